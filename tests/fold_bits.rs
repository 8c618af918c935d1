//! The host fold (`HostRing`) and the WGSL fold (`DeviceRing`, `OneShot`,
//! `Direct`) give the same bits for every op and dtype, on the values
//! where IEEE arithmetic leaves room: NaN (either side), signed zeros,
//! infinities, overflow, and the largest and smallest finite values.

mod common;

use wgpu_collectives::{
    Communicator, DType, Element, Error, Placement, Plan, ReduceOp, World, WorldConfig,
};

/// f32 values that stress min, max, prod and sum.
const SPECIAL: [f32; 12] = [
    f32::NAN,
    -f32::NAN,
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MAX,
    -f32::MAX,
    1.0,
    -1.5,
    65504.0,
    70000.0,
];

/// Every pair and triple of special values, laid out so that element i
/// of rank r's input is the r-th value of combination i.
fn combos(n: usize) -> Vec<Vec<f32>> {
    let k = SPECIAL.len();
    let count = k.pow(n as u32);
    (0..n)
        .map(|r| {
            (0..count)
                .map(|i| SPECIAL[(i / k.pow(r as u32)) % k])
                .collect()
        })
        .collect()
}

/// The all-reduce of `values` (this rank's, converted to `dtype`; the
/// integers take the values' bits) on `c`, as raw little-endian bytes.
fn all_reduce_bytes(
    c: &Communicator,
    dtype: DType,
    op: ReduceOp,
    values: &[f32],
) -> Result<Vec<u8>, Error> {
    fn go<T: Element>(
        c: &Communicator,
        op: ReduceOp,
        x: Vec<T>,
        bytes: impl Fn(T) -> Vec<u8>,
    ) -> Result<Vec<u8>, Error> {
        let y = c.all_reduce(&c.tensor(&x)?, op)?.wait()?.to_vec::<T>()?;
        Ok(y.into_iter().flat_map(bytes).collect())
    }
    let v = values.iter().copied();
    match dtype {
        DType::F32 => go(c, op, v.collect(), |x: f32| x.to_le_bytes().to_vec()),
        DType::F16 => go(c, op, v.map(half::f16::from_f32).collect(), |x| {
            x.to_le_bytes().to_vec()
        }),
        DType::BF16 => go(c, op, v.map(half::bf16::from_f32).collect(), |x| {
            x.to_le_bytes().to_vec()
        }),
        DType::I32 => go(c, op, v.map(|x| x.to_bits() as i32).collect(), |x| {
            x.to_le_bytes().to_vec()
        }),
        _ => go(c, op, v.map(f32::to_bits).collect(), |x: u32| {
            x.to_le_bytes().to_vec()
        }),
    }
}

/// A world of `n` ranks under `placement` with `plan` forced.
fn world(n: usize, placement: Placement, plan: Plan) -> World {
    World::new(
        WorldConfig::new(n)
            .with_placement(placement)
            .with_plan(Some(plan)),
    )
    .unwrap_or_else(|e| panic!("{plan}: {e}"))
}

/// The all-reduce's output bytes on every rank of `w`.
fn reduce(w: &World, dtype: DType, op: ReduceOp) -> Vec<Vec<u8>> {
    let all = combos(w.size());
    w.run(|c| all_reduce_bytes(c, dtype, op, &all[c.rank()]))
        .unwrap_or_else(|e| panic!("{dtype} {op:?}: {e}"))
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("{dtype} {op:?}, rank {r}: {e}")))
        .collect()
}

#[test]
fn host_and_wgsl_folds_agree_on_special_values() {
    let mut failures = Vec::new();
    for n in [2, 3] {
        let host = world(n, Placement::DevicePerRank, Plan::HostRing);
        let others = [
            world(n, Placement::DevicePerRank, Plan::DeviceRing),
            world(n, Placement::DevicePerRank, Plan::OneShot),
            world(n, Placement::SharedDevice, Plan::Direct),
        ];
        for dtype in DType::ALL {
            for op in common::ops_for(dtype) {
                let want = reduce(&host, dtype, op);
                for (w, plan) in others
                    .iter()
                    .zip([Plan::DeviceRing, Plan::OneShot, Plan::Direct])
                {
                    let other = reduce(w, dtype, op);
                    let size = dtype.size();
                    for (r, (h, o)) in want.iter().zip(&other).enumerate() {
                        let bad = h.chunks(size).zip(o.chunks(size)).position(|(a, b)| a != b);
                        if let Some(i) = bad {
                            let k = SPECIAL.len();
                            let values: Vec<f32> =
                                (0..n).map(|q| SPECIAL[(i / k.pow(q as u32)) % k]).collect();
                            failures.push(format!(
                                "{n} ranks {dtype} {op:?}: {plan} gives {:02x?} where host-ring gives \
                                 {:02x?} at element {i} (inputs {values:?}), rank {r}",
                                &o[i * size..(i + 1) * size],
                                &h[i * size..(i + 1) * size],
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
