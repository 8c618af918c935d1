//! send and recv: a tensor from one rank to another, paired by the
//! pair's own sequence numbers. The sender's packets carry the bytes (on
//! a shared device, one device copy the receiver takes); the first packet
//! carries a receipt where the receiver can tell it back, so that a send
//! completes once it was matched and fails when the receiver refuses it.

use std::sync::Arc;

use crate::algo::p2p;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, missing, scratch,
};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::health::Health;
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;
use crate::runtime::work_state::WorkState;
use crate::transport::{Receipt, Verdict};

/// A send of `len` elements to `peer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Send {
    pub dtype: DType,
    pub len: usize,
    pub peer: usize,
}

/// A receive of `len` elements from `peer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recv {
    pub dtype: DType,
    pub len: usize,
    pub peer: usize,
}

/// Neither runs on the shared device's steps: a pair's packets carry them.
fn never() -> std::result::Result<(), String> {
    Err("a send or receive is one hop between a pair".into())
}

impl Send {
    /// The send of `x` to `peer`.
    pub(crate) fn of(x: &Tensor, peer: usize) -> Send {
        Send {
            dtype: x.dtype(),
            len: x.len(),
            peer,
        }
    }
}

impl Unit for Send {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::len(self.len)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        let _ = input;
        peer_of(seat, self.peer)?;
        Ok(Layout::apart(0))
    }

    fn peer(&self) -> Option<usize> {
        Some(self.peer)
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::PointToPoint]
    }

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        _calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        never()
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        let r = p.rank();
        let x = at.ins.first().ok_or_else(|| missing(r))?;
        p.buf = x.buffer().clone();
        let copy = match at.shared || p.link.shares_device(self.peer) {
            true => Some(scratch(at.dev, x.words())?),
            false => None,
        };
        // The first packet carries the receipt; one still here after a
        // failed send was never sent, and the send's own error says why.
        p.receipt = Some(receipt(at.health, at.state, r, p.w.fp, self.peer));
        let sent = match copy {
            Some(copy) => {
                let buffer = copy.buffer().clone();
                p2p::send_on_device(p, self.peer, x.words(), buffer, Box::new(copy))
            }
            None => p2p::send(p, self.peer, x.words()),
        };
        if let Some(unsent) = p.receipt.take() {
            unsent.disarm();
        }
        sent?;
        Ok(None)
    }
}

impl Recv {
    /// The receive into `out` from `peer`.
    pub(crate) fn of(out: &Tensor, peer: usize) -> Recv {
        Recv {
            dtype: out.dtype(),
            len: out.len(),
            peer,
        }
    }
}

impl Unit for Recv {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::len(self.len)
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        let _ = input;
        peer_of(seat, self.peer)?;
        // Its tensor is its output, of the length it was made with.
        Ok(Layout {
            out: None,
            ..Layout::apart(0)
        })
    }

    fn peer(&self) -> Option<usize> {
        Some(self.peer)
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::PointToPoint]
    }

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        _calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        never()
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        let out = at.outs.first().ok_or_else(|| missing(p.rank()))?;
        p.buf = out.buffer().clone();
        let on_device = at.shared || p.link.shares_device(self.peer);
        p2p::recv(p, self.peer, out.words(), on_device)?;
        Ok(None)
    }
}

/// The receipt a send to `peer` carries, where the receiver tells it
/// back (in this process, or in another as a frame back): the send's work
/// completes once the receiver has matched it, and fails when it refuses,
/// so a mismatch fails both sides, and a send to a rank that returned
/// without receiving fails at once (its departure is known) rather than
/// completing once the bytes were posted.
fn receipt(
    health: &Arc<Health>,
    state: &Arc<WorkState>,
    rank: usize,
    fp: Fingerprint,
    peer: usize,
) -> Receipt {
    state.expect_receipt(peer, fp);
    let (state, health) = (state.clone(), health.clone());
    Receipt::new(move |verdict| {
        state.receipt(
            peer,
            fp,
            match verdict {
                Verdict::Taken => Ok(()),
                Verdict::Refused(theirs) => Err(Error::Mismatch {
                    rank,
                    seq: fp.seq,
                    ours: fp.to_string(),
                    peer,
                    theirs,
                    flight: health.flight.report(),
                }),
                Verdict::Dropped => {
                    Err(health
                        .check(rank, &fp)
                        .err()
                        .unwrap_or_else(|| Error::PeerFailed {
                            rank,
                            seq: fp.seq,
                            doing: fp.to_string(),
                            peer,
                            reason: "it dropped the message without receiving it".into(),
                            flight: health.flight.report(),
                        }))
                }
            },
        )
    })
}

/// `Ok` when `peer` is another rank of the group, else why not.
fn peer_of(seat: Seat, peer: usize) -> std::result::Result<(), String> {
    if peer >= seat.size {
        Err(format!(
            "peer {peer} is not a rank of a group of {}",
            seat.size
        ))
    } else if peer == seat.rank {
        Err(format!("rank {peer} cannot send to or receive from itself"))
    } else {
        Ok(())
    }
}
