//! A tuning table that corrects itself as the world runs.
//!
//! A table is timed once, on a machine that may have been busy then and
//! quiet now (or the reverse), and a wrong one used to be kept for good.
//! So rank 0 compares what its collectives really take with what the
//! table predicted. When the plan it chose runs slower than predicted by
//! more than the noise, or a rival's prediction is within the noise of
//! it, the user's own calls of that size time the contenders in turn
//! (all ranks together: each call runs the same plan on every rank), the
//! table takes the medians, and the planner chooses from it again. The
//! cache is rewritten with what was learned. Where the table is right,
//! nothing moves: a trigger needs a window of calls, and a key explored
//! once waits longer each time before it is explored again (as NCCL's
//! tuner plugins revise their choices at run time, but never on one
//! call).
//!
//! Every rank must choose alike, and ranks run ahead of each other, so a
//! change takes effect at a checkpoint (every [`EVERY`] collectives) that
//! rank 0 decides [`AHEAD`] checkpoints before it starts: a rank that
//! reaches a checkpoint not yet decided waits for rank 0, within its
//! deadline. The decisions ([`Healer`]) are a function of the
//! observations alone, tested with given durations. Over MPI, process 0
//! decides for every process: the times and the decisions travel
//! (`heal/span.rs`).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::deadline::{Alarm, Ring};
use crate::error::{Error, Result};
use crate::runtime::fingerprint::Kind;
pub(crate) mod span;

use self::span::{self as heal_span, Decided, Note, Seen as SeenCall, Span};
use crate::runtime::plan::Plan;
use crate::runtime::stats;
use crate::runtime::tune::{Point, Table};

/// Collectives between two checkpoints.
pub(crate) const EVERY: u64 = 8;
/// Checkpoints rank 0 decides before it reaches them.
pub(crate) const AHEAD: u64 = 2;
/// Calls of the chosen plan a trigger judges (their median).
const WINDOW: usize = 8;
/// The least margin over the prediction that counts as slower (the
/// calls of a program are timed otherwise than the tuner's, one by one:
/// a difference this small is the method's, not the table's).
const SLOW: f64 = 0.5;
/// A plan slower than predicted is timed against the rivals predicted
/// within this factor of what it takes.
const REACH: f64 = 2.0;
/// Calls of each contender an exploration waits for.
const EACH: usize = 4;
/// Calls in a row that run one contender while exploring (the first
/// of them is not counted: it carries the last plan's tail).
const BLOCK: u64 = 4;
/// Checkpoints an exploration may last, at most.
const LONGEST: u64 = 10;
/// Checkpoints a size explored once waits before it is looked at again
/// (twice as long after each look): an exploration costs its calls, and
/// on a noisy machine a second look mostly finds the first's answer.
const QUIET: u64 = 16;
/// Sizes watched at once (the most recently used are kept).
const KEYS: usize = 32;
/// Calls kept per size watched.
const KEPT: usize = 32;

/// When a call ran: the world's run, and its sequence number there.
pub(crate) type At = (u32, u64);

/// The calls of one kind and size that run each plan in turn.
#[derive(Debug, PartialEq)]
pub(crate) struct Explore {
    pub kind: Kind,
    pub bytes: usize,
    pub plans: Vec<Plan>,
}

/// What every rank decides by from a checkpoint on.
#[derive(Debug, Clone)]
pub(crate) struct Directive {
    pub table: Arc<Table>,
    pub explore: Option<Arc<Explore>>,
}

impl Directive {
    /// The plan a call of `kind` and `bytes` numbered `seq` runs, when it
    /// is being explored: the contenders in turn, [`BLOCK`] calls each,
    /// by sequence number.
    pub(crate) fn prefer(&self, kind: Kind, bytes: Option<usize>, seq: u64) -> Option<Plan> {
        let e = self.explore.as_deref()?;
        if e.kind != kind || Some(e.bytes) != bytes || e.plans.is_empty() {
            return None;
        }
        let i = usize::try_from((seq / BLOCK).checked_rem(e.plans.len() as u64)?).ok()?;
        e.plans.get(i).copied()
    }
}

/// The calls seen of one kind and size.
#[derive(Debug)]
struct Seen {
    kind: Kind,
    bytes: usize,
    /// (when, plan, seconds), oldest first, at most [`KEPT`].
    calls: Vec<(At, Plan, f64)>,
    /// Used last (for keeping the [`KEYS`] most recent).
    used: u64,
    /// Not explored again before this checkpoint; explorations so far.
    quiet_until: u64,
    explored: u32,
}

/// A size looked at again at checkpoint `c`, after `explored` looks
/// before: counts the look, and gives the checkpoint it is quiet until
/// ([`QUIET`] checkpoints, twice as long after each look).
fn looked(explored: &mut u32, c: u64) -> u64 {
    *explored = explored.saturating_add(1);
    c.saturating_add(QUIET.checked_shl((*explored).min(20)).unwrap_or(u64::MAX))
}

/// Rank 0's learning: observations in, directives out.
#[derive(Debug)]
pub(crate) struct Healer {
    table: Arc<Table>,
    /// Since when the table has been in force.
    since: At,
    seen: Vec<Seen>,
    /// The exploration in progress: what, from when, decided at which
    /// checkpoint.
    exploring: Option<(Arc<Explore>, At, u64)>,
    clock: u64,
    /// The plan of the last call observed.
    last: Option<Plan>,
}

