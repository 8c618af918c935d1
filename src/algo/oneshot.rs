//! One-shot all-reduce, for small messages, where the ring's 2(n-1) round
//! trips cost more than the bytes: every rank sends its whole input to
//! every other rank and reduces all n contributions itself.
//!
//! Each chunk is reduced in exactly the ring's order (starting at rank c+1,
//! ending at rank c, with the ring's chunk boundaries), so the one-shot and
//! the ring give the same bits: which one the cost model picks never shows
//! in the results.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "schedule index math: ranks are below n <= MAX_RANKS, and every offset and length lies within a tensor whose byte size was checked when it was made (DType::padded_bytes), or within staging sized from one"
)]

use crate::algo::steps::{Span, Steps};
use crate::error::Result;

/// All-reduces the first `words` words of the working buffer, using
/// `all` (room for n x `stride` words) for every rank's contribution.
pub(crate) fn all_reduce(
    p: &mut impl Steps,
    all: &wgpu::Buffer,
    stride: usize,
    words: usize,
) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
    if n == 1 || words == 0 {
        return Ok(());
    }
    p.reserve(words)?;
    let out = p.buffer();
    let whole = Span { off: 0, words };

    // Out: this rank's input to every peer.
    let mine = p.fetch(whole)?;
    for k in 1..n {
        let mut d = p.empty_packet();
        d.extend_from_slice(&mine);
        p.post((r + k) % n, d)?;
    }

    // In: every rank's contribution side by side, rank j at word j * stride.
    p.set_buffer(all.clone());
    for j in 0..n {
        let data = if j == r {
            None
        } else {
            Some(p.take(j, words * 4)?)
        };
        let bytes = data.as_deref().unwrap_or(&mine);
        p.store(
            Span {
                off: j * stride,
                words,
            },
            bytes,
        )?;
        if let Some(d) = data {
            p.recycle(d);
        }
    }
    p.recycle(mine);

    // Reduce: chunk c as the ring would, from rank c+1 round to rank c.
    p.set_buffer(out.clone());
    let chunk = super::part_words(words, n);
    let mut enc = p.encoder();
    for c in 0..n {
        let off = (c * chunk).min(words);
        let span = Span {
            off,
            words: chunk.min(words - off),
        };
        if span.words == 0 {
            continue;
        }
        let first = (c + 1) % n;
        enc.copy_buffer_to_buffer(
            all,
            ((first * stride + off) * 4) as u64,
            &out,
            (off * 4) as u64,
            (span.words * 4) as u64,
        );
        for k in 2..=n {
            let j = (c + k) % n;
            p.encode_reduce(&mut enc, span, all, j * stride + off, k == n)?;
        }
    }
    p.submit_steps(enc)
}
