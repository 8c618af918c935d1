//! Schedules for ranks that share one device: every rank's buffers are
//! bound or copied directly, and the whole group's steps go into one
//! encoder (one submission for the collective).
//!
//! Reductions keep the ring's fold order (see [`super::part_words`]): part
//! c of an all-reduce is folded from rank c+1 round to rank c, a
//! reduce-scatter's chunk c likewise, a reduce from root+1 round to the
//! root. So the bits are the ring's, whichever placement runs it.
//!
//! An all-reduce is one dispatch where the adapter can bind 2n buffers:
//! workgroup row c folds part c, every invocation reads its unit of all n
//! inputs and writes all n outputs (2n·S bytes moved, the least an
//! out-of-place all-reduce can). A dispatch costs 30-60 us on lavapipe, so
//! one instead of n matters at small sizes. Tensors too large to bind whole
//! take a dispatch per part and bindable piece; where 2n buffers cannot be
//! bound, part c is written to rank c only and device copies spread it
//! ((4n-1)·S moved).
#![allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over tensors whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]

use crate::device::direct::{DirectReducer, Fold, Order, Window, fits};
use crate::device::timestamps::Timestamps;
use crate::device::{Encoder, RankDevice};
use crate::dtype::DType;
use crate::error::Result;
use crate::op::ReduceOp;

/// The largest reduce-scatter input that takes one dispatch. Its kernel
/// picks each row's output with a `switch`: fewer dispatches win at small
/// sizes, while at large ones the `switch` moves bytes slower than a
/// dispatch per chunk. A rule measured on lavapipe with 4 ranks (figures
/// in docs/performance.md), not yet on a GPU.
const SCATTER_IN_ONE_MAX: u64 = 8 << 20;

/// One collective's device steps for the whole group, recorded into one
/// encoder.
pub(crate) struct Steps<'a> {
    pub dev: &'a RankDevice,
    pub enc: Encoder,
    pub n: usize,
    /// Bytes a binding's offset must be a multiple of.
    pub align: u64,
    /// GPU timestamps around the kernel passes, when profiling.
    pub stamps: Option<&'a mut Timestamps>,
}

/// Rounds `bytes` up to whole 16-byte units (tensors are padded to them).
fn units(bytes: u64) -> u64 {
    bytes.next_multiple_of(16)
}

