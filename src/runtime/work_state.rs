//! What a `Work` and the progress thread running its collective share:
//! the collective's phase, its outputs, its plan and its sends' receipts.
//! The progress thread publishes; the `Work` (`api/work.rs`) waits on the
//! condition variable or registers a waker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::time::Instant;

use crate::device::tensor::Tensor;
use crate::device::{Ticket, lock};
use crate::error::{Error, Result};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::plan::Plan;

/// What `split` exchanges: every parent rank's (color, key), in parent rank order.
pub(crate) type SplitTable = Vec<(Option<u32>, usize)>;

#[derive(Clone)]
pub(crate) enum Phase {
    Queued,
    Running(Instant),
    /// Host steps done; the device still has to run this submission.
    Issued(Ticket),
    /// The device is done; a send's receiver has yet to match it.
    Unreceipted,
    Done,
    Failed(Error),
}

/// The outputs the progress thread hands over, unless the `Work` is gone.
#[derive(Default)]
pub(crate) struct Outputs {
    pub tensors: Vec<Tensor>,
    /// Split's table of every rank's (color, key).
    pub table: Option<SplitTable>,
    abandoned: bool,
}

/// A raised alarm (a rank returned, a peer failed) wakes a `Work`
/// waiting on this state, to look again at what it waits for: a send's
/// receiver that left will never match it.
impl crate::deadline::Ring for WorkState {
    fn ring(&self) {
        let _p = lock(&self.phase);
        self.changed.notify_all();
    }
}

/// Shared between a `Work` and the progress thread running it.
pub(crate) struct WorkState {
    pub phase: Mutex<Phase>,
    /// The sends whose receivers have yet to tell their receipts: each
    /// one's receiver and fingerprint (under the phase lock). A group's
    /// sends go to several peers, and only these can keep it waiting.
    receipts: Mutex<Vec<(usize, Fingerprint)>>,
    pub changed: Condvar,
    pub waker: Mutex<Option<Waker>>,
    pub outputs: Mutex<Outputs>,
    /// The plan it runs with (`Plan::code`), once chosen.
    plan: AtomicU64,
}

impl WorkState {
    pub(crate) fn new() -> Arc<WorkState> {
        Arc::new(WorkState {
            phase: Mutex::new(Phase::Queued),
            receipts: Mutex::new(Vec::new()),
            changed: Condvar::new(),
            waker: Mutex::new(None),
            outputs: Mutex::new(Outputs::default()),
            plan: AtomicU64::new(0),
        })
    }

    /// Hands the finished op's outputs to its `Work` (before its phase
    /// says so); dropped at once when the `Work` is gone, so that their
    /// buffers go back to the pool for the next op.
    pub(crate) fn put_outputs(&self, tensors: Vec<Tensor>, table: Option<SplitTable>) {
        let mut o = lock(&self.outputs);
        if o.abandoned {
            drop(o);
            drop(tensors);
        } else {
            o.tensors = tensors;
            o.table = table;
        }
    }

    pub(crate) fn take_outputs(&self) -> Vec<Tensor> {
        std::mem::take(&mut lock(&self.outputs).tensors)
    }

    /// The `Work` is gone: nobody will read the outputs.
    pub(crate) fn abandon(&self) {
        let mut o = lock(&self.outputs);
        o.abandoned = true;
        let tensors = std::mem::take(&mut o.tensors);
        drop(o);
        drop(tensors);
    }

    /// Moves to `p`, unless the work has already failed (a receiver may
    /// refuse a send before its host steps are done).
    fn set(&self, p: Phase) {
        let mut now = lock(&self.phase);
        if matches!(*now, Phase::Failed(_)) {
            return;
        }
        *now = p;
        drop(now);
        self.wake();
    }

    /// The planner chose `plan` (a group keeps its first call's).
    pub(crate) fn planned(&self, plan: Plan) {
        let _ = self.plan.compare_exchange(
            0,
            Plan::code(Some(plan)),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    pub(crate) fn start(&self) {
        self.set(Phase::Running(Instant::now()));
    }

    pub(crate) fn issued(&self, idx: Ticket) {
        self.set(Phase::Issued(idx));
    }

    pub(crate) fn fail(&self, e: Error) {
        self.set(Phase::Failed(e));
    }

    /// Called when the device reports the final submission done. A work
    /// with receipts still to come waits for them.
    pub(crate) fn gpu_done(&self) {
        let mut p = lock(&self.phase);
        if matches!(*p, Phase::Issued(_)) {
            *p = if !lock(&self.receipts).is_empty() {
                Phase::Unreceipted
            } else {
                Phase::Done
            };
            drop(p);
            self.wake();
        }
    }

    /// One more receipt to wait for: the send `fp` to `peer`'s (made
    /// before it is posted).
    pub(crate) fn expect_receipt(&self, peer: usize, fp: Fingerprint) {
        let _p = lock(&self.phase);
        lock(&self.receipts).push((peer, fp));
    }

    /// `peer`'s verdict on this work's send `fp`: the last one taken
    /// completes a work the device is done with; a refusal fails it.
    pub(crate) fn receipt(&self, peer: usize, fp: Fingerprint, verdict: Result<()>) {
        let mut p = lock(&self.phase);
        let left = {
            let mut r = lock(&self.receipts);
            if let Some(i) = r.iter().position(|&s| s == (peer, fp)) {
                r.swap_remove(i);
            }
            r.len()
        };
        match (verdict, &*p) {
            (_, Phase::Done | Phase::Failed(_)) => return,
            (Err(e), _) => *p = Phase::Failed(e),
            (Ok(()), Phase::Unreceipted) if left == 0 => *p = Phase::Done,
            (Ok(()), _) => return,
        }
        drop(p);
        self.wake();
    }

    fn wake(&self) {
        self.changed.notify_all();
        if let Some(w) = lock(&self.waker).take() {
            w.wake();
        }
    }

    /// A send still waiting for its receipt whose receiver `gone` says
    /// will never tell it: that receiver and the send's fingerprint. The
    /// caller holds the phase lock (`phase`), so that no receipt told
    /// before the receiver left is missed.
    pub(crate) fn unreceipted_by(
        &self,
        _phase: &std::sync::MutexGuard<'_, Phase>,
        mut gone: impl FnMut(usize) -> bool,
    ) -> Option<(usize, Fingerprint)> {
        lock(&self.receipts)
            .iter()
            .copied()
            .find(|&(peer, _)| gone(peer))
    }

    /// The plan chosen, if it has been.
    pub(crate) fn plan(&self) -> Option<Plan> {
        Plan::from_code(self.plan.load(Ordering::Acquire))
    }

    pub(crate) fn phase(&self) -> Phase {
        lock(&self.phase).clone()
    }
}
