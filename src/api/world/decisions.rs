//! The plan of every call is chosen once: each rank's record counts the
//! planner's decisions for each of its calls, on both placements, under
//! every forced plan, by the rules, by a table, and by a table that
//! heals. A call that completed was decided once and ran the plan its
//! `Work` names; the call that failed first was decided once (refused);
//! none that failed after it was decided more than once.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::arithmetic_side_effects,
    reason = "a test: a failed expectation is a failed test, and its sizes are small"
)]

use super::*;
use crate::api::config::Tune;
use crate::runtime::flight::State;
use crate::{ReduceOp, Work};

/// Figures for every all_reduce plan a world in one process runs, and
/// for all_gather: a table the test gives, so that what it decides does
/// not depend on a measurement (healing's exploration still may, which
/// changes what is decided, never how often).
const TABLE: &str = "wgpu-collectives tuning 3\nkey decisions\n\
    all_reduce direct 4096:2e-5~0.02 1048576:4e-4~0.02\n\
    all_reduce one-shot 4096:3e-5~0.02 1048576:9e-4~0.02\n\
    all_reduce device-ring 4096:6e-5~0.02 1048576:6e-4~0.02\n\
    all_reduce host-ring 4096:5e-5~0.02 1048576:5e-4~0.02\n\
    all_gather direct 4096:2e-5~0.02 1048576:4e-4~0.02\n\
    all_gather device-ring 4096:6e-5~0.02 1048576:6e-4~0.02\n\
    host-fold same-bits\nkernel-units 1\nend\n";

/// How the planner decides, besides what is forced.
#[derive(Debug, Clone, Copy)]
enum By {
    Rules,
    Table,
    Healing,
}

const N: usize = 3;

fn config(placement: Placement, by: By, plan: Option<Plan>) -> WorldConfig {
    let mut config = WorldConfig::new(N)
        .with_placement(placement)
        .with_plan(plan)
        .with_timeout(std::time::Duration::from_secs(60));
    match by {
        By::Rules => config = config.with_tune(Tune::Off),
        By::Table => config = config.with_tune_table(TABLE).with_healing(false),
        By::Healing => {
            config = config.with_tune_table(TABLE).with_healing(true);
            config.given_heals = true;
        }
    }
    config
}

/// Every kind of collective, the small and large all_reduce twice, each
/// waited for; each call's `Work` plan, `None` where it failed.
fn calls(c: &Communicator) -> Result<Vec<Option<Plan>>> {
    let r = c.rank();
    let x: Vec<f32> = (0..3000).map(|i| ((i + r) % 7) as f32).collect();
    let big: Vec<f32> = (0..300_000).map(|i| ((i * 3 + r) % 11) as f32).collect();
    let (x, big) = (c.tensor(&x)?, c.tensor(&big)?);
    let mut plans = Vec::new();
    let mut wait = |w: Result<Work>| {
        plans.push(w.and_then(Work::wait_plan));
    };
    for _ in 0..2 {
        wait(c.all_reduce(&x, ReduceOp::Sum));
        wait(c.all_reduce(&big, ReduceOp::Max));
        wait(c.all_gather(&x));
        wait(c.reduce_scatter(&x, ReduceOp::Sum));
        wait(c.broadcast(&x, 1));
        wait(c.barrier());
        wait(c.all_reduce_coalesced(&[x.clone(), big.clone()], ReduceOp::Sum));
    }
    // The plan once the Work completed, as the Work names it.
    Ok(plans.into_iter().map(|p| p.ok().flatten()).collect())
}

/// Runs `calls` on a world made by `config` and checks every rank's record.
fn check(config: WorldConfig, what: &str) {
    let world = match World::new(config) {
        Ok(w) => w,
        // The direct kernels forced between devices of their own: the
        // world refuses, and no call is decided.
        Err(Error::InvalidArgument { what: why, .. }) if what.contains("Some(Direct)") => {
            assert!(why.contains("do not share one device"), "{what}: {why}");
            return;
        }
        Err(e) => panic!("{what}: {e}"),
    };
    // What decides is what the case says: a table where one was given
    // and no plan forced (a forced plan is timed by no table), healing on
    // it where asked.
    let free = !what.contains("forced Some");
    let tabled = !what.contains("Rules") && free;
    assert_eq!(world.tuning.table.is_some(), tabled, "{what}: the table");
    assert_eq!(
        world.tuning.heal.is_some(),
        tabled && what.contains("Healing"),
        "{what}: healing"
    );
    let out = world.run(calls).expect("the run");
    for (r, plans) in out.into_iter().enumerate() {
        let plans = plans.expect("the calls were issued");
        let record = world.health.flight.decisions(r);
        assert_eq!(
            record.len(),
            plans.len(),
            "{what}: rank {r}'s record: {record:?}"
        );
        let mut failed = false;
        for ((fp, state, plan, decisions), told) in record.iter().zip(&plans) {
            match state {
                State::Completed => {
                    assert_eq!(
                        *decisions, 1,
                        "{what}: rank {r}, {fp}: decided {decisions} times"
                    );
                    assert_eq!(
                        plan, told,
                        "{what}: rank {r}, {fp}: the record's plan and the Work's"
                    );
                    assert!(plan.is_some(), "{what}: rank {r}, {fp}: no plan");
                }
                State::Failed if !failed => {
                    // The first failure: a forced plan refused, decided once.
                    assert_eq!(
                        *decisions, 1,
                        "{what}: rank {r}, {fp}: decided {decisions} times"
                    );
                    assert_eq!(*plan, None, "{what}: rank {r}, {fp}: refused with a plan");
                    failed = true;
                }
                State::Failed => {
                    // A repeat of the group's failure reaches no decision;
                    // a forced plan between devices of their own is
                    // decided (refused) before the rank looks for one.
                    assert!(
                        *decisions <= 1,
                        "{what}: rank {r}, {fp}: decided {decisions} times"
                    );
                }
                other => panic!("{what}: rank {r}, {fp}: left {other:?}"),
            }
        }
    }
}

fn every_case(placement: Placement) {
    let forced = std::iter::once(None).chain(Plan::ALL.map(Some));
    for plan in forced {
        for by in [By::Rules, By::Table, By::Healing] {
            let what = format!("{placement:?}, {by:?}, forced {plan:?}");
            check(config(placement, by, plan), &what);
        }
    }
}

#[test]
fn every_call_is_decided_once_on_a_shared_device() {
    every_case(Placement::SharedDevice);
}

#[test]
fn every_call_is_decided_once_on_devices_of_their_own() {
    every_case(Placement::DevicePerRank);
}
