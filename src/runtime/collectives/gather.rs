//! gather: every rank's tensor at the root, in rank order (the output is
//! not touched elsewhere). On a shared device, device copies into the
//! root's output; otherwise the root takes each rank's slices in turn.

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

/// A gather of `len` elements from every rank to `root`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gather {
    pub dtype: DType,
    /// Elements each rank contributes.
    pub len: usize,
    pub root: usize,
}

impl Gather {
    /// The gather of `x` to `root`.
    pub(crate) fn of(x: &Tensor, root: usize) -> Gather {
        Gather {
            dtype: x.dtype(),
            len: x.len(),
            root,
        }
    }
}

impl Unit for Gather {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::rooted(self.len, self.root)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        root_of(seat, self.root)?;
        if seat.rank == self.root {
            Ok(Layout::apart(gathered(seat, input)?))
        } else {
            // Off the root the output is not touched.
            Ok(Layout {
                out: None,
                ..Layout::apart(0)
            })
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
        _calls: &[&Collective],
        ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        whole_words("segments", ins)
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
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        self.part(p, at.ins, at.outs).map(|()| None)
    }
}

impl Gather {
    /// This rank's part, on views its steps can work on where they lie.
    fn part(&self, p: &mut Prims<'_>, ins: &[Tensor], outs: &[Tensor]) -> Result<()> {
        let (Some(x), Some(out)) = (ins.first(), outs.first()) else {
            return Err(missing(p.rank()));
        };
        let bytes = usize::try_from(x.byte_len()).unwrap_or(usize::MAX);
        star::gather(p, self.root, x.buffer(), out.buffer(), bytes)
    }
}
