//! Failures are loud, fast and lossless: mismatches, timeouts with a flight
//! record, ranks that panic or return early, abort, device loss.

use std::time::{Duration, Instant};

use wgpu_collectives::{DType, Error, Placement, ReduceOp, World, WorldConfig};

const N: usize = 4;

/// A world whose collectives give up after `secs`.
fn world_with_timeout(n: usize, secs: u64) -> World {
    World::new(WorldConfig::new(n).with_timeout(Duration::from_secs(secs))).expect("world")
}

/// Every rank's error, failing the test if any rank succeeded.
fn errors<T: std::fmt::Debug>(results: Vec<Result<T, Error>>) -> Vec<Error> {
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| match r {
            Err(e) => e,
            Ok(v) => panic!("rank {rank} succeeded with {v:?}, expected an error"),
        })
        .collect()
}

fn assert_mismatch(errs: &[Error], ours: &str, theirs: &str) {
    for (rank, e) in errs.iter().enumerate() {
        match e {
            Error::Mismatch {
                ours: o, theirs: t, ..
            } => {
                let both = format!("{o} / {t}");
                assert!(
                    both.contains(ours) && both.contains(theirs),
                    "rank {rank}: {e}"
                );
            }
            other => panic!("rank {rank}: expected Mismatch, got {other}"),
        }
    }
}

#[test]
fn a_length_mismatch_fails_every_rank_with_both_sides_at_once() {
    let w = world_with_timeout(N, 30);
    let start = Instant::now();
    let r = w
        .run(|c| {
            // Rank 2 reduces 0 elements, the others 1000: rank 2 alone would send nothing.
            let len = if c.rank() == 2 { 0 } else { 1000 };
            let x = c.tensor(&vec![1.0f32; len])?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|t| t.len())
        })
        .expect("run");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    assert_mismatch(&errors(r), "len 0", "len 1000");
}

#[test]
fn an_op_or_dtype_mismatch_is_caught() {
    let w = world_with_timeout(N, 30);
    let r = w
        .run(|c| {
            let op = if c.rank() == 1 {
                ReduceOp::Max
            } else {
                ReduceOp::Sum
            };
            let x = c.tensor(&[1i32; 64])?;
            c.all_reduce(&x, op)?.wait().map(|t| t.len())
        })
        .expect("run");
    assert_mismatch(&errors(r), "max", "sum");

    let r = w
        .run(|c| {
            let x = if c.rank() == 3 {
                c.zeros(DType::U32, 64)?
            } else {
                c.zeros(DType::I32, 64)?
            };
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|t| t.len())
        })
        .expect("run");
    assert_mismatch(&errors(r), "uint32", "int32");
}

/// A collective's fingerprint says what its call has and nothing else: a
/// barrier has no dtype or length, an all_to_all no length (its counts
/// differ between ranks), and both sides of a mismatch say so.
#[test]
fn a_mismatch_describes_each_call_as_it_was_made() {
    let w = world_with_timeout(N, 30);
    let r = w
        .run(|c| -> Result<usize, Error> {
            if c.rank() == 1 {
                c.barrier()?.wait().map(|t| t.len())
            } else {
                let x = c.tensor(&[c.rank() as i32; N])?;
                c.all_to_all(&x, None, None)?.wait().map(|t| t.len())
            }
        })
        .expect("run");
    let errs = errors(r);
    assert_mismatch(&errs, "#0 barrier()", "#0 all_to_all(int32)");
    for e in &errs {
        match e {
            Error::Mismatch { flight, .. } => {
                assert!(flight.contains("rank 1: [0 barrier"), "{flight}")
            }
            other => panic!("expected Mismatch, got {other}"),
        }
    }
    for e in &errs {
        assert!(
            !e.to_string().contains("len 0"),
            "a placeholder length: {e}"
        );
    }
}