/// The median of `v` and its spread, where the median is above zero.
fn median(v: &[f64]) -> Option<(f64, f64)> {
    stats::summary(v).filter(|(m, _)| *m > 0.0)
}

impl Healer {
    /// A healer of `table`, in force from the start.
    pub(crate) fn new(table: Arc<Table>) -> Healer {
        Healer {
            table,
            since: (0, 0),
            seen: Vec::new(),
            exploring: None,
            clock: 0,
            last: None,
        }
    }

    /// The table in force.
    pub(crate) fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// A call of `kind` moving `bytes` per rank ran `plan` at `at` and
    /// took `secs`. Not counted after a call of another plan: the ranks
    /// sharing a device may still have been finishing its steps.
    pub(crate) fn observe(&mut self, kind: Kind, bytes: usize, plan: Plan, at: At, secs: f64) {
        if self.last.replace(plan) != Some(plan) {
            return;
        }
        if !(secs.is_finite() && secs > 0.0 && self.table.entries.iter().any(|e| e.kind == kind)) {
            return;
        }
        self.clock = self.clock.saturating_add(1);
        let i = match self
            .seen
            .iter()
            .position(|s| s.kind == kind && s.bytes == bytes)
        {
            Some(i) => i,
            None => {
                if self.seen.len() >= KEYS {
                    // Forget the size used longest ago.
                    if let Some(old) = (0..self.seen.len()).min_by_key(|&j| self.seen[j].used) {
                        self.seen.swap_remove(old);
                    }
                }
                self.seen.push(Seen {
                    kind,
                    bytes,
                    calls: Vec::with_capacity(KEPT),
                    used: 0,
                    quiet_until: 0,
                    explored: 0,
                });
                self.seen.len().saturating_sub(1)
            }
        };
        let Some(s) = self.seen.get_mut(i) else {
            return;
        };
        s.used = self.clock;
        if s.calls.len() >= KEPT {
            s.calls.remove(0);
        }
        s.calls.push((at, plan, secs));
    }

    /// The directive from checkpoint `c` of run `run` on, decided now;
    /// with the new table when the table changed (for the cache).
    pub(crate) fn decide(&mut self, run: u32, c: u64) -> (Directive, Option<Arc<Table>>) {
        let changed = match self.exploring.clone() {
            Some((e, from, began)) => self.conclude(&e, from, began, c),
            None => self.trigger(run, c),
        };
        let directive = Directive {
            table: self.table.clone(),
            explore: self.exploring.as_ref().map(|(e, _, _)| e.clone()),
        };
        (directive, changed)
    }

    /// A new run begins: an exploration in progress is dropped.
    pub(crate) fn new_run(&mut self) {
        self.exploring = None;
    }

    /// Starts an exploration where a size's calls say the table is wrong
    /// or too close to call; it takes effect at checkpoint `c`. Where the
    /// chosen plan is slower than predicted and no rival could beat what
    /// it takes, the table takes what it took instead (returned).
    fn trigger(&mut self, run: u32, c: u64) -> Option<Arc<Table>> {
        let table = self.table.clone();
        let since = self.since;
        for s in &mut self.seen {
            if s.quiet_until > c {
                continue;
            }
            let mut recent: Vec<&(At, Plan, f64)> =
                s.calls.iter().filter(|(at, _, _)| *at >= since).collect();
            if recent.len() < WINDOW {
                continue;
            }
            recent.drain(..recent.len().saturating_sub(WINDOW));
            let plan = recent.first().map(|r| r.1);
            let Some(plan) = plan.filter(|p| recent.iter().all(|r| r.1 == *p)) else {
                continue;
            };
            let Some(mine) = table
                .entries
                .iter()
                .find(|e| e.kind == s.kind && e.plan == plan)
            else {
                continue;
            };
            let predicted = mine.cost.at(s.bytes);
            let spread = mine.cost.spread_near(s.bytes);
            let secs: Vec<f64> = recent.iter().map(|r| r.2).collect();
            let Some((observed, observed_spread)) = median(&secs) else {
                continue;
            };
            // Plans the planner could run at this size: not far past the
            // largest size they were timed at (`Table::best`).
            let others: Vec<(Plan, f64, f64)> = table
                .entries
                .iter()
                .filter(|e| e.kind == s.kind && e.plan != plan)
                .filter(|e| s.bytes as f64 <= 4.0 * e.cost.largest())
                .map(|e| (e.plan, e.cost.at(s.bytes), e.cost.spread_near(s.bytes)))
                .collect();
            let slow = observed > predicted * (1.0 + SLOW.max(3.0 * spread));
            let rivals: Vec<Plan> = if slow {
                // The table is wrong here, its other predictions maybe
                // too: every plan that might beat what this one takes,
                // not those far behind (timing them costs the calls).
                others
                    .iter()
                    .filter(|(_, q, _)| *q <= REACH * observed)
                    .map(|o| o.0)
                    .collect()
            } else {
                // Near what it is predicted to take, or takes, whichever
                // is less (explored calls carry more than calls in a row).
                let base = predicted.min(observed);
                others
                    .iter()
                    .filter(|(_, q, qs)| !stats::slower(*q, base, spread + qs))
                    .map(|o| o.0)
                    .collect()
            };
            if rivals.is_empty() {
                if !slow {
                    continue;
                }
                // Nothing could beat it: the table takes what it takes.
                s.quiet_until = looked(&mut s.explored, c);
                let point = Point {
                    bytes: s.bytes as f64,
                    secs: observed,
                    spread: observed_spread,
                };
                tracing::info!(
                    kind = s.kind.name(),
                    bytes = s.bytes,
                    plan = plan.name(),
                    observed_us = observed * 1e6,
                    predicted_us = predicted * 1e6,
                    "healing: slower than predicted, and no rival near; the table takes it"
                );
                let t = Arc::new(table.with_point(s.kind, plan, point));
                self.table = t.clone();
                self.since = (run, c.saturating_mul(EVERY));
                return Some(t);
            }
            let plans: Vec<Plan> = std::iter::once(plan).chain(rivals).collect();
            tracing::info!(
                kind = s.kind.name(),
                bytes = s.bytes,
                plan = plan.name(),
                observed_us = observed * 1e6,
                predicted_us = predicted * 1e6,
                why = if slow { "slower than predicted" } else { "a rival within the noise" },
                contenders = ?plans.iter().map(|p| p.name()).collect::<Vec<_>>(),
                "healing: timing the contenders again on the calls themselves"
            );
            let e = Explore {
                kind: s.kind,
                bytes: s.bytes,
                plans,
            };
            self.exploring = Some((Arc::new(e), (run, c.saturating_mul(EVERY)), c));
            return None;
        }
        None
    }

