//! The MPI backend: ranks in several processes.
//!
//! A group's ranks live in one or more processes. A hop between two ranks
//! of one process goes over the in-process backend (channels and loans,
//! as in a world of one process); a hop to another process goes to this
//! process's [`hub::Hub`], which hands it to the one thread that calls MPI
//! (`pump.rs`), as a frame routed by (group, receiver, sender, lane;
//! `routes.rs`), with the wire's format in `wire.rs` and who is still
//! there in `liveness.rs`. The runtime above sees one
//! [`Transport`] either way; it only learns that loans do not cross
//! processes ([`Transport::carries_loans`]).
//!
//! Groups are told apart on the wire by an id that every process derives
//! the same way: the world's from the order in which processes make their
//! worlds, a split's from its parent's, its sequence number and its color.

pub(crate) mod hub;
mod liveness;
mod pump;
pub(crate) mod raw;
mod routes;
pub(crate) mod wire;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crossbeam::channel::Receiver;

use self::hub::{Arrived, Frame, HEADER, Hub, Outgoing, Route};
use super::staging::Landing;
use super::{Body, Carried, Closed, LANES, Lane, Packet, Receipt, Transport, Wake};

/// A packet header that can cross a process boundary.
pub(crate) trait Header: Carried + Sized {
    /// Writes the header into `out` (at most [`HEADER`] bytes).
    fn encode(&self, out: &mut [u8; HEADER]);
    /// Reads a header written by `encode`; `None` if it is not one.
    fn decode(bytes: &[u8; HEADER]) -> Option<Self>;
}

/// Which ranks of a group live where.
pub(crate) struct Layout {
    /// The group's id on the wire.
    pub group: u64,
    /// Each rank's process.
    pub process_of: Vec<usize>,
    /// Where this group meets, when its ranks are all of one process and
    /// share its device (a split's; the world's own group is made as a
    /// device per rank even when it has a single process).
    pub meet: bool,
    /// The same for the groups `split` makes of this process's ranks alone.
    pub splits_meet: bool,
}

/// One rank's end of a group spread over processes.
pub(crate) struct Remote<H: Carried> {
    hub: Arc<Hub>,
    layout: Arc<Layout>,
    /// This rank in the group.
    me: usize,
    /// The in-process links of the group's ranks in this process.
    local: Arc<dyn Transport<H>>,
    /// Runs of the group so far: each process's ranks reset their links
    /// once per run, and a frame of another run is never taken for this
    /// one's (a process that starts the next run early sends into it).
    epoch: AtomicU32,
    /// Frames from each remote peer in this epoch, per lane (`peer * LANES
    /// + lane`).
    from: RwLock<Vec<Option<Receiver<Frame>>>>,
    /// Where device steps' bytes for this rank land (see `land_into`).
    landing: Mutex<Option<Arc<Landing>>>,
}

/// The ends of `layout`'s ranks that live in this process (`None` for the
/// others).
pub(crate) fn ends<H: Header>(
    hub: &Arc<Hub>,
    layout: Layout,
) -> Vec<Option<Arc<dyn Transport<H>>>> {
    let layout = Arc::new(layout);
    hub.member(&layout);
    let n = layout.process_of.len();
    // Ranks of several processes never all share one device: only a
    // group of this process's ranks alone has a `meet` (see `split`).
    let mut local = super::local::mesh::<H>(n, layout.meet).into_iter();
    (0..n)
        .map(|me| {
            let here = local.next()?;
            (layout.process_of.get(me) == Some(&hub.process))
                .then(|| Arc::new(Remote::open(hub.clone(), layout.clone(), me, here)) as _)
        })
        .collect()
}

impl<H: Carried> Remote<H> {
    fn open(hub: Arc<Hub>, layout: Arc<Layout>, me: usize, local: Arc<dyn Transport<H>>) -> Self {
        let from = RwLock::new(open_routes(&hub, &layout, me, 0));
        Remote {
            hub,
            layout,
            me,
            local,
            epoch: AtomicU32::new(0),
            from,
            landing: Mutex::new(None),
        }
    }

