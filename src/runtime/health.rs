//! How ranks learn that a peer failed, so that nobody waits for a rank that
//! will never arrive.
//!
//! Every blocking wait in the engine checks this shared record before it
//! sleeps, and the record's alarm wakes every sleeping wait when it
//! changes. The first failure of any rank in a group is recorded once;
//! every other rank's pending and later collectives then fail at once,
//! with an error that names the rank that failed and why, instead of
//! hanging until their timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::deadline::Alarm;
use crate::device::lock;
use crate::error::{Error, Result};
use crate::runtime::claims::Claims;
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::flight::{Flight, FlightRecord};

pub(crate) struct Health {
    failure: Mutex<Option<Failure>>,
    /// A failure no run outlives: another process died or was refused.
    /// Every run from then on starts failed with it.
    lasting: Mutex<Option<Failure>>,
    /// Each rank's own first failure of the run, with the call it failed:
    /// what that rank's later calls repeat, saying so.
    firsts: Mutex<Vec<Option<(u64, Error)>>>,
    /// Ranks whose closure has returned and whose collectives have all
    /// finished: whatever a peer still waits for from them will never come.
    gone: Vec<AtomicBool>,
    /// What every rank last did, for timeout errors.
    pub flight: Flight,
    /// For a group made by `split`: the parent group and each rank's rank
    /// in it. A parent's failures and departures are this group's too.
    parent: Option<(Arc<Health>, Vec<usize>)>,
    /// Where the first failure writes the flight record (JSON), if anywhere.
    dump: Option<std::path::PathBuf>,
    /// Tells ranks in other processes of a failure first recorded here.
    announce: std::sync::OnceLock<Announce>,
    /// Where this process's departures are passed on (other processes).
    depart: std::sync::OnceLock<Depart>,
    /// Runs started (resets): a failure passed on from another process
    /// belongs to the run it happened in, not to whichever runs here.
    runs: std::sync::atomic::AtomicU32,
    /// Whether run `runs` is still going (set and cleared under the
    /// failure lock): news of a departure that comes after it ended, and
    /// before the next began, is of no run here.
    in_run: AtomicBool,
    /// What ranks that share a device without meeting on it write.
    pub claims: Claims,
    /// Raised by every failure and departure; shared with the groups
    /// `split` makes, whose waits a parent's failure ends too.
    pub alarm: Arc<Alarm>,
}

/// Passes a failure on to ranks this record does not reach (those of
/// other processes): the run it happened in (see `Health::runs`), the
/// rank that failed, and its error.
pub(crate) type Announce = Box<dyn Fn(u32, usize, &Error) + Send + Sync>;
/// Passes on that a rank of this process returned from its closure in a
/// run (the run, the rank).
pub(crate) type Depart = Box<dyn Fn(u32, usize) + Send + Sync>;

#[derive(Clone)]
struct Failure {
    origin: usize,
    error: Error,
}

impl Health {
    /// A world's group whose rank r runs on device `devices[r]` (`None`
    /// for ranks of other processes), remembering `depth` collectives per
    /// rank.
    pub(crate) fn new(
        devices: Vec<Option<usize>>,
        depth: usize,
        dump: Option<std::path::PathBuf>,
    ) -> Arc<Health> {
        let ranks = devices.len();
        Arc::new(Health {
            claims: Claims::new(devices),
            failure: Mutex::new(None),
            lasting: Mutex::new(None),
            firsts: Mutex::new(vec![None; ranks]),
            gone: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
            flight: Flight::new(ranks, depth),
            parent: None,
            dump,
            announce: std::sync::OnceLock::new(),
            depart: std::sync::OnceLock::new(),
            runs: std::sync::atomic::AtomicU32::new(0),
            in_run: AtomicBool::new(false),
            alarm: Arc::default(),
        })
    }

