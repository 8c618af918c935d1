//! Point-to-point: one rank's tensor to another, matched by the pair's own
//! issue order.
//!
//! Posting a send never waits for the receiver (the bytes are buffered on
//! the way, as MPI's eager protocol buffers them), so two ranks that each
//! send before they receive do not deadlock, grouped or not; the send's
//! first packet carries a receipt that the receiver tells back once it
//! has matched the header (or refused it), which the send's `Work`
//! waits for. Between devices
//! the bytes cross the host in slices, so the receiver uploads one while
//! the sender downloads the next; the slice size is fixed, not taken from
//! either device, because both sides must cut the tensor the same way.
//! Every call carries at least one packet, so a peer that sends another
//! length (even an empty tensor) is caught by the first packet's header.
//!
//! On a device the two ranks share, the bytes never leave it: the sender
//! copies them into a pooled buffer, which travels as the packet, and the
//! receiver copies them out (two device copies; the sender's `Work` then
//! does not depend on when the receiver gets to it).
#![allow(
    clippy::arithmetic_side_effects,
    reason = "schedule index math: every offset and length lies within a tensor whose byte size was checked when it was made"
)]

use crate::algo::steps::{Span, Steps, slices};
use crate::error::Result;
use crate::transport::{Body, Resident};

/// Words per point-to-point packet between devices.
pub(crate) const SLICE_WORDS: usize = 1 << 18;

/// The spans a tensor of `words` words travels in: at least one.
fn packets(words: usize) -> impl Iterator<Item = Span> {
    let empty = (words == 0).then_some(Span { off: 0, words: 0 });
    slices(SLICE_WORDS, words).chain(empty)
}

/// Sends `spans` of the working buffer to `peer` through the host, a
/// packet each (an empty span: an empty packet).
pub(crate) fn send_spans(
    p: &mut impl Steps,
    peer: usize,
    spans: impl Iterator<Item = Span>,
) -> Result<()> {
    for span in spans {
        let data = if span.words == 0 {
            p.empty_packet()
        } else {
            p.fetch(span)?
        };
        p.post(peer, data)?;
    }
    Ok(())
}

/// Receives a packet from `peer` into each of `spans` of the working buffer.
pub(crate) fn recv_spans(
    p: &mut impl Steps,
    peer: usize,
    spans: impl Iterator<Item = Span>,
) -> Result<()> {
    for span in spans {
        p.recv_from(peer, span)?;
    }
    Ok(())
}

/// Sends the first `words` words of the working buffer to `peer` through
/// the host.
pub(crate) fn send(p: &mut impl Steps, peer: usize, words: usize) -> Result<()> {
    p.reserve(SLICE_WORDS.min(words))?;
    send_spans(p, peer, packets(words))
}

/// Sends the first `words` words of the working buffer to `peer`, a rank
/// on the same device, through `copy` (a buffer of at least that size,
/// kept from its pool by `hold` until the receiver lets go).
pub(crate) fn send_on_device(
    p: &mut impl Steps,
    peer: usize,
    words: usize,
    copy: wgpu::Buffer,
    hold: Box<dyn std::any::Any + Send>,
) -> Result<()> {
    let bytes = (words * 4) as u64;
    let src = p.buffer();
    p.copy(&src, 0, &copy, 0, bytes)?;
    p.post_body(
        peer,
        Body::Resident(Resident {
            buffer: copy,
            bytes,
            _hold: hold,
        }),
    )
}

/// Receives `words` words from `peer` into the start of the working
/// buffer, sent by [`send`] or, when `on_device`, by [`send_on_device`].
pub(crate) fn recv(p: &mut impl Steps, peer: usize, words: usize, on_device: bool) -> Result<()> {
    if on_device {
        return p.recv_from(peer, Span { off: 0, words });
    }
    p.reserve(SLICE_WORDS.min(words))?;
    recv_spans(p, peer, packets(words))
}
