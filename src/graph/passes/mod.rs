//! Passes: each a function from graph to graph that keeps `verify`'s
//! invariants, with its own tests: `dce`, `sink_waits`, `raise_comms`,
//! `reorder_for_overlap`, `bucket_all_reduces` (and `bucket_by_cost`).

mod bucket;
mod dce;
mod memory;
mod raise;
mod reorder;
mod sink;

pub use bucket::{DEFAULT_BUCKET_BYTES, bucket_all_reduces, bucket_by_cost};
pub use dce::dce;
pub use memory::{peak_bytes, within};
pub use raise::raise_comms;
pub use reorder::{GraphCost, reorder_for_overlap, reorder_for_overlap_within};
pub use sink::sink_waits;

use std::collections::HashSet;

use super::ir::{Graph, NodeId};

/// Moves node `id` to position `to` of the order (counted after removal).
fn move_to(g: &mut Graph, id: NodeId, to: usize) {
    if let Some(from) = g.nodes.iter().position(|n| n.id == id) {
        let node = g.nodes.remove(from);
        let to = to.min(g.nodes.len());
        g.nodes.insert(to, node);
    }
}

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
