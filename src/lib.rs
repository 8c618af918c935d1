//! Collective communication for ranks on wgpu devices.
//!
//! NCCL gives NVIDIA GPUs fast collectives; wgpu users (Vulkan, Metal,
//! DX12: AMD, Intel, Apple, NVIDIA alike) have nothing comparable. This
//! crate runs a [`World`] of simulated ranks on wgpu devices, executing
//! SPMD code as `torch.distributed` programs do. Ranks on one adapter share
//! its device ([`Placement`]): a collective is then one submission whose
//! kernel reads every rank's input where it lies. Ranks on devices of their
//! own run ring schedules through host memory, whose reductions are WGSL
//! kernels on the receiving rank's device. Either way a collective returns
//! at once with a fence-backed [`Work`], and gives the same bits.
//!
//! ```no_run
//! use wgpu_collectives::{World, WorldConfig, Communicator, ReduceOp};
//! # fn main() -> Result<(), wgpu_collectives::Error> {
//! let world = World::new(WorldConfig::new(4))?;
//! let sums = world.run(|comm: &Communicator| {
//!     let x = comm.tensor(&[comm.rank() as f32; 1000])?;
//!     let y = comm.all_reduce(&x, ReduceOp::Sum)?.wait()?;
//!     y.to_vec::<f32>()
//! })?;
//! # Ok(()) }
//! ```
//!
//! The engine opens to the framework around it: [`World::from_devices`]
//! runs ranks on devices the user made, [`Communicator::wrap_buffer`]
//! puts a user's own `wgpu::Buffer` into a collective with no copy, the
//! `*_into` calls write where the user says, and collectives follow stream
//! order on the rank's queue. From `examples/own_buffers.rs`:
//!
//! ```no_run
//! # use wgpu_collectives::{Communicator, DType, Error, ReduceOp, wgpu};
//! # fn fill_gradient(comm: &Communicator) -> wgpu::Buffer { unimplemented!() }
//! # fn read_back(comm: &Communicator, b: &wgpu::Buffer) -> Vec<f32> { unimplemented!() }
//! # fn rank(comm: &Communicator, len: usize) -> Result<Vec<f32>, Error> {
//! // The rank's own kernel writes `grad`, submitted and not waited for.
//! let grad: wgpu::Buffer = fill_gradient(comm);
//! // All-reduced where it lies, after the fill in stream order.
//! let view = comm.wrap_buffer(&grad, 0, DType::F32, len)?;
//! let _ = comm.all_reduce_in_place(&view, ReduceOp::Sum)?.wait()?;
//! // Read with the rank's own staging buffer.
//! Ok(read_back(comm, &grad))
//! # }
//! ```
//!
//! What there is: [`World`] and [`WorldConfig`] (the ranks, their
//! devices, SPMD runs), [`Placement`] (which ranks share a device),
//! [`HostLink`] (how hops between separate devices cross the host) and
//! [`request_device`] (a device able to share host memory),
//! [`Communicator`] (a rank's view of a group: tensors,
//! collectives, point-to-point calls, its device), [`Group`] (calls
//! launched together), [`Tensor`] and [`Work`] (the handle a
//! collective returns), [`Error`]; the [`graph`] module (traced graphs,
//! passes, an executor); [`FlightRecord`] (what every rank last did);
//! `init_logging` (the engine's logs on stderr; feature `log`, on by
//! default with `cli`, the benchmark binary's). With the cargo feature `mpi`,
//! `World::from_mpi` spreads a world over the processes of an MPI job
//! (`mpirun -n P`), each holding some of its ranks. The README's "Layout"
//! shows how the engine inside is layered; only `transport/mpi/raw.rs`
//! (the raw MPI calls), `device/hostmem.rs` (host memory devices import)
//! and one copy out of a landing buffer (`transport/staging.rs`) allow
//! `unsafe`.
#![warn(missing_docs)]
#![deny(unsafe_code)]
// Nothing reachable from a public call may panic or overflow unnoticed:
// arithmetic on sizes is checked or saturating, and each place left
// unchecked carries an `allow` saying why its values are in range.
#![deny(
    clippy::arithmetic_side_effects,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

mod algo;
mod api;
mod deadline;
mod device;
mod dtype;
mod error;
pub mod graph;
mod hash;
#[cfg(feature = "log")]
mod logging;
mod op;
mod runtime;
mod transport;

/// The README's examples, compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The other documents' examples, compiled (and run, unless `no_run`) as
/// doctests, so that none goes stale.
#[cfg(doctest)]
mod doc_examples {
    #[doc = include_str!("../ARCHITECTURE.md")]
    pub struct Architecture;
    #[doc = include_str!("../CONTRIBUTING.md")]
    pub struct Contributing;
    #[doc = include_str!("../docs/configuration.md")]
    pub struct Configuration;
    #[doc = include_str!("../docs/graphs.md")]
    pub struct Graphs;
    #[doc = include_str!("../docs/performance.md")]
    pub struct Performance;
    #[doc = include_str!("../docs/processes.md")]
    pub struct Processes;
    #[doc = include_str!("../docs/tuning.md")]
    pub struct Tuning;
}

/// The wgpu this crate is built on, so that users name the same one.
pub use wgpu;

pub use api::comm::Communicator;
pub use api::config::{HostLink, MAX_RANKS, Placement, Tune, WorldConfig};
pub use api::group::Group;
pub use api::host_link::request_device;
pub use api::work::Work;
pub use api::world::World;
pub use device::kernels::{reduction_wgsl, reduction_workgroups};
pub use device::tensor::{DType, Element, Tensor};
pub use error::{Error, Result};
#[cfg(feature = "log")]
pub use logging::init_logging;
pub use op::ReduceOp;
pub use runtime::cost::{Algorithm, CostModel};
pub use runtime::flight::{FlightEntry, FlightRecord, FlightState};
pub use runtime::fold_order::FoldOrder;
pub use runtime::plan::Plan;
pub use runtime::profile::Profile;