    /// Ends the exploration `e` (in force from `from`, decided at
    /// checkpoint `began`) when each contender ran [`EACH`] times or it
    /// has lasted [`LONGEST`]; the table takes the medians.
    fn conclude(&mut self, e: &Explore, from: At, began: u64, c: u64) -> Option<Arc<Table>> {
        let s = self
            .seen
            .iter_mut()
            .find(|s| s.kind == e.kind && s.bytes == e.bytes)?;
        let runs = |p: Plan| -> Vec<f64> {
            s.calls
                .iter()
                .filter(|(at, q, _)| *at >= from && *q == p)
                .map(|r| r.2)
                .collect()
        };
        let done = e.plans.iter().all(|&p| runs(p).len() >= EACH);
        if !done && c < began.saturating_add(LONGEST) {
            return None;
        }
        self.exploring = None;
        s.quiet_until = looked(&mut s.explored, c);
        let mut table = (*self.table).clone();
        let mut learned = Vec::new();
        for &p in &e.plans {
            let v = runs(p);
            if v.len() < 2 {
                continue;
            }
            // The median, as the calls that follow are judged by.
            if let Some((secs, spread)) = median(&v) {
                let point = Point {
                    bytes: e.bytes as f64,
                    secs,
                    spread,
                };
                table = table.with_point(e.kind, p, point);
                learned.push((p.name(), (secs * 1e6).round()));
            }
        }
        // Calls from now on are judged against the new table.
        self.since = (from.0, c.saturating_mul(EVERY));
        if learned.is_empty() {
            return None;
        }
        tracing::info!(
            kind = e.kind.name(),
            bytes = e.bytes,
            us = ?learned,
            "healing: the table takes what the calls took"
        );
        let table = Arc::new(table);
        self.table = table.clone();
        Some(table)
    }
}

/// The decisions every rank reads, and rank 0's healer.
struct Board {
    run: u32,
    /// (first checkpoint, directive) at each change, oldest first; none
    /// in a process that has not heard from process 0 in this run.
    changes: Vec<(u64, Directive)>,
    /// The last checkpoint decided.
    upto: u64,
    /// Process 0's decisions for runs this process has not started.
    early: Vec<Decided>,
}

/// The decisions ranks wait for, and the condition variable they wait
/// on, which a raised alarm rings too (a peer's failure ends the wait).
struct Notices {
    board: Mutex<Board>,
    decided: Condvar,
}

impl Ring for Notices {
    fn ring(&self) {
        let _b = hold(&self.board);
        self.decided.notify_all();
    }
}

/// A world's healing: rank 0 decides, every rank reads.
pub(crate) struct Heal {
    notices: Arc<Notices>,
    healer: Mutex<Healer>,
    /// The calls the ranks are finishing.
    timing: Mutex<Timing>,
    /// Keeps a changed table (the cache).
    keep: Box<dyn Fn(&Table) + Send + Sync>,
    /// How the world's other processes are reached, over MPI.
    span: Option<Span>,
}

impl std::fmt::Debug for Heal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Heal")
    }
}

