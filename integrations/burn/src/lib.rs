//! Real collectives for burn tensors on wgpu.
//!
//! burn 0.23's `Tensor::all_reduce` over wgpu devices is emulated: cubecl
//! has no device transport for wgpu, so every tensor is read back to the
//! host on the first device's thread, summed there, and written back to
//! each device in turn. This crate gives burn programs the engine of
//! `wgpu-collectives` instead: the same devices registered with burn and
//! with the engine ([`BurnWorld`]), and collectives that work on burn's own
//! buffers where they lie (no host round trip of the tensor, results in
//! place where burn lets a handle be written).
//!
//! Two calling shapes, as burn and `torch.distributed` have them:
//! - burn's own, one tensor per device from one thread:
//!   [`BurnWorld::all_reduce`], [`all_gather`](BurnWorld::all_gather),
//!   [`reduce_scatter`](BurnWorld::reduce_scatter),
//!   [`broadcast`](BurnWorld::broadcast);
//! - SPMD, one closure per rank: [`BurnWorld::run`] gives each rank a
//!   [`Rank`] with the same four collectives on its own tensor.
//!
//! ```no_run
//! use burn_tensor::{Tensor, distributed::ReduceOperation};
//! use wgpu_collectives::WorldConfig;
//! use wgpu_collectives_burn::BurnWorld;
//!
//! # fn main() -> Result<(), wgpu_collectives_burn::Error> {
//! let world = BurnWorld::new(WorldConfig::new(4))?;
//! let grads: Vec<Tensor<2>> = world
//!     .devices()
//!     .iter()
//!     .map(|d| Tensor::ones([8, 8], d))
//!     .collect();
//! let summed = world.all_reduce(grads, ReduceOperation::Sum)?; // 4.0 everywhere
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![deny(unsafe_code)]
#![deny(
    clippy::arithmetic_side_effects,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod collective;
mod devices;
mod error;
mod lend;
mod rank;
mod world;

pub use collective::Reduction;
pub use error::{Error, Result};
pub use rank::Rank;
/// The engine this crate drives, for its config and error types.
pub use wgpu_collectives;
pub use world::BurnWorld;