    /// The record of a group made by `split` out of `parent`'s ranks
    /// (`parent.1[r]`: rank r's rank there).
    pub(crate) fn with_parent(ranks: usize, parent: (Arc<Health>, Vec<usize>)) -> Health {
        Health {
            claims: Claims::new(parent.0.claims.devices_of(&parent.1)),
            failure: Mutex::new(None),
            lasting: Mutex::new(None),
            firsts: Mutex::new(vec![None; ranks]),
            gone: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
            flight: Flight::new(ranks, parent.0.flight.depth()),
            dump: parent.0.dump.clone(),
            alarm: parent.0.alarm.clone(),
            parent: Some(parent),
            announce: std::sync::OnceLock::new(),
            depart: std::sync::OnceLock::new(),
            runs: std::sync::atomic::AtomicU32::new(0),
            in_run: AtomicBool::new(false),
        }
    }

    /// Each rank's rank in the world.
    pub(crate) fn world_ranks(&self) -> Vec<usize> {
        let n = self.gone.len();
        match &self.parent {
            None => (0..n).collect(),
            Some((p, map)) => {
                let up = p.world_ranks();
                map.iter()
                    .map(|&r| up.get(r).copied().unwrap_or(r))
                    .collect()
            }
        }
    }

    /// The flight record of every rank of the group, as data.
    pub(crate) fn flight_record(&self) -> FlightRecord {
        let mut record = self.flight.snapshot(self.world_ranks());
        record.failure = lock(&self.failure)
            .as_ref()
            .map(|f| (f.origin, f.error.to_string()));
        record
    }

    /// Writes the flight record where `WGPU_COLLECTIVES_FLIGHT_DUMP` (or
    /// the config) says, the group's world ranks in the file name
    /// (`PATH.ranks-0-3.json`), so that processes and groups never
    /// overwrite each other.
    fn write_dump(&self) {
        let Some(path) = &self.dump else { return };
        let record = self.flight_record();
        let ranks = &record.world_ranks;
        let (lo, hi) = (
            ranks.iter().min().copied().unwrap_or(0),
            ranks.iter().max().copied().unwrap_or(0),
        );
        let mut name = path.clone().into_os_string();
        name.push(format!(".ranks-{lo}-{hi}.json"));
        if let Err(e) = std::fs::write(&name, record.to_json()) {
            tracing::warn!(path = ?name, error = %e, "could not write the flight record");
        } else {
            tracing::info!(path = ?name, "flight record written");
        }
    }

    /// Marks `rank` as finished for good (until the next run), and tells
    /// other processes.
    pub(crate) fn set_gone(&self, rank: usize) {
        self.gone_here(rank);
        if let Some(d) = self.depart.get() {
            d(self.runs(), rank);
        }
    }

    /// Marks `rank` as finished for good (until the next run).
    fn gone_here(&self, rank: usize) {
        if let Some(g) = self.gone.get(rank) {
            g.store(true, Ordering::Release);
        }
        self.alarm.raise();
    }

    /// Marks `rank`, of another process, as finished in run `run` (not
    /// passed on): only while that run is this one and still going.
    /// Checked under the lock `reset` starts a run under and `end_run`
    /// ends it under, so that a departure read before a new run starts,
    /// or after this one ended, is never applied (a user's thread between
    /// runs would be told the rank left).
    /// The alarm is raised after the lock is let go: bells take the locks
    /// of their waits, which may be waiting for this one.
    #[cfg(feature = "mpi")]
    pub(crate) fn gone_elsewhere(&self, run: u32, rank: usize) {
        let f = lock(&self.failure);
        let now = self.runs() == run && self.in_run.load(Ordering::Acquire);
        if let Some(g) = self.gone.get(rank).filter(|_| now) {
            g.store(true, Ordering::Release);
        }
        drop(f);
        if now {
            self.alarm.raise();
        }
    }

    /// Where departures of this process's ranks are passed on (set once).
    #[cfg(feature = "mpi")]
    pub(crate) fn depart_to(&self, depart: Depart) {
        let _ = self.depart.set(depart);
    }

