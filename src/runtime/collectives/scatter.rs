//! scatter: slice r of the root's tensor to rank r (the input is not read
//! elsewhere). On a shared device, device copies out of the root's
//! input; otherwise the root hands each rank its slices in turn.

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

/// A scatter from `root` of `len` elements to each rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scatter {
    pub dtype: DType,
    /// Elements each rank receives.
    pub len: usize,
    pub root: usize,
}

impl Unit for Scatter {
    fn kind(&self) -> Kind {
        Kind::Scatter
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

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        _ins: &[&[Tensor]],
        outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        whole_words("slices", outs)
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<()> {
        let (xs, os) = (firsts(ins)?, firsts(outs)?);
        let x = xs.get(self.root).ok_or_else(|| missing(self.root))?;
        let bytes = os.first().map_or(0, |o| o.byte_len());
        for (r, o) in os.iter().enumerate() {
            steps.copy(
                x.buffer(),
                (r as u64).saturating_mul(bytes),
                o.buffer(),
                0,
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
        let bytes = usize::try_from(out.byte_len()).unwrap_or(usize::MAX);
        star::scatter(p, self.root, x.buffer(), out.buffer(), bytes)
    }
}
