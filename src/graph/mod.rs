//! Traced graphs whose collectives are functional ops.
//!
//! In PyTorch's compiled path a collective returns an async tensor and a
//! separate `wait_tensor` makes it ready. Tracing puts every wait right
//! after its collective (always correct, never overlapped); passes then
//! move waits to just before first use and collectives up to just after
//! their inputs, so compute runs while the ring does. Two real bugs shaped
//! this module: `wait_tensor` once had a schema claiming it was pure, so
//! dead-code elimination dropped waits; and a collective whose result one
//! rank did not use was dropped on that rank only, so the others hung.
//! Here every op has a schema and an effect: `wait_tensor` mutates its
//! input (`Tensor(a!)`), collectives are ordered effects, and no pass ever
//! drops or reorders either.
//!
//! - `ir`: the graph, its ops, and the printer (one stable line per node).
//! - `schema`: each op's schema in PyTorch's notation, and its effect.
//! - `trace`: building graphs from code shaped like eager code.
//! - `verify`: the invariants every pass must keep.
//! - `eager`: async tensors and eager compute ops, for code outside graphs.
//! - `exec`: runs a graph on a rank (kernels, async collectives, waits), with a timeline.
//! - `agree`: ranks check that their graphs issue the same collectives before one runs.
//! - `calibrate`: the cost model's estimates against a run's timeline, and a collective refit.
//! - `compute`: the compute ops' kernels, on the crate's public API only.
//! - `passes`: `dce`, `sink_waits`, `raise_comms`, `reorder_for_overlap`,
//!   `bucket_all_reduces`.

mod agree;
pub mod calibrate;
mod compute;
pub mod eager;
pub mod exec;
pub mod ir;
pub mod passes;
pub mod schema;
pub mod trace;
pub mod verify;

pub use exec::{Event, Lane, Run, chrome_trace, execute, execute_on};
pub use ir::{Graph, Node, NodeId, Op};
pub use schema::{Effect, effect, schema};
pub use trace::Tracer;
pub use verify::verify;
