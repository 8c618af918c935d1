//! Each `wait_tensor` moves to just before the first node that uses its
//! value (or just before the output when nothing does), so that whatever
//! compute comes between runs while the collective does.

use super::move_to;
use crate::graph::ir::{Graph, Op};

/// `g` with every wait sunk to its first user.
pub fn sink_waits(mut g: Graph) -> Graph {
    let waits: Vec<usize> = g
        .nodes
        .iter()
        .filter(|n| n.op == Op::WaitTensor)
        .map(|n| n.id)
        .collect();
    for w in waits {
        let pos = g.positions();
        let first_user = g
            .users(w)
            .into_iter()
            .filter_map(|u| pos.get(&u).copied())
            .min();
        let end = g
            .nodes
            .iter()
            .position(|n| n.op == Op::Output)
            .unwrap_or(g.nodes.len());
        let target = first_user.unwrap_or(end);
        // Removing the wait shifts later positions down by one.
        move_to(&mut g, w, target.saturating_sub(1));
    }
    g.after("sink_waits")
}
