//! Ranks that live as long as the user wants: communicators used from the
//! user's own threads before and after runs (a late rank is waited for),
//! and per-rank state moved into a run.

mod common;

use std::cell::RefCell;
use std::sync::mpsc;
use std::time::Duration;

use common::*;
use wgpu_collectives::{Error, ReduceOp, World};

/// Each rank, on a thread of the user's own, all-reduces `rank + 1`; rank
/// 1 starts `late` after the others.
fn on_user_threads(w: &World, late: Duration) -> Vec<Result<Vec<f32>, Error>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..w.size())
            .map(|r| {
                s.spawn(move || {
                    if r == 1 {
                        std::thread::sleep(late);
                    }
                    let c = w.communicator(r).expect("communicator");
                    let x = c.tensor(&[r as f32 + 1.0; 16])?;
                    c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("user thread"))
            .collect()
    })
}

#[test]
fn user_threads_before_and_after_a_run_wait_for_a_late_rank() {
    let w = world(3);
    for r in on_user_threads(&w, Duration::from_millis(300)) {
        assert_eq!(r.expect("before any run"), vec![6.0; 16]);
    }
    for r in w.run(|c| c.rank()).expect("run") {
        assert!(r < 3);
    }
    // Every rank returned from the run's closure; rank 1 is late here, and
    // must be waited for rather than reported gone.
    for r in on_user_threads(&w, Duration::from_millis(300)) {
        assert_eq!(r.expect("after a run"), vec![6.0; 16]);
    }
    // And runs and user threads alternate.
    let sums = w
        .run(|c| -> Result<Vec<f32>, Error> {
            let x = c.tensor(&[1.0f32; 4])?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
        })
        .expect("run");
    for r in sums {
        assert_eq!(r.expect("rank"), vec![3.0; 4]);
    }
    for r in on_user_threads(&w, Duration::from_millis(50)) {
        assert_eq!(r.expect("after a second run"), vec![6.0; 16]);
    }
}

#[test]
fn run_with_moves_per_rank_state_that_is_neither_sync_nor_clone() {
    let w = world(3);
    // A channel end (Send, not Sync) and a RefCell (Send, not Sync) per rank.
    let (tx, rx) = mpsc::channel::<(usize, f32)>();
    let states: Vec<_> = (0..3)
        .map(|r| (tx.clone(), RefCell::new(vec![r as f32 * 10.0; 8])))
        .collect();
    drop(tx);
    let out = w
        .run_with(states, |c, (tx, data)| -> Result<usize, Error> {
            data.borrow_mut().iter_mut().for_each(|v| *v += 1.0);
            let x = c.tensor(&data.borrow())?;
            let y = c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()?;
            tx.send((c.rank(), y[0]))
                .map_err(|e| Error::InvalidArgument {
                    rank: Some(c.rank()),
                    what: e.to_string(),
                })?;
            Ok(c.rank())
        })
        .expect("run_with");
    for (r, got) in out.into_iter().enumerate() {
        assert_eq!(got.expect("rank"), r);
    }
    let mut sent: Vec<(usize, f32)> = rx.iter().collect();
    sent.sort_by_key(|&(r, _)| r);
    // (0 + 1) + (10 + 1) + (20 + 1)
    assert_eq!(sent, vec![(0, 33.0), (1, 33.0), (2, 33.0)]);

    match w.run_with(vec![(); 2], |c, ()| c.rank()) {
        Err(Error::InvalidArgument { what, .. }) => assert!(what.contains("2 states"), "{what}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// The usual wgpu habit (burn and cubecl do it internally): threads of the
/// user's own submitting to a rank's queue and polling its device, with
/// `Wait` and with `Poll`, at full speed, while the ranks run hundreds of
/// collectives. None of it may crash, hang or change a result.
#[test]
fn user_threads_submitting_and_polling_every_device_never_disturb_collectives() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let n = 4;
    let world = common::world(n);
    let stop = AtomicBool::new(false);
    let user_submissions = AtomicU64::new(0);
    let rounds = 200usize;
    let results = std::thread::scope(|s| {
        for r in 0..n {
            let c = world.communicator(r).expect("a rank");
            for waits in [true, false] {
                let (dev, queue) = (c.device().clone(), c.queue().clone());
                let (stop, count) = (&stop, &user_submissions);
                s.spawn(move || {
                    let buffer = |label| {
                        dev.create_buffer(&wgpu::BufferDescriptor {
                            label: Some(label),
                            size: 1 << 16,
                            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                            mapped_at_creation: false,
                        })
                    };
                    let (a, b) = (buffer("user a"), buffer("user b"));
                    while !stop.load(Ordering::Acquire) {
                        let mut enc = dev.create_command_encoder(&Default::default());
                        enc.copy_buffer_to_buffer(&a, 0, &b, 0, 1 << 16);
                        let idx = queue.submit([enc.finish()]);
                        let polled = if waits {
                            dev.poll(wgpu::PollType::Wait {
                                submission_index: Some(idx),
                                timeout: None,
                            })
                        } else {
                            dev.poll(wgpu::PollType::Poll)
                        };
                        polled.expect("the user's poll");
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        }
        let results = world.run(|c| -> Result<usize, wgpu_collectives::Error> {
            let mut checked = 0;
            for round in 0..rounds {
                let len = 1 + (round * 37) % 3000;
                let x: Vec<i32> = (0..len)
                    .map(|i| (c.rank() * 1000 + i + round) as i32)
                    .collect();
                let t = c.tensor(&x)?;
                let y = c.all_reduce(&t, ReduceOp::Sum)?.wait()?.to_vec::<i32>()?;
                for (i, v) in y.iter().enumerate() {
                    let want = (0..4).map(|r| (r * 1000 + i + round) as i32).sum::<i32>();
                    assert_eq!(*v, want, "rank {}, round {round}, element {i}", c.rank());
                }
                checked += 1;
            }
            Ok(checked)
        });
        stop.store(true, Ordering::Release);
        results
    });
    for (rank, r) in results.expect("the run").into_iter().enumerate() {
        assert_eq!(r.expect("the rank's collectives"), rounds, "rank {rank}");
    }
    assert!(user_submissions.load(std::sync::atomic::Ordering::Relaxed) > 0);
}