#[test]
fn a_rank_that_skips_a_collective_is_a_mismatch_of_sequence_numbers() {
    let w = world_with_timeout(N, 30);
    let r = w
        .run(|c| -> Result<usize, Error> {
            let x = c.tensor(&[1.0f32; 100])?;
            if c.rank() != 0 {
                let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            }
            let y = c.tensor(&[2.0f32; 50])?;
            c.all_reduce(&y, ReduceOp::Sum)?.wait().map(|t| t.len())
        })
        .expect("run");
    assert_mismatch(
        &errors(r),
        "#0 all_reduce(float, len 50",
        "#0 all_reduce(float, len 100",
    );
}

#[test]
fn a_rank_that_never_arrives_times_out_with_a_flight_record() {
    let w = world_with_timeout(3, 1);
    let start = Instant::now();
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 10])?;
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            if c.rank() == 2 {
                // Busy elsewhere, longer than the timeout, then gone.
                std::thread::sleep(Duration::from_secs(3));
                return Ok(());
            }
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("run");
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(6), "took {elapsed:?}");
    // Both waiting ranks report the timeout, each with every rank's record:
    // ranks 0 and 1 are in #1, rank 2 never got past #0.
    for (rank, res) in r.into_iter().enumerate().take(2) {
        let e = res.expect_err("ranks 0 and 1 must fail");
        let Error::Timeout { flight, .. } = &e else {
            panic!("rank {rank}: expected Timeout, got {e}");
        };
        let msg = e.to_string();
        let line = |r: usize| {
            flight
                .lines()
                .find(|l| l.contains(&format!("rank {r}:")))
                .unwrap_or_else(|| panic!("no line for rank {r}: {msg}"))
        };
        assert!(
            line(2).contains("[0 all_reduce 40 bytes, completed") && !line(2).contains("[1 "),
            "{msg}"
        );
        for r in 0..2 {
            assert!(
                line(r).contains("[1 all_reduce 40 bytes, in progress")
                    || line(r).contains("[1 all_reduce 40 bytes, failed"),
                "{msg}"
            );
        }
    }
}

#[test]
fn wait_timeout_bounds_a_single_wait() {
    let w = world_with_timeout(2, 30);
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 10])?;
            if c.rank() == 1 {
                std::thread::sleep(Duration::from_millis(1500));
            }
            let start = Instant::now();
            let res = c
                .all_reduce(&x, ReduceOp::Sum)?
                .wait_timeout(Duration::from_millis(300));
            if c.rank() == 0 {
                match res {
                    Err(Error::Timeout { after, .. }) => {
                        assert!(
                            after >= Duration::from_millis(300)
                                && start.elapsed() < Duration::from_secs(1),
                            "{after:?}"
                        );
                    }
                    other => panic!("rank 0: expected Timeout, got {other:?}"),
                }
            }
            Ok(())
        })
        .expect("run");
    for x in r {
        x.expect("rank");
    }
}

/// A failure that travels through ranks reads as one sentence: each rank
/// names the rank that failed first and that rank's own words, once, and
/// says what it was running itself; never "rank 0 ...: peer rank 2
/// failed: rank 1 ...: peer rank 2 failed: ...".
#[test]
fn a_failure_chain_names_the_first_failure_once() {
    let w = world_with_timeout(3, 30);
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 100])?;
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            if c.rank() == 2 {
                return Ok(());
            }
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("run");
    for (rank, res) in r.into_iter().enumerate().take(2) {
        let e = res.expect_err("a peer left");
        let text = e.to_string();
        match &e {
            Error::PeerFailed {
                rank: me,
                peer: 2,
                doing,
                reason,
                flight,
                ..
            } => {
                // The flight record comes with it: rank 2 never issued #1.
                assert!(
                    flight.contains("rank 2: [0 all_reduce 400 bytes, completed"),
                    "{flight}"
                );
                assert!(
                    text.ends_with(flight.as_str()) && text.contains("flight record"),
                    "the message ends with it: {text}"
                );
                assert_eq!(*me, rank, "{text}");
                assert_eq!(doing, "#1 all_reduce(float, len 100, sum)", "{text}");
                assert!(
                    reason.starts_with("rank 2 returned from its closure without issuing #1"),
                    "{text}"
                );
            }
            other => panic!("rank {rank}: expected PeerFailed naming rank 2, got {other}"),
        }
        assert_eq!(text.matches("failed first").count(), 1, "nested: {text}");
        assert_eq!(text.matches("seq").count(), 1, "nested: {text}");
    }
}

