//! all_reduce, and its coalesced form: the reduction of every rank's
//! tensor on every rank. It offers every plan the engine has: on a shared
//! device the reduction kernel over every rank's part where it lies
//! (`Direct`); between devices the ring with WGSL reduction kernels on
//! each rank's device (`DeviceRing`), the same ring folded on the host
//! (`HostRing`), or every rank reducing every part (`OneShot`). All fold
//! each part in the ring's order, so all give the same bits; across
//! processes sharing a device each, the two-level plan (`TwoLevel`,
//! `runtime/two_level.rs`) folds in an order of its own, and runs only
//! where the fold order allows it.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]

use crate::algo::direct::Steps;
use crate::algo::fold::HostFold;
use crate::algo::{oneshot, part_words, ring};
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, firsts, missing, reducible, scratch,
};
use crate::runtime::host_oneshot;
use crate::runtime::host_ring::HostSteps;
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;
use crate::runtime::two_level;

/// An all-reduce of `len` elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllReduce {
    pub dtype: DType,
    pub len: usize,
    pub op: ReduceOp,
}

impl AllReduce {
    /// The all-reduce of `x` with `op`.
    pub(crate) fn of(x: &Tensor, op: ReduceOp) -> AllReduce {
        AllReduce {
            dtype: x.dtype(),
            len: x.len(),
            op,
        }
    }
}

impl Unit for AllReduce {
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
        let _ = seat;
        Ok(Layout::in_place(input))
    }

    fn plans(&self) -> &'static [Plan] {
        &[
            Plan::Direct,
            Plan::DeviceRing,
            Plan::HostRing,
            Plan::OneShot,
            Plan::TwoLevel,
        ]
    }

    fn priced(&self) -> Option<usize> {
        Some(self.dtype.words(self.len).saturating_mul(4))
    }

    fn any_view(&self, plan: Plan) -> bool {
        plan == Plan::HostRing
    }

    fn direct_feasible(
        &self,
        dev: &RankDevice,
        calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        reducible(dev, calls.len())
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        let xs: Vec<&wgpu::Buffer> = firsts(ins)?.into_iter().map(Tensor::buffer).collect();
        let os: Vec<&wgpu::Buffer> = firsts(outs)?.into_iter().map(Tensor::buffer).collect();
        let words = self.dtype.words(self.len);
        let q = part_words(words, xs.len());
        steps.all_reduce(self.dtype, self.op, &xs, &os, words, q)?;
        Ok(None)
    }

    fn run(&self, plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        let n = p.nranks;
        let (Some(x), Some(out)) = (at.ins.first(), at.outs.first()) else {
            return Err(missing(p.rank()));
        };
        let fold = HostFold {
            dtype: x.dtype(),
            op: self.op,
            ranks: u32::try_from(n).unwrap_or(u32::MAX),
        };
        if plan == Plan::HostRing {
            on_host(p, x, out, fold)?;
            return Ok(None);
        }
        if plan == Plan::TwoLevel {
            let tier = at.tier.ok_or_else(|| {
                p.w.device_error("the plan two-level ran without a tier (a bug)".into())
            })?;
            // The shard between processes: on the host where the host
            // folds this adapter's bits, as between separate devices.
            two_level::all_reduce(p, at.dev, tier, (x, out), fold, |p, shard| {
                if tier.host_fold {
                    on_host(p, shard, shard, fold)
                } else {
                    ring::all_reduce(p, shard.words())
                }
            })?;
            return Ok(None);
        }
        // The one-shot has two homes, fixed by this rank's link for the
        // world's life (so the table times the one that runs): host
        // memory, where the device imports it, else the device. Both fold
        // each part in the ring's order (the same bits) and pair on the
        // wire, so ranks whose devices differ here still pair.
        if plan == Plan::OneShot && n > 1 && x.words() > 0 && p.folds_in_host_memory() {
            host_oneshot::all_reduce(p, x, out, fold)?;
            return Ok(None);
        }
        // Out of place, the input is copied first and reduced in place.
        // Reading it where it lies instead (a kernel writing dst = op(x,
        // received)) saves the copy but, on CPU adapters, streams three
        // buffers through the cache instead of two: measured slower on
        // lavapipe, so not done.
        if !x.same_view(out) {
            p.copy(x.buffer(), 0, out.buffer(), 0, x.used_bytes())?;
        }
        p.buf = out.buffer().clone();
        let words = x.words();
        // The one-shot folds each part in the ring's order: the same bits.
        if plan == Plan::OneShot && n > 1 && words > 0 {
            let stride = words.div_ceil(p.align_words()) * p.align_words();
            let all = scratch(at.dev, n * stride)?;
            oneshot::all_reduce(p, all.buffer(), stride, words)?;
        } else {
            ring::all_reduce(p, words)?;
        }
        Ok(None)
    }
}

