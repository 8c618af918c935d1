//! broadcast: the root's tensor on every rank. On a shared device, device
//! copies from the root's buffer; otherwise a chain from the root, slice
//! by slice, each rank passing on what it received.

use crate::algo::chain;
use crate::algo::direct::Steps;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, missing, root_of,
};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// A broadcast of `len` elements from `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Broadcast {
    pub dtype: DType,
    pub len: usize,
    pub root: usize,
}

impl Broadcast {
    /// The broadcast of `x` from `root`.
    pub(crate) fn of(x: &Tensor, root: usize) -> Broadcast {
        Broadcast {
            dtype: x.dtype(),
            len: x.len(),
            root,
        }
    }
}

impl Unit for Broadcast {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
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

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        let x = ins
            .get(self.root)
            .and_then(|x| x.first())
            .ok_or_else(|| missing(self.root))?;
        for o in outs.iter().filter_map(|o| o.first()) {
            steps.copy(x.buffer(), 0, o.buffer(), 0, x.used_bytes());
        }
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        self.part(p, at.ins, at.outs).map(|()| None)
    }
}

impl Broadcast {
    /// This rank's part, on views its steps can work on where they lie.
    fn part(&self, p: &mut Prims<'_>, ins: &[Tensor], outs: &[Tensor]) -> Result<()> {
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
