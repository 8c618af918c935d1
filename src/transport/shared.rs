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
use crate::error::{Error, Result};

/// Where a group of ranks on one device meets, one round per collective.
pub(crate) struct Meeting<A, O> {
    table: Mutex<Table<A, O>>,
    changed: Condvar,
    n: usize,
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
            n,
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
    /// Waits as long as `patience` allows. Whenever the watch's alarm
    /// rings, `left` gives the error for each rank that has left the run;
    /// one of them that is not here will never come, and ends the wait
    /// with its error.
    pub(crate) fn meet(
        self: &Arc<Self>,
        rank: usize,
        round: u64,
        arrival: A,
        patience: &Patience<'_>,
        left: impl Fn(usize) -> Option<Error>,
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
                // A rank that left before this look rang no bell for it:
                // ask who has left before sleeping, and before reading the
                // table. A rank arrives before it leaves, so one that had
                // left and is absent left without arriving. (Asked after
                // the read, a rank could arrive, host the round, finish
                // and leave in between, and be taken for one that never
                // came.)
                let mut had_left: Vec<(usize, Error)> = (0..self.n)
                    .filter(|&i| i != rank)
                    .filter_map(|i| left(i).map(|e| (i, e)))
                    .collect();
                let mut t = lock(&self.table);
                if let Some(o) = take_outcome(&mut t, rank, round) {
                    return Ok(Some(o));
                }
                let never =
                    absent(&t, round).find_map(|i| had_left.iter().position(|(j, _)| *j == i));
                if let Some(k) = never {
                    return Err(had_left.swap_remove(k).1);
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

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::arithmetic_side_effects,
    reason = "a test: a failed expectation is a failed test, and its sums are small"
)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// A watch that never ends a wait early.
    #[derive(Default)]
    struct Quiet(Alarm);

    impl Watch for Quiet {
        fn check(&self) -> Result<()> {
            Ok(())
        }
        fn timed_out(&self, what: String, after: Duration) -> Error {
            Error::Timeout {
                rank: 0,
                seq: 0,
                what,
                after,
                flight: String::new(),
            }
        }
        fn alarm(&self) -> &Alarm {
            &self.0
        }
    }

    fn patience(watch: &Quiet) -> Patience<'_> {
        Patience {
            rank: 0,
            seq: 0,
            timeout: Duration::from_secs(10),
            watch,
        }
    }

    /// Each rank's outcome: the sum of every arrival, plus its rank.
    fn host(all: Vec<u32>) -> Vec<Result<u32>> {
        let sum: u32 = all.iter().sum();
        (0..all.len()).map(|r| Ok(sum + r as u32)).collect()
    }

    /// Rank 1 arrives, hosts the round, takes its outcome and leaves while
    /// rank 0 looks: rank 0 gets its outcome, not a report that rank 1
    /// left without coming. Rank 1's visit happens inside rank 0's
    /// question about who has left, so whether it is taken for one that
    /// never came depends only on the order of that question and the
    /// look at the table, not on timing.
    #[test]
    fn a_rank_that_came_and_left_during_a_look_is_not_taken_for_absent() {
        let meeting: Arc<Meeting<u32, Result<u32>>> = Arc::new(Meeting::new(2));
        let watch = Quiet::default();
        let patience = patience(&watch);
        let gone = AtomicBool::new(false);
        let got = meeting
            .meet(
                0,
                0,
                10,
                &patience,
                |peer| {
                    if peer == 1 && !gone.swap(true, Ordering::SeqCst) {
                        let theirs = meeting.meet(1, 0, 20, &patience, |_| None, host);
                        assert_eq!(theirs.unwrap().unwrap(), 31);
                    }
                    gone.load(Ordering::SeqCst).then(|| Error::InvalidArgument {
                        rank: Some(0),
                        what: format!("rank {peer} left without coming"),
                    })
                },
                host,
            )
            .unwrap();
        assert_eq!(got.unwrap(), 30);
    }

    /// A rank that left and never came ends the wait with its error.
    #[test]
    fn a_rank_that_left_without_coming_ends_the_wait() {
        let meeting: Arc<Meeting<u32, Result<u32>>> = Arc::new(Meeting::new(2));
        let watch = Quiet::default();
        let patience = patience(&watch);
        let got = meeting.meet(
            0,
            0,
            10,
            &patience,
            |peer| {
                Some(Error::InvalidArgument {
                    rank: Some(0),
                    what: format!("rank {peer} left without coming"),
                })
            },
            host,
        );
        match got {
            Err(Error::InvalidArgument { what, .. }) => {
                assert_eq!(what, "rank 1 left without coming");
            }
            other => panic!("expected rank 1's departure, got {other:?}"),
        }
    }
}