    fn remote(&self, peer: usize) -> Option<usize> {
        let p = *self.layout.process_of.get(peer)?;
        (p != self.hub.process).then_some(p)
    }
}

/// Opens the routes to `me` from every rank of another process, for
/// `epoch`.
fn open_routes(hub: &Hub, layout: &Layout, me: usize, epoch: u32) -> Vec<Option<Receiver<Frame>>> {
    let mine = layout.process_of.get(me).copied();
    layout
        .process_of
        .iter()
        .enumerate()
        .flat_map(|(peer, &p)| Lane::ALL.map(move |lane| (peer, p, lane)))
        .map(|(peer, p, lane)| {
            (Some(p) != mine).then(|| hub.open(route(layout, epoch, me, peer, lane)))
        })
        .collect()
}

/// The route of frames to `to` from `from` on `lane` in `layout`'s group.
fn route(layout: &Layout, epoch: u32, to: usize, from: usize, lane: Lane) -> Route {
    Route {
        group: layout.group,
        epoch,
        to: u32::try_from(to).unwrap_or(u32::MAX),
        from: u32::try_from(from).unwrap_or(u32::MAX),
        lane: lane as u8,
    }
}

/// A split's group id, the same in every process.
pub(crate) fn split_id(parent: u64, seq: u64, color: u32) -> u64 {
    crate::hash::fnv1a([parent, seq, u64::from(color)])
}

impl<H: Carried> Drop for Remote<H> {
    fn drop(&mut self) {
        self.close();
        let me = u32::try_from(self.me).unwrap_or(u32::MAX);
        self.hub.land(self.layout.group, me, None);
    }
}

impl<H: Carried> Remote<H> {
    /// Closes this epoch's routes.
    fn close(&self) {
        let epoch = self.epoch.load(Ordering::Acquire);
        let from = self.from.read().unwrap_or_else(|p| p.into_inner());
        for (i, rx) in from.iter().enumerate() {
            if rx.is_some() {
                let peer = i.checked_div(LANES).unwrap_or(0);
                if let Some(&lane) = Lane::ALL.get(i.checked_rem(LANES).unwrap_or(0)) {
                    self.hub
                        .close(&route(&self.layout, epoch, self.me, peer, lane));
                }
            }
        }
    }
}

impl<H: Header> Transport<H> for Remote<H> {
    fn send(&self, peer: usize, lane: Lane, packet: Packet<H>) -> Result<(), Closed> {
        let Some(process) = self.remote(peer) else {
            return self.local.send(peer, lane, packet);
        };
        let body = match packet.body {
            Body::Bytes(b) => Outgoing::Bytes(b),
            Body::Mapped(m) => Outgoing::Mapped(m),
            // Loans and device buffers never leave a process (the runtime
            // maps or copies them first: `carries_loans`, `takes_mapped`).
            Body::Loan(_) | Body::Resident(_) | Body::Landed(_) => return Err(Closed),
        };
        let mut header = [0u8; HEADER];
        packet.fp.encode(&mut header);
        let r = route(
            &self.layout,
            self.epoch.load(Ordering::Acquire),
            peer,
            self.me,
            lane,
        );
        // A send's receipt waits here for the receiver's word (a frame
        // back), or is dropped when the run ends.
        self.hub
            .send(process, r, &header, body, packet.receipt)
            .then_some(())
            .ok_or(Closed)
    }

