//! The primitive steps of collective schedules, on one rank.
//!
//! Each ring step moves one slice (a [`Span`] of 32-bit words of the
//! working buffer) to or from a ring neighbour, with NCCL's names: `send`,
//! `recv_reduce_send`, `recv_reduce_copy_send`, `recv_reduce`,
//! `recv_copy_send`, `recv`. Sends never block; receives wait for the
//! neighbour's packet, checking its fingerprint. A step that must forward
//! what it computed waits for its own device (the reduced bytes have to
//! reach the host); a step that only stores does not, and the collective's
//! completion is the last such submission.
//!
//! Besides ring steps: device copies, point-to-point `post`/`take` for
//! all_to_all, and a host image of a buffer range for the layouts a device
//! copy cannot express (16-bit elements at odd offsets).
#![allow(
    clippy::arithmetic_side_effects,
    reason = "schedule index math: ranks are below n <= MAX_RANKS, and every offset and length lies within a tensor whose byte size was checked when it was made (DType::padded_bytes), or within staging sized from one"
)]

use std::sync::Arc;
use std::time::Instant;

use crate::algo::steps::{RingSteps, Span, Steps, reduce_step};
use crate::deadline::Ring;
use crate::device::kernels::Reducer;
use crate::device::timestamps::Timestamps;
use crate::device::{Encoder, Ticket};
use crate::error::{Error, Result};
use crate::runtime::hop;
use crate::runtime::hop::{Link, Packet};
use crate::runtime::profile::Counters;
use crate::runtime::waiter::Waiter;
use crate::transport::{Body, Lane, Loan, Receipt, Resident, Stager};

/// Largest slice moved in one step. Big enough that per-step overheads (a
/// submission, a fence wait, a map) are small next to the copy, small
/// enough that the ring pipelines on tensors of a few MiB.
const SLICE_BYTES: u64 = 1 << 20;

impl Steps for Prims<'_> {
    fn recv_reduce(&mut self, span: Span) -> Result<()> {
        Prims::recv_reduce(self, span)
    }
    fn relay(&mut self) -> Result<()> {
        Prims::relay(self)
    }
    fn recv_from(&mut self, peer: usize, span: Span) -> Result<()> {
        Prims::recv_from(self, peer, span)
    }
    fn buffer(&self) -> wgpu::Buffer {
        self.buf.clone()
    }
    fn set_buffer(&mut self, buffer: wgpu::Buffer) {
        self.buf = buffer;
    }
    fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        bytes: u64,
    ) -> Result<()> {
        Prims::copy(self, src, src_off, dst, dst_off, bytes)
    }
    fn fetch(&mut self, span: Span) -> Result<Vec<u8>> {
        Prims::fetch(self, span)
    }
    fn store(&mut self, span: Span, data: &[u8]) -> Result<()> {
        Prims::store(self, span, data)
    }
    fn empty_packet(&self) -> Vec<u8> {
        self.link.buffer()
    }
    fn post(&mut self, peer: usize, data: Vec<u8>) -> Result<()> {
        Prims::post(self, peer, data)
    }
    fn post_body(&mut self, peer: usize, body: Body) -> Result<()> {
        Prims::post_body(self, peer, body)
    }
    fn take(&mut self, peer: usize, bytes: usize) -> Result<Vec<u8>> {
        Prims::take(self, peer, bytes)
    }
    fn recycle(&self, data: Vec<u8>) {
        Prims::recycle(self, data)
    }
    fn download_image(&mut self, bytes: usize) -> Result<Vec<u8>> {
        Prims::download_image(self, bytes)
    }
    fn upload_image(&mut self, image: &[u8]) -> Result<()> {
        Prims::upload_image(self, image)
    }
    fn encoder(&self) -> Encoder {
        Prims::encoder(self)
    }
    fn encode_reduce(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        span: Span,
        src: &wgpu::Buffer,
        src_word: usize,
        last: bool,
    ) -> Result<()> {
        Prims::encode_reduce(self, enc, span, src, src_word, last)
    }
    fn submit_steps(&mut self, enc: Encoder) -> Result<()> {
        Prims::submit_steps(self, enc)
    }
    fn call(&self) -> String {
        self.w.fp.to_string()
    }
    fn mismatch(&self, peer: usize, ours: String, theirs: String) -> Error {
        Error::Mismatch {
            rank: self.w.rank,
            seq: self.w.fp.seq,
            ours,
            peer,
            theirs,
            flight: self.w.health.flight.report(),
        }
    }
}

