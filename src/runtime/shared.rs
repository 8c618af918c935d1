//! Collectives of a group whose ranks all share one device.
//!
//! Every rank's progress thread hands its tensors to the group's meeting
//! (`transport::shared`); the last to arrive checks that all ranks called
//! the same collective (the fingerprints, and all_to_all's counts pair by
//! pair), records the whole group's steps (`algo::direct`) into one
//! encoder and submits it once, and every rank's `Work` completes on that
//! one submission. A collective the device steps cannot express (16-bit
//! chunks that start mid-word, a chunk that does not start where a kernel
//! can bind it, more inputs than the adapter can bind) goes to the host
//! schedules instead, decided once for the whole group.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]

use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::device::tensor::Tensor;
use crate::device::timestamps::Timestamps;
use crate::device::{RankDevice, Ticket};
use crate::error::{Error, Result};
use crate::runtime::collectives::{Collective, SplitTable};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::plan::Plan;
use crate::runtime::planner::{self, Call, For, Lies, Tuning};
use crate::runtime::profile::Counters;
use crate::runtime::stand_in::StandIns;
use crate::runtime::waiter::Waiter;
use crate::transport::Carried;
use crate::transport::shared::Meeting;

/// What a rank brings to the meeting.
pub(crate) struct Arrival {
    fp: Fingerprint,
    what: Collective,
    ins: Vec<Tensor>,
    outs: Vec<Tensor>,
    /// The rank's profile, when it is profiling: the group's kernel time
    /// is added to it.
    profile: Option<Arc<Counters>>,
}

/// How a collective went, for one rank.
#[derive(Clone)]
pub(crate) enum Outcome {
    /// The group's submission, which writes every output.
    Ran {
        last: Ticket,
        table: Option<SplitTable>,
    },
    /// Run it on the host schedules with this plan (every rank was told
    /// the same).
    Host(Plan),
}

/// Where a shared-device group meets.
pub(crate) type Group = Meeting<Arrival, Result<Outcome>>;

/// The runtime's packets carry a fingerprint, and a group whose ranks
/// share one device meets here.
impl Carried for Fingerprint {
    type Meeting = Group;

    fn meeting(n: usize) -> Group {
        Group::new(n)
    }
}

/// Runs `what` on `ins` and `outs` (this rank's) with the rest of the group.
#[allow(
    clippy::too_many_arguments,
    reason = "the collective, this rank's tensors and its profiling state: one call site, in the progress thread"
)]
pub(crate) fn run(
    group: &Arc<Group>,
    w: &Waiter<'_>,
    tuning: &Tuning,
    explore: Option<Plan>,
    what: &Collective,
    ins: &[Tensor],
    outs: &[Tensor],
    profile: Option<Arc<Counters>>,
    stamps: Option<&mut Timestamps>,
) -> Result<Outcome> {
    let arrival = Arrival {
        fp: w.fp,
        what: what.clone(),
        ins: ins.to_vec(),
        outs: outs.to_vec(),
        profile,
    };
    group.meet(
        w.rank,
        w.fp.seq,
        arrival,
        &w.patience(),
        |peer| w.left(peer),
        |all| host(w, (tuning, explore), all, stamps),
    )?
}

/// The last rank's part: agree, then record and submit everyone's steps.
fn host(
    w: &Waiter<'_>,
    (tuning, explore): (&Tuning, Option<Plan>),
    all: Vec<Arrival>,
    stamps: Option<&mut Timestamps>,
) -> Vec<Result<Outcome>> {
    let n = all.len();
    if let Some(errors) = disagreement(w, &all) {
        return errors.into_iter().map(Err).collect();
    }
    if let Some(why) = shared_bytes(&all) {
        return (0..n)
            .map(|r| Err(Error::invalid(r, why.clone())))
            .collect();
    }
    // The call's one decision, for every rank of the group.
    let call = Call {
        what: &all[0].what,
        n,
        lies: Lies::Shared(feasible(w.dev, &all)),
        explore,
    };
    let whom = For {
        flight: &w.health.flight,
        fp: &w.fp,
        ranks: 0..n,
    };
    let plan = match planner::decide(tuning, &call, whom) {
        Ok(plan) => plan,
        Err(why) => {
            return (0..n)
                .map(|r| Err(Error::invalid(r, why.clone())))
                .collect();
        }
    };
    let outcome = if plan == Plan::Direct {
        record(w, &all, stamps).map(|(last, table)| Outcome::Ran { last, table })
    } else {
        Ok(Outcome::Host(plan))
    };
    (0..n)
        .map(|r| match &outcome {
            Ok(o) => Ok(o.clone()),
            Err(e) if r == w.rank => Err(e.clone()),
            Err(e) => Err(Error::device(
                r,
                Some(w.fp.seq),
                format!("the device this rank shares failed the collective: {e}"),
            )),
        })
        .collect()
}

