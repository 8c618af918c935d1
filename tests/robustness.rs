//! The defects an attack with bad input and faults found, each as its
//! repro: concurrent runs and threads sharing a communicator never pair
//! the wrong collectives, sizes that overflow and absurd timeouts are
//! errors or waits (never panics), all_to_all counts are validated before
//! anything is issued, and dropping a world with a rank stuck does not
//! block for the timeout.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use wgpu_collectives::graph::eager;
use wgpu_collectives::{DType, Error, ReduceOp, World, WorldConfig};

/// Each rank's outputs, or its error.
type PerRank = Vec<Result<Vec<Vec<f32>>, Error>>;

/// Ten all_reduces of `[v; 8]` on every rank; each must sum to n·v.
fn ten_sums(w: &World, v: f32) -> Result<PerRank, Error> {
    w.run(|c| {
        let x = c.tensor(&[v; 8])?;
        let works = (0..10)
            .map(|_| c.all_reduce(&x, ReduceOp::Sum))
            .collect::<Result<Vec<_>, _>>()?;
        works
            .into_iter()
            .map(|w| w.wait()?.to_vec::<f32>())
            .collect::<Result<Vec<_>, _>>()
    })
}

#[test]
fn two_runs_at_once_never_mix_their_collectives() {
    let w = world(2);
    for _ in 0..5 {
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| ten_sums(&w, 1.0));
            let b = s.spawn(|| ten_sums(&w, 1000.0));
            (a.join().expect("thread a"), b.join().expect("thread b"))
        });
        let mut ran = 0;
        for (r, v) in [(a, 1.0f32), (b, 1000.0)] {
            match r {
                Ok(ranks) => {
                    ran += 1;
                    for rank in ranks {
                        for out in rank.expect("a run that started completes") {
                            assert_eq!(out, vec![2.0 * v; 8], "a result mixed two runs");
                        }
                    }
                }
                Err(Error::InvalidArgument { what, .. }) => {
                    assert!(what.contains("another run"), "{what}")
                }
                Err(e) => panic!("unexpected error: {e}"),
            }
        }
        assert!(ran >= 1, "at least one of the runs must go ahead");
    }
}

