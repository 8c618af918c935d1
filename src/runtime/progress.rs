//! The progress thread: runs a communicator's collectives in issue order.
//!
//! One thread per communicator per rank (NCCL's proxy thread, Gloo's
//! context) takes queued ops one at a time, agrees with its ring
//! neighbours on what runs (the fingerprint handshake), lays out the
//! working buffers each schedule needs and runs the schedule. It publishes
//! each op's outcome to its `Work`; a failure is also recorded for the
//! whole group, so that peers stop waiting at once.

use std::borrow::Cow;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crossbeam::channel::Receiver;

use crate::algo::fold::HostFold;
use crate::algo::{oneshot, p2p, pairwise, ring};
use crate::device::tensor::{DType, Tensor};
use crate::device::timestamps::Timestamps;
use crate::device::{RankDevice, Ticket, lock};
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::collective::{Collective, SplitTable};
use crate::runtime::collectives::scratch;
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::flight::State;
use crate::runtime::health::Health;
use crate::runtime::hop;
use crate::runtime::hop::{Link, Packet};
use crate::runtime::host_ring::HostSteps;
use crate::runtime::plan::Plan;
use crate::runtime::planner::{self, Tuning};
use crate::runtime::prims::Prims;
use crate::runtime::profile::Counters;
use crate::runtime::shared;
use crate::runtime::waiter::Waiter;
use crate::runtime::work_state::WorkState;
use crate::transport::{Body, Lane, Receipt, Stager, Verdict};

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
}

