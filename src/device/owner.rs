//! The one place that submits to a device and polls it.
//!
//! wgpu-core 30.0.2 panics when a `PollType::Wait` with a timeout expires
//! while another thread's poll retires the queue (`../WGPU-NOTES.md`): a
//! device that anyone else also polls (a user's thread, burn, a second
//! rank on the same device) must never be waited on with a timeout. So a
//! device has one owner thread, the only engine code that polls it, and
//! it only ever waits without a timeout on a submission it knows was made
//! (such a wait reads a fence at or past its target, so it cannot trip the
//! assert). Each submission made through [`Owner::submit`] gets a
//! [`Ticket`], in queue order; the owner thread waits for the oldest
//! pending one, publishes "done through t", and runs the callbacks waiting
//! for it.
//!
//! Everyone else waits on what the owner publishes, with a deadline: a
//! condition variable, woken when a submission completes, when a map
//! callback fires (whichever thread's poll ran it), or when the device
//! fails. A device that hangs leaves its owner thread blocked in the
//! driver, never a caller: their waits time out.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::deadline::wait_until;
use crate::device::lock;

/// A submission made through the owner: tickets count submissions in
/// queue order, from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket(u64);

/// What a completion callback learns: whether the work finished, or the
/// device failed first.
pub(crate) type OnDone = Box<dyn FnOnce(bool) + Send>;

/// The state the owner thread publishes.
#[derive(Default)]
struct State {
    /// Tickets handed out so far.
    issued: u64,
    /// Every ticket up to this one has completed.
    done: u64,
    /// Submissions the owner thread has not seen complete, oldest first.
    pending: VecDeque<(u64, wgpu::SubmissionIndex)>,
    /// Callbacks waiting for a ticket.
    callbacks: Vec<(u64, OnDone)>,
    /// The first error reported outside an error scope, and whether it is
    /// permanent (device lost, a failed poll) or reported once (a
    /// validation error at submit).
    fault: Option<(String, bool)>,
    stop: bool,
    /// The owner thread has returned and let go of its device handle.
    exited: bool,
}

/// Shared between the owner thread, the device's users and wgpu callbacks.
pub(crate) struct Signal {
    state: Mutex<State>,
    /// Bumped (under the state lock) by every event a waiter may be
    /// waiting for; read without it, so that a waiter's first look costs
    /// no lock.
    generation: AtomicU64,
    /// `State::done`, readable without the lock (written under it).
    done: AtomicU64,
    /// Waiters wait on this one.
    changed: Condvar,
    /// The owner thread waits on this one (a new submission, `stop`), so
    /// that a submission wakes nobody else.
    work: Condvar,
}

impl crate::deadline::Ring for Signal {
    fn ring(&self) {
        self.notify();
    }
}

impl Signal {
    /// Wakes every waiter: something they may wait for has happened (a
    /// map callback fired).
    pub(crate) fn notify(&self) {
        let s = lock(&self.state);
        self.generation.fetch_add(1, Ordering::SeqCst);
        drop(s);
        self.changed.notify_all();
    }

    /// Records a fault reported outside any error scope (first permanent one wins).
    pub(crate) fn fault(&self, msg: String, permanent: bool) {
        let mut s = lock(&self.state);
        if s.fault.as_ref().is_none_or(|(_, p)| !p) {
            s.fault = Some((msg, permanent));
        }
        self.generation.fetch_add(1, Ordering::SeqCst);
        drop(s);
        self.changed.notify_all();
    }
}

/// One device's owner: submits, and learns completions from its thread.
pub(crate) struct Owner {
    signal: Arc<Signal>,
    queue: wgpu::Queue,
    /// Held across `Queue::submit` and the ticket it gets, so that tickets
    /// follow queue order. Not the state lock: wgpu may run callbacks
    /// (which take the state lock) inside `submit`.
    submitting: Mutex<()>,
    /// The owner thread, joined on drop once it has returned.
    thread: Option<std::thread::JoinHandle<()>>,
    /// How long a drop waits for the owner thread to return.
    patience: Duration,
}

