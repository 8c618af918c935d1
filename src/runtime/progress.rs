//! The progress thread: runs a communicator's collectives in issue order.
//!
//! One thread per communicator per rank (NCCL's proxy thread, Gloo's
//! context) takes queued ops one at a time, agrees with its ring
//! neighbours on what runs (the fingerprint handshake), lays out the
//! working buffers each schedule needs and runs the schedule. It publishes
//! each op's outcome to its `Work`; a failure is also recorded for the
//! whole group, so that peers stop waiting at once.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crossbeam::channel::Receiver;

use crate::device::tensor::{DType, Tensor};
use crate::device::timestamps::Timestamps;
use crate::device::{RankDevice, Ticket, lock};
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::collectives::{Collective, Here, SplitTable, scratch};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::flight::State;
use crate::runtime::heal::At;
use crate::runtime::health::Health;
use crate::runtime::hop;
use crate::runtime::hop::{Link, Packet};
use crate::runtime::plan::Plan;
use crate::runtime::planner::{self, Call, For, Lies, Tuning};
use crate::runtime::prims::Prims;
use crate::runtime::profile::Counters;
use crate::runtime::shared;
use crate::runtime::stand_in::StandIns;
use crate::runtime::waiter::Waiter;
use crate::runtime::work_state::WorkState;
use crate::transport::{Body, Lane, Stager};

/// Ops queued or running on a progress thread. Waiting for it to drain
/// (a rank that departs, a run that starts) is a condition wait, not a
/// polling loop.
#[derive(Default)]
pub(crate) struct Inflight {
    count: Mutex<usize>,
    idle: Condvar,
}

impl Inflight {
    pub(crate) fn add(&self) {
        let mut c = lock(&self.count);
        *c = c.saturating_add(1);
    }

    pub(crate) fn done(&self) {
        let mut c = lock(&self.count);
        *c = c.saturating_sub(1);
        if *c == 0 {
            self.idle.notify_all();
        }
    }

    pub(crate) fn get(&self) -> usize {
        *lock(&self.count)
    }

    /// Waits until no op is queued or running, or `deadline` passes;
    /// whether it drained.
    pub(crate) fn wait_idle(&self, deadline: std::time::Instant) -> bool {
        crate::deadline::wait_until(&self.idle, lock(&self.count), deadline, |c| *c == 0).1
    }
}

/// An op's output: the caller's tensor (in place), or a new one that the
/// progress thread takes from the device's pool when the op starts. Taking
/// it then, not at the call, bounds the live outputs by what callers hold:
/// a queue of out-of-place collectives whose results are dropped (or used
/// one at a time) runs on recycled buffers instead of a fresh allocation
/// per call, each zeroed by wgpu and faulted in by the driver.
pub(crate) enum Output {
    Given(Tensor),
    New { dtype: DType, len: usize },
}

impl Output {
    /// Length and dtype.
    pub(crate) fn shape(&self) -> (usize, DType) {
        match self {
            Output::Given(t) => (t.len(), t.dtype()),
            Output::New { dtype, len } => (*len, *dtype),
        }
    }

    fn tensor(&self, dev: &Arc<RankDevice>) -> Result<Tensor> {
        match self {
            Output::Given(t) => Ok(t.clone()),
            Output::New { dtype, len } => Tensor::output(dev, *dtype, *len),
        }
    }
}

/// One call: a collective, or a send or receive.
pub(crate) struct Item {
    pub what: Collective,
    /// Derived from `what` when it was issued.
    pub fp: Fingerprint,
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<Output>,
}

/// What one `Work` stands for: one call, or the calls of a group, which
/// launch together.
pub(crate) struct Op {
    pub items: Vec<Item>,
    pub state: Arc<WorkState>,
}

/// Per-op bookkeeping, kept from op to op so that steady state allocates
/// nothing for it.
#[derive(Default)]
struct Scratch {
    /// The op's calls' fingerprints (kept after the calls are dropped).
    fps: Vec<Fingerprint>,
    /// Which calls completed.
    done: Vec<bool>,
    /// The order they run in.
    order: Vec<usize>,
    /// Each call's outputs, as a range of the op's outputs.
    spans: Vec<std::ops::Range<usize>>,
}

