//! Dead-code elimination that respects effects: only pure nodes whose
//! value nobody uses are dropped. A `wait_tensor` mutates its input, and a
//! collective talks to the other ranks, so neither is ever dropped, on any
//! rank, whatever uses their results (dropping one on one rank would leave
//! the others waiting for it).

use crate::graph::ir::Graph;
use crate::graph::schema::{Effect, effect};

/// `g` without its unused pure nodes.
pub fn dce(mut g: Graph) -> Graph {
    loop {
        let dead: Vec<usize> = g
            .nodes
            .iter()
            .filter(|n| effect(&n.op) == Effect::Pure && g.users(n.id).is_empty())
            .map(|n| n.id)
            .collect();
        if dead.is_empty() {
            return g.after("dce");
        }
        g.nodes.retain(|n| !dead.contains(&n.id));
    }
}
