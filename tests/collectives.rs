//! The collective set against CPU references: all_gather, reduce_scatter,
//! broadcast, reduce, all_to_all, barrier, the coalesced calls and split,
//! for every dtype (and op where there is one), several world sizes and
//! awkward lengths (0, 1, odd: 16-bit elements then start mid-word).

mod common;

use std::time::{Duration, Instant};

use common::*;
use wgpu_collectives::{Communicator, Error, ReduceOp, Tensor, World};

const LENS: [usize; 4] = [0, 1, 7, 1001];

fn ok<T>(what: &str, results: Vec<Result<T, Error>>) -> Vec<T> {
    results
        .into_iter()
        .enumerate()
        .map(|(rank, r)| r.unwrap_or_else(|e| panic!("{what}, rank {rank}: {e}")))
        .collect()
}

fn run<T: Send>(
    w: &World,
    what: &str,
    f: impl Fn(&Communicator) -> Result<T, Error> + Sync,
) -> Vec<T> {
    ok(what, w.run(f).unwrap_or_else(|e| panic!("{what}: {e}")))
}

fn gather_and_broadcast<T: Num>(w: &World) {
    let n = w.size();
    for len in LENS {
        let what = format!("all_gather {} len {len} on {n}", T::DTYPE);
        let got = run(w, &what, |c| {
            let x = c.tensor(&inputs::<T>(ReduceOp::Sum, c.rank(), len))?;
            c.all_gather(&x)?.wait()?.to_vec::<T>()
        });
        let want: Vec<T> = (0..n)
            .flat_map(|r| inputs::<T>(ReduceOp::Sum, r, len))
            .collect();
        for (rank, g) in got.iter().enumerate() {
            check(&format!("{what}, rank {rank}"), ReduceOp::Sum, g, &want);
        }

        for root in 0..n {
            let what = format!("broadcast {} len {len} from {root} on {n}", T::DTYPE);
            let got = run(w, &what, |c| {
                let x = c.tensor(&inputs::<T>(ReduceOp::Max, c.rank(), len))?;
                let y = c.broadcast(&x, root)?.wait()?.to_vec::<T>()?;
                Ok((y, x.to_vec::<T>()?))
            });
            let want = inputs::<T>(ReduceOp::Max, root, len);
            for (rank, (g, x)) in got.iter().enumerate() {
                check(&format!("{what}, rank {rank}"), ReduceOp::Sum, g, &want);
                check(
                    &format!("{what}, rank {rank}, input unchanged"),
                    ReduceOp::Sum,
                    x,
                    &inputs::<T>(ReduceOp::Max, rank, len),
                );
            }
        }
    }
}

fn scatter_and_reduce<T: Num>(w: &World) {
    let n = w.size();
    for op in ops_for(T::DTYPE) {
        for m in LENS {
            let len = m * n;
            let what = format!("reduce_scatter {} {op} {m} per rank on {n}", T::DTYPE);
            let got = run(w, &what, |c| {
                let x = c.tensor(&inputs::<T>(op, c.rank(), len))?;
                c.reduce_scatter(&x, op)?.wait()?.to_vec::<T>()
            });
            let full = reference::<T>(op, n, len);
            for (rank, g) in got.iter().enumerate() {
                check(
                    &format!("{what}, rank {rank}"),
                    op,
                    g,
                    &full[rank * m..(rank + 1) * m],
                );
            }

            let root = m % n;
            let what = format!("reduce {} {op} len {m} to {root} on {n}", T::DTYPE);
            let got = run(w, &what, |c| {
                let x = c.tensor(&inputs::<T>(op, c.rank(), m))?;
                c.reduce(&x, op, root)?.wait()?.to_vec::<T>()
            });
            check(
                &format!("{what}, root"),
                op,
                &got[root],
                &reference::<T>(op, n, m),
            );
        }
    }
}

fn every_dtype(n: usize) {
    let w = world(n);
    gather_and_broadcast::<f32>(&w);
    gather_and_broadcast::<half::f16>(&w);
    gather_and_broadcast::<half::bf16>(&w);
    gather_and_broadcast::<i32>(&w);
    gather_and_broadcast::<u32>(&w);
    scatter_and_reduce::<f32>(&w);
    scatter_and_reduce::<half::f16>(&w);
    scatter_and_reduce::<half::bf16>(&w);
    scatter_and_reduce::<i32>(&w);
    scatter_and_reduce::<u32>(&w);
}

#[test]
fn gather_scatter_broadcast_reduce_on_1_rank() {
    every_dtype(1);
}

