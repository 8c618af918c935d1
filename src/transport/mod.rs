//! Moving bytes between two ranks, behind one trait.
//!
//! A schedule's hop is `send` to a peer and `recv` from one; what carries
//! the bytes is a [`Transport`] backend, and nothing above this module
//! knows which (NCCL's `ncclTransport`, Gloo's `transport/`). The first
//! backend is in-process channels ([`local`]); ranks in several processes
//! talk over MPI (`mpi`, the feature of that name). A transport knows deadlines, nothing of the
//! group's health or the progress of a collective: it waits at most what
//! it is given and says when a peer's end is gone; the runtime decides
//! what that means.
//!
//! Ranks in one process can do better than copying bytes into a packet:
//! the sender *lends* a mapped read-back buffer ([`local::Loan`]) and the
//! receiver reads it in place. That is a capability of the in-process
//! backend ([`Transport::carries_loans`]), not a device handle inside
//! every packet.
//!
//! Device staging (`staging.rs`) is the device side of a host hop: the
//! mapped buffers a slice goes through on its way off and onto a device.

pub(crate) mod local;
pub(crate) mod mapped;
#[cfg(feature = "mpi")]
pub(crate) mod mpi;
pub(crate) mod pool;
pub(crate) mod shared;
pub(crate) mod staging;

use std::sync::Arc;
use std::time::Duration;

use crossbeam::channel::{Receiver, Sender, bounded};

use crate::deadline::Ring;

pub(crate) use local::{Loan, LoanView};
pub(crate) use staging::Stager;

/// A slice in flight from one rank to another, with a header the
/// transport carries without reading (the runtime puts the sender's view
/// of which collective the bytes belong to there).
pub(crate) struct Packet<H> {
    pub fp: H,
    pub from: usize,
    pub body: Body,
    /// Where the receiver tells the sender it took the message, or not
    /// (the first packet of a send to a rank of this process).
    pub receipt: Option<Receipt>,
}

/// What the receiver of a point-to-point message says of it.
pub(crate) enum Verdict {
    /// Its header matched the receive: the message is taken.
    Taken,
    /// It did not: the receiver's own call, as it names it.
    Refused(String),
    /// It was dropped untaken (the receiver failed, or a run was reset).
    Dropped,
}

/// The receiver's word back to the sender, inside one process: a send
/// completes once its receiver has matched it, so a mismatch fails the
/// send too, not only the receive. Told once; dropping it untold tells
/// [`Verdict::Dropped`].
pub(crate) struct Receipt(Option<Box<dyn FnOnce(Verdict) + Send>>);

impl Receipt {
    pub(crate) fn new(tell: impl FnOnce(Verdict) + Send + 'static) -> Receipt {
        Receipt(Some(Box::new(tell)))
    }

    /// Tells the sender.
    pub(crate) fn tell(mut self, verdict: Verdict) {
        if let Some(f) = self.0.take() {
            f(verdict);
        }
    }

    /// Forgets a receipt that was never sent (its send failed first, and
    /// says why itself).
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for Receipt {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f(Verdict::Dropped);
        }
    }
}

/// The bytes of a packet.
pub(crate) enum Body {
    Bytes(Vec<u8>),
    /// A buffer of the sender's, lent in place (in-process only).
    Loan(Loan),
    /// Bytes already on the device sender and receiver share.
    Resident(Resident),
    /// A lent buffer's bytes, mapped, on their way to another process:
    /// the transport sends straight out of the mapping (no copy into a
    /// packet) and lets go of the loan once the bytes are sent.
    Mapped(Mapped),
    /// Another process's bytes, landed in a buffer of the receiver's
    /// device that its kernels read (see `staging::Landing`).
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Landed(staging::Landed),
}

/// A lent read-back buffer, mapped (or a slot in host memory), read in
/// place by the transport.
pub(crate) struct Mapped {
    /// Dropped before `loan` (field order): the owner unmaps the buffer
    /// only once every loan of it is gone. `None` for a slot in host
    /// memory, read through the loan.
    view: Option<wgpu::BufferView>,
    loan: Loan,
}

impl Mapped {
    /// `view` is `loan`'s mapping, or `None` where the loan is a slot in
    /// host memory whose filling submission is done.
    pub(crate) fn new(view: Option<wgpu::BufferView>, loan: Loan) -> Result<Mapped, String> {
        if view.is_none() {
            let host = loan
                .host
                .as_ref()
                .ok_or("a lent buffer without its mapping")?;
            host.mem().bytes(loan.len())?;
        }
        Ok(Mapped { view, loan })
    }
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        match (&self.view, &self.loan.host) {
            (Some(v), _) => v,
            // In range: `new` checked.
            (None, Some(h)) => h.mem().bytes(self.loan.len()).unwrap_or_default(),
            (None, None) => &[],
        }
    }
}

/// A copy of the sender's bytes on a device the receiver shares: the
/// receiver copies out of it with a device copy, submitted to the same
/// queue after the sender's copy into it, so it reads what was sent.
pub(crate) struct Resident {
    pub buffer: wgpu::Buffer,
    pub bytes: u64,
    /// Keeps the buffer out of its pool until the receiver lets go.
    pub _hold: Box<dyn std::any::Any + Send>,
}

/// Which stream of packets between two ranks a packet travels on, as an
/// MPI tag would say: collectives pair by the group's issue order,
/// point-to-point calls by each pair's own, so neither may take the
/// other's packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Collective = 0,
    PointToPoint = 1,
}

impl Lane {
    /// Every lane, in index order.
    pub(crate) const ALL: [Lane; LANES] = [Lane::Collective, Lane::PointToPoint];
}

/// Lanes between each pair of ranks.
pub(crate) const LANES: usize = 2;

