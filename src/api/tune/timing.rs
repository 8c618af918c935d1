//! Timing the plans on a world's own devices: a world per plan, with the
//! plan forced, runs the calls that `runtime/estimate.rs`'s schedule asks
//! for.

use std::sync::Arc;
use std::time::Instant;

use crate::api::config::WorldConfig;
use crate::api::tune::load;
use crate::device::RankDevice;
use crate::device::tensor::DType;
use crate::error::Result;
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
use crate::runtime::planner::{Forced, Tuning};
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

/// A world with one plan forced, over the devices and links timing gives
/// it, that runs the calls timing asks for. The world's constructor makes
/// them (`World` is one: `api/timed.rs`), so that timing, which a world
/// runs while it is made, knows nothing of `World`.
pub(crate) trait Bench {
    /// The seconds of each of `ask.calls` calls of `ask.kind` of
    /// `ask.bytes` per rank (each call's slowest rank), when it runs with
    /// `ask.plan`; `None` when it runs another or cannot run this size.
    fn time(&self, ask: &Ask) -> Result<Option<Vec<f64>>>;
}

/// Makes the bench a plan is timed on: over `devices` and `links`, with
/// `config`, this process's ranks (the first, and how many in all), and
/// the tuning with the plan forced.
pub(crate) type Benches<'a> = &'a dyn Fn(
    Vec<Arc<RankDevice>>,
    Vec<Arc<crate::runtime::hop::Link>>,
    &WorldConfig,
    (usize, usize),
    Tuning,
) -> Result<Box<dyn Bench>>;

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
    pub benches: Benches<'a>,
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
    benches: Benches<'_>,
) -> Result<Measurement> {
    let n = devices.len();
    let here = Over {
        ranks: (0, n),
        links: &|_| Ok(mesh(n, meets)),
        agree: &|v| Ok(v.to_vec()),
        gather: &|v| Ok(v.to_vec()),
        benches,
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
    let agreed = |w: &dyn Bench, ask: &Ask| -> Result<Option<Vec<f64>>> {
        let mine = w
            .time(ask)?
            .unwrap_or_else(|| vec![f64::INFINITY; ask.calls]);
        let all = (over.agree)(&mine)?;
        Ok(all.iter().all(|s| s.is_finite()).then_some(all))
    };
    let mut worlds: Vec<(Plan, Box<dyn Bench>)> = Vec::new();
    let mut contenders: Vec<(Kind, Plan)> = Vec::new();
    for (i, plan) in Plan::ALL.into_iter().enumerate() {
        if (plan == Plan::Direct && !meets)
            || (plan == Plan::HostRing && !tuning.figures.host_fold)
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
            forced: Forced {
                plan: Some(plan),
                fold: FoldOrder::Fastest,
                ..tuning.forced
            },
            tier: tuning.tier.as_ref().map(|t| Arc::new(t.fresh())),
            ..Tuning::new(tuning.forced, tuning.figures)
        };
        let links = (over.links)(i)?;
        // The timing's own calls wait as long as they need: a world made
        // with a short timeout on a loaded machine must not fail because
        // a 16 MiB call took longer than its user's collectives would.
        let patience = config.timeout().max(PATIENCE);
        let mut config = config.clone().with_plan(Some(plan)).with_timeout(patience);
        config.quiet = true;
        let w = (over.benches)(devices.to_vec(), links, &config, over.ranks, forced)?;
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
            if agreed(&*w, &warm)?.is_some() {
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
            let got = agreed(&**w, ask)?;
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
