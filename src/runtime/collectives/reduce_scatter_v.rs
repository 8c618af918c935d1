//! reduce_scatter_v: the reduction of every rank's tensor, of which rank
//! r gets `counts[r]` elements, from the offset of the counts before it
//! (`MPI_Reduce_scatter`). Chunk c is folded in the ring's order, from
//! rank c+1 round to rank c, under every plan: on a shared device the
//! reduction kernel over every rank's chunk where it lies, otherwise the
//! ring over chunks laid in aligned slots.
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
use crate::op::ReduceOp;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, count_sum, missing, offsets,
    reducible, scratch,
};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// A reduce_scatter_v: rank r gets `counts[r]` elements of the reduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReduceScatterV {
    pub dtype: DType,
    pub counts: Vec<usize>,
    pub op: ReduceOp,
}

impl ReduceScatterV {
    /// The reduce_scatter_v of `x` with `op`, rank r getting `counts[r]` elements.
    pub(crate) fn of(x: &Tensor, counts: &[usize], op: ReduceOp) -> ReduceScatterV {
        ReduceScatterV {
            dtype: x.dtype(),
            counts: counts.to_vec(),
            op,
        }
    }
}

impl Unit for ReduceScatterV {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn op(&self) -> Option<ReduceOp> {
        Some(self.op)
    }

    fn compared(&self) -> Compared {
        Compared::lens(&self.counts)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        let total = count_sum(seat, "counts", &self.counts)?;
        if input != total {
            return Err(format!(
                "reduce_scatter_v: the tensor has {input} elements, but counts {:?} add up to {total}",
                self.counts
            ));
        }
        Ok(Layout::apart(
            self.counts.get(seat.rank).copied().unwrap_or(0),
        ))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
    }

    fn direct_feasible(
        &self,
        dev: &RankDevice,
        _calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        reducible(dev, self.counts.len())?;
        let a = usize::try_from(dev.binding_align()).unwrap_or(usize::MAX);
        let (offs, _) = offsets(&self.counts, self.dtype.size());
        if offs.iter().all(|o| o % a == 0) {
            Ok(())
        } else {
            Err(format!(
                "each chunk must start on a multiple of {a} bytes for a kernel to bind it where it lies"
            ))
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
        let xs: Vec<&wgpu::Buffer> = ins
            .iter()
            .enumerate()
            .map(|(r, x)| x.first().map(Tensor::buffer).ok_or_else(|| missing(r)))
            .collect::<Result<_>>()?;
        for (c, o) in outs.iter().enumerate() {
            let o = o.first().ok_or_else(|| missing(c))?;
            let bytes = (self.counts[c] * size) as u64;
            steps.reduce_from(
                self.dtype,
                self.op,
                &xs,
                c,
                offs[c] as u64,
                o.buffer(),
                bytes,
            )?;
        }
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        self.part(p, at.dev, at.ins, at.outs).map(|()| None)
    }
}

impl ReduceScatterV {
    /// This rank's part, on views its steps can work on where they lie.
    fn part(
        &self,
        p: &mut Prims<'_>,
        dev: &Arc<RankDevice>,
        ins: &[Tensor],
        outs: &[Tensor],
    ) -> Result<()> {
        let (n, r) = (p.nranks, p.rank());
        let (Some(x), Some(out)) = (ins.first(), outs.first()) else {
            return Err(missing(r));
        };
        let size = self.dtype.size();
        let (offs, total) = offsets(&self.counts, size);
        if total == 0 {
            return Ok(());
        }
        if n == 1 {
            return p.copy(x.buffer(), 0, out.buffer(), 0, out.used_bytes());
        }
        // Each chunk gets an aligned slot, so the kernels can bind it where it lies.
        let a = p.align_words();
        let words: Vec<usize> = self.counts.iter().map(|c| (c * size).div_ceil(4)).collect();
        let slots: Vec<usize> = words
            .iter()
            .map(|w| w.next_multiple_of(4).div_ceil(a) * a)
            .collect();
        let (soffs, stotal) = offsets(&slots, 1);
        let tmp = scratch(dev, stotal)?;
        if offs.iter().all(|o| o % 4 == 0) {
            for c in 0..n {
                p.copy(
                    x.buffer(),
                    offs[c] as u64,
                    tmp.buffer(),
                    (soffs[c] * 4) as u64,
                    (words[c] * 4) as u64,
                )?;
            }
        } else {
            // 16-bit chunks that start mid-word: cut them on the host.
            p.buf = x.buffer().clone();
            let image = p.download_image(x.used_bytes() as usize)?;
            let mut laid = vec![0u8; stotal * 4];
            for c in 0..n {
                let bytes = self.counts[c] * size;
                laid[soffs[c] * 4..soffs[c] * 4 + bytes]
                    .copy_from_slice(&image[offs[c]..offs[c] + bytes]);
            }
            p.buf = tmp.buffer().clone();
            p.upload_image(&laid)?;
        }
        p.buf = tmp.buffer().clone();
        // The kernels fold whole 16-byte units: a chunk's span covers them
        // (its slot has the room; what lies past the chunk is never copied
        // out).
        let chunks: Vec<Span> = soffs
            .iter()
            .zip(&words)
            .map(|(&off, &words)| Span {
                off,
                words: words.next_multiple_of(4),
            })
            .collect();
        ring::reduce_scatter_v(p, &chunks)?;
        p.copy(
            tmp.buffer(),
            (soffs[r] * 4) as u64,
            out.buffer(),
            0,
            out.used_bytes(),
        )
    }
}