/// Locks `m`, whatever a panicking holder left (nothing half-done here
/// matters more than going on).
fn hold<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Heal {
    /// Healing of `table`; `keep` is given each table learned.
    pub(crate) fn new(table: Arc<Table>, keep: Box<dyn Fn(&Table) + Send + Sync>) -> Heal {
        Heal::spanning(table, keep, None)
    }

    /// Healing of `table` in a world over several processes, reaching
    /// the others through `span`: process 0 decides, and only it keeps.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn across(
        table: Arc<Table>,
        keep: Box<dyn Fn(&Table) + Send + Sync>,
        span: Span,
    ) -> Heal {
        Heal::spanning(table, keep, Some(span))
    }

    fn spanning(
        table: Arc<Table>,
        keep: Box<dyn Fn(&Table) + Send + Sync>,
        span: Option<Span>,
    ) -> Heal {
        let first = Directive {
            table: table.clone(),
            explore: None,
        };
        Heal {
            notices: Arc::new(Notices {
                board: Mutex::new(Board {
                    run: 0,
                    changes: vec![(0, first)],
                    upto: AHEAD,
                    early: Vec::new(),
                }),
                decided: Condvar::new(),
            }),
            healer: Mutex::new(Healer::new(table)),
            timing: Mutex::new(Timing::default()),
            keep,
            span,
        }
    }

    /// Whether this process decides (it holds rank 0).
    fn decides(&self) -> bool {
        self.span.as_ref().is_none_or(|s| s.decides)
    }

    /// A new run of the world starts (every rank idle): its sequence
    /// numbers start at 0 under the table last decided.
    pub(crate) fn new_run(&self) {
        *hold(&self.timing) = Timing::default();
        if !self.decides() {
            // Process 0 says what this run starts with.
            let mut b = hold(&self.notices.board);
            b.run = b.run.wrapping_add(1);
            b.changes.clear();
            b.upto = 0;
            let run = b.run;
            let due: Vec<Decided> = b.early.iter().filter(|d| d.run == run).cloned().collect();
            b.early
                .retain(|d| d.run.wrapping_sub(run) < u32::MAX / 2 && d.run != run);
            for d in due {
                apply(&mut b, d);
            }
            drop(b);
            self.notices.decided.notify_all();
            return;
        }
        let mut h = hold(&self.healer);
        h.new_run();
        let table = h.table().clone();
        drop(h);
        let first = Directive {
            table,
            explore: None,
        };
        let mut b = hold(&self.notices.board);
        b.run = b.run.wrapping_add(1);
        b.changes = vec![(0, first.clone())];
        b.upto = AHEAD;
        let run = b.run;
        drop(b);
        self.tell(Decided {
            run,
            upto: AHEAD,
            changes: vec![(0, first)],
        });
    }

    /// Process 0: tells the others what it decided.
    fn tell(&self, decided: Decided) {
        if let Some(span) = &self.span {
            span.relay
                .send(decided.run, true, Note::Decided(decided).encode());
        }
    }

    /// A note from another process (`heal/span.rs`): a process's calls
    /// (process 0 merges them with its own), or process 0's decisions.
    /// Words that are no note are dropped, and said so.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    pub(crate) fn receive(&self, words: &[u8]) {
        match Note::decode(words) {
            Some(Note::Seen(calls)) if self.decides() => {
                for call in calls {
                    self.merge(call);
                }
            }
            Some(Note::Decided(d)) if !self.decides() => {
                let mut b = hold(&self.notices.board);
                if d.run == b.run {
                    apply(&mut b, d);
                } else if d.run.wrapping_sub(b.run) < u32::MAX / 2 && b.early.len() < 256 {
                    // A run process 0 started first.
                    b.early.push(d);
                }
                drop(b);
                self.notices.decided.notify_all();
            }
            _ => tracing::warn!(
                bytes = words.len(),
                "healing: a note from another process that is none this process takes; dropped"
            ),
        }
    }

    /// Process 0: one process's time of a call; once every process's
    /// is in, the call took the slowest's.
    fn merge(&self, call: SeenCall) {
        let processes = self.span.as_ref().map_or(1, |s| s.processes);
        if call.at.0 != hold(&self.notices.board).run {
            // A run left (its late batch), or one not started here.
            return;
        }
        let mut t = hold(&self.timing);
        let i = match t.merging.iter().position(|(c, _)| c.at == call.at) {
            Some(i) => i,
            None => {
                if t.merging.len() >= 64 {
                    // A call some process never finished (a failure).
                    t.merging.remove(0);
                }
                t.merging.push((call, 0));
                t.merging.len().saturating_sub(1)
            }
        };
        let Some((c, seen)) = t.merging.get_mut(i) else {
            return;
        };
        c.secs = c.secs.max(call.secs);
        *seen = seen.saturating_add(1);
        if *seen < processes {
            return;
        }
        let (c, _) = t.merging.remove(i);
        drop(t);
        hold(&self.healer).observe(c.kind, c.bytes, c.plan, c.at, c.secs);
    }

    /// The directive for collective `seq` of the current run on `rank`,
    /// and the run: rank 0 decides what is due first; the others wait for
    /// it, `patience` at most, or until `failed` says the group failed
    /// (looked at again whenever `alarm`, the group's, is raised).
    pub(crate) fn at(
        &self,
        rank: usize,
        seq: u64,
        patience: Duration,
        alarm: &Alarm,
        failed: impl Fn() -> Result<()>,
    ) -> Result<(Directive, u32)> {
        let deadline = crate::deadline::after(patience);
        let c = seq / EVERY;
        if rank == 0 {
            self.decide_upto(c.saturating_add(AHEAD));
        }
        let bell: Arc<dyn Ring> = self.notices.clone();
        let _hung = alarm.hang(&bell);
        let mut b = hold(&self.notices.board);
        while b.upto < c || b.changes.is_empty() {
            failed()?;
            let now = Instant::now();
            if now >= deadline {
                let heard = if b.changes.is_empty() {
                    "nothing of this run yet".to_string()
                } else {
                    format!("up to checkpoint {}", b.upto)
                };
                return Err(Error::Timeout {
                    rank,
                    seq,
                    what: format!(
                        "rank 0 to decide the plans of checkpoint {c} (collectives from #{}): \
                         it has decided {heard}",
                        c.saturating_mul(EVERY),
                    ),
                    after: patience,
                    flight: String::new(),
                });
            }
            // Woken by a decision, or by the alarm (its bell takes this
            // lock to ring, so no ring falls between the look and the
            // sleep).
            b = self
                .notices
                .decided
                .wait_timeout(b, deadline.saturating_duration_since(now))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let d = b
            .changes
            .iter()
            .rev()
            .find(|(from, _)| *from <= c)
            .map(|(_, d)| d.clone())
            .ok_or_else(|| {
                Error::device(
                    rank,
                    Some(seq),
                    "internal: no healing decision for the checkpoint",
                )
            })?;
        Ok((d, b.run))
    }

    /// Rank 0: decides every checkpoint up to `upto`.
    fn decide_upto(&self, upto: u64) {
        let (run, from) = {
            let b = hold(&self.notices.board);
            (b.run, b.upto)
        };
        if from >= upto {
            return;
        }
        let mut learned = None;
        let mut decisions = Vec::new();
        {
            let mut h = hold(&self.healer);
            for c in from.saturating_add(1)..=upto {
                let (d, changed) = h.decide(run, c);
                learned = changed.or(learned);
                decisions.push((c, d));
            }
        }
        let mut b = hold(&self.notices.board);
        let mut fresh = Vec::new();
        for (c, d) in decisions {
            let same = b.changes.last().is_some_and(|(_, last)| {
                Arc::ptr_eq(&last.table, &d.table)
                    && match (&last.explore, &d.explore) {
                        (None, None) => true,
                        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
                        _ => false,
                    }
            });
            if !same {
                if self.span.is_some() {
                    fresh.push((c, d.clone()));
                }
                b.changes.push((c, d));
            }
            b.upto = c;
        }
        let told = Decided {
            run: b.run,
            upto: b.upto,
            changes: fresh,
        };
        // Nobody reads a checkpoint far behind rank 0: keep the change in
        // force there and what follows.
        let old = b.upto.saturating_sub(64);
        while b.changes.get(1).is_some_and(|(from, _)| *from <= old) {
            b.changes.remove(0);
        }
        drop(b);
        self.notices.decided.notify_all();
        self.tell(told);
        if let Some(t) = learned {
            (self.keep)(&t);
        }
    }

    /// `rank`'s call of `kind` moving `bytes` ran `plan` at `at`, started
    /// at `start`, and its device has finished it. Once all `n` ranks
    /// have said so, the group's time: from its first rank's start (or
    /// the group's previous call's end, if later) to its last rank's end.
    /// Rank 0's alone would leave out the others' tails, which the next
    /// call then carries where the ranks share a device.
    #[allow(
        clippy::too_many_arguments,
        reason = "one call's facts, as the progress thread has them"
    )]
    pub(crate) fn observed(
        &self,
        n: usize,
        kind: Kind,
        bytes: usize,
        plan: Plan,
        at: At,
        start: Instant,
    ) {
        let now = Instant::now();
        // Over MPI, this process's ranks: the others time theirs.
        let n = self.span.as_ref().map_or(n, |s| s.local);
        let mut t = hold(&self.timing);
        let i = match t.calls.iter().position(|c| c.at == at) {
            Some(i) => i,
            None => {
                if t.calls.len() >= 64 {
                    // A call some rank never finished (a failure).
                    t.calls.remove(0);
                }
                t.calls.push(Call {
                    at,
                    kind,
                    bytes,
                    plan,
                    first: start,
                    last: now,
                    seen: 0,
                });
                t.calls.len().saturating_sub(1)
            }
        };
        let Some(c) = t.calls.get_mut(i) else { return };
        c.first = c.first.min(start);
        c.last = c.last.max(now);
        c.seen = c.seen.saturating_add(1);
        if c.seen < n || c.kind != kind || c.bytes != bytes || c.plan != plan {
            return;
        }
        let c = t.calls.remove(i);
        let began = t.done.map_or(c.first, |d| d.max(c.first));
        t.done = Some(t.done.map_or(c.last, |d| d.max(c.last)));
        drop(t);
        let secs = c.last.saturating_duration_since(began).as_secs_f64();
        self.seen(SeenCall {
            at,
            kind,
            bytes,
            plan,
            secs,
        });
    }

    /// This process's ranks took `seen.secs` over a call: the healer's
    /// observation in one process; over MPI, process 0's part of one, or
    /// another process's, sent to process 0 a batch at a time.
    fn seen(&self, seen: SeenCall) {
        match &self.span {
            None => {
                hold(&self.healer).observe(seen.kind, seen.bytes, seen.plan, seen.at, seen.secs)
            }
            Some(span) if span.decides => self.merge(seen),
            Some(span) => {
                // To process 0, a batch at a time.
                let mut t = hold(&self.timing);
                t.outbox.push(seen);
                if t.outbox.len() >= heal_span::BATCH {
                    let batch =
                        std::mem::replace(&mut t.outbox, Vec::with_capacity(heal_span::BATCH));
                    drop(t);
                    span.relay
                        .send(seen.at.0, false, Note::Seen(batch).encode());
                }
            }
        }
    }
}

