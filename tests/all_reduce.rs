//! all_reduce values against the CPU reference: every dtype and op, several
//! world sizes and awkward lengths, both in place and out of place.

mod common;

use common::*;
use wgpu_collectives::{Error, ReduceOp, World};

fn lengths(n: usize) -> Vec<usize> {
    let mut l = vec![0, 1, n.saturating_sub(1), n + 1, 1_000_003, 1 << 20];
    l.dedup();
    l
}

/// One all_reduce per (op, length, placement) on every rank, checked
/// against the reference, against the input's expected state, and for
/// identical bits on every rank. Each rank's input and the reference are
/// made once per (op, length): the test's own arithmetic on the CPU was
/// most of its time on the two cores it shares with lavapipe.
fn sweep<T: Num>(world: &World, lens: &[usize]) {
    let n = world.size();
    for op in ops_for(T::DTYPE) {
        for &len in lens {
            let ins: Vec<Vec<T>> = (0..n).map(|r| inputs::<T>(op, r, len)).collect();
            let want = fold::<T>(op, &ins);
            for in_place in [false, true] {
                let what = format!(
                    "{n} ranks, {} {op}, len {len}, {}",
                    T::DTYPE,
                    if in_place { "in place" } else { "out of place" }
                );
                let results = world
                    .run(|c| -> Result<_, Error> {
                        let x = c.tensor(ins.get(c.rank()).map_or(&[][..], Vec::as_slice))?;
                        let y = if in_place {
                            c.all_reduce_in_place(&x, op)?.wait()?
                        } else {
                            c.all_reduce(&x, op)?.wait()?
                        };
                        Ok((read::<T>(&x), read::<T>(&y)))
                    })
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let mut first: Option<&[T]> = None;
                for (rank, res) in results.iter().enumerate() {
                    let (x, y) = res
                        .as_ref()
                        .unwrap_or_else(|e| panic!("{what}, rank {rank}: {e}"));
                    check(&format!("{what}, rank {rank}"), op, y, &want);
                    let (held, wanted) = if in_place {
                        ("the result", y)
                    } else {
                        ("its input unchanged", &ins[rank])
                    };
                    check(
                        &format!("{what}, rank {rank}, the input holds {held}"),
                        ReduceOp::Sum,
                        x,
                        wanted,
                    );
                    match first {
                        None => first = Some(y),
                        Some(f) => assert!(
                            f.iter().map(|v| v.raw()).eq(y.iter().map(|v| v.raw())),
                            "{what}: rank {rank}'s bits differ from rank 0's"
                        ),
                    }
                }
            }
        }
    }
}

fn every_dtype_and_op(n: usize) {
    let w = world(n);
    let lens = lengths(n);
    sweep::<f32>(&w, &lens);
    sweep::<half::f16>(&w, &lens);
    sweep::<half::bf16>(&w, &lens);
    sweep::<i32>(&w, &lens);
    sweep::<u32>(&w, &lens);
}

#[test]
fn every_dtype_and_op_on_1_rank() {
    every_dtype_and_op(1);
}

#[test]
fn every_dtype_and_op_on_2_ranks() {
    every_dtype_and_op(2);
}

#[test]
fn every_dtype_and_op_on_3_ranks() {
    every_dtype_and_op(3);
}

#[test]
fn every_dtype_and_op_on_4_ranks() {
    every_dtype_and_op(4);
}

#[test]
fn every_dtype_and_op_on_5_ranks() {
    every_dtype_and_op(5);
}

#[test]
fn every_dtype_and_op_on_8_ranks() {
    every_dtype_and_op(8);
}

/// The same inputs give the same bits on every run (Avg on floats is the
/// case where reduction order would show).
#[test]
fn results_are_identical_across_runs() {
    let w = world(5);
    let len = 1_000_003;
    let once = || {
        w.run(|c| -> Result<Vec<u32>, Error> {
            let x = c.tensor(
                &(0..len)
                    .map(|i| (bits(c.rank(), i, 7) % 1000) as f32 / 7.0)
                    .collect::<Vec<f32>>(),
            )?;
            let y = c.all_reduce(&x, ReduceOp::Avg)?.wait()?;
            Ok(y.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect())
        })
        .expect("run")
        .into_iter()
        .map(|r| r.expect("all_reduce"))
        .collect::<Vec<_>>()
    };
    let (a, b) = (once(), once());
    for rank in 0..5 {
        assert!(a[rank] == a[0], "rank {rank} differs from rank 0 in run 1");
        assert!(a[rank] == b[rank], "rank {rank} differs between runs");
    }
}

/// A tensor larger than the adapter's largest storage binding is reduced
/// in pieces; an odd f16 length also leaves a half-filled last word.
#[test]
fn tensor_larger_than_one_storage_binding() {
    let w = world(2);
    let max_binding = w
        .communicator(0)
        .expect("rank 0")
        .device()
        .limits()
        .max_storage_buffer_binding_size as usize;
    let len = max_binding / 2 + 2 * 4099 + 1; // f16 elements: more bytes than one binding, odd
    let results = w
        .run(|c| -> Result<Vec<half::f16>, Error> {
            let (_, y) = all_reduce::<half::f16>(c, ReduceOp::Sum, len, true)?;
            y.to_vec::<half::f16>()
        })
        .expect("run");
    let want = reference::<half::f16>(ReduceOp::Sum, 2, len);
    for (rank, r) in results.into_iter().enumerate() {
        check(
            &format!("rank {rank}, {len} f16 elements"),
            ReduceOp::Sum,
            &r.expect("all_reduce"),
            &want,
        );
    }
}
