//! Peak memory, estimated from tensor sizes, and keeping passes under a
//! bound (Inductor's `reorder_communication_preserving_peak_memory`).
//!
//! A node's value is allocated when it runs and freed once its last user
//! has: compute and collectives allocate their outputs (a collective at
//! its issue, since its output exists from then); a reshape, a getitem, a
//! wait and an in-place collective alias their argument, whose life their
//! own users extend. Moving a collective earlier (prefetching a gather)
//! or a wait later keeps buffers alive longer, which is what the bound
//! stops.

use std::collections::HashMap;

use crate::graph::ir::{Graph, Node, NodeId, Op};

/// Live bytes as nodes are placed in some order.
pub(crate) struct Liveness {
    /// The node whose allocation each node's value is.
    root: HashMap<NodeId, NodeId>,
    /// Uses of each allocation not yet placed.
    uses: HashMap<NodeId, usize>,
    bytes: HashMap<NodeId, usize>,
    /// Bytes live now, and the most so far.
    pub live: usize,
    pub peak: usize,
}

fn aliases(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape | Op::Item(_) | Op::WaitTensor | Op::AllReduceInPlace(_) | Op::Output
    )
}

impl Liveness {
    pub(crate) fn new(g: &Graph) -> Liveness {
        let mut root = HashMap::new();
        let mut bytes = HashMap::new();
        // Nodes are in a topological order: an alias's argument has its root.
        for n in &g.nodes {
            let r = match (aliases(&n.op), n.args.first()) {
                (true, Some(a)) => root.get(a).copied().unwrap_or(*a),
                _ => n.id,
            };
            root.insert(n.id, r);
            if r == n.id {
                bytes.insert(n.id, n.bytes());
            }
        }
        let mut uses: HashMap<NodeId, usize> = HashMap::new();
        for n in &g.nodes {
            for a in &n.args {
                let r = root.get(a).copied().unwrap_or(*a);
                let u = uses.entry(r).or_insert(0usize);
                *u = u.saturating_add(1);
            }
        }
        Liveness {
            root,
            uses,
            bytes,
            live: 0,
            peak: 0,
        }
    }

    /// Bytes `n` allocates when it runs.
    pub(crate) fn allocates(&self, n: &Node) -> usize {
        if self.root.get(&n.id) == Some(&n.id) {
            self.bytes.get(&n.id).copied().unwrap_or(0)
        } else {
            0
        }
    }

    /// Places `n`: allocates its value, then frees the allocations whose
    /// last use it is.
    pub(crate) fn place(&mut self, n: &Node) {
        self.live = self.live.saturating_add(self.allocates(n));
        self.peak = self.peak.max(self.live);
        if self.allocates(n) > 0 && self.uses.get(&n.id).is_none_or(|&u| u == 0) {
            // Nobody reads it: freed at once (after counting it).
            self.live = self.live.saturating_sub(self.allocates(n));
        }
        for a in &n.args {
            let r = self.root.get(a).copied().unwrap_or(*a);
            if let Some(u) = self.uses.get_mut(&r) {
                *u = u.saturating_sub(1);
                if *u == 0 {
                    let b = self.bytes.get(&r).copied().unwrap_or(0);
                    self.live = self.live.saturating_sub(b);
                }
            }
        }
    }
}

/// The most bytes live at once when `g` runs in its order.
pub fn peak_bytes(g: &Graph) -> usize {
    let mut l = Liveness::new(g);
    for n in &g.nodes {
        l.place(n);
    }
    l.peak
}

/// Runs an order-only `pass` (one that moves nodes, such as `sink_waits`,
/// `raise_comms` or `reorder_for_overlap`) unless it would raise `g`'s
/// estimated peak memory above `bound` (or above `g`'s own peak, if that
/// is higher already): then `g` is kept as it was. Bucketing is not for
/// this: its decisions must be the same on every rank, and peak memory
/// depends on what each rank computes; its cap bounds what it adds.
pub fn within(bound: usize, g: Graph, pass: impl FnOnce(Graph) -> Graph) -> Graph {
    let before = peak_bytes(&g);
    let out = pass(g.clone());
    if peak_bytes(&out) <= bound.max(before) {
        out
    } else {
        g.after("(a pass kept back: over the peak memory bound)")
    }
}
