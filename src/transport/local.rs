//! The in-process backend: a channel per ordered pair of ranks, a packet
//! pool shared by the group, and loans.
//!
//! A loan is one host copy per hop instead of two: the sender lends its
//! mapped read-back buffer and the receiver copies straight out of it into
//! its own upload buffer. A lent buffer is reused only when every holder
//! has dropped its handle, and a receiver that forwards the same bytes
//! (the all-gather half of a ring) passes the handle on rather than
//! copying again.
//!
//! A buffer is lent as soon as the copy into it is submitted, not when it
//! lands: the borrower waits for the sender's fence (its map callback)
//! when it reads. So the sender's progress thread never blocks on its own
//! device in a ring step; it goes on to the next slice while its device
//! still reduces and copies this one. That is the pipelining of NCCL's
//! slices, with the fence wait moved to the one rank that needs the bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use crossbeam::channel::{Receiver, Sender, unbounded};

use crate::deadline::{Patience, Ring};
use crate::device::{RankDevice, Ticket};
use crate::error::Error;

use super::mapped::HostSlot;
use super::pool::Pool;
use super::{Body, Carried, Closed, LANES, Lane, Packet, Transport, Wake};

/// Map states of a staging buffer, set by its map callback.
pub(crate) const MAP_PENDING: u8 = 0;
pub(crate) const MAP_READY: u8 = 1;
pub(crate) const MAP_FAILED: u8 = 2;

/// A read-back buffer of another rank, lent for reading its first `bytes`
/// once the owner's submission `filled` has landed them and mapped it. Its
/// owner reuses it only once every `Loan` of it is gone.
#[derive(Clone)]
pub(crate) struct Loan {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) bytes: u64,
    /// Counts the holders: the owner reuses the buffer once it alone holds
    /// it. Dropped (then the owner woken) in `Drop`.
    pub(crate) hold: Option<Arc<()>>,
    /// Whether the owner is waiting for the holders to let go.
    pub(crate) awaited: Arc<AtomicBool>,
    /// The map state, set by the map callback.
    pub(crate) state: Arc<AtomicU8>,
    pub(crate) owner: Arc<RankDevice>,
    pub(crate) filled: Ticket,
    /// The slot in host memory the buffer imports, on a mapped link: no
    /// map then; readers wait for `filled` and read it in place.
    pub(crate) host: Option<Arc<HostSlot>>,
}

/// A loan's bytes on the host.
pub(crate) enum LoanView<'a> {
    /// Through the lender's mapping.
    Mapped(wgpu::BufferView),
    /// In host memory the lender's device wrote.
    Host(&'a [u8]),
}

impl std::ops::Deref for LoanView<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            LoanView::Mapped(v) => v,
            LoanView::Host(b) => b,
        }
    }
}

/// Why a loan could not be read.
pub(crate) enum LoanError {
    /// The wait ended (a timeout, or the watch said stop).
    Wait(Error),
    /// The owner's device failed to fill or map it: the owner's failure.
    Owner(String),
}

impl Drop for Loan {
    /// Lets go of the buffer, then wakes its owner, which may be waiting
    /// to reuse it (see `Stager::encode_lend`).
    fn drop(&mut self) {
        drop(self.hold.take());
        // Fences on both sides: either the owner sees the count fall, or
        // this sees it waiting (it sets the flag before it checks), so
        // no wake-up is missed.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.awaited.load(Ordering::SeqCst) {
            self.owner.map_signal().notify();
        }
    }
}

impl Loan {
    /// Bytes lent.
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.bytes).unwrap_or(usize::MAX)
    }

    /// Waits for the owner's submission that fills the lent buffer. Its
    /// device fills it whatever becomes of the owner after it
    /// sent it, so a failure elsewhere does not end this wait (what was
    /// sent is read, as a packet already here is): only the owner's device
    /// failing, or `p`'s timeout.
    pub(crate) fn filled(&self, p: &Patience) -> Result<(), LoanError> {
        let start = std::time::Instant::now();
        loop {
            if self.owner.is_done(self.filled) {
                return Ok(());
            }
            let spent = start.elapsed();
            let Some(left) = p.timeout.checked_sub(spent).filter(|l| !l.is_zero()) else {
                let what = format!("the lender's device to finish a slice of #{}", p.seq);
                return Err(LoanError::Wait(p.watch.timed_out(what, spent)));
            };
            let seen = self.owner.generation();
            if let Err(e) = self.owner.wait_quietly(self.filled, seen, left) {
                return Err(LoanError::Owner(e));
            }
        }
    }

    /// The lent bytes, once they have landed (waiting on the owner's device
    /// for them, with `p`'s deadline).
    pub(crate) fn read(&self, p: &Patience) -> Result<LoanView<'_>, LoanError> {
        // What was sent is read whatever became of its lender since (see
        // `filled`); a mapped buffer's map callback runs before its fill
        // is seen done, so the wait below then only looks.
        self.filled(p)?;
        if let Some(host) = &self.host {
            return host
                .mem()
                .bytes(self.len())
                .map(LoanView::Host)
                .map_err(LoanError::Owner);
        }
        let mut owner_failed = None;
        let bell: Arc<dyn Ring> = self.owner.map_signal();
        let waited = p.until(
            || format!("the lender's device to finish a slice of #{}", p.seq),
            &bell,
            |slice| {
                let seen = self.owner.generation();
                match self.state.load(Ordering::Acquire) {
                    MAP_READY => Ok(Some(true)),
                    MAP_FAILED => {
                        owner_failed = Some("mapping it failed".to_string());
                        Ok(Some(false))
                    }
                    // Filled: the map callback is on its way.
                    _ if slice.rung() => Ok(None),
                    _ if self.owner.is_done(self.filled) => {
                        self.owner.wait_change(seen, slice.limit);
                        Ok(None)
                    }
                    _ => match self.owner.wait_quietly(self.filled, seen, slice.limit) {
                        Err(e) => {
                            owner_failed = Some(e);
                            Ok(Some(false))
                        }
                        Ok(_) => Ok(None),
                    },
                }
            },
        );
        match waited {
            Err(e) => return Err(LoanError::Wait(e)),
            Ok(false) => {
                return Err(LoanError::Owner(
                    owner_failed.unwrap_or_else(|| "it failed".into()),
                ));
            }
            Ok(true) => {}
        }
        // The owner's device may be lost between the map and this read
        // (it finished its own part and went on): the owner's failure too.
        self.buf
            .get_mapped_range(..self.bytes)
            .map(LoanView::Mapped)
            .map_err(|e| LoanError::Owner(format!("reading it failed: {e}")))
    }
}

