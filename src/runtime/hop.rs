//! A hop as the runtime sees it: a transport's send and receive, plus what
//! the transport does not know. A receive is a bounded wait that fails
//! as soon as a peer fails or has left, and checks that the packet
//! belongs to the collective this rank is running (fingerprint) and
//! carries the bytes the schedule expects. A lent buffer that its owner's
//! device failed to fill is the owner's failure, recorded for the group.

use std::sync::Arc;
use std::time::Duration;

use crate::deadline::Ring;
use crate::error::{Error, Result};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::waiter::Waiter;
use crate::transport::local::{LoanError, LoanView};
use crate::transport::{Body, Lane, Loan, Mapped, Transport, Verdict};

/// A rank's links, as the runtime uses them: packets headed by the
/// fingerprint of the collective they belong to.
pub(crate) type Link = dyn Transport<Fingerprint>;
/// A packet on a [`Link`].
pub(crate) type Packet = crate::transport::Packet<Fingerprint>;

/// Sends `packet` to `peer` on `lane` without blocking. A loan to a peer
/// the transport cannot lend to (another process) goes mapped, once its
/// bytes have landed, where the transport sends out of mappings, else as
/// a copy of its bytes.
pub(crate) fn post(link: &Link, peer: usize, lane: Lane, packet: Packet, w: &Waiter) -> Result<()> {
    let packet = match packet.body {
        Body::Loan(loan) if !link.carries_loans(peer) => {
            let view = read_loan(&loan, packet.from, w)?;
            let body = if link.takes_mapped(peer) {
                let view = match view {
                    LoanView::Mapped(v) => Some(v),
                    LoanView::Host(_) => None,
                };
                Body::Mapped(Mapped::new(view, loan).map_err(|why| w.device_error(why))?)
            } else {
                let mut data = link.buffer();
                data.extend_from_slice(&view);
                drop(view);
                Body::Bytes(data)
            };
            Packet { body, ..packet }
        }
        // Its buffer goes back to the transport once used: never forwarded.
        Body::Landed(_) => {
            return Err(w.device_error(format!(
                "a slice from another process was forwarded to rank {peer} as it landed"
            )));
        }
        _ => packet,
    };
    link.send(peer, lane, packet).map_err(|_| gone(peer, w))
}

/// `peer`'s end of the link is gone: its group was dropped, after a
/// failure (reported as that failure, recorded first) or without one.
fn gone(peer: usize, w: &Waiter) -> Error {
    match w.health.check(w.rank, &w.fp) {
        Err(e) => e,
        Ok(()) => w.peer_failed(peer, "its end of the link is gone".into()),
    }
}

/// Receives the next packet from `peer` on `lane`, checking that it
/// belongs to the call `w` is running (the same collective, or the send
/// that pairs with this receive) and carries `bytes` bytes.
pub(crate) fn take(
    link: &Link,
    peer: usize,
    lane: Lane,
    bytes: usize,
    w: &Waiter,
) -> Result<Packet> {
    let gone = || gone(peer, w);
    let bell: Arc<dyn Ring> = link.wake().clone();
    let mut p = w.until(
        || match bytes {
            0 => format!("rank {peer} to join {}", w.fp),
            _ => format!("rank {peer} to send {bytes} bytes of {}", w.fp),
        },
        &bell,
        |slice| {
            // A peer that left before this look rang no bell for it: look
            // first, and sleep only while it is still here.
            let left = w.health.is_gone(peer);
            let limit = if left || slice.rung() {
                Duration::ZERO
            } else {
                slice.limit
            };
            match link.recv(peer, lane, limit) {
                Ok(Some(p)) => Ok(Some(p)),
                Ok(None) if left || w.health.is_gone(peer) => {
                    match link.recv(peer, lane, Duration::ZERO) {
                        Ok(Some(p)) => Ok(Some(p)),
                        Err(_) => Err(gone()),
                        // A peer that left after a failure is reported with that
                        // failure (recorded before it left), not as a departure.
                        Ok(None) => Err(w.left_without(peer)),
                    }
                }
                Ok(None) => Ok(None),
                Err(_) => Err(gone()),
            }
        },
    )?;
    let pairs = w.fp.pairs_with(&p.fp);
    if let Some(receipt) = p.receipt.take() {
        receipt.tell(if pairs && p.len() == bytes {
            Verdict::Taken
        } else {
            Verdict::Refused(w.fp.to_string())
        });
    }
    if !pairs || p.len() != bytes {
        let (ours, theirs) = if !pairs {
            (w.fp.to_string(), p.fp.to_string())
        } else {
            // Same collective, different schedule: only a bug would get here.
            (
                format!("{} expecting {bytes} bytes", w.fp),
                format!("{} sending {} bytes", p.fp, p.len()),
            )
        };
        return Err(Error::Mismatch {
            rank: w.rank,
            seq: w.fp.seq,
            ours,
            peer: p.from,
            theirs,
            flight: w.health.flight.report(),
        });
    }
    Ok(p)
}

/// The bytes of a loan from `owner`, once they have landed. Should the
/// owner's device fail, the owner may be waiting on someone else and
/// never see it: the failure is recorded as the owner's, for the whole
/// group, and this rank reports `PeerFailed`, naming it.
pub(crate) fn read_loan<'a>(loan: &'a Loan, owner: usize, w: &Waiter) -> Result<LoanView<'a>> {
    loan.read(&w.patience())
        .or_else(|e| owner_failed(e, owner, w))
}

/// Waits until the bytes of a loan in host memory from `owner` have
/// landed, as [`read_loan`].
pub(crate) fn wait_loan(loan: &Loan, owner: usize, w: &Waiter) -> Result<()> {
    loan.filled(&w.patience())
        .or_else(|e| owner_failed(e, owner, w))
}

/// A loan that could not be read: the wait's end, or the owner's failure.
fn owner_failed<T>(e: LoanError, owner: usize, w: &Waiter) -> Result<T> {
    match e {
        LoanError::Wait(e) => Err(e),
        LoanError::Owner(why) => {
            let what = format!(
                "its device failed to fill a slice it lent to rank {}: {why}",
                w.rank
            );
            w.health
                .fail(owner, Error::device(owner, Some(w.fp.seq), what));
            w.health.check(w.rank, &w.fp)?;
            Err(w.device_error(format!("reading a buffer lent by rank {owner}: {why}")))
        }
    }
}

/// Gives a packet's bytes back to the pool (a loan goes back to its owner
/// when dropped).
pub(crate) fn recycle(link: &Link, p: Packet) {
    if let Body::Bytes(b) = p.body {
        link.recycle(b);
    }
}
