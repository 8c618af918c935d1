//! reduce_scatter, and its coalesced form: rank r gets chunk r of the
//! reduction of every rank's tensor. On a shared device, the reduction
//! kernel over every rank's chunk where it lies; otherwise the ring over
//! chunks laid in aligned slots. Chunk c is folded in the ring's order
//! under both.
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
use crate::op::ReduceOp;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, reducible, scratch, share,
};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// A reduce-scatter of `len` elements (n times the output's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReduceScatter {
    pub dtype: DType,
    pub len: usize,
    pub op: ReduceOp,
}

/// Reduce-scatters of several tensors at once (`lens`: each input's elements).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReduceScatterCoalesced {
    pub dtype: DType,
    pub lens: Vec<usize>,
    pub op: ReduceOp,
}

impl ReduceScatter {
    /// The reduce-scatter of `x` with `op`.
    pub(crate) fn of(x: &Tensor, op: ReduceOp) -> ReduceScatter {
        ReduceScatter {
            dtype: x.dtype(),
            len: x.len(),
            op,
        }
    }
}

impl Unit for ReduceScatter {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn op(&self) -> Option<ReduceOp> {
        Some(self.op)
    }

    fn compared(&self) -> Compared {
        Compared::len(self.len)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        Ok(Layout::apart(share(seat, input)?))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
    }

    fn direct_feasible(
        &self,
        dev: &RankDevice,
        calls: &[&Collective],
        _ins: &[&[Tensor]],
        outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        feasible(dev, calls.len(), outs)
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        kernels(steps, self.dtype, self.op, ins, outs)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        each(p, at)
    }
}

impl ReduceScatterCoalesced {
    /// The reduce-scatter of every tensor of `xs` with `op`.
    pub(crate) fn of(xs: &[Tensor], op: ReduceOp) -> ReduceScatterCoalesced {
        ReduceScatterCoalesced {
            dtype: xs.first().map_or(DType::F32, Tensor::dtype),
            lens: xs.iter().map(Tensor::len).collect(),
            op,
        }
    }
}

impl Unit for ReduceScatterCoalesced {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn op(&self) -> Option<ReduceOp> {
        Some(self.op)
    }

    fn compared(&self) -> Compared {
        Compared::lens(&self.lens)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        Ok(Layout::apart(share(seat, input)?))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
    }

    fn direct_feasible(
        &self,
        dev: &RankDevice,
        calls: &[&Collective],
        _ins: &[&[Tensor]],
        outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        feasible(dev, calls.len(), outs)
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        kernels(steps, self.dtype, self.op, ins, outs)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        each(p, at)
    }
}

/// The reduction kernel binds every rank's chunk where it lies: `Ok`
/// when it can, else why not.
fn feasible(dev: &RankDevice, n: usize, outs: &[&[Tensor]]) -> std::result::Result<(), String> {
    reducible(dev, n)?;
    let align = dev.binding_align();
    if outs
        .iter()
        .flat_map(|o| o.iter())
        .all(|o| o.byte_len() % align == 0)
    {
        Ok(())
    } else {
        Err(format!(
            "each rank's chunk must be a multiple of {align} bytes for a kernel to bind it"
        ))
    }
}

/// On a shared device: for each tensor, the kernel reduces chunk r of
/// every rank's input into rank r's output.
fn kernels(
    steps: &mut Steps<'_>,
    dtype: DType,
    op: ReduceOp,
    ins: &[Vec<Tensor>],
    outs: &[Vec<Tensor>],
) -> Result<Option<SplitTable>> {
    for i in 0..ins.first().map_or(0, Vec::len) {
        let xs: Vec<&wgpu::Buffer> = ins
            .iter()
            .filter_map(|t| t.get(i))
            .map(Tensor::buffer)
            .collect();
        let os: Vec<&wgpu::Buffer> = outs
            .iter()
            .filter_map(|t| t.get(i))
            .map(Tensor::buffer)
            .collect();
        let chunk = outs
            .first()
            .and_then(|o| o.get(i))
            .map_or(0, Tensor::byte_len);
        steps.reduce_scatter(dtype, op, &xs, &os, chunk)?;
    }
    Ok(None)
}

/// The ring, tensor by tensor.
fn each(p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
    for (x, out) in at.ins.iter().zip(at.outs) {
        ring_scatter(p, at.dev, x, out)?;
    }
    Ok(None)
}

/// Reduce-scatters `x` (n chunks) into `out` (this rank's chunk) around
/// the ring.
fn ring_scatter(p: &mut Prims, dev: &Arc<RankDevice>, x: &Tensor, out: &Tensor) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    let m = out.len();
    let bytes = m * x.dtype().size();
    if bytes == 0 {
        return Ok(());
    }
    if n == 1 {
        return p.copy(x.buffer(), 0, out.buffer(), 0, out.used_bytes());
    }
    // Each chunk gets an aligned slot, so the kernels can bind it where it lies.
    let chunk = out.words();
    let slot = chunk.div_ceil(p.align_words()) * p.align_words();
    let tmp = scratch(dev, n * slot)?;
    if bytes % 4 == 0 {
        for c in 0..n {
            p.copy(
                x.buffer(),
                (c * bytes) as u64,
                tmp.buffer(),
                (c * slot * 4) as u64,
                bytes as u64,
            )?;
        }
    } else {
        // 16-bit elements, odd chunk length: chunks start mid-word; cut them on the host.
        p.buf = x.buffer().clone();
        let image = p.download_image(x.used_bytes() as usize)?;
        let mut slots = vec![0u8; n * slot * 4];
        for c in 0..n {
            slots[c * slot * 4..c * slot * 4 + bytes]
                .copy_from_slice(&image[c * bytes..(c + 1) * bytes]);
        }
        p.buf = tmp.buffer().clone();
        p.upload_image(&slots)?;
    }
    p.buf = tmp.buffer().clone();
    ring::reduce_scatter(p, slot, chunk)?;
    p.copy(
        tmp.buffer(),
        (r * slot * 4) as u64,
        out.buffer(),
        0,
        out.used_bytes(),
    )
}