impl<H> Packet<H> {
    /// Bytes carried.
    pub(crate) fn len(&self) -> usize {
        match &self.body {
            Body::Bytes(b) => b.len(),
            Body::Loan(l) => l.len(),
            Body::Resident(r) => usize::try_from(r.bytes).unwrap_or(usize::MAX),
            Body::Mapped(m) => m.as_ref().len(),
            Body::Landed(l) => l.len(),
        }
    }
}

/// What the runtime above gives its transport to carry: the header of its
/// packets (`Packet::fp`), and the place where the ends of a group whose
/// ranks all share one device meet (`runtime::shared`'s meeting). The
/// transport hands one such place to every end of a group that meets, and
/// a new one to each group `split` makes of it, knowing only its type.
pub(crate) trait Carried: Send + 'static {
    /// Where a group whose ranks share one device meets.
    type Meeting: Send + Sync + 'static;

    /// A meeting place for a group of `n` ranks.
    fn meeting(n: usize) -> Self::Meeting;
}

/// Wakes a rank blocked in [`Transport::recv`]: a raised alarm rings it
/// (see `deadline::Alarm`), and the receive returns empty-handed so that
/// the wait looks at its watch again.
pub(crate) struct Wake {
    tx: Sender<()>,
    rx: Receiver<()>,
}

impl Default for Wake {
    fn default() -> Wake {
        // One pending wake-up is enough: a second adds nothing.
        let (tx, rx) = bounded(1);
        Wake { tx, rx }
    }
}

impl Ring for Wake {
    fn ring(&self) {
        let _ = self.tx.try_send(());
    }
}

impl Wake {
    /// The next message on `from`, waiting at most `limit`; `Ok(None)`
    /// when none came in time or the wake rang (a ring left from an
    /// earlier wait costs one more look, never a message).
    ///
    /// A message already there is taken first: `select` picks at random
    /// among ready channels, and a departure rings the wake as its last
    /// message lands, so a look that found both could report the peer gone
    /// with its message unread (8 ranks, a chain broadcast, about one run
    /// in ten under load).
    pub(crate) fn recv<T>(&self, from: &Receiver<T>, limit: Duration) -> Result<Option<T>, Closed> {
        match from.try_recv() {
            Ok(m) => return Ok(Some(m)),
            Err(crossbeam::channel::TryRecvError::Disconnected) => return Err(Closed),
            Err(crossbeam::channel::TryRecvError::Empty) if limit.is_zero() => return Ok(None),
            Err(crossbeam::channel::TryRecvError::Empty) => {}
        }
        crossbeam::select! {
            recv(from) -> m => m.map(Some).map_err(|_| Closed),
            recv(self.rx) -> _ => Ok(None),
            default(limit) => Ok(None),
        }
    }
}

/// The peer's end of the link is gone (its group was dropped).
#[derive(Debug)]
pub(crate) struct Closed;

/// One rank's ends of its links to every other rank of a group.
pub(crate) trait Transport<H: Carried>: Send + Sync {
    /// Sends `packet` to `peer` on `lane` without blocking.
    fn send(&self, peer: usize, lane: Lane, packet: Packet<H>) -> Result<(), Closed>;

    /// The next packet from `peer` on `lane`, waiting at most `limit`;
    /// `Ok(None)` when none came in time.
    fn recv(&self, peer: usize, lane: Lane, limit: Duration) -> Result<Option<Packet<H>>, Closed>;

    /// What wakes this end's [`recv`](Self::recv) early.
    fn wake(&self) -> &Arc<Wake>;

    /// Where this end's group meets instead of sending bytes, when its
    /// ranks all share one device; the same place on every end.
    fn meeting(&self) -> Option<Arc<H::Meeting>> {
        None
    }

    /// Whether packets to `peer` may carry [`Body::Loan`] (sender and
    /// receiver share the process).
    fn carries_loans(&self, peer: usize) -> bool;

    /// Whether `peer` runs on this end's device where the group's ranks
    /// hop rather than meet (ranks of one process sharing its device, in
    /// a group over MPI): ring steps and point-to-point calls to it send
    /// [`Body::Resident`], a device copy, where they would lend a host
    /// buffer.
    fn shares_device(&self, _peer: usize) -> bool {
        false
    }

    /// Whether a loan to `peer` that cannot go as one ([`Self::carries_loans`])
    /// may go as [`Body::Mapped`]: sent out of its mapping, with no copy.
    fn takes_mapped(&self, _peer: usize) -> bool {
        false
    }

    /// Whether bytes from other processes can come to this end's device
    /// steps, and land where its kernels read them ([`Self::land_into`]).
    fn lands(&self) -> bool {
        false
    }

    /// Lets bytes from other processes for this end's device steps land in
    /// `landing`.
    fn land_into(&self, _landing: &Arc<staging::Landing>) {}

    /// This rank's end of the links of a group made of `members` (ranks
    /// here, in the new group's order) by `split` number `seq` for `color`:
    /// entry i is member i's end where it lives in this process, `None`
    /// elsewhere. Every member calls it; the first to arrive in a process
    /// makes the ends for that process's members. A group that meets
    /// makes groups that meet (a subset of ranks on one device is on it
    /// too), each at a place of its own.
    fn split(&self, seq: u64, color: u32, members: &[usize]) -> Vec<Option<Arc<dyn Transport<H>>>>;

    /// Drops packets left over from an earlier, failed run.
    fn drain(&self);

    /// An empty host buffer, from a pool shared by the group.
    fn buffer(&self) -> Vec<u8>;

    /// Returns a packet's bytes to the pool.
    fn recycle(&self, bytes: Vec<u8>);
}
