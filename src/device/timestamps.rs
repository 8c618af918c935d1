//! GPU timestamps around reduction passes, where the adapter has them: the
//! profile's kernel time (`runtime/profile.rs`).

use crate::device::RankDevice;
use crate::error::{Error, Result};

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