#[test]
fn gather_scatter_broadcast_reduce_on_3_ranks() {
    every_dtype(3);
}

#[test]
fn gather_scatter_broadcast_reduce_on_4_ranks() {
    every_dtype(4);
}

/// Big enough for several slices per step.
#[test]
fn large_gather_scatter_broadcast_reduce() {
    let w = world(3);
    let m = 700_001;
    let got = run(&w, "large", |c| {
        let x = c.tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), 3 * m))?;
        let rs = c.reduce_scatter(&x, ReduceOp::Sum)?;
        let ag = c.all_gather(&x)?;
        let bc = c.broadcast(&x, 1)?;
        let rd = c.reduce(&x, ReduceOp::Sum, 2)?;
        Ok((
            rs.wait()?.to_vec::<f32>()?,
            ag.wait()?.to_vec::<f32>()?,
            bc.wait()?.to_vec::<f32>()?,
            rd.wait()?.to_vec::<f32>()?,
        ))
    });
    let full = reference::<f32>(ReduceOp::Sum, 3, 3 * m);
    let gathered: Vec<f32> = (0..3)
        .flat_map(|r| inputs::<f32>(ReduceOp::Sum, r, 3 * m))
        .collect();
    for (rank, (rs, ag, bc, _)) in got.iter().enumerate() {
        check(
            &format!("reduce_scatter rank {rank}"),
            ReduceOp::Sum,
            rs,
            &full[rank * m..(rank + 1) * m],
        );
        check(
            &format!("all_gather rank {rank}"),
            ReduceOp::Sum,
            ag,
            &gathered,
        );
        check(
            &format!("broadcast rank {rank}"),
            ReduceOp::Sum,
            bc,
            &inputs::<f32>(ReduceOp::Sum, 1, 3 * m),
        );
    }
    check("reduce at root 2", ReduceOp::Sum, &got[2].3, &full);
}

/// Rank r sends (r + 2j) % 3 elements to rank j: uneven, with zeros.
fn counts(r: usize, j: usize) -> usize {
    (r + 2 * j) % 3
}

fn all_to_all_uneven<T: Num>(w: &World) {
    let n = w.size();
    let what = format!("all_to_all {} uneven on {n}", T::DTYPE);
    let got = run(w, &what, |c| {
        let r = c.rank();
        let send: Vec<usize> = (0..n).map(|j| counts(r, j)).collect();
        let recv: Vec<usize> = (0..n).map(|j| counts(j, r)).collect();
        let x = c.tensor(&inputs::<T>(ReduceOp::Sum, r, send.iter().sum()))?;
        c.all_to_all(&x, Some(&send), Some(&recv))?
            .wait()?
            .to_vec::<T>()
    });
    for (r, g) in got.iter().enumerate() {
        let mut want = Vec::new();
        for j in 0..n {
            let off: usize = (0..r).map(|k| counts(j, k)).sum();
            want.extend_from_slice(
                &inputs::<T>(ReduceOp::Sum, j, (0..n).map(|k| counts(j, k)).sum())
                    [off..off + counts(j, r)],
            );
        }
        check(&format!("{what}, rank {r}"), ReduceOp::Sum, g, &want);
    }

    for len in [0, 4, 4 * 1001] {
        let what = format!("all_to_all {} even len {len} on {n}", T::DTYPE);
        let got = run(w, &what, |c| {
            let x = c.tensor(&inputs::<T>(ReduceOp::Min, c.rank(), len))?;
            c.all_to_all(&x, None, None)?.wait()?.to_vec::<T>()
        });
        let m = len / n;
        for (r, g) in got.iter().enumerate() {
            let want: Vec<T> = (0..n)
                .flat_map(|j| inputs::<T>(ReduceOp::Min, j, len)[r * m..(r + 1) * m].to_vec())
                .collect();
            check(&format!("{what}, rank {r}"), ReduceOp::Sum, g, &want);
        }
    }
}

#[test]
fn all_to_all_every_dtype_even_and_uneven() {
    let w = world(4);
    all_to_all_uneven::<f32>(&w);
    all_to_all_uneven::<half::f16>(&w);
    all_to_all_uneven::<half::bf16>(&w);
    all_to_all_uneven::<i32>(&w);
    all_to_all_uneven::<u32>(&w);
}

