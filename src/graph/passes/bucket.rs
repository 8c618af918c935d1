//! Bucketing, as DDP does with gradients: runs of consecutive all_reduces
//! with the same op and dtype, up to a byte cap, become one coalesced
//! all_reduce (one ring pass instead of one per tensor).
//!
//! The bucket is issued where its last member was (when every member's
//! input is ready). A member joins only if its input does not depend on an
//! earlier member's result (never merge across a dependency) and nothing
//! uses an earlier member's result before it (a bucket must not delay a
//! value somebody already needs; run `sink_waits` first).

use std::collections::HashSet;

use super::move_to;
use crate::ReduceOp;
use crate::graph::ir::{Graph, Node, NodeId, Op};

/// DDP's default `bucket_cap_mb`: 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Every node `id` depends on, transitively.
fn ancestors(g: &Graph, id: NodeId) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut todo = vec![id];
    while let Some(n) = todo.pop() {
        for &a in g.node(n).map(|n| n.args.as_slice()).unwrap_or(&[]) {
            if seen.insert(a) {
                todo.push(a);
            }
        }
    }
    seen
}

fn wait_of(g: &Graph, id: NodeId) -> Option<NodeId> {
    g.users(id)
        .into_iter()
        .find(|&u| g.node(u).is_some_and(|n| n.op == Op::WaitTensor))
}

/// Whether `b` may join a bucket whose members are `bucket`.
fn joins(g: &Graph, bucket: &[NodeId], b: &Node, op: ReduceOp, bytes: usize, cap: usize) -> bool {
    if b.op != Op::AllReduce(op) || bytes.saturating_add(b.bytes()) > cap {
        return false;
    }
    let Some(first) = bucket.first().and_then(|&m| g.node(m)) else {
        return false;
    };
    if b.dtype != first.dtype {
        return false;
    }
    let needs = ancestors(g, b.id);
    let pos = g.positions();
    let here = pos.get(&b.id).copied().unwrap_or(0);
    bucket.iter().all(|&m| {
        let wait = wait_of(g, m);
        let used_before = wait
            .map(|w| g.users(w))
            .unwrap_or_default()
            .iter()
            .any(|u| pos.get(u).is_some_and(|&p| p < here));
        !needs.contains(&m) && wait.is_none_or(|w| !needs.contains(&w)) && !used_before
    })
}

/// `g` with adjacent compatible all_reduces merged, up to `cap` bytes a bucket.
pub fn bucket_all_reduces(mut g: Graph, cap: usize) -> Graph {
    let collectives: Vec<NodeId> = g
        .nodes
        .iter()
        .filter(|n| n.op.is_collective())
        .map(|n| n.id)
        .collect();
    let mut buckets: Vec<Vec<NodeId>> = Vec::new();
    let mut bytes = 0;
    for c in collectives {
        let Some(node) = g.node(c).cloned() else {
            continue;
        };
        let open = buckets
            .last()
            .filter(|b| matches!(g.node(b[0]).map(|n| &n.op), Some(Op::AllReduce(_))));
        let fits = match (
            open,
            &node.op,
            open.and_then(|b| g.node(b[0])).map(|n| n.op.clone()),
        ) {
            (Some(b), _, Some(Op::AllReduce(op))) => joins(&g, b, &node, op, bytes, cap),
            _ => false,
        };
        if fits {
            bytes = bytes.saturating_add(node.bytes());
            if let Some(b) = buckets.last_mut() {
                b.push(c);
            }
        } else {
            bytes = node.bytes();
            buckets.push(vec![c]);
        }
    }
    for bucket in buckets.into_iter().filter(|b| b.len() > 1) {
        merge(&mut g, &bucket);
    }
    g
}

/// Replaces the members (all_reduces with one op and dtype) by one
/// coalesced all_reduce at the last member's place; each member becomes a
/// `getitem` of it (keeping its id, so its wait is unchanged).
fn merge(g: &mut Graph, members: &[NodeId]) {
    let Some(first) = members.first().and_then(|&m| g.node(m)).cloned() else {
        return;
    };
    let Op::AllReduce(op) = first.op else { return };
    let inputs: Vec<NodeId> = members
        .iter()
        .filter_map(|&m| g.node(m))
        .map(|n| n.args[0])
        .collect();
    let total = members
        .iter()
        .filter_map(|&m| g.node(m))
        .map(Node::len)
        .sum();
    let id = g.next_id();
    let last = members.last().copied().unwrap_or(first.id);
    let at = g.positions().get(&last).copied().unwrap_or(g.nodes.len());
    g.nodes.insert(
        at,
        Node {
            id,
            op: Op::AllReduceCoalesced(op),
            args: inputs,
            dtype: first.dtype,
            shape: vec![total],
            seq: first.seq,
        },
    );
    for (i, &m) in members.iter().enumerate() {
        if let Some(n) = g.nodes.iter_mut().find(|n| n.id == m) {
            n.op = Op::Item(i);
            n.args = vec![id];
            n.seq = None;
        }
    }
    // Items right after the bucket, then each member's wait after its item.
    let mut cursor = g.positions().get(&id).copied().unwrap_or(0);
    for &m in members {
        let p = g.positions().get(&m).copied().unwrap_or(0);
        if p < cursor {
            cursor = cursor.saturating_sub(1);
        }
        move_to(g, m, cursor.saturating_add(1));
        cursor = g.positions().get(&m).copied().unwrap_or(cursor);
    }
    for &m in members {
        let Some(w) = wait_of(g, m) else { continue };
        let pos = g.positions();
        let (pw, pm) = (
            pos.get(&w).copied().unwrap_or(0),
            pos.get(&m).copied().unwrap_or(0),
        );
        if pw < pm {
            move_to(g, w, pm);
        }
    }
}
