//! Timing the plans on a world's own devices: a world per plan, with the
//! plan forced, runs the calls that `runtime/estimate.rs`'s schedule asks
//! for.

use std::sync::Arc;
use std::time::Instant;

use crate::api::tune::load;
use crate::api::world::{World, WorldConfig};
use crate::device::RankDevice;
use crate::device::tensor::DType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::collectives::Collective;
use crate::runtime::collectives::all_gather::AllGather;
use crate::runtime::collectives::all_reduce::AllReduce;
use crate::runtime::collectives::broadcast::Broadcast;
use crate::runtime::collectives::reduce_scatter::ReduceScatter;
use crate::runtime::estimate::{self, Ask, Series};
use crate::runtime::fingerprint::Kind;
use crate::runtime::fold_order::FoldOrder;
use crate::runtime::plan::Plan;
use crate::runtime::planner::Tuning;
use crate::runtime::shared;
use crate::transport::MakePlace;
use crate::transport::local::mesh;

/// The collectives timed.
pub(crate) const KINDS: [Kind; 4] = [
    Kind::AllReduce,
    Kind::ReduceScatter,
    Kind::AllGather,
    Kind::Broadcast,
];

/// The plans `kind` offers, as its unit says.
fn offers(kind: Kind) -> &'static [Plan] {
    let (dtype, len, op) = (DType::F32, 0, ReduceOp::Sum);
    let unit: Collective = match kind {
        Kind::AllReduce => AllReduce { dtype, len, op }.into(),
        Kind::ReduceScatter => ReduceScatter { dtype, len, op }.into(),
        Kind::AllGather => AllGather { dtype, len }.into(),
        _ => Broadcast {
            dtype,
            len,
            root: 0,
        }
        .into(),
    };
    unit.plans()
}

/// Past this much time spent measuring, no size above 1 MiB is started,
/// no round is added and no second look taken above 1 MiB.
const BUDGET: std::time::Duration = std::time::Duration::from_millis(1300);

/// The least timeout the timing worlds' calls wait with.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the plans are timed: the world's ranks (the first here, and how
/// many in all), the links of the world timing plan number `i`, the
/// agreement of every process on figures (each the largest any process
/// measured), so that every process takes the same steps, and every
/// process's words, one after another (the same length from each).
pub(crate) struct Over<'a> {
    pub ranks: (usize, usize),
    pub links: &'a dyn Fn(usize) -> Result<Vec<Arc<crate::runtime::hop::Link>>>,
    pub agree: &'a dyn Fn(&[f64]) -> Result<Vec<f64>>,
    pub gather: &'a dyn Fn(&[u64]) -> Result<Vec<u64>>,
}

/// What timing found: each plan's series, and the largest share of a
/// host's CPU that other processes used meanwhile (`load.rs`), agreed by
/// every process.
#[derive(Debug, Default)]
pub(crate) struct Measurement {
    pub series: Vec<Series>,
    pub others: f64,
}

/// Times `kinds` under every plan that can run on `devices` (meeting on
/// one device when `meets`), in this process.
pub(crate) fn measure(
    config: &WorldConfig,
    devices: &[Arc<RankDevice>],
    meets: bool,
    tuning: &Tuning,
    kinds: &[Kind],
) -> Result<Measurement> {
    let n = devices.len();
    let here = Over {
        ranks: (0, n),
        links: &|_| Ok(mesh(n, meets.then_some(shared::place as MakePlace))),
        agree: &|v| Ok(v.to_vec()),
        gather: &|v| Ok(v.to_vec()),
    };
    measure_over(config, devices, meets, tuning, kinds, &here)
}

