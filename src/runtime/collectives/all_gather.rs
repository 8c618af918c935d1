//! all_gather, and its coalesced form: every rank's tensor on every rank,
//! in rank order. On a shared device, device copies from every rank's
//! input into every rank's output; otherwise the ring, in place in the
//! output.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]

use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::algo::ring;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, gathered, scratch, whole_words,
};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// An all-gather of `len` elements from each rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllGather {
    pub dtype: DType,
    /// Elements each rank contributes.
    pub len: usize,
}

/// All-gathers of several tensors at once (`lens`: each one's elements
/// per rank).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllGatherCoalesced {
    pub dtype: DType,
    pub lens: Vec<usize>,
}

impl AllGather {
    /// The all-gather of `x`.
    pub(crate) fn of(x: &Tensor) -> AllGather {
        AllGather {
            dtype: x.dtype(),
            len: x.len(),
        }
    }
}

impl Unit for AllGather {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::len(self.len)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        Ok(Layout::apart(gathered(seat, input)?))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
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
        copies(steps, ins, outs);
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        each(p, at)
    }
}

impl AllGatherCoalesced {
    /// The all-gather of every tensor of `xs`.
    pub(crate) fn of(xs: &[Tensor]) -> AllGatherCoalesced {
        AllGatherCoalesced {
            dtype: xs.first().map_or(DType::F32, Tensor::dtype),
            lens: xs.iter().map(Tensor::len).collect(),
        }
    }
}

impl Unit for AllGatherCoalesced {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::lens(&self.lens)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        Ok(Layout::apart(gathered(seat, input)?))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
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
        copies(steps, ins, outs);
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        each(p, at)
    }
}

/// On a shared device: rank r's i-th input into segment r of every
/// rank's i-th output.
fn copies(steps: &mut Steps<'_>, ins: &[Vec<Tensor>], outs: &[Vec<Tensor>]) {
    for i in 0..ins.first().map_or(0, Vec::len) {
        for (r, x) in ins.iter().enumerate() {
            let Some(x) = x.get(i) else { continue };
            let bytes = x.byte_len();
            for o in outs.iter().filter_map(|o| o.get(i)) {
                steps.copy(x.buffer(), 0, o.buffer(), r as u64 * bytes, bytes);
            }
        }
    }
}

/// The ring, tensor by tensor.
fn each(p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
    for (x, out) in at.ins.iter().zip(at.outs) {
        ring_gather(p, at.dev, x, out)?;
    }
    Ok(None)
}

/// All-gathers `x` into `out` (n x len, rank-major) around the ring.
fn ring_gather(p: &mut Prims, dev: &Arc<RankDevice>, x: &Tensor, out: &Tensor) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    let bytes = x.len() * x.dtype().size();
    if bytes == 0 {
        return Ok(());
    }
    if bytes % 4 == 0 {
        // Every segment starts on a word: gather in place in the output.
        let seg = bytes / 4;
        p.copy(
            x.buffer(),
            0,
            out.buffer(),
            (r * bytes) as u64,
            bytes as u64,
        )?;
        p.buf = out.buffer().clone();
        return ring::all_gather(p, seg);
    }
    // 16-bit elements, odd length: segments would start mid-word. Gather
    // whole-word segments in scratch, then pack them on the host.
    let seg = x.words();
    let tmp = scratch(dev, n * seg)?;
    p.copy(
        x.buffer(),
        0,
        tmp.buffer(),
        (r * seg * 4) as u64,
        (seg * 4) as u64,
    )?;
    p.buf = tmp.buffer().clone();
    ring::all_gather(p, seg)?;
    let image = p.download_image(n * seg * 4)?;
    let mut packed = Vec::with_capacity(out.used_bytes() as usize);
    for j in 0..n {
        packed.extend_from_slice(&image[j * seg * 4..j * seg * 4 + bytes]);
    }
    packed.resize(out.used_bytes() as usize, 0);
    p.buf = out.buffer().clone();
    p.upload_image(&packed)
}