    fn recv(&self, peer: usize, lane: Lane, limit: Duration) -> Result<Option<Packet<H>>, Closed> {
        if self.remote(peer).is_none() {
            return self.local.recv(peer, lane, limit);
        }
        let at = peer.saturating_mul(LANES).saturating_add(lane as usize);
        let rx = self
            .from
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(at)
            .and_then(Option::clone)
            .ok_or(Closed)?;
        let _waiting = self.hub.wait();
        let Some(frame) = self.local.wake().recv(&rx, limit)? else {
            return Ok(None);
        };
        let fp = H::decode(&frame.header).ok_or(Closed)?;
        let body = match frame.body {
            Arrived::Bytes(b) => Body::Bytes(b),
            Arrived::Landed(l) => Body::Landed(l),
        };
        // The sender waits for word of this one: the receipt goes back.
        let receipt = frame.reply.map(|(process, token)| {
            let hub = self.hub.clone();
            let back = route(
                &self.layout,
                self.epoch.load(Ordering::Acquire),
                peer,
                self.me,
                lane,
            );
            Receipt::new(move |verdict| hub.answer(process, back, token, verdict))
        });
        Ok(Some(Packet {
            fp,
            from: peer,
            body,
            receipt,
        }))
    }

    fn meeting(&self) -> Option<Arc<H::Meeting>> {
        self.local.meeting()
    }

    fn wake(&self) -> &Arc<Wake> {
        // One wake for both kinds of peer: a rank waits on one at a time.
        self.local.wake()
    }

    fn carries_loans(&self, peer: usize) -> bool {
        self.remote(peer).is_none()
    }

    fn takes_mapped(&self, peer: usize) -> bool {
        self.remote(peer).is_some()
    }

    /// This process's ranks share one device exactly where the groups
    /// split of them alone meet there.
    fn shares_device(&self, peer: usize) -> bool {
        self.layout.splits_meet
            && peer != self.me
            && self.layout.process_of.get(peer) == Some(&self.hub.process)
    }

    fn lands(&self) -> bool {
        self.layout
            .process_of
            .iter()
            .any(|&p| p != self.hub.process)
    }

    fn land_into(&self, landing: &Arc<Landing>) {
        let mut now = self.landing.lock().unwrap_or_else(|p| p.into_inner());
        if now.as_ref().is_some_and(|l| Arc::ptr_eq(l, landing)) {
            return;
        }
        *now = Some(landing.clone());
        let me = u32::try_from(self.me).unwrap_or(u32::MAX);
        self.hub.land(self.layout.group, me, Some(landing.clone()));
    }

    fn split(&self, seq: u64, color: u32, members: &[usize]) -> Vec<Option<Arc<dyn Transport<H>>>> {
        let process_of: Vec<usize> = members
            .iter()
            .map(|&r| self.layout.process_of.get(r).copied().unwrap_or(usize::MAX))
            .collect();
        let here = process_of.iter().all(|&p| p == self.hub.process);
        let layout = Layout {
            group: split_id(self.layout.group, seq, color),
            process_of,
            meet: self.layout.splits_meet && here,
            splits_meet: self.layout.splits_meet,
        };
        ends(&self.hub, layout)
    }

    /// Starts the next run: this run's frames that are left are dropped,
    /// and frames of the next that came early (another process started
    /// it first) wait in the hub for the new routes.
    fn drain(&self) {
        self.local.drain();
        self.close();
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        // The last run's sends are over, whatever their receivers said.
        let me = u32::try_from(self.me).unwrap_or(u32::MAX);
        self.hub.forget(self.layout.group, me, epoch);
        let fresh = open_routes(&self.hub, &self.layout, self.me, epoch);
        let old = std::mem::replace(
            &mut *self.from.write().unwrap_or_else(|p| p.into_inner()),
            fresh,
        );
        for rx in old.iter().flatten() {
            while let Ok(f) = rx.try_recv() {
                if let Arrived::Bytes(b) = f.body {
                    self.hub.recycle(b);
                }
            }
        }
    }

    fn buffer(&self) -> Vec<u8> {
        self.hub.buffer()
    }

    fn recycle(&self, bytes: Vec<u8>) {
        self.hub.recycle(bytes);
    }
}
