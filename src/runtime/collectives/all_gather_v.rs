//! all_gather_v: every rank's tensor, concatenated in rank order, where
//! rank r contributes `counts[r]` elements (`MPI_Allgatherv`, torch's
//! uneven all_gather). On a shared device, device copies into every
//! rank's output; otherwise the ring, each segment passed on slice by
//! slice. Segments of 16-bit elements that would start mid-word are
//! gathered as whole words and packed on the host.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over counts whose total was checked against the tensors' lengths when the call was made, and ranks below n <= MAX_RANKS"
)]

use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::algo::ring;
use crate::algo::steps::Span;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, count_sum, missing, offsets,
    scratch,
};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// An all_gather_v: rank r gives `counts[r]` elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllGatherV {
    pub dtype: DType,
    pub counts: Vec<usize>,
}

impl AllGatherV {
    /// Whether every segment starts and ends on a 32-bit word.
    fn whole_words(&self) -> bool {
        self.counts.iter().all(|c| c * self.dtype.size() % 4 == 0)
    }
}

impl AllGatherV {
    /// The all_gather_v of `x`, rank r contributing `counts[r]` elements.
    pub(crate) fn of(x: &Tensor, counts: &[usize]) -> AllGatherV {
        AllGatherV {
            dtype: x.dtype(),
            counts: counts.to_vec(),
        }
    }
}

impl Unit for AllGatherV {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::lens(&self.counts)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        let total = count_sum(seat, "counts", &self.counts)?;
        let mine = self.counts.get(seat.rank).copied().unwrap_or(0);
        if input != mine {
            return Err(format!(
                "all_gather_v: this rank's tensor has {input} elements, but counts {:?} give it {mine}",
                self.counts
            ));
        }
        Ok(Layout::apart(total))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
    }

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        _calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        if self.whole_words() {
            Ok(())
        } else {
            Err(
                "segments of 16-bit elements of odd count start mid-word, where a copy cannot"
                    .into(),
            )
        }
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        let size = self.dtype.size();
        let (offs, _) = offsets(&self.counts, size);
        for (r, x) in ins.iter().enumerate() {
            let x = x.first().ok_or_else(|| missing(r))?;
            let bytes = (self.counts[r] * size) as u64;
            for o in outs.iter().filter_map(|o| o.first()) {
                steps.copy(x.buffer(), 0, o.buffer(), offs[r] as u64, bytes);
            }
        }
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        self.part(p, at.dev, at.ins, at.outs).map(|()| None)
    }
}

impl AllGatherV {
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
        let size = self.dtype.size();
        let (offs, total) = offsets(&self.counts, size);
        if total == 0 {
            return Ok(());
        }
        let mine = (self.counts[r] * size) as u64;
        if self.whole_words() {
            // Every segment starts on a word: gather in place in the output.
            if mine > 0 {
                p.copy(x.buffer(), 0, out.buffer(), offs[r] as u64, mine)?;
            }
            p.buf = out.buffer().clone();
            let segs: Vec<Span> = self
                .counts
                .iter()
                .zip(&offs)
                .map(|(c, o)| Span {
                    off: o / 4,
                    words: c * size / 4,
                })
                .collect();
            return ring::all_gather_v(p, &segs);
        }
        // Whole-word segments in scratch, gathered, then packed on the host.
        let words: Vec<usize> = self.counts.iter().map(|c| (c * size).div_ceil(4)).collect();
        let (woffs, wtotal) = offsets(&words, 1);
        let tmp = scratch(dev, wtotal)?;
        p.copy(
            x.buffer(),
            0,
            tmp.buffer(),
            (woffs[r] * 4) as u64,
            (words[r] * 4) as u64,
        )?;
        p.buf = tmp.buffer().clone();
        let segs: Vec<Span> = woffs
            .iter()
            .zip(&words)
            .map(|(&off, &words)| Span { off, words })
            .collect();
        ring::all_gather_v(p, &segs)?;
        let image = p.download_image(wtotal * 4)?;
        let mut packed = Vec::with_capacity(out.used_bytes() as usize);
        for (j, c) in self.counts.iter().enumerate() {
            packed.extend_from_slice(&image[woffs[j] * 4..woffs[j] * 4 + c * size]);
        }
        packed.resize(out.used_bytes() as usize, 0);
        p.buf = out.buffer().clone();
        p.upload_image(&packed)
    }
}