impl Steps<'_> {
    /// Timestamp queries for the next kernel pass, while the batch has room
    /// (the caller reads it back after each collective).
    fn stamp(&mut self) -> Option<(wgpu::QuerySet, u32)> {
        self.stamps.as_deref_mut().and_then(Timestamps::next)
    }

    fn reducer(
        &self,
        dtype: DType,
        op: ReduceOp,
        inputs: usize,
        outputs: usize,
        order: Order,
    ) -> Result<DirectReducer> {
        let divisor = if op == ReduceOp::Avg {
            self.n as u32
        } else {
            0
        };
        self.dev.direct.get(
            self.dev,
            dtype,
            op,
            divisor,
            Fold {
                inputs,
                outputs,
                order,
            },
        )
    }

    /// Folds `bytes` from byte `at` of `ins` (in fold order) into byte
    /// `out_at` of every one of `outs`, in bindable pieces.
    fn fold(
        &mut self,
        r: &DirectReducer,
        ins: &[&wgpu::Buffer],
        at: u64,
        outs: &[&wgpu::Buffer],
        out_at: u64,
        bytes: u64,
    ) -> Result<()> {
        let max = self.dev.limits.max_storage_buffer_binding_size;
        let piece = (max / self.align).max(1) * self.align;
        let mut done = 0;
        let mut windows: Vec<Window> = Vec::with_capacity(ins.len() + outs.len());
        while done < bytes {
            let size = units((bytes - done).min(piece));
            windows.clear();
            windows.extend(ins.iter().map(|b| ((*b).clone(), at + done, size)));
            windows.extend(outs.iter().map(|b| ((*b).clone(), out_at + done, size)));
            let stamps = self.stamp();
            r.encode(self.dev, &mut self.enc, &windows, stamps)?;
            done += piece;
        }
        Ok(())
    }

    /// One rotating dispatch over whole buffers (`bytes` of each input, of
    /// each output): a workgroup row per rank, `row_units` units each.
    fn rows(
        &mut self,
        r: &DirectReducer,
        (ins, in_bytes): (&[&wgpu::Buffer], u64),
        (outs, out_bytes): (&[&wgpu::Buffer], u64),
        row_units: u64,
    ) -> Result<()> {
        let mut windows: Vec<Window> = Vec::with_capacity(ins.len() + outs.len());
        windows.extend(ins.iter().map(|b| ((*b).clone(), 0, in_bytes)));
        windows.extend(outs.iter().map(|b| ((*b).clone(), 0, out_bytes)));
        let stamps = self.stamp();
        r.encode_parts(self.dev, &mut self.enc, &windows, self.n, row_units, stamps)
    }

    /// Whether this adapter can bind what [`Steps::all_reduce`] needs.
    pub(crate) fn can_reduce(dev: &RankDevice, n: usize) -> bool {
        fits(dev, n, 1)
    }

    /// All-reduces `words` words of every `xs[r]` into `outs[r]` (which may
    /// be the same buffer: in place); parts of `q` words.
    pub(crate) fn all_reduce(
        &mut self,
        dtype: DType,
        op: ReduceOp,
        xs: &[&wgpu::Buffer],
        outs: &[&wgpu::Buffer],
        words: usize,
        q: usize,
    ) -> Result<()> {
        let n = self.n;
        let every = fits(self.dev, n, n);
        let bytes = units(words as u64 * 4);
        if every && bytes <= self.dev.limits.max_storage_buffer_binding_size {
            // One dispatch: the kernel cuts the parts and rotates each itself.
            let align = (super::PART_ALIGN_BYTES / 16) as u32;
            let r = self.reducer(dtype, op, n, n, Order::Parts { align })?;
            let part_units = q as u64 * 4 / dtype.unit_bytes();
            return self.rows(&r, (xs, bytes), (outs, bytes), part_units);
        }
        let r = self.reducer(dtype, op, n, if every { n } else { 1 }, Order::Bound)?;
        let mut order: Vec<&wgpu::Buffer> = Vec::with_capacity(n);
        for c in 0..n {
            let off = (c * q).min(words);
            let len = q.min(words - off);
            if len == 0 {
                continue;
            }
            // Part c, folded from rank c+1 round to rank c.
            order.clear();
            order.extend((1..=n).map(|k| xs[(c + k) % n]));
            let (at, bytes) = (off as u64 * 4, len as u64 * 4);
            if every {
                self.fold(&r, &order, at, outs, at, bytes)?;
            } else {
                self.fold(&r, &order, at, &outs[c..=c], at, bytes)?;
                for (j, out) in outs.iter().enumerate() {
                    if j != c {
                        self.enc
                            .copy_buffer_to_buffer(outs[c], at, out, at, units(bytes));
                    }
                }
            }
        }
        Ok(())
    }

    /// Reduce-scatters: chunk c (`chunk` bytes at byte c·`chunk`, a
    /// bindable offset) of every `xs[r]` is folded from rank c+1 round to
    /// rank c into `outs[c]`.
    pub(crate) fn reduce_scatter(
        &mut self,
        dtype: DType,
        op: ReduceOp,
        xs: &[&wgpu::Buffer],
        outs: &[&wgpu::Buffer],
        chunk: u64,
    ) -> Result<()> {
        let n = self.n;
        let whole = chunk * n as u64;
        let max = self.dev.limits.max_storage_buffer_binding_size;
        if fits(self.dev, n, n) && whole <= max.min(SCATTER_IN_ONE_MAX) && chunk > 0 {
            // One dispatch: workgroup row c folds chunk c into output c.
            let r = self.reducer(dtype, op, n, n, Order::Chunks)?;
            return self.rows(&r, (xs, whole), (outs, chunk), chunk / dtype.unit_bytes());
        }
        let r = self.reducer(dtype, op, n, 1, Order::Bound)?;
        let mut order: Vec<&wgpu::Buffer> = Vec::with_capacity(n);
        for c in 0..n {
            order.clear();
            order.extend((1..=n).map(|k| xs[(c + k) % n]));
            self.fold(&r, &order, c as u64 * chunk, &outs[c..=c], 0, chunk)?;
        }
        Ok(())
    }

    /// Reduces `bytes` of every `xs[r]` into `out` (the root's), folded
    /// from rank root+1 round to the root.
    pub(crate) fn reduce(
        &mut self,
        dtype: DType,
        op: ReduceOp,
        xs: &[&wgpu::Buffer],
        root: usize,
        out: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<()> {
        self.reduce_from(dtype, op, xs, root, 0, out, bytes)
    }

    /// Like [`reduce`](Self::reduce), from byte `at` of every `xs[r]` (a
    /// bindable offset).
    #[allow(
        clippy::too_many_arguments,
        reason = "what a fold reads and writes: one call site per collective"
    )]
    pub(crate) fn reduce_from(
        &mut self,
        dtype: DType,
        op: ReduceOp,
        xs: &[&wgpu::Buffer],
        root: usize,
        at: u64,
        out: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let n = self.n;
        let r = self.reducer(dtype, op, n, 1, Order::Bound)?;
        let order: Vec<&wgpu::Buffer> = (1..=n).map(|k| xs[(root + k) % n]).collect();
        self.fold(&r, &order, at, &[out], 0, bytes)
    }

    /// Copies `bytes` (a multiple of 4) from byte `from` of `src` to byte
    /// `to` of `dst`.
    pub(crate) fn copy(
        &mut self,
        src: &wgpu::Buffer,
        from: u64,
        dst: &wgpu::Buffer,
        to: u64,
        bytes: u64,
    ) {
        if bytes > 0 && !(src == dst && from == to) {
            self.enc.copy_buffer_to_buffer(src, from, dst, to, bytes);
        }
    }
}
