//! Shared test helpers: worlds, inputs whose exact reduction is known
//! whatever the reduction order, and the CPU reference.
#![allow(dead_code)]

pub mod filecheck;

use half::{bf16, f16};
use wgpu_collectives::{Communicator, DType, Element, ReduceOp, Tensor, World, WorldConfig};

/// A world of `n` ranks; panics (fails the test) when no adapter is found.
pub fn world(n: usize) -> World {
    match World::new(WorldConfig::new(n)) {
        Ok(w) => w,
        Err(e) => panic!("cannot build a {n}-rank world: {e}"),
    }
}

/// The adapter a framework would pick: the one `WGPU_ADAPTER_NAME` names
/// (else the first); fails the test when there is none.
pub fn user_adapter() -> wgpu_collectives::wgpu::Adapter {
    use wgpu_collectives::wgpu;
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle().with_env());
    let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    if let Ok(name) = std::env::var("WGPU_ADAPTER_NAME") {
        let name = name.to_lowercase();
        adapters.retain(|a| a.get_info().name.to_lowercase().contains(&name));
    }
    adapters
        .into_iter()
        .next()
        .expect("an adapter (is one installed?)")
}

/// Deterministic pseudo-random bits for (rank, index, salt).
pub fn bits(rank: usize, i: usize, salt: u64) -> u32 {
    let mut z = ((rank as u64) << 40) ^ (i as u64) ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

/// Element types under test, with a reference reduction.
pub trait Num: Element + Copy + PartialEq + std::fmt::Debug {
    /// An input for `op` on `rank` at index `i`, chosen so that the exact
    /// result does not depend on reduction order (small integers for float
    /// sums, powers of two for float products).
    fn input(op: ReduceOp, rank: usize, i: usize) -> Self;
    /// The reduction of two values (wrapping for integers).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// Avg's last step.
    fn divide(sum: Self, n: usize) -> Self;
    /// Distance in units in the last place (0 for equal integers).
    fn ulps(a: Self, b: Self) -> u64;
    /// Raw bits, for bit-exact comparison.
    fn raw(self) -> u64;
}

fn float_input(op: ReduceOp, rank: usize, i: usize) -> f32 {
    let h = bits(rank, i, op as u64);
    match op {
        ReduceOp::Prod => [-2.0, -1.0, 0.5, 1.0, 2.0][(h % 5) as usize],
        ReduceOp::Min | ReduceOp::Max => ((h % 4001) as f32 - 2000.0) / 16.0,
        _ => (h % 17) as f32 - 8.0,
    }
}

macro_rules! float_num {
    ($t:ty, $from:expr, $to:expr, $bits:expr) => {
        impl Num for $t {
            fn input(op: ReduceOp, rank: usize, i: usize) -> Self {
                $from(float_input(op, rank, i))
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                let (x, y): (f32, f32) = ($to(a), $to(b));
                $from(match op {
                    ReduceOp::Sum | ReduceOp::Avg => x + y,
                    ReduceOp::Prod => x * y,
                    ReduceOp::Min => x.min(y),
                    ReduceOp::Max => x.max(y),
                    _ => unreachable!("bitwise op on a float"),
                })
            }
            fn divide(sum: Self, n: usize) -> Self {
                $from((f64::from($to(sum)) / n as f64) as f32)
            }
            fn ulps(a: Self, b: Self) -> u64 {
                // Map the sign-magnitude bits onto a monotonic integer line.
                let key = |v: Self| {
                    let b = $bits(v) as i64;
                    let sign = 1i64 << (8 * std::mem::size_of::<Self>() - 1);
                    if b & sign != 0 { -(b & (sign - 1)) } else { b }
                };
                key(a).abs_diff(key(b))
            }
            fn raw(self) -> u64 {
                $bits(self) as u64
            }
        }
    };
}
float_num!(f32, |x: f32| x, |x: f32| x, |x: f32| x.to_bits());
float_num!(f16, f16::from_f32, f16::to_f32, |x: f16| x.to_bits());
float_num!(bf16, bf16::from_f32, bf16::to_f32, |x: bf16| x.to_bits());

macro_rules! int_num {
    ($t:ty) => {
        impl Num for $t {
            fn input(op: ReduceOp, rank: usize, i: usize) -> Self {
                bits(rank, i, op as u64 + 100) as $t
            }
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::BitAnd => a & b,
                    ReduceOp::BitOr => a | b,
                    ReduceOp::BitXor => a ^ b,
                }
            }
            fn divide(sum: Self, n: usize) -> Self {
                sum / n as $t
            }
            fn ulps(a: Self, b: Self) -> u64 {
                u64::from(a != b)
            }
            fn raw(self) -> u64 {
                self as u32 as u64
            }
        }
    };
}
int_num!(i32);
int_num!(u32);

