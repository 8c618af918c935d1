//! Collective algorithms, each a schedule of primitive steps.
//!
//! [`prims::Prims`] holds the primitives (NCCL's names: `send`,
//! `recv_reduce_send`, `recv_reduce_copy_send`, `recv_copy_send`, `recv`);
//! each algorithm file is only the order in which a rank calls them:
//! `ring` for all-reduce, all-gather, reduce-scatter and barrier, `oneshot`
//! for small all-reduces, `chain`
//! for the rooted broadcast and reduce, `pairwise` for all-to-all.

pub(crate) mod chain;
pub(crate) mod oneshot;
pub(crate) mod pairwise;
pub(crate) mod prims;
pub(crate) mod ring;