/// One call of the group, as its ranks finish it.
struct Call {
    at: At,
    kind: Kind,
    bytes: usize,
    plan: Plan,
    /// The first rank's start and the last rank's end so far.
    first: Instant,
    last: Instant,
    /// Ranks that have finished it.
    seen: usize,
}

/// The group's calls in flight, and when its last observed call ended;
/// over MPI, process 0's calls waiting for the other processes' times
/// (with how many are in), or another process's times not yet sent.
#[derive(Default)]
struct Timing {
    calls: Vec<Call>,
    done: Option<Instant>,
    merging: Vec<(SeenCall, usize)>,
    outbox: Vec<SeenCall>,
}

/// Process 0's decisions `d`, in the board of the run they are for.
fn apply(b: &mut Board, d: Decided) {
    for (from, directive) in d.changes {
        // Changes come in order; one heard twice is not taken twice.
        if b.changes.last().is_none_or(|(last, _)| *last < from) {
            b.changes.push((from, directive));
        }
    }
    b.upto = b.upto.max(d.upto);
    let old = b.upto.saturating_sub(64);
    while b.changes.get(1).is_some_and(|(from, _)| *from <= old) {
        b.changes.remove(0);
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::arithmetic_side_effects,
    reason = "a test: small sizes, a failed expectation is a failed test"
)]
mod tests {
    use super::*;
    use crate::device::tensor::DType;
    use crate::op::ReduceOp;
    use crate::runtime::collectives::Collective;
    use crate::runtime::collectives::all_reduce::AllReduce;
    use crate::runtime::planner::{self, Tuning};