#[test]
fn all_to_all_counts_that_disagree_fail_every_rank() {
    let w = world(3);
    let r = w
        .run(|c| {
            // Rank 0 expects 2 elements from rank 1, which sends it 1.
            let send = [1usize, 1, 1];
            let recv = if c.rank() == 0 {
                [1usize, 2, 1]
            } else {
                [1, 1, 1]
            };
            let x = c.tensor(&[1.0f32; 3])?;
            c.all_to_all(&x, Some(&send), Some(&recv))?
                .wait()
                .map(|t| t.len())
        })
        .expect("run");
    for (rank, res) in r.into_iter().enumerate() {
        match res {
            // Each rank as it sees it: rank 1 is the sender.
            Err(Error::Mismatch { ours, theirs, .. }) => {
                let both = format!("{ours} / {theirs}");
                assert!(
                    both.contains("expecting 2 elements from rank 1") && both.contains("sending 1"),
                    "rank {rank}: {both}"
                );
            }
            other => panic!("rank {rank}: expected Mismatch, got {other:?}"),
        }
    }
}

#[test]
fn barrier_waits_for_the_last_rank() {
    let w = world(4);
    let start = Instant::now();
    let got = run(&w, "barrier", |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let arrived = start.elapsed();
        let _ = c.barrier()?.wait()?;
        Ok((arrived, start.elapsed()))
    });
    let last_arrival = got.iter().map(|g| g.0).max().expect("ranks");
    for (rank, (_, left)) in got.iter().enumerate() {
        assert!(
            *left >= last_arrival,
            "rank {rank} left the barrier at {left:?}, before rank 2 arrived at {last_arrival:?}"
        );
    }
}

fn coalesced<T: Num>(w: &World) {
    let n = w.size();
    let lens = [3 * n, 0, n, 1001 * n];
    for op in ops_for(T::DTYPE) {
        let what = format!("coalesced {} {op} on {n}", T::DTYPE);
        let got = run(w, &what, |c| {
            let xs: Vec<Tensor> = lens
                .iter()
                .map(|&l| c.tensor(&inputs::<T>(op, c.rank() + l, l)))
                .collect::<Result<_, _>>()?;
            let ar = c.all_reduce_coalesced(&xs, op)?;
            let rs = c.reduce_scatter_coalesced(&xs, op)?;
            let ag = c.all_gather_coalesced(&xs)?;
            let read = |ts: Vec<Tensor>| {
                ts.iter()
                    .map(|t| t.to_vec::<T>())
                    .collect::<Result<Vec<_>, _>>()
            };
            Ok((
                read(ar.wait_all()?)?,
                read(rs.wait_all()?)?,
                read(ag.wait_all()?)?,
            ))
        });
        for (rank, (ar, rs, ag)) in got.iter().enumerate() {
            for (i, &l) in lens.iter().enumerate() {
                // Tensor i of rank r holds inputs(op, r + l, l): fold those.
                let want: Vec<T> = (0..l)
                    .map(|k| {
                        (1..n).fold(T::input(op, l, k), |a, r| {
                            T::combine(op, a, T::input(op, r + l, k))
                        })
                    })
                    .map(|v| {
                        if op == ReduceOp::Avg {
                            T::divide(v, n)
                        } else {
                            v
                        }
                    })
                    .collect();
                check(
                    &format!("{what}: all_reduce #{i}, rank {rank}"),
                    op,
                    &ar[i],
                    &want,
                );
                let m = l / n;
                check(
                    &format!("{what}: reduce_scatter #{i}, rank {rank}"),
                    op,
                    &rs[i],
                    &want[rank * m..(rank + 1) * m],
                );
                let gathered: Vec<T> = (0..n).flat_map(|r| inputs::<T>(op, r + l, l)).collect();
                check(
                    &format!("{what}: all_gather #{i}, rank {rank}"),
                    ReduceOp::Sum,
                    &ag[i],
                    &gathered,
                );
            }
        }
    }
}

#[test]
fn coalesced_calls_every_dtype() {
    let w = world(3);
    coalesced::<f32>(&w);
    coalesced::<half::f16>(&w);
    coalesced::<half::bf16>(&w);
    coalesced::<i32>(&w);
    coalesced::<u32>(&w);
}

/// Coalesced calls over no tensors give no tensors (as torch's coalescing
/// manager over nothing), and the group goes on: a call after them is
/// exact.
#[test]
fn coalesced_calls_over_no_tensors_give_nothing() {
    let w = world(3);
    let got = run(&w, "empty coalesced", |c| {
        let ar = c.all_reduce_coalesced(&[], ReduceOp::Sum)?.wait_all()?;
        let ag = c.all_gather_coalesced(&[])?.wait_all()?;
        let rs = c.reduce_scatter_coalesced(&[], ReduceOp::Sum)?.wait_all()?;
        let x = c.tensor(&[c.rank() as u32 + 1; 5])?;
        let sum = c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<u32>()?;
        Ok((ar.len(), ag.len(), rs.len(), sum))
    });
    for (rank, g) in got.into_iter().enumerate() {
        assert_eq!(g, (0, 0, 0, vec![6; 5]), "rank {rank}");
    }
}

