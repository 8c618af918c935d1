//! The shared-device transport: ranks on one device meet instead of
//! sending bytes.
//!
//! Ranks that share a wgpu device can bind each other's buffers, so a
//! collective needs no hop at all: every rank hands in what it holds (its
//! arrival), and the last one to arrive gets all of them and records the
//! whole group's commands, which the device's one owner submits once
//! (NCCL's P2P transport and PyTorch SymmetricMemory do the same within a
//! node). Each rank then gets its own outcome back. What an arrival holds,
//! and what the last rank does with the arrivals, is the runtime's: this
//! module knows only who has come, and deadlines.

use std::sync::{Arc, Condvar, Mutex};

use crate::deadline::{Alarm, Patience, Ring, Watch};
use crate::device::lock;
use crate::error::Result;

/// Where a group of ranks on one device meets, one round per collective.
pub(crate) struct Meeting<A, O> {
    table: Mutex<Table<A, O>>,
    changed: Condvar,
}

struct Table<A, O> {
    /// Each rank's latest round, with its arrival until the last rank of
    /// the round takes them all.
    arrived: Vec<Option<(u64, Option<A>)>>,
    /// Each rank's outcome, with its round, until the rank takes it.
    outcomes: Vec<Option<(u64, O)>>,
}

/// A raised alarm wakes the ranks waiting here.
impl<A: Send, O: Send> Ring for Meeting<A, O> {
    fn ring(&self) {
        let _t = lock(&self.table);
        self.changed.notify_all();
    }
}

impl<A: Send + 'static, O: Send + 'static> Meeting<A, O> {
    /// A meeting place for `n` ranks.
    pub(crate) fn new(n: usize) -> Meeting<A, O> {
        Meeting {
            table: Mutex::new(Table {
                arrived: (0..n).map(|_| None).collect(),
                outcomes: (0..n).map(|_| None).collect(),
            }),
            changed: Condvar::new(),
        }
    }

    /// Forgets arrivals and outcomes left by an earlier, failed run.
    pub(crate) fn clear(&self) {
        let mut t = lock(&self.table);
        t.arrived.iter_mut().for_each(|a| *a = None);
        t.outcomes.iter_mut().for_each(|o| *o = None);
    }

    /// Joins round `round` as `rank` with `arrival`, and returns this
    /// rank's outcome. The last rank to join takes every arrival (in rank
    /// order) and runs `host` on them, which gives each rank's outcome.
    /// Waits as long as `patience` allows; `missing` is asked, whenever
    /// the watch's alarm rings, about the ranks not yet here, and may end
    /// the wait (a rank that left will never come).
    pub(crate) fn meet(
        self: &Arc<Self>,
        rank: usize,
        round: u64,
        arrival: A,
        patience: &Patience<'_>,
        missing: impl Fn(&[usize]) -> Result<()>,
        host: impl FnOnce(Vec<A>) -> Vec<O>,
    ) -> Result<O> {
        let all = {
            let mut t = lock(&self.table);
            if let Some(slot) = t.arrived.get_mut(rank) {
                *slot = Some((round, Some(arrival)));
            }
            if absent(&t, round).next().is_none() {
                let all: Vec<A> = t
                    .arrived
                    .iter_mut()
                    .filter_map(|a| a.as_mut().and_then(|(_, a)| a.take()))
                    .collect();
                Some(all)
            } else {
                None
            }
        };
        if let Some(all) = all {
            let outcomes = host(all);
            let mut t = lock(&self.table);
            for (slot, o) in t.outcomes.iter_mut().zip(outcomes) {
                *slot = Some((round, o));
            }
            self.changed.notify_all();
        }
        // An outcome that is here wins over a failure the watch may report
        // meanwhile: a rank the group's own submission failed reports that
        // failure itself, not a peer's report of it.
        let ready = ReadyFirst {
            meeting: self,
            rank,
            round,
            inner: patience.watch,
        };
        let patience = Patience {
            watch: &ready,
            ..*patience
        };
        let bell: Arc<dyn Ring> = self.clone();
        let waited = patience.until(
            || {
                let t = lock(&self.table);
                let absent: Vec<String> = absent(&t, round).map(|i| i.to_string()).collect();
                format!("ranks {} to join on the shared device", absent.join(", "))
            },
            &bell,
            |slice| {
                let mut t = lock(&self.table);
                if let Some(o) = take_outcome(&mut t, rank, round) {
                    return Ok(Some(o));
                }
                // A rank that left before this look rang no bell for it:
                // ask about the absent ones before sleeping.
                let absent: Vec<usize> = absent(&t, round).collect();
                drop(t);
                missing(&absent)?;
                t = lock(&self.table);
                if let Some(o) = take_outcome(&mut t, rank, round) {
                    return Ok(Some(o));
                }
                if !slice.rung() {
                    t = self
                        .changed
                        .wait_timeout(t, slice.limit)
                        .map(|(g, _)| g)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
                Ok(take_outcome(&mut t, rank, round))
            },
        );
        if waited.is_err() {
            // Withdraw, so that a late rank cannot complete the round with
            // this rank's stale arrival.
            let mut t = lock(&self.table);
            if let Some(slot) = t.arrived.get_mut(rank) {
                if slot
                    .as_ref()
                    .is_some_and(|(r, a)| *r == round && a.is_some())
                {
                    *slot = None;
                }
            }
        }
        waited
    }
}

/// The runtime's watch, quiet once this rank's outcome has come.
struct ReadyFirst<'a, A, O> {
    meeting: &'a Meeting<A, O>,
    rank: usize,
    round: u64,
    inner: &'a dyn Watch,
}

impl<A, O> Watch for ReadyFirst<'_, A, O> {
    fn check(&self) -> Result<()> {
        let here = lock(&self.meeting.table)
            .outcomes
            .get(self.rank)
            .is_some_and(|o| o.as_ref().is_some_and(|(r, _)| *r == self.round));
        if here { Ok(()) } else { self.inner.check() }
    }

    fn timed_out(&self, what: String, after: std::time::Duration) -> crate::error::Error {
        self.inner.timed_out(what, after)
    }

    fn alarm(&self) -> &Alarm {
        self.inner.alarm()
    }
}

/// The ranks whose latest arrival is not for `round`.
fn absent<A, O>(t: &Table<A, O>, round: u64) -> impl Iterator<Item = usize> + '_ {
    t.arrived
        .iter()
        .enumerate()
        .filter(move |(_, a)| a.as_ref().is_none_or(|(r, _)| *r != round))
        .map(|(i, _)| i)
}

fn take_outcome<A, O>(t: &mut Table<A, O>, rank: usize, round: u64) -> Option<O> {
    let slot = t.outcomes.get_mut(rank)?;
    if slot.as_ref().is_some_and(|(r, _)| *r == round) {
        slot.take().map(|(_, o)| o)
    } else {
        None
    }
}
