//! Where a collective's time goes: reduction kernels, transfers, waiting.
//!
//! A collective on a slow link and one on a slow kernel look the same in a
//! busbw figure; the split tells them apart. Host-side phases are timed on
//! the progress thread; the kernels' own time comes from GPU timestamps
//! written around each reduction pass, where the adapter has
//! `TIMESTAMP_QUERY`. Off by default: timestamps cost a read-back.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::time::{Duration, Instant};

use crate::device::RankDevice;
use crate::error::{Error, Result};

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

/// Timestamp pairs one read-back can hold.
const PAIRS: u32 = 128;

/// GPU timestamps around reduction passes, read back in batches.
pub(crate) struct Timestamps {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    used: u32,
    period_ns: f64,
}

impl Timestamps {
    pub(crate) fn new(dev: &RankDevice) -> Result<Timestamps> {
        use wgpu::BufferUsages as U;
        let bytes = u64::from(PAIRS) * 16;
        dev.count_resource();
        let set = dev.scoped("creating a timestamp query set", |d| {
            d.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("reduction timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: PAIRS * 2,
            })
        })?;
        Ok(Timestamps {
            set,
            resolve: dev.create_buffer(
                "timestamps",
                bytes,
                U::QUERY_RESOLVE | U::COPY_SRC,
                false,
            )?,
            read: dev.create_buffer(
                "timestamp read-back",
                bytes,
                U::MAP_READ | U::COPY_DST,
                false,
            )?,
            used: 0,
            period_ns: f64::from(dev.queue.get_timestamp_period()),
        })
    }

    /// Query indices for the next pass, or `None` when the batch is full
    /// (collect it first).
    pub(crate) fn next(&mut self) -> Option<(wgpu::QuerySet, u32)> {
        if self.used == PAIRS {
            return None;
        }
        let first = self.used.checked_mul(2)?;
        self.used = self.used.checked_add(1)?;
        Some((self.set.clone(), first))
    }

    /// Reads the batch back (waiting for the device) and returns the total
    /// time between each pair, in nanoseconds.
    pub(crate) fn collect(&mut self, dev: &RankDevice, seq: u64) -> Result<u64> {
        if self.used == 0 {
            return Ok(0);
        }
        let bytes = u64::from(self.used) * 16;
        let mut enc = dev.encoder();
        enc.resolve_query_set(&self.set, 0..self.used.saturating_mul(2), &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, bytes);
        dev.submit_and_map(enc, &self.read, bytes, Some(seq), "a timestamp read-back")?;
        let total = {
            let view = self
                .read
                .get_mapped_range(..bytes)
                .map_err(|e| Error::device(dev.rank, Some(seq), format!("timestamp view: {e}")))?;
            let stamps: &[u64] = bytemuck::cast_slice(&view);
            stamps
                .chunks_exact(2)
                .map(|p| (p[1].saturating_sub(p[0]) as f64 * self.period_ns) as u64)
                .sum()
        };
        self.read.unmap();
        self.used = 0;
        Ok(total)
    }
}
