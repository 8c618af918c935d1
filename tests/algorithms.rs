//! The all-reduce algorithms: one-shot and ring give the same bits (so the
//! cost model's choice never shows in results), and the cost model picks
//! one-shot for small messages and the ring for large ones.

mod common;

use std::time::Duration;

use common::*;
use wgpu_collectives::{Algorithm, CostModel, Error, ReduceOp, World, WorldConfig};

fn forced(n: usize, a: Algorithm) -> World {
    World::new(WorldConfig::new(n).with_algorithm(a))
        .unwrap_or_else(|e| panic!("{n}-rank world: {e}"))
}

/// Values whose sums round: the reduction order shows in the bits.
fn rough(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (bits(rank, i, 3) % 100_000) as f32 / 7.0 - 5000.0)
        .collect()
}

fn results<T: Num>(w: &World, op: ReduceOp, len: usize) -> Vec<Vec<u64>> {
    w.run(|c| -> Result<Vec<u64>, Error> {
        let x = c.tensor(&inputs::<T>(op, c.rank(), len))?;
        Ok(c.all_reduce(&x, op)?
            .wait()?
            .to_vec::<T>()?
            .iter()
            .map(|v| v.raw())
            .collect())
    })
    .expect("run")
    .into_iter()
    .map(|r| r.expect("all_reduce"))
    .collect()
}

fn same_bits_as_the_ring<T: Num>(one: &World, ring: &World) {
    let n = one.size();
    for op in ops_for(T::DTYPE) {
        for len in [1, 7, 1000, 4099, 30_001] {
            let (a, b) = (results::<T>(one, op, len), results::<T>(ring, op, len));
            assert!(
                a == b,
                "{n} ranks, {} {op}, len {len}: one-shot and ring differ",
                T::DTYPE
            );
            let want: Vec<u64> = reference::<T>(op, n, len).iter().map(|v| v.raw()).collect();
            if op != ReduceOp::Avg || T::DTYPE.is_integer() {
                assert!(
                    a[0] == want,
                    "{n} ranks, {} {op}, len {len}: wrong values",
                    T::DTYPE
                );
            }
        }
    }
}

#[test]
fn one_shot_gives_the_rings_bits_for_every_dtype_and_op() {
    for n in [2, 3, 5] {
        let (one, ring) = (forced(n, Algorithm::OneShot), forced(n, Algorithm::Ring));
        same_bits_as_the_ring::<f32>(&one, &ring);
        same_bits_as_the_ring::<half::f16>(&one, &ring);
        same_bits_as_the_ring::<half::bf16>(&one, &ring);
        same_bits_as_the_ring::<i32>(&one, &ring);
        same_bits_as_the_ring::<u32>(&one, &ring);
    }
}

#[test]
fn one_shot_and_ring_agree_where_the_order_of_a_sum_shows() {
    let (one, ring) = (forced(4, Algorithm::OneShot), forced(4, Algorithm::Ring));
    for len in [3, 1000, 50_000] {
        let run = |w: &World| {
            w.run(|c| -> Result<Vec<u32>, Error> {
                let x = c.tensor(&rough(c.rank(), len))?;
                let y = c.all_reduce(&x, ReduceOp::Avg)?.wait()?;
                Ok(y.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
            })
            .expect("run")
            .into_iter()
            .map(|r| r.expect("all_reduce"))
            .collect::<Vec<_>>()
        };
        let (a, b) = (run(&one), run(&ring));
        assert!(a == b, "len {len}: one-shot and ring differ");
        // And they are right: three f32 additions and a division, each
        // off by at most half an ULP of what it rounds.
        let inputs: Vec<Vec<f32>> = (0..4).map(|r| rough(r, len)).collect();
        for (i, &bits) in a[0].iter().enumerate() {
            let terms: Vec<f64> = inputs.iter().map(|x| f64::from(x[i])).collect();
            let exact = terms.iter().sum::<f64>() / 4.0;
            let scale = terms.iter().map(|t| t.abs()).sum::<f64>() / 4.0;
            let got = f64::from(f32::from_bits(bits));
            let bound = f64::from(f32::EPSILON) * (3.0 * scale + exact.abs());
            assert!(
                (got - exact).abs() <= bound,
                "len {len}, element {i}: {got} vs {exact}"
            );
        }
    }
}

#[test]
fn the_cost_model_picks_one_shot_for_small_messages_only() {
    let m = CostModel {
        alpha: Duration::from_micros(100),
        beta: 1e9,
        dispatch: Duration::from_micros(5),
    };
    assert_eq!(m.all_reduce_algorithm(4, 4096), Algorithm::OneShot);
    assert_eq!(m.all_reduce_algorithm(4, 64 << 20), Algorithm::Ring);
    // Two ranks: the ring is one round trip each way already.
    assert_eq!(m.one_shot_threshold(2), 0);
    let t4 = m.one_shot_threshold(4);
    assert!(t4 > 4096 && t4 < 64 << 20, "threshold {t4}");
    assert_eq!(m.all_reduce_algorithm(4, t4), Algorithm::OneShot);
    assert_eq!(m.all_reduce_algorithm(4, t4 + 1), Algorithm::Ring);
    // A slower fence makes one-shot worth it for bigger messages.
    let slow = CostModel {
        alpha: Duration::from_micros(400),
        ..m
    };
    assert!(slow.one_shot_threshold(4) > t4);
    // Costly dispatches (n(n-1) of them for the one-shot) make it lose.
    let costly = CostModel {
        dispatch: Duration::from_micros(60),
        ..m
    };
    assert_eq!(costly.one_shot_threshold(8), 0);
}

#[test]
fn the_world_measures_its_cost_model() {
    let w = world(2);
    let m = w.cost_model();
    assert!(m.alpha > Duration::ZERO && m.beta > 0.0, "{m:?}");
    assert!(m.dispatch < m.alpha * 100, "{m:?}");
    assert_eq!(w.algorithm(), Algorithm::Auto);
}