/// [`measure`], over `over`: a world of this process's ranks, or of
/// several processes' (`world_mpi.rs`).
pub(crate) fn measure_over(
    config: &WorldConfig,
    devices: &[Arc<RankDevice>],
    meets: bool,
    tuning: &Tuning,
    kinds: &[Kind],
    over: &Over<'_>,
) -> Result<Measurement> {
    let start = Instant::now();
    let before = load::now();
    // What every process measured, agreed; a plan that did not run there
    // (infinitely slow) did not run.
    let agreed = |w: &World, ask: &Ask| -> Result<Option<Vec<f64>>> {
        let mine = time(w, ask)?.unwrap_or_else(|| vec![f64::INFINITY; ask.calls]);
        let all = (over.agree)(&mine)?;
        Ok(all.iter().all(|s| s.is_finite()).then_some(all))
    };
    let mut worlds: Vec<(Plan, World)> = Vec::new();
    let mut contenders: Vec<(Kind, Plan)> = Vec::new();
    for (i, plan) in Plan::ALL.into_iter().enumerate() {
        if (plan == Plan::Direct && !meets)
            || (plan == Plan::HostRing && !tuning.host_fold)
            || (plan == Plan::TwoLevel && tuning.tier.is_none())
        {
            continue;
        }
        let offered: Vec<Kind> = kinds
            .iter()
            .copied()
            .filter(|&k| offers(k).contains(&plan))
            .collect();
        if offered.is_empty() {
            continue;
        }
        // The two-level plan is timed on floats like the others (its
        // time does not depend on the dtype's fold order), at a meeting
        // of its own; the planner runs it only where the order allows.
        let forced = Tuning {
            plan: Some(plan),
            table: None,
            heal: None,
            prefer: None,
            fold: FoldOrder::Fastest,
            tier: tuning.tier.as_ref().map(|t| Arc::new(t.fresh())),
            ..tuning.clone()
        };
        let links = (over.links)(i)?;
        // The timing's own calls wait as long as they need: a world made
        // with a short timeout on a loaded machine must not fail because
        // a 16 MiB call took longer than its user's collectives would.
        let patience = config.timeout().max(PATIENCE);
        let mut config = config.clone().with_plan(Some(plan)).with_timeout(patience);
        config.quiet = true;
        let w = World::assemble_with(None, devices.to_vec(), links, &config, over.ranks, forced)?;
        // Every kind once first: its kernels compile on first use, which
        // would count as part of its smallest size's time. A kind that
        // runs another plan here is not timed under this one.
        for kind in offered {
            let warm = Ask {
                kind,
                plan,
                bytes: estimate::SIZES[0],
                calls: 1,
                warm: false,
            };
            if agreed(&w, &warm)?.is_some() {
                contenders.push((kind, plan));
            }
        }
        worlds.push((plan, w));
    }
    let series = estimate::run(
        &contenders,
        &estimate::SIZES,
        |ask| {
            let Some((_, w)) = worlds.iter().find(|(p, _)| *p == ask.plan) else {
                return Ok(None);
            };
            let got = agreed(w, ask)?;
            if let Some(t) = &got {
                tracing::debug!(
                    kind = ask.kind.name(),
                    plan = ask.plan.name(),
                    bytes = ask.bytes,
                    us = ?t.iter().map(|s| (s * 1e6).round()).collect::<Vec<_>>(),
                    "world: timed"
                );
            }
            Ok(got)
        },
        || {
            let all = (over.agree)(&[start.elapsed().as_secs_f64()])?;
            Ok(all.first().copied().unwrap_or(0.0) > BUDGET.as_secs_f64())
        },
    )?;
    // Every process's window (none where the counts cannot be read).
    let mine = before
        .zip(load::now())
        .map(|(b, a)| load::Window::between(load::host(), b, a).words().to_vec())
        .unwrap_or_else(|| vec![0; 4]);
    let windows = load::Window::from_words(&(over.gather)(&mine)?);
    Ok(Measurement {
        series,
        others: load::others(&windows),
    })
}

/// The seconds of each of `ask.calls` calls of `ask.kind` of `ask.bytes`
/// per rank on `w` (each call's slowest rank), when it runs with
/// `ask.plan`; `None` when it runs another (the kind does not offer it)
/// or cannot run this size with it.
fn time(w: &World, ask: &Ask) -> Result<Option<Vec<f64>>> {
    let n = w.size();
    let len = (ask.bytes / 4).max(1).next_multiple_of(n);
    let per_rank = w.run(|c| -> Result<Option<Vec<f64>>> {
        let x = c.zeros(DType::F32, len)?;
        let once = || -> Result<()> {
            let work = match ask.kind {
                Kind::AllReduce => c.all_reduce_in_place(&x, ReduceOp::Sum)?,
                Kind::ReduceScatter => c.reduce_scatter(&x, ReduceOp::Sum)?,
                Kind::AllGather => c.all_gather(&x)?,
                _ => c.broadcast_in_place(&x, 0)?,
            };
            work.wait().map(|_| ())
        };
        if ask.warm {
            once()?;
        }
        let _ = c.barrier()?.wait()?;
        let mut times = Vec::with_capacity(ask.calls);
        for _ in 0..ask.calls {
            let t = Instant::now();
            once()?;
            times.push(t.elapsed().as_secs_f64());
        }
        let ran = c
            .flight_record()
            .ranks
            .get(c.rank())
            .and_then(|r| r.iter().rev().find(|e| e.collective == ask.kind.name()))
            .and_then(|e| e.plan);
        Ok((ran == Some(ask.plan)).then_some(times))
    })?;
    let mut slowest = vec![0.0f64; ask.calls];
    for r in per_rank {
        match r {
            Ok(Some(times)) => {
                for (s, t) in slowest.iter_mut().zip(times) {
                    *s = s.max(t);
                }
            }
            Ok(None) | Err(Error::InvalidArgument { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(slowest))
}
