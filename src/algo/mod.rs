//! Collective algorithms, each a schedule of primitive steps.
//!
//! [`prims::Prims`] holds the primitives (NCCL's names: `send`,
//! `recv_reduce_send`, `recv_reduce_copy_send`, `recv_copy_send`, `recv`);
//! each algorithm file is only the order in which a rank calls them.

pub(crate) mod prims;
pub(crate) mod ring;