impl RingSteps for Prims<'_> {
    fn rank(&self) -> usize {
        Prims::rank(self)
    }
    fn nranks(&self) -> usize {
        self.nranks
    }
    fn step_words(&self, remaining: usize, parts: usize) -> usize {
        Prims::step_words(self, remaining, parts)
    }
    fn reserve(&mut self, words: usize) -> Result<()> {
        Prims::reserve(self, words)
    }
    fn send(&mut self, span: Span) -> Result<()> {
        Prims::send(self, span)
    }
    fn recv_reduce_send(&mut self, span: Span) -> Result<()> {
        Prims::recv_reduce_send(self, span)
    }
    fn recv_reduce_copy_send(&mut self, span: Span) -> Result<()> {
        Prims::recv_reduce_copy_send(self, span)
    }
    fn recv_copy_send(&mut self, span: Span) -> Result<()> {
        Prims::recv_copy_send(self, span)
    }
    fn recv(&mut self, span: Span) -> Result<()> {
        Prims::recv(self, span)
    }
}

/// Primitive steps of one collective on one rank.
pub(crate) struct Prims<'a> {
    pub w: Waiter<'a>,
    pub link: &'a Link,
    /// The lane its packets travel on: the collectives', or the
    /// point-to-point one.
    pub lane: Lane,
    pub stage: &'a mut Stager,
    /// The working buffer the ring steps read and write.
    pub buf: wgpu::Buffer,
    pub reduce: Option<Reducer>,
    /// The reduction of the last step, which also applies Avg's division.
    pub finish: Option<Reducer>,
    pub nranks: usize,
    /// The last submission that wrote an output.
    pub last: Option<Ticket>,
    /// Where the time goes, when profiling is on.
    pub prof: Option<&'a Counters>,
    /// GPU timestamps around reductions, when profiling on an adapter that has them.
    pub stamps: Option<&'a mut Timestamps>,
    /// A send's receipt, carried by its first packet.
    pub receipt: Option<Receipt>,
    /// Where the ring runs over some of the group's ranks only (a
    /// two-level plan's exchange between processes): this rank's place
    /// among them, and the ranks in ring order (`nranks` of them).
    pub ring: Option<(usize, Arc<[usize]>)>,
}

impl<'a> Prims<'a> {
    /// This rank's place in the ring.
    pub(crate) fn rank(&self) -> usize {
        self.ring.as_ref().map_or(self.w.rank, |(at, _)| *at)
    }

    /// The rank of the group at place `at` of the ring.
    fn member(&self, at: usize) -> usize {
        match &self.ring {
            Some((_, members)) => members.get(at).copied().unwrap_or(usize::MAX),
            None => at,
        }
    }

    /// The next rank of the ring, as the group numbers it.
    pub(crate) fn next(&self) -> usize {
        self.member((self.rank() + 1) % self.nranks)
    }

    /// The previous rank of the ring, as the group numbers it.
    pub(crate) fn prev(&self) -> usize {
        self.member((self.rank() + self.nranks - 1) % self.nranks)
    }

    /// Words of the storage-offset alignment: every slice a kernel binds
    /// starts at a multiple of it (and so holds whole 16-byte units).
    pub(crate) fn align_words(&self) -> usize {
        usize::try_from(self.w.dev.binding_align() / 4).unwrap_or(4)
    }

    /// Words per step when `remaining` words are left to split into `parts`:
    /// an even share, rounded up to the alignment, and at most one slice.
    pub(crate) fn step_words(&self, remaining: usize, parts: usize) -> usize {
        let align = self.align_words();
        let max_bytes = SLICE_BYTES.min(self.w.dev.limits.max_storage_buffer_binding_size);
        let max = ((max_bytes / 4) as usize / align).max(1) * align;
        remaining
            .div_ceil(parts.max(1))
            .div_ceil(align)
            .saturating_mul(align)
            .min(max)
    }

    /// Reserves staging for slices of up to `words`.
    pub(crate) fn reserve(&mut self, words: usize) -> Result<()> {
        self.stage.reserve((words.max(1) * 4) as u64)?;
        if self.link.lands() {
            if let Some(landing) = self.stage.landing()? {
                self.link.land_into(&landing);
            }
        }
        Ok(())
    }

