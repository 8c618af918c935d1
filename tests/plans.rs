//! Every plan can be forced, runs what it names, and gives the CPU
//! reference's bits; a forced plan that cannot run is refused on every
//! rank with the reason, never replaced by another.

mod common;

use common::*;
use wgpu_collectives::{
    Communicator, DType, Error, Placement, Plan, ReduceOp, Tensor, World, WorldConfig,
};

fn world(n: usize, placement: Placement, plan: Option<Plan>) -> Result<World, Error> {
    World::new(
        WorldConfig::new(n)
            .with_placement(placement)
            .with_plan(plan),
    )
}

/// The plan this rank's newest collective ran with, from its flight record.
fn last_plan(c: &Communicator) -> Option<Plan> {
    c.flight_record().ranks[c.rank()]
        .last()
        .and_then(|e| e.plan)
}

/// Runs `f` on every rank, failing the test on any error.
fn run<T: Send>(
    w: &World,
    what: &str,
    f: impl Fn(&Communicator) -> Result<T, Error> + Sync,
) -> Vec<T> {
    w.run(f)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("{what}, rank {r}: {e}")))
        .collect()
}

/// The collectives that offer `plan`, each run on every rank and checked
/// against the CPU reference; each rank says which plan ran.
fn every_collective_under<T: Num>(w: &World, plan: Plan, len: usize) {
    let n = w.size();
    let tag = format!("{plan} {} len {len} on {n}", T::DTYPE);
    let ran = |c: &Communicator, what: &str| {
        assert_eq!(
            last_plan(c),
            Some(plan),
            "{what} {tag}, rank {}: the flight record names another plan",
            c.rank()
        );
    };
    let reduces = matches!(
        plan,
        Plan::Direct | Plan::DeviceRing | Plan::HostRing | Plan::OneShot
    );
    if reduces {
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            let got = run(w, &format!("all_reduce {tag}"), |c| {
                let x = c.tensor(&inputs::<T>(op, c.rank(), len))?;
                let work = c.all_reduce(&x, op)?;
                // Collectives run in issue order: once the barrier is done,
                // the all_reduce has chosen its plan.
                let _ = c.barrier()?.wait()?;
                assert_eq!(work.plan(), Some(plan), "Work::plan {tag}");
                work.wait()?.to_vec::<T>()
            });
            for (r, g) in got.iter().enumerate() {
                check(
                    &format!("all_reduce {op:?} {tag}, rank {r}"),
                    op,
                    g,
                    &reference::<T>(op, n, len),
                );
            }
        }
    }
    if matches!(plan, Plan::Direct | Plan::DeviceRing) {
        let op = ReduceOp::Sum;
        let got = run(w, &format!("reduce_scatter {tag}"), |c| {
            let x = c.tensor(&inputs::<T>(op, c.rank(), len * n))?;
            let y = c.reduce_scatter(&x, op)?.wait()?.to_vec::<T>()?;
            ran(c, "reduce_scatter");
            Ok(y)
        });
        let full = reference::<T>(op, n, len * n);
        for (r, g) in got.iter().enumerate() {
            check(
                &format!("reduce_scatter {tag}, rank {r}"),
                op,
                g,
                &full[r * len..(r + 1) * len],
            );
        }
        let got = run(w, &format!("all_gather {tag}"), |c| {
            let x = c.tensor(&inputs::<T>(op, c.rank(), len))?;
            let y = c.all_gather(&x)?.wait()?.to_vec::<T>()?;
            ran(c, "all_gather");
            Ok(y)
        });
        let want: Vec<T> = (0..n).flat_map(|r| inputs::<T>(op, r, len)).collect();
        for (r, g) in got.iter().enumerate() {
            check(&format!("all_gather {tag}, rank {r}"), op, g, &want);
        }
        run(w, &format!("barrier {tag}"), |c| {
            let _ = c.barrier()?.wait()?;
            ran(c, "barrier");
            Ok(())
        });
    }
    if matches!(plan, Plan::Direct | Plan::Chain) {
        let root = n - 1;
        let got = run(w, &format!("broadcast {tag}"), |c| {
            let x = c.tensor(&inputs::<T>(ReduceOp::Sum, c.rank(), len))?;
            let y = c.broadcast(&x, root)?.wait()?.to_vec::<T>()?;
            ran(c, "broadcast");
            Ok(y)
        });
        for (r, g) in got.iter().enumerate() {
            let want = inputs::<T>(ReduceOp::Sum, root, len);
            check(
                &format!("broadcast {tag}, rank {r}"),
                ReduceOp::Sum,
                g,
                &want,
            );
        }
        let op = ReduceOp::Sum;
        let got = run(w, &format!("reduce {tag}"), |c| {
            let x = c.tensor(&inputs::<T>(op, c.rank(), len))?;
            let y = c.reduce(&x, op, root)?.wait()?.to_vec::<T>()?;
            ran(c, "reduce");
            Ok(y)
        });
        check(
            &format!("reduce {tag} at the root"),
            op,
            &got[root],
            &reference::<T>(op, n, len),
        );
    }
    if matches!(plan, Plan::Direct | Plan::Pairwise) {
        let got = run(w, &format!("all_to_all {tag}"), |c| {
            let x = c.tensor(&inputs::<T>(ReduceOp::Sum, c.rank(), len * n))?;
            let y = c.all_to_all(&x, None, None)?.wait()?.to_vec::<T>()?;
            ran(c, "all_to_all");
            Ok(y)
        });
        for (r, g) in got.iter().enumerate() {
            let want: Vec<T> = (0..n)
                .flat_map(|s| {
                    inputs::<T>(ReduceOp::Sum, s, len * n)[r * len..(r + 1) * len].to_vec()
                })
                .collect();
            check(
                &format!("all_to_all {tag}, rank {r}"),
                ReduceOp::Sum,
                g,
                &want,
            );
        }
    }
    if matches!(plan, Plan::Direct | Plan::Star) {
        let root = 0;
        let got = run(w, &format!("gather {tag}"), |c| {
            let x = c.tensor(&inputs::<T>(ReduceOp::Sum, c.rank(), len))?;
            let out = c.zeros(T::DTYPE, if c.rank() == root { len * n } else { 0 })?;
            let _ = c.gather_into(&x, &out, root)?.wait()?;
            ran(c, "gather");
            out.to_vec::<T>()
        });
        let want: Vec<T> = (0..n)
            .flat_map(|r| inputs::<T>(ReduceOp::Sum, r, len))
            .collect();
        check(
            &format!("gather {tag} at the root"),
            ReduceOp::Sum,
            &got[root],
            &want,
        );
    }
}