#[test]
fn a_rank_that_returns_early_fails_its_peers_within_a_second() {
    let w = world_with_timeout(N, 30);
    let start = Instant::now();
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 1000])?;
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            if c.rank() == 3 {
                return Ok(());
            }
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("run");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "took {:?}",
        start.elapsed()
    );
    for (rank, res) in r.into_iter().enumerate().take(3) {
        match res {
            Err(Error::PeerFailed { peer: 3, .. }) => {}
            Err(Error::PeerFailed { reason, .. }) if reason.contains("rank 3") => {}
            other => panic!("rank {rank}: expected PeerFailed naming rank 3, got {other:?}"),
        }
    }
    // The world still works.
    let again = w
        .run(|c| -> Result<Vec<f32>, Error> {
            let x = c.tensor(&[1.0f32; 4])?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
        })
        .expect("run");
    for v in again {
        assert_eq!(v.expect("rank"), vec![N as f32; 4]);
    }
}

#[test]
fn abort_fails_pending_work_on_every_rank() {
    let w = world_with_timeout(N, 30);
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 1000])?;
            if c.rank() == 0 {
                // Rank 0 issues nothing and aborts; the others are blocked waiting for it.
                std::thread::sleep(Duration::from_millis(300));
                c.abort();
                let later = c.all_reduce(&x, ReduceOp::Sum)?.wait();
                assert!(
                    matches!(later, Err(Error::Aborted { rank: 0, .. })),
                    "{later:?}"
                );
                return Err(Error::Aborted { rank: 0, seq: 0 });
            }
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("run");
    for (rank, e) in errors(r).into_iter().enumerate() {
        assert!(
            matches!(e, Error::Aborted { rank: r, .. } if r == rank),
            "rank {rank}: {e}"
        );
    }
}

#[test]
fn device_loss_becomes_an_error_and_peers_fail_cleanly() {
    // One rank's device lost models one GPU failing: a device per rank.
    let w = World::new(
        WorldConfig::new(3)
            .with_timeout(Duration::from_secs(30))
            .with_placement(Placement::DevicePerRank),
    )
    .expect("world");
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 1000])?;
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            if c.rank() == 1 {
                c.device().destroy();
            }
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("run");
    let errs = errors(r);
    assert!(
        matches!(errs[1], Error::Device { .. }),
        "rank 1: {}",
        errs[1]
    );
    for rank in [0, 2] {
        assert!(
            matches!(errs[rank], Error::PeerFailed { peer: 1, .. }),
            "rank {rank}: {}",
            errs[rank]
        );
    }
}

#[test]
fn losing_a_shared_device_is_a_device_error_on_every_rank_that_shares_it() {
    let w = World::new(
        WorldConfig::new(3)
            .with_timeout(Duration::from_secs(30))
            .with_placement(Placement::SharedDevice),
    )
    .expect("world");
    assert_eq!(w.placement(), Placement::SharedDevice);
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 1000])?;
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            if c.rank() == 1 {
                c.device().destroy();
            }
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("run");
    for (rank, e) in errors(r).into_iter().enumerate() {
        assert!(
            matches!(e, Error::Device { rank: r, .. } if r == Some(rank)),
            "rank {rank}: {e}"
        );
    }
}

