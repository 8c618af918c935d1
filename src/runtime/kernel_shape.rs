//! How many units each invocation of the reduction kernel takes, timed on
//! the device instead of assumed from its type.
//!
//! On lavapipe a workgroup costs a round trip through the driver's thread
//! pool, so a few units per invocation beat one; on a GPU one unit per
//! invocation is the usual shape. Which one wins is the device's to say:
//! a tuned world times the device ring's reduction of a ring slice (1 MiB,
//! f32 sum) at 1, 4, 16 and 64 units per invocation, medians of 5, and keeps
//! the fastest for every device of the world.

use std::time::{Duration, Instant};

use crate::device::RankDevice;
use crate::device::tensor::DType;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::runtime::stats::median_duration as median;

/// The shapes timed.
const SHAPES: [u64; 4] = [1, 4, 16, 64];

/// Bytes reduced per timing: one ring slice.
const BYTES: u64 = 1 << 20;

/// The units per invocation that reduced a 1 MiB slice fastest on `dev`.
pub(crate) fn fastest(dev: &RankDevice) -> Result<u64> {
    let usage = wgpu::BufferUsages::STORAGE;
    let dst = dev.create_buffer("kernel shape", BYTES, usage, false)?;
    let src = dev.create_buffer("kernel shape", BYTES, usage, false)?;
    let r = dev.kernels.reducer(dev, DType::F32, ReduceOp::Sum, 0)?;
    let time = |per: u64| -> Result<Duration> {
        dev.kernels.set_units_per_invocation(per);
        let mut enc = dev.encoder();
        r.encode(dev, &mut enc, &dst, 0, &src, 0, BYTES, None)?;
        let t = Instant::now();
        let idx = dev.submit(enc, None)?;
        dev.wait(idx, None, "timing the reduction kernel's shapes")?;
        Ok(t.elapsed())
    };
    let mut best = (Duration::MAX, 1);
    for per in SHAPES {
        time(per)?; // warm
        let d = median((0..5).map(|_| time(per)).collect::<Result<Vec<_>>>()?);
        if d < best.0 {
            best = (d, per);
        }
    }
    dev.kernels.set_units_per_invocation(best.1);
    tracing::debug!(
        units = best.1,
        us = best.0.as_secs_f64() * 1e6,
        "world: reduction kernel shape timed"
    );
    Ok(best.1)
}
