//! gather and scatter: the root exchanges a piece with every other rank
//! directly (a star, not a ring: every piece has one source and one
//! destination, so nothing would be forwarded).
//!
//! Pieces travel in the point-to-point slices (`p2p.rs`). When a piece
//! is a whole number of words, each lands in place with a device store;
//! a 16-bit piece of odd length starts mid-word in the root's buffer, so
//! the root cuts or assembles those in a host image, which the bytes
//! cross anyway.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "schedule index math: ranks are below n <= MAX_RANKS, and every offset and length lies within a tensor whose byte size was checked when it was made"
)]

use crate::algo::p2p::{SLICE_WORDS, recv_spans, send_spans};
use crate::algo::steps::{Span, Steps, slices};
use crate::error::Result;

/// The other ranks, from the one after `root` on.
fn others(root: usize, n: usize) -> impl Iterator<Item = usize> {
    (1..n).map(move |k| (root + k) % n)
}

/// The slices of rank `j`'s piece (`words` words at word `j * words`).
fn piece(j: usize, words: usize) -> impl Iterator<Item = Span> {
    slices(SLICE_WORDS, words).map(move |s| Span {
        off: j * words + s.off,
        words: s.words,
    })
}

/// Gathers every rank's `bytes` bytes of `x` into the root's `out`, rank
/// after rank (`out` is not touched elsewhere).
pub(crate) fn gather(
    p: &mut impl Steps,
    root: usize,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    bytes: usize,
) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
    let words = bytes.div_ceil(4);
    p.reserve(SLICE_WORDS.min(words))?;
    if r != root {
        p.set_buffer(x.clone());
        return send_spans(p, root, slices(SLICE_WORDS, words));
    }
    if bytes % 4 == 0 {
        p.copy(x, 0, out, (r * bytes) as u64, bytes as u64)?;
        p.set_buffer(out.clone());
        for j in others(root, n) {
            // Rank j's piece of the output, received from it in place.
            recv_spans(p, j, piece(j, words))?;
        }
        return Ok(());
    }
    let mut image = vec![0u8; (n * bytes).next_multiple_of(4)];
    p.set_buffer(x.clone());
    let own = p.download_image(words * 4)?;
    image[r * bytes..(r + 1) * bytes].copy_from_slice(&own[..bytes]);
    for j in others(root, n) {
        for s in slices(SLICE_WORDS, words) {
            let data = p.take(j, s.words * 4)?;
            let from = s.off * 4;
            let keep = (bytes - from).min(data.len());
            image[j * bytes + from..j * bytes + from + keep].copy_from_slice(&data[..keep]);
            p.recycle(data);
        }
    }
    p.set_buffer(out.clone());
    p.upload_image(&image)
}

/// Scatters the root's `x` (n pieces of `bytes` bytes) so that rank j's
/// `out` gets piece j (`x` is not read elsewhere).
pub(crate) fn scatter(
    p: &mut impl Steps,
    root: usize,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    bytes: usize,
) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
    let words = bytes.div_ceil(4);
    p.reserve(SLICE_WORDS.min(words))?;
    if r != root {
        p.set_buffer(out.clone());
        return recv_spans(p, root, slices(SLICE_WORDS, words));
    }
    if bytes % 4 == 0 {
        p.set_buffer(x.clone());
        for j in others(root, n) {
            send_spans(p, j, piece(j, words))?;
        }
        return p.copy(x, (r * bytes) as u64, out, 0, bytes as u64);
    }
    p.set_buffer(x.clone());
    let image = p.download_image((n * bytes).next_multiple_of(4))?;
    let cut = |j: usize| {
        let mut v = image[j * bytes..(j + 1) * bytes].to_vec();
        v.resize(words * 4, 0);
        v
    };
    for j in others(root, n) {
        let whole = cut(j);
        for s in slices(SLICE_WORDS, words) {
            let mut data = p.empty_packet();
            data.extend_from_slice(&whole[s.off * 4..(s.off + s.words) * 4]);
            p.post(j, data)?;
        }
    }
    p.set_buffer(out.clone());
    p.upload_image(&cut(r))
}
