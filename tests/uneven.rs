//! The uneven collectives, all_gather_v and reduce_scatter_v, against CPU
//! references: 1 to 5 ranks, both placements, every dtype, counts of 0, 1
//! and odd lengths; counts that cannot hold refused on every rank.

mod common;

use common::*;
use wgpu_collectives::{Communicator, DType, Error, Placement, Plan, ReduceOp, World, WorldConfig};

fn world(n: usize, placement: Placement, plan: Option<Plan>) -> World {
    World::new(
        WorldConfig::new(n)
            .with_placement(placement)
            .with_plan(plan),
    )
    .unwrap_or_else(|e| panic!("{n} ranks, {placement}: {e}"))
}

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

/// Count patterns for `n` ranks: growing by rank from 0 (0, 1, 2, ...),
/// odd (1, 3, 5, ...), all empty, and long ones of different lengths.
fn patterns(n: usize) -> Vec<Vec<usize>> {
    vec![
        (0..n).collect(),
        (0..n).map(|r| 2 * r + 1).collect(),
        vec![0; n],
        (0..n).map(|r| 1000 + 37 * r).collect(),
    ]
}

fn all_gather_v<T: Num>(w: &World, counts: &[usize], tag: &str) {
    let n = w.size();
    let what = format!("all_gather_v {} {counts:?} on {n}, {tag}", T::DTYPE);
    let got = run(w, &what, |c| {
        let x = c.tensor(&inputs::<T>(ReduceOp::Sum, c.rank(), counts[c.rank()]))?;
        c.all_gather_v(&x, counts)?.wait()?.to_vec::<T>()
    });
    let want: Vec<T> = (0..n)
        .flat_map(|r| inputs::<T>(ReduceOp::Sum, r, counts[r]))
        .collect();
    for (r, g) in got.iter().enumerate() {
        check(&format!("{what}, rank {r}"), ReduceOp::Sum, g, &want);
    }
}

fn reduce_scatter_v<T: Num>(w: &World, counts: &[usize], op: ReduceOp, tag: &str) {
    let n = w.size();
    let total: usize = counts.iter().sum();
    let what = format!(
        "reduce_scatter_v {} {op:?} {counts:?} on {n}, {tag}",
        T::DTYPE
    );
    let got = run(w, &what, |c| {
        let x = c.tensor(&inputs::<T>(op, c.rank(), total))?;
        c.reduce_scatter_v(&x, counts, op)?.wait()?.to_vec::<T>()
    });
    let full = reference::<T>(op, n, total);
    let mut at = 0;
    for (r, g) in got.iter().enumerate() {
        check(
            &format!("{what}, rank {r}"),
            op,
            g,
            &full[at..at + counts[r]],
        );
        at += counts[r];
    }
}

fn every_dtype(w: &World, counts: &[usize], tag: &str) {
    all_gather_v::<f32>(w, counts, tag);
    all_gather_v::<half::f16>(w, counts, tag);
    all_gather_v::<half::bf16>(w, counts, tag);
    all_gather_v::<i32>(w, counts, tag);
    all_gather_v::<u32>(w, counts, tag);
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
        reduce_scatter_v::<f32>(w, counts, op, tag);
        reduce_scatter_v::<half::f16>(w, counts, op, tag);
        reduce_scatter_v::<half::bf16>(w, counts, op, tag);
        reduce_scatter_v::<i32>(w, counts, op, tag);
    }
    reduce_scatter_v::<u32>(w, counts, ReduceOp::BitXor, tag);
}

#[test]
fn every_dtype_and_count_pattern_on_1_to_5_ranks_under_both_placements() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        for n in 1..=5 {
            let w = world(n, placement, None);
            for counts in patterns(n) {
                every_dtype(&w, &counts, &placement.to_string());
            }
        }
    }
}

#[test]
fn every_plan_they_offer_gives_the_reference() {
    // Counts the direct kernels can bind where they lie (chunks on 256
    // bytes), under Direct and the device ring on a shared device; odd
    // counts under the device ring.
    let n = 3;
    let aligned: Vec<usize> = (0..n).map(|r| 128 * (r + 1)).collect();
    for (plan, counts) in [
        (Plan::Direct, aligned.clone()),
        (Plan::DeviceRing, aligned),
        (Plan::DeviceRing, vec![3, 0, 5]),
    ] {
        let w = world(n, Placement::SharedDevice, Some(plan));
        let tag = format!("forced {plan}");
        every_dtype(&w, &counts, &tag);
        let plans = run(&w, "the plan that ran", |c| {
            let x = c.tensor(&vec![1.0f32; counts[c.rank()]])?;
            let _ = c.all_gather_v(&x, &counts)?.wait()?;
            Ok(c.flight_record().ranks[c.rank()]
                .last()
                .and_then(|e| e.plan))
        });
        assert!(plans.iter().all(|p| *p == Some(plan)), "{tag}: {plans:?}");
    }
}