#[test]
fn coalesced_tensors_must_share_a_dtype() {
    let w = world(2);
    let c = w.communicator(0).expect("rank 0");
    let a = c.tensor(&[1.0f32; 4]).expect("a");
    let b = c.tensor(&[1i32; 4]).expect("b");
    match c.all_reduce_coalesced(&[a, b], ReduceOp::Sum) {
        Err(Error::InvalidArgument { what, .. }) => {
            assert!(what.contains("float") && what.contains("int32"), "{what}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

/// The checks torch.distributed's functional-collective tests make on 4
/// ranks, over a 2x2 split and the world.
#[test]
fn split_into_pairs_like_torch_functional_collectives() {
    let w = world(4);
    let got = run(&w, "split", |c| {
        let pair = c
            .split(Some((c.rank() / 2) as u32), c.rank())?
            .expect("every rank has a color");
        let ones = c.tensor(&[1.0f32; 5])?;
        let in_pair = pair
            .all_reduce(&pair.tensor(&[1.0f32; 5])?, ReduceOp::Sum)?
            .wait()?
            .to_vec::<f32>()?;
        let in_world = c
            .all_reduce(&ones, ReduceOp::Sum)?
            .wait()?
            .to_vec::<f32>()?;
        let bcast = pair
            .broadcast(&pair.tensor(&[c.rank() as f32; 3])?, 0)?
            .wait()?
            .to_vec::<f32>()?;
        let gathered = pair
            .all_gather(&pair.tensor(&[c.rank() as i32; 2])?)?
            .wait()?
            .to_vec::<i32>()?;
        let scattered = pair
            .reduce_scatter(
                &pair.tensor(&[c.rank() as i32, 10 * c.rank() as i32])?,
                ReduceOp::Sum,
            )?
            .wait()?
            .to_vec::<i32>()?;
        Ok((
            pair.rank(),
            pair.size(),
            in_pair,
            in_world,
            bcast,
            gathered,
            scattered,
        ))
    });
    for (r, (pr, ps, in_pair, in_world, bcast, gathered, scattered)) in got.into_iter().enumerate()
    {
        assert_eq!((pr, ps), (r % 2, 2), "rank {r}'s place in its pair");
        assert_eq!(in_pair, vec![2.0; 5], "rank {r}: sum over the pair");
        assert_eq!(in_world, vec![4.0; 5], "rank {r}: sum over the world");
        let first = (r / 2 * 2) as f32;
        assert_eq!(
            bcast,
            vec![first; 3],
            "rank {r}: broadcast from the pair's rank 0"
        );
        let (a, b) = ((r / 2 * 2) as i32, (r / 2 * 2 + 1) as i32);
        assert_eq!(
            gathered,
            vec![a, a, b, b],
            "rank {r}: all_gather in the pair"
        );
        let want = if r % 2 == 0 { a + b } else { 10 * (a + b) };
        assert_eq!(
            scattered,
            vec![want],
            "rank {r}: reduce_scatter in the pair"
        );
    }
}

/// Rows and columns of a 2x2 grid all-reduce at the same time.
#[test]
fn a_grid_of_split_communicators_runs_rows_and_columns_concurrently() {
    let w = world(4);
    let got = run(&w, "grid", |c| {
        let r = c.rank();
        let row = c.split(Some((r / 2) as u32), r)?.expect("row");
        let col = c.split(Some((r % 2) as u32), r)?.expect("column");
        let x = (r + 1) as u32;
        let row_work = row.all_reduce(&row.tensor(&vec![x; 100_003])?, ReduceOp::Sum)?;
        let col_work = col.all_reduce(&col.tensor(&vec![10 * x; 100_003])?, ReduceOp::Sum)?;
        Ok((
            col_work.wait()?.to_vec::<u32>()?,
            row_work.wait()?.to_vec::<u32>()?,
        ))
    });
    for (r, (col, row)) in got.into_iter().enumerate() {
        let row_sum = if r < 2 { 1 + 2 } else { 3 + 4 };
        let col_sum = 10 * if r % 2 == 0 { 1 + 3 } else { 2 + 4 };
        assert!(row.iter().all(|&v| v == row_sum), "rank {r}: row sum");
        assert!(col.iter().all(|&v| v == col_sum), "rank {r}: column sum");
    }
}

/// Three communicators per device (world, row, column) with collectives
/// in flight on all of them while the rank thread waits and polls: every
/// device is polled by four threads at once, round after round. wgpu-core
/// 30.0.2 panics on concurrent polls of one device; the engine must take
/// turns, and this is the test that caught it (once in a CI run).
#[test]
fn three_communicators_per_device_poll_concurrently_for_many_rounds() {
    let w = world(4);
    let rounds = 150;
    let got = run(&w, "three communicators", |c| {
        let r = c.rank();
        let row = c.split(Some((r / 2) as u32), r)?.expect("row");
        let col = c.split(Some((r % 2) as u32), r)?.expect("column");
        let mut sums = Vec::new();
        for i in 0..rounds {
            let len = 1 + 997 * (i % 7);
            let x = (r + i) as u32;
            let a = row.all_reduce(&row.tensor(&vec![x; len])?, ReduceOp::Sum)?;
            let b = col.all_reduce(&col.tensor(&vec![x; len])?, ReduceOp::Max)?;
            let g = c.all_reduce(&c.tensor(&vec![x; len])?, ReduceOp::Sum)?;
            while !(a.is_completed() && b.is_completed() && g.is_completed()) {
                std::thread::yield_now();
            }
            let (a, b, g) = (a.wait()?, b.wait()?, g.wait()?);
            sums.push((
                a.to_vec::<u32>()?[len - 1],
                b.to_vec::<u32>()?[len - 1],
                g.to_vec::<u32>()?[0],
            ));
        }
        Ok(sums)
    });
    for (r, sums) in got.into_iter().enumerate() {
        let (row, col) = ([r / 2 * 2, r / 2 * 2 + 1], [r % 2, r % 2 + 2]);
        for (i, (a, b, g)) in sums.into_iter().enumerate() {
            let want_row = row.iter().map(|&p| (p + i) as u32).sum::<u32>();
            let want_col = col.iter().map(|&p| (p + i) as u32).max().unwrap_or(0);
            let want_all = (0..4).map(|p| (p + i) as u32).sum::<u32>();
            assert_eq!(
                (a, b, g),
                (want_row, want_col, want_all),
                "rank {r} round {i}"
            );
        }
    }
}

#[test]
fn split_into_singletons_and_no_color() {
    let w = world(3);
    let got = run(&w, "split", |c| {
        let color = if c.rank() == 1 {
            None
        } else {
            Some(c.rank() as u32)
        };
        match c.split(color, 0)? {
            None => Ok(None),
            Some(alone) => {
                let x = alone.tensor(&[c.rank() as f32 + 0.5; 9])?;
                let y = alone
                    .all_reduce(&x, ReduceOp::Sum)?
                    .wait()?
                    .to_vec::<f32>()?;
                Ok(Some((alone.size(), y)))
            }
        }
    });
    assert!(
        got[1].is_none(),
        "a rank without a color gets no communicator"
    );
    for r in [0, 2] {
        assert_eq!(got[r], Some((1, vec![r as f32 + 0.5; 9])), "rank {r} alone");
    }
}

#[test]
fn bad_arguments_are_errors() {
    let w = world(3);
    let c = w.communicator(0).expect("rank 0");
    let x = c.tensor(&[1.0f32; 10]).expect("x");
    let e = c
        .reduce_scatter(&x, ReduceOp::Sum)
        .expect_err("10 is not divisible by 3");
    assert!(
        e.to_string().contains("10 elements") && e.to_string().contains("3 ranks"),
        "{e}"
    );
    let e = c.broadcast(&x, 3).expect_err("root 3 of 3");
    assert!(e.to_string().contains("root 3"), "{e}");
    let e = c
        .all_to_all(&x, Some(&[5, 5]), None)
        .expect_err("two counts for three ranks");
    assert!(e.to_string().contains("2 entries"), "{e}");
    let e = c
        .all_to_all(&x, Some(&[5, 5, 5]), Some(&[1, 1, 1]))
        .expect_err("counts sum to 15");
    assert!(e.to_string().contains("sum to 15"), "{e}");
    let e = c
        .all_to_all(&x, None, None)
        .expect_err("10 is not divisible by 3");
    assert!(e.to_string().contains("10 elements"), "{e}");
    assert_eq!(
        x.to_vec::<f32>().expect("read"),
        vec![1.0; 10],
        "input untouched"
    );
}
