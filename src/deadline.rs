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

/// The backstop a caller's wait allows for a collective whose every step is
/// bounded by `timeout`: twice that and a second, saturating.
pub(crate) fn backstop(timeout: Duration) -> Duration {
    timeout
        .saturating_mul(2)
        .saturating_add(Duration::from_secs(1))
}