impl Scratch {
    /// Ready for `items`: the order a group's calls run in on this rank is
    /// sends first (they never wait for their receiver), then the
    /// collectives in call order, then the receives, so that no call of a
    /// group waits on a peer that is itself waiting for a later call of
    /// its own group.
    fn reset(&mut self, items: &[Item]) {
        self.fps.clear();
        self.fps.extend(items.iter().map(|it| it.fp));
        self.done.clear();
        self.done.resize(items.len(), false);
        self.spans.clear();
        self.order.clear();
        self.order.extend(0..items.len());
        self.order.sort_by_key(|&i| match items[i].what {
            Collective::Send { .. } => 0,
            Collective::Recv { .. } => 2,
            _ => 1,
        });
    }

    /// The first call that did not complete.
    fn failed_seq(&self) -> Option<u64> {
        self.fps
            .iter()
            .zip(&self.done)
            .find(|(_, d)| !**d)
            .map(|(fp, _)| fp.seq)
    }
}

/// What running an op leaves: the submission that last writes its
/// outputs, and split's table.
struct Ran {
    last: Ticket,
    table: Option<SplitTable>,
}

/// The progress thread's state: everything it needs, nothing shared with
/// callers except through the op queue, `Health` and `WorkState`.
pub(crate) struct Progress {
    pub rank: usize,
    pub size: usize,
    pub dev: Arc<RankDevice>,
    pub endpoint: Arc<Link>,
    pub health: Arc<Health>,
    pub stage: Stager,
    pub timeout: Duration,
    pub inflight: Arc<Inflight>,
    pub counters: Arc<Counters>,
    pub tuning: Tuning,
    /// Made on first use once profiling is on, on adapters with timestamps.
    pub stamps: Option<Timestamps>,
    /// Where the group meets when all its ranks share one device.
    pub group: Option<Arc<shared::Group>>,
    /// This rank's last call, for healing to time: its kind, bytes, plan,
    /// place in the run and start.
    pub watch: Option<(
        crate::runtime::fingerprint::Kind,
        usize,
        Plan,
        At,
        std::time::Instant,
    )>,
}

/// A call healing will time: its kind, bytes and place in the run.
type Watching = (crate::runtime::fingerprint::Kind, usize, At);

