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