impl Progress {
    pub(crate) fn run(mut self, rx: Receiver<Op>) {
        let mut scratch = Scratch::default();
        // Ends when the communicator is dropped (its sender with it).
        while let Ok(op) = rx.recv() {
            op.state.start();
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
                    self.dev.on_done(
                        last,
                        Box::new(move |ok| {
                            if ok {
                                tracing::trace!(rank, seq, "device done");
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
                    self.health.fail(origin, e.clone());
                    for (fp, _) in scratch.fps.iter().zip(&scratch.done).filter(|(_, d)| !**d) {
                        self.health.flight.record(self.rank, *fp, State::Failed);
                    }
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
            self.health.check(self.rank, &it.fp)?;
            self.health
                .flight
                .record(self.rank, it.fp, State::InProgress);
            tracing::debug!(rank = self.rank, seq = it.fp.seq, call = %it.fp, "started");
            let r = self.execute(it, state, &outs[s.spans[i].clone()])?;
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
    /// the submission that last writes them.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
    )]
    fn execute(&mut self, op: &Item, state: &Arc<WorkState>, outs: &[Tensor]) -> Result<Ran> {
        let dev = self.dev.clone();
        let (n, r) = (self.size, self.rank);
        let waiter = Waiter {
            dev: &dev,
            health: &self.health,
            rank: r,
            fp: op.fp,
            timeout: self.timeout,
        };
        let p2p = op.fp.kind.point_to_point();
        let met = if let (Some(group), true) = (&self.group, n > 1 && !p2p) {
            let profiling = self.counters.enabled();
            if profiling && dev.timestamps && self.stamps.is_none() {
                self.stamps = Some(Timestamps::new(&dev)?);
            }
            let since = std::time::Instant::now();
            let outcome = shared::run(
                group,
                &waiter,
                &self.tuning,
                &op.what,
                &op.inputs,
                outs,
                profiling.then(|| self.counters.clone()),
                self.stamps.as_mut().filter(|_| profiling),
            )?;
            match outcome {
                shared::Outcome::Ran { last, table } => {
                    if profiling {
                        // The meeting: waiting for the group, and for the
                        // last rank to record and submit its steps.
                        self.counters.waited(since);
                        self.counters.collective();
                    }
                    self.planned(state, op, Plan::Direct);
                    return Ok(Ran { last, table });
                }
                // Every rank was told the same: the host schedules run it.
                shared::Outcome::Host(plan) => Some(plan),
            }
        } else {
            None
        };
        let plan = match met {
            Some(plan) => plan,
            None => {
                // Alone on its device (or a pair's hop): every rank of the
                // group chooses alike from what they share.
                let direct = (n == 1).then_some(Ok(()));
                planner::choose(&self.tuning, &op.what, n, &direct)
                    .map_err(|why| Error::invalid(r, why))?
            }
        };
        self.planned(state, op, plan);
        // Agree on what runs before moving any data: a rank that issued
        // something else (or nothing) is caught here, on every rank, even
        // when one side would have sent no bytes at all. (A point-to-point
        // call checks its one peer with its first packet.)
        if n > 1 && !p2p {
            handshake(&*self.endpoint, &waiter, n)?;
            // Ranks that share this device, each with its own progress,
            // agree that none writes bytes another touches.
            self.health.claims.check(
                &waiter.patience(),
                &op.fp,
                &op.inputs,
                outs,
                op.what.writes_output(r),
            )?;
        }
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
        let host_ring = plan == Plan::HostRing;
        let mut p = Prims {
            w: waiter,
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
        };
        // Views the schedules cannot work on where they lie are staged;
        // the ring on the host reads and writes whole words anywhere.
        let writes = op.what.writes_output(r);
        let staged = if host_ring && op.inputs.iter().chain(outs).all(Tensor::whole_words) {
            Staged::none(&op.inputs, outs)
        } else {
            Staged::new(&mut p, &dev, &op.inputs, outs, writes)?
        };
        let (ins, outs) = (&staged.ins[..], &staged.outs[..]);
        let mut table = None;
        match &op.what {
            Collective::AllReduce { op: reduce_op, .. } => {
                let (x, out) = (&ins[0], &outs[0]);
                let words = x.words();
                if host_ring {
                    all_reduce_on_host(&mut p, x, out, *reduce_op, n)?;
                } else {
                    // Out of place, the input is copied first and reduced in
                    // place. Reading it where it lies instead (a kernel writing
                    // dst = op(x, received)) saves the copy but, on CPU adapters,
                    // streams three buffers through the cache instead of two:
                    // measured slower on lavapipe, so not done.
                    if !x.same_view(out) {
                        p.copy(x.buffer(), 0, out.buffer(), 0, x.used_bytes())?;
                    }
                    p.buf = out.buffer().clone();
                    // The one-shot folds each part in the ring's order: the same bits.
                    if plan == Plan::OneShot && n > 1 && words > 0 {
                        let stride = words.div_ceil(p.align_words()) * p.align_words();
                        let all = scratch(&dev, n * stride)?;
                        oneshot::all_reduce(&mut p, all.buffer(), stride, words)?;
                    } else {
                        ring::all_reduce(&mut p, words)?;
                    }
                }
            }
            Collective::AllReduceCoalesced { .. } => all_reduce_coalesced(&mut p, &dev, ins, outs)?,
            Collective::AllGather { .. } | Collective::AllGatherCoalesced { .. } => {
                for (x, out) in ins.iter().zip(outs) {
                    all_gather(&mut p, &dev, x, out)?;
                }
            }
            Collective::ReduceScatter { .. } | Collective::ReduceScatterCoalesced { .. } => {
                for (x, out) in ins.iter().zip(outs) {
                    reduce_scatter(&mut p, &dev, x, out)?;
                }
            }
            Collective::Unit(u) => u.unit().run(plan, &mut p, &dev, ins, outs)?,
            Collective::AllToAll { send, recv, .. } => {
                let (x, out) = (&ins[0], &outs[0]);
                p.buf = x.buffer().clone();
                let elem = x.dtype().size();
                pairwise::all_to_all(
                    &mut p,
                    elem,
                    send,
                    recv,
                    x.used_bytes() as usize,
                    out.buffer(),
                    out.used_bytes() as usize,
                )?;
            }
            Collective::Send { peer, .. } => {
                let x = &ins[0];
                p.buf = x.buffer().clone();
                let copy = match self.group {
                    Some(_) => Some(scratch(&dev, x.words())?),
                    None => None,
                };
                // The first packet carries the receipt; one still here
                // after a failed send was never sent, and the send's own
                // error says why.
                p.receipt = receipt(&self.health, state, r, op.fp, *peer, &*self.endpoint);
                let sent = match copy {
                    Some(copy) => {
                        let buffer = copy.buffer().clone();
                        p2p::send_on_device(&mut p, *peer, x.words(), buffer, Box::new(copy))
                    }
                    None => p2p::send(&mut p, *peer, x.words()),
                };
                if let Some(unsent) = p.receipt.take() {
                    unsent.disarm();
                }
                sent?;
            }
            Collective::Recv { peer, .. } => {
                let out = &outs[0];
                p.buf = out.buffer().clone();
                p2p::recv(&mut p, *peer, out.words(), self.group.is_some())?;
            }
            Collective::Barrier => ring::barrier(&mut p)?,
            Collective::Split { color, key } => {
                table = Some(split_table(&mut p, *color, *key)?);
            }
        }
        staged.copy_back(&mut p, &dev)?;
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
    /// Tells the op's `Work`, the flight record and the log which plan
    /// runs `item` (a group's `Work` names its first call's).
    fn planned(&self, state: &WorkState, item: &Item, plan: Plan) {
        tracing::debug!(
            rank = self.rank,
            seq = item.fp.seq,
            plan = plan.name(),
            "planned"
        );
        state.planned(plan);
        self.health.flight.planned(self.rank, &item.fp, plan);
    }
}

/// An all-reduce as the ring on the host (`algo/fold.rs`): down once from
/// the input, the ring's steps on a host image, up once into the output
/// (no device copy of the input into the output first).
#[allow(
    clippy::arithmetic_side_effects,
    reason = "the words of a tensor whose byte size was checked when it was made"
)]
fn all_reduce_on_host(
    p: &mut Prims,
    x: &Tensor,
    out: &Tensor,
    op: ReduceOp,
    n: usize,
) -> Result<()> {
    let fold = HostFold {
        dtype: x.dtype(),
        op,
        ranks: u32::try_from(n).unwrap_or(u32::MAX),
    };
    // The image holds the ring's padded words; only the view's own bytes
    // come down and go up.
    let words = x.words();
    let bytes = usize::try_from(x.byte_len().next_multiple_of(4)).unwrap_or(usize::MAX);
    p.buf = x.buffer().clone();
    let mut image = p.download_image_at(x.word_offset(), bytes)?;
    image.resize(words * 4, 0);
    let steps = &mut HostSteps {
        p: &mut *p,
        image: &mut image,
        fold,
    };
    ring::all_reduce(steps, words)?;
    p.buf = out.buffer().clone();
    let own = image.get(..bytes).unwrap_or(&image);
    p.upload_image_at(out.word_offset(), own)?;
    p.recycle(image);
    Ok(())
}

/// A collective's tensors as its schedule sees them: views it can work on
/// where they lie (see `Tensor::direct`) as they are, others through a
/// pooled tensor, copied in before and back after.
struct Staged<'a> {
    /// The op's own tensors when none is staged (no copy of the lists).
    ins: Cow<'a, [Tensor]>,
    outs: Cow<'a, [Tensor]>,
    /// (staged, the view it stands for) of every staged output.
    back: Vec<(Tensor, Tensor)>,
}

impl<'a> Staged<'a> {
    /// The op's own tensors, as they lie.
    fn none(ins: &'a [Tensor], outs: &'a [Tensor]) -> Staged<'a> {
        Staged {
            ins: Cow::Borrowed(ins),
            outs: Cow::Borrowed(outs),
            back: Vec::new(),
        }
    }

    /// `writes`: whether the call writes its outputs on this rank (a
    /// gather's output is not touched off the root, so not staged).
    fn new(
        p: &mut Prims,
        dev: &Arc<RankDevice>,
        ins: &'a [Tensor],
        outs: &'a [Tensor],
        writes: bool,
    ) -> Result<Staged<'a>> {
        if ins.iter().chain(outs).all(Tensor::direct) {
            return Ok(Staged::none(ins, outs));
        }
        let mut back = Vec::new();
        let mut staged_outs = Vec::with_capacity(outs.len());
        for o in outs {
            if o.direct() || !writes {
                staged_outs.push(o.clone());
            } else {
                let w = Tensor::output(dev, o.dtype(), o.len())?;
                back.push((w.clone(), o.clone()));
                staged_outs.push(w);
            }
        }
        let mut staged_ins = Vec::with_capacity(ins.len());
        for x in ins {
            if x.direct() {
                staged_ins.push(x.clone());
                continue;
            }
            // In place: the input's stage is the output's.
            let w = match back.iter().find(|(_, view)| view.same_view(x)) {
                Some((w, _)) => w.clone(),
                None => Tensor::output(dev, x.dtype(), x.len())?,
            };
            // Whole words: the buffer's size and the view's offset are
            // multiples of 4 (checked when it was wrapped), so a last
            // half-word rounds up within the buffer; it lands in the
            // padding, which is never copied back.
            let bytes = x.byte_len().next_multiple_of(4);
            p.copy(x.buffer(), x.offset(), w.buffer(), 0, bytes)?;
            staged_ins.push(w);
        }
        Ok(Staged {
            ins: Cow::Owned(staged_ins),
            outs: Cow::Owned(staged_outs),
            back,
        })
    }