/// Rank `rank`'s input.
pub fn inputs<T: Num>(op: ReduceOp, rank: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::input(op, rank, i)).collect()
}

/// The exact all-reduce of the inputs `ins` (one per rank, of one
/// length), folded in rank order.
pub fn fold<T: Num>(op: ReduceOp, ins: &[Vec<T>]) -> Vec<T> {
    let Some((first, rest)) = ins.split_first() else {
        return Vec::new();
    };
    let mut acc = first.clone();
    for x in rest {
        for (a, &b) in acc.iter_mut().zip(x) {
            *a = T::combine(op, *a, b);
        }
    }
    if op == ReduceOp::Avg {
        for a in &mut acc {
            *a = T::divide(*a, ins.len());
        }
    }
    acc
}

/// The exact all-reduce of every rank's input, folded in rank order.
pub fn reference<T: Num>(op: ReduceOp, n: usize, len: usize) -> Vec<T> {
    let ins: Vec<Vec<T>> = (0..n).map(|r| inputs::<T>(op, r, len)).collect();
    fold(op, &ins)
}

/// Checks `got` against `want`: bit-exact, except Avg on floats within 2 ULP.
pub fn check<T: Num>(what: &str, op: ReduceOp, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let float = !T::DTYPE.is_integer();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = if float && op == ReduceOp::Avg {
            T::ulps(*g, *w) <= 2
        } else {
            g.raw() == w.raw()
        };
        assert!(ok, "{what}: element {i} is {g:?}, want {w:?}");
    }
}

/// Reads a tensor back, failing the test on error.
pub fn read<T: Num>(t: &Tensor) -> Vec<T> {
    match t.to_vec::<T>() {
        Ok(v) => v,
        Err(e) => panic!("to_vec: {e}"),
    }
}

/// All-reduces this rank's generated input; returns (input tensor, output tensor).
pub fn all_reduce<T: Num>(
    c: &Communicator,
    op: ReduceOp,
    len: usize,
    in_place: bool,
) -> Result<(Tensor, Tensor), wgpu_collectives::Error> {
    let x = c.tensor(&inputs::<T>(op, c.rank(), len))?;
    let y = if in_place {
        c.all_reduce_in_place(&x, op)?.wait()?
    } else {
        c.all_reduce(&x, op)?.wait()?
    };
    Ok((x, y))
}

/// The ops defined on `dtype`.
pub fn ops_for(dtype: DType) -> Vec<ReduceOp> {
    ReduceOp::ALL
        .into_iter()
        .filter(|op| op.supports(dtype))
        .collect()
}

/// A fixed cost model for graph passes: 100 us a hop, 1 GB/s, 4 ranks,
/// 1 GFLOP/s, 10 GB/s (so that tests do not depend on the machine).
pub fn graph_cost() -> wgpu_collectives::graph::passes::GraphCost {
    wgpu_collectives::graph::passes::GraphCost {
        comm: wgpu_collectives::CostModel {
            alpha: std::time::Duration::from_micros(100),
            beta: 1e9,
            dispatch: std::time::Duration::from_micros(5),
        },
        ranks: 4,
        flops: 1e9,
        bytes: 1e10,
    }
}
