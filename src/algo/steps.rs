//! The steps schedules are written in, with NCCL's names, so that a
//! schedule (`ring.rs`, `chain.rs`, ...) reads as the order of its steps
//! and runs on whatever implements them: the runtime's device steps
//! (`runtime/prims.rs`), the host ring's steps on a host image
//! (`runtime/host_ring.rs`), or a test's recorder.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "span math: offsets and lengths within a tensor whose byte size was checked when it was made"
)]

use crate::device::Encoder;
use crate::error::{Error, Result};
use crate::transport::Body;

/// A contiguous range of 32-bit words of the working buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub off: usize,
    pub words: usize,
}

impl Span {
    pub(crate) fn offset(self) -> u64 {
        self.off as u64 * 4
    }
    pub(crate) fn bytes(self) -> usize {
        self.words * 4
    }
    /// The span's bytes within a host image of the buffer.
    pub(crate) fn range(self) -> std::ops::Range<usize> {
        self.off * 4..(self.off + self.words) * 4
    }
}

/// The spans of `words` words, `step` words each (the last may be shorter).
pub(crate) fn slices(step: usize, words: usize) -> impl Iterator<Item = Span> {
    (0..words).step_by(step.max(1)).map(move |off| Span {
        off,
        words: step.min(words - off),
    })
}

/// The name of a reduction step, for the trace: `last`, the final fold;
/// `forward`, the result goes on to the next rank.
pub(crate) fn reduce_step(last: bool, forward: bool) -> &'static str {
    match (last, forward) {
        (false, _) => "recv_reduce_send",
        (true, true) => "recv_reduce_copy_send",
        (true, false) => "recv_reduce",
    }
}

/// The steps a ring schedule is written in (NCCL's primitive names), so
/// that one schedule runs on the device (`runtime/prims.rs`) or on a host
/// image (`runtime/host_ring.rs`).
pub(crate) trait RingSteps {
    fn rank(&self) -> usize;
    fn nranks(&self) -> usize;
    /// Words per step: at most the slice size, and a multiple of the
    /// binding alignment.
    fn step_words(&self, remaining: usize, parts: usize) -> usize;
    /// Readies staging for steps of up to `words`.
    fn reserve(&mut self, words: usize) -> Result<()>;
    fn send(&mut self, span: Span) -> Result<()>;
    fn recv_reduce_send(&mut self, span: Span) -> Result<()>;
    fn recv_reduce_copy_send(&mut self, span: Span) -> Result<()>;
    fn recv_copy_send(&mut self, span: Span) -> Result<()>;
    fn recv(&mut self, span: Span) -> Result<()>;
}

/// Every step the other schedules take besides the ring's: the working
/// buffer and copies on the device, host packets to and from any peer,
/// host images of the working buffer, and reductions recorded into an
/// encoder.
pub(crate) trait Steps: RingSteps {
    /// Folds what comes from the previous rank into `span`, last step.
    fn recv_reduce(&mut self, span: Span) -> Result<()>;
    /// Passes a token to the next rank once one came from the previous.
    fn relay(&mut self) -> Result<()>;
    /// Receives `span` from `peer` (point to point).
    fn recv_from(&mut self, peer: usize, span: Span) -> Result<()>;
    /// The working buffer, which spans index.
    fn buffer(&self) -> wgpu::Buffer;
    /// Makes `buffer` the working buffer.
    fn set_buffer(&mut self, buffer: wgpu::Buffer);
    /// A device copy, in stream order with the steps.
    fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_off: u64,
        dst: &wgpu::Buffer,
        dst_off: u64,
        bytes: u64,
    ) -> Result<()>;
    /// `span`'s bytes, brought to the host.
    fn fetch(&mut self, span: Span) -> Result<Vec<u8>>;
    /// Writes `data` into `span`.
    fn store(&mut self, span: Span, data: &[u8]) -> Result<()>;
    /// An empty packet from the link's pool.
    fn empty_packet(&self) -> Vec<u8>;
    /// Sends `data` to `peer`.
    fn post(&mut self, peer: usize, data: Vec<u8>) -> Result<()>;
    /// Sends `body` to `peer`.
    fn post_body(&mut self, peer: usize, body: Body) -> Result<()>;
    /// Receives `bytes` bytes from `peer`.
    fn take(&mut self, peer: usize, bytes: usize) -> Result<Vec<u8>>;
    /// Gives a packet back to the pool.
    fn recycle(&self, data: Vec<u8>);
    /// The first `bytes` bytes of the working buffer, on the host.
    fn download_image(&mut self, bytes: usize) -> Result<Vec<u8>>;
    /// Writes `image` at the start of the working buffer.
    fn upload_image(&mut self, image: &[u8]) -> Result<()>;
    /// An encoder for steps recorded together.
    fn encoder(&self) -> Encoder;
    /// Records `span` of the working buffer folded with `src` from word
    /// `src_word` (the final fold when `last`).
    fn encode_reduce(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        span: Span,
        src: &wgpu::Buffer,
        src_word: usize,
        last: bool,
    ) -> Result<()>;
    /// Submits what `enc` recorded.
    fn submit_steps(&mut self, enc: Encoder) -> Result<()>;
    /// The call as ranks compare it (its fingerprint), for errors.
    fn call(&self) -> String;
    /// The error for a peer whose call does not pair with this rank's.
    fn mismatch(&self, peer: usize, ours: String, theirs: String) -> Error;
}
