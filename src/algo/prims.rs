//! The primitive steps of ring schedules, on one rank.
//!
//! Each step moves one slice (a [`Span`] of 32-bit words of the
//! collective's working buffer) to or from a ring neighbour. Sends never
//! block; receives wait for the neighbour's packet, checking its
//! fingerprint. A step that must forward what it computed waits for its own
//! device (the reduced bytes have to reach the host); a step that only
//! stores does not, and the collective's completion is the last such
//! submission.

use crate::error::Result;
use crate::health::Waiter;
use crate::kernels::Reducer;
use crate::transport::{Endpoint, Packet, Stager};

/// A contiguous range of 32-bit words of the working buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub off: usize,
    pub words: usize,
}

impl Span {
    fn offset(self) -> u64 {
        self.off as u64 * 4
    }
    fn bytes(self) -> usize {
        self.words * 4
    }
}

/// Largest slice moved in one step. Big enough that per-step overheads (a
/// submission, a fence wait, a map) are small next to the copy, small
/// enough that the ring pipelines on tensors of a few MiB.
const SLICE_BYTES: u64 = 1 << 20;

/// Primitive steps of one collective on one rank.
pub(crate) struct Prims<'a> {
    pub w: Waiter<'a>,
    pub link: &'a Endpoint,
    pub stage: &'a mut Stager,
    /// The collective's working buffer (its output).
    pub buf: &'a wgpu::Buffer,
    pub reduce: Option<Reducer>,
    /// The reduction of the last step, which also applies Avg's division.
    pub finish: Option<Reducer>,
    pub nranks: usize,
    /// The last submission that wrote `buf`.
    pub last: Option<wgpu::SubmissionIndex>,
}

impl<'a> Prims<'a> {
    pub(crate) fn rank(&self) -> usize {
        self.w.rank
    }

    fn next(&self) -> usize {
        (self.w.rank + 1) % self.nranks
    }

    fn prev(&self) -> usize {
        (self.w.rank + self.nranks - 1) % self.nranks
    }

    /// Words per step when `remaining` words are left to split into `parts`:
    /// an even share, rounded up to the storage-offset alignment (so every
    /// slice can be bound where it lies, in whole 16-byte kernel units), and
    /// at most one slice.
    pub(crate) fn step_words(&self, remaining: usize, parts: usize) -> usize {
        let limits = &self.w.dev.limits;
        let align = (limits.min_storage_buffer_offset_alignment.max(16) / 4) as usize;
        let max_bytes = SLICE_BYTES.min(limits.max_storage_buffer_binding_size);
        let max = ((max_bytes / 4) as usize / align).max(1) * align;
        remaining
            .div_ceil(parts.max(1))
            .div_ceil(align)
            .saturating_mul(align)
            .min(max)
    }

    /// Reserves staging for slices of up to `words`.
    pub(crate) fn reserve(&mut self, words: usize) -> Result<()> {
        self.stage.reserve((words.max(1) * 4) as u64)
    }

    fn submit(&mut self, enc: wgpu::CommandEncoder) -> Result<wgpu::SubmissionIndex> {
        let idx = self.w.dev.submit(enc, Some(self.w.fp.seq))?;
        self.stage.submitted(&idx);
        Ok(idx)
    }

    fn packet(&self, data: Vec<u8>) -> Packet {
        Packet {
            fp: self.w.fp,
            from: self.w.rank,
            data,
        }
    }

    /// Copies `span` of the buffer to the host and appends it to `data`.
    fn download(
        &mut self,
        mut enc: wgpu::CommandEncoder,
        span: Span,
        data: &mut Vec<u8>,
    ) -> Result<()> {
        self.stage.encode_download(
            &mut enc,
            self.buf,
            span.offset(),
            span.bytes() as u64,
            &self.w,
        )?;
        let idx = self.submit(enc)?;
        self.stage.finish_download(span.bytes(), data, &self.w)?;
        self.last = Some(idx);
        Ok(())
    }

    /// Records the received bytes into `span` of the buffer, reduced with
    /// `reducer` or stored as they are.
    fn absorb(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        span: Span,
        data: &[u8],
        reducer: Option<&Reducer>,
    ) -> Result<()> {
        match reducer {
            None => self
                .stage
                .encode_upload(enc, data, self.buf, span.offset(), &self.w),
            Some(r) => {
                let src = self.stage.encode_upload_for_kernel(enc, data, &self.w)?;
                r.encode(
                    self.w.dev,
                    enc,
                    self.buf,
                    span.offset(),
                    &src,
                    0,
                    span.bytes() as u64,
                )
            }
        }
    }

    fn reducer(&self, last: bool) -> Result<Reducer> {
        let r = if last { &self.finish } else { &self.reduce };
        r.clone().ok_or_else(|| {
            self.w
                .device_error("reduction step without a reduction kernel".into())
        })
    }

    /// Sends `span` of the buffer to the next rank.
    pub(crate) fn send(&mut self, span: Span) -> Result<()> {
        if span.words == 0 {
            return Ok(());
        }
        let mut data = self.link.buffer();
        self.download(self.w.dev.encoder(), span, &mut data)?;
        self.link.post(self.next(), self.packet(data))
    }

    fn recv_reduce_then_send(&mut self, span: Span, last: bool) -> Result<()> {
        if span.words == 0 {
            return Ok(());
        }
        let mut p = self.link.take(self.prev(), span.bytes(), &self.w)?;
        let r = self.reducer(last)?;
        let mut enc = self.w.dev.encoder();
        self.absorb(&mut enc, span, &p.data, Some(&r))?;
        p.data.clear();
        self.download(enc, span, &mut p.data)?;
        let next = self.next();
        self.link.post(next, self.packet(p.data))
    }

    /// Receives a partial result for `span` from the previous rank, reduces
    /// it into the buffer and sends the new partial result on.
    pub(crate) fn recv_reduce_send(&mut self, span: Span) -> Result<()> {
        self.recv_reduce_then_send(span, false)
    }

    /// The last reduction of `span`: after it the buffer holds the final
    /// value, which is sent on to start its trip around the ring.
    pub(crate) fn recv_reduce_copy_send(&mut self, span: Span) -> Result<()> {
        self.recv_reduce_then_send(span, true)
    }

    /// Receives the final value of `span`, stores it and forwards the very
    /// same bytes (no device round trip).
    pub(crate) fn recv_copy_send(&mut self, span: Span) -> Result<()> {
        if span.words == 0 {
            return Ok(());
        }
        let p = self.link.take(self.prev(), span.bytes(), &self.w)?;
        let mut enc = self.w.dev.encoder();
        self.absorb(&mut enc, span, &p.data, None)?;
        self.last = Some(self.submit(enc)?);
        let next = self.next();
        self.link.post(next, self.packet(p.data))
    }

    /// Receives the final value of `span` and stores it.
    pub(crate) fn recv(&mut self, span: Span) -> Result<()> {
        if span.words == 0 {
            return Ok(());
        }
        let p = self.link.take(self.prev(), span.bytes(), &self.w)?;
        let mut enc = self.w.dev.encoder();
        self.absorb(&mut enc, span, &p.data, None)?;
        self.last = Some(self.submit(enc)?);
        self.link.recycle(p.data);
        Ok(())
    }
}