/// Nothing polls health on a timer: a failure rings the waits it ends.
/// With a timeout far longer than the test, a peer that only heard of the
/// failure at its deadline would report `Timeout`; every peer must
/// report the failure itself, under both placements (the shared device's
/// meeting, and the hops and staging of devices of their own), whether it
/// is waiting in a collective or a receive.
#[test]
fn a_failure_wakes_every_waiting_peer_instead_of_its_deadline() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = World::new(
            WorldConfig::new(3)
                .with_placement(placement)
                .with_timeout(Duration::from_secs(120)),
        )
        .expect("world");
        let r = w
            .run(|c| -> Result<(), Error> {
                let x = c.tensor(&[1.0f32; 4096])?;
                match c.rank() {
                    // Fails after its peers are waiting on it.
                    2 => {
                        std::thread::sleep(Duration::from_millis(200));
                        Err(Error::InvalidArgument {
                            rank: Some(2),
                            what: "the test fails rank 2".into(),
                        })
                    }
                    1 => c.recv(&x, 2)?.wait().map(|_| ()),
                    _ => c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ()),
                }
            })
            .expect("run");
        for (rank, res) in r.iter().enumerate().take(2) {
            match res {
                Err(Error::PeerFailed { .. }) | Err(Error::Aborted { .. }) => {}
                other => panic!("{placement:?}, rank {rank}: expected the failure, got {other:?}"),
            }
        }
    }
}

/// A send whose receiver returned from its closure without receiving, and
/// a receive whose sender did the same, fail at once naming that rank,
/// under both placements: not at the timeout (20 s here).
#[test]
fn a_send_or_receive_whose_peer_returned_fails_at_once() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = World::new(
            WorldConfig::new(2)
                .with_placement(placement)
                .with_timeout(Duration::from_secs(20)),
        )
        .expect("world");
        for receiver_leaves in [true, false] {
            let start = Instant::now();
            let r = w
                .run(|c| -> Result<(), Error> {
                    let x = c.tensor(&[1.0f32; 16])?;
                    let leaves = if receiver_leaves { 1 } else { 0 };
                    if c.rank() == leaves {
                        return Ok(());
                    }
                    if receiver_leaves {
                        c.send(&x, 1)?.wait().map(drop)
                    } else {
                        c.recv(&x, 0)?.wait().map(drop)
                    }
                })
                .expect("run");
            let stays = if receiver_leaves { 0 } else { 1 };
            let gone = 1 - stays;
            match &r[stays] {
                Err(Error::PeerFailed { peer, reason, .. }) => {
                    assert_eq!(*peer, gone, "{placement}: {reason}");
                    assert!(
                        reason.contains(&format!("rank {gone} returned from its closure")),
                        "{placement}: {reason}"
                    );
                }
                other => panic!("{placement}, rank {stays}: expected PeerFailed, got {other:?}"),
            }
            assert!(r[gone].is_ok(), "{placement}: {:?}", r[gone]);
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "{placement}: took {:?}",
                start.elapsed()
            );
        }
    }
}

/// The flight record an error carries agrees with it: the rank's own
/// failed call shows as failed (not in progress, and never "nothing
/// issued"), and a later call of the same run says the group failed
/// earlier, where, rather than repeat the first failure as its own.
#[test]
fn the_flight_record_agrees_with_the_error_it_ends() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = World::new(WorldConfig::new(2).with_placement(placement)).expect("world");
        let r = w
            .run(|c| -> Result<(Error, Error), Error> {
                let len = if c.rank() == 0 { 1000 } else { 999 };
                let x = c.zeros(DType::F32, len)?;
                let first = c.all_reduce(&x, ReduceOp::Sum)?.wait();
                let later = c.all_reduce(&x, ReduceOp::Sum)?.wait();
                Ok((
                    first.expect_err("a mismatch"),
                    later.expect_err("the group failed"),
                ))
            })
            .expect("run");
        for (rank, got) in r.into_iter().enumerate() {
            let (first, later) = got.expect("errors");
            let Error::Mismatch { seq: 0, flight, .. } = &first else {
                panic!("{placement}, rank {rank}: {first}");
            };
            let mine = flight
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("rank {rank}:")))
                .unwrap_or_else(|| panic!("{flight}"));
            assert!(
                mine.contains("[0 all_reduce") && mine.contains("failed"),
                "{placement}, rank {rank}: {first}"
            );
            assert!(
                !mine.contains("in progress") && !mine.contains("nothing issued"),
                "{first}"
            );
            match &later {
                Error::PeerFailed { seq: 1, reason, .. } => {
                    assert!(reason.starts_with("the group failed at seq 0: "), "{later}")
                }
                other => panic!("{placement}, rank {rank}: {other}"),
            }
        }
    }
}
