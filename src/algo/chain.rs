//! Chain schedules along the ring, for rooted collectives: broadcast flows
//! from the root to root-1, reduce flows from root+1 to the root. Slices
//! follow each other down the chain, so a large tensor costs about one
//! pass of the chain, not n.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "schedule index math: ranks are below n <= MAX_RANKS, and every offset and length lies within a tensor whose byte size was checked when it was made (DType::padded_bytes), or within staging sized from one"
)]

use crate::algo::steps::{Steps, slices};
use crate::error::Result;

/// Broadcasts the first `words` words of the root's working buffer into
/// every rank's.
pub(crate) fn broadcast(p: &mut impl Steps, root: usize, words: usize) -> Result<()> {
    let n = p.nranks();
    if n == 1 || words == 0 {
        return Ok(());
    }
    let pos = (p.rank() + n - root) % n;
    let step = p.step_words(words, 1);
    p.reserve(step)?;
    for s in slices(step, words) {
        match pos {
            0 => p.send(s)?,
            x if x == n - 1 => p.recv(s)?,
            _ => p.recv_copy_send(s)?,
        }
    }
    Ok(())
}

/// Reduces the first `words` words of every rank's working buffer into the
/// root's; the others keep the partial reduction they forwarded.
pub(crate) fn reduce(p: &mut impl Steps, root: usize, words: usize) -> Result<()> {
    let n = p.nranks();
    if n == 1 || words == 0 {
        return Ok(());
    }
    let pos = (p.rank() + n - root - 1) % n;
    let step = p.step_words(words, 1);
    p.reserve(step)?;
    for s in slices(step, words) {
        match pos {
            0 => p.send(s)?,
            x if x == n - 1 => p.recv_reduce(s)?,
            _ => p.recv_reduce_send(s)?,
        }
    }
    Ok(())
}