#[test]
fn forcing_direct_on_chunks_its_kernels_cannot_bind_is_refused() {
    let w = world(2, Placement::SharedDevice, Some(Plan::Direct));
    let results = w
        .run(|c| {
            let x = c.tensor(&[1.0f32; 5])?;
            c.reduce_scatter_v(&x, &[1, 4], ReduceOp::Sum)?.wait()
        })
        .unwrap_or_else(|e| panic!("{e}"));
    for (r, res) in results.into_iter().enumerate() {
        assert!(
            matches!(&res, Err(Error::InvalidArgument { what, .. }) if what.contains("direct")),
            "rank {r}: {res:?}"
        );
    }
}

#[test]
fn equal_counts_give_reduce_scatters_bits() {
    // Inputs whose sum depends on the order it is folded in: the uneven
    // call must fold each chunk in the even one's order.
    let n = 4;
    let chunk = 300;
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = world(n, placement, None);
        let got = run(&w, "even and uneven", |c| {
            let v: Vec<f32> = (0..n * chunk)
                .map(|i| f32::from_bits(bits(c.rank(), i, 7) & 0x3fff_ffff) * 1.0e-3)
                .collect();
            let x = c.tensor(&v)?;
            let even = c
                .reduce_scatter(&x, ReduceOp::Sum)?
                .wait()?
                .to_vec::<f32>()?;
            let uneven = c
                .reduce_scatter_v(&x, &[chunk; 4], ReduceOp::Sum)?
                .wait()?
                .to_vec::<f32>()?;
            Ok((even, uneven))
        });
        for (r, (even, uneven)) in got.iter().enumerate() {
            let same = even
                .iter()
                .zip(uneven)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{placement}, rank {r}: the uneven call's bits differ");
        }
    }
}

#[test]
fn into_forms_and_groups_write_the_callers_outputs() {
    let w = world(3, Placement::DevicePerRank, None);
    let counts = [2usize, 0, 3];
    let got = run(&w, "into, in a group", |c| {
        let x = c.tensor(&vec![c.rank() as i32 + 1; counts[c.rank()]])?;
        let gathered = c.zeros(DType::I32, 5)?;
        let y = c.tensor(&[1, 2, 3, 4, 5])?;
        let mine = c.zeros(DType::I32, counts[c.rank()])?;
        let _ = c
            .group(|g| {
                g.all_gather_v_into(&x, &gathered, &counts)?;
                g.reduce_scatter_v_into(&y, &mine, &counts, ReduceOp::Sum)
            })?
            .wait()?;
        Ok((gathered.to_vec::<i32>()?, mine.to_vec::<i32>()?))
    });
    let sums = [3, 6, 9, 12, 15];
    for (r, (gathered, mine)) in got.iter().enumerate() {
        assert_eq!(gathered, &vec![1, 1, 3, 3, 3], "rank {r}");
        let at: usize = counts[..r].iter().sum();
        assert_eq!(mine, &sums[at..at + counts[r]].to_vec(), "rank {r}");
    }
}

/// Runs `f` on every rank of a 3-rank world under `placement` and checks
/// that every rank fails with an error `ok` accepts.
fn refused(
    placement: Placement,
    what: &str,
    f: impl Fn(&Communicator) -> Result<wgpu_collectives::Tensor, Error> + Sync,
    ok: impl Fn(&Error) -> bool,
) {
    let w = world(3, placement, None);
    let results = w.run(f).unwrap_or_else(|e| panic!("{what}: {e}"));
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Err(e) if ok(&e) => {}
            other => panic!("{what}, {placement}, rank {r}: {other:?}"),
        }
    }
}

#[test]
fn counts_that_cannot_hold_are_refused_on_every_rank() {
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument { .. });
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        refused(
            placement,
            "two counts for three ranks",
            |c| c.all_gather_v(&c.tensor(&[1.0f32])?, &[1, 1])?.wait(),
            invalid,
        );
        refused(
            placement,
            "each rank's length is not its count",
            |c| c.all_gather_v(&c.tensor(&[1.0f32; 2])?, &[1, 1, 1])?.wait(),
            invalid,
        );
        refused(
            placement,
            "counts that do not add up to the length",
            |c| {
                c.reduce_scatter_v(&c.tensor(&[1.0f32; 4])?, &[1, 1, 1], ReduceOp::Sum)?
                    .wait()
            },
            invalid,
        );
        refused(
            placement,
            "counts that overflow",
            |c| {
                c.reduce_scatter_v(&c.tensor(&[1u32; 2])?, &[usize::MAX, 1, 0], ReduceOp::Sum)?
                    .wait()
            },
            invalid,
        );
        // Only the comparison of the ranks' calls can see this.
        refused(
            placement,
            "counts that differ between ranks",
            |c| {
                let counts = if c.rank() == 2 { [2, 1, 1] } else { [1, 2, 1] };
                let x = c.tensor(&[1i32; 4])?;
                c.reduce_scatter_v(&x, &counts, ReduceOp::Sum)?.wait()
            },
            |e| matches!(e, Error::Mismatch { .. }),
        );
    }
}