    fn submit(&mut self, enc: Encoder) -> Result<Ticket> {
        let t = self.w.dev.submit(enc, Some(self.w.fp.seq))?;
        self.stage.submitted(t);
        Ok(t)
    }

    /// A packet of this call's; the first one carries the receipt, if any.
    fn packet(&mut self, body: Body) -> Packet {
        Packet {
            fp: self.w.fp,
            from: self.w.rank,
            body,
            receipt: self.receipt.take(),
        }
    }

    /// Whether ring steps lend their read-back buffers: where kernels
    /// read upload buffers directly (see `transport/local.rs`) and the
    /// transport carries loans, or sends out of their mappings.
    fn lends(&self, peer: usize) -> bool {
        self.stage.lends() && (self.link.carries_loans(peer) || self.link.takes_mapped(peer))
    }

    /// Sends `span` of the buffer to the next rank, after the steps
    /// recorded in `enc`: lent where ring steps lend, else copied into a
    /// packet.
    fn send_after(&mut self, mut enc: Encoder, span: Span) -> Result<()> {
        let next = self.next();
        if self.link.shares_device(next) {
            return self.send_resident(enc, next, span);
        }
        if !self.lends(next) {
            let mut data = self.link.buffer();
            self.download(enc, span, &mut data)?;
            return hop::post(
                self.link,
                next,
                self.lane,
                self.packet(Body::Bytes(data)),
                &self.w,
            );
        }
        let t = Instant::now();
        let (buf, bytes) = (self.buf.clone(), span.bytes() as u64);
        self.stage
            .encode_lend(&mut enc, &buf, span.offset(), bytes, &self.w.patience())?;
        let idx = self.submit(enc)?;
        let loan: Loan = self.stage.finish_lend(bytes, idx, &self.w.patience())?;
        self.last = Some(idx);
        self.took_move(t);
        hop::post(
            self.link,
            next,
            self.lane,
            self.packet(Body::Loan(loan)),
            &self.w,
        )
    }

    /// Sends `span` of the buffer to `peer`, a rank on this device, after
    /// the steps in `enc`: one device copy into a pooled buffer, which
    /// travels as the packet; the receiver's steps read it, submitted
    /// after this copy to the same queue.
    fn send_resident(&mut self, mut enc: Encoder, peer: usize, span: Span) -> Result<()> {
        let t = Instant::now();
        let copy = self.stage.resident(span.words)?;
        let bytes = span.bytes() as u64;
        let buffer = copy.buffer().clone();
        enc.copy_buffer_to_buffer(&self.buf, span.offset(), &buffer, 0, bytes);
        self.last = Some(self.submit(enc)?);
        self.took_move(t);
        let body = Body::Resident(Resident {
            buffer,
            bytes,
            _hold: Box::new(copy),
        });
        hop::post(self.link, peer, self.lane, self.packet(body), &self.w)
    }

