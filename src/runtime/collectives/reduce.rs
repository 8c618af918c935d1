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
use crate::runtime::collectives::{Compared, Unit, firsts, missing, reducible, scratch};
use crate::runtime::fingerprint::Kind;
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

impl Unit for Reduce {
    fn kind(&self) -> Kind {
        Kind::Reduce
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn op(&self) -> Option<ReduceOp> {
        Some(self.op)
    }

    fn compared(&self) -> Compared {
        Compared {
            len: Some(self.len),
            root: Some(self.root),
            shape: 0,
        }
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::Chain]
    }

    fn direct_feasible(
        &self,
        dev: &RankDevice,
        ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        reducible(dev, ins.len())
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<()> {
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
        Ok(())
    }

    fn run(
        &self,
        _plan: Plan,
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
