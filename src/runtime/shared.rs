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
use crate::algo::part_words;
use crate::device::tensor::{DType, Tensor};
use crate::device::timestamps::Timestamps;
use crate::device::{RankDevice, Ticket};
use crate::error::{Error, Result};
use crate::runtime::collective::Collective;
use crate::runtime::collective::SplitTable;
use crate::runtime::collectives::reducible;
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::plan::Plan;
use crate::runtime::planner::{self, Tuning};
use crate::runtime::profile::Counters;
use crate::runtime::waiter::Waiter;
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

/// Runs `what` on `ins` and `outs` (this rank's) with the rest of the group.
#[allow(
    clippy::too_many_arguments,
    reason = "the collective, this rank's tensors and its profiling state: one call site, in the progress thread"
)]
pub(crate) fn run(
    group: &Group,
    w: &Waiter<'_>,
    tuning: &Tuning,
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
        |absent| {
            for &peer in absent {
                if w.health.is_gone(peer) {
                    // A peer that left after a failure is reported with that failure.
                    w.health.check(w.rank, &w.fp)?;
                    return Err(w.peer_failed(
                        peer,
                        format!(
                            "rank {peer} returned from its closure without issuing {}",
                            w.fp
                        ),
                    ));
                }
            }
            Ok(())
        },
        |all| host(w, tuning, all, stamps),
    )?
}

