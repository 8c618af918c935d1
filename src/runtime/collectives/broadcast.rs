//! broadcast: the root's tensor on every rank. On a shared device, device
//! copies from the root's buffer; otherwise a chain from the root, slice
//! by slice, each rank passing on what it received.

use std::sync::Arc;

use crate::algo::chain;
use crate::algo::direct::Steps;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{Compared, Unit, missing};
use crate::runtime::fingerprint::Kind;
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// A broadcast of `len` elements from `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Broadcast {
    pub dtype: DType,
    pub len: usize,
    pub root: usize,
}

impl Unit for Broadcast {
    fn kind(&self) -> Kind {
        Kind::Broadcast
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
        &[Plan::Direct, Plan::Chain]
    }

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        Ok(())
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<()> {
        let x = ins
            .get(self.root)
            .and_then(|x| x.first())
            .ok_or_else(|| missing(self.root))?;
        for o in outs.iter().filter_map(|o| o.first()) {
            steps.copy(x.buffer(), 0, o.buffer(), 0, x.used_bytes());
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
        let r = p.rank();
        let (Some(x), Some(out)) = (ins.first(), outs.first()) else {
            return Err(missing(r));
        };
        if r == self.root && !x.same_view(out) {
            p.copy(x.buffer(), 0, out.buffer(), 0, x.used_bytes())?;
        }
        p.buf = out.buffer().clone();
        chain::broadcast(p, self.root, x.words())
    }
}
