//! Where a collective's time goes: reduction kernels, transfers, waiting.
//!
//! A collective on a slow link and one on a slow kernel look the same in a
//! busbw figure; the split tells them apart. Host-side phases are timed on
//! the progress thread; the kernels' own time comes from GPU timestamps
//! written around each reduction pass, where the adapter has
//! `TIMESTAMP_QUERY`. Off by default: timestamps cost a read-back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::time::{Duration, Instant};

/// Time a communicator's collectives spent on this rank, by kind of work,
/// since profiling was switched on (or last read).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Profile {
    /// GPU time of the reduction kernels (zero without GPU timestamps).
    pub kernels: Duration,
    /// Host time moving bytes between the device and the host (copies,
    /// maps, memcpys, and waits for this rank's own device). Ring steps are
    /// pipelined, so the kernels run meanwhile: the three overlap.
    pub transfers: Duration,
    /// Host time blocked waiting for peers: their packets, and their
    /// devices' fences before reading a buffer they lent.
    pub waiting: Duration,
    /// Collectives counted.
    pub collectives: u64,
    /// Whether the kernel time came from GPU timestamps.
    pub gpu_timestamps: bool,
}

/// Running totals, shared by a communicator and its progress thread.
#[derive(Default)]
pub(crate) struct Counters {
    enabled: AtomicBool,
    kernels: AtomicU64,
    device: AtomicU64,
    waiting: AtomicU64,
    collectives: AtomicU64,
}

fn ns(d: Duration) -> u64 {
    d.as_nanos().min(u128::from(u64::MAX)) as u64
}

impl Counters {
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, on: bool) {
        self.enabled.store(on, Ordering::Release);
    }

    pub(crate) fn waited(&self, since: Instant) {
        self.waiting
            .fetch_add(ns(since.elapsed()), Ordering::Relaxed);
    }

    pub(crate) fn moved(&self, since: Instant) {
        self.device
            .fetch_add(ns(since.elapsed()), Ordering::Relaxed);
    }

    pub(crate) fn kernel_ns(&self, v: u64) {
        self.kernels.fetch_add(v, Ordering::Relaxed);
    }

    pub(crate) fn collective(&self) {
        self.collectives.fetch_add(1, Ordering::Relaxed);
    }

    /// The totals so far, which start again from zero.
    pub(crate) fn take(&self, gpu_timestamps: bool) -> Profile {
        Profile {
            kernels: Duration::from_nanos(self.kernels.swap(0, Ordering::AcqRel)),
            transfers: Duration::from_nanos(self.device.swap(0, Ordering::AcqRel)),
            waiting: Duration::from_nanos(self.waiting.swap(0, Ordering::AcqRel)),
            collectives: self.collectives.swap(0, Ordering::AcqRel),
            gpu_timestamps,
        }
    }
}