/// The last rank's part: agree, then record and submit everyone's steps.
fn host(
    w: &Waiter<'_>,
    tuning: &Tuning,
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
    let plan = match planner::choose(tuning, &all[0].what, n, &Some(feasible(w.dev, &all))) {
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
    for (r, a) in all.iter().enumerate() {
        let Collective::AllToAll { send, .. } = &a.what else {
            return None;
        };
        for (j, b) in all.iter().enumerate() {
            let Collective::AllToAll { recv, .. } = &b.what else {
                return None;
            };
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
    let n = all.len();
    let a = &all[0];
    let reduces = || reducible(dev, n);
    let words = |what: &str, bytes: Vec<u64>| {
        if bytes.iter().all(|b| b % 4 == 0) {
            Ok(())
        } else {
            Err(format!(
                "{what} of 16-bit elements of odd length start mid-word, where a copy cannot"
            ))
        }
    };
    match &a.what {
        Collective::AllReduce { .. } | Collective::AllReduceCoalesced { .. } => reduces(),
        Collective::ReduceScatter { .. } | Collective::ReduceScatterCoalesced { .. } => {
            reduces()?;
            if a.outs
                .iter()
                .all(|o| o.byte_len() % dev.binding_align() == 0)
            {
                Ok(())
            } else {
                Err(format!(
                    "each rank's chunk must be a multiple of {} bytes for a kernel to bind it",
                    dev.binding_align()
                ))
            }
        }
        Collective::AllGather { .. } | Collective::AllGatherCoalesced { .. } => {
            words("segments", a.ins.iter().map(Tensor::byte_len).collect())
        }
        Collective::AllToAll { dtype, .. } => {
            let size = dtype.size() as u64;
            let counts = all.iter().flat_map(|b| match &b.what {
                Collective::AllToAll { send, recv, .. } => {
                    send.iter().chain(recv).copied().collect()
                }
                _ => Vec::new(),
            });
            words("blocks", counts.map(|c| c as u64 * size).collect())
        }
        Collective::Barrier | Collective::Split { .. } => Ok(()),
        Collective::Unit(u) => {
            let ins: Vec<&[Tensor]> = all.iter().map(|a| &a.ins[..]).collect();
            let outs: Vec<&[Tensor]> = all.iter().map(|a| &a.outs[..]).collect();
            u.unit().direct_feasible(dev, &ins, &outs)
        }
        // Never met here: a pair's packets carry them (`algo::p2p`).
        Collective::Send { .. } | Collective::Recv { .. } => {
            Err("a send or receive is one hop between a pair".into())
        }
    }
}

/// A view the device steps cannot bind where it lies, and its stand-in.
struct Staged {
    stand_in: Tensor,
    view: Tensor,
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
    // pooled tensors, copied in first and back last.
    let mut back: Vec<Staged> = Vec::new();
    let mut ins: Vec<Vec<Tensor>> = Vec::with_capacity(n);
    let mut outs: Vec<Vec<Tensor>> = Vec::with_capacity(n);
    for (r, a) in all.iter().enumerate() {
        let writes = a.what.writes_output(r);
        let mut rank_outs = Vec::with_capacity(a.outs.len());
        for o in &a.outs {
            // A gather's output off the root is not touched, so not staged.
            if o.direct() || !writes {
                rank_outs.push(o.clone());
            } else {
                let stand_in = Tensor::output(o.rank_device(), o.dtype(), o.len())?;
                back.push(Staged {
                    stand_in: stand_in.clone(),
                    view: o.clone(),
                });
                rank_outs.push(stand_in);
            }
        }
        let mut rank_ins = Vec::with_capacity(a.ins.len());
        for x in &a.ins {
            if x.direct() {
                rank_ins.push(x.clone());
                continue;
            }
            let stand_in = match back.iter().find(|s| s.view.same_view(x)) {
                Some(s) => s.stand_in.clone(),
                None => Tensor::output(x.rank_device(), x.dtype(), x.len())?,
            };
            // Whole words: see `Staged` in progress.rs.
            let bytes = x.byte_len().next_multiple_of(4);
            steps.copy(x.buffer(), x.offset(), stand_in.buffer(), 0, bytes);
            rank_ins.push(stand_in);
        }
        ins.push(rank_ins);
        outs.push(rank_outs);
    }
    let table = steps_for(&mut steps, &all[0].what, all, &ins, &outs)?;
    for s in &back {
        let bytes = s.view.byte_len();
        let whole = bytes & !3;
        steps.copy(
            s.stand_in.buffer(),
            0,
            s.view.buffer(),
            s.view.offset(),
            whole,
        );
        if bytes % 4 != 0 {
            let last = Tensor::output(s.view.rank_device(), DType::U32, 4)?;
            steps.copy(s.stand_in.buffer(), whole, last.buffer(), 0, 4);
            let at = s.view.offset().saturating_add(whole);
            dev.kernels
                .patch_half(dev, &mut steps.enc, s.view.buffer(), at, last.buffer())?;
        }
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

/// The collective's own steps, on views every kernel can bind.
fn steps_for(
    steps: &mut Steps<'_>,
    what: &Collective,
    all: &[Arrival],
    ins: &[Vec<Tensor>],
    outs: &[Vec<Tensor>],
) -> Result<Option<SplitTable>> {
    let n = all.len();
    fn bufs(ts: &[Vec<Tensor>], i: usize) -> Vec<&wgpu::Buffer> {
        ts.iter().map(|t| t[i].buffer()).collect()
    }
    match what {
        Collective::AllReduce { dtype, op, len } => {
            let (xs, os) = (bufs(ins, 0), bufs(outs, 0));
            let words = dtype.words(*len);
            let q = part_words(words, n);
            steps.all_reduce(*dtype, *op, &xs, &os, words, q)?;
        }
        Collective::AllReduceCoalesced { dtype, op, .. } => {
            // One pass over each rank's concatenation, as the ring does.
            let total: usize = ins[0].iter().map(Tensor::words).sum();
            let mut flats = Vec::with_capacity(n);
            for xs in ins {
                let Some(first) = xs.first() else {
                    return Ok(None);
                };
                let flat = Tensor::output(first.rank_device(), DType::U32, total)?;
                let mut off = 0;
                for x in xs {
                    steps.copy(x.buffer(), 0, flat.buffer(), off, x.used_bytes());
                    off += x.used_bytes();
                }
                flats.push(flat);
            }
            let fs: Vec<&wgpu::Buffer> = flats.iter().map(Tensor::buffer).collect();
            let q = part_words(total, n);
            steps.all_reduce(*dtype, *op, &fs, &fs, total, q)?;
            for (flat, os) in flats.iter().zip(outs) {
                let mut off = 0;
                for o in os {
                    steps.copy(flat.buffer(), off, o.buffer(), 0, o.used_bytes());
                    off += o.used_bytes();
                }
            }
        }
        Collective::ReduceScatter { dtype, op, .. }
        | Collective::ReduceScatterCoalesced { dtype, op, .. } => {
            for i in 0..ins[0].len() {
                let (xs, os) = (bufs(ins, i), bufs(outs, i));
                let chunk = outs[0][i].byte_len();
                steps.reduce_scatter(*dtype, *op, &xs, &os, chunk)?;
            }
        }
        Collective::AllGather { .. } | Collective::AllGatherCoalesced { .. } => {
            for i in 0..ins[0].len() {
                let bytes = ins[0][i].byte_len();
                for (r, x) in ins.iter().enumerate() {
                    for o in outs {
                        steps.copy(x[i].buffer(), 0, o[i].buffer(), r as u64 * bytes, bytes);
                    }
                }
            }
        }
        Collective::Unit(u) => u.unit().direct_steps(steps, ins, outs)?,
        Collective::AllToAll { dtype, .. } => {
            let size = dtype.size() as u64;
            for (r, a) in all.iter().enumerate() {
                let Collective::AllToAll { send, .. } = &a.what else {
                    continue;
                };
                let mut from = 0u64;
                for (j, &count) in send.iter().enumerate() {
                    let Collective::AllToAll { recv, .. } = &all[j].what else {
                        continue;
                    };
                    let to: u64 = recv.iter().take(r).map(|&c| c as u64 * size).sum();
                    let bytes = count as u64 * size;
                    steps.copy(ins[r][0].buffer(), from, outs[j][0].buffer(), to, bytes);
                    from += bytes;
                }
            }
        }
        Collective::Barrier | Collective::Send { .. } | Collective::Recv { .. } => {}
        Collective::Split { .. } => {
            let table = all
                .iter()
                .map(|a| match a.what {
                    Collective::Split { color, key } => (color, key),
                    _ => (None, 0),
                })
                .collect();
            return Ok(Some(table));
        }
    }
    Ok(None)
}
