//! Collective algorithms, each a schedule of primitive steps.
//!
//! [`prims::Prims`] holds the primitives (NCCL's names: `send`,
//! `recv_reduce_send`, `recv_reduce_copy_send`, `recv_copy_send`, `recv`);
//! each algorithm file is only the order in which a rank calls them:
//! `ring` for all-reduce, all-gather, reduce-scatter and barrier, `oneshot`
//! for small all-reduces, `chain`
//! for the rooted broadcast and reduce, `pairwise` for all-to-all.

pub(crate) mod chain;
pub(crate) mod direct;
pub(crate) mod oneshot;
pub(crate) mod pairwise;
pub(crate) mod prims;
pub(crate) mod ring;

/// Words in each part of an all-reduce of `words` words over `n` ranks:
/// ceil(words / n), rounded up to `align` words so that every part starts
/// where a kernel can bind it. Part c is words [c·q, (c+1)·q) (the last
/// shorter or empty) and is folded from rank c+1 round to rank c, by the
/// ring, the one-shot and the shared device alike: each element's fold
/// order depends only on its index, the length and n (for a given
/// alignment), so every algorithm and placement gives the same bits.
pub(crate) fn part_words(words: usize, n: usize, align: usize) -> usize {
    let align = align.max(1);
    words
        .div_ceil(n.max(1))
        .div_ceil(align)
        .saturating_mul(align)
}
