//! `Group`: calls gathered to launch together (`Communicator::group`), as
//! NCCL's `ncclGroupStart`/`ncclGroupEnd` and torch's `batch_isend_irecv`.
//!
//! A group only collects checked calls; the communicator numbers and
//! queues them as one op when the closure returns, so a group that fails
//! half way launches nothing, and a group's calls cannot interleave with
//! calls issued elsewhere on the communicator.

use std::cell::RefCell;

use crate::api::comm::{Call, Communicator, Dest};
use crate::api::work::Work;
use crate::device::tensor::Tensor;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::runtime::collectives::Collective;
use crate::runtime::collectives::all_gather::AllGather;
use crate::runtime::collectives::all_gather_v::AllGatherV;
use crate::runtime::collectives::all_reduce::AllReduce;
use crate::runtime::collectives::broadcast::Broadcast;
use crate::runtime::collectives::gather::Gather;
use crate::runtime::collectives::reduce::Reduce;
use crate::runtime::collectives::reduce_scatter::ReduceScatter;
use crate::runtime::collectives::reduce_scatter_v::ReduceScatterV;
use crate::runtime::collectives::scatter::Scatter;
use crate::runtime::collectives::send_recv::{Recv, Send};

/// The calls of one [`Communicator::group`]. Each method checks its
/// arguments as the communicator's method of the same name does, and
/// launches nothing until the group closes.
pub struct Group<'a> {
    comm: &'a Communicator,
    calls: RefCell<Vec<Call>>,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Group({:?}, {} calls)",
            self.comm,
            self.calls.borrow().len()
        )
    }
}

impl Communicator {
    /// Launches every call `calls` makes on its [`Group`] together, as
    /// `ncclGroupStart`/`ncclGroupEnd` (or torch's `batch_isend_irecv`)
    /// do: sends, receives and the `*_into` collectives, in any mix of
    /// kinds and dtypes, under one `Work` whose `wait_all` gives every
    /// call's outputs in call order (an empty tensor for a send). The
    /// calls of a group must not depend on each other: on each rank its
    /// sends go first, then its collectives in call order, then its
    /// receives, so a ring of sends and receives in one group cannot
    /// deadlock. Should `calls` fail, nothing is launched.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(3))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let (n, r) = (c.size(), c.rank());
    ///     let x = c.tensor(&[r as i32; 2])?;
    ///     let (from_prev, sum) = (c.zeros(DType::I32, 2)?, c.zeros(DType::I32, 2)?);
    ///     c.group(|g| {
    ///         g.send(&x, (r + 1) % n)?;
    ///         g.recv(&from_prev, (r + n - 1) % n)?;
    ///         g.all_reduce_into(&x, &sum, ReduceOp::Sum)
    ///     })?
    ///     .wait_all()?;
    ///     Ok([from_prev.to_vec::<i32>()?, sum.to_vec::<i32>()?].concat())
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![2, 2, 3, 3]);
    /// # Ok(()) }
    /// ```
    pub fn group<F>(&self, calls: F) -> Result<Work>
    where
        F: FnOnce(&Group<'_>) -> Result<()>,
    {
        let g = Group::new(self);
        calls(&g)?;
        self.issue_all(g.into_calls())
    }
}

impl<'a> Group<'a> {
    pub(crate) fn new(comm: &'a Communicator) -> Group<'a> {
        Group {
            comm,
            calls: RefCell::new(Vec::new()),
        }
    }

    pub(crate) fn into_calls(self) -> Vec<Call> {
        self.calls.into_inner()
    }

    fn add(&self, call: Result<Call>) -> Result<()> {
        self.calls.borrow_mut().push(call?);
        Ok(())
    }

    /// Adds the one-tensor call `what` of `x` into `out`, checked as the
    /// communicator checks every call.
    fn one(&self, what: impl Into<Collective>, x: &Tensor, out: &Tensor) -> Result<()> {
        self.add(
            self.comm
                .call(what.into(), std::slice::from_ref(x), Dest::Given(out)),
        )
    }

    /// The communicator the group's calls go to.
    pub fn communicator(&self) -> &Communicator {
        self.comm
    }

    /// [`Communicator::send`], launched with the group.
    pub fn send(&self, x: &Tensor, peer: usize) -> Result<()> {
        self.add(
            self.comm
                .call(Send::of(x, peer).into(), std::slice::from_ref(x), Dest::New),
        )
    }

    /// [`Communicator::recv`], launched with the group.
    pub fn recv(&self, out: &Tensor, peer: usize) -> Result<()> {
        self.add(
            self.comm
                .call(Recv::of(out, peer).into(), &[], Dest::Given(out)),
        )
    }

    /// [`Communicator::all_reduce_into`], launched with the group.
    pub fn all_reduce_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp) -> Result<()> {
        self.one(AllReduce::of(x, op), x, out)
    }

    /// [`Communicator::all_reduce_in_place`], launched with the group.
    pub fn all_reduce_in_place(&self, x: &Tensor, op: ReduceOp) -> Result<()> {
        self.one(AllReduce::of(x, op), x, x)
    }

    /// [`Communicator::broadcast_in_place`], launched with the group.
    pub fn broadcast_in_place(&self, x: &Tensor, root: usize) -> Result<()> {
        self.one(Broadcast::of(x, root), x, x)
    }

    /// [`Communicator::reduce_in_place`], launched with the group.
    pub fn reduce_in_place(&self, x: &Tensor, op: ReduceOp, root: usize) -> Result<()> {
        self.one(Reduce::of(x, op, root), x, x)
    }

    /// [`Communicator::all_gather_into`], launched with the group.
    pub fn all_gather_into(&self, x: &Tensor, out: &Tensor) -> Result<()> {
        self.one(AllGather::of(x), x, out)
    }

    /// [`Communicator::reduce_scatter_into`], launched with the group.
    pub fn reduce_scatter_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp) -> Result<()> {
        self.one(ReduceScatter::of(x, op), x, out)
    }

    /// [`Communicator::all_gather_v_into`], launched with the group.
    pub fn all_gather_v_into(&self, x: &Tensor, out: &Tensor, counts: &[usize]) -> Result<()> {
        self.one(AllGatherV::of(x, counts), x, out)
    }

    /// [`Communicator::reduce_scatter_v_into`], launched with the group.
    pub fn reduce_scatter_v_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        self.one(ReduceScatterV::of(x, counts, op), x, out)
    }

    /// [`Communicator::broadcast_into`], launched with the group.
    pub fn broadcast_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<()> {
        self.one(Broadcast::of(x, root), x, out)
    }

    /// [`Communicator::reduce_into`], launched with the group.
    pub fn reduce_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp, root: usize) -> Result<()> {
        self.one(Reduce::of(x, op, root), x, out)
    }

    /// [`Communicator::all_to_all_into`], launched with the group.
    pub fn all_to_all_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        send_counts: Option<&[usize]>,
        recv_counts: Option<&[usize]>,
    ) -> Result<()> {
        let what = self.comm.all_to_all_of(x, send_counts, recv_counts)?;
        self.one(what, x, out)
    }

    /// [`Communicator::gather_into`], launched with the group.
    pub fn gather_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<()> {
        self.one(Gather::of(x, root), x, out)
    }

    /// [`Communicator::scatter_into`], launched with the group.
    pub fn scatter_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<()> {
        self.one(Scatter::of(out, root), x, out)
    }
}