/// Each rank's error when the ranks did not all call the same collective
/// (or all_to_all's counts do not pair up); `None` when they agree.
fn disagreement(w: &Waiter<'_>, all: &[Arrival]) -> Option<Vec<Error>> {
    let mismatch = |r: usize, ours: String, peer: usize, theirs: String| Error::Mismatch {
        rank: r,
        seq: all[r].fp.seq,
        ours,
        peer,
        theirs,
        flight: w.health.flight.report(),
    };
    if all.iter().any(|a| a.fp != all[0].fp) {
        return Some(
            all.iter()
                .enumerate()
                .map(|(r, a)| {
                    let peer = all.iter().position(|b| b.fp != a.fp).unwrap_or(0);
                    mismatch(r, a.fp.to_string(), peer, all[peer].fp.to_string())
                })
                .collect(),
        );
    }
    // Counts that differ by rank must pair up: what a sends b, b receives from a.
    for (r, a) in all.iter().enumerate() {
        let (send, _) = a.what.unit().pairs()?;
        for (j, b) in all.iter().enumerate() {
            let (_, recv) = b.what.unit().pairs()?;
            let (s, t) = (send.get(j).copied(), recv.get(r).copied());
            if s != t {
                // Told as the receiver sees it, as a hop would.
                let ours = format!(
                    "{} expecting {} elements from rank {r}",
                    b.fp,
                    t.unwrap_or(0)
                );
                let theirs = format!("{} sending {} elements to rank {j}", a.fp, s.unwrap_or(0));
                return Some(
                    (0..all.len())
                        .map(|x| mismatch(x, ours.clone(), r, theirs.clone()))
                        .collect(),
                );
            }
        }
    }
    None
}

/// Ranks that share a device could hand in views of one buffer; a rank's
/// output that shares bytes with another rank's tensor would be written
/// while the other reads or writes it. Why, when it does.
fn shared_bytes(all: &[Arrival]) -> Option<String> {
    for (r, a) in all.iter().enumerate() {
        for (s, b) in all.iter().enumerate() {
            if r == s {
                continue;
            }
            let clash = a.what.writes_output(r)
                && a.outs
                    .iter()
                    .any(|o| b.ins.iter().chain(&b.outs).any(|t| o.overlaps(t)));
            if clash {
                return Some(format!(
                    "{}: rank {r}'s output shares bytes with a tensor of rank {s} (ranks that \
                     share a device must not share the bytes a collective writes)",
                    a.fp
                ));
            }
        }
    }
    None
}

/// Whether the device steps can run this collective, or why not.
fn feasible(dev: &RankDevice, all: &[Arrival]) -> Result<(), String> {
    let calls: Vec<&Collective> = all.iter().map(|a| &a.what).collect();
    let ins: Vec<&[Tensor]> = all.iter().map(|a| &a.ins[..]).collect();
    let outs: Vec<&[Tensor]> = all.iter().map(|a| &a.outs[..]).collect();
    all[0].what.unit().direct_feasible(dev, &calls, &ins, &outs)
}

/// Records every rank's steps for the collective in one encoder, submits
/// it, and returns the submission (and split's table).
fn record(
    w: &Waiter<'_>,
    all: &[Arrival],
    stamps: Option<&mut Timestamps>,
) -> Result<(Ticket, Option<SplitTable>)> {
    let dev = w.dev;
    let n = all.len();
    let profiling = all.iter().any(|a| a.profile.is_some());
    let mut steps = Steps {
        dev,
        enc: dev.encoder(),
        n,
        align: dev.binding_align(),
        stamps: stamps.filter(|_| profiling),
    };
    // Views that do not start their buffer on whole units go through
    // pooled stand-ins, copied in first and back last.
    let mut stood = Vec::with_capacity(n);
    for (r, a) in all.iter().enumerate() {
        stood.push(StandIns::new(
            &mut steps,
            &a.ins,
            &a.outs,
            a.what.writes_output(r),
        )?);
    }
    let ins: Vec<Vec<Tensor>> = stood.iter().map(|s| s.ins.to_vec()).collect();
    let outs: Vec<Vec<Tensor>> = stood.iter().map(|s| s.outs.to_vec()).collect();
    let calls: Vec<&Collective> = all.iter().map(|a| &a.what).collect();
    let table = all[0]
        .what
        .unit()
        .direct_steps(&mut steps, &calls, &ins, &outs)?;
    for s in &stood {
        s.copy_back(&mut steps)?;
    }
    let ticket = dev.submit(steps.enc, Some(w.fp.seq))?;
    if let Some(ts) = steps.stamps {
        // Profiling only: waits for the group's kernels, once per collective.
        let ns = ts.collect(dev, w.fp.seq)?;
        for p in all.iter().filter_map(|a| a.profile.as_ref()) {
            p.kernel_ns(ns);
        }
    }
    Ok((ticket, table))
}
