//! Views a collective's steps cannot work on where they lie (a view that
//! does not start on a whole unit of its buffer, say), run through
//! pooled stand-ins: copied in before the steps, copied back after,
//! touching no byte outside the view. Written once for both places that
//! run steps: the progress thread's schedules (`Prims`, a submission per
//! copy) and the shared device's meeting (`Steps`, the group's one
//! encoder).
#![allow(
    clippy::arithmetic_side_effects,
    reason = "byte math within a tensor, whose byte size was checked when it was made"
)]

use std::borrow::Cow;
use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::device::RankDevice;
use crate::device::tensor::{DType, Tensor};
use crate::error::Result;
use crate::runtime::prims::Prims;

/// What stands in a view's place needs of whoever runs the steps.
pub(crate) trait Copies {
    /// Copies `bytes` (a multiple of 4) from byte `from` of `src` to byte
    /// `to` of `dst`, in step order.
    fn copy(
        &mut self,
        src: &wgpu::Buffer,
        from: u64,
        dst: &wgpu::Buffer,
        to: u64,
        bytes: u64,
    ) -> Result<()>;

    /// Writes the low 16 bits of `src`'s word at byte `from` over the
    /// half-word at byte `at` of `dst` (the last element of a 16-bit view
    /// of odd length: the word's other half is not the view's), through
    /// `last`, a word of scratch on `dev`.
    fn patch_half(
        &mut self,
        dev: &RankDevice,
        last: &Tensor,
        src: (&wgpu::Buffer, u64),
        dst: (&wgpu::Buffer, u64),
    ) -> Result<()>;
}

impl Copies for Prims<'_> {
    fn copy(
        &mut self,
        src: &wgpu::Buffer,
        from: u64,
        dst: &wgpu::Buffer,
        to: u64,
        bytes: u64,
    ) -> Result<()> {
        Prims::copy(self, src, from, dst, to, bytes)
    }

    fn patch_half(
        &mut self,
        dev: &RankDevice,
        last: &Tensor,
        (src, from): (&wgpu::Buffer, u64),
        (dst, at): (&wgpu::Buffer, u64),
    ) -> Result<()> {
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(src, from, last.buffer(), 0, 4);
        dev.kernels
            .patch_half(dev, &mut enc, dst, at, last.buffer())?;
        self.submit_steps(enc)
    }
}

impl Copies for Steps<'_> {
    fn copy(
        &mut self,
        src: &wgpu::Buffer,
        from: u64,
        dst: &wgpu::Buffer,
        to: u64,
        bytes: u64,
    ) -> Result<()> {
        Steps::copy(self, src, from, dst, to, bytes);
        Ok(())
    }

    fn patch_half(
        &mut self,
        dev: &RankDevice,
        last: &Tensor,
        (src, from): (&wgpu::Buffer, u64),
        (dst, at): (&wgpu::Buffer, u64),
    ) -> Result<()> {
        Steps::copy(self, src, from, last.buffer(), 0, 4);
        dev.kernels
            .patch_half(dev, &mut self.enc, dst, at, last.buffer())
    }
}

/// A call's tensors as its steps see them: views they can work on where
/// they lie (see `Tensor::direct`) as they are, the others through
/// stand-ins.
pub(crate) struct StandIns<'a> {
    /// The call's own tensors when none stands in (no copy of the lists).
    pub ins: Cow<'a, [Tensor]>,
    pub outs: Cow<'a, [Tensor]>,
    /// (stand-in, the view it stands for) of every output stood in for.
    back: Vec<(Tensor, Tensor)>,
}

impl<'a> StandIns<'a> {
    /// The call's own tensors, as they lie.
    pub(crate) fn none(ins: &'a [Tensor], outs: &'a [Tensor]) -> StandIns<'a> {
        StandIns {
            ins: Cow::Borrowed(ins),
            outs: Cow::Borrowed(outs),
            back: Vec::new(),
        }
    }

    /// Stand-ins for the views among `ins` and `outs` that need one, the
    /// inputs copied in through `c`. `writes`: whether the call writes
    /// its outputs on this rank (a gather's output is not touched off the
    /// root, so not stood in for).
    pub(crate) fn new(
        c: &mut impl Copies,
        ins: &'a [Tensor],
        outs: &'a [Tensor],
        writes: bool,
    ) -> Result<StandIns<'a>> {
        if ins.iter().chain(outs).all(Tensor::direct) {
            return Ok(StandIns::none(ins, outs));
        }
        let mut back: Vec<(Tensor, Tensor)> = Vec::new();
        let mut stood_outs = Vec::with_capacity(outs.len());
        for o in outs {
            if o.direct() || !writes {
                stood_outs.push(o.clone());
            } else {
                let w = Tensor::output(o.rank_device(), o.dtype(), o.len())?;
                back.push((w.clone(), o.clone()));
                stood_outs.push(w);
            }
        }
        let mut stood_ins = Vec::with_capacity(ins.len());
        for x in ins {
            if x.direct() {
                stood_ins.push(x.clone());
                continue;
            }
            // In place: the input's stand-in is the output's.
            let w = match back.iter().find(|(_, view)| view.same_view(x)) {
                Some((w, _)) => w.clone(),
                None => Tensor::output(x.rank_device(), x.dtype(), x.len())?,
            };
            // Whole words: the buffer's size and the view's offset are
            // multiples of 4 (checked when it was wrapped), so a last
            // half-word rounds up within the buffer; it lands in the
            // padding, which is never copied back.
            let bytes = x.byte_len().next_multiple_of(4);
            c.copy(x.buffer(), x.offset(), w.buffer(), 0, bytes)?;
            stood_ins.push(w);
        }
        Ok(StandIns {
            ins: Cow::Owned(stood_ins),
            outs: Cow::Owned(stood_outs),
            back,
        })
    }

    /// Copies each stand-in into its view through `c`, touching no byte
    /// outside the view.
    pub(crate) fn copy_back(&self, c: &mut impl Copies) -> Result<()> {
        for (w, view) in &self.back {
            let bytes = view.byte_len();
            let whole = bytes & !3;
            c.copy(w.buffer(), 0, view.buffer(), view.offset(), whole)?;
            if bytes % 4 != 0 {
                let dev: &Arc<RankDevice> = view.rank_device();
                let last = Tensor::output(dev, DType::U32, 4)?;
                let at = view.offset().saturating_add(whole);
                c.patch_half(dev, &last, (w.buffer(), whole), (view.buffer(), at))?;
            }
        }
        Ok(())
    }
}
