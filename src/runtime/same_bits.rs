//! Whether folding on the host gives this adapter's bits.
//!
//! The host ring (`algo/fold.rs`) folds in the ring's order on the CPU;
//! the device ring and the shared device's kernels fold the same order in
//! WGSL. The bits agree only where the adapter's float arithmetic is the
//! host's: lavapipe compiles WGSL for this CPU, but a GPU may flush
//! subnormals to zero or divide to within 2.5 ULP (WGSL allows both), so
//! on an H200 the host ring's averages and products differed from the
//! kernels' and one world gave other bits under another placement. Rather
//! than take "the adapter is a CPU" for "it folds as the host does", the
//! tuner folds a probe both ways (every float dtype, every arithmetic
//! operator, subnormals and inexact quotients among the values) and offers
//! the host ring only where every bit agrees. Integer and bitwise folds
//! are exact everywhere and are not probed.

use crate::algo::fold::HostFold;
use crate::device::RankDevice;
use crate::device::tensor::DType;
use crate::error::Result;
use crate::op::ReduceOp;

/// Bytes of each probe buffer: a whole number of 16-byte units.
const PROBE_BYTES: usize = 4096;

/// Whether `dev`'s reduction kernel and the host fold give the same bits
/// for every float dtype and arithmetic operator (Avg dividing by
/// `ranks`), on values that span subnormals to near overflow.
pub(crate) fn host_fold_agrees(dev: &RankDevice, ranks: u32) -> Result<bool> {
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let dst = dev.create_buffer("same-bits probe", PROBE_BYTES as u64, usage, false)?;
    let src = dev.create_buffer("same-bits probe", PROBE_BYTES as u64, usage, false)?;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let (a, b) = (values(dtype, 1), values(dtype, 2));
        for op in [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Avg,
            ReduceOp::Min,
            ReduceOp::Max,
        ] {
            let divisor = if op == ReduceOp::Avg { ranks.max(1) } else { 0 };
            let reducer = dev.kernels.reducer(dev, dtype, op, divisor)?;
            dev.write_buffer(&dst, &a)?;
            dev.write_buffer(&src, &b)?;
            let mut enc = dev.encoder();
            reducer.encode(dev, &mut enc, &dst, 0, &src, 0, PROBE_BYTES as u64, None)?;
            let idx = dev.submit(enc, None)?;
            dev.wait(idx, None, "folding the same-bits probe")?;
            let mut device = vec![0u8; PROBE_BYTES];
            dev.read_buffer(&dst, 0, &mut device)?;
            let mut host = a.clone();
            HostFold {
                dtype,
                op,
                ranks: ranks.max(1),
            }
            .fold(&mut host, &b, divisor != 0);
            if host != device {
                let at = host.iter().zip(&device).position(|(h, d)| h != d);
                tracing::info!(
                    %dtype,
                    %op,
                    first_byte_differing = at,
                    "world: the host folds other bits than this adapter; no host ring"
                );
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// Probe values of `dtype`: pseudo-random words whose exponents cover the
/// whole range, subnormals included, but never all ones (no infinity or
/// NaN going in; a NaN's pattern is made canonical on both sides anyway).
fn values(dtype: DType, salt: u64) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64 ^ salt.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    match dtype {
        DType::F32 => (0..PROBE_BYTES / 4)
            .flat_map(|_| {
                let w = next() as u32;
                let w = if (w >> 23) & 0xff == 0xff {
                    w & !(1 << 30)
                } else {
                    w
                };
                w.to_le_bytes()
            })
            .collect(),
        DType::F16 => halves(&mut next, 10, 0x1f),
        _ => halves(&mut next, 7, 0xff),
    }
}

/// 16-bit floats with `mantissa` bits and an exponent field of `all_ones`,
/// never all ones.
fn halves(next: &mut impl FnMut() -> u64, mantissa: u32, all_ones: u16) -> Vec<u8> {
    (0..PROBE_BYTES / 2)
        .flat_map(|_| {
            let h = next() as u16;
            let h = if (h >> mantissa) & all_ones == all_ones {
                h & !(1 << 14)
            } else {
                h
            };
            h.to_le_bytes()
        })
        .collect()
}
