//! The reduction of `shaders/fold.wgsl`, on the host.
//!
//! Where hops go through host memory anyway (ranks on devices of their
//! own, joined by host staging) and the adapter is the CPU itself, the
//! ring can keep the tensor on the host for its whole schedule: one
//! download, the ring's 2(n-1) steps folding and copying host memory, one
//! upload. The device ring instead pays a submission and a fence per step
//! (an upload, a kernel, a download), which on a CPU adapter costs more
//! than the fold itself. The same fold in the same order gives the same
//! bits: sum, product, min and max computed in the value type (`f32` for
//! the 16-bit floats, rounded to nearest even on the way back, as the
//! kernel's `lower`), wrapping integer arithmetic, bitwise operators on
//! the raw words, and Avg's division after the last step's rounding.

use crate::dtype::DType;
use crate::op::ReduceOp;

/// One all-reduce's fold: `dst = op(dst, src)` element by element.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HostFold {
    pub dtype: DType,
    pub op: ReduceOp,
    /// The rank count Avg divides by on the last step.
    pub ranks: u32,
}

impl HostFold {
    /// Folds `src` into `dst` (equal lengths, whole elements); `last`:
    /// the final step, which applies Avg's division.
    ///
    /// The operator is chosen once per call, outside the element loop, so
    /// each loop is one operation the compiler vectorises (a `match` per
    /// element measured at a fifth of the ring's time on lavapipe).
    pub(crate) fn fold(&self, dst: &mut [u8], src: &[u8], last: bool) {
        let divisor = if last && self.op == ReduceOp::Avg {
            self.ranks.max(1)
        } else {
            0
        };
        match self.dtype {
            DType::F32 => {
                // NaN is made canonical on the last step only, as the
                // kernels' `last` does: steps before it keep a NaN a NaN.
                match self.op {
                    ReduceOp::Prod if last => words(dst, src, |a, b| {
                        canon(f32::from_bits(a) * f32::from_bits(b)).to_bits()
                    }),
                    ReduceOp::Prod => words(dst, src, |a, b| {
                        (f32::from_bits(a) * f32::from_bits(b)).to_bits()
                    }),
                    ReduceOp::Min => words(dst, src, |a, b| {
                        nan_min(f32::from_bits(a), f32::from_bits(b)).to_bits()
                    }),
                    ReduceOp::Max => words(dst, src, |a, b| {
                        nan_max(f32::from_bits(a), f32::from_bits(b)).to_bits()
                    }),
                    _ if last && divisor == 0 => words(dst, src, |a, b| {
                        canon(f32::from_bits(a) + f32::from_bits(b)).to_bits()
                    }),
                    _ => words(dst, src, |a, b| {
                        (f32::from_bits(a) + f32::from_bits(b)).to_bits()
                    }),
                }
                if divisor != 0 {
                    let n = divisor as f32;
                    // Only the last step divides.
                    each_word(dst, |a| canon(f32::from_bits(a) / n).to_bits());
                }
            }
            DType::I32 | DType::U32 => {
                let signed = self.dtype == DType::I32;
                match self.op {
                    ReduceOp::BitAnd => words(dst, src, |a, b| a & b),
                    ReduceOp::BitOr => words(dst, src, |a, b| a | b),
                    ReduceOp::BitXor => words(dst, src, |a, b| a ^ b),
                    ReduceOp::Prod => words(dst, src, u32::wrapping_mul),
                    ReduceOp::Min if signed => {
                        words(dst, src, |a, b| (a as i32).min(b as i32) as u32)
                    }
                    ReduceOp::Max if signed => {
                        words(dst, src, |a, b| (a as i32).max(b as i32) as u32)
                    }
                    ReduceOp::Min => words(dst, src, u32::min),
                    ReduceOp::Max => words(dst, src, u32::max),
                    // Wrapping addition is the same bits for i32 and u32.
                    _ => words(dst, src, u32::wrapping_add),
                }
                if divisor != 0 {
                    if signed {
                        let n = divisor as i32;
                        each_word(dst, |a| (a as i32).checked_div(n).map_or(a, |v| v as u32));
                    } else {
                        each_word(dst, |a| a.checked_div(divisor).unwrap_or(a));
                    }
                }
            }
            DType::F16 => halves_in_f32(
                dst,
                src,
                self.op,
                (divisor, last),
                |h| half::f16::from_bits(h).to_f32(),
                |v| half::f16::from_f32(v).to_bits(),
            ),
            DType::BF16 => halves_in_f32(
                dst,
                src,
                self.op,
                (divisor, last),
                |h| half::bf16::from_bits(h).to_f32(),
                |v| half::bf16::from_f32(v).to_bits(),
            ),
        }
    }
}

