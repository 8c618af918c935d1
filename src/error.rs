//! One error type for the whole crate.
//!
//! Collective failures are only debuggable when the error says *where*
//! (which rank, which collective by sequence number) and *what each side
//! expected*, so every variant carries that context instead of a bare
//! message. `Error` is `Clone` because one failure is reported to several
//! waiters (every pending `Work` of a communicator, every rank of a group).

use std::time::Duration;

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No wgpu adapter matched the request.
    #[error(
        "no GPU adapter found (backends: {backends}{name}); on Debian/Ubuntu without a GPU, \
         install software Vulkan with `apt-get install mesa-vulkan-drivers` (lavapipe), \
         then set WGPU_ADAPTER_NAME=llvmpipe to pick it"
    )]
    NoAdapter {
        /// The backends that were searched.
        backends: String,
        /// `", name containing …"` when a name filter was given, else empty.
        name: String,
    },

    /// A caller passed something the API cannot accept.
    #[error("invalid argument{}: {what}", at(*rank, None))]
    InvalidArgument {
        /// The rank that made the call, when known.
        rank: Option<usize>,
        /// What was wrong, with the values involved.
        what: String,
    },

    /// Ranks disagree about which collective they are running.
    #[error(
        "collective mismatch on rank {rank}, seq {seq}: this rank issued {ours}, \
         but rank {peer} issued {theirs}{flight}"
    )]
    Mismatch {
        /// This rank.
        rank: usize,
        /// This rank's sequence number for the collective.
        seq: u64,
        /// This rank's fingerprint of the collective.
        ours: String,
        /// The peer that disagreed.
        peer: usize,
        /// The peer's fingerprint.
        theirs: String,
        /// The flight record when it was found (what every rank last did),
        /// which ends the message.
        flight: String,
    },

    /// A wait ran past its deadline.
    #[error("timeout on rank {rank}, seq {seq}: {what} after {after:?}{flight}")]
    Timeout {
        /// This rank.
        rank: usize,
        /// The collective that timed out.
        seq: u64,
        /// What was being waited for.
        what: String,
        /// How long it waited.
        after: Duration,
        /// The flight record: what each rank last did (may be empty).
        flight: String,
    },

    /// Another rank failed, so this rank's collective cannot complete.
    /// `peer` is the rank that failed first and `reason` its own error,
    /// once: never a chain of ranks reporting each other.
    #[error(
        "rank {rank}, seq {seq}{}: peer rank {peer} failed first: {reason}{flight}",
        doing_at(doing)
    )]
    PeerFailed {
        /// This rank.
        rank: usize,
        /// The collective that was failed.
        seq: u64,
        /// What this rank was running (its fingerprint), when known.
        doing: String,
        /// The rank that failed first.
        peer: usize,
        /// Why it failed: its own error.
        reason: String,
        /// The flight record when it was reported (where every rank
        /// was), which ends the message.
        flight: String,
    },

    /// A rank's closure panicked inside `World::run`.
    #[error("rank {rank} panicked: {message}")]
    RankPanicked {
        /// The rank whose closure panicked.
        rank: usize,
        /// The panic payload, when it was a string.
        message: String,
    },

    /// The communicator was aborted.
    #[error("rank {rank}, seq {seq}: communicator aborted")]
    Aborted {
        /// This rank.
        rank: usize,
        /// The collective that was aborted.
        seq: u64,
    },

    /// wgpu reported an error (validation, out of memory, device lost, a failed map).
    #[error("wgpu error{}: {what}", at(*rank, *seq))]
    Device {
        /// The rank whose device failed, when known.
        rank: Option<usize>,
        /// The collective in progress, when there was one.
        seq: Option<u64>,
        /// wgpu's message, with what we were doing.
        what: String,
    },

    /// What carries bytes between processes (MPI) could not start, or the
    /// processes of a job do not agree on the world they make.
    #[error("between processes{}: {what}", process.map(|p| format!(" (process {p})")).unwrap_or_default())]
    Transport {
        /// The process (its MPI rank) that found it, when known.
        process: Option<usize>,
        /// What failed, with every process's view where they differ.
        what: String,
    },
}

fn doing_at(doing: &str) -> String {
    if doing.is_empty() {
        String::new()
    } else {
        format!(" ({doing})")
    }
}

fn at(rank: Option<usize>, seq: Option<u64>) -> String {
    match (rank, seq) {
        (Some(r), Some(s)) => format!(" on rank {r}, seq {s}"),
        (Some(r), None) => format!(" on rank {r}"),
        (None, Some(s)) => format!(" at seq {s}"),
        (None, None) => String::new(),
    }
}

impl Error {
    /// The message without the flight record: for an error quoted inside
    /// another, which carries its own.
    pub(crate) fn brief(&self) -> String {
        let mut e = self.clone();
        match &mut e {
            Error::Mismatch { flight, .. }
            | Error::Timeout { flight, .. }
            | Error::PeerFailed { flight, .. } => flight.clear(),
            _ => {}
        }
        e.to_string()
    }

    /// This error with `now` as its flight record, where it carries one
    /// (a snapshot taken when it was found, before its call was recorded
    /// as failed).
    pub(crate) fn with_flight(mut self, now: String) -> Self {
        match &mut self {
            Error::Mismatch { flight, .. }
            | Error::Timeout { flight, .. }
            | Error::PeerFailed { flight, .. }
                if !flight.is_empty() =>
            {
                *flight = now;
            }
            _ => {}
        }
        self
    }

    /// This error, a rank's own failure at call `first`, told again for
    /// its later call `seq`: the same kind, prefixed "the group failed at
    /// seq {first}: ". `None` for the kinds the group reports in a way of
    /// its own (a mismatch, an abort, the wire between processes).
    pub(crate) fn repeated(
        &self,
        rank: usize,
        seq: u64,
        first: u64,
        doing: impl FnOnce() -> String,
    ) -> Option<Self> {
        let again = |what: &str| format!("the group failed at seq {first}: {what}");
        Some(match self {
            Error::InvalidArgument { what, .. } => Error::InvalidArgument {
                rank: Some(rank),
                what: again(what),
            },
            Error::Device { what, .. } => Error::Device {
                rank: Some(rank),
                seq: Some(seq),
                what: again(what),
            },
            Error::Timeout {
                what,
                after,
                flight,
                ..
            } => Error::Timeout {
                rank,
                seq,
                what: again(what),
                after: *after,
                flight: flight.clone(),
            },
            Error::PeerFailed {
                peer,
                reason,
                flight,
                ..
            } => Error::PeerFailed {
                rank,
                seq,
                doing: doing(),
                peer: *peer,
                reason: again(reason),
                flight: flight.clone(),
            },
            Error::RankPanicked { .. } => Error::PeerFailed {
                rank,
                seq,
                doing: doing(),
                peer: rank,
                reason: again(&self.brief()),
                flight: String::new(),
            },
            _ => return None,
        })
    }

    pub(crate) fn invalid(rank: usize, what: impl Into<String>) -> Self {
        Error::InvalidArgument {
            rank: Some(rank),
            what: what.into(),
        }
    }

    pub(crate) fn device(rank: usize, seq: Option<u64>, what: impl Into<String>) -> Self {
        Error::Device {
            rank: Some(rank),
            seq,
            what: what.into(),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The text a panic carried, for the error that reports it.
pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
