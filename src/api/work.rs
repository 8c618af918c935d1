//! `Work`: the handle a collective returns at once.
//!
//! A collective is finished when two things have happened: the progress
//! thread has run its host-side steps (receives, sends), and the device has
//! executed the last submission that writes the output. The first is a
//! state the progress thread publishes; the second is a fence, which the
//! device's owner (`device/owner.rs`) reports, so waiting on a `Work` is a
//! condition-variable wait, then a wait for the owner to report the fence.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::device::tensor::Tensor;
use crate::device::{RankDevice, Ticket, lock};
use crate::error::{Error, Result};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::health::Health;
use crate::runtime::plan::Plan;
use crate::runtime::work_state::SplitTable;
use crate::runtime::work_state::{Phase, WorkState};

/// An asynchronous collective in flight: wait on it (or `.await` it) to get
/// its output.
///
/// Dropping a `Work` does not cancel the collective: it still completes, so
/// peers never hang on a rank that lost interest.
#[must_use = "a collective's result is only safe to read after waiting on its Work"]
pub struct Work {
    state: Arc<WorkState>,
    /// Length and dtype of the first output.
    shape: (usize, crate::dtype::DType),
    dev: Arc<RankDevice>,
    health: Arc<Health>,
    fp: Fingerprint,
    rank: usize,
    timeout: Duration,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Work(rank {}, {})", self.rank, self.fp)
    }
}

impl Work {
    pub(crate) fn new(
        state: Arc<WorkState>,
        shape: (usize, crate::dtype::DType),
        dev: Arc<RankDevice>,
        health: Arc<Health>,
        fp: Fingerprint,
        rank: usize,
        timeout: Duration,
    ) -> Work {
        Work {
            state,
            shape,
            dev,
            health,
            fp,
            rank,
            timeout,
        }
    }

    /// Waits for the collective and returns its output (the first, for a
    /// coalesced call: [`wait_all`](Self::wait_all) gives them all).
    ///
    /// Each phase is bounded by the world's timeout: the host steps from
    /// when they start (time spent queued behind earlier collectives does
    /// not count; those have their own bounds), then the device fence.
    pub fn wait(self) -> Result<Tensor> {
        self.finish(None)?;
        self.first()
    }

    /// Like [`wait`](Self::wait), but gives up after `limit` from now with
    /// [`Error::Timeout`].
    pub fn wait_timeout(self, limit: Duration) -> Result<Tensor> {
        self.finish(Some(crate::deadline::after(limit)))?;
        self.first()
    }

    /// Waits for a collective with several outputs (a coalesced call) and
    /// returns them in order.
    pub fn wait_all(self) -> Result<Vec<Tensor>> {
        self.finish(None)?;
        Ok(self.state.take_outputs())
    }

    /// Waits for the call and returns the plan it ran, as `plan` names it.
    #[cfg(test)]
    pub(crate) fn wait_plan(self) -> Result<Option<Plan>> {
        self.finish(None)?;
        Ok(self.plan())
    }

    /// Waits for a split and returns its table of every rank's (color, key).
    pub(crate) fn wait_split(self) -> Result<SplitTable> {
        self.finish(None)?;
        lock(&self.state.outputs).table.take().ok_or_else(|| {
            Error::device(
                self.rank,
                Some(self.fp.seq),
                format!("{} finished without the table of colors", self.fp),
            )
        })
    }

    /// Length of the first output, known without waiting (for async tensors).
    pub fn len(&self) -> usize {
        self.shape.0
    }

    /// Whether the first output is empty (known without waiting).
    pub fn is_empty(&self) -> bool {
        self.shape.0 == 0
    }

    /// Element type of the first output, known without waiting.
    pub fn dtype(&self) -> crate::dtype::DType {
        self.shape.1
    }

    /// The collective's sequence number in its communicator.
    pub(crate) fn seq(&self) -> u64 {
        self.fp.seq
    }

    /// The plan the collective runs with, once the progress thread has
    /// chosen it (before any byte moves); `None` while it waits behind
    /// earlier collectives, for a call that failed before a plan was
    /// chosen, and for an empty group. A group's `Work` names its first
    /// call's plan. Never blocks; after `wait`, the flight record
    /// ([`Communicator::flight_record`](crate::Communicator::flight_record))
    /// keeps each call's plan.
    pub fn plan(&self) -> Option<Plan> {
        self.state.plan()
    }

    /// Whether the collective has finished (successfully or not). Never blocks.
    pub fn is_completed(&self) -> bool {
        match self.state.phase() {
            Phase::Done | Phase::Failed(_) => true,
            Phase::Issued(t) => self.gpu_finished(t),
            Phase::Queued | Phase::Running(_) | Phase::Unreceipted => false,
        }
    }

    /// The first output; a call with none (an empty group) gives an empty
    /// tensor, as a send does.
    fn first(&self) -> Result<Tensor> {
        let mut outs = self.state.take_outputs();
        if outs.is_empty() {
            return Tensor::output(&self.dev, self.shape.1, 0);
        }
        Ok(outs.swap_remove(0))
    }