/// The 16-bit floats' fold, as the kernel's: `lift` to `f32`, combine,
/// `lower` (rounding to nearest even), and Avg's division after that
/// rounding; on the `last` step, NaN made canonical.
fn halves_in_f32(
    dst: &mut [u8],
    src: &[u8],
    op: ReduceOp,
    (divisor, last): (u32, bool),
    lift: impl Fn(u16) -> f32,
    lower: impl Fn(f32) -> u16,
) {
    halves(dst, src, |a, b| {
        let (a, b) = (lift(a), lift(b));
        let v = match op {
            ReduceOp::Prod => a * b,
            ReduceOp::Min => nan_min(a, b),
            ReduceOp::Max => nan_max(a, b),
            _ => a + b,
        };
        if divisor != 0 {
            lower(canon(lift(lower(v)) / divisor as f32))
        } else if last {
            lower(canon(v))
        } else {
            lower(v)
        }
    })
}

/// Applies `f` to each pair of 32-bit words; on aligned buffers (the
/// usual case: pooled packets and images) through a `u32` view, which the
/// compiler vectorises.
fn words(dst: &mut [u8], src: &[u8], f: impl Fn(u32, u32) -> u32) {
    match (
        bytemuck::try_cast_slice_mut::<u8, u32>(dst),
        bytemuck::try_cast_slice::<u8, u32>(src),
    ) {
        (Ok(d), Ok(s)) => d.iter_mut().zip(s).for_each(|(d, s)| *d = f(*d, *s)),
        _ => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let a = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
                let b = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                d.copy_from_slice(&f(a, b).to_le_bytes());
            }
        }
    }
}