impl Progress {
    pub(crate) fn run(mut self, rx: Receiver<Op>) {
        let mut scratch = Scratch::default();
        // Ends when the communicator is dropped (its sender with it).
        while let Ok(op) = rx.recv() {
            op.state.start();
            self.watch = None;
            scratch.reset(&op.items);
            let mut outs = Vec::with_capacity(op.items.iter().map(|it| it.outputs.len()).sum());
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.launch(&op.items, &op.state, &mut outs, &mut scratch)
            }))
            .unwrap_or_else(|p| {
                Err(Error::device(
                    self.rank,
                    scratch.failed_seq(),
                    format!("internal error: {}", crate::error::panic_message(&p)),
                ))
            });
            // Let go of the tensors before anyone hears the op is done: a
            // caller that then drops its output must find it back in the
            // pool, not still held here (nor in the state, once its Work is gone).
            let Op { items, state } = op;
            drop(items);
            match result {
                Ok(Ran { last, table }) => {
                    for fp in &scratch.fps {
                        tracing::debug!(rank = self.rank, seq = fp.seq, "host steps done");
                        self.health.flight.record(self.rank, *fp, State::Completed);
                    }
                    state.put_outputs(outs, table);
                    state.issued(last);
                    // Wakes futures and waiters once the device has run it.
                    let seq = scratch.fps.first().map(|fp| fp.seq);
                    let (done, dev, rank) = (state.clone(), self.dev.clone(), self.rank);
                    let size = self.size;
                    // One call's time, for healing (a group's is no one call's).
                    let watch = self
                        .watch
                        .take()
                        .filter(|_| scratch.fps.len() == 1)
                        .zip(self.tuning.heal.clone());
                    self.dev.on_done(
                        last,
                        Box::new(move |ok| {
                            if ok {
                                tracing::trace!(rank, seq, "device done");
                                if let Some(((kind, bytes, plan, at, start), heal)) = watch {
                                    heal.observed(size, kind, bytes, plan, at, start);
                                }
                                done.gpu_done();
                            } else {
                                let why = dev.check(seq).err().unwrap_or_else(|| {
                                    Error::device(rank, seq, "the device failed")
                                });
                                done.fail(why);
                            }
                        }),
                    );
                }
                Err(e) => {
                    let seq = scratch.failed_seq();
                    tracing::debug!(rank = self.rank, seq, error = %e, "failed");
                    drop(outs);
                    // The schedule is broken for everyone: make peers fail now, not at their timeout.
                    let origin = match &e {
                        Error::PeerFailed { peer, .. } => *peer,
                        _ => self.rank,
                    };
                    self.health.failed_at(self.rank, seq, origin, e.clone());
                    for (fp, _) in scratch.fps.iter().zip(&scratch.done).filter(|(_, d)| !**d) {
                        self.health.flight.record(self.rank, *fp, State::Failed);
                    }
                    // The record the caller reads says this call failed.
                    let e = e.with_flight(self.health.flight.report());
                    self.stage.clear();
                    state.fail(e);
                }
            }
            self.inflight.done();
        }
    }

    /// Runs an op's calls in launch order, their outputs (made here) in
    /// `outs`; `s.done` says which completed, should one fail. Returns the
    /// submission that last writes an output.
    fn launch(
        &mut self,
        items: &[Item],
        state: &Arc<WorkState>,
        outs: &mut Vec<Tensor>,
        s: &mut Scratch,
    ) -> Result<Ran> {
        let dev = self.dev.clone();
        for it in items {
            let start = outs.len();
            for o in &it.outputs {
                outs.push(o.tensor(&dev)?);
            }
            s.spans.push(start..outs.len());
        }
        let (mut last, mut table) = (None, None);
        for k in 0..s.order.len() {
            let i = s.order[k];
            let it = &items[i];
            // Where the ranks lie apart, a forced plan is decided before
            // the rank looks for a peer's failure: one that cannot run is
            // refused by every rank itself, none reporting a peer's
            // refusal instead. (Where they meet, the meeting decides.)
            let early = if !self.meets(it) && self.tuning.forces(&it.what) {
                Some(self.decide(it, None)?)
            } else {
                None
            };
            self.health.check(self.rank, &it.fp)?;
            self.health
                .flight
                .record(self.rank, it.fp, State::InProgress);
            tracing::debug!(rank = self.rank, seq = it.fp.seq, call = %it.fp, "started");
            let r = self.execute(it, early, state, &outs[s.spans[i].clone()])?;
            self.health
                .flight
                .record(self.rank, it.fp, State::Completed);
            last = last.max(Some(r.last));
            table = table.or(r.table);
            s.done[i] = true;
        }
        let last = match last {
            Some(t) => t,
            // An empty group still completes in stream order.
            None => dev.submit(dev.encoder(), None)?,
        };
        Ok(Ran { last, table })
    }

    /// Runs one collective into `outs` (its outputs, made here); returns
    /// the last submission of its schedule. Its steps, each once: where
    /// healing is on, the checkpoint the group plans by; the decision (at
    /// the meeting, which also runs a direct plan, where the ranks share a
    /// device; by this rank alone elsewhere); where the ranks lie apart,
    /// the agreement on what runs; the schedule.
    fn execute(
        &mut self,
        op: &Item,
        early: Option<Plan>,
        state: &Arc<WorkState>,
        outs: &[Tensor],
    ) -> Result<Ran> {
        let since = std::time::Instant::now();
        let (explore, watching) = self.checkpoint(op)?;
        let plan = match (self.group.clone(), self.meets(op)) {
            (Some(group), true) => match self.meet(&group, op, explore, outs)? {
                shared::Outcome::Ran { last, table } => {
                    self.planned(state, op, Plan::Direct);
                    self.watch = watching.map(|(k, b, at)| (k, b, Plan::Direct, at, since));
                    return Ok(Ran { last, table });
                }
                // Every rank was told the same: the host schedules run it.
                shared::Outcome::Host(plan) => plan,
            },
            _ => {
                // Alone on its device (or a pair's hop): every rank of
                // the group chooses alike from what they share.
                let plan = match early {
                    Some(plan) => plan,
                    None => self.decide(op, explore)?,
                };
                self.agree(op, outs)?;
                plan
            }
        };
        self.planned(state, op, plan);
        self.watch = watching.map(|(k, b, at)| (k, b, plan, at, since));
        self.schedule(op, plan, state, outs)
    }

    /// The waiter for `fp`'s waits on this rank.
    fn waiter<'a>(
        dev: &'a RankDevice,
        health: &'a Health,
        (rank, fp, timeout): (usize, Fingerprint, Duration),
    ) -> Waiter<'a> {
        Waiter {
            dev,
            health,
            rank,
            fp,
            timeout,
        }
    }

    /// Where the table heals: the checkpoint every rank decides by at this
    /// call (rank 0's, waited for), made this rank's table; the plan
    /// healing explores here, and what to time the call as.
    fn checkpoint(&mut self, op: &Item) -> Result<(Option<Plan>, Option<Watching>)> {
        let (n, r) = (self.size, self.rank);
        let Some(heal) = self.tuning.heal.clone() else {
            return Ok((None, None));
        };
        if n <= 1 || op.fp.kind.point_to_point() {
            return Ok((None, None));
        }
        let health = &self.health;
        let waiter = Self::waiter(&self.dev, health, (r, op.fp, self.timeout));
        let (d, run) = heal.at(r, op.fp.seq, self.timeout, &health.alarm, || {
            health.check(r, &op.fp)?;
            if health.is_gone(0) {
                return Err(waiter.peer_failed(
                    0,
                    "rank 0, which decides the plans the group runs, returned from its closure"
                        .into(),
                ));
            }
            Ok(())
        })?;
        if !self
            .tuning
            .table
            .as_ref()
            .is_some_and(|t| Arc::ptr_eq(t, &d.table))
        {
            self.tuning.table = Some(d.table.clone());
        }
        let bytes = planner::bytes_of(&op.what);
        let explore = d.prefer(op.fp.kind, bytes, op.fp.seq);
        Ok((explore, bytes.map(|b| (op.fp.kind, b, (run, op.fp.seq)))))
    }

    /// The group's meeting, where every rank shares this device: it checks
    /// every rank's call, decides once for all and runs a direct plan.
    fn meet(
        &mut self,
        group: &Arc<shared::Group>,
        op: &Item,
        explore: Option<Plan>,
        outs: &[Tensor],
    ) -> Result<shared::Outcome> {
        let dev = self.dev.clone();
        let profiling = self.counters.enabled();
        if profiling && dev.timestamps && self.stamps.is_none() {
            self.stamps = Some(Timestamps::new(&dev)?);
        }
        let waiter = Self::waiter(&dev, &self.health, (self.rank, op.fp, self.timeout));
        let since = std::time::Instant::now();
        let outcome = shared::run(
            group,
            &waiter,
            &self.tuning,
            explore,
            &op.what,
            &op.inputs,
            outs,
            profiling.then(|| self.counters.clone()),
            self.stamps.as_mut().filter(|_| profiling),
        )?;
        if profiling && matches!(outcome, shared::Outcome::Ran { .. }) {
            // The meeting: waiting for the group, and for the last rank
            // to record and submit its steps.
            self.counters.waited(since);
            self.counters.collective();
        }
        Ok(outcome)
    }

    /// Ranks apart agree on what runs before moving any data: a rank that
    /// issued something else (or nothing) is caught here, on every rank,
    /// even when one side would have sent no bytes at all. (A
    /// point-to-point call checks its one peer with its first packet; a
    /// group that met checked every rank's call, and that no rank writes
    /// bytes another touches, at its meeting.)
    fn agree(&self, op: &Item, outs: &[Tensor]) -> Result<()> {
        let (n, r) = (self.size, self.rank);
        if n <= 1 || op.fp.kind.point_to_point() {
            return Ok(());
        }
        let waiter = Self::waiter(&self.dev, &self.health, (r, op.fp, self.timeout));
        handshake(&*self.endpoint, &waiter, n)?;
        // Ranks that share this device, each with its own progress, agree
        // that none writes bytes another touches.
        self.health.claims.check(
            &waiter.patience(),
            &op.fp,
            &op.inputs,
            outs,
            op.what.writes_output(r),
        )
    }

    /// Runs `plan`'s schedule for `op` on this rank's steps: its kernels,
    /// its views staged where the steps cannot use them where they lie.
    fn schedule(
        &mut self,
        op: &Item,
        plan: Plan,
        state: &Arc<WorkState>,
        outs: &[Tensor],
    ) -> Result<Ran> {
        let dev = self.dev.clone();
        let (n, r) = (self.size, self.rank);
        let p2p = op.fp.kind.point_to_point();
        let (reduce, finish) = match (op.what.op(), op.what.dtype()) {
            (Some(o), Some(dtype)) if n > 1 => {
                let divisor = if o == ReduceOp::Avg { n as u32 } else { 0 };
                (
                    Some(dev.kernels.reducer(&dev, dtype, o, 0)?),
                    Some(dev.kernels.reducer(&dev, dtype, o, divisor)?),
                )
            }
            _ => (None, None),
        };
        let first = dev.submit(dev.encoder(), Some(op.fp.seq))?;
        self.stage.rewind();
        let profiling = self.counters.enabled();
        if profiling && dev.timestamps && self.stamps.is_none() {
            self.stamps = Some(Timestamps::new(&dev)?);
        }
        // Barrier and split move no tensor; their schedules still want a buffer.
        let spare;
        let buf = match outs.first().or(op.inputs.first()) {
            Some(t) => t.buffer().clone(),
            None => {
                spare = scratch(&dev, 4)?;
                spare.buffer().clone()
            }
        };
        let mut p = Prims {
            w: Self::waiter(&dev, &self.health, (r, op.fp, self.timeout)),
            link: &*self.endpoint,
            lane: if p2p {
                Lane::PointToPoint
            } else {
                Lane::Collective
            },
            stage: &mut self.stage,
            buf,
            reduce,
            finish,
            nranks: n,
            last: None,
            prof: profiling.then_some(&*self.counters),
            stamps: if profiling {
                self.stamps.as_mut()
            } else {
                None
            },
            receipt: None,
            ring: None,
        };
        // Views the schedules cannot work on where they lie are staged,
        // unless the plan's steps work on whole words anywhere.
        let unit = op.what.unit();
        let writes = op.what.writes_output(r);
        let staged = if unit.any_view(plan) && op.inputs.iter().chain(outs).all(Tensor::whole_words)
        {
            StandIns::none(&op.inputs, outs)
        } else {
            StandIns::new(&mut p, &op.inputs, outs, writes)?
        };
        let here = Here {
            dev: &dev,
            ins: &staged.ins,
            outs: &staged.outs,
            state,
            health: &self.health,
            shared: self.group.is_some(),
            tier: self.tuning.tier.as_deref(),
        };
        let table = unit.run(plan, &mut p, &here)?;
        staged.copy_back(&mut p)?;
        let last = p.last.unwrap_or(first);
        let ran = Ran { last, table };
        if profiling {
            if let Some(ts) = self.stamps.as_mut() {
                self.counters.kernel_ns(ts.collect(&dev, op.fp.seq)?);
            }
            self.counters.collective();
        }
        Ok(ran)
    }
}