    pub(crate) fn is_gone(&self, rank: usize) -> bool {
        self.gone
            .get(rank)
            .is_some_and(|g| g.load(Ordering::Acquire))
            || self
                .parent
                .as_ref()
                .is_some_and(|(p, map)| map.get(rank).is_some_and(|&r| p.is_gone(r)))
    }

    /// Records that rank `origin` failed with `error` (the first record
    /// wins), and passes it on to other processes' ranks.
    pub(crate) fn fail(&self, origin: usize, error: Error) {
        self.record(origin, error, true, None);
    }

    /// Records that `rank`'s call `seq` failed with `error` (its first
    /// failure of the run is kept, for its later calls to repeat), and the
    /// group's failure as [`fail`](Self::fail) does, `origin` its cause.
    pub(crate) fn failed_at(&self, rank: usize, seq: Option<u64>, origin: usize, error: Error) {
        if let Some(seq) = seq {
            let mut firsts = lock(&self.firsts);
            if let Some(slot @ None) = firsts.get_mut(rank) {
                *slot = Some((seq, error.clone()));
            }
        }
        self.fail(origin, error);
    }

    /// Records a failure another process passed on (not passed on again):
    /// one of run `run` only while that run is this one (as
    /// `gone_elsewhere`), one with no run (a process dead or refused) in
    /// any.
    #[cfg(feature = "mpi")]
    pub(crate) fn fail_elsewhere(&self, run: Option<u32>, origin: usize, error: Error) {
        self.record(origin, error, false, run);
    }

    /// Records a failure that every run from now on has too (another
    /// process died, or was refused): a run that starts later starts
    /// failed, however fast its collectives would have been.
    #[cfg(feature = "mpi")]
    pub(crate) fn fail_for_good(&self, origin: usize, error: Error) {
        {
            let mut l = lock(&self.lasting);
            if l.is_none() {
                *l = Some(Failure {
                    origin,
                    error: error.clone(),
                });
            }
        }
        self.record(origin, error, false, None);
    }

    /// Whether a lasting failure is recorded (`fail_for_good`).
    #[cfg(all(test, feature = "mpi"))]
    pub(crate) fn failed_for_good(&self) -> bool {
        lock(&self.lasting).is_some()
    }

    fn record(&self, origin: usize, error: Error, announce: bool, run: Option<u32>) {
        let mut f = lock(&self.failure);
        if f.is_some() || run.is_some_and(|r| r != self.runs()) {
            return;
        }
        // An abort is asked for, not a failure to investigate, and each
        // process asks for its own.
        let real = !matches!(error, Error::Aborted { .. });
        if announce && real {
            if let Some(a) = self.announce.get() {
                a(self.runs(), origin, &error);
            }
        }
        *f = Some(Failure { origin, error });
        drop(f);
        self.alarm.raise();
        if real {
            self.write_dump();
        }
    }

    /// Where failures recorded here are passed on (set once).
    #[cfg(feature = "mpi")]
    pub(crate) fn announce_to(&self, announce: Announce) {
        let _ = self.announce.set(announce);
    }

    /// Whether a failure other than an abort is recorded.
    #[cfg(feature = "mpi")]
    pub(crate) fn failed(&self) -> bool {
        lock(&self.failure)
            .as_ref()
            .is_some_and(|f| !matches!(f.error, Error::Aborted { .. }))
    }

    /// Forgets departures.
    fn clear_gone(&self) {
        for g in &self.gone {
            g.store(false, Ordering::Release);
        }
    }

    /// A run has ended: its departures are forgotten, and news of them
    /// from other processes that comes later is dropped (a rank whose
    /// closure returned is gone for the run's peers only; the user's
    /// threads may use its communicator next). A failure stays recorded
    /// until the next run.
    pub(crate) fn end_run(&self) {
        let f = lock(&self.failure);
        self.in_run.store(false, Ordering::Release);
        self.clear_gone();
        drop(f);
    }