    /// Copies each staged output into its view, touching no byte outside it.
    fn copy_back(&self, p: &mut Prims, dev: &Arc<RankDevice>) -> Result<()> {
        for (w, view) in &self.back {
            let bytes = view.byte_len();
            let whole = bytes & !3;
            p.copy(w.buffer(), 0, view.buffer(), view.offset(), whole)?;
            if bytes % 4 != 0 {
                // A 16-bit view of odd length: its last element is the low
                // half of a word whose high half is not ours.
                let last = scratch(dev, 4)?;
                let mut enc = p.encoder();
                enc.copy_buffer_to_buffer(w.buffer(), whole, last.buffer(), 0, 4);
                let at = view.offset().saturating_add(whole);
                dev.kernels
                    .patch_half(dev, &mut enc, view.buffer(), at, last.buffer())?;
                p.submit_steps(enc)?;
            }
        }
        Ok(())
    }
}

/// The receipt a send to `peer` carries, where the receiver can tell it
/// back (a rank of this process): the send's work completes once the
/// receiver has matched it, and fails when it refuses, so a mismatch fails
/// both sides. Sends to other processes complete once posted.
fn receipt(
    health: &Arc<Health>,
    state: &Arc<WorkState>,
    rank: usize,
    fp: Fingerprint,
    peer: usize,
    link: &Link,
) -> Option<Receipt> {
    if !link.carries_loans(peer) {
        return None;
    }
    state.expect_receipt();
    let (state, health) = (state.clone(), health.clone());
    Some(Receipt::new(move |verdict| {
        state.receipt(match verdict {
            Verdict::Taken => Ok(()),
            Verdict::Refused(theirs) => Err(Error::Mismatch {
                rank,
                seq: fp.seq,
                ours: fp.to_string(),
                peer,
                theirs,
                flight: health.flight.report(),
            }),
            Verdict::Dropped => {
                Err(health
                    .check(rank, &fp)
                    .err()
                    .unwrap_or_else(|| Error::PeerFailed {
                        rank,
                        seq: fp.seq,
                        doing: fp.to_string(),
                        peer,
                        reason: "it dropped the message without receiving it".into(),
                        flight: health.flight.report(),
                    }))
            }
        })
    }))
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

/// All-gathers `x` into `out` (n x len, rank-major).
#[allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]
fn all_gather(p: &mut Prims, dev: &Arc<RankDevice>, x: &Tensor, out: &Tensor) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    let bytes = x.len() * x.dtype().size();
    if bytes == 0 {
        return Ok(());
    }
    if bytes % 4 == 0 {
        // Every segment starts on a word: gather in place in the output.
        let seg = bytes / 4;
        p.copy(
            x.buffer(),
            0,
            out.buffer(),
            (r * bytes) as u64,
            bytes as u64,
        )?;
        p.buf = out.buffer().clone();
        return ring::all_gather(p, seg);
    }
    // 16-bit elements, odd length: segments would start mid-word. Gather
    // whole-word segments in scratch, then pack them on the host.
    let seg = x.words();
    let tmp = scratch(dev, n * seg)?;
    p.copy(
        x.buffer(),
        0,
        tmp.buffer(),
        (r * seg * 4) as u64,
        (seg * 4) as u64,
    )?;
    p.buf = tmp.buffer().clone();
    ring::all_gather(p, seg)?;
    let image = p.download_image(n * seg * 4)?;
    let mut packed = Vec::with_capacity(out.used_bytes() as usize);
    for j in 0..n {
        packed.extend_from_slice(&image[j * seg * 4..j * seg * 4 + bytes]);
    }
    packed.resize(out.used_bytes() as usize, 0);
    p.buf = out.buffer().clone();
    p.upload_image(&packed)
}

