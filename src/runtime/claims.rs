//! Bytes that ranks on one device write, checked across those ranks.
//!
//! Ranks that share a device can hand in views of one buffer. When a
//! collective would have one rank write bytes that another rank of the
//! same collective reads or writes, the result depends on who runs first:
//! silently wrong. Under the shared placement the group meets on the
//! device and checks every arrival (`shared.rs`); ranks that share a device
//! without meeting there (the same device given twice to
//! `World::from_devices` with a device per rank) post what they read and
//! write here, and wait for their co-device peers of the same call, so
//! every one of them reaches the same verdict, on bytes, whatever the
//! placement. Ranks alone on their device post nothing and never wait.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};

use crate::deadline::{Patience, Ring};
use crate::device::lock;
use crate::device::tensor::Tensor;
use crate::error::{Error, Result};

/// One rank's tensors in one call.
struct Arrival {
    ins: Vec<Tensor>,
    outs: Vec<Tensor>,
    /// Whether the call writes this rank's outputs (a gather's off the
    /// root does not).
    writes: bool,
}

/// What the co-device ranks of one call have posted, and how many of them
/// have read the verdict (the last one removes the entry).
#[derive(Default)]
struct Board {
    arrivals: HashMap<usize, Arrival>,
    read: usize,
}

/// The group's board of posted calls, by sequence number.
pub(crate) struct Claims {
    /// Each rank's device, where it runs in this process: ranks with the
    /// same key share a device.
    devices: Vec<Option<usize>>,
    posts: Arc<Posts>,
}

/// The boards, and the condition their posts are announced on (which a
/// raised alarm rings too).
#[derive(Default)]
struct Posts {
    boards: Mutex<HashMap<u64, Board>>,
    posted: Condvar,
}

impl Ring for Posts {
    fn ring(&self) {
        let _b = lock(&self.boards);
        self.posted.notify_all();
    }
}

impl Claims {
    /// A group whose rank r runs on device `devices[r]`.
    pub(crate) fn new(devices: Vec<Option<usize>>) -> Claims {
        Claims {
            devices,
            posts: Arc::default(),
        }
    }

    /// The devices of `members` (ranks of this group), in their order.
    pub(crate) fn devices_of(&self, members: &[usize]) -> Vec<Option<usize>> {
        members
            .iter()
            .map(|&m| self.devices.get(m).copied().flatten())
            .collect()
    }

    /// The other ranks of the group on `rank`'s device.
    fn peers(&self, rank: usize) -> impl Iterator<Item = usize> + '_ {
        let mine = self.devices.get(rank).copied().flatten();
        self.devices
            .iter()
            .enumerate()
            .filter(move |(r, d)| *r != rank && mine.is_some() && **d == mine)
            .map(|(r, _)| r)
    }

    /// Forgets every posted call (a new run starts its sequence numbers at 0).
    pub(crate) fn clear(&self) {
        lock(&self.posts.boards).clear();
    }

    /// Posts what `w`'s rank reads and writes in its call (`call`, as
    /// errors name it), waits for its
    /// co-device peers' posts of the same call, and fails with
    /// `InvalidArgument` (on every one of them alike) when a rank writes
    /// bytes another one touches. Returns at once on a rank alone on its
    /// device.
    pub(crate) fn check(
        &self,
        w: &Patience<'_>,
        call: &dyn std::fmt::Display,
        ins: &[Tensor],
        outs: &[Tensor],
        writes: bool,
    ) -> Result<()> {
        let (rank, seq) = (w.rank, w.seq);
        let peers: Vec<usize> = self.peers(rank).collect();
        if peers.is_empty() {
            return Ok(());
        }
        let members = peers.len().saturating_add(1);
        lock(&self.posts.boards)
            .entry(seq)
            .or_default()
            .arrivals
            .insert(
                rank,
                Arrival {
                    ins: ins.to_vec(),
                    outs: outs.to_vec(),
                    writes,
                },
            );
        self.posts.posted.notify_all();
        let bell: Arc<dyn Ring> = self.posts.clone();
        let waited = w.until(
            || format!("ranks {peers:?}, which share its device, to post their tensors"),
            &bell,
            |slice| {
                let boards = lock(&self.posts.boards);
                let (boards, _) = self
                    .posts
                    .posted
                    .wait_timeout_while(boards, slice.limit, |b| {
                        !slice.rung() && b.get(&seq).is_none_or(|b| b.arrivals.len() < members)
                    })
                    .unwrap_or_else(|p| p.into_inner());
                let mut boards = boards;
                Ok(read_verdict(&mut boards, seq, members))
            },
        );
        match waited {
            Ok(None) => Ok(()),
            Ok(Some(why)) => Err(Error::invalid(rank, format!("{call}: {why}"))),
            Err(e) => {
                let mut boards = lock(&self.posts.boards);
                // Every post arrived, and a peer that read the verdict
                // first has failed the group with it: this rank reports
                // the same verdict, not the peer's failure.
                if let Some(verdict) = read_verdict(&mut boards, seq, members) {
                    return Err(match verdict {
                        Some(why) => Error::invalid(rank, format!("{call}: {why}")),
                        None => e,
                    });
                }
                // Nobody will read this call's verdict: take the post back.
                if let Some(b) = boards.get_mut(&seq) {
                    b.arrivals.remove(&rank);
                    if b.arrivals.is_empty() {
                        boards.remove(&seq);
                    }
                }
                Err(e)
            }
        }
    }
}

/// The verdict on call `seq` once all `members` have posted (this rank's
/// read of it counted; the board goes once every member has read it), or
/// `None` while posts are missing.
fn read_verdict(
    boards: &mut HashMap<u64, Board>,
    seq: u64,
    members: usize,
) -> Option<Option<String>> {
    let board = boards.get_mut(&seq)?;
    if board.arrivals.len() < members {
        return None;
    }
    let verdict = clash(&board.arrivals);
    board.read = board.read.saturating_add(1);
    if board.read >= members {
        boards.remove(&seq);
    }
    Some(verdict)
}

/// Why the posted calls clash, when a rank writes bytes another touches
/// (the lowest such pair, so every reader words it alike).
fn clash(arrivals: &HashMap<usize, Arrival>) -> Option<String> {
    let mut ranks: Vec<(usize, &Arrival)> = arrivals.iter().map(|(r, a)| (*r, a)).collect();
    ranks.sort_unstable_by_key(|(r, _)| *r);
    for &(r, a) in ranks.iter().filter(|(_, a)| a.writes) {
        for &(s, b) in ranks.iter().filter(|(s, _)| *s != r) {
            let shared = a
                .outs
                .iter()
                .any(|o| b.ins.iter().chain(&b.outs).any(|t| o.overlaps(t)));
            if shared {
                return Some(format!(
                    "rank {r}'s output shares bytes with a tensor of rank {s} (ranks that \
                     share a device must not share the bytes a collective writes)"
                ));
            }
        }
    }
    None
}
