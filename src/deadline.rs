//! Deadlines that never overflow.
//!
//! A caller may ask for a timeout of `Duration::MAX` to mean "as long as it
//! takes"; `Instant + Duration` panics on overflow, so every deadline in
//! the engine is made here and saturates instead: a timeout too long to
//! represent becomes the latest instant the clock can hold (a century
//! away, in practice never).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How far ahead the latest representable deadline is tried first.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `from + limit`, or the latest instant it can represent.
pub(crate) fn after_from(from: Instant, limit: Duration) -> Instant {
    from.checked_add(limit)
        .or_else(|| from.checked_add(FAR))
        .unwrap_or(from)
}

/// `now + limit`, or the latest instant it can represent.
pub(crate) fn after(limit: Duration) -> Instant {
    after_from(Instant::now(), limit)
}

/// Waits on `changed` (notified whenever the state under `guard` changes)
/// until `done` holds or `deadline` passes; gives back the guard and
/// whether `done` held. A poisoned lock is taken as it is: its state is
/// still what the last holder published. Every condition wait with a
/// deadline in the engine is this one.
pub(crate) fn wait_until<'a, T>(
    changed: &std::sync::Condvar,
    mut guard: std::sync::MutexGuard<'a, T>,
    deadline: Instant,
    mut done: impl FnMut(&mut T) -> bool,
) -> (std::sync::MutexGuard<'a, T>, bool) {
    loop {
        if done(&mut guard) {
            return (guard, true);
        }
        let now = Instant::now();
        if now >= deadline {
            return (guard, false);
        }
        guard = changed
            .wait_timeout(guard, deadline.saturating_duration_since(now))
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}

/// The backstop a caller's wait allows for a collective whose every step is
/// bounded by `timeout`: twice that and a second, saturating.
pub(crate) fn backstop(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(1))
}

/// Something a blocked wait sleeps on (a condition variable, a device's
/// signal, a channel), which a raised [`Alarm`] can wake.
pub(crate) trait Ring: Send + Sync {
    /// Wakes whoever sleeps on it; they look again at what they wait for
    /// and at the alarm. Whoever implements it for a condition variable
    /// takes the variable's lock before notifying, so that a waiter
    /// between its look and its sleep cannot miss the wake-up.
    fn ring(&self);
}

/// Raised whenever something happens that may end a wait early (a
/// failure, an abort, a rank that leaves); rings the bell of every wait
/// in progress, so that a failure reaches the waits it concerns at once
/// instead of at their next look. A wait that the event does not concern
/// looks, finds nothing for it, and sleeps again.
#[derive(Default)]
pub(crate) struct Alarm {
    raised: AtomicU64,
    /// The bells of the waits in progress (one entry per wait).
    bells: Mutex<Vec<Arc<dyn Ring>>>,
}

impl Alarm {
    /// How many times it has been raised.
    pub(crate) fn raised(&self) -> u64 {
        self.raised.load(Ordering::SeqCst)
    }

    /// Raises it: counts, then rings every bell.
    pub(crate) fn raise(&self) {
        self.raised.fetch_add(1, Ordering::SeqCst);
        for bell in self.bells().iter() {
            bell.ring();
        }
    }

    fn bells(&self) -> std::sync::MutexGuard<'_, Vec<Arc<dyn Ring>>> {
        self.bells.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hangs `bell` until the guard drops: every raise rings it. Hang it
    /// before taking the lock its ring takes, and drop the guard after
    /// letting go of that lock.
    pub(crate) fn hang(&self, bell: &Arc<dyn Ring>) -> Hung<'_> {
        self.bells().push(bell.clone());
        Hung {
            alarm: self,
            bell: bell.clone(),
        }
    }
}

/// A bell hung on an alarm, taken down when dropped.
pub(crate) struct Hung<'a> {
    alarm: &'a Alarm,
    bell: Arc<dyn Ring>,
}

impl Drop for Hung<'_> {
    fn drop(&mut self) {
        let mut bells = self.alarm.bells();
        if let Some(i) = bells.iter().position(|b| Arc::ptr_eq(b, &self.bell)) {
            bells.swap_remove(i);
        }
    }
}

/// One look of a bounded wait: how long it may sleep, and whether the
/// alarm was raised since the wait last looked at the watch.
pub(crate) struct Slice<'a> {
    pub limit: Duration,
    seen: u64,
    alarm: &'a Alarm,
}

impl Slice<'_> {
    /// Whether to stop sleeping and let the wait look at its watch again.
    /// A waiter asks after taking the state its bell rings (the lock, the
    /// device's generation) and before it sleeps.
    pub(crate) fn rung(&self) -> bool {
        self.alarm.raised() != self.seen
    }
}

/// What may end a bounded wait early, and what running out of time looks
/// like: the runtime's view of the group (a peer failed, the group was
/// aborted), seen from below through this trait, so that the transport and
/// device layers wait with deadlines and know nothing of health.
pub(crate) trait Watch {
    /// `Err` once the wait should stop.
    fn check(&self) -> crate::error::Result<()>;
    /// The error for a wait that ran `after` without `what` happening.
    fn timed_out(&self, what: String, after: Duration) -> crate::error::Error;
    /// Raised whenever `check` may have changed its answer.
    fn alarm(&self) -> &Alarm;
}

/// A bounded wait made for one collective on one rank: at most `timeout`,
/// ended at once when the watch's alarm rings and its check fails.
#[derive(Clone, Copy)]
pub(crate) struct Patience<'a> {
    pub rank: usize,
    pub seq: u64,
    pub timeout: Duration,
    pub watch: &'a dyn Watch,
}

impl Patience<'_> {
    /// Repeats `attempt` (which sleeps on `bell` at most the slice it is
    /// given, and not once the slice is rung) until it yields a value, the
    /// watch ends the wait, or the timeout passes.
    pub(crate) fn until<T>(
        &self,
        what: impl Fn() -> String,
        bell: &Arc<dyn Ring>,
        mut attempt: impl FnMut(&Slice<'_>) -> crate::error::Result<Option<T>>,
    ) -> crate::error::Result<T> {
        let start = Instant::now();
        let deadline = after_from(start, self.timeout);
        let alarm = self.watch.alarm();
        let _hung = alarm.hang(bell);
        loop {
            let seen = alarm.raised();
            if let Err(e) = self.watch.check() {
                // What is already here wins over a failure elsewhere: one
                // last look, which does not sleep (no time, and rung).
                let look = Slice {
                    limit: Duration::ZERO,
                    seen: seen.wrapping_add(1),
                    alarm,
                };
                return match attempt(&look)? {
                    Some(v) => Ok(v),
                    None => Err(e),
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self
                    .watch
                    .timed_out(what(), now.saturating_duration_since(start)));
            }
            let slice = Slice {
                limit: deadline.saturating_duration_since(now),
                seen,
                alarm,
            };
            if let Some(v) = attempt(&slice)? {
                return Ok(v);
            }
        }
    }

    /// A device error on this rank, in this collective.
    pub(crate) fn device_error(&self, what: String) -> crate::error::Error {
        crate::error::Error::device(self.rank, Some(self.seq), what)
    }
}