/// Reduce-scatters `x` (n chunks) into `out` (this rank's chunk).
#[allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]
fn reduce_scatter(p: &mut Prims, dev: &Arc<RankDevice>, x: &Tensor, out: &Tensor) -> Result<()> {
    let (n, r) = (p.nranks, p.rank());
    let m = out.len();
    let bytes = m * x.dtype().size();
    if bytes == 0 {
        return Ok(());
    }
    if n == 1 {
        return p.copy(x.buffer(), 0, out.buffer(), 0, out.used_bytes());
    }
    // Each chunk gets an aligned slot, so the kernels can bind it where it lies.
    let chunk = out.words();
    let slot = chunk.div_ceil(p.align_words()) * p.align_words();
    let tmp = scratch(dev, n * slot)?;
    if bytes % 4 == 0 {
        for c in 0..n {
            p.copy(
                x.buffer(),
                (c * bytes) as u64,
                tmp.buffer(),
                (c * slot * 4) as u64,
                bytes as u64,
            )?;
        }
    } else {
        // 16-bit elements, odd chunk length: chunks start mid-word; cut them on the host.
        p.buf = x.buffer().clone();
        let image = p.download_image(x.used_bytes() as usize)?;
        let mut slots = vec![0u8; n * slot * 4];
        for c in 0..n {
            slots[c * slot * 4..c * slot * 4 + bytes]
                .copy_from_slice(&image[c * bytes..(c + 1) * bytes]);
        }
        p.buf = tmp.buffer().clone();
        p.upload_image(&slots)?;
    }
    p.buf = tmp.buffer().clone();
    ring::reduce_scatter(p, slot, chunk)?;
    p.copy(
        tmp.buffer(),
        (r * slot * 4) as u64,
        out.buffer(),
        0,
        out.used_bytes(),
    )
}

