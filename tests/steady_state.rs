//! In steady state a collective creates no wgpu resources of its own
//! (a bounded few, never one per call; see the asserts): outputs and
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
fn a_hundred_repeated_collectives_create_no_resources_per_call() {
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
            // Not one per call: at most two in 200 collectives. A buffer
            // freed while another rank's encoder is open is held back
            // until it is submitted (device/pool.rs), and the shared
            // device's reduction binds every rank's buffers in one bind
            // group, so a pool that rotated differently can meet a
            // combination it has not bound before: a resource or two,
            // rarely, never growing with the number of calls.
            assert!(
                after - before <= 2,
                "rank {rank}, {bytes} bytes: 100 more rounds created {} wgpu resources",
                after - before
            );
        }
    }
}

/// Out-of-place calls issued back to back with their results dropped (the
/// benchmark's timed loop, or a caller that only keeps the last): outputs
/// are taken from the pool when each op starts, so the queue runs on
/// recycled buffers, not a fresh one per call (at most 3 new in all). The
/// last result is checked against the CPU reference, so a reused buffer
/// with stale bytes shows.
#[test]
fn a_queue_of_dropped_out_of_place_results_creates_no_resources_per_call() {
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
        // A few, never one per call: a buffer freed while another rank's
        // encoder is open is held back until it is submitted
        // (device/pool.rs), so a queue on a shared device may need a
        // buffer or two more than the first call did, and a bind group
        // for each new combination of the ranks' buffers.
        assert!(
            after - before <= 3,
            "rank {rank}: 31 queued all_reduces created {} wgpu resources",
            after - before
        );
        check(&format!("rank {rank}"), ReduceOp::Sum, &y, &want);
    }
}
