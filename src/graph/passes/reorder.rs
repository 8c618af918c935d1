//! Orders compute to cover communication, under the cost model.
//!
//! A list schedule over the dependency graph, simulated in time, that
//! spends compute on collectives in issue order (Inductor's
//! `reorder_compute_for_overlap`):
//! - a collective is issued as soon as its inputs are ready (and every
//!   earlier collective is issued: their order is the program's);
//! - the wait of a collective that has finished by now is placed at once
//!   (it costs nothing), so what needs its result can go on;
//! - then compute that the next collective needs, so that it is issued
//!   early;
//! - then other compute, but only while a collective is still running: a
//!   collective gets the independent compute its estimated time needs and
//!   no more, and the rest is kept to cover later collectives;
//! - else the wait whose collective finishes first.
//!
//! Ties go to program order, so every rank computes the same order.
//! Costs: collectives by the alpha-beta ring model, matmuls by their
//! FLOPs, other compute by its bytes.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::memory::Liveness;
use crate::CostModel;
use crate::graph::ir::{Graph, Node, NodeId, Op};

/// What the schedule assumes about the machine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphCost {
    /// The hop model (from `World::cost_model`).
    pub comm: CostModel,
    /// Ranks in the group the collectives run on.
    pub ranks: usize,
    /// Compute throughput for matmuls, FLOP/s.
    pub flops: f64,
    /// Memory throughput for element-wise compute, bytes/s.
    pub bytes: f64,
}

impl GraphCost {
    /// Estimated time of `n` (zero for bookkeeping nodes).
    pub fn of(&self, g: &Graph, n: &Node) -> Duration {
        let secs = |s: f64| Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX);
        let arg_bytes: usize = n
            .args
            .iter()
            .filter_map(|&a| g.node(a))
            .map(Node::bytes)
            .sum();
        match &n.op {
            Op::Matmul { .. } => {
                let k = n.args.first().and_then(|&a| g.node(a)).map_or(0, |a| {
                    a.len()
                        .checked_div(n.shape.first().copied().unwrap_or(1))
                        .unwrap_or(0)
                });
                secs(2.0 * n.len() as f64 * k as f64 / self.flops)
            }
            Op::AllReduce(_) | Op::AllReduceCoalesced(_) | Op::AllReduceInPlace(_) => {
                self.comm.ring_all_reduce(self.ranks, arg_bytes)
            }
            Op::AllGather
            | Op::ReduceScatter(_)
            | Op::AllToAll
            | Op::AllToAllV { .. }
            | Op::Broadcast(_)
            | Op::Reduce(..)
            | Op::AllGatherCoalesced
            | Op::ReduceScatterCoalesced(_) => {
                // n-1 hops of a rank's share.
                let share = arg_bytes.max(n.bytes()) as f64 / self.ranks.max(1) as f64;
                let hop = self.comm.alpha.as_secs_f64() + share / self.comm.beta;
                secs((self.ranks.saturating_sub(1)) as f64 * hop)
            }
            Op::Input(_) | Op::Output | Op::Item(_) | Op::WaitTensor | Op::Reshape => {
                Duration::ZERO
            }
            _ => secs(arg_bytes.saturating_add(n.bytes()) as f64 / self.bytes),
        }
    }
}

impl GraphCost {
    /// What a collective of kind `op` costs whatever its size: its hops'
    /// latency (zero for compute).
    pub fn fixed(&self, op: &Op) -> Duration {
        let hops = self.ranks.saturating_sub(1) as u32;
        match op {
            Op::AllReduce(_) | Op::AllReduceCoalesced(_) | Op::AllReduceInPlace(_) => {
                self.comm.ring_all_reduce(self.ranks, 0)
            }
            o if o.is_collective() => self.comm.alpha.saturating_mul(hops),
            _ => Duration::ZERO,
        }
    }
}

/// `g` reordered so that compute covers each collective's estimated time.
pub fn reorder_for_overlap(g: Graph, cost: &GraphCost) -> Graph {
    schedule(g, cost, usize::MAX).after("reorder_for_overlap")
}

/// [`reorder_for_overlap`] keeping the estimated peak memory (see
/// [`peak_bytes`](super::peak_bytes)) at most `bound` bytes, or `g`'s own
/// peak if that is higher: a collective is issued early only while its
/// output fits under the bound, and should the schedule still end above
/// it, `g` is kept as it was.
pub fn reorder_for_overlap_within(g: Graph, cost: &GraphCost, bound: usize) -> Graph {
    super::within(bound, g, |g| schedule(g, cost, bound)).after("reorder_for_overlap_within")
}

