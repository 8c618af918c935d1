//! Ring schedules, as NCCL's `runRing` (`src/device/all_reduce.h`,
//! `all_gather.h`, `reduce_scatter.h`).
//!
//! The working buffer is cut into n parts (`part_words`), and the parts
//! into slices; in round k every rank moves slice k of a part to its next
//! neighbour. Ranks run their rounds
//! independently, so while one rank reduces a slice its neighbour is
//! already moving the next one. Chunk `c` of a reduction is always reduced
//! in the same ring order, starting at rank c+1 and ending at rank c, then
//! copied: every rank gets the same bits, on every run.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "schedule index math: ranks are below n <= MAX_RANKS, and every offset and length lies within a tensor whose byte size was checked when it was made (DType::padded_bytes), or within staging sized from one"
)]

use crate::algo::prims::{Prims, RingSteps, Span};
use crate::error::Result;

/// All-reduces the first `words` words of the working buffer: reduce-scatter
/// then all-gather, 2(n-1) steps per round. The same schedule runs on the
/// device ([`Prims`]) or, where the tensor stays on the host for the whole
/// ring, on a host image (`algo/host.rs`): the packets are the same.
pub(crate) fn all_reduce(p: &mut impl RingSteps, words: usize) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
    if n == 1 || words == 0 {
        return Ok(());
    }
    let ring = |k: usize| (r + k) % n;
    // Round k takes slice k of every part (see `part_words`), so each
    // element is folded in its part's order however many rounds it takes.
    let q = super::part_words(words, n);
    let step = p.step_words(q, 1);
    p.reserve(step)?;
    let mut base = 0;
    while base < q {
        let span = |c: usize| {
            let off = (c * q + base).min(words);
            let end = (c * q + (base + step).min(q)).min(words);
            Span {
                off,
                words: end.saturating_sub(off),
            }
        };

        // Reduce-scatter: push, then reduce what comes and pass it on.
        p.send(span(ring(n - 1)))?;
        for j in 2..n {
            p.recv_reduce_send(span(ring(n - j)))?;
        }
        // Chunk r is now complete here: finish it and start it round the ring.
        p.recv_reduce_copy_send(span(r))?;

        // All-gather: store each final chunk and pass it on; the last one stops here.
        for j in 1..n - 1 {
            p.recv_copy_send(span(ring(n - j)))?;
        }
        p.recv(span(ring(1)))?;

        base += step;
    }
    Ok(())
}

/// All-gathers segments of `seg` words: segment `j` lives at word `j * seg`
/// of the working buffer, and this rank's own segment is already in place.
pub(crate) fn all_gather(p: &mut Prims, seg: usize) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    if n == 1 || seg == 0 {
        return Ok(());
    }
    let ring = |k: usize| (r + k) % n;
    let step = p.step_words(seg, 1);
    p.reserve(step)?;
    let mut base = 0;
    while base < seg {
        let span = |j: usize| Span {
            off: j * seg + base,
            words: step.min(seg - base),
        };
        p.send(span(r))?;
        for j in 1..n - 1 {
            p.recv_copy_send(span(ring(n - j)))?;
        }
        p.recv(span(ring(1)))?;
        base += step;
    }
    Ok(())
}

/// Reduce-scatters `n` chunks of `chunk` words, chunk `c` at word
/// `c * slot` (`slot` a multiple of the alignment): afterwards this rank's
/// own chunk holds the final reduction. n-1 steps per round.
pub(crate) fn reduce_scatter(p: &mut Prims, slot: usize, chunk: usize) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    if n == 1 || chunk == 0 {
        return Ok(());
    }
    let ring = |k: usize| (r + k) % n;
    let step = p.step_words(chunk, 1);
    p.reserve(step)?;
    let mut base = 0;
    while base < chunk {
        let span = |c: usize| Span {
            off: c * slot + base,
            words: step.min(chunk - base),
        };
        p.send(span(ring(n - 1)))?;
        for j in 2..n {
            p.recv_reduce_send(span(ring(n - j)))?;
        }
        p.recv_reduce(span(r))?;
        base += step;
    }
    Ok(())
}

/// A barrier: n-1 relays of a token round the ring, after which every rank
/// has heard (through its neighbours) from every other.
pub(crate) fn barrier(p: &mut Prims) -> Result<()> {
    for _ in 1..p.nranks {
        p.relay()?;
    }
    Ok(())
}
