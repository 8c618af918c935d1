//! Blocking waits made on behalf of one collective on one rank, bounded
//! by the timeout and ended early by the group's health.

use std::sync::Arc;
use std::time::Duration;

use crate::deadline::{Alarm, Patience, Ring, Slice, Watch};
use crate::device::RankDevice;
use crate::error::{Error, Result};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::health::Health;

/// Blocking waits made on behalf of one collective on one rank: each lasts
/// at most the configured timeout, and gives up as soon as a peer fails
/// (the group's alarm wakes it).
pub(crate) struct Waiter<'a> {
    pub dev: &'a RankDevice,
    pub health: &'a Health,
    /// This rank in the communicator.
    pub rank: usize,
    pub fp: Fingerprint,
    pub timeout: Duration,
}

impl Waiter<'_> {
    /// The same waits, as the layers below see them (see `deadline::Watch`).
    pub(crate) fn patience(&self) -> Patience<'_> {
        Patience {
            rank: self.rank,
            seq: self.fp.seq,
            timeout: self.timeout,
            watch: self,
        }
    }

    /// Repeats `attempt` until it yields, see [`Patience::until`].
    pub(crate) fn until<T>(
        &self,
        what: impl Fn() -> String,
        bell: &Arc<dyn Ring>,
        attempt: impl FnMut(&Slice<'_>) -> Result<Option<T>>,
    ) -> Result<T> {
        self.patience().until(what, bell, attempt)
    }

    pub(crate) fn device_error(&self, what: String) -> Error {
        Error::device(self.rank, Some(self.fp.seq), what)
    }

    /// `peer` failed this collective first, because of `reason`.
    pub(crate) fn peer_failed(&self, peer: usize, reason: String) -> Error {
        Error::PeerFailed {
            rank: self.rank,
            seq: self.fp.seq,
            doing: self.fp.to_string(),
            peer,
            reason,
            flight: self.health.flight.report(),
        }
    }
}

impl Waiter<'_> {
    /// Why this collective cannot complete, where `peer` has left the run
    /// (`None` while it has not): see [`Waiter::left_without`].
    pub(crate) fn left(&self, peer: usize) -> Option<Error> {
        self.health.is_gone(peer).then(|| self.left_without(peer))
    }

    /// Why this collective cannot complete, `peer` having left the run
    /// without joining it: the failure it left after, else that it
    /// returned from its closure without issuing it.
    pub(crate) fn left_without(&self, peer: usize) -> Error {
        match self.health.check(self.rank, &self.fp) {
            Err(e) => e,
            Ok(()) => self.peer_failed(
                peer,
                format!(
                    "rank {peer} returned from its closure without issuing {}",
                    self.fp
                ),
            ),
        }
    }
}

impl Watch for Waiter<'_> {
    fn check(&self) -> Result<()> {
        self.health.check(self.rank, &self.fp)
    }

    fn alarm(&self) -> &Alarm {
        &self.health.alarm
    }

    fn timed_out(&self, what: String, after: Duration) -> Error {
        Error::Timeout {
            rank: self.rank,
            seq: self.fp.seq,
            what,
            after,
            flight: self.health.flight.report(),
        }
    }
}