    /// Runs started so far.
    pub(crate) fn runs(&self) -> u32 {
        self.runs.load(Ordering::Acquire)
    }

    /// Forgets failures, departures and history (a new `World::run`);
    /// a lasting failure stays.
    pub(crate) fn reset(&self) {
        let mut f = lock(&self.failure);
        *f = lock(&self.lasting).clone();
        lock(&self.firsts).iter_mut().for_each(|e| *e = None);
        self.runs.fetch_add(1, Ordering::AcqRel);
        self.in_run.store(true, Ordering::Release);
        // Under the lock: a departure of the new run, early, is kept.
        self.clear_gone();
        drop(f);
        self.flight.clear();
        self.claims.clear();
    }

    /// What `rank` of this group was doing at `fp`, as its flight record
    /// names it (the fingerprint itself when the record has let it go).
    fn doing(&self, rank: usize, fp: &Fingerprint) -> String {
        let named = self.flight.doing(rank, fp);
        if named.is_empty() {
            fp.to_string()
        } else {
            named
        }
    }

    /// `Ok` while nobody has failed; else the error `rank` should report for `seq`.
    pub(crate) fn check(&self, rank: usize, fp: &Fingerprint) -> Result<()> {
        let seq = fp.seq;
        let f = match lock(&self.failure).clone() {
            Some(f) => f,
            None => {
                return match &self.parent {
                    // A failure of the parent group fails this one too; the
                    // call it names is this group's, not the parent's call
                    // of the same sequence number.
                    Some((p, map)) => {
                        p.check(map.get(rank).copied().unwrap_or(rank), fp)
                            .map_err(|e| match e {
                                Error::PeerFailed {
                                    rank,
                                    seq,
                                    peer,
                                    reason,
                                    flight,
                                    ..
                                } => Error::PeerFailed {
                                    rank,
                                    seq,
                                    doing: self.doing(rank, fp),
                                    peer,
                                    reason,
                                    flight,
                                },
                                e => e,
                            })
                    }
                    None => Ok(()),
                };
            }
        };
        // A later call of a rank that failed itself: its own first
        // failure again, saying it is a repeat and of which call (every
        // rank of a plan refused alike says its own words, not a peer's).
        let own = lock(&self.firsts).get(rank).cloned().flatten();
        if let Some((first, e)) = own.filter(|(s, _)| *s != seq && !fp.kind.point_to_point()) {
            if let Some(again) = e.repeated(rank, seq, first, || self.doing(rank, fp)) {
                return Err(again.with_flight(self.flight.report()));
            }
        }
        // A later call of the run: it says the group failed earlier, and
        // where, rather than repeat the first failure's words as its own.
        let first = match &f.error {
            Error::Mismatch { seq, .. }
            | Error::Timeout { seq, .. }
            | Error::PeerFailed { seq, .. } => Some(*seq),
            Error::Device { seq, .. } => *seq,
            _ => None,
        };
        if let Some(first) = first.filter(|&s| s != seq && !fp.kind.point_to_point()) {
            return Err(Error::PeerFailed {
                rank,
                seq,
                doing: self.doing(rank, fp),
                peer: f.origin,
                reason: format!("the group failed at seq {first}: {}", f.error.brief()),
                flight: self.flight.report(),
            });
        }
        Err(match f.error {
            // Every rank hears of a mismatch as itself: what it issued,
            // and a rank whose call differs from it.
            Error::Mismatch {
                rank: a,
                seq,
                ours,
                peer: b,
                theirs,
                flight,
            } => {
                let mine = self.flight.issued(rank, seq).or_else(|| {
                    (fp.seq == seq && !fp.kind.point_to_point()).then(|| fp.to_string())
                });
                let (peer, theirs, ours) = match mine {
                    _ if rank == a => (b, theirs, ours),
                    _ if rank == b => (a, ours, theirs),
                    // Like the rank that found it: the other side differs.
                    Some(m) if m == ours => (b, theirs, m),
                    // Like the other side: the finder differs.
                    Some(m) if m == theirs => (a, ours, m),
                    // Neither (the two differ in what only they can see,
                    // as all_to_all's counts between them): both sides.
                    m => (
                        a,
                        format!("{ours}, against rank {b}'s {theirs}"),
                        m.unwrap_or_else(|| "nothing yet".to_string()),
                    ),
                };
                Error::Mismatch {
                    rank,
                    seq,
                    ours,
                    peer,
                    theirs,
                    flight,
                }
            }
            Error::Aborted { .. } => Error::Aborted { rank, seq },
            // The wire between processes failed (a process refused for
            // what it sent): the world's failure, not one peer's, and
            // every rank says it in its own words.
            e @ Error::Transport { .. } => e,
            e if f.origin == rank => e,
            // The whole group waited too long: every rank reports the timeout,
            // with the flight record that says who was behind.
            Error::Timeout {
                what,
                after,
                flight,
                ..
            } => Error::Timeout {
                rank,
                seq,
                what: format!("rank {} waiting for {what}", f.origin),
                after,
                flight,
            },
            // The first failure's own words, once: a rank that reported
            // a peer's failure passes on the peer's reason, not its report.
            Error::PeerFailed { reason, .. } => Error::PeerFailed {
                rank,
                seq,
                doing: self.doing(rank, fp),
                peer: f.origin,
                reason,
                flight: self.flight.report(),
            },
            e => Error::PeerFailed {
                rank,
                seq,
                doing: self.doing(rank, fp),
                peer: f.origin,
                reason: e.brief(),
                flight: self.flight.report(),
            },
        })
    }
}

