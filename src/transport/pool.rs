//! Host buffers for packets, reused newest first.
//!
//! A pool handed out oldest first (a queue) cycles through every buffer it
//! holds before reusing one: each grows to a slice's size on first use
//! (page faults, zeroing), and a warm one goes cold while the rest come
//! round. With the MPI hub's 256 that was 256 MiB per process, grown over
//! the first few hundred frames, which a tuning run of three calls timed as
//! the host ring's steady cost. Newest first, a steady stream reuses the
//! few buffers in flight, still in cache.

use std::sync::Mutex;

use crate::device::lock;

/// At most `cap` spare buffers, the last returned handed out first.
pub(crate) struct Pool {
    spare: Mutex<Vec<Vec<u8>>>,
    cap: usize,
}

impl Pool {
    /// An empty pool that keeps up to `cap` buffers.
    pub(crate) fn new(cap: usize) -> Pool {
        Pool {
            spare: Mutex::new(Vec::with_capacity(cap)),
            cap,
        }
    }

    /// An empty buffer: the newest spare, or a new one.
    pub(crate) fn take(&self) -> Vec<u8> {
        let mut v = lock(&self.spare).pop().unwrap_or_default();
        v.clear();
        v
    }

    /// A buffer of `len` bytes to be overwritten whole (a receive's): its
    /// old bytes stay, only what it grows by is zeroed.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn take_sized(&self, len: usize) -> Vec<u8> {
        let mut v = lock(&self.spare).pop().unwrap_or_default();
        if v.len() >= len {
            v.truncate(len);
        } else {
            v.resize(len, 0);
        }
        v
    }

    /// Keeps `v` for reuse, unless the pool is full.
    pub(crate) fn give(&self, v: Vec<u8>) {
        let mut spare = lock(&self.spare);
        if spare.len() < self.cap {
            spare.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buffer given back last comes out first, emptied, with its room.
    #[test]
    fn the_newest_buffer_comes_back_first() {
        let pool = Pool::new(2);
        let (mut a, mut b) = (Vec::with_capacity(10), Vec::with_capacity(20));
        a.push(1u8);
        b.push(2u8);
        pool.give(a);
        pool.give(b);
        pool.give(Vec::with_capacity(30)); // over the cap: dropped
        let first = pool.take();
        assert!(first.is_empty());
        assert_eq!(first.capacity(), 20);
        assert_eq!(pool.take().capacity(), 10);
        assert_eq!(pool.take().capacity(), 0);
    }

    /// A sized buffer has the length asked for, whatever it held.
    #[test]
    fn a_sized_buffer_has_the_length_asked_for() {
        let pool = Pool::new(1);
        pool.give(vec![7u8; 8]);
        assert_eq!(pool.take_sized(3), vec![7u8; 3]);
        pool.give(vec![7u8; 2]);
        assert_eq!(pool.take_sized(4), vec![7, 7, 0, 0]);
        assert_eq!(pool.take_sized(5).len(), 5);
    }
}
