//! The integration's collectives against burn's own (`Tensor::all_reduce`,
//! `all_gather`, `reduce_scatter`, `broadcast`: an independent
//! implementation, emulated through the host) on the same devices, and
//! against a CPU reference for the reductions burn does not have.
//!
//! The burn devices of a world are registered with cubecl for the life of
//! the process, so the tests share one world of four ranks (behind a lock:
//! one call at a time) instead of making devices per test. Inputs are
//! small integers, so every sum is exact whatever the order.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Mutex, MutexGuard, OnceLock};

use burn_tensor::distributed::ReduceOperation;
use burn_tensor::{DType, Device, Tensor, TensorData};
use wgpu_collectives::{ReduceOp, WorldConfig};
use wgpu_collectives_burn::{BurnWorld, Error};

const RANKS: usize = 4;

fn world() -> Idle {
    static WORLD: OnceLock<Mutex<BurnWorld>> = OnceLock::new();
    Idle(
        WORLD
            .get_or_init(|| {
                Mutex::new(
                    BurnWorld::new(WorldConfig::new(RANKS)).expect("a world of 4 burn devices"),
                )
            })
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
    )
}

/// The shared world, held by one test, whose devices are idle again when
/// the test lets go of it. Lavapipe compiles shader variants on its
/// queue's thread: a submission still running when the test binary
/// exits races LLVM's teardown, and the process crashed after every test
/// had passed (5 runs of 6 on a 2-core machine, whichever revision).
/// Burn's own work on the same devices is waited for as well.
struct Idle(MutexGuard<'static, BurnWorld>);

impl std::ops::Deref for Idle {
    type Target = BurnWorld;

    fn deref(&self) -> &BurnWorld {
        &self.0
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        // Both streams onto each device: the engine's submissions, and
        // burn's own (its collectives and kernels, which cubecl may still
        // be compiling or submitting when the test returns; the guard
        // that waited for the engine's alone still saw a crash at exit,
        // once in CI after all 12 tests had passed).
        let idle = self.0.world().run(|c| c.synchronize());
        let burns: Vec<_> = self.0.devices().iter().map(|d| d.sync()).collect();
        if !std::thread::panicking() {
            for r in idle.expect("a run that waits for the devices") {
                r.expect("a device idle again");
            }
            for r in burns {
                r.expect("burn's work on a device done");
            }
        }
    }
}

/// Element `i` of rank `rank`'s input: a small integer in -5..=5,
/// different per rank and per element.
fn value(rank: usize, i: usize, seed: usize) -> f32 {
    ((i * 7 + rank * 13 + seed * 5) % 11) as f32 - 5.0
}

fn values(rank: usize, len: usize, seed: usize) -> Vec<f32> {
    (0..len).map(|i| value(rank, i, seed)).collect()
}

fn tensor<const D: usize>(
    device: &Device,
    dims: [usize; D],
    rank: usize,
    seed: usize,
) -> Tensor<D> {
    let len = dims.iter().product();
    Tensor::from_data(TensorData::new(values(rank, len, seed), dims), device)
}

fn inputs<const D: usize>(world: &BurnWorld, dims: [usize; D], seed: usize) -> Vec<Tensor<D>> {
    world
        .devices()
        .iter()
        .enumerate()
        .map(|(r, d)| tensor(d, dims, r, seed))
        .collect()
}

fn read<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn read_all<const D: usize>(ts: Vec<Tensor<D>>) -> Vec<Vec<f32>> {
    ts.into_iter().map(read).collect()
}

fn assert_on_devices<const D: usize>(world: &BurnWorld, ts: &[Tensor<D>]) {
    for (r, t) in ts.iter().enumerate() {
        assert_eq!(
            &t.device(),
            &world.devices()[r],
            "result {r} is not on rank {r}'s device"
        );
    }
}

#[test]
fn all_reduce_sum_matches_burns_own() {
    let w = world();
    for dims in [[1, 1], [3, 5], [64, 33], [512, 1024]] {
        let ours = w
            .all_reduce(inputs(&w, dims, 1), ReduceOperation::Sum)
            .unwrap();
        assert_on_devices(&w, &ours);
        let burns = Tensor::all_reduce(inputs(&w, dims, 1), ReduceOperation::Sum);
        assert_eq!(
            ours.iter().map(|t| t.dims()).collect::<Vec<_>>(),
            vec![dims; RANKS]
        );
        let (ours, burns) = (read_all(ours), read_all(burns));
        assert_eq!(ours, burns, "dims {dims:?}");
        // And both against the host: the sum over ranks, element by element.
        let len = dims.iter().product();
        let want: Vec<f32> = (0..len)
            .map(|i| (0..RANKS).map(|r| value(r, i, 1)).sum())
            .collect();
        assert_eq!(ours[RANKS - 1], want);
    }
}

#[test]
fn all_reduce_mean_matches_burns_own_within_an_ulp() {
    let w = world();
    let dims = [37, 19];
    let ours = read_all(
        w.all_reduce(inputs(&w, dims, 2), ReduceOperation::Mean)
            .unwrap(),
    );
    let burns = read_all(Tensor::all_reduce(
        inputs(&w, dims, 2),
        ReduceOperation::Mean,
    ));
    for (o, b) in ours.iter().flatten().zip(burns.iter().flatten()) {
        assert!(
            (o - b).abs() <= f32::EPSILON * b.abs().max(1.0),
            "{o} vs {b}"
        );
    }
    // Every rank holds the same bits.
    assert!(ours.iter().all(|r| r == &ours[0]));
}

#[test]
fn all_reduce_with_the_engines_other_ops_matches_the_host() {
    let w = world();
    let len = 1000;
    for (op, fold) in [
        (ReduceOp::Max, f32::max as fn(f32, f32) -> f32),
        (ReduceOp::Min, f32::min),
        (ReduceOp::Prod, |a: f32, b: f32| a * b),
    ] {
        let got = read_all(w.all_reduce(inputs(&w, [len], 3), op).unwrap());
        let want: Vec<f32> = (0..len)
            .map(|i| (1..RANKS).fold(value(0, i, 3), |a, r| fold(a, value(r, i, 3))))
            .collect();
        assert_eq!(got.len(), RANKS);
        for (r, g) in got.iter().enumerate() {
            assert_eq!(g, &want, "{op:?} on rank {r}");
        }
    }
}

#[test]
fn all_gather_matches_burns_own() {
    let w = world();
    for dims in [[1, 3], [5, 7], [128, 300]] {
        let ours = w.all_gather(inputs(&w, dims, 4)).unwrap();
        assert_on_devices(&w, &ours);
        assert!(ours.iter().all(|t| t.dims() == [RANKS * dims[0], dims[1]]));
        let burns = Tensor::all_gather(inputs(&w, dims, 4), 0);
        assert_eq!(read_all(ours), read_all(burns), "dims {dims:?}");
    }
}

#[test]
fn reduce_scatter_matches_burns_own() {
    let w = world();
    for dims in [[4, 1], [8, 9], [256, 130]] {
        let ours = w
            .reduce_scatter(inputs(&w, dims, 5), ReduceOperation::Sum)
            .unwrap();
        assert_on_devices(&w, &ours);
        assert!(ours.iter().all(|t| t.dims() == [dims[0] / RANKS, dims[1]]));
        let burns = Tensor::reduce_scatter(inputs(&w, dims, 5), 0, ReduceOperation::Sum);
        assert_eq!(read_all(ours), read_all(burns), "dims {dims:?}");
    }
}

#[test]
fn broadcast_matches_burns_own() {
    let w = world();
    for root in [0, 2] {
        let dims = [33, 17];
        let x = tensor(&w.devices()[root], dims, root, 6);
        let ours = w.broadcast(x.clone(), root).unwrap();
        assert_on_devices(&w, &ours);
        let burns = Tensor::broadcast(x.clone(), w.devices());
        assert_eq!(read_all(ours), read_all(burns));
        assert_eq!(
            read(x),
            values(root, 33 * 17, 6),
            "the root's own tensor changed"
        );
    }
}

#[test]
fn a_handle_burn_shares_is_not_written_in_place() {
    let w = world();
    let xs = inputs(&w, [300], 7);
    // A second reference to every input: the collective must not write
    // through it.
    let kept = xs.clone();
    let out = read_all(w.all_reduce(xs, ReduceOperation::Sum).unwrap());
    for (r, k) in kept.into_iter().enumerate() {
        assert_eq!(
            read(k),
            values(r, 300, 7),
            "rank {r}'s shared input was overwritten"
        );
    }
    let want: Vec<f32> = (0..300)
        .map(|i| (0..RANKS).map(|r| value(r, i, 7)).sum())
        .collect();
    assert!(out.iter().all(|o| o == &want));
}

#[test]
fn strided_views_are_reduced_as_burn_sees_them() {
    let w = world();
    // A transposed view: row-major order is not the buffer's order.
    let xs: Vec<Tensor<2>> = inputs(&w, [6, 10], 8)
        .into_iter()
        .map(|t| t.swap_dims(0, 1))
        .collect();
    let ys: Vec<Tensor<2>> = inputs(&w, [6, 10], 8)
        .into_iter()
        .map(|t| t.swap_dims(0, 1))
        .collect();
    let ours = w.all_reduce(xs, ReduceOperation::Sum).unwrap();
    assert!(ours.iter().all(|t| t.dims() == [10, 6]));
    assert_eq!(
        read_all(ours),
        read_all(Tensor::all_reduce(ys, ReduceOperation::Sum))
    );
    // A slice along dimension 0 (a range of a larger buffer).
    let xs: Vec<Tensor<2>> = inputs(&w, [8, 5], 9)
        .into_iter()
        .map(|t| t.narrow(0, 3, 4))
        .collect();
    let ys: Vec<Tensor<2>> = inputs(&w, [8, 5], 9)
        .into_iter()
        .map(|t| t.narrow(0, 3, 4))
        .collect();
    let ours = read_all(w.all_gather(xs).unwrap());
    assert_eq!(ours, read_all(Tensor::all_gather(ys, 0)));
}

#[test]
fn half_precision_tensors_match_burns_own() {
    let w = world();
    // burn's wgpu kernels have no bf16 (cubecl's WGSL compiler refuses the
    // cast), so f16 is the half precision a burn program has here.
    let make = || -> Vec<Tensor<1>> {
        inputs(&w, [777], 10)
            .into_iter()
            .map(|t| t.cast(DType::F16))
            .collect()
    };
    let ours = w.all_reduce(make(), ReduceOperation::Sum).unwrap();
    assert!(ours.iter().all(|t| t.dtype() == DType::F16));
    assert_eq!(
        read_all(ours),
        read_all(Tensor::all_reduce(make(), ReduceOperation::Sum))
    );
}

#[test]
fn spmd_calls_match_burns_own() {
    let w = world();
    let dims = [16, 12];
    let got = w
        .run(|rank| -> Result<_, Error> {
            let r = rank.rank();
            let d = rank.device();
            let sum = rank.all_reduce(tensor(d, dims, r, 11), ReduceOperation::Sum)?;
            let gathered = rank.all_gather(tensor(d, dims, r, 12))?;
            let scattered = rank.reduce_scatter(tensor(d, dims, r, 13), ReduceOp::Max)?;
            let root = if r == 1 {
                tensor(d, dims, r, 14)
            } else {
                Tensor::zeros(dims, d)
            };
            let bcast = rank.broadcast(root, 1)?;
            Ok((read(sum), read(gathered), read(scattered), read(bcast)))
        })
        .unwrap();
    let sums = read_all(Tensor::all_reduce(
        inputs(&w, dims, 11),
        ReduceOperation::Sum,
    ));
    let gathers = read_all(Tensor::all_gather(inputs(&w, dims, 12), 0));
    let len = dims[0] * dims[1];
    let chunk = len / RANKS;
    for (r, outcome) in got.into_iter().enumerate() {
        let (sum, gathered, scattered, bcast) = outcome.unwrap();
        assert_eq!(sum, sums[r]);
        assert_eq!(gathered, gathers[r]);
        let max: Vec<f32> = (r * chunk..(r + 1) * chunk)
            .map(|i| (0..RANKS).map(|q| value(q, i, 13)).fold(f32::MIN, f32::max))
            .collect();
        assert_eq!(scattered, max, "rank {r}'s chunk of the max");
        assert_eq!(bcast, values(1, len, 14));
    }
}

#[test]
fn tensors_it_cannot_take_are_errors_with_the_rank() {
    let w = world();
    let d = w.devices();
    // Uneven chunks.
    let err = w
        .reduce_scatter(inputs(&w, [6, 2], 15), ReduceOperation::Sum)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTensor { rank: 0, .. }), "{err}");
    // Rank 2's tensor on rank 3's device.
    let mut xs = inputs(&w, [4], 15);
    xs[2] = tensor(&d[3], [4], 2, 15);
    let err = w.all_reduce(xs, ReduceOperation::Sum).unwrap_err();
    assert!(matches!(err, Error::InvalidTensor { rank: 2, .. }), "{err}");
    // Shapes that disagree.
    let mut xs = inputs(&w, [2, 6], 15);
    xs[1] = tensor(&d[1], [6, 2], 1, 15);
    let err = w.all_reduce(xs, ReduceOperation::Sum).unwrap_err();
    assert!(matches!(err, Error::InvalidTensor { rank: 1, .. }), "{err}");
    // A tensor still tracked by autodiff.
    let xs: Vec<Tensor<1>> = inputs(&w, [4], 15)
        .into_iter()
        .map(|t| t.autodiff().require_grad())
        .collect();
    let err = w.all_reduce(xs, ReduceOperation::Sum).unwrap_err();
    assert!(matches!(err, Error::InvalidTensor { rank: 0, .. }), "{err}");
    // f64 is not a dtype the engine reduces.
    let xs: Vec<Tensor<1>> = inputs(&w, [4], 15)
        .into_iter()
        .map(|t| t.cast(DType::F64))
        .collect();
    let err = w.all_reduce(xs, ReduceOperation::Sum).unwrap_err();
    assert!(matches!(err, Error::InvalidTensor { rank: 0, .. }), "{err}");
    // A wrong count of tensors.
    let err = w
        .all_reduce(inputs(&w, [4], 15).split_off(1), ReduceOperation::Sum)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidTensor { .. }), "{err}");
    // And the world still works afterwards: nothing was issued.
    let ok = read_all(
        w.all_reduce(inputs(&w, [4], 16), ReduceOperation::Sum)
            .unwrap(),
    );
    let want: Vec<f32> = (0..4)
        .map(|i| (0..RANKS).map(|r| value(r, i, 16)).sum())
        .collect();
    assert_eq!(ok[0], want);
}

#[test]
fn ranks_that_disagree_fail_on_every_rank() {
    // A world of its own: a failed run leaves a world to be made anew.
    let w = BurnWorld::new(WorldConfig::new(2).with_timeout(std::time::Duration::from_secs(10)))
        .unwrap();
    let got = w
        .run(|rank| {
            let len = if rank.rank() == 0 { 8 } else { 12 };
            rank.all_reduce(
                Tensor::<1>::ones([len], rank.device()),
                ReduceOperation::Sum,
            )
            .map(read)
        })
        .unwrap();
    for (r, outcome) in got.into_iter().enumerate() {
        let err = outcome.unwrap_err();
        assert!(
            matches!(err, Error::Engine(wgpu_collectives::Error::Mismatch { .. })),
            "rank {r}: {err}"
        );
    }
}