impl Owner {
    /// Starts the owner thread of `device`.
    pub(crate) fn start(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        name: String,
        patience: Duration,
    ) -> std::io::Result<Owner> {
        let signal = Arc::new(Signal {
            state: Mutex::new(State::default()),
            generation: AtomicU64::new(0),
            done: AtomicU64::new(0),
            changed: Condvar::new(),
            work: Condvar::new(),
        });
        let (s, d) = (signal.clone(), device.clone());
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            run(&d, &s);
            drop(d);
            lock(&s.state).exited = true;
            s.changed.notify_all();
        })?;
        Ok(Owner {
            signal,
            queue: queue.clone(),
            submitting: Mutex::new(()),
            thread: Some(thread),
            patience,
        })
    }

    /// For wgpu callbacks: wakes waiters when they fire.
    pub(crate) fn signal(&self) -> Arc<Signal> {
        self.signal.clone()
    }

    /// Submits `commands` on the queue; the ticket says when they are done.
    /// `failed` is asked, right after the submit and on the same thread,
    /// whether the submission failed validation (the caller's error scopes
    /// know): a failed submission never reaches the queue, so it gets no
    /// ticket and nothing ever waits on its index (wgpu refuses to wait on
    /// an index it did not return from a successful submission).
    pub(crate) fn submit(
        &self,
        commands: wgpu::CommandBuffer,
        failed: impl FnOnce() -> Option<String>,
    ) -> std::result::Result<Ticket, String> {
        let _order = lock(&self.submitting);
        let index = self.queue.submit([commands]);
        if let Some(why) = failed() {
            return Err(why);
        }
        let mut s = lock(&self.signal.state);
        s.issued = s.issued.saturating_add(1);
        let t = s.issued;
        s.pending.push_back((t, index));
        drop(s);
        self.signal.work.notify_one();
        Ok(Ticket(t))
    }

    /// Whether `t` has completed (never blocks).
    pub(crate) fn is_done(&self, t: Ticket) -> bool {
        self.signal.done.load(Ordering::Acquire) >= t.0
    }

    /// Runs `f(true)` once `t` has completed, or `f(false)` if the device
    /// fails first; at once when either has already happened. It runs on
    /// the owner thread (or the caller's): it must not block.
    pub(crate) fn on_done(&self, t: Ticket, f: OnDone) {
        let mut s = lock(&self.signal.state);
        let now = if s.done >= t.0 {
            Some(true)
        } else if s.fault.as_ref().is_some_and(|(_, p)| *p) {
            Some(false)
        } else {
            s.callbacks.push((t.0, f));
            return;
        };
        drop(s);
        if let Some(ok) = now {
            f(ok);
        }
    }

    /// Waits until `t` has completed (`Ok(true)`), `limit` has passed
    /// (`Ok(false)`) or the device has failed for good (`Err` with why).
    pub(crate) fn wait(&self, t: Ticket, limit: Duration) -> std::result::Result<bool, String> {
        self.wait_since(t, None, limit)
    }

    /// Like [`wait`](Self::wait), returning early too once anything
    /// happens after generation `seen` (see [`wait_change`](Self::wait_change)).
    pub(crate) fn wait_since(
        &self,
        t: Ticket,
        seen: Option<u64>,
        limit: Duration,
    ) -> std::result::Result<bool, String> {
        let generation = &self.signal.generation;
        let s = self.sleep_while(limit, |s| {
            s.done < t.0
                && !s.fault.as_ref().is_some_and(|(_, permanent)| *permanent)
                && seen.is_none_or(|g| generation.load(Ordering::SeqCst) == g)
        });
        if s.done >= t.0 {
            return Ok(true);
        }
        match &s.fault {
            Some((msg, true)) => Err(msg.clone()),
            _ => Ok(false),
        }
    }

    /// The current generation, to pass to [`Owner::wait_change`].
    pub(crate) fn generation(&self) -> u64 {
        self.signal.generation.load(Ordering::SeqCst)
    }

    /// Waits at most `limit` for anything to happen after generation `seen`
    /// (a completion, a map callback, a fault).
    pub(crate) fn wait_change(&self, seen: u64, limit: Duration) {
        let generation = &self.signal.generation;
        drop(self.sleep_while(limit, |_| generation.load(Ordering::SeqCst) == seen));
    }

    /// Sleeps on the waiters' condvar while `pending` holds, at most `limit`
    /// (the condvar rechecks after every wake-up); returns the state.
    fn sleep_while(
        &self,
        limit: Duration,
        pending: impl FnMut(&mut State) -> bool,
    ) -> std::sync::MutexGuard<'_, State> {
        let s = lock(&self.signal.state);
        self.signal
            .changed
            .wait_timeout_while(s, limit, pending)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0)
    }

    /// The recorded fault: `Some((message, permanent))`. A one-off fault
    /// is forgotten once read.
    pub(crate) fn take_fault(&self) -> Option<String> {
        let mut s = lock(&self.signal.state);
        match s.fault.clone() {
            None => None,
            Some((msg, true)) => Some(msg),
            Some((msg, false)) => {
                s.fault = None;
                Some(msg)
            }
        }
    }
}

