//! Benchmark inputs whose exact result is known whatever the reduction
//! order, and the count of wrong elements.
//!
//! Float inputs are small integers (sums stay exact in bf16's 8 bits) and
//! products are of ±1 with a single 2, so every element can be checked
//! bit-exactly; Avg on floats is allowed 2 ULP, as the tests do.

use half::{bf16, f16};
use wgpu_collectives::{Communicator, DType, Element, Error, ReduceOp, Tensor};

use super::args::Collective;

trait Value: Element + Copy {
    fn from_i64(v: i64) -> Self;
    fn from_f64(v: f64) -> Self;
    fn ulps(a: Self, b: Self) -> u64;
}

macro_rules! float {
    ($t:ty, $from:expr, $bits:expr) => {
        impl Value for $t {
            fn from_i64(v: i64) -> Self {
                $from(v as f64)
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn ulps(a: Self, b: Self) -> u64 {
                ($bits(a) as i64).abs_diff($bits(b) as i64)
            }
        }
    };
}
float!(f32, |x: f64| x as f32, |x: f32| x.to_bits());
float!(f16, f16::from_f64, |x: f16| x.to_bits());
float!(bf16, bf16::from_f64, |x: bf16| x.to_bits());

macro_rules! int {
    ($t:ty) => {
        impl Value for $t {
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            fn from_f64(v: f64) -> Self {
                v as i64 as $t
            }
            fn ulps(a: Self, b: Self) -> u64 {
                u64::from(a != b)
            }
        }
    };
}
int!(i32);
int!(u32);

/// Rank `rank`'s element `i` for `op`, as an integer (exact in every dtype).
fn input(op: ReduceOp, rank: usize, i: usize) -> i64 {
    let i = i as i64;
    let r = rank as i64;
    match op {
        ReduceOp::Prod => {
            if rank == 0 {
                [1, 2, -1][(i % 3) as usize]
            } else if (i + r) % 2 == 0 {
                1
            } else {
                -1
            }
        }
        ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor => {
            (i * 2_654_435_761 + r * 40_503) & 0x7fff_ffff
        }
        // Non-negative, so that u32 orders them as i64 does.
        _ => {
            (i + r) % 5
                + if op == ReduceOp::Max || op == ReduceOp::Min {
                    r
                } else {
                    0
                }
        }
    }
}

fn expected(op: ReduceOp, n: usize, i: usize) -> (i64, Option<f64>) {
    let mut acc = input(op, 0, i);
    for r in 1..n {
        let v = input(op, r, i);
        acc = match op {
            ReduceOp::Sum | ReduceOp::Avg => acc + v,
            ReduceOp::Prod => acc * v,
            ReduceOp::Min => acc.min(v),
            ReduceOp::Max => acc.max(v),
            ReduceOp::BitAnd => acc & v,
            ReduceOp::BitOr => acc | v,
            ReduceOp::BitXor => acc ^ v,
        };
    }
    match op {
        ReduceOp::Avg => (acc, Some(acc as f64 / n as f64)),
        _ => (acc, None),
    }
}

fn make<T: Value>(c: &Communicator, op: ReduceOp, len: usize) -> Result<Tensor, Error> {
    let v: Vec<T> = (0..len)
        .map(|i| T::from_i64(input(op, c.rank(), i)))
        .collect();
    c.tensor(&v)
}

/// This rank's input tensor for `op`.
pub fn tensor(c: &Communicator, dtype: DType, op: ReduceOp, len: usize) -> Result<Tensor, Error> {
    match dtype {
        DType::F32 => make::<f32>(c, op, len),
        DType::F16 => make::<f16>(c, op, len),
        DType::BF16 => make::<bf16>(c, op, len),
        DType::I32 => make::<i32>(c, op, len),
        DType::U32 => make::<u32>(c, op, len),
    }
}

fn wrong_in<T: Value>(
    t: &Tensor,
    n: usize,
    want: &dyn Fn(usize) -> Option<(i64, Option<f64>)>,
) -> Result<u64, Error> {
    let got = t.to_vec::<T>()?;
    let float = !T::DTYPE.is_integer();
    Ok(got
        .iter()
        .enumerate()
        .filter(|&(i, &g)| match want(i) {
            None => false,
            Some((_, Some(avg))) if float => T::ulps(g, T::from_f64(avg)) > 2,
            Some((sum, Some(_))) => T::ulps(g, T::from_i64(sum / n as i64)) != 0,
            Some((exact, None)) => T::ulps(g, T::from_i64(exact)) != 0,
        })
        .count() as u64)
}

/// What element `k` of rank `rank`'s output should be (`None`: not
/// defined, as on a reduce's non-root ranks). `per_rank` is the output
/// length of reduce_scatter and the per-peer length of all_gather and
/// all_to_all.
#[allow(clippy::too_many_arguments)]
pub fn expected_output(
    coll: Collective,
    op: ReduceOp,
    n: usize,
    rank: usize,
    root: usize,
    per_rank: usize,
    k: usize,
) -> Option<(i64, Option<f64>)> {
    Some(match coll {
        Collective::AllReduce => expected(op, n, k),
        Collective::ReduceScatter => expected(op, n, rank * per_rank + k),
        Collective::Reduce if rank == root => expected(op, n, k),
        Collective::Reduce => return None,
        Collective::AllGather => (input(op, k / per_rank, k % per_rank), None),
        Collective::Broadcast => (input(op, root, k), None),
        Collective::AllToAll => (
            input(op, k / per_rank, rank * per_rank + k % per_rank),
            None,
        ),
        // One rank has no peer: nothing moves.
        Collective::Sendrecv if n < 2 => return None,
        Collective::Sendrecv => (input(op, (rank + n - 1) % n, k), None),
        Collective::Gather if rank == root => (input(op, k / per_rank, k % per_rank), None),
        Collective::Gather => return None,
        Collective::Scatter => (input(op, root, rank * per_rank + k), None),
        Collective::AllGatherV => {
            // Element k of the concatenation: which rank's, and where in it.
            let mut at = k;
            let mut from = 0;
            for (j, c) in counts(n, per_rank).into_iter().enumerate() {
                if at < c {
                    from = j;
                    break;
                }
                at -= c;
            }
            (input(op, from, at), None)
        }
        Collective::ReduceScatterV => {
            let before: usize = counts(n, per_rank).iter().take(rank).sum();
            expected(op, n, before + k)
        }
    })
}

/// The counts the benchmark's uneven collectives split `total` elements
/// by: rank r gets r+1 shares, the last rank what rounding leaves.
pub fn counts(n: usize, total: usize) -> Vec<usize> {
    let shares = n * (n + 1) / 2;
    let mut c: Vec<usize> = (0..n).map(|r| total * (r + 1) / shares.max(1)).collect();
    let given: usize = c.iter().sum();
    if let Some(last) = c.last_mut() {
        *last += total - given;
    }
    c
}

/// Number of elements of `t` (a collective's output over `n` ranks) that
/// differ from `want`.
pub fn wrong(
    t: &Tensor,
    n: usize,
    want: &dyn Fn(usize) -> Option<(i64, Option<f64>)>,
) -> Result<u64, Error> {
    match t.dtype() {
        DType::F32 => wrong_in::<f32>(t, n, want),
        DType::F16 => wrong_in::<f16>(t, n, want),
        DType::BF16 => wrong_in::<bf16>(t, n, want),
        DType::I32 => wrong_in::<i32>(t, n, want),
        DType::U32 => wrong_in::<u32>(t, n, want),
    }
}
