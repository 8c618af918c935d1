//! One collective on one rank, in three steps that both calling shapes
//! share: stage (take the burn tensor apart, choose where the result goes,
//! lend both to the engine), issue (the engine queues it and returns at
//! once), finish (wait for it, hand the result back to burn).
//!
//! Staging is itself two steps: checking (everything that can be wrong
//! with a tensor, without waiting on anything) and lending (which waits on
//! burn's device thread). A call in burn's own shape (one tensor per
//! device, driven from one thread) checks every rank's tensor before any
//! rank issues, so a bad tensor fails the call with nothing in flight;
//! then it lends and issues rank by rank, so the first ranks' collectives
//! start while the later ranks' tensors are being lent.

use burn_tensor::distributed::ReduceOperation;
use burn_tensor::{Device, Tensor};
use wgpu_collectives::{Communicator, ReduceOp, Work};

use crate::error::{Error, Result};
use crate::lend::{Lent, Taken, fresh, take};

/// A reduction: burn's own [`ReduceOperation`] (`Sum`, `Mean`), or any of
/// the engine's float reductions ([`ReduceOp`]: `Sum`, `Prod`, `Min`,
/// `Max`, `Avg`).
pub trait Reduction {
    /// The engine's operator.
    fn reduce_op(self) -> ReduceOp;
}

impl Reduction for ReduceOperation {
    fn reduce_op(self) -> ReduceOp {
        match self {
            ReduceOperation::Sum => ReduceOp::Sum,
            ReduceOperation::Mean => ReduceOp::Avg,
        }
    }
}

impl Reduction for ReduceOp {
    fn reduce_op(self) -> ReduceOp {
        self
    }
}

/// Which collective, with its operator or root.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    /// Along dimension 0.
    AllGather,
    /// Along dimension 0, in even chunks.
    ReduceScatter(ReduceOp),
    Broadcast {
        root: usize,
    },
}

impl Kind {
    /// The result's dims on a world of `n` ranks, for an input of `dims`.
    fn out_dims<const D: usize>(
        self,
        rank: usize,
        n: usize,
        dims: [usize; D],
    ) -> Result<[usize; D]> {
        let mut out = dims;
        match self {
            Kind::AllReduce(_) | Kind::Broadcast { .. } => {}
            Kind::AllGather => {
                let first = out.first_mut().ok_or_else(|| no_dim0(rank, "all_gather"))?;
                *first = first.checked_mul(n).ok_or_else(|| {
                    Error::tensor(rank, format!("all_gather: {n} x {dims:?} overflows"))
                })?;
            }
            Kind::ReduceScatter(_) => {
                let first = out
                    .first_mut()
                    .ok_or_else(|| no_dim0(rank, "reduce_scatter"))?;
                *first = match (first.checked_rem(n), first.checked_div(n)) {
                    (Some(0), Some(chunk)) => chunk,
                    _ => {
                        return Err(Error::tensor(
                            rank,
                            format!(
                                "reduce_scatter splits dimension 0 in {n} even chunks; \
                                 the tensor's dims are {dims:?}"
                            ),
                        ));
                    }
                };
            }
        }
        Ok(out)
    }

    /// Whether the result may be written over the input, when burn lets
    /// the input's handle be written.
    fn in_place(self) -> bool {
        matches!(self, Kind::AllReduce(_) | Kind::Broadcast { .. })
    }
}

fn no_dim0(rank: usize, what: &str) -> Error {
    Error::tensor(
        rank,
        format!("{what} works along dimension 0; a 0-dim tensor has none"),
    )
}

/// A collective staged on one rank: the input lent to the engine and the
/// output it writes (the same tensor when in place).
pub(crate) struct Staged {
    kind: Kind,
    /// `None` when the result is written over the input.
    input: Option<Lent>,
    output: Lent,
}

/// A rank's tensor checked for `kind` (nothing lent yet: no wait on the
/// device).
pub(crate) struct Checked<const D: usize> {
    kind: Kind,
    taken: Taken<D>,
    out_dims: [usize; D],
}

/// Checks `tensor` for `kind` on `comm`'s rank, whose burn device is
/// `device`: everything that can be wrong with it, before anything is lent.
pub(crate) fn check<const D: usize>(
    comm: &Communicator,
    device: &Device,
    kind: Kind,
    tensor: Tensor<D>,
) -> Result<Checked<D>> {
    let rank = comm.rank();
    let taken = take(rank, device, tensor)?;
    let out_dims = kind.out_dims(rank, comm.size(), taken.dims)?;
    Ok(Checked {
        kind,
        taken,
        out_dims,
    })
}

/// Stages `kind` on `comm`'s rank, whose burn device is `device`.
pub(crate) fn stage<const D: usize>(
    comm: &Communicator,
    device: &Device,
    kind: Kind,
    tensor: Tensor<D>,
) -> Result<Staged> {
    check(comm, device, kind, tensor)?.lend(comm)
}

impl<const D: usize> Checked<D> {
    /// Lends the tensor, and a fresh output unless the result is written
    /// in place: this waits on burn's device thread.
    pub(crate) fn lend(self, comm: &Communicator) -> Result<Staged> {
        let Checked {
            kind,
            taken,
            out_dims,
        } = self;
        if kind.in_place() && taken.cube.can_mut() {
            let output = Lent::new(comm, taken.cube, taken.dtype)?;
            return Ok(Staged {
                kind,
                input: None,
                output,
            });
        }
        let out = fresh(&taken.cube, out_dims);
        let input = Lent::new(comm, taken.cube, taken.dtype)?;
        let output = Lent::new(comm, out, taken.dtype)?;
        Ok(Staged {
            kind,
            input: Some(input),
            output,
        })
    }
}

impl Staged {
    /// Queues the collective on the engine; returns at once.
    pub(crate) fn issue(&self, comm: &Communicator) -> Result<Work> {
        let out = &self.output.view;
        let x = self.input.as_ref().map_or(out, |i| &i.view);
        let work = match self.kind {
            Kind::AllReduce(op) => comm.all_reduce_into(x, out, op),
            Kind::AllGather => comm.all_gather_into(x, out),
            Kind::ReduceScatter(op) => comm.reduce_scatter_into(x, out, op),
            Kind::Broadcast { root } => comm.broadcast_into(x, out, root),
        };
        Ok(work?)
    }

    /// Waits for `work` (the engine's deadline bounds it) and hands the
    /// result back to burn; the input's handle is released only now.
    pub(crate) fn finish<const D: usize>(self, work: Work) -> Result<Tensor<D>> {
        let _ = work.wait()?;
        drop(self.input);
        Ok(self.output.into_tensor())
    }
}