impl Progress {
    /// Whether `item` is decided and run at its group's meeting: a
    /// collective of ranks that all share this device.
    fn meets(&self, item: &Item) -> bool {
        self.group.is_some() && self.size > 1 && !item.fp.kind.point_to_point()
    }

    /// The call's one decision, where this rank decides its own plan
    /// (alone on its device, or a pair's hop; see `planner::decide`), with
    /// healing exploring `explore`.
    fn decide(&self, item: &Item, explore: Option<Plan>) -> Result<Plan> {
        let n = self.size;
        let call = Call {
            what: &item.what,
            n,
            lies: if n == 1 {
                Lies::Shared(Ok(()))
            } else {
                Lies::Apart
            },
            explore,
        };
        let whom = For {
            flight: &self.health.flight,
            fp: &item.fp,
            ranks: self.rank..self.rank.saturating_add(1),
        };
        planner::decide(&self.tuning, &call, whom).map_err(|why| Error::invalid(self.rank, why))
    }

    /// Tells the op's `Work` and the log which plan runs `item` (a
    /// group's `Work` names its first call's; the flight record heard it
    /// from the decision).
    fn planned(&self, state: &WorkState, item: &Item, plan: Plan) {
        tracing::debug!(
            rank = self.rank,
            seq = item.fp.seq,
            plan = plan.name(),
            "planned"
        );
        state.planned(plan);
    }
}

/// Sends this rank's fingerprint to the next rank of the ring and checks
/// the previous rank's against it.
#[allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]
fn handshake(link: &Link, w: &Waiter, n: usize) -> Result<()> {
    let data = link.buffer();
    let token = Packet {
        fp: w.fp,
        from: w.rank,
        body: Body::Bytes(data),
        receipt: None,
    };
    hop::post(link, (w.rank + 1) % n, Lane::Collective, token, w)?;
    let p = hop::take(link, (w.rank + n - 1) % n, Lane::Collective, 0, w)?;
    hop::recycle(link, p);
    Ok(())
}
