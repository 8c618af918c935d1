//! The flight record: what each rank of a group last did.
//!
//! When a collective times out, the useful question is "which rank is
//! behind, and where": one rank stuck in #41 while the others wait in #42
//! says at once who to look at. Every rank keeps its last
//! [`DEPTH`] collectives with their state and when it last changed, and a
//! timeout error carries all ranks' records (as NCCL's and PyTorch's flight
//! recorders do).

use std::collections::VecDeque;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

use crate::device::lock;
use crate::runtime::fingerprint::Fingerprint;

/// Collectives remembered per rank.
pub(crate) const DEPTH: usize = 16;

/// Where a collective is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Enqueued,
    InProgress,
    Completed,
    Failed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Enqueued => "enqueued",
            State::InProgress => "in progress",
            State::Completed => "completed",
            State::Failed => "failed",
        }
    }
}

struct Entry {
    fp: Fingerprint,
    state: State,
    since: Instant,
}

/// Per-rank rings of recent collectives.
pub(crate) struct Flight {
    ranks: Vec<Mutex<VecDeque<Entry>>>,
}

impl Flight {
    pub(crate) fn new(ranks: usize) -> Flight {
        Flight {
            ranks: (0..ranks)
                .map(|_| Mutex::new(VecDeque::with_capacity(DEPTH)))
                .collect(),
        }
    }

    /// Records that `rank`'s collective `fp` is now in `state`.
    pub(crate) fn record(&self, rank: usize, fp: Fingerprint, state: State) {
        let Some(ring) = self.ranks.get(rank) else {
            return;
        };
        let mut ring = lock(ring);
        let now = Instant::now();
        if let Some(e) = ring.iter_mut().rev().find(|e| e.fp.seq == fp.seq) {
            e.state = state;
            e.since = now;
            return;
        }
        if ring.len() == DEPTH {
            ring.pop_front();
        }
        ring.push_back(Entry {
            fp,
            state,
            since: now,
        });
    }

    /// What `rank` was running as collective `seq` (its fingerprint), or
    /// an empty string when it is no longer (or not yet) recorded.
    pub(crate) fn doing(&self, rank: usize, seq: u64) -> String {
        self.ranks
            .get(rank)
            .and_then(|ring| {
                lock(ring)
                    .iter()
                    .rev()
                    .find(|e| e.fp.seq == seq)
                    .map(|e| e.fp.to_string())
            })
            .unwrap_or_default()
    }

    /// Forgets everything (a new run starts its sequence numbers at 0).
    pub(crate) fn clear(&self) {
        for r in &self.ranks {
            lock(r).clear();
        }
    }

    /// The record of every rank, one line each, newest collective last.
    pub(crate) fn report(&self) -> String {
        let now = Instant::now();
        let mut s = String::from("\nflight record (last collectives per rank, newest last):");
        for (rank, ring) in self.ranks.iter().enumerate() {
            let ring = lock(ring);
            let _ = write!(s, "\n  rank {rank}:");
            if ring.is_empty() {
                s.push_str(" nothing issued");
            }
            for e in ring.iter() {
                let _ = write!(s, " [{} {}", e.fp.seq, e.fp.kind.name());
                if let Some(bytes) = e.fp.bytes() {
                    let _ = write!(s, " {bytes} bytes");
                }
                let _ = write!(
                    s,
                    ", {} {:.3}s]",
                    e.state.name(),
                    now.saturating_duration_since(e.since).as_secs_f64()
                );
            }
        }
        s
    }
}
