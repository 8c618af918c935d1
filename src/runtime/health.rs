//! How ranks learn that a peer failed, so that nobody waits for a rank that
//! will never arrive.
//!
//! Every blocking wait in the engine is a loop of short waits (a tick) that
//! checks this shared record between them. The first failure of any rank in
//! a group is recorded once; every other rank's pending and later collectives
//! then fail within a tick, with an error that names the rank that failed
//! and why, instead of hanging until their timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::deadline::{Patience, Watch};
use crate::device::{RankDevice, lock};
use crate::error::{Error, Result};
use crate::runtime::claims::Claims;
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::flight::{Flight, FlightRecord};
use crate::runtime::hop::Link;

pub(crate) struct Health {
    failure: Mutex<Option<Failure>>,
    /// Ranks whose closure has returned and whose collectives have all
    /// finished: whatever a peer still waits for from them will never come.
    gone: Vec<AtomicBool>,
    /// What every rank last did, for timeout errors.
    pub flight: Flight,
    /// For a group made by `split`: the parent group and each rank's rank
    /// in it. A parent's failures and departures are this group's too.
    parent: Option<(Arc<Health>, Vec<usize>)>,
    /// Groups being formed by `split`, until every member has joined.
    forming: Mutex<HashMap<(u64, u32), Forming>>,
    /// Where the first failure writes the flight record (JSON), if anywhere.
    dump: Option<std::path::PathBuf>,
    /// Tells ranks in other processes of a failure first recorded here.
    announce: std::sync::OnceLock<Announce>,
    /// Runs started (resets): a failure passed on from another process
    /// belongs to the run it happened in, not to whichever runs here.
    runs: std::sync::atomic::AtomicU32,
    /// What ranks that share a device without meeting on it write.
    pub claims: Claims,
}

/// Passes a failure on to ranks this record does not reach (those of
/// other processes): the run it happened in (see `Health::runs`), the
/// rank that failed, and its error.
pub(crate) type Announce = Box<dyn Fn(u32, usize, &Error) + Send + Sync>;

/// A group one `split` is forming: its links, and its shared record.
struct Forming {
    endpoints: Vec<Option<Arc<Link>>>,
    health: Arc<Health>,
    /// Where the new group meets, should its ranks share one device.
    group: Arc<crate::runtime::shared::Group>,
}

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
            gone: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
            flight: Flight::new(ranks, depth),
            parent: None,
            forming: Mutex::new(HashMap::new()),
            dump,
            announce: std::sync::OnceLock::new(),
            runs: std::sync::atomic::AtomicU32::new(0),
        })
    }

    fn with_parent(ranks: usize, parent: (Arc<Health>, Vec<usize>)) -> Health {
        Health {
            claims: Claims::new(parent.0.claims.devices_of(&parent.1)),
            failure: Mutex::new(None),
            gone: (0..ranks).map(|_| AtomicBool::new(false)).collect(),
            flight: Flight::new(ranks, parent.0.flight.depth()),
            dump: parent.0.dump.clone(),
            parent: Some(parent),
            forming: Mutex::new(HashMap::new()),
            announce: std::sync::OnceLock::new(),
            runs: std::sync::atomic::AtomicU32::new(0),
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

    /// Joins the group that `split` number `seq` forms for `color` out of
    /// `parents` (ranks here, in the new group's order), as its rank `me`:
    /// the first member to arrive makes the group's links.
    pub(crate) fn join_split(
        this: &Arc<Health>,
        link: &Link,
        seq: u64,
        color: u32,
        parents: &[usize],
        me: usize,
    ) -> Result<(Arc<Link>, Arc<Health>, Arc<crate::runtime::shared::Group>)> {
        let mut forming = lock(&this.forming);
        let f = forming.entry((seq, color)).or_insert_with(|| Forming {
            endpoints: link.split(seq, color, parents),
            health: Arc::new(Health::with_parent(
                parents.len(),
                (this.clone(), parents.to_vec()),
            )),
            group: Arc::new(crate::runtime::shared::Group::new(parents.len())),
        });
        let endpoint = f
            .endpoints
            .get_mut(me)
            .and_then(Option::take)
            .ok_or_else(|| Error::InvalidArgument {
                rank: Some(parents.get(me).copied().unwrap_or(me)),
                what: format!("split #{seq}: rank {me} of color {color} joined twice"),
            })?;
        let (health, group) = (f.health.clone(), f.group.clone());
        if f.endpoints.iter().all(Option::is_none) {
            forming.remove(&(seq, color));
        }
        Ok((endpoint, health, group))
    }

    /// Marks `rank` as finished for good (until the next run).
    pub(crate) fn set_gone(&self, rank: usize) {
        if let Some(g) = self.gone.get(rank) {
            g.store(true, Ordering::Release);
        }
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
        self.record(origin, error, true);
    }

    /// Records a failure another process passed on (not passed on again).
    #[cfg(feature = "mpi")]
    pub(crate) fn fail_elsewhere(&self, origin: usize, error: Error) {
        self.record(origin, error, false);
    }

    fn record(&self, origin: usize, error: Error, announce: bool) {
        let mut f = lock(&self.failure);
        if f.is_some() {
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

    /// Forgets departures (a run has ended).
    pub(crate) fn clear_gone(&self) {
        for g in &self.gone {
            g.store(false, Ordering::Release);
        }
    }

    /// Runs started so far.
    pub(crate) fn runs(&self) -> u32 {
        self.runs.load(Ordering::Acquire)
    }

    /// Forgets failures, departures and history (a new `World::run`).
    pub(crate) fn reset(&self) {
        let mut f = lock(&self.failure);
        *f = None;
        self.runs.fetch_add(1, Ordering::AcqRel);
        drop(f);
        self.clear_gone();
        self.flight.clear();
        lock(&self.forming).clear();
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

/// Blocking waits made on behalf of one collective on one rank: each lasts
/// at most the configured timeout, and gives up within a tick when a peer
/// fails.
pub(crate) struct Waiter<'a> {
    pub dev: &'a RankDevice,
    pub health: &'a Health,
    /// This rank in the communicator.
    pub rank: usize,
    pub fp: Fingerprint,
    pub timeout: Duration,
}

impl Waiter<'_> {
    /// The same waits, as the layers below see them (see `deadline::Watch`).
    pub(crate) fn patience(&self) -> Patience<'_> {
        Patience {
            rank: self.rank,
            seq: self.fp.seq,
            timeout: self.timeout,
            watch: self,
        }
    }

    /// Repeats `attempt` until it yields, see [`Patience::until`].
    pub(crate) fn until<T>(
        &self,
        what: impl Fn() -> String,
        attempt: impl FnMut(Duration) -> Result<Option<T>>,
    ) -> Result<T> {
        self.patience().until(what, attempt)
    }

    pub(crate) fn device_error(&self, what: String) -> Error {
        Error::device(self.rank, Some(self.fp.seq), what)
    }

    /// `peer` failed this collective first, because of `reason`.
    pub(crate) fn peer_failed(&self, peer: usize, reason: String) -> Error {
        Error::PeerFailed {
            rank: self.rank,
            seq: self.fp.seq,
            doing: self.fp.to_string(),
            peer,
            reason,
            flight: self.health.flight.report(),
        }
    }
}

impl Watch for Waiter<'_> {
    fn check(&self) -> Result<()> {
        self.health.check(self.rank, &self.fp)
    }

    fn timed_out(&self, what: String, after: Duration) -> Error {
        Error::Timeout {
            rank: self.rank,
            seq: self.fp.seq,
            what,
            after,
            flight: self.health.flight.report(),
        }
    }
}
