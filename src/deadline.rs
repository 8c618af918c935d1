//! Deadlines that never overflow.
//!
//! A caller may ask for a timeout of `Duration::MAX` to mean "as long as it
//! takes"; `Instant + Duration` panics on overflow, so every deadline in
//! the engine is made here and saturates instead: a timeout too long to
//! represent becomes the latest instant the clock can hold (a century
//! away, in practice never).

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

/// How long one slice of a bounded wait lasts before [`Watch::check`] is
/// asked again.
pub(crate) const TICK: Duration = Duration::from_millis(20);

/// What may end a bounded wait early, and what running out of time looks
/// like: the runtime's view of the group (a peer failed, the group was
/// aborted), seen from below through this trait, so that the transport and
/// device layers wait with deadlines and know nothing of health.
pub(crate) trait Watch {
    /// `Err` once the wait should stop.
    fn check(&self) -> crate::error::Result<()>;
    /// The error for a wait that ran `after` without `what` happening.
    fn timed_out(&self, what: String, after: Duration) -> crate::error::Error;
}

/// A bounded wait made for one collective on one rank: at most `timeout`,
/// in ticks, each followed by the watch's check.
#[derive(Clone, Copy)]
pub(crate) struct Patience<'a> {
    pub rank: usize,
    pub seq: u64,
    pub timeout: Duration,
    pub watch: &'a dyn Watch,
}

impl Patience<'_> {
    /// Repeats `attempt` (which may block at most the slice it is given)
    /// until it yields a value, the watch ends the wait, or the timeout
    /// passes.
    pub(crate) fn until<T>(
        &self,
        what: impl Fn() -> String,
        mut attempt: impl FnMut(Duration) -> crate::error::Result<Option<T>>,
    ) -> crate::error::Result<T> {
        let start = Instant::now();
        let deadline = after_from(start, self.timeout);
        loop {
            self.watch.check()?;
            let now = Instant::now();
            if now >= deadline {
                return Err(self
                    .watch
                    .timed_out(what(), now.saturating_duration_since(start)));
            }
            if let Some(v) = attempt(deadline.saturating_duration_since(now).min(TICK))? {
                return Ok(v);
            }
        }
    }

    /// A device error on this rank, in this collective.
    pub(crate) fn device_error(&self, what: String) -> crate::error::Error {
        crate::error::Error::device(self.rank, Some(self.seq), what)
    }
}
