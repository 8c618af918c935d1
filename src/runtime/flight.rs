//! The flight record: what each rank of a group last did.
//!
//! When a collective times out, the useful question is "which rank is
//! behind, and where": one rank stuck in #41 while the others wait in #42
//! says at once who to look at. Every rank keeps its last collectives
//! (64 by default, `WGPU_COLLECTIVES_FLIGHT_DEPTH`) with their state and
//! when it changed. A timeout error carries the newest of them in its
//! text; [`World::flight_record`](crate::World::flight_record) and
//! [`Communicator::flight_record`](crate::Communicator::flight_record)
//! give all of it as data, with a JSON form; and the first failure of a
//! group writes it to `WGPU_COLLECTIVES_FLIGHT_DUMP` when that is set (as
//! NCCL's and PyTorch's flight recorders do).

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use crate::device::lock;
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::plan::Plan;

/// Collectives remembered per rank unless configured.
pub(crate) const DEFAULT_DEPTH: usize = 64;

/// Collectives per rank an error's text shows (the newest).
const IN_ERRORS: usize = 16;

/// Where a collective is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FlightState {
    /// Issued, waiting for the progress thread.
    Enqueued,
    /// The progress thread is running its steps.
    InProgress,
    /// Its host steps are done (the device may still be finishing).
    Completed,
    /// It failed.
    Failed,
}

impl FlightState {
    /// The state's name, as the record prints it.
    pub fn name(self) -> &'static str {
        match self {
            FlightState::Enqueued => "enqueued",
            FlightState::InProgress => "in progress",
            FlightState::Completed => "completed",
            FlightState::Failed => "failed",
        }
    }
}

pub(crate) use FlightState as State;

#[derive(Clone)]
struct Entry {
    fp: Fingerprint,
    state: State,
    plan: Option<Plan>,
    /// How many times the planner decided this call's plan (once).
    decisions: u32,
    since: Instant,
    issued_at: SystemTime,
    changed_at: SystemTime,
}

/// One collective in the record.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FlightEntry {
    /// Its sequence number in its communicator.
    pub seq: u64,
    /// Its kind (`all_reduce`, `barrier`, ...).
    pub collective: &'static str,
    /// What it was, as ranks compare it (`#3 all_reduce(float, len 1000, sum)`).
    pub fingerprint: String,
    /// Bytes per rank, where every rank moves the same.
    pub bytes: Option<usize>,
    /// A send's receiver or a receive's sender (its `seq` counts that
    /// pair's calls, not the group's).
    pub peer: Option<usize>,
    /// Its state when the record was read.
    pub state: FlightState,
    /// The plan it ran with, once the planner chose it.
    pub plan: Option<Plan>,
    /// When it was issued.
    pub issued_at: SystemTime,
    /// When its state last changed.
    pub changed_at: SystemTime,
    /// How long it had been in its state when the record was read.
    pub age: Duration,
}

/// The recent collectives of every rank of a group, oldest first.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FlightRecord {
    /// Entry r: rank r's collectives (ranks in the group; see `world_ranks`).
    pub ranks: Vec<Vec<FlightEntry>>,
    /// Each group rank's rank in the world.
    pub world_ranks: Vec<usize>,
    /// The group's first failure, if it has one: the rank it started on
    /// (in the group) and its error.
    pub failure: Option<(usize, String)>,
}

impl FlightRecord {
    /// The record as JSON: `{"failure": null | {"rank": r, "error": "..."},
    /// "ranks": [{"rank": r, "world_rank": w, "collectives": [{"seq",
    /// "collective", "fingerprint", "bytes", "peer", "state", "plan",
    /// "issued_at_us", "changed_at_us", "age_us"}]}]}`, times in
    /// microseconds since the Unix epoch. (Written here, not through a
    /// JSON crate, so that the library has no JSON dependency: the shape
    /// is fixed and every string goes through one escaper.)
    pub fn to_json(&self) -> String {
        let micros = |t: SystemTime| {
            t.duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros())
        };
        let opt = |v: Option<usize>| v.map_or_else(|| "null".to_string(), |v| v.to_string());
        let mut s = String::from("{\"failure\":");
        match &self.failure {
            None => s.push_str("null"),
            Some((rank, error)) => {
                let _ = write!(s, "{{\"rank\":{rank},\"error\":{}}}", json_string(error));
            }
        }
        s.push_str(",\"ranks\":[");
        for (r, entries) in self.ranks.iter().enumerate() {
            if r > 0 {
                s.push(',');
            }
            let world = self.world_ranks.get(r).copied().unwrap_or(r);
            let _ = write!(s, "{{\"rank\":{r},\"world_rank\":{world},\"collectives\":[");
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    s.push(',');
                }
                let _ = write!(
                    s,
                    "{{\"seq\":{},\"collective\":{},\"fingerprint\":{},\"bytes\":{},\
                     \"peer\":{},\"state\":{},\"plan\":{},\"issued_at_us\":{},\
                     \"changed_at_us\":{},\"age_us\":{}}}",
                    e.seq,
                    json_string(e.collective),
                    json_string(&e.fingerprint),
                    opt(e.bytes),
                    opt(e.peer),
                    json_string(e.state.name()),
                    e.plan
                        .map_or_else(|| "null".to_string(), |p| json_string(p.name())),
                    micros(e.issued_at),
                    micros(e.changed_at),
                    e.age.as_micros(),
                );
            }
            s.push_str("]}");
        }
        s.push_str("]}");
        s
    }

    /// The record as an error shows it: the newest `per_rank` of each rank.
    fn text(&self, per_rank: usize) -> String {
        let mut s = String::from("\nflight record (last collectives per rank, newest last):");
        for (rank, entries) in self.ranks.iter().enumerate() {
            let _ = write!(s, "\n  rank {rank}:");
            if entries.is_empty() {
                s.push_str(" nothing issued");
            }
            for e in entries.iter().skip(entries.len().saturating_sub(per_rank)) {
                let _ = write!(s, " [{} {}", e.seq, e.collective);
                match (e.collective, e.peer) {
                    ("send", Some(p)) => {
                        let _ = write!(s, " to {p}");
                    }
                    (_, Some(p)) => {
                        let _ = write!(s, " from {p}");
                    }
                    _ => {}
                }
                if let Some(bytes) = e.bytes {
                    let _ = write!(s, " {bytes} bytes");
                }
                let _ = write!(s, ", {} {:.3}s", e.state.name(), e.age.as_secs_f64());
                if let Some(plan) = e.plan {
                    let _ = write!(s, ", {plan}");
                }
                s.push(']');
            }
        }
        s
    }
}

