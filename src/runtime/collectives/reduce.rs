//! reduce: the reduction of every rank's tensor, at the root, folded from
//! rank root+1 round to the root. On a shared device one kernel folds
//! every rank's input into the root's output; otherwise a chain towards
//! the root, each rank folding in its own and passing the partial on.

use std::sync::Arc;

use crate::algo::chain;
use crate::algo::direct::Steps;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, firsts, missing, reducible,
    root_of, scratch,
};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// A reduce of `len` elements to `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reduce {
    pub dtype: DType,
    pub len: usize,
    pub op: ReduceOp,
    pub root: usize,
}

impl Reduce {
    /// The reduction of `x` with `op` to `root`.
    pub(crate) fn of(x: &Tensor, op: ReduceOp, root: usize) -> Reduce {
        Reduce {
            dtype: x.dtype(),
            len: x.len(),
            op,
            root,
        }
    }
}

impl Unit for Reduce {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn op(&self) -> Option<ReduceOp> {
        Some(self.op)
    }

    fn compared(&self) -> Compared {
        Compared::rooted(self.len, self.root)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        root_of(seat, self.root)?;
        Ok(Layout::in_place(input))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::Chain]
    }

    fn direct_feasible(
        &self,
        dev: &RankDevice,
        _calls: &[&Collective],
        ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        reducible(dev, ins.len())
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        let (xs, os) = (firsts(ins)?, firsts(outs)?);
        let out = os.get(self.root).ok_or_else(|| missing(self.root))?;
        let bytes = xs.first().map_or(0, |x| x.used_bytes());
        let bufs: Vec<&wgpu::Buffer> = xs.iter().map(|x| x.buffer()).collect();
        steps.reduce(self.dtype, self.op, &bufs, self.root, out.buffer(), bytes)?;
        // The other ranks' outputs keep their own input.
        for (r, (x, o)) in xs.iter().zip(&os).enumerate() {
            if r != self.root {
                steps.copy(x.buffer(), 0, o.buffer(), 0, x.used_bytes());
            }
        }
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        self.part(p, at.dev, at.ins, at.outs).map(|()| None)
    }
}

impl Reduce {
    /// This rank's part, on views its steps can work on where they lie.
    fn part(
        &self,
        p: &mut Prims<'_>,
        dev: &Arc<RankDevice>,
        ins: &[Tensor],
        outs: &[Tensor],
    ) -> Result<()> {
        let r = p.rank();
        let (Some(x), Some(out)) = (ins.first(), outs.first()) else {
            return Err(missing(r));
        };
        // Partial results pass through every rank's working buffer; off
        // the root, an in-place call's tensor must keep its bytes.
        let spare;
        let work = if x.same_view(out) && r != self.root {
            spare = scratch(dev, x.words())?;
            &spare
        } else {
            out
        };
        if !x.same_view(work) {
            p.copy(x.buffer(), 0, work.buffer(), 0, x.used_bytes())?;
        }
        p.buf = work.buffer().clone();
        chain::reduce(p, self.root, x.words())
    }
}
