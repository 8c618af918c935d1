//! Collective algorithms, each a schedule of primitive steps.
//!
//! [`steps`] names the primitives (NCCL's names: `send`,
//! `recv_reduce_send`, `recv_reduce_copy_send`, `recv_copy_send`, `recv`)
//! as traits the runtime implements (`runtime/prims.rs`); each algorithm
//! file is only the order in which a rank calls them, so it runs (and is
//! tested) on anything that takes the steps:
//! `ring` for all-reduce, all-gather, reduce-scatter and barrier, `oneshot`
//! for small all-reduces, `chain`
//! for the rooted broadcast and reduce, `pairwise` for all-to-all, `star`
//! for gather and scatter, `p2p` for send and receive.

pub(crate) mod chain;
pub(crate) mod direct;
pub(crate) mod fold;
pub(crate) mod oneshot;
pub(crate) mod p2p;
pub(crate) mod pairwise;
pub(crate) mod ring;
pub(crate) mod star;
pub(crate) mod steps;

/// Bytes every part of an all-reduce starts on a multiple of: 256, the
/// largest storage-binding offset alignment WebGPU lets an adapter ask
/// for, so that every part is bindable on any adapter and the parts (hence
/// the bits) do not depend on which adapter or device limits run it.
pub(crate) const PART_ALIGN_BYTES: usize = 256;

/// Words in each part of an all-reduce of `words` words over `n` ranks:
/// ceil(words / n), rounded up to [`PART_ALIGN_BYTES`]. Part c is words
/// [c·q, (c+1)·q) (the last shorter or empty) and is folded from rank c+1
/// round to rank c, by the ring, the one-shot and the shared device alike:
/// each element's fold order depends only on its index, the length and n,
/// so every algorithm, placement and adapter gives the same bits.
pub(crate) fn part_words(words: usize, n: usize) -> usize {
    let align = PART_ALIGN_BYTES / 4;
    words
        .div_ceil(n.max(1))
        .div_ceil(align)
        .saturating_mul(align)
}