    /// Copies `bytes` from `src[src_off..]` to `dst[dst_off..]` on the
    /// device (offsets and length multiples of 4).
    pub(crate) fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        bytes: u64,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let mut enc = self.w.dev.encoder();
        enc.copy_buffer_to_buffer(src, src_off, dst, dst_off, bytes);
        self.last = Some(self.submit(enc)?);
        Ok(())
    }

    /// Copies `span` of the buffer to the host and appends it to `data`.
    fn download(&mut self, mut enc: Encoder, span: Span, data: &mut Vec<u8>) -> Result<()> {
        let t = Instant::now();
        let buf = self.buf.clone();
        self.stage.encode_download(
            &mut enc,
            &buf,
            span.offset(),
            span.bytes() as u64,
            &self.w.patience(),
        )?;
        let idx = self.submit(enc)?;
        self.stage
            .finish_download(span.bytes(), data, &self.w.patience())?;
        self.last = Some(idx);
        self.took_move(t);
        Ok(())
    }

    fn took_wait(&self, since: Instant) {
        if let Some(c) = self.prof {
            c.waited(since);
        }
    }

    fn took_move(&self, since: Instant) {
        if let Some(c) = self.prof {
            c.moved(since);
        }
    }

    /// Receives a packet from `peer`, timing the wait.
    pub(crate) fn take_packet(&self, peer: usize, bytes: usize) -> Result<Packet> {
        let t = Instant::now();
        let p = hop::take(self.link, peer, self.lane, bytes, &self.w);
        self.took_wait(t);
        p
    }

    /// Timestamp queries for the next reduction pass (reading a full batch back first).
    fn stamp(&mut self) -> Result<Option<(wgpu::QuerySet, u32)>> {
        let Some(ts) = self.stamps.as_deref_mut() else {
            return Ok(None);
        };
        if let Some(q) = ts.next() {
            return Ok(Some(q));
        }
        let spent = ts.collect(self.w.dev, self.w.fp.seq)?;
        if let Some(c) = self.prof {
            c.kernel_ns(spent);
        }
        Ok(ts.next())
    }

    /// Records the bytes of `p` into `span` of the buffer, as [`Self::absorb`].
    fn absorb_packet(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        span: Span,
        p: &Packet,
        reducer: Option<&Reducer>,
    ) -> Result<()> {
        match &p.body {
            Body::Loan(loan) if self.stage.reads_in_place(loan) => {
                // A slot in host memory this device imports: read where
                // the lender's device wrote it.
                let t = Instant::now();
                hop::wait_loan(loan, p.from, &self.w)?;
                self.took_wait(t);
                let src = self.stage.read_in_place(loan).map_err(|why| {
                    self.w
                        .device_error(format!("importing a slot lent by rank {}: {why}", p.from))
                })?;
                self.absorb_resident(enc, span, &src, reducer)
            }
            Body::Loan(loan) => {
                let t = Instant::now();
                let view = hop::read_loan(loan, p.from, &self.w)?;
                self.took_wait(t);
                self.absorb(enc, span, &view, reducer)
            }
            Body::Bytes(data) => self.absorb(enc, span, data, reducer),
            Body::Mapped(m) => self.absorb(enc, span, m.as_ref(), reducer),
            Body::Resident(r) => self.absorb_resident(enc, span, &r.buffer, reducer),
            Body::Landed(l) => {
                let src = l.encode_use(enc).clone();
                self.absorb_resident(enc, span, &src, reducer)
            }
        }
    }

    /// Records `src[..span.bytes()]`, on this device, into `span` of the
    /// buffer, reduced with `reducer` or copied as it is.
    fn absorb_resident(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        span: Span,
        src: &wgpu::Buffer,
        reducer: Option<&Reducer>,
    ) -> Result<()> {
        let (buf, bytes) = (self.buf.clone(), span.bytes() as u64);
        match reducer {
            None => {
                enc.copy_buffer_to_buffer(src, 0, &buf, span.offset(), bytes);
                Ok(())
            }
            Some(red) => {
                let stamps = self.stamp()?;
                red.encode(self.w.dev, enc, &buf, span.offset(), src, 0, bytes, stamps)
            }
        }
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
        let t = Instant::now();
        let buf = self.buf.clone();
        let Some(r) = reducer else {
            self.stage
                .encode_upload(enc, data, &buf, span.offset(), &self.w.patience())?;
            self.took_move(t);
            return Ok(());
        };
        let src = self
            .stage
            .encode_upload_for_kernel(enc, data, &self.w.patience())?;
        self.took_move(t);
        let stamps = self.stamp()?;
        let bytes = span.bytes() as u64;
        r.encode(self.w.dev, enc, &buf, span.offset(), &src, 0, bytes, stamps)
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
        self.step("send", span);
        if span.words == 0 {
            return Ok(());
        }
        self.send_after(self.w.dev.encoder(), span)
    }

    /// Logs a step at `trace` (nothing when that level is off).
    pub(crate) fn step(&self, name: &'static str, span: Span) {
        tracing::trace!(
            rank = self.w.rank,
            seq = self.w.fp.seq,
            step = name,
            word = span.off,
            words = span.words
        );
    }

    fn recv_reduce_then(&mut self, span: Span, last: bool, forward: bool) -> Result<()> {
        self.step(reduce_step(last, forward), span);
        if span.words == 0 {
            return Ok(());
        }
        let p = self.take_packet(self.prev(), span.bytes())?;
        let r = self.reducer(last)?;
        let mut enc = self.w.dev.encoder();
        self.absorb_packet(&mut enc, span, &p, Some(&r))?;
        // Let go of the bytes (a lent buffer goes back to its owner)
        // before waiting for anything of our own; a buffer on this device
        // only once the steps that read it are submitted (its pool hands
        // it out again to later submissions alone).
        let resident = match p.body {
            Body::Resident(_) => Some(p),
            _ => {
                hop::recycle(self.link, p);
                None
            }
        };
        if !forward {
            self.last = Some(self.submit(enc)?);
            drop(resident);
            return Ok(());
        }
        let sent = self.send_after(enc, span);
        drop(resident);
        sent
    }

    /// Receives a partial result for `span` from the previous rank, reduces
    /// it into the buffer and sends the new partial result on.
    pub(crate) fn recv_reduce_send(&mut self, span: Span) -> Result<()> {
        self.recv_reduce_then(span, false, true)
    }

    /// The last reduction of `span`: after it the buffer holds the final
    /// value, which is sent on to start its trip around the ring.
    pub(crate) fn recv_reduce_copy_send(&mut self, span: Span) -> Result<()> {
        self.recv_reduce_then(span, true, true)
    }

    /// The last reduction of `span`, kept here (reduce-scatter, reduce).
    pub(crate) fn recv_reduce(&mut self, span: Span) -> Result<()> {
        self.recv_reduce_then(span, true, false)
    }

    /// Receives the final value of `span`, stores it and forwards the very
    /// same bytes (no device round trip). Bytes that landed from another
    /// process are this rank's to reuse once stored: what goes on is the
    /// stored copy, lent.
    pub(crate) fn recv_copy_send(&mut self, span: Span) -> Result<()> {
        let Some(mut p) = self.recv_store(span)? else {
            return Ok(());
        };
        // What came goes on as it is where the next rank takes it so: a
        // buffer on the device both share, else a host one; otherwise
        // the stored copy goes, as a send would send it.
        let next = self.next();
        let as_is = match p.body {
            Body::Landed(_) => false,
            Body::Resident(_) => self.link.shares_device(next),
            _ => !self.link.shares_device(next),
        };
        if !as_is {
            hop::recycle(self.link, p);
            return self.send_after(self.w.dev.encoder(), span);
        }
        p.from = self.w.rank;
        hop::post(self.link, next, self.lane, p, &self.w)
    }

    /// Receives the final value of `span` and stores it.
    pub(crate) fn recv(&mut self, span: Span) -> Result<()> {
        if let Some(p) = self.recv_store(span)? {
            hop::recycle(self.link, p);
        }
        Ok(())
    }

    /// Receives `span` from `peer` and stores it (no wait). Unlike the ring
    /// steps, an empty span still takes its packet: a point-to-point call
    /// always carries one, so that a peer sending another length is caught.
    pub(crate) fn recv_from(&mut self, peer: usize, span: Span) -> Result<()> {
        self.step("recv", span);
        let p = self.take_packet(peer, span.bytes())?;
        if span.words > 0 {
            let mut enc = self.w.dev.encoder();
            self.absorb_packet(&mut enc, span, &p, None)?;
            self.last = Some(self.submit(enc)?);
        }
        hop::recycle(self.link, p);
        Ok(())
    }

    /// Receives `span` from the previous rank and stores it (no wait);
    /// returns the received packet, `None` for an empty span.
    fn recv_store(&mut self, span: Span) -> Result<Option<Packet>> {
        self.step("recv", span);
        if span.words == 0 {
            return Ok(None);
        }
        let p = self.take_packet(self.prev(), span.bytes())?;
        let mut enc = self.w.dev.encoder();
        self.absorb_packet(&mut enc, span, &p, None)?;
        self.last = Some(self.submit(enc)?);
        Ok(Some(p))
    }

    /// `span` of the working buffer, on the host (in a pooled packet buffer).
    pub(crate) fn fetch(&mut self, span: Span) -> Result<Vec<u8>> {
        let mut data = self.link.buffer();
        self.download(self.w.dev.encoder(), span, &mut data)?;
        Ok(data)
    }

    /// Writes `data` into `span` of the working buffer (no wait).
    pub(crate) fn store(&mut self, span: Span, data: &[u8]) -> Result<()> {
        let mut enc = self.w.dev.encoder();
        self.absorb(&mut enc, span, data, None)?;
        self.last = Some(self.submit(enc)?);
        Ok(())
    }

    /// A command encoder for steps recorded together.
    pub(crate) fn encoder(&self) -> Encoder {
        self.w.dev.encoder()
    }

    /// Records a reduction of `src[src_word..][..span.words]` into `span` of
    /// the working buffer, both on this device (`last`: the final one,
    /// which applies Avg's division).
    pub(crate) fn encode_reduce(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        span: Span,
        src: &wgpu::Buffer,
        src_word: usize,
        last: bool,
    ) -> Result<()> {
        let r = self.reducer(last)?;
        let stamps = self.stamp()?;
        let buf = self.buf.clone();
        r.encode(
            self.w.dev,
            enc,
            &buf,
            span.offset(),
            src,
            src_word as u64 * 4,
            span.bytes() as u64,
            stamps,
        )
    }

    /// Submits steps recorded together; they write an output.
    pub(crate) fn submit_steps(&mut self, enc: Encoder) -> Result<()> {
        self.last = Some(self.submit(enc)?);
        Ok(())
    }

    /// Passes an empty token to the next rank and waits for the previous
    /// rank's: after n-1 of these every rank has heard from every other.
    pub(crate) fn relay(&mut self) -> Result<()> {
        let data = self.link.buffer();
        hop::post(
            self.link,
            self.next(),
            self.lane,
            self.packet(Body::Bytes(data)),
            &self.w,
        )?;
        let p = self.take_packet(self.prev(), 0)?;
        hop::recycle(self.link, p);
        Ok(())
    }

    /// Sends `data` to `peer` (point to point).
    pub(crate) fn post(&mut self, peer: usize, data: Vec<u8>) -> Result<()> {
        self.post_body(peer, Body::Bytes(data))
    }

    /// Sends `body` to `peer` (point to point).
    pub(crate) fn post_body(&mut self, peer: usize, body: Body) -> Result<()> {
        let p = self.packet(body);
        hop::post(self.link, peer, self.lane, p, &self.w)
    }

    /// Receives `bytes` bytes from `peer` (point to point).
    pub(crate) fn take(&mut self, peer: usize, bytes: usize) -> Result<Vec<u8>> {
        let p = self.take_packet(peer, bytes)?;
        match p.body {
            Body::Bytes(data) => Ok(data),
            Body::Loan(loan) => {
                let mut data = self.link.buffer();
                data.extend_from_slice(&hop::read_loan(&loan, p.from, &self.w)?);
                Ok(data)
            }
            Body::Mapped(m) => {
                let mut data = self.link.buffer();
                data.extend_from_slice(m.as_ref());
                Ok(data)
            }
            Body::Landed(l) => {
                let mut data = self.link.buffer();
                l.read_into(&mut data)
                    .map_err(|why| self.w.device_error(why))?;
                Ok(data)
            }
            Body::Resident(_) => Err(self.w.device_error(format!(
                "rank {peer} sent bytes on the device where host bytes were expected"
            ))),
        }
    }

    /// Gives a received buffer back to the packet pool.
    pub(crate) fn recycle(&self, data: Vec<u8>) {
        self.link.recycle(data);
    }

    /// The first `bytes` (a multiple of 4) of the working buffer, on the host.
    pub(crate) fn download_image(&mut self, bytes: usize) -> Result<Vec<u8>> {
        self.download_image_at(0, bytes)
    }

    /// `bytes` (a multiple of 4) of the working buffer from word `base`,
    /// on the host, in a buffer of the packet pool (give it back with
    /// `recycle`).
    pub(crate) fn download_image_at(&mut self, base: usize, bytes: usize) -> Result<Vec<u8>> {
        let mut image = self.link.buffer();
        image.reserve(bytes);
        let step = self.step_words(bytes / 4, 1).max(1);
        self.reserve(step)?;
        let mut off = 0;
        while off < bytes / 4 {
            let words = step.min(bytes / 4 - off);
            let span = Span {
                off: base + off,
                words,
            };
            self.download(self.w.dev.encoder(), span, &mut image)?;
            off += words;
        }
        Ok(image)
    }

    /// Runs `fold` on a host image of `len` bytes, then writes its first
    /// `bytes` to `dst` from word `dst_base`, where this device imports
    /// host memory: with `down`, the image first holds `bytes` of that
    /// buffer from that word (zero-padded). The device copies the bytes
    /// into memory the host folds in place, and out again, with no map and
    /// no memcpy. `Ok(false)`, and nothing done, elsewhere.
    pub(crate) fn fold_in_host_memory(
        &mut self,
        down: Option<(&wgpu::Buffer, usize)>,
        (dst, dst_base): (&wgpu::Buffer, usize),
        (bytes, len): (usize, usize),
        fold: impl FnOnce(&mut Prims, &mut [u8]) -> Result<()>,
    ) -> Result<bool> {
        let Some(mut img) = self.stage.take_image(len as u64)? else {
            return Ok(false);
        };
        if let Some((src, base)) = down {
            let t = Instant::now();
            let mut enc = self.w.dev.encoder();
            enc.copy_buffer_to_buffer(src, (base * 4) as u64, img.buffer(), 0, bytes as u64);
            let t_down = self.submit(enc)?;
            img.used_by(t_down);
            self.wait_own(t_down, "the tensor to come down to the host image")?;
            self.took_move(t);
        } else if let Some(t) = img.last_use() {
            // The last collective's copy out of the image.
            self.wait_own(t, "the host image's last copy to the device")?;
        }
        let image = img
            .bytes_mut(self.w.dev, len)
            .map_err(|why| self.w.device_error(why))?;
        if down.is_some() {
            image.get_mut(bytes..).unwrap_or_default().fill(0);
        }
        fold(self, image)?;
        let t = Instant::now();
        let mut enc = self.w.dev.encoder();
        enc.copy_buffer_to_buffer(img.buffer(), 0, dst, (dst_base * 4) as u64, bytes as u64);
        let up = self.submit(enc)?;
        img.used_by(up);
        self.last = Some(up);
        self.stage.put_image(img);
        self.took_move(t);
        Ok(true)
    }

    /// Whether this rank's slots lie in host memory its device imports,
    /// where the one-shot folds on the host (`runtime/host_oneshot.rs`):
    /// the link's, for the world's life.
    pub(crate) fn folds_in_host_memory(&self) -> bool {
        self.stage.lends_in_host_memory()
    }

    /// Lends `len` bytes in host memory every device of the group
    /// imports, the first `bytes` (a multiple of 4, at most `len`) of them
    /// `src`'s from word `base`: one device copy into a slot, not waited
    /// for. `None` where slots are not in host memory.
    pub(crate) fn lend_in_host_memory(
        &mut self,
        (src, base): (&wgpu::Buffer, usize),
        bytes: usize,
        len: usize,
    ) -> Result<Option<Loan>> {
        if !self.stage.lends_in_host_memory() {
            return Ok(None);
        }
        self.reserve(len.max(bytes) / 4)?;
        let t = Instant::now();
        let mut enc = self.w.dev.encoder();
        let off = (base * 4) as u64;
        self.stage
            .encode_lend(&mut enc, src, off, bytes as u64, &self.w.patience())?;
        let filled = self.submit(enc)?;
        let loan = self
            .stage
            .finish_lend(len as u64, filled, &self.w.patience())?;
        self.took_move(t);
        Ok(Some(loan))
    }

    /// Waits for this rank's own submission `t`, with the collective's
    /// deadline (a peer's failure or an abort ends it too).
    pub(crate) fn wait_own(&self, t: Ticket, what: &str) -> Result<()> {
        let dev = self.w.dev;
        let bell: Arc<dyn Ring> = dev.map_signal();
        self.w.until(
            || format!("{what} (#{})", self.w.fp.seq),
            &bell,
            |slice| {
                if dev.is_done(t) {
                    return Ok(Some(()));
                }
                if !slice.rung() {
                    let seen = dev.generation();
                    dev.poll_since(t, seen, slice.limit, Some(self.w.fp.seq))?;
                }
                Ok(None)
            },
        )
    }

    /// Writes `image` (a multiple of 4 bytes) to the start of the working buffer.
    pub(crate) fn upload_image(&mut self, image: &[u8]) -> Result<()> {
        self.upload_image_at(0, image)
    }

    /// Writes `image` (a multiple of 4 bytes) to the working buffer from
    /// word `base`.
    pub(crate) fn upload_image_at(&mut self, base: usize, image: &[u8]) -> Result<()> {
        let step = self.step_words(image.len() / 4, 1).max(1);
        self.reserve(step)?;
        for (i, piece) in image.chunks(step * 4).enumerate() {
            let mut enc = self.w.dev.encoder();
            self.absorb(
                &mut enc,
                Span {
                    off: base + i * step,
                    words: piece.len() / 4,
                },
                piece,
                None,
            )?;
            self.last = Some(self.submit(enc)?);
        }
        Ok(())
    }
}