fn plans_on(placement: Placement) -> Vec<Plan> {
    Plan::ALL
        .into_iter()
        .filter(|&p| p != Plan::PointToPoint)
        // Across processes only: tests/mpi.rs runs it under mpirun.
        .filter(|&p| p != Plan::TwoLevel)
        .filter(|&p| p != Plan::Direct || placement == Placement::SharedDevice)
        .collect()
}

#[test]
fn every_plan_forced_gives_the_reference_on_both_placements() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        for plan in plans_on(placement) {
            for n in [2, 3] {
                let w = world(n, placement, Some(plan))
                    .unwrap_or_else(|e| panic!("{plan} on {n} ranks, {placement}: {e}"));
                assert_eq!(w.plan(), Some(plan));
                // The direct kernels bind each rank's chunk where it lies:
                // it must start on the adapter's binding alignment (256
                // bytes at most), so odd lengths are for the other plans.
                let (lens, half_len): (&[usize], usize) = if plan == Plan::Direct {
                    (&[64, 1024], 128)
                } else {
                    (&[1, 7, 1000], 7)
                };
                for &len in lens {
                    every_collective_under::<f32>(&w, plan, len);
                    every_collective_under::<i32>(&w, plan, len);
                }
                every_collective_under::<half::f16>(&w, plan, half_len);
            }
        }
    }
}

/// Every rank refuses the call itself, with `InvalidArgument`: none
/// reports a peer's refusal as its own failure (which one did was a race
/// that the benchmark's `--plan all` lost on a fresh machine), so several
/// runs, on a shared device and on devices of their own.
#[test]
fn forcing_two_levels_in_one_process_is_refused_with_the_reason() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = world(2, placement, Some(Plan::TwoLevel))
            .unwrap_or_else(|e| panic!("a world forcing two-level: {e}"));
        for _ in 0..16 {
            let got = w.run(|c| -> Result<(), Error> {
                let x = c.tensor(&[1i32; 16])?;
                let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
                Ok(())
            });
            let got = got.unwrap_or_else(|e| panic!("the run: {e}"));
            for r in got {
                match r {
                    Err(Error::InvalidArgument { what, .. })
                        if what.contains("two-level") && what.contains("across processes") => {}
                    Err(e) => panic!("{placement:?}: refused, but not as expected: {e}"),
                    Ok(()) => panic!("{placement:?}: two-level ran in one process"),
                }
            }
        }
    }
}

/// After the refusal, a later call of the same run: every rank repeats
/// its own refusal, saying it is a repeat and of which call (not one
/// rank the refusal's words as if new and the others a peer's failure).
#[test]
fn after_a_refused_plan_every_rank_repeats_its_own_refusal() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = world(3, placement, Some(Plan::TwoLevel))
            .unwrap_or_else(|e| panic!("a world forcing two-level: {e}"));
        for _ in 0..8 {
            let got = w
                .run(|c| -> Result<(Error, Error), Error> {
                    let x = c.tensor(&[1i32; 16])?;
                    let first = c.all_reduce(&x, ReduceOp::Sum)?.wait();
                    let later = c.all_gather(&x)?.wait();
                    Ok((first.expect_err("refused"), later.expect_err("a repeat")))
                })
                .unwrap_or_else(|e| panic!("the run: {e}"));
            for (rank, r) in got.into_iter().enumerate() {
                let (first, later) = r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                let Error::InvalidArgument { what: was, .. } = &first else {
                    panic!("{placement:?}, rank {rank}: {first}");
                };
                match &later {
                    Error::InvalidArgument {
                        rank: Some(r),
                        what,
                    } if *r == rank => {
                        assert_eq!(
                            *what,
                            format!("the group failed at seq 0: {was}"),
                            "{placement:?}, rank {rank}"
                        );
                    }
                    other => panic!("{placement:?}, rank {rank}: not a repeat of its own: {other}"),
                }
            }
        }
    }
}