fn schedule(g: Graph, cost: &GraphCost, bound: usize) -> Graph {
    let mut memory = Liveness::new(&g);
    let order: HashMap<NodeId, usize> = g.positions();
    let mut done: HashSet<NodeId> = HashSet::new();
    let mut out = Vec::with_capacity(g.nodes.len());
    let mut now = Duration::ZERO;
    // When each process group's collectives are done: a group runs its
    // collectives one after another, groups at the same time.
    let mut comm_free: HashMap<usize, Duration> = HashMap::new();
    let mut finish: HashMap<NodeId, Duration> = HashMap::new(); // collective -> estimated end
    let mut next_seq = g
        .nodes
        .iter()
        .filter(|n| n.op.is_collective())
        .map(|n| n.seq.unwrap_or(0))
        .min();
    // The collective a node's value waits on, if any (itself, or a getitem's).
    let collective_of = |id: NodeId| -> Option<NodeId> {
        let n = g.node(id)?;
        match n.op {
            Op::Item(_) => n.args.first().copied(),
            ref o if o.is_collective() => Some(id),
            _ => None,
        }
    };
    // The next collective to issue, and what it needs.
    let next_of = |seq: Option<u64>| {
        g.nodes
            .iter()
            .find(|n| n.op.is_collective() && n.seq == seq)
            .map(|n| super::ancestors(&g, n.id))
            .unwrap_or_default()
    };
    let mut needed = next_of(next_seq);
    while out.len() < g.nodes.len() {
        let ready: Vec<&Node> = g
            .nodes
            .iter()
            .filter(|n| !done.contains(&n.id) && n.args.iter().all(|a| done.contains(a)))
            .collect();
        let ends = |n: &Node| {
            n.args
                .first()
                .and_then(|&a| collective_of(a))
                .and_then(|c| finish.get(&c))
                .copied()
        };
        let compute =
            |n: &&&Node| !matches!(n.op, Op::WaitTensor | Op::Output) && !n.op.is_collective();
        // Whether an issued collective is still running at `now`.
        let running = g
            .nodes
            .iter()
            .filter(|n| n.op == Op::WaitTensor && !done.contains(&n.id))
            .any(|n| ends(n).is_some_and(|end| end > now));
        let fits = |n: &Node| memory.live.saturating_add(memory.allocates(n)) <= bound;
        let pick = ready
            .iter()
            .find(|n| n.op.is_collective() && n.seq == next_seq && fits(n))
            .or_else(|| {
                ready
                    .iter()
                    .filter(|n| n.op == Op::WaitTensor && ends(n).is_none_or(|end| end <= now))
                    .min_by_key(|n| (ends(n), order[&n.id]))
            })
            .or_else(|| {
                ready
                    .iter()
                    .filter(compute)
                    .find(|n| needed.contains(&n.id) && fits(n))
            })
            .or_else(|| ready.iter().filter(compute).find(|n| running && fits(n)))
            .or_else(|| {
                ready
                    .iter()
                    .filter(|n| n.op == Op::WaitTensor)
                    .min_by_key(|n| (ends(n), order[&n.id]))
            })
            .or_else(|| ready.iter().find(compute))
            .or_else(|| ready.iter().find(|n| n.op == Op::Output))
            .or_else(|| ready.first())
            .copied();
        let Some(n) = pick else { break };
        let t = cost.of(&g, n);
        if n.op.is_collective() {
            let free = comm_free.entry(n.group).or_insert(Duration::ZERO);
            let end = now.max(*free).saturating_add(t);
            *free = end;
            finish.insert(n.id, end);
            next_seq = g
                .nodes
                .iter()
                .filter(|m| m.op.is_collective() && m.seq > n.seq)
                .map(|m| m.seq.unwrap_or(0))
                .min();
            needed = next_of(next_seq);
        } else if n.op == Op::WaitTensor {
            if let Some(end) = n
                .args
                .first()
                .and_then(|&a| collective_of(a))
                .and_then(|c| finish.get(&c))
            {
                now = now.max(*end);
            }
        } else {
            now = now.saturating_add(t);
        }
        memory.place(n);
        done.insert(n.id);
        out.push(n.clone());
    }
    Graph {
        nodes: out,
        passes: g.passes.clone(),
    }
}
