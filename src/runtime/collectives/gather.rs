//! gather: every rank's tensor at the root, in rank order (the output is
//! not touched elsewhere). On a shared device, device copies into the
//! root's output; otherwise the root takes each rank's slices in turn.

use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::algo::star;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{Compared, Unit, firsts, missing, whole_words};
use crate::runtime::fingerprint::Kind;
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// A gather of `len` elements from every rank to `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gather {
    pub dtype: DType,
    /// Elements each rank contributes.
    pub len: usize,
    pub root: usize,
}

impl Unit for Gather {
    fn kind(&self) -> Kind {
        Kind::Gather
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    fn compared(&self) -> Compared {
        Compared {
            len: Some(self.len),
            root: Some(self.root),
            shape: 0,
        }
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::Star]
    }

    fn writes_output(&self, rank: usize) -> bool {
        rank == self.root
    }

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        whole_words("segments", ins)
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<()> {
        let (xs, os) = (firsts(ins)?, firsts(outs)?);
        let out = os.get(self.root).ok_or_else(|| missing(self.root))?;
        let bytes = xs.first().map_or(0, |x| x.byte_len());
        for (r, x) in xs.iter().enumerate() {
            steps.copy(
                x.buffer(),
                0,
                out.buffer(),
                (r as u64).saturating_mul(bytes),
                bytes,
            );
        }
        Ok(())
    }

    fn run(
        &self,
        _plan: Plan,
        p: &mut Prims<'_>,
        _dev: &Arc<RankDevice>,
        ins: &[Tensor],
        outs: &[Tensor],
    ) -> Result<()> {
        let (Some(x), Some(out)) = (ins.first(), outs.first()) else {
            return Err(missing(p.rank()));
        };
        let bytes = usize::try_from(x.byte_len()).unwrap_or(usize::MAX);
        star::gather(p, self.root, x.buffer(), out.buffer(), bytes)
    }
}