    const MIB: usize = 1 << 20;

    /// What all_reduce's plans really take here, at 64 KiB and 1 MiB:
    /// the direct kernel fastest, then the host ring, the device ring,
    /// the one-shot.
    fn truth(plan: Plan, bytes: usize) -> f64 {
        let b = bytes as f64;
        match plan {
            Plan::Direct => 1.0e-4 + 1.0e-9 * b,
            Plan::HostRing => 2.0e-4 + 2.0e-9 * b,
            Plan::DeviceRing => 4.0e-4 + 3.0e-9 * b,
            _ => 5.0e-4 + 6.0e-9 * b,
        }
    }

    /// A table of all_reduce at 64 KiB and 1 MiB, each plan costed as
    /// `costed` says.
    fn table(costed: impl Fn(Plan) -> Plan) -> Arc<Table> {
        let mut text = String::from("wgpu-collectives tuning 3\nkey test\n");
        for p in [
            Plan::Direct,
            Plan::HostRing,
            Plan::DeviceRing,
            Plan::OneShot,
        ] {
            let q = costed(p);
            text += &format!(
                "all_reduce {} 65536:{:e}~0.02 1048576:{:e}~0.02\n",
                p.name(),
                truth(q, 64 << 10),
                truth(q, MIB)
            );
        }
        text += "host-fold same-bits\nkernel-units 1\nend\n";
        Arc::new(Table::from_text(&text, None).unwrap())
    }

    /// A table that ranks all_reduce's plans backwards: the direct kernel
    /// the slowest and the one-shot the fastest.
    fn backwards() -> Arc<Table> {
        table(|p| match p {
            Plan::Direct => Plan::OneShot,
            Plan::OneShot => Plan::Direct,
            Plan::HostRing => Plan::DeviceRing,
            _ => Plan::HostRing,
        })
    }

    /// The plan of an all_reduce on `n` ranks that share a device, by
    /// `d`'s table and what it explores at call `seq`.
    fn decided(d: &Directive, what: &Collective, n: usize, seq: u64) -> Plan {
        let tuning = Tuning {
            table: Some(d.table.clone()),
            ..Tuning::for_tests()
        };
        let explore = d.prefer(Kind::AllReduce, planner::bytes_of(what), seq);
        planner::explored_for_tests(&tuning, what, n, planner::Lies::Shared(Ok(())), explore)
            .unwrap()
    }

    /// Runs `calls` all_reduce calls of `bytes` on `n` ranks that decide
    /// by `heal` (each rank in turn at each sequence number, rank 0 first
    /// as it may run ahead), rank 0 observing `took(plan, call)`; returns
    /// each rank's plan at each call.
    fn drive(
        heal: &Heal,
        n: usize,
        calls: u64,
        bytes: usize,
        took: impl Fn(Plan, u64) -> f64,
    ) -> Vec<Vec<Plan>> {
        let what: Collective = AllReduce {
            dtype: DType::F32,
            len: bytes / 4,
            op: ReduceOp::Sum,
        }
        .into();
        let mut plans = vec![Vec::new(); n];
        for seq in 0..calls {
            for (r, mine) in plans.iter_mut().enumerate() {
                let (d, run) = heal
                    .at(r, seq, Duration::from_secs(1), &Alarm::default(), || Ok(()))
                    .unwrap();
                let plan = decided(&d, &what, n, seq);
                mine.push(plan);
                if r == 0 {
                    let secs = took(plan, seq);
                    heal.healer.lock().unwrap().observe(
                        Kind::AllReduce,
                        bytes,
                        plan,
                        (run, seq),
                        secs,
                    );
                }
            }
        }
        plans
    }