#[cfg(all(test, feature = "mpi"))]
#[allow(
    clippy::arithmetic_side_effects,
    reason = "a test: small sizes, a failed expectation is a failed test"
)]
mod tests {
    use super::*;

    fn failed_elsewhere(origin: usize) -> Error {
        Error::PeerFailed {
            rank: origin,
            seq: 0,
            doing: String::new(),
            peer: origin,
            reason: "a test's".into(),
            flight: String::new(),
        }
    }

    /// What another process says of a run (a rank returned, a rank
    /// failed) counts only in that run: said of the run before, it is
    /// stale, though read before this run began; a process dead counts in
    /// every run.
    #[test]
    fn news_from_another_process_counts_only_in_its_run() {
        let h = Health::new(vec![Some(0), Some(0), None, None], 4, None);
        h.reset();
        let run = h.runs();
        h.gone_elsewhere(run - 1, 2);
        assert!(!h.is_gone(2), "a departure of the run before was applied");
        h.fail_elsewhere(Some(run - 1), 3, failed_elsewhere(3));
        assert!(!h.failed(), "a failure of the run before was recorded");
        h.gone_elsewhere(run, 2);
        assert!(h.is_gone(2) && !h.is_gone(3));
        h.fail_elsewhere(Some(run), 3, failed_elsewhere(3));
        assert!(h.failed());
        h.reset();
        assert!(!h.is_gone(2) && !h.failed());
        h.fail_elsewhere(None, 2, failed_elsewhere(2));
        assert!(h.failed(), "a dead process's failure was not recorded");
    }

    /// A departure that comes after its run ended, before the next one
    /// starts, marks no one gone: not between runs, where a user's thread
    /// may send to the rank, nor in the next run.
    #[test]
    fn news_from_another_process_between_runs_marks_no_one() {
        let h = Health::new(vec![Some(0), None], 4, None);
        h.reset();
        let run = h.runs();
        h.end_run();
        h.gone_elsewhere(run, 1);
        assert!(!h.is_gone(1), "a departure applied between runs");
        h.reset();
        assert!(
            !h.is_gone(1),
            "a departure of the run before applied to this one"
        );
        h.gone_elsewhere(h.runs(), 1);
        assert!(h.is_gone(1), "a departure of this run was dropped");
        h.end_run();
        assert!(!h.is_gone(1), "a departure outlived its run");
    }
}