impl std::fmt::Display for FlightRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.text(usize::MAX).trim_start())
    }
}

/// `text` as a JSON string (RFC 8259: quotes, backslashes and control
/// characters escaped).
fn json_string(text: &str) -> String {
    let mut s = String::with_capacity(text.len().saturating_add(2));
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// Per-rank rings of recent collectives.
pub(crate) struct Flight {
    ranks: Vec<Mutex<VecDeque<Entry>>>,
    depth: usize,
}

impl Flight {
    pub(crate) fn new(ranks: usize, depth: usize) -> Flight {
        let depth = depth.max(1);
        Flight {
            ranks: (0..ranks)
                .map(|_| Mutex::new(VecDeque::with_capacity(depth)))
                .collect(),
            depth,
        }
    }

    /// Collectives remembered per rank.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// Records that `rank`'s collective `fp` is now in `state`.
    pub(crate) fn record(&self, rank: usize, fp: Fingerprint, state: State) {
        let Some(ring) = self.ranks.get(rank) else {
            return;
        };
        let mut ring = lock(ring);
        let (now, wall) = (Instant::now(), SystemTime::now());
        if let Some(e) = ring.iter_mut().rev().find(|e| e.fp.key() == fp.key()) {
            e.state = state;
            e.since = now;
            e.changed_at = wall;
            return;
        }
        if ring.len() >= self.depth {
            ring.pop_front();
        }
        ring.push_back(Entry {
            fp,
            state,
            plan: None,
            decisions: 0,
            since: now,
            issued_at: wall,
            changed_at: wall,
        });
    }

    /// Records that the planner decided the plan of `rank`'s collective
    /// `fp`: `plan`, or a refusal.
    pub(crate) fn decided(&self, rank: usize, fp: &Fingerprint, plan: Option<Plan>) {
        let Some(ring) = self.ranks.get(rank) else {
            return;
        };
        if let Some(e) = lock(ring).iter_mut().rev().find(|e| e.fp.key() == fp.key()) {
            e.plan = plan;
            e.decisions = e.decisions.saturating_add(1);
        }
    }

    /// Each of `rank`'s recorded collectives (not sends or receives), in
    /// issue order: its fingerprint, state, plan and how many times the
    /// planner decided it.
    #[cfg(test)]
    pub(crate) fn decisions(&self, rank: usize) -> Vec<(String, State, Option<Plan>, u32)> {
        self.ranks.get(rank).map_or_else(Vec::new, |ring| {
            lock(ring)
                .iter()
                .filter(|e| !e.fp.kind.point_to_point())
                .map(|e| (e.fp.to_string(), e.state, e.plan, e.decisions))
                .collect()
        })
    }

    /// What `rank` was running as the call `fp` stands for (its
    /// fingerprint), or an empty string when it is no longer (or not yet)
    /// recorded.
    /// The collective (not a send or receive) `rank` issued as number
    /// `seq`, as it named it, if the record still holds it.
    pub(crate) fn issued(&self, rank: usize, seq: u64) -> Option<String> {
        let ring = lock(self.ranks.get(rank)?);
        ring.iter()
            .rev()
            .find(|e| e.fp.seq == seq && !e.fp.kind.point_to_point())
            .map(|e| e.fp.to_string())
    }

    pub(crate) fn doing(&self, rank: usize, fp: &Fingerprint) -> String {
        self.ranks
            .get(rank)
            .and_then(|ring| {
                lock(ring)
                    .iter()
                    .rev()
                    .find(|e| e.fp.key() == fp.key())
                    .map(|e| e.fp.to_string())
            })
            .unwrap_or_default()
    }

    /// Forgets everything (a new run starts its sequence numbers at 0).
    pub(crate) fn clear(&self) {
        for r in &self.ranks {
            lock(r).clear();
        }
    }

    /// The whole record, as data; `world_ranks` maps group ranks to the world's.
    pub(crate) fn snapshot(&self, world_ranks: Vec<usize>) -> FlightRecord {
        let now = Instant::now();
        let ranks = self
            .ranks
            .iter()
            .map(|ring| {
                lock(ring)
                    .iter()
                    .map(|e| FlightEntry {
                        seq: e.fp.seq,
                        collective: e.fp.kind.name(),
                        fingerprint: e.fp.to_string(),
                        bytes: e.fp.bytes(),
                        peer: e.fp.peer,
                        state: e.state,
                        plan: e.plan,
                        issued_at: e.issued_at,
                        changed_at: e.changed_at,
                        age: now.saturating_duration_since(e.since),
                    })
                    .collect()
            })
            .collect();
        FlightRecord {
            ranks,
            world_ranks,
            failure: None,
        }
    }

    /// The newest collectives of every rank, one line each, for an error.
    pub(crate) fn report(&self) -> String {
        self.snapshot(Vec::new()).text(IN_ERRORS)
    }
}
