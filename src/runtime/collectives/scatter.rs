//! scatter: slice r of the root's tensor to rank r (the input is not read
//! elsewhere). On a shared device, device copies out of the root's
//! input; otherwise the root hands each rank its slices in turn.

use crate::algo::direct::Steps;
use crate::algo::star;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, firsts, gathered, missing, root_of,
    whole_words,
};
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

impl Scatter {
    /// The scatter from `root` into `out` (its length is each rank's share).
    pub(crate) fn of(out: &Tensor, root: usize) -> Scatter {
        Scatter {
            dtype: out.dtype(),
            len: out.len(),
            root,
        }
    }
}

impl Unit for Scatter {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::rooted(self.len, self.root)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        root_of(seat, self.root)?;
        let want = gathered(seat, self.len)?;
        if seat.rank == self.root && input != want {
            return Err(format!(
                "the root's input has {input} elements, {want} expected ({} ranks x {})",
                seat.size, self.len
            ));
        }
        Ok(Layout::apart(self.len))
    }

    fn reads_input(&self, rank: usize) -> bool {
        rank == self.root
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::Star]
    }

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        _calls: &[&Collective],
        _ins: &[&[Tensor]],
        outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        whole_words("slices", outs)
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
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
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        self.part(p, at.ins, at.outs).map(|()| None)
    }
}

impl Scatter {
    /// This rank's part, on views its steps can work on where they lie.
    fn part(&self, p: &mut Prims<'_>, ins: &[Tensor], outs: &[Tensor]) -> Result<()> {
        let (Some(x), Some(out)) = (ins.first(), outs.first()) else {
            return Err(missing(p.rank()));
        };
        let bytes = usize::try_from(out.byte_len()).unwrap_or(usize::MAX);
        star::scatter(p, self.root, x.buffer(), out.buffer(), bytes)
    }
}