/// One rank's ends of the in-process links to every other rank of a group:
/// entry `peer * LANES + lane`.
pub(crate) struct Local<H: Carried> {
    to: Vec<Sender<Packet<H>>>,
    from: Vec<Receiver<Packet<H>>>,
    pool: Arc<Pool>,
    wake: Arc<Wake>,
    /// The group's meeting place, where its ranks share one device (then
    /// each group a split makes of it meets too).
    meeting: Option<Arc<H::Meeting>>,
}

/// Links between every pair of `n` ranks; entry `r` is rank `r`'s end.
/// Where they `meet` (they share one device), every end has the same
/// meeting place.
pub(crate) fn mesh<H: Carried>(n: usize, meet: bool) -> Vec<Arc<dyn Transport<H>>> {
    let meeting = meet.then(|| Arc::new(H::meeting(n)));
    let pool = Arc::new(Pool::new(n.clamp(1, crate::MAX_RANKS).saturating_mul(4)));
    // links[a][end(b, lane)]: a -> b
    type Channel<H> = (Sender<Packet<H>>, Receiver<Packet<H>>);
    let links: Vec<Vec<Channel<H>>> = (0..n)
        .map(|_| (0..n.saturating_mul(LANES)).map(|_| unbounded()).collect())
        .collect();
    let ends = || (0..n).flat_map(|p| Lane::ALL.map(|l| (p, l)));
    (0..n)
        .map(|r| {
            Arc::new(Local {
                to: ends().map(|(p, l)| links[r][end(p, l)].0.clone()).collect(),
                from: ends().map(|(p, l)| links[p][end(r, l)].1.clone()).collect(),
                pool: pool.clone(),
                wake: Arc::default(),
                meeting: meeting.clone(),
            }) as Arc<dyn Transport<H>>
        })
        .collect()
}

/// The index of the channel to or from `peer` on `lane`.
fn end(peer: usize, lane: Lane) -> usize {
    peer.saturating_mul(LANES).saturating_add(lane as usize)
}

impl<H: Carried> Transport<H> for Local<H> {
    fn send(&self, peer: usize, lane: Lane, packet: Packet<H>) -> Result<(), Closed> {
        self.to
            .get(end(peer, lane))
            .ok_or(Closed)?
            .send(packet)
            .map_err(|_| Closed)
    }

    fn recv(&self, peer: usize, lane: Lane, limit: Duration) -> Result<Option<Packet<H>>, Closed> {
        self.wake
            .recv(self.from.get(end(peer, lane)).ok_or(Closed)?, limit)
    }

    fn wake(&self) -> &Arc<Wake> {
        &self.wake
    }

    fn meeting(&self) -> Option<Arc<H::Meeting>> {
        self.meeting.clone()
    }

    fn carries_loans(&self, _peer: usize) -> bool {
        true
    }

    fn split(
        &self,
        _seq: u64,
        _color: u32,
        members: &[usize],
    ) -> Vec<Option<Arc<dyn Transport<H>>>> {
        mesh(members.len(), self.meeting.is_some())
            .into_iter()
            .map(Some)
            .collect()
    }

    fn drain(&self) {
        for rx in &self.from {
            while let Ok(p) = rx.try_recv() {
                if let Body::Bytes(b) = p.body {
                    self.recycle(b);
                }
            }
        }
    }

    fn buffer(&self) -> Vec<u8> {
        self.pool.take()
    }

    fn recycle(&self, v: Vec<u8>) {
        self.pool.give(v);
    }
}