#[test]
fn forcing_direct_between_separate_devices_is_refused_with_the_reason() {
    let e = world(2, Placement::DevicePerRank, Some(Plan::Direct))
        .err()
        .unwrap_or_else(|| panic!("a world forcing direct on separate devices was made"));
    let text = e.to_string();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert!(
        text.contains("direct") && text.contains("share one device"),
        "{text}"
    );
}

#[test]
fn forcing_direct_on_a_shape_its_kernels_cannot_run_fails_every_rank() {
    let n = 2;
    let w = world(n, Placement::SharedDevice, Some(Plan::Direct)).unwrap_or_else(|e| panic!("{e}"));
    // An f16 all_gather of odd length: rank 1's segment starts mid-word.
    let results = w
        .run(|c| {
            let x = c.tensor(&inputs::<half::f16>(ReduceOp::Sum, c.rank(), 7))?;
            c.all_gather(&x)?.wait()
        })
        .unwrap_or_else(|e| panic!("{e}"));
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Err(Error::InvalidArgument { what, .. }) => {
                assert!(
                    what.contains("direct") && what.contains("mid-word"),
                    "rank {r}: {what}"
                )
            }
            other => panic!("rank {r}: {other:?}"),
        }
    }
    // The world goes on: the next call runs.
    let got = run(&w, "all_reduce after the refusal", |c| {
        let x = c.tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), 10))?;
        c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
    });
    for g in got {
        check(
            "after",
            ReduceOp::Sum,
            &g,
            &reference::<f32>(ReduceOp::Sum, n, 10),
        );
    }
}

/// What the planner does with a table: the direct kernel where it is
/// cheapest and the ranks share a device, a ring where they do not (the
/// direct kernel cannot run there). The table is given, so that no
/// measurement decides the test.
#[test]
fn the_planner_runs_direct_on_a_shared_device_and_a_ring_on_separate_ones() {
    let table = "wgpu-collectives tuning 3\nkey given\n\
        all_reduce direct 4096:1e-4 65536:2e-4 1048576:1e-3 16777216:1e-2\n\
        all_reduce device-ring 4096:3e-4 65536:5e-4 1048576:3e-3 16777216:3e-2\n\
        all_reduce one-shot 4096:2e-4 65536:6e-4 1048576:8e-3 16777216:1e-1\n\
        host-fold other-bits\nkernel-units 1\nend\n";
    for (placement, want) in [
        (Placement::SharedDevice, Plan::Direct),
        (Placement::DevicePerRank, Plan::DeviceRing),
    ] {
        let w = World::new(
            WorldConfig::new(3)
                .with_placement(placement)
                .with_plan(None)
                .with_tune_table(table),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.plan(), None);
        let plans = run(&w, "all_reduce of 1 MiB", |c| {
            let x = c.zeros(DType::F32, 1 << 18)?;
            let _: Tensor = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            Ok(last_plan(c))
        });
        for (r, p) in plans.into_iter().enumerate() {
            assert_eq!(p, Some(want), "{placement}, rank {r}");
        }
    }
}

/// The groups `split` makes meet where their parent met (their links
/// carry a meeting place of their own), and not where it did not. Direct
/// is forced where they meet (it runs only on a meeting), so that what the
/// planner measured cannot decide the test.
#[test]
fn a_split_group_meets_on_the_device_its_parent_met_on() {
    for (placement, direct) in [
        (Placement::SharedDevice, true),
        (Placement::DevicePerRank, false),
    ] {
        let plan = direct.then_some(Plan::Direct);
        let w = world(4, placement, plan).unwrap_or_else(|e| panic!("{e}"));
        let got = run(&w, "split, then all_reduce", |c| {
            let sub = c
                .split(Some((c.rank() % 2) as u32), c.rank())?
                .ok_or_else(|| Error::InvalidArgument {
                    rank: Some(c.rank()),
                    what: "every rank has a color".into(),
                })?;
            let x = sub.tensor(&[c.rank() as i32 + 1; 8])?;
            let sum = sub.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<i32>()?;
            Ok((last_plan(&sub), sum))
        });
        for (r, (plan, sum)) in got.into_iter().enumerate() {
            // Ranks r and r+2 (the same parity) sum r+1 and r+3.
            let want = if r % 2 == 0 { 1 + 3 } else { 2 + 4 };
            assert_eq!(sum, vec![want; 8], "{placement}, rank {r}");
            assert_eq!(
                plan == Some(Plan::Direct),
                direct,
                "{placement}, rank {r}: {plan:?}"
            );
        }
    }
}

#[test]
fn a_bad_plan_name_is_refused() {
    assert_eq!(Plan::parse("ring"), None);
    assert_eq!(Plan::parse(" Device_Ring "), Some(Plan::DeviceRing));
}
