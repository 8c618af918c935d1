//! What users call: the world of ranks, communicators, tensors and the
//! handles collectives return.

pub(crate) mod bootstrap;
pub(crate) mod comm;
pub(crate) mod config;
pub(crate) mod group;
pub(crate) mod host_link;
pub(crate) mod timed;
pub(crate) mod tune;
pub(crate) mod work;
pub(crate) mod world;
#[cfg(feature = "mpi")]
pub(crate) mod world_mpi;
