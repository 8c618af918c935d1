//! The invariants every graph must keep, before and after every pass.

use std::collections::HashMap;

use super::ir::{Graph, NodeId, Op};

/// Checks that: ids are unique; the order is topological; each collective
/// result (a single-result collective, or each `getitem` of a coalesced
/// one) has exactly one `wait_tensor` and no other user; every wait waits
/// on a collective result; nothing but an in-place collective reads the
/// input it overwrites; collectives keep their traced relative order.
/// A failure names the nodes.
pub fn verify(g: &Graph) -> Result<(), String> {
    let mut seen: HashMap<NodeId, usize> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        if seen.insert(n.id, i).is_some() {
            return Err(format!("%{} appears twice", n.id));
        }
        for a in &n.args {
            if !seen.contains_key(a) {
                return Err(format!(
                    "%{} uses %{a}, which does not come before it",
                    n.id
                ));
            }
        }
    }
    let is_result = |id: NodeId| -> bool {
        g.node(id).is_some_and(|n| match n.op {
            ref o if o.is_coalesced() => false,
            Op::Item(_) => n
                .args
                .first()
                .and_then(|&c| g.node(c))
                .is_some_and(|c| c.op.is_collective()),
            ref o => o.is_collective(),
        })
    };
    for n in &g.nodes {
        if is_result(n.id) {
            let users: Vec<NodeId> = g.users(n.id);
            let waits = users
                .iter()
                .filter(|&&u| g.node(u).is_some_and(|u| u.op == Op::WaitTensor))
                .count();
            if waits != 1 {
                return Err(format!(
                    "collective result %{} has {waits} wait_tensor nodes, not one",
                    n.id
                ));
            }
            if let Some(u) = users
                .iter()
                .find(|&&u| g.node(u).is_some_and(|u| u.op != Op::WaitTensor))
            {
                return Err(format!(
                    "%{u} reads collective result %{} without waiting for it",
                    n.id
                ));
            }
        }
        if n.op == Op::WaitTensor && !n.args.first().is_some_and(|&a| is_result(a)) {
            return Err(format!(
                "wait_tensor %{} does not wait on a collective result",
                n.id
            ));
        }
        if let Op::AllReduceInPlace(_) = n.op {
            let input = n.args.first().copied().unwrap_or(usize::MAX);
            if let Some(u) = g.users(input).into_iter().find(|&u| u != n.id) {
                return Err(format!(
                    "%{u} reads %{input}, which the in-place %{} overwrites",
                    n.id
                ));
            }
        }
        if n.op.is_coalesced() {
            if let Some(u) = g
                .users(n.id)
                .iter()
                .find(|&&u| !matches!(g.node(u).map(|u| &u.op), Some(Op::Item(_))))
            {
                return Err(format!(
                    "%{u} reads coalesced collective %{} other than through getitem",
                    n.id
                ));
            }
        }
    }
    let seqs: Vec<(NodeId, u64)> = g
        .nodes
        .iter()
        .filter(|n| n.op.is_collective())
        .map(|n| (n.id, n.seq.unwrap_or(u64::MAX)))
        .collect();
    for w in seqs.windows(2) {
        if w[0].1 >= w[1].1 {
            return Err(format!(
                "collectives %{} and %{} are out of their traced order",
                w[0].0, w[1].0
            ));
        }
    }
    Ok(())
}