    #[test]
    fn a_backwards_table_heals_and_every_rank_switches_at_the_same_call() {
        let backwards = backwards();
        let kept = Arc::new(Mutex::new(Vec::new()));
        let k = kept.clone();
        let heal = Heal::new(
            backwards,
            Box::new(move |t: &Table| k.lock().unwrap().push(t.clone())),
        );
        // A call after one of another plan carries that plan's tail (the
        // ranks sharing the device still finishing it), as on lavapipe.
        let prev = std::cell::Cell::new(None);
        let plans = drive(&heal, 4, 300, MIB, |p, _| {
            let tail = prev
                .replace(Some(p))
                .filter(|&q| q != p)
                .map_or(0.0, |q| truth(q, MIB));
            truth(p, MIB) + tail
        });
        for r in 1..4 {
            assert_eq!(plans[r], plans[0], "rank {r} chose otherwise than rank 0");
        }
        let p = &plans[0];
        assert_eq!(p[0], Plan::OneShot, "the table's choice first");
        // From the first call on which the direct kernel runs for good.
        let settled = (0..p.len())
            .rev()
            .find(|&i| p[i] != Plan::Direct)
            .map_or(0, |i| i + 1);
        assert!(
            settled <= 100,
            "settled on the direct kernel at call {settled}: {p:?}"
        );
        assert!(
            settled % EVERY as usize == 0,
            "a switch between checkpoints: {settled}"
        );
        assert!(
            !kept.lock().unwrap().is_empty(),
            "the learned table was not kept"
        );
        let learned = kept.lock().unwrap().last().unwrap().clone();
        assert_eq!(
            learned.choose(Kind::AllReduce, MIB, |_| true),
            Some(Plan::Direct)
        );
    }

    #[test]
    fn a_right_table_with_noisy_calls_switches_nothing() {
        let right = table(|p| p);
        let heal = Heal::new(right, Box::new(|_: &Table| {}));
        // +-15% on every call, one call in ten 3x slow.
        let plans = drive(&heal, 3, 400, 64 << 10, |p, seq| {
            let jitter = 1.0 + 0.3 * (((seq * 7919) % 101) as f64 / 100.0 - 0.5);
            let spike = if seq % 10 == 3 { 3.0 } else { 1.0 };
            truth(p, 64 << 10) * jitter * spike
        });
        for (r, mine) in plans.iter().enumerate() {
            assert!(
                mine.iter().all(|&p| p == Plan::Direct),
                "rank {r} ran another plan: {mine:?}"
            );
        }
    }

    /// Two processes of two ranks each: process 0 decides, the other
    /// follows what it is told; each times its own ranks' part of a call
    /// (the other process's 10% slower), and its notes reach the other
    /// at once.
    #[test]
    fn across_processes_every_rank_switches_at_the_same_call_and_only_process_0_keeps() {
        let backwards = backwards();
        let to_1: Arc<std::sync::OnceLock<Arc<Heal>>> = Arc::default();
        let to_0: Arc<std::sync::OnceLock<Arc<Heal>>> = Arc::default();
        let sent = Arc::new(Mutex::new((0usize, 0usize)));
        /// The other process's healing, as a relay: it receives what
        /// this one sends, and counts it.
        struct Across {
            decides: bool,
            to: Arc<std::sync::OnceLock<Arc<Heal>>>,
            sent: Arc<Mutex<(usize, usize)>>,
        }
        impl heal_span::Relay for Across {
            fn send(&self, _run: u32, to_all: bool, words: Vec<u8>) {
                assert_eq!(to_all, self.decides, "a note sent the wrong way");
                let mut s = self.sent.lock().unwrap();
                if self.decides {
                    s.0 += 1
                } else {
                    s.1 += 1
                }
                drop(s);
                self.to.get().unwrap().receive(&words);
            }
        }
        let span = |decides: bool, to: Arc<std::sync::OnceLock<Arc<Heal>>>| Span {
            local: 2,
            processes: 2,
            decides,
            relay: Arc::new(Across {
                decides,
                to,
                sent: sent.clone(),
            }),
        };
        let kept = Arc::new(Mutex::new((0usize, 0usize)));
        let (k0, k1) = (kept.clone(), kept.clone());
        let p0 = Arc::new(Heal::across(
            backwards.clone(),
            Box::new(move |_: &Table| k0.lock().unwrap().0 += 1),
            span(true, to_1.clone()),
        ));
        let p1 = Arc::new(Heal::across(
            backwards,
            Box::new(move |_: &Table| k1.lock().unwrap().1 += 1),
            span(false, to_0.clone()),
        ));
        to_1.set(p1.clone()).unwrap();
        to_0.set(p0.clone()).unwrap();
        // Process 0 starts the run first: its first note waits for it.
        p0.new_run();
        p1.new_run();

        let what: Collective = AllReduce {
            dtype: DType::F32,
            len: MIB / 4,
            op: ReduceOp::Sum,
        }
        .into();
        let mut plans = vec![Vec::new(); 4];
        let prev = std::cell::Cell::new(None);
        for seq in 0..300u64 {
            for (r, mine) in plans.iter_mut().enumerate() {
                let heal = if r < 2 { &p0 } else { &p1 };
                let (d, run) = heal
                    .at(r, seq, Duration::from_secs(1), &Alarm::default(), || Ok(()))
                    .unwrap();
                let plan = decided(&d, &what, 4, seq);
                mine.push(plan);
                if r == 0 || r == 2 {
                    let tail = prev
                        .replace(Some(plan))
                        .filter(|&q| q != plan)
                        .map_or(0.0, |q| truth(q, MIB));
                    let slower = if r == 2 { 1.1 } else { 1.0 };
                    heal.seen(SeenCall {
                        at: (run, seq),
                        kind: Kind::AllReduce,
                        bytes: MIB,
                        plan,
                        secs: (truth(plan, MIB) + tail) * slower,
                    });
                }
            }
        }
        for r in 1..4 {
            assert_eq!(plans[r], plans[0], "rank {r} chose otherwise than rank 0");
        }
        let p = &plans[0];
        assert_eq!(p[0], Plan::OneShot, "the table's choice first");
        let settled = (0..p.len())
            .rev()
            .find(|&i| p[i] != Plan::Direct)
            .map_or(0, |i| i + 1);
        assert!(
            settled <= 100,
            "settled on the direct kernel at call {settled}: {p:?}"
        );
        assert!(
            settled % EVERY as usize == 0,
            "a switch between checkpoints: {settled}"
        );
        let (k0, k1) = *kept.lock().unwrap();
        assert!(
            k0 > 0 && k1 == 0,
            "kept by process 0 {k0} times, by the other {k1}"
        );
        let (s0, s1) = *sent.lock().unwrap();
        // Process 0 tells each checkpoint; the other sends a batch of 8.
        assert!(
            s0 >= 300 / EVERY as usize && s1 == 300 / heal_span::BATCH,
            "{s0} {s1}"
        );
        // Junk from the wire is dropped, and nothing moves.
        p1.receive(&[2, 0, 0]);
        p0.receive(&[]);
        let (d, _) = p1
            .at(2, 299, Duration::from_secs(1), &Alarm::default(), || Ok(()))
            .unwrap();
        let plan = decided(&d, &what, 4, 299);
        assert_eq!(plan, Plan::Direct);
    }