#[test]
fn a_run_while_another_is_in_progress_is_refused_and_the_first_completes() {
    let w = world(2);
    let started = AtomicBool::new(false);
    let release = AtomicBool::new(false);
    std::thread::scope(|s| {
        let first = s.spawn(|| {
            w.run(|c| {
                started.store(true, Ordering::Release);
                while !release.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let x = c.tensor(&[3i32; 5])?;
                c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<i32>()
            })
        });
        while !started.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        match w.run(|_| ()) {
            Err(Error::InvalidArgument { what, .. }) => {
                assert!(what.contains("another run"), "{what}")
            }
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        release.store(true, Ordering::Release);
        for r in first.join().expect("first run").expect("run") {
            assert_eq!(r.expect("rank"), vec![6; 5]);
        }
    });
    // And a run after it goes ahead.
    for r in w.run(|c| c.rank()).expect("a later run") {
        assert!(r < 2);
    }
}

#[test]
fn threads_sharing_a_communicator_in_a_run_are_refused_not_cross_paired() {
    let w = world(2);
    let results = w
        .run(|c| {
            std::thread::scope(|s| {
                let spawned = [1.0f32, 1000.0].map(|v| {
                    s.spawn(move || -> Result<Vec<f32>, Error> {
                        let x = c.tensor(&[v; 8])?;
                        c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
                    })
                });
                spawned.map(|h| h.join().expect("thread"))
            })
        })
        .expect("run");
    for rank in results {
        for r in rank {
            match r {
                Err(Error::InvalidArgument { what, .. }) => {
                    assert!(what.contains("rank"), "{what}")
                }
                other => panic!("a second thread's collective must be refused: {other:?}"),
            }
        }
    }
    // The rank's own thread still pairs correctly.
    for r in w
        .run(|c| {
            let x = c.tensor(&[c.rank() as f32 + 1.0; 4])?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
        })
        .expect("run")
    {
        assert_eq!(r.expect("rank"), vec![3.0; 4]);
    }
}

#[test]
fn a_second_thread_issuing_while_the_first_ones_work_is_in_flight_fails_the_group() {
    let w = world(2);
    let c0 = w.communicator(0).expect("rank 0");
    let x = c0.tensor(&[1.0f32; 8]).expect("tensor");
    // Rank 1 has not issued, so this stays in flight.
    let first = c0.all_reduce(&x, ReduceOp::Sum).expect("issue");
    let second = std::thread::scope(|s| {
        s.spawn(|| c0.all_reduce(&x, ReduceOp::Sum).map(|_| ()))
            .join()
            .expect("thread")
    });
    match second {
        Err(Error::InvalidArgument { what, .. }) => {
            assert!(what.contains("second thread"), "{what}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // The collective already in flight fails rather than pairing with
    // whatever rank 1 issues next.
    let c1 = w.communicator(1).expect("rank 1");
    let y = c1.tensor(&[1000.0f32; 8]).expect("tensor");
    let peer = c1.all_reduce(&y, ReduceOp::Sum).and_then(|w| w.wait());
    assert!(peer.is_err(), "rank 1's collective must fail: {peer:?}");
    match first.wait() {
        Err(Error::InvalidArgument { .. }) | Err(Error::PeerFailed { .. }) => {}
        other => panic!("the first collective must fail: {other:?}"),
    }
}

#[test]
fn lengths_whose_byte_size_overflows_are_invalid_arguments() {
    let w = world(2);
    let c = w.communicator(0).expect("rank 0");
    for len in [usize::MAX, (1 << 61) + 1, usize::MAX / 2 + 1] {
        for dtype in DType::ALL {
            match c.zeros(dtype, len) {
                Err(Error::InvalidArgument { what, .. }) => {
                    assert!(what.contains("overflows"), "{what}")
                }
                Err(Error::Device { what, .. }) => {
                    assert!(what.contains("max_buffer_size"), "{what}")
                }
                other => panic!("zeros({dtype}, {len}): expected an error, got {other:?}"),
            }
        }
    }
    let a = c.tensor(&[1.0f32; 4]).expect("a");
    let b = c.tensor(&[1.0f32; 4]).expect("b");
    match eager::matmul(&a, &b, [(1 << 62) + 1, 4, 1], false, false) {
        Err(Error::InvalidArgument { what, .. }) => assert!(what.contains("overflows"), "{what}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // A dimension past the kernels' 32-bit indices, with a product that fits.
    let empty = c.tensor::<f32>(&[]).expect("empty");
    match eager::matmul(&empty, &empty, [1 << 33, 0, 1], false, false) {
        Err(Error::InvalidArgument { .. }) => {}
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // The world still works.
    let out = w
        .run(|c| {
            let x = c.tensor(&[2u32; 3])?;
            c.all_gather(&x)?.wait()?.to_vec::<u32>()
        })
        .expect("run");
    for r in out {
        assert_eq!(r.expect("rank"), vec![2; 6]);
    }
}

#[test]
fn an_infinite_timeout_waits_instead_of_panicking() {
    let w = World::new(WorldConfig::new(2).with_timeout(Duration::MAX)).expect("world");
    let out = w
        .run(|c| {
            let x = c.tensor(&[c.rank() as i32 + 1; 6])?;
            let y = c
                .all_reduce(&x, ReduceOp::Sum)?
                .wait_timeout(Duration::MAX)?;
            let z = c.broadcast(&y, 1)?.wait()?;
            let _ = c.barrier()?.wait_timeout(Duration::MAX)?;
            z.to_vec::<i32>()
        })
        .expect("run");
    for r in out {
        assert_eq!(r.expect("rank"), vec![3; 6]);
    }
}

#[test]
fn all_to_all_counts_are_checked_before_anything_is_issued() {
    let w = world(2);
    let out = w
        .run(|c| {
            let x = c.tensor(&[c.rank() as u32; 4])?;
            // What rank r sends itself must be what it receives from itself
            // (the repro: rank 0 sends itself 2, expects 3).
            let mut own = [2, 2];
            own[c.rank()] = 3;
            let errs = [
                c.all_to_all(&x, Some(&[2, 2]), Some(&own)).err(),
                // Sums that wrap.
                c.all_to_all(&x, Some(&[usize::MAX, 1]), None).err(),
                c.all_to_all(&x, Some(&[2, 2]), Some(&[2, usize::MAX]))
                    .err(),
                c.all_to_all(&x, Some(&[2, 2]), Some(&[usize::MAX, 2]))
                    .err(),
            ];
            // Nothing was issued: a valid call now runs as sequence 0 on both ranks.
            let y = c.all_to_all(&x, None, None)?.wait()?.to_vec::<u32>()?;
            Ok::<_, Error>((errs, y))
        })
        .expect("run");
    for (rank, r) in out.into_iter().enumerate() {
        let (errs, y) = r.expect("rank");
        // Each bad call fails on both ranks, so none was issued anywhere.
        for (i, e) in errs.iter().enumerate() {
            match e {
                Some(Error::InvalidArgument { .. }) => {}
                None => panic!("call {i} on rank {rank} must fail"),
                Some(other) => panic!("call {i} on rank {rank}: {other}"),
            }
        }
        assert_eq!(y, vec![0, 0, 1, 1]);
    }
}

#[test]
fn dropping_a_world_with_a_rank_waiting_for_a_peer_returns_promptly() {
    let w = World::new(WorldConfig::new(2).with_timeout(Duration::from_secs(60))).expect("world");
    let c0 = w.communicator(0).expect("rank 0");
    let x = c0.tensor(&[1.0f32; 1024]).expect("tensor");
    let work = c0.all_reduce(&x, ReduceOp::Sum).expect("issue");
    // Let the progress thread start waiting for rank 1.
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    drop(w);
    let took = start.elapsed();
    assert!(took < Duration::from_secs(20), "dropping took {took:?}");
    match work.wait() {
        Err(Error::Aborted { .. }) => {}
        other => panic!("expected Aborted, got {other:?}"),
    }
}