impl Drop for Owner {
    /// Stops the owner thread and waits (at most the device timeout) for
    /// it to finish its last poll and drop its device handle: a detached
    /// owner still inside the driver when the process exits can race the
    /// driver's own teardown (lavapipe aborted once with a double free).
    fn drop(&mut self) {
        let deadline = crate::deadline::after(self.patience);
        let mut s = lock(&self.signal.state);
        s.stop = true;
        self.signal.work.notify_all();
        // A completion callback may hold the last handle, and run on the
        // owner thread itself: it returns once this drop does.
        let on_owner = self
            .thread
            .as_ref()
            .is_some_and(|t| t.thread().id() == std::thread::current().id());
        if on_owner {
            return;
        }
        let (s, exited) = wait_until(&self.signal.changed, s, deadline, |s| s.exited);
        if !exited {
            // Still polling a device that never finishes: leave it.
            return;
        }
        drop(s);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The owner thread: waits (without a timeout) for the oldest pending
/// submission, then publishes it and every earlier one as done.
fn run(device: &wgpu::Device, signal: &Signal) {
    loop {
        let (ticket, index) = {
            let mut s = lock(&signal.state);
            loop {
                if s.stop {
                    return;
                }
                if let Some(p) = s.pending.front() {
                    break p.clone();
                }
                s = signal.work.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        };
        let polled = device.poll(wgpu::PollType::Wait {
            submission_index: Some(index),
            timeout: None,
        });
        let mut s = lock(&signal.state);
        let ready: Vec<(u64, OnDone)>;
        let ok = match polled {
            Ok(_) => {
                s.done = s.done.max(ticket);
                signal.done.store(s.done, Ordering::Release);
                while s.pending.front().is_some_and(|(t, _)| *t <= ticket) {
                    s.pending.pop_front();
                }
                let (now, later) = std::mem::take(&mut s.callbacks)
                    .into_iter()
                    .partition(|(t, _)| *t <= ticket);
                s.callbacks = later;
                ready = now;
                true
            }
            Err(e) => {
                // The device is gone: nothing pending will complete. (A
                // submission that failed validation never gets here: it
                // has no ticket, see `Owner::submit`; a lost device's
                // submissions fail without a validation error, and their
                // index is refused here.)
                if s.fault.as_ref().is_none_or(|(_, p)| !p) {
                    s.fault = Some((format!("polling the device failed: {e}"), true));
                }
                s.pending.clear();
                ready = std::mem::take(&mut s.callbacks);
                false
            }
        };
        signal.generation.fetch_add(1, Ordering::SeqCst);
        drop(s);
        signal.changed.notify_all();
        for (_, f) in ready {
            f(ok);
        }
        if !ok {
            // Keep serving `stop`; there is nothing more to poll.
            let mut s = lock(&signal.state);
            while !s.stop {
                s = signal.work.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            return;
        }
    }
}
