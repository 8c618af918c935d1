//! The SPMD shape: inside [`BurnWorld::run`](crate::BurnWorld::run) each
//! rank's closure holds a [`Rank`] and calls the collectives on its own
//! tensor, as a `torch.distributed` program does.

use burn_tensor::{Device, Tensor};
use wgpu_collectives::Communicator;

use crate::collective::{Kind, Reduction, stage};
use crate::error::Result;

/// One rank of a [`BurnWorld`](crate::BurnWorld) inside `run`: its burn
/// device and its communicator.
///
/// Every call blocks until the collective has completed on this rank (up
/// to the world's timeout), so the tensor it returns is ready for any burn
/// op. Every rank must make the same calls in the same order, with tensors
/// of one dtype and element count (the engine checks both and fails the
/// call on every rank otherwise; it cannot see how the dims split the
/// count, so keep those the same as well).
pub struct Rank<'a> {
    pub(crate) comm: &'a Communicator,
    pub(crate) device: &'a Device,
}

impl Rank<'_> {
    /// This rank's index, `0..size()`.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// How many ranks the world has.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// The burn device this rank's tensors live on.
    pub fn device(&self) -> &Device {
        self.device
    }

    /// The engine's communicator of this rank, for anything this crate
    /// does not wrap (point-to-point, splits, barriers).
    pub fn communicator(&self) -> &Communicator {
        self.comm
    }

    /// `x` reduced over all ranks with `op` (burn's `ReduceOperation` or
    /// the engine's `ReduceOp`). Written in place when `x` owns its handle
    /// alone, else into a fresh one.
    pub fn all_reduce<const D: usize>(
        &self,
        x: Tensor<D>,
        op: impl Reduction,
    ) -> Result<Tensor<D>> {
        self.call(Kind::AllReduce(op.reduce_op()), x)
    }

    /// Every rank's `x`, concatenated along dimension 0 in rank order.
    pub fn all_gather<const D: usize>(&self, x: Tensor<D>) -> Result<Tensor<D>> {
        self.call(Kind::AllGather, x)
    }

    /// `x` reduced over all ranks with `op`, of which this rank keeps
    /// chunk `rank()` along dimension 0 (whose size must split evenly).
    pub fn reduce_scatter<const D: usize>(
        &self,
        x: Tensor<D>,
        op: impl Reduction,
    ) -> Result<Tensor<D>> {
        self.call(Kind::ReduceScatter(op.reduce_op()), x)
    }

    /// `root`'s `x` on every rank. Elsewhere `x` says the shape and is
    /// written in place when it owns its handle alone (its contents are
    /// not read).
    pub fn broadcast<const D: usize>(&self, x: Tensor<D>, root: usize) -> Result<Tensor<D>> {
        self.call(Kind::Broadcast { root }, x)
    }

    fn call<const D: usize>(&self, kind: Kind, x: Tensor<D>) -> Result<Tensor<D>> {
        let staged = stage(self.comm, self.device, kind, x)?;
        let work = staged.issue(self.comm)?;
        staged.finish(work)
    }
}