/// An all-reduce as the ring on the host (`algo/fold.rs`): down once from
/// the input, the ring's steps on a host image, up once into the output
/// (no device copy of the input into the output first). `fold` says how
/// (its dtype may differ from the tensors', which may be words).
fn on_host(p: &mut Prims, x: &Tensor, out: &Tensor, fold: HostFold) -> Result<()> {
    // The image holds the ring's padded words; only the view's own bytes
    // come down and go up.
    let words = x.words();
    let bytes = usize::try_from(x.byte_len().next_multiple_of(4)).unwrap_or(usize::MAX);
    let folded = p.fold_in_host_memory(
        Some((x.buffer(), x.word_offset())),
        (out.buffer(), out.word_offset()),
        (bytes, words * 4),
        |p, image| ring::all_reduce(&mut HostSteps { p, image, fold }, words),
    )?;
    if folded {
        return Ok(());
    }
    p.buf = x.buffer().clone();
    let mut image = p.download_image_at(x.word_offset(), bytes)?;
    image.resize(words * 4, 0);
    let steps = &mut HostSteps {
        p: &mut *p,
        image: &mut image,
        fold,
    };
    ring::all_reduce(steps, words)?;
    p.buf = out.buffer().clone();
    let own = image.get(..bytes).unwrap_or(&image);
    p.upload_image_at(out.word_offset(), own)?;
    p.recycle(image);
    Ok(())
}

/// All-reduces of several tensors at once, in one pass over their
/// concatenation (each starting on a 16-byte unit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllReduceCoalesced {
    pub dtype: DType,
    pub lens: Vec<usize>,
    pub op: ReduceOp,
}

impl AllReduceCoalesced {
    /// The all-reduce of every tensor of `xs` with `op`.
    pub(crate) fn of(xs: &[Tensor], op: ReduceOp) -> AllReduceCoalesced {
        AllReduceCoalesced {
            dtype: xs.first().map_or(DType::F32, Tensor::dtype),
            lens: xs.iter().map(Tensor::len).collect(),
            op,
        }
    }
}

impl Unit for AllReduceCoalesced {
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
        let _ = seat;
        // The ring runs over their concatenation, which must fit one buffer.
        let total = self
            .lens
            .iter()
            .try_fold(0usize, |a, &l| a.checked_add(l))
            .ok_or_else(|| format!("the coalesced tensors' lengths {:?} overflow", self.lens))?;
        Ok(Layout {
            scratch: total,
            ..Layout::apart(input)
        })
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
    }

    fn direct_feasible(
        &self,
        dev: &RankDevice,
        calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        reducible(dev, calls.len())
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        _calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        // One pass over each rank's concatenation, as the ring does.
        let n = ins.len();
        let total: usize = ins
            .first()
            .map_or(0, |xs| xs.iter().map(Tensor::words).sum());
        let mut flats = Vec::with_capacity(n);
        for xs in ins {
            // An empty list moves nothing.
            let Some(first) = xs.first() else {
                return Ok(None);
            };
            let flat = Tensor::output(first.rank_device(), DType::U32, total)?;
            let mut off = 0;
            for x in xs {
                steps.copy(x.buffer(), 0, flat.buffer(), off, x.used_bytes());
                off += x.used_bytes();
            }
            flats.push(flat);
        }
        let fs: Vec<&wgpu::Buffer> = flats.iter().map(Tensor::buffer).collect();
        let q = part_words(total, n);
        steps.all_reduce(self.dtype, self.op, &fs, &fs, total, q)?;
        for (flat, os) in flats.iter().zip(outs) {
            let mut off = 0;
            for o in os {
                steps.copy(flat.buffer(), off, o.buffer(), 0, o.used_bytes());
                off += o.used_bytes();
            }
        }
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        let total: usize = at.ins.iter().map(|x| x.words()).sum();
        if total == 0 {
            return Ok(None);
        }
        let flat = scratch(at.dev, total)?;
        let mut off = 0u64;
        for x in at.ins {
            p.copy(x.buffer(), 0, flat.buffer(), off, x.used_bytes())?;
            off += x.used_bytes();
        }
        p.buf = flat.buffer().clone();
        ring::all_reduce(p, total)?;
        let mut off = 0u64;
        for out in at.outs {
            p.copy(flat.buffer(), off, out.buffer(), 0, out.used_bytes())?;
            off += out.used_bytes();
        }
        Ok(None)
    }
}