/// All-reduces several tensors in one ring pass over their concatenation
/// (each starting on a 16-byte unit).
#[allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]
fn all_reduce_coalesced(
    p: &mut Prims,
    dev: &Arc<RankDevice>,
    ins: &[Tensor],
    outs: &[Tensor],
) -> Result<()> {
    let total: usize = ins.iter().map(|x| x.words()).sum();
    if total == 0 {
        return Ok(());
    }
    let flat = scratch(dev, total)?;
    let mut off = 0u64;
    for x in ins {
        p.copy(x.buffer(), 0, flat.buffer(), off, x.used_bytes())?;
        off += x.used_bytes();
    }
    p.buf = flat.buffer().clone();
    ring::all_reduce(p, total)?;
    let mut off = 0u64;
    for out in outs {
        p.copy(flat.buffer(), off, out.buffer(), 0, out.used_bytes())?;
        off += out.used_bytes();
    }
    Ok(())
}

/// Every rank's (color, key), gathered around the ring on the host.
#[allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]
fn split_table(p: &mut Prims, color: Option<u32>, key: usize) -> Result<Vec<(Option<u32>, usize)>> {
    let (n, r) = (p.nranks, p.rank());
    let encode = |rank: usize, color: Option<u32>, key: usize| {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&(rank as u64).to_le_bytes());
        v.extend_from_slice(&color.map_or(u64::MAX, u64::from).to_le_bytes());
        v.extend_from_slice(&(key as u64).to_le_bytes());
        v
    };
    let word =
        |d: &[u8], i: usize| u64::from_le_bytes(d[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    let mut table = vec![(None, 0); n];
    table[r] = (color, key);
    let mut carry = encode(r, color, key);
    for _ in 1..n {
        p.post((r + 1) % n, carry)?;
        let d = p.take((r + n - 1) % n, 24)?;
        let (rank, c, k) = (word(&d, 0) as usize, word(&d, 1), word(&d, 2) as usize);
        if rank < n {
            table[rank] = (u32::try_from(c).ok(), k);
        }
        carry = d;
    }
    p.recycle(carry);
    Ok(table)
}
