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

use crate::algo::steps::{RingSteps, Span, Steps};
use crate::error::Result;

/// All-reduces the first `words` words of the working buffer: reduce-scatter
/// then all-gather, 2(n-1) steps per round. The same schedule runs on the
/// device (`runtime/prims.rs`) or, where the tensor stays on the host for
/// the whole ring, on a host image (`runtime/host_ring.rs`): the packets
/// are the same.
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
pub(crate) fn all_gather(p: &mut impl Steps, seg: usize) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
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
pub(crate) fn reduce_scatter(p: &mut impl Steps, slot: usize, chunk: usize) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
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

/// All-gathers segments of different lengths: segment `j` is `segs[j]` of
/// the working buffer, and this rank's own is already in place. Round k
/// moves slice k of every segment (empty once a segment is done).
pub(crate) fn all_gather_v(p: &mut impl Steps, segs: &[Span]) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
    let longest = segs.iter().map(|s| s.words).max().unwrap_or(0);
    if n == 1 || longest == 0 || segs.len() != n {
        return Ok(());
    }
    let ring = |k: usize| (r + k) % n;
    let step = p.step_words(longest, 1);
    p.reserve(step)?;
    let mut base = 0;
    while base < longest {
        let span = |j: usize| slice_of(segs[j], base, step);
        p.send(span(r))?;
        for j in 1..n - 1 {
            p.recv_copy_send(span(ring(n - j)))?;
        }
        p.recv(span(ring(1)))?;
        base += step;
    }
    Ok(())
}

/// Reduce-scatters chunks of different lengths: chunk `c` is `chunks[c]`
/// of the working buffer (each starting on the binding alignment), folded
/// from rank c+1 round to rank c; afterwards this rank's own chunk holds
/// the final reduction.
pub(crate) fn reduce_scatter_v(p: &mut impl Steps, chunks: &[Span]) -> Result<()> {
    let (n, r) = (p.nranks(), p.rank());
    let longest = chunks.iter().map(|s| s.words).max().unwrap_or(0);
    if n == 1 || longest == 0 || chunks.len() != n {
        return Ok(());
    }
    let ring = |k: usize| (r + k) % n;
    let step = p.step_words(longest, 1);
    p.reserve(step)?;
    let mut base = 0;
    while base < longest {
        let span = |c: usize| slice_of(chunks[c], base, step);
        p.send(span(ring(n - 1)))?;
        for j in 2..n {
            p.recv_reduce_send(span(ring(n - j)))?;
        }
        p.recv_reduce(span(r))?;
        base += step;
    }
    Ok(())
}

/// Slice `base..base + step` of `whole`, cut to its end (empty past it).
fn slice_of(whole: Span, base: usize, step: usize) -> Span {
    let from = base.min(whole.words);
    Span {
        off: whole.off + from,
        words: step.min(whole.words - from),
    }
}

/// A barrier: n-1 relays of a token round the ring, after which every rank
/// has heard (through its neighbours) from every other.
pub(crate) fn barrier(p: &mut impl Steps) -> Result<()> {
    for _ in 1..p.nranks() {
        p.relay()?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::algo::steps::RingSteps;

    /// Records the steps a rank takes, with no runtime behind them.
    struct Recorder {
        rank: usize,
        n: usize,
        step: usize,
        log: Vec<(&'static str, Span)>,
    }

    impl RingSteps for Recorder {
        fn rank(&self) -> usize {
            self.rank
        }
        fn nranks(&self) -> usize {
            self.n
        }
        fn step_words(&self, remaining: usize, _parts: usize) -> usize {
            self.step.min(remaining).max(1)
        }
        fn reserve(&mut self, _words: usize) -> Result<()> {
            Ok(())
        }
        fn send(&mut self, span: Span) -> Result<()> {
            self.log.push(("send", span));
            Ok(())
        }
        fn recv_reduce_send(&mut self, span: Span) -> Result<()> {
            self.log.push(("recv_reduce_send", span));
            Ok(())
        }
        fn recv_reduce_copy_send(&mut self, span: Span) -> Result<()> {
            self.log.push(("recv_reduce_copy_send", span));
            Ok(())
        }
        fn recv_copy_send(&mut self, span: Span) -> Result<()> {
            self.log.push(("recv_copy_send", span));
            Ok(())
        }
        fn recv(&mut self, span: Span) -> Result<()> {
            self.log.push(("recv", span));
            Ok(())
        }
    }

    fn run(rank: usize, n: usize, step: usize, words: usize) -> Vec<(&'static str, Span)> {
        let mut r = Recorder {
            rank,
            n,
            step,
            log: Vec::new(),
        };
        all_reduce(&mut r, words).unwrap();
        r.log
    }

    #[test]
    fn all_reduce_takes_nccls_steps_part_by_part() {
        // 3 ranks, 3 parts of 64 words (the alignment), one round.
        let (n, words) = (3, 192);
        let q = crate::algo::part_words(words, n);
        assert_eq!(q, 64);
        let part = |c: usize| Span {
            off: c * q,
            words: q,
        };
        for r in 0..n {
            let ring = |k: usize| (r + k) % n;
            assert_eq!(
                run(r, n, q, words),
                vec![
                    ("send", part(ring(2))),
                    ("recv_reduce_send", part(ring(1))),
                    ("recv_reduce_copy_send", part(r)),
                    ("recv_copy_send", part(ring(2))),
                    ("recv", part(ring(1))),
                ],
                "rank {r}"
            );
        }
    }

    #[test]
    fn rounds_take_slice_k_of_every_part_and_the_last_part_may_be_short() {
        // 2 ranks, 130 words: parts of 128 (aligned) and 2; steps of 64.
        let log = run(0, 2, 64, 130);
        let spans: Vec<(usize, usize)> = log.iter().map(|(_, s)| (s.off, s.words)).collect();
        assert_eq!(
            spans,
            vec![
                // Round 0: slice 0 of part 1 (words 128..130), then of part 0.
                (128, 2),
                (0, 64),
                (128, 2),
                // Round 1: slice 1 of part 1 is empty, of part 0 words 64..128.
                (130, 0),
                (64, 64),
                (130, 0),
            ]
        );
        assert!(run(0, 1, 64, 100).is_empty(), "one rank takes no step");
    }
}
