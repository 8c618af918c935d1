//! In steady state a collective creates no wgpu resources: outputs and
//! scratch come from the device's pool, staging buffers are made once per
//! communicator, pipelines and bind groups are cached.
//!
//! Healing is off here: a table that heals may time another plan on the
//! calls themselves, and a plan's first call makes its resources.

mod common;

use common::*;
use wgpu_collectives::{Communicator, Error, ReduceOp, World, WorldConfig};

/// A world of `n` ranks whose plans stay as its table chose them.
fn world(n: usize) -> World {
    World::new(WorldConfig::new(n).with_healing(false)).expect("a world")
}

fn repeat(c: &Communicator, times: usize, bytes: usize) -> Result<(), Error> {
    let x = c.tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), bytes / 4))?;
    for _ in 0..times {
        let _ = c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?;
        let y = c.all_reduce(&x, ReduceOp::Max)?.wait()?;
        drop(y);
    }
    Ok(())
}

#[test]
fn a_hundred_repeated_collectives_create_no_wgpu_resources() {
    let w = world(4);
    for bytes in [4 << 10, 3 << 20] {
        let counts = w
            .run(|c| -> Result<(u64, u64), Error> {
                repeat(c, 1, bytes)?;
                let before = c.resources_created();
                repeat(c, 100, bytes)?;
                Ok((before, c.resources_created()))
            })
            .expect("run");
        for (rank, r) in counts.into_iter().enumerate() {
            let (before, after) = r.expect("collectives");
            assert!(
                before > 0,
                "rank {rank}: the first collective creates its resources"
            );
            assert_eq!(
                after,
                before,
                "rank {rank}, {bytes} bytes: 100 more collectives created {} wgpu resources",
                after - before
            );
        }
    }
}

/// Out-of-place calls issued back to back with their results dropped (the
/// benchmark's timed loop, or a caller that only keeps the last): outputs
/// are taken from the pool when each op starts, so the queue runs on
/// recycled buffers, not a fresh one per call. The last result is checked
/// against the CPU reference, so a reused buffer with stale bytes shows.
#[test]
fn a_queue_of_dropped_out_of_place_results_creates_no_wgpu_resources() {
    let w = world(3);
    let n = 3;
    let len = (3 << 20) / 4;
    let counts = w
        .run(|c| -> Result<(u64, u64, Vec<f32>), Error> {
            let x = c.tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), len))?;
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            let before = c.resources_created();
            for _ in 0..30 {
                drop(c.all_reduce(&x, ReduceOp::Sum)?);
            }
            let y = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            Ok((before, c.resources_created(), y.to_vec::<f32>()?))
        })
        .expect("run");
    let want = reference::<f32>(ReduceOp::Sum, n, len);
    for (rank, r) in counts.into_iter().enumerate() {
        let (before, after, y) = r.expect("collectives");
        assert_eq!(
            after,
            before,
            "rank {rank}: 31 queued all_reduces created {} wgpu resources",
            after - before
        );
        check(&format!("rank {rank}"), ReduceOp::Sum, &y, &want);
    }
}
