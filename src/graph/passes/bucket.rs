//! Bucketing, as DDP does with gradients and FSDP with parameter shards:
//! runs of consecutive all_reduces (or all_gathers, or reduce_scatters)
//! with the same op and dtype, up to a byte cap, become one coalesced
//! collective (one launch instead of one per tensor, each tensor still
//! reduced or gathered as alone, so the bits do not change).
//!
//! Every rank must bucket alike, or ranks issue different collectives. So
//! the decision reads only what every rank of an SPMD program shares, as
//! PyTorch's bucketing does: the collective sequence (adjacency, op,
//! dtype, size) and the dependencies between collectives (a member never
//! joins a bucket whose earlier member its input needs). It never reads
//! which rank-local compute uses a result: a rank that reads an earlier
//! member's result before the bucket is issued (to log a norm, say) has
//! that read moved after the bucket's wait instead, and buckets like the
//! others. The bucket is issued where its last member was.

use std::collections::HashSet;

use std::time::Duration;

use super::{GraphCost, ancestors, move_to};
use crate::graph::ir::{Graph, Node, NodeId, Op};

/// DDP's default `bucket_cap_mb`: 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

fn wait_of(g: &Graph, id: NodeId) -> Option<NodeId> {
    g.users(id)
        .into_iter()
        .find(|&u| g.node(u).is_some_and(|n| n.op == Op::WaitTensor))
}

/// Whether `b` may join a bucket whose members are `bucket`.
/// The coalesced collective that bucketing turns runs of `op` into.
fn coalesced(op: &Op) -> Option<Op> {
    Some(match op {
        Op::AllReduce(r) => Op::AllReduceCoalesced(*r),
        Op::AllGather => Op::AllGatherCoalesced,
        Op::ReduceScatter(r) => Op::ReduceScatterCoalesced(*r),
        _ => return None,
    })
}

/// Whether `b` may join a bucket whose members are `bucket`: the same
/// collective (kind and operator), dtype and process group, within the cap, and not
/// needing an earlier member's result.
fn joins(g: &Graph, bucket: &[NodeId], b: &Node, bytes: usize, cap: usize) -> bool {
    let Some(first) = bucket.first().and_then(|&m| g.node(m)) else {
        return false;
    };
    if b.op != first.op
        || b.dtype != first.dtype
        || b.group != first.group
        || bytes.saturating_add(b.bytes()) > cap
    {
        return false;
    }
    let needs = ancestors(g, b.id);
    bucket.iter().all(|&m| {
        let wait = wait_of(g, m);
        !needs.contains(&m) && wait.is_none_or(|w| !needs.contains(&w))
    })
}

/// `g` with adjacent compatible all_reduces, all_gathers and
/// reduce_scatters merged, up to `cap` bytes a bucket.
pub fn bucket_all_reduces(g: Graph, cap: usize) -> Graph {
    bucket(g, cap, None).after("bucket_all_reduces")
}

/// Like [`bucket_all_reduces`], and a member joins only if what it costs
/// the bucket's earlier members is no more than the merge saves (one
/// collective's fixed cost, under `cost`): they start when it is ready and
/// end after its bytes have moved too. When it will be ready is estimated
/// from the compute it depends on alone (the sum of their estimated
/// times: one rank's compute runs one op at a time), which is the same on
/// every rank. So gradients that backward makes far apart are all-reduced
/// apart, each overlapping the backward that follows, as DDP's small
/// first bucket intends; FSDP's large parameter shards are gathered one by
/// one, the next while this layer computes; small tensors made together
/// still merge.
pub fn bucket_by_cost(g: Graph, cap: usize, cost: &GraphCost) -> Graph {
    bucket(g, cap, Some(cost)).after("bucket_by_cost")
}

/// When `id`'s inputs can be ready at the earliest: the estimated time of
/// everything it depends on.
fn ready_at(g: &Graph, cost: &GraphCost, id: NodeId) -> Duration {
    ancestors(g, id)
        .into_iter()
        .filter_map(|a| g.node(a))
        .map(|a| cost.of(g, a))
        .fold(Duration::ZERO, Duration::saturating_add)
}

fn bucket(mut g: Graph, cap: usize, cost: Option<&GraphCost>) -> Graph {
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
            .filter(|b| g.node(b[0]).is_some_and(|n| coalesced(&n.op).is_some()));
        let fits = open.is_some_and(|b| {
            joins(&g, b, &node, bytes, cap) && cost.is_none_or(|k| soon(&g, k, b, &node))
        });
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
    restore_dependencies(&mut g);
    g
}

/// Whether waiting for `b` and moving its bytes costs the bucket's earlier
/// members less than the collective the merge saves.
fn soon(g: &Graph, cost: &GraphCost, bucket: &[NodeId], b: &Node) -> bool {
    let Some(&first) = bucket.first() else {
        return false;
    };
    let fixed = cost.fixed(&b.op);
    let delay = ready_at(g, cost, b.id).saturating_sub(ready_at(g, cost, first));
    let bytes = cost.of(g, b).saturating_sub(fixed);
    delay.saturating_add(bytes) <= fixed
}

/// Reorders `g` so that every node comes after its arguments, moving as
/// little as it can: of the nodes whose arguments are placed, the earliest
/// in the current order goes next, except a collective whose predecessor
/// in the traced order is not placed yet. A merge leaves nodes that read
/// an early member's result before the bucket; they, and what needs them,
/// move after it.
fn restore_dependencies(g: &mut Graph) {
    let mut placed: HashSet<NodeId> = HashSet::new();
    let mut rest = std::mem::take(&mut g.nodes);
    let mut order = Vec::with_capacity(rest.len());
    let mut seqs: Vec<u64> = rest.iter().filter_map(|n| n.seq).collect();
    seqs.sort_unstable();
    let mut next_seq = seqs.into_iter().peekable();
    while !rest.is_empty() {
        let due = next_seq.peek().copied();
        let pick = rest.iter().position(|n| {
            n.args.iter().all(|a| placed.contains(a))
                && (!n.op.is_collective() || n.seq.is_none() || n.seq == due)
        });
        // An acyclic graph always has a next node; should it not, keep the rest as it is.
        let Some(i) = pick else {
            order.append(&mut rest);
            break;
        };
        let n = rest.remove(i);
        if n.op.is_collective() && n.seq.is_some() {
            next_seq.next();
        }
        placed.insert(n.id);
        order.push(n);
    }
    g.nodes = order;
}

/// Replaces the members (one collective, op and dtype) by one coalesced
/// collective at the last member's place; each member becomes a `getitem`
/// of it (keeping its id, so its wait is unchanged).
fn merge(g: &mut Graph, members: &[NodeId]) {
    let Some(first) = members.first().and_then(|&m| g.node(m)).cloned() else {
        return;
    };
    let Some(op) = coalesced(&first.op) else {
        return;
    };
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
            op,
            args: inputs,
            dtype: first.dtype,
            shape: vec![total],
            seq: first.seq,
            group: first.group,
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