    /// Whether the work is finished now that the device may be done with `t`.
    fn gpu_finished(&self, t: Ticket) -> bool {
        if !self.dev.is_done(t) {
            return false;
        }
        self.state.gpu_done();
        matches!(self.state.phase(), Phase::Done | Phase::Failed(_))
    }

    fn timeout_error(&self, what: &str, after: Duration) -> Error {
        Error::Timeout {
            rank: self.rank,
            seq: self.fp.seq,
            what: format!("{what} of {}", self.fp),
            after,
            flight: self.health.flight.report(),
        }
    }

    fn finish(&self, deadline: Option<Instant>) -> Result<()> {
        let start = Instant::now();
        // A send waiting for its receiver hangs a bell on the group's
        // alarm, which every departure and failure raises: taken before
        // the phase lock, which the bell takes to ring.
        let alarm = &self.health.alarm;
        let bell: Arc<dyn crate::deadline::Ring> = self.state.clone();
        let mut hung = None;
        let mut phase = lock(&self.state.phase);
        loop {
            let seen = alarm.raised();
            let now = Instant::now();
            let limit = match (&*phase, deadline) {
                (Phase::Done, _) => return Ok(()),
                (Phase::Failed(e), _) => return Err(e.clone()),
                (Phase::Issued(t), _) => {
                    let t = *t;
                    drop(phase);
                    let limit = deadline.map_or(self.timeout, |d| d.saturating_duration_since(now));
                    if !self.dev.poll_for(t, limit, Some(self.fp.seq))? {
                        return Err(
                            self.timeout_error("the device to finish the output", start.elapsed())
                        );
                    }
                    self.state.gpu_done();
                    phase = lock(&self.state.phase);
                    continue;
                }
                (_, Some(d)) => d,
                // A send waits for its receiver to match it, as long as
                // any wait for a peer.
                (Phase::Unreceipted, None) => crate::deadline::after_from(start, self.timeout),
                // Bounded by the progress thread's own per-wait timeouts;
                // this is a backstop should it ever stop publishing.
                (Phase::Running(since), None) => {
                    crate::deadline::after_from(*since, crate::deadline::backstop(self.timeout))
                }
                (Phase::Queued, None) => {
                    crate::deadline::after_from(now, crate::deadline::backstop(self.timeout))
                }
            };
            let unreceipted = matches!(*phase, Phase::Unreceipted);
            if unreceipted && hung.is_none() {
                drop(phase);
                hung = Some(alarm.hang(&bell));
                phase = lock(&self.state.phase);
                continue;
            }
            // A receiver that returned from its closure will never match
            // a send to it: fail now, not at the deadline. Only the sends
            // not yet matched count (a group's other peers may be gone
            // with everything they owed it received).
            let stranded = if unreceipted {
                self.state
                    .unreceipted_by(&phase, |peer| self.health.is_gone(peer))
            } else {
                None
            };
            if let Some((peer, send)) = stranded {
                self.health.check(self.rank, &send)?;
                return Err(Error::PeerFailed {
                    rank: self.rank,
                    seq: send.seq,
                    doing: send.to_string(),
                    peer,
                    reason: format!(
                        "rank {peer} returned from its closure without receiving {send}"
                    ),
                    flight: self.health.flight.report(),
                });
            }
            if now >= limit {
                let what = if unreceipted {
                    "the receiver to match the send"
                } else {
                    "the collective's host steps"
                };
                return Err(self.timeout_error(what, start.elapsed()));
            }
            // Until the phase moves on, the limit passes (checked above),
            // or, for a send, the alarm rings: its receiver may have left.
            let was = std::mem::discriminant(&*phase);
            phase = crate::deadline::wait_until(&self.state.changed, phase, limit, |p| {
                std::mem::discriminant(p) != was || (unreceipted && alarm.raised() != seen)
            })
            .0;
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.state.abandon();
    }
}

/// Awaiting a `Work` gives its output (the first, for a coalesced call;
/// use [`Work::wait_all`] for all of them).
impl Future for Work {
    type Output = Result<Tensor>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // Register first, so a transition between the check and the
        // registration still wakes us.
        *lock(&this.state.waker) = Some(cx.waker().clone());
        let ready = match this.state.phase() {
            Phase::Done => true,
            Phase::Failed(e) => return Poll::Ready(Err(e)),
            Phase::Issued(t) => {
                let finished = this.gpu_finished(t);
                if let Phase::Failed(e) = this.state.phase() {
                    return Poll::Ready(Err(e));
                }
                finished
            }
            Phase::Queued | Phase::Running(_) | Phase::Unreceipted => false,
        };
        if !ready {
            return Poll::Pending;
        }
        let first = lock(&this.state.outputs).tensors.first().cloned();
        match first {
            Some(t) => Poll::Ready(Ok(t)),
            // An empty group: an empty tensor, as `wait` gives.
            None => Poll::Ready(Tensor::output(&this.dev, this.shape.1, 0)),
        }
    }
}
