//! `Group`: calls gathered to launch together (`Communicator::group`), as
//! NCCL's `ncclGroupStart`/`ncclGroupEnd` and torch's `batch_isend_irecv`.
//!
//! A group only collects checked calls; the communicator numbers and
//! queues them as one op when the closure returns, so a group that fails
//! half way launches nothing, and a group's calls cannot interleave with
//! calls issued elsewhere on the communicator.

use std::cell::RefCell;

use crate::api::comm::{Call, Communicator};
use crate::device::tensor::Tensor;
use crate::error::Result;
use crate::op::ReduceOp;

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

    /// The communicator the group's calls go to.
    pub fn communicator(&self) -> &Communicator {
        self.comm
    }

    /// [`Communicator::send`], launched with the group.
    pub fn send(&self, x: &Tensor, peer: usize) -> Result<()> {
        self.add(self.comm.send_call(x, peer))
    }

    /// [`Communicator::recv`], launched with the group.
    pub fn recv(&self, out: &Tensor, peer: usize) -> Result<()> {
        self.add(self.comm.recv_call(out, peer))
    }

    /// [`Communicator::all_reduce_into`], launched with the group.
    pub fn all_reduce_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp) -> Result<()> {
        self.add(self.comm.all_reduce_into_call(x, out, op))
    }

    /// [`Communicator::all_reduce_in_place`], launched with the group.
    pub fn all_reduce_in_place(&self, x: &Tensor, op: ReduceOp) -> Result<()> {
        self.add(self.comm.all_reduce_into_call(x, x, op))
    }

    /// [`Communicator::broadcast_in_place`], launched with the group.
    pub fn broadcast_in_place(&self, x: &Tensor, root: usize) -> Result<()> {
        self.add(self.comm.broadcast_into_call(x, x, root))
    }

    /// [`Communicator::reduce_in_place`], launched with the group.
    pub fn reduce_in_place(&self, x: &Tensor, op: ReduceOp, root: usize) -> Result<()> {
        self.add(self.comm.reduce_into_call(x, x, op, root))
    }

    /// [`Communicator::all_gather_into`], launched with the group.
    pub fn all_gather_into(&self, x: &Tensor, out: &Tensor) -> Result<()> {
        self.add(self.comm.all_gather_into_call(x, out))
    }

    /// [`Communicator::reduce_scatter_into`], launched with the group.
    pub fn reduce_scatter_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp) -> Result<()> {
        self.add(self.comm.reduce_scatter_into_call(x, out, op))
    }

    /// [`Communicator::all_gather_v_into`], launched with the group.
    pub fn all_gather_v_into(&self, x: &Tensor, out: &Tensor, counts: &[usize]) -> Result<()> {
        self.add(self.comm.all_gather_v_into_call(x, out, counts))
    }

    /// [`Communicator::reduce_scatter_v_into`], launched with the group.
    pub fn reduce_scatter_v_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<()> {
        self.add(self.comm.reduce_scatter_v_into_call(x, out, counts, op))
    }

    /// [`Communicator::broadcast_into`], launched with the group.
    pub fn broadcast_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<()> {
        self.add(self.comm.broadcast_into_call(x, out, root))
    }

    /// [`Communicator::reduce_into`], launched with the group.
    pub fn reduce_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp, root: usize) -> Result<()> {
        self.add(self.comm.reduce_into_call(x, out, op, root))
    }

    /// [`Communicator::all_to_all_into`], launched with the group.
    pub fn all_to_all_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        send_counts: Option<&[usize]>,
        recv_counts: Option<&[usize]>,
    ) -> Result<()> {
        self.add(
            self.comm
                .all_to_all_into_call(x, out, send_counts, recv_counts),
        )
    }

    /// [`Communicator::gather_into`], launched with the group.
    pub fn gather_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<()> {
        self.add(self.comm.gather_into_call(x, out, root))
    }

    /// [`Communicator::scatter_into`], launched with the group.
    pub fn scatter_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<()> {
        self.add(self.comm.scatter_into_call(x, out, root))
    }
}