/// Applies `f` to each 32-bit word of `dst`.
fn each_word(dst: &mut [u8], f: impl Fn(u32) -> u32) {
    match bytemuck::try_cast_slice_mut::<u8, u32>(dst) {
        Ok(d) => d.iter_mut().for_each(|d| *d = f(*d)),
        Err(_) => {
            for d in dst.chunks_exact_mut(4) {
                let v = f(u32::from_le_bytes([d[0], d[1], d[2], d[3]]));
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

/// Applies `f` to each pair of 16-bit halves.
fn halves(dst: &mut [u8], src: &[u8], f: impl Fn(u16, u16) -> u16) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
        let v = f(
            u16::from_le_bytes([d[0], d[1]]),
            u16::from_le_bytes([s[0], s[1]]),
        );
        d.copy_from_slice(&v.to_le_bytes());
    }
}

/// The one NaN every fold gives (`f32::NAN`'s bits, 0x7fc00000), as
/// `canon` in `shaders/order_float.wgsl`: a NaN's sign and payload would
/// otherwise depend on the hardware.
fn canon(v: f32) -> f32 {
    if v.is_nan() { f32::NAN } else { v }
}

/// Min as `ordered_min` in `shaders/order_float.wgsl`: a NaN on either
/// side wins (canonical), and equal values meet on their bits' OR, so
/// min(-0, +0) is -0 whichever side each is on.
fn nan_min(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a < b {
        a
    } else if b < a {
        b
    } else {
        f32::from_bits(a.to_bits() | b.to_bits())
    }
}

/// Max as `ordered_max`: equal values meet on their bits' AND, so
/// max(-0, +0) is +0.
fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else if a > b {
        a
    } else if b > a {
        b
    } else {
        f32::from_bits(a.to_bits() & b.to_bits())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    fn fold_f32(op: ReduceOp, a: &[f32], b: &[f32], last: bool, ranks: u32) -> Vec<f32> {
        let mut d: Vec<u8> = bytemuck::cast_slice(a).to_vec();
        let s: Vec<u8> = bytemuck::cast_slice(b).to_vec();
        HostFold {
            dtype: DType::F32,
            op,
            ranks,
        }
        .fold(&mut d, &s, last);
        d.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn float_ops_and_the_last_steps_division() {
        let (a, b) = ([1.0, -2.0, 3.5], [4.0, 5.0, -0.5]);
        assert_eq!(
            fold_f32(ReduceOp::Sum, &a, &b, false, 2),
            vec![5.0, 3.0, 3.0]
        );
        assert_eq!(
            fold_f32(ReduceOp::Prod, &a, &b, false, 2),
            vec![4.0, -10.0, -1.75]
        );
        assert_eq!(
            fold_f32(ReduceOp::Min, &a, &b, false, 2),
            vec![1.0, -2.0, -0.5]
        );
        assert_eq!(
            fold_f32(ReduceOp::Max, &a, &b, false, 2),
            vec![4.0, 5.0, 3.5]
        );
        // Avg divides only on the last step.
        assert_eq!(
            fold_f32(ReduceOp::Avg, &a, &b, false, 2),
            vec![5.0, 3.0, 3.0]
        );
        assert_eq!(
            fold_f32(ReduceOp::Avg, &a, &b, true, 2),
            vec![2.5, 1.5, 1.5]
        );
    }

    #[test]
    fn integers_wrap_truncate_and_take_bitwise_ops() {
        let run = |dtype, op, a: [u32; 2], b: [u32; 2], last| {
            let mut d: Vec<u8> = bytemuck::cast_slice(&a).to_vec();
            HostFold {
                dtype,
                op,
                ranks: 2,
            }
            .fold(&mut d, bytemuck::cast_slice(&b), last);
            bytemuck::pod_collect_to_vec::<u8, u32>(&d)
        };
        let m = (-7i32) as u32;
        assert_eq!(
            run(
                DType::I32,
                ReduceOp::Sum,
                [i32::MAX as u32, m],
                [1, 2],
                false
            ),
            vec![i32::MIN as u32, (-5i32) as u32]
        );
        assert_eq!(
            run(DType::I32, ReduceOp::Avg, [m, 9], [0, 0], true),
            vec![(-3i32) as u32, 4]
        );
        assert_eq!(
            run(DType::U32, ReduceOp::Min, [3, 9], [5, 1], false),
            vec![3, 1]
        );
        assert_eq!(
            run(
                DType::U32,
                ReduceOp::BitXor,
                [0b1100, 1],
                [0b1010, 1],
                false
            ),
            vec![0b0110, 0]
        );
        assert_eq!(
            run(DType::I32, ReduceOp::BitOr, [m, 0], [0, 8], false),
            vec![m, 8]
        );
    }

    #[test]
    fn half_floats_round_to_nearest_even_after_each_step() {
        let bits = |v: &[f32]| -> Vec<u8> {
            v.iter()
                .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
                .collect()
        };
        // 2048 + 1 is not an f16: it rounds to even (2048), step by step.
        let mut d = bits(&[2048.0, 0.5]);
        HostFold {
            dtype: DType::F16,
            op: ReduceOp::Sum,
            ranks: 3,
        }
        .fold(&mut d, &bits(&[1.0, 0.25]), false);
        assert_eq!(d, bits(&[2048.0, 0.75]));
        let mut d = bits(&[3.0]);
        HostFold {
            dtype: DType::F16,
            op: ReduceOp::Avg,
            ranks: 3,
        }
        .fold(&mut d, &bits(&[3.0]), true);
        assert_eq!(d, bits(&[2.0]));
        let b16 = |v: f32| half::bf16::from_f32(v).to_bits().to_le_bytes().to_vec();
        let mut d = b16(1.5);
        HostFold {
            dtype: DType::BF16,
            op: ReduceOp::Max,
            ranks: 2,
        }
        .fold(&mut d, &b16(-4.0), false);
        assert_eq!(d, b16(1.5));
    }
}