    /// Notes that go nowhere.
    struct Nowhere;
    impl heal_span::Relay for Nowhere {
        fn send(&self, _run: u32, _to_all: bool, _words: Vec<u8>) {}
    }

    #[test]
    fn a_process_that_has_heard_nothing_of_the_run_waits_for_process_0() {
        let t = table(|p| p);
        let p1 = Heal::across(
            t,
            Box::new(|_: &Table| {}),
            Span {
                local: 1,
                processes: 2,
                decides: false,
                relay: Arc::new(Nowhere),
            },
        );
        p1.new_run();
        // Checkpoint 0 is decided in one process from the start; here,
        // only when process 0 says so.
        match p1.at(
            1,
            0,
            Duration::from_millis(30),
            &Alarm::default(),
            || Ok(()),
        ) {
            Err(Error::Timeout { what, .. }) => {
                assert!(what.contains("nothing of this run"), "{what}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_rank_ahead_of_rank_0_waits_within_its_deadline() {
        let heal = Heal::new(table(|p| p), Box::new(|_: &Table| {}));
        // Rank 1 at a checkpoint rank 0 has not decided: it waits, and
        // fails at its deadline naming what it waited for.
        let far = (AHEAD + 2) * EVERY;
        match heal.at(1, far, Duration::from_millis(30), &Alarm::default(), || {
            Ok(())
        }) {
            Err(Error::Timeout { what, .. }) => assert!(what.contains("rank 0"), "{what}"),
            other => panic!("{other:?}"),
        }
        // A failure of the group ends the wait at once.
        let deadline = Duration::from_secs(60);
        let t = Instant::now();
        let r = heal.at(1, far, deadline, &Alarm::default(), || {
            Err(Error::Aborted { rank: 1, seq: far })
        });
        assert!(matches!(r, Err(Error::Aborted { .. })));
        assert!(t.elapsed() < Duration::from_secs(5));
        // Once rank 0 gets there, the same call is answered.
        heal.at(0, far, deadline, &Alarm::default(), || Ok(()))
            .unwrap();
        assert!(
            heal.at(1, far, deadline, &Alarm::default(), || Ok(()))
                .is_ok()
        );
    }

    /// A failure that comes while a rank waits for rank 0 ends the wait
    /// when the group's alarm is raised, not at a timer's next look.
    #[test]
    fn a_failure_during_the_wait_ends_it_when_the_alarm_rings() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let heal = Heal::new(table(|p| p), Box::new(|_: &Table| {}));
        let far = (AHEAD + 2) * EVERY;
        let (alarm, failed) = (Alarm::default(), AtomicBool::new(false));
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                failed.store(true, Ordering::SeqCst);
                alarm.raise();
            });
            let r = heal.at(1, far, Duration::from_secs(60), &alarm, || {
                if failed.load(Ordering::SeqCst) {
                    Err(Error::Aborted { rank: 1, seq: far })
                } else {
                    Ok(())
                }
            });
            assert!(matches!(r, Err(Error::Aborted { .. })), "{r:?}");
        });
        assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    }
}
