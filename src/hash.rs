//! The one hash ranks and processes compare: FNV-1a over words, the same
//! on every machine (no random seed, as std's hasher has), so two ranks
//! agree on a hash exactly when they hashed the same words.

/// FNV-1a over the little-endian bytes of `words`.
pub(crate) fn fnv1a(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        for b in w.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}
