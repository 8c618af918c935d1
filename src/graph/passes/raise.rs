//! Each collective moves up to just after the last node its inputs need
//! (and never above an earlier collective: their order is the program's on
//! every rank), so it starts as early as it can.

use super::move_to;
use crate::graph::ir::Graph;

/// `g` with every collective raised to just after its inputs are ready.
pub fn raise_comms(mut g: Graph) -> Graph {
    let collectives: Vec<usize> = g
        .nodes
        .iter()
        .filter(|n| n.op.is_collective())
        .map(|n| n.id)
        .collect();
    let mut floor = 0; // just after the previous collective
    for c in collectives {
        let pos = g.positions();
        let Some(node) = g.node(c) else { continue };
        let ready = node
            .args
            .iter()
            .filter_map(|a| pos.get(a))
            .map(|p| p.saturating_add(1))
            .max()
            .unwrap_or(0);
        let target = ready.max(floor);
        let here = pos.get(&c).copied().unwrap_or(target);
        if target < here {
            move_to(&mut g, c, target);
        }
        floor = g.positions().get(&c).map_or(floor, |p| p.saturating_add(1));
    }
    g.after("raise_comms")
}
