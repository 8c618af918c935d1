//! Calibrating the scheduler's cost model against what ran.
//!
//! The passes schedule by estimates: collectives by the alpha-beta model,
//! matmuls by FLOPs, other compute by bytes. A timeline says what each
//! took: a compute span is its kernel's time, and a collective whose wait
//! blocked ended when its wait did, so its span is its duration (one whose
//! wait did not block finished at some unknown time before: not a sample).
//! [`samples`] pairs the two, [`Calibration`] says how far apart they are,
//! and [`refit`] scales the model to the measurements: the fixed and the
//! per-byte parts of the collectives' cost by a least-squares fit, the
//! matmul and the element-wise throughputs each by one factor. A refit is
//! collective: the ranks average their fitted factors with an all_reduce,
//! so every rank schedules with the same figures (the same bits).

use std::time::Duration;

use super::exec::{Lane, Run};
use super::ir::{Graph, NodeId, Op};
use super::passes::GraphCost;
use crate::runtime::stats;
use crate::{Communicator, ReduceOp, Result};

/// What a sample measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum What {
    /// A collective.
    Collective,
    /// A matrix product (costed by FLOPs).
    Matmul,
    /// Other compute (costed by bytes).
    Elementwise,
}

/// One node's estimate and measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The node.
    pub node: NodeId,
    /// What kind of cost it is.
    pub what: What,
    /// For a collective, the estimate's part that does not depend on its
    /// size (the rest is per byte).
    pub fixed: Duration,
    /// The model's estimate.
    pub predicted: Duration,
    /// What it took.
    pub measured: Duration,
}

/// How far a model's estimates are from what ran: the median of
/// |predicted - measured| / measured, per kind (`None`: no sample).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibration {
    /// Over collectives.
    pub collectives: Option<f64>,
    /// Over compute ops.
    pub compute: Option<f64>,
    /// Collectives' estimated and measured total.
    pub collective_totals: (Duration, Duration),
}

fn micros(us: f64) -> Duration {
    Duration::try_from_secs_f64(us.max(0.0) / 1e6).unwrap_or(Duration::ZERO)
}

/// The samples of one run of `g` (with its timeline) under `cost`.
pub fn samples(g: &Graph, run: &Run, cost: &GraphCost) -> Vec<Sample> {
    run.timeline
        .iter()
        .filter(|e| e.lane == Lane::Compute || e.blocked_us > 0.0)
        .filter_map(|e| {
            let n = g.node(e.node)?;
            let what = match n.op {
                ref o if o.is_collective() => What::Collective,
                Op::Matmul { .. } => What::Matmul,
                _ => What::Elementwise,
            };
            Some(Sample {
                node: e.node,
                what,
                fixed: cost.fixed(&n.op),
                predicted: cost.of(g, n),
                measured: micros(e.end_us - e.start_us),
            })
        })
        .collect()
}

/// The median of `v` (see `runtime/stats.rs`).
fn median(v: Vec<f64>) -> Option<f64> {
    stats::summary(&v).map(|(m, _)| m)
}

impl Calibration {
    /// How far `samples`' estimates are from their measurements.
    pub fn of(samples: &[Sample]) -> Calibration {
        let err = |s: &Sample| {
            let m = s.measured.as_secs_f64();
            (s.predicted.as_secs_f64() - m).abs() / m.max(1e-9)
        };
        let pick = |coll: bool| {
            median(
                samples
                    .iter()
                    .filter(|s| (s.what == What::Collective) == coll)
                    .map(err)
                    .collect(),
            )
        };
        let colls = samples.iter().filter(|s| s.what == What::Collective);
        let totals = colls.fold((Duration::ZERO, Duration::ZERO), |(p, m), s| {
            (p.saturating_add(s.predicted), m.saturating_add(s.measured))
        });
        Calibration {
            collectives: pick(true),
            compute: pick(false),
            collective_totals: totals,
        }
    }
}

/// The least-squares factors (kf, kv) with measured ~ kf * fixed + kv * rest.
fn fit_collectives(samples: &[Sample]) -> Option<(f64, f64)> {
    let (mut ff, mut fv, mut vv, mut tf, mut tv) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for s in samples.iter().filter(|s| s.what == What::Collective) {
        let f = s.fixed.as_secs_f64();
        let v = s.predicted.saturating_sub(s.fixed).as_secs_f64();
        let t = s.measured.as_secs_f64();
        (ff, fv, vv, tf, tv) = (ff + f * f, fv + f * v, vv + v * v, tf + t * f, tv + t * v);
    }
    let det = ff * vv - fv * fv;
    if det > 1e-6 * ff * vv && det > 0.0 {
        let (kf, kv) = ((tf * vv - tv * fv) / det, (tv * ff - tf * fv) / det);
        if kf > 0.0 && kv > 0.0 {
            return Some((kf, kv));
        }
    }
    // One size only (or a fit that makes no sense): one factor for both.
    let (pp, tp) = (ff + 2.0 * fv + vv, tf + tv);
    (pp > 0.0 && tp > 0.0).then(|| (tp / pp, tp / pp))
}

/// One factor k with measured ~ k * predicted over samples of `what`.
fn fit_one(samples: &[Sample], what: What) -> Option<f64> {
    let (pp, tp) = samples
        .iter()
        .filter(|s| s.what == what)
        .fold((0.0, 0.0), |(pp, tp), s| {
            let p = s.predicted.as_secs_f64();
            (pp + p * p, tp + p * s.measured.as_secs_f64())
        });
    (pp > 0.0 && tp > 0.0).then(|| tp / pp)
}

/// `cost` refit to this rank's `samples` and agreed with every rank of
/// `comm` (the factors averaged by all_reduce); a kind without samples on
/// any rank keeps its figures. Collective: every rank must call it.
pub fn refit(comm: &Communicator, samples: &[Sample], cost: &GraphCost) -> Result<GraphCost> {
    let (kf, kv) = fit_collectives(samples).unwrap_or((0.0, 0.0));
    let km = fit_one(samples, What::Matmul).unwrap_or(0.0);
    let ke = fit_one(samples, What::Elementwise).unwrap_or(0.0);
    // Each factor and whether this rank has it, summed over the ranks.
    let mine = [kf, kv, km, ke].map(|k| k as f32);
    let have = mine.map(|k| if k > 0.0 { 1.0f32 } else { 0.0 });
    let both: Vec<f32> = mine.iter().chain(&have).copied().collect();
    let sums = comm
        .all_reduce(&comm.tensor(&both)?, ReduceOp::Sum)?
        .wait()?
        .to_vec::<f32>()?;
    let factor = |i: usize| {
        let (sum, count) = (sums.get(i).copied(), sums.get(i.saturating_add(4)).copied());
        match (sum, count) {
            (Some(s), Some(c)) if c > 0.0 && s > 0.0 => f64::from(s / c),
            _ => 1.0,
        }
    };
    let scale = |d: Duration, k: f64| Duration::try_from_secs_f64(d.as_secs_f64() * k).unwrap_or(d);
    let mut out = *cost;
    out.comm.alpha = scale(cost.comm.alpha, factor(0));
    out.comm.dispatch = scale(cost.comm.dispatch, factor(0));
    out.comm.beta = cost.comm.beta / factor(1);
    out.flops = cost.flops / factor(2);
    out.bytes = cost.bytes / factor(3);
    Ok(out)
}
