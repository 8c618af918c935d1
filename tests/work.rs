//! The async handle: many collectives in flight, waiting from another
//! thread, the Future path, is_completed, dropped work, inputs kept alive.

mod common;

use std::time::{Duration, Instant};

use common::*;
use wgpu_collectives::{Error, ReduceOp, Work};

const N: usize = 4;

fn expect_all<T>(results: Vec<Result<T, Error>>) -> Vec<T> {
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
        .collect()
}

#[test]
fn eight_collectives_in_flight_complete_in_any_wait_order() {
    let w = world(N);
    let ops = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];
    let lens = [1usize, 7, 1000, 4096, 65_537, 3, 300_001, 12];
    let results = w
        .run(|c| -> Result<Vec<Vec<f32>>, Error> {
            let works: Vec<Work> = (0..8)
                .map(|k| {
                    let x = c.tensor(&inputs::<f32>(ops[k % 4], c.rank(), lens[k]))?;
                    c.all_reduce(&x, ops[k % 4])
                })
                .collect::<Result<_, _>>()?;
            // Wait newest first: earlier ones must still be right.
            let mut outs = Vec::new();
            for work in works.into_iter().rev() {
                outs.push(work.wait()?.to_vec::<f32>()?);
            }
            outs.reverse();
            Ok(outs)
        })
        .expect("run");
    for (rank, outs) in expect_all(results).into_iter().enumerate() {
        for k in 0..8 {
            let want = reference::<f32>(ops[k % 4], N, lens[k]);
            check(
                &format!("rank {rank}, collective {k}"),
                ops[k % 4],
                &outs[k],
                &want,
            );
        }
    }
}

#[test]
fn work_can_be_waited_on_from_another_thread() {
    let w = world(N);
    let len = 100_003;
    let results = w
        .run(|c| -> Result<Vec<i32>, Error> {
            let x = c.tensor(&inputs::<i32>(ReduceOp::Sum, c.rank(), len))?;
            let work = c.all_reduce(&x, ReduceOp::Sum)?;
            let waiter = std::thread::spawn(move || work.wait().and_then(|t| t.to_vec::<i32>()));
            waiter.join().expect("waiter thread")
        })
        .expect("run");
    let want = reference::<i32>(ReduceOp::Sum, N, len);
    for (rank, out) in expect_all(results).into_iter().enumerate() {
        check(&format!("rank {rank}"), ReduceOp::Sum, &out, &want);
    }
}

#[test]
fn work_is_a_future() {
    let w = world(N);
    let len = 50_001;
    let results = w
        .run(|c| -> Result<Vec<u32>, Error> {
            let x = c.tensor(&inputs::<u32>(ReduceOp::BitXor, c.rank(), len))?;
            let work = c.all_reduce(&x, ReduceOp::BitXor)?;
            let y = futures::executor::block_on(work)?;
            y.to_vec::<u32>()
        })
        .expect("run");
    let want = reference::<u32>(ReduceOp::BitXor, N, len);
    for (rank, out) in expect_all(results).into_iter().enumerate() {
        check(&format!("rank {rank}"), ReduceOp::BitXor, &out, &want);
    }
}

#[test]
fn is_completed_turns_true_without_waiting() {
    let w = world(N);
    let len = 200_000;
    let results = w
        .run(|c| -> Result<Vec<f32>, Error> {
            let x = c.tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), len))?;
            let work = c.all_reduce(&x, ReduceOp::Sum)?;
            let give_up = Instant::now() + Duration::from_secs(60);
            while !work.is_completed() {
                assert!(Instant::now() < give_up, "is_completed never became true");
                std::thread::sleep(Duration::from_millis(1));
            }
            work.wait()?.to_vec::<f32>()
        })
        .expect("run");
    let want = reference::<f32>(ReduceOp::Sum, N, len);
    for (rank, out) in expect_all(results).into_iter().enumerate() {
        check(&format!("rank {rank}"), ReduceOp::Sum, &out, &want);
    }
}

/// Dropping a Work still completes the collective: the next one, which
/// peers can only reach after it, is correct; and the input tensor, dropped
/// by the caller right after issuing, stayed alive for the ring.
#[test]
fn dropped_work_and_dropped_input_still_complete() {
    let w = world(N);
    let len = 30_000;
    let results = w
        .run(|c| -> Result<(Vec<f32>, Vec<f32>), Error> {
            let x = c.tensor(&inputs::<f32>(ReduceOp::Max, c.rank(), len))?;
            let out = {
                let work = c.all_reduce(&x, ReduceOp::Max)?;
                drop(x);
                work.wait()?
            };
            let y = c.tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), len))?;
            drop(c.all_reduce(&y, ReduceOp::Sum)?);
            let z = c.tensor(&inputs::<f32>(ReduceOp::Min, c.rank(), len))?;
            let last = c.all_reduce(&z, ReduceOp::Min)?.wait()?;
            Ok((out.to_vec::<f32>()?, last.to_vec::<f32>()?))
        })
        .expect("run");
    let max = reference::<f32>(ReduceOp::Max, N, len);
    let min = reference::<f32>(ReduceOp::Min, N, len);
    for (rank, (a, b)) in expect_all(results).into_iter().enumerate() {
        check(
            &format!("rank {rank}, input dropped"),
            ReduceOp::Max,
            &a,
            &max,
        );
        check(
            &format!("rank {rank}, after a dropped work"),
            ReduceOp::Min,
            &b,
            &min,
        );
    }
}
