//! Ring all-reduce, as NCCL's `runRing` in `src/device/all_reduce.h`.
//!
//! The buffer is cut into rounds of `n` chunks. In each round, rank `r`
//! first reduce-scatters (after n-1 steps it holds the final value of chunk
//! `r`), then all-gathers (n-1 more steps pass every final chunk around).
//! Chunk `c` is always reduced in the same ring order, starting at rank
//! c+1 and ending at rank c, then copied: every rank gets the same bits, on
//! every run. Ranks run their rounds independently, so while one rank
//! reduces a slice its neighbour is already moving the next one.

use crate::algo::prims::{Prims, Span};
use crate::error::Result;

/// All-reduces the first `words` words of the working buffer.
pub(crate) fn all_reduce(p: &mut Prims, words: usize) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    if n == 1 || words == 0 {
        return Ok(());
    }
    let ring = |k: usize| (r + k) % n;
    let mut base = 0;
    while base < words {
        let chunk = p.step_words(words - base, n);
        p.reserve(chunk)?;
        let span = |c: usize| {
            let off = (base + c * chunk).min(words);
            Span {
                off,
                words: chunk.min(words - off),
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

        base += chunk * n;
    }
    Ok(())
}
