//! Where a frame from another process goes in this one: the routing
//! table the MPI thread fills and the ranks read.
//!
//! A frame names its route (group, run, receiving rank, sending rank,
//! lane). Where that rank has opened the route, the frame goes to its
//! channel, where the rank's receive waits with its own deadline; where
//! it has not yet (another process ran ahead into a new group), the frame
//! waits here until the route opens, within bounds (`EARLY_FRAMES`,
//! `EARLY_BYTES`): a process ahead by whole runs of traffic is
//! legitimate, one that sends without end is not. A frame is taken only
//! where the group's ranks live as it says, so no frame pairs with the
//! wrong receiver. Notices (a failure, a departure, a runtime's note) go
//! to whoever listens for the group; receipts and landing buffers are
//! kept here too, under the same lock.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crossbeam::channel::{Receiver, Sender, unbounded};

use super::Layout;
use super::wire::{HEADER, Kind, Route};
use crate::device::lock;
use crate::transport::pool::Pool;
use crate::transport::staging::{Landed, Landing};
use crate::transport::{LANES, Receipt};

/// Frames kept for routes not open yet (another process ran ahead), at
/// most, and their bytes: a process ahead by whole runs of traffic is
/// legitimate, one that sends without end is not.
pub(super) const EARLY_FRAMES: usize = 1 << 16;
const EARLY_BYTES: usize = 1 << 30;

/// A frame as a rank receives it: the packet header's bytes and the body.
pub(crate) struct Frame {
    pub header: [u8; HEADER],
    pub body: Arrived,
    /// Where the sender waits to hear that its message was taken: its
    /// process and the token it gave.
    pub reply: Option<(usize, u64)>,
}

/// Where a frame's body landed: in host memory from the pool, or in a
/// landing buffer of the rank it is for (a device step's bytes, where that
/// rank has a free one).
pub(crate) enum Arrived {
    Bytes(Vec<u8>),
    Landed(Landed),
}

/// The lane of a notice that says a rank returned from its closure.
pub(super) const DEPARTED: u8 = 1;
/// The lane of the notes a group's runtime sends its other processes,
/// words the hub carries without reading.
pub(super) const NOTES: u8 = 2;
/// Notices kept for groups that no one listens for yet (a process ahead
/// of this one into a new world), at most.
const EARLY_NOTICES: usize = 1024;

/// What the hub tells a group rather than one rank.
pub(crate) enum Notice {
    /// A rank of another process recorded a failure: the group's route
    /// (its run, and in `from` the rank that failed) and the error's text.
    Failed(Route, String),
    /// A rank of another process returned from its closure in the
    /// route's run (`from`): its peers fail at once, not at a deadline.
    Gone(Route),
    /// A process has sent nothing, not even its heartbeat, for `quiet`
    /// (more than the liveness window): it died, or hangs.
    Silent { process: usize, quiet: Duration },
    /// A note from the group's runtime in another process (what
    /// [`Hub::note`] sent), unread.
    Note(Vec<u8>),
    /// `process` sent what no engine sends (`what`): nothing more from it
    /// is taken, and every run with its ranks fails.
    Refused { process: usize, what: String },
}

/// A frame kept for a route not open yet, with what it is and the process
/// it came from: a group not made here when it came is checked once it is.
struct Early {
    frame: Frame,
    kind: Kind,
    sender: usize,
}

/// Routes and frames that came early, shared with the ranks.
#[derive(Default)]
pub(super) struct Routes {
    open: HashMap<Route, Sender<Frame>>,
    early: HashMap<Route, VecDeque<Early>>,
    /// Where each group's notices go.
    notices: HashMap<u64, Sender<Notice>>,
    /// Notices for groups no one listens for yet, oldest first.
    unheard: VecDeque<(u64, Notice)>,
    /// Where device steps' bytes for each (group, rank) land.
    landings: HashMap<(u64, u32), Arc<Landing>>,
    /// Sends waiting for their receiver's word, by token, with the route
    /// they went on.
    receipts: HashMap<u64, (Route, Receipt)>,
    /// The last token given.
    token: u64,
    /// The groups with ranks in this process, by id: where their ranks
    /// live, while the group does.
    groups: HashMap<u64, Weak<Layout>>,
    /// Frames and bytes kept in `early`.
    early_frames: usize,
    early_bytes: usize,
    /// Processes refused, and why: told to every group, those made later
    /// included.
    refused: Vec<(usize, String)>,
}

impl Routes {
    /// `layout`'s group has ranks in this process (`me`): frames for it
    /// are checked against where its ranks live, while it lives; those
    /// that came before, unchecked, are checked now. Returns the processes
    /// whose frames do not fit, and why (they are to be refused; their
    /// frames are dropped).
    pub(super) fn member(&mut self, layout: &Arc<Layout>, me: usize) -> Vec<(usize, String)> {
        self.groups.retain(|_, l| l.strong_count() > 0);
        self.groups.insert(layout.group, Arc::downgrade(layout));
        let kept: Vec<Route> = self
            .early
            .keys()
            .filter(|k| k.group == layout.group)
            .copied()
            .collect();
        let mut wrong = Vec::new();
        for route in kept {
            for e in self.take_early_checked(&route) {
                match self.check(route, e.kind, e.sender, me) {
                    Ok(true) => {
                        // Room: it was counted a moment ago.
                        let _ = self.keep_early(route, e.frame, (e.kind, e.sender));
                    }
                    Ok(false) => {}
                    Err(why) => wrong.push((e.sender, why)),
                }
            }
        }
        wrong
    }

    /// Opens `route`: frames for it go to the returned channel (those that
    /// came early first). Frames kept for the route's earlier epochs are
    /// stale (a failed run's): their buffers go back to `pool`.
    pub(super) fn open(&mut self, route: Route, pool: &Pool) -> Receiver<Frame> {
        let (tx, rx) = unbounded();
        let stale: Vec<Route> = self
            .early
            .keys()
            .filter(|k| {
                k.epoch < route.epoch
                    && Route {
                        epoch: route.epoch,
                        ..**k
                    } == route
            })
            .copied()
            .collect();
        for k in stale {
            for f in self.take_early(&k) {
                if let Arrived::Bytes(b) = f.body {
                    pool.give(b);
                }
            }
        }
        for f in self.take_early(&route) {
            let _ = tx.send(f);
        }
        self.open.insert(route, tx);
        rx
    }

    /// Closes `route`; frames that come for it later are kept until it
    /// opens again.
    pub(super) fn close(&mut self, route: &Route) {
        self.open.remove(route);
    }

    /// Where notices to `group` go from now on (those that came before
    /// first, and every refusal so far).
    pub(super) fn listen(&mut self, group: u64, to: Sender<Notice>) {
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.unheard)
            .into_iter()
            .partition(|(g, _)| *g == group);
        self.unheard = rest;
        for (_, notice) in mine {
            let _ = to.send(notice);
        }
        for (process, what) in &self.refused {
            let _ = to.send(Notice::Refused {
                process: *process,
                what: what.clone(),
            });
        }
        self.notices.insert(group, to);
    }

    /// Tells every group listening what `notice` makes.
    pub(super) fn tell_groups(&self, notice: impl Fn() -> Notice) {
        for n in self.notices.values() {
            let _ = n.send(notice());
        }
    }

    /// Process `from` is refused for `why`: every group hears it, those
    /// that listen later too.
    pub(super) fn refuse(&mut self, from: usize, why: String) {
        self.tell_groups(|| Notice::Refused {
            process: from,
            what: why.clone(),
        });
        self.refused.push((from, why));
    }

    /// A send on `route` waits for its receiver's word in `receipt`: the
    /// token its head carries.
    pub(super) fn awaiting(&mut self, route: Route, receipt: Receipt) -> u64 {
        self.token = self.token.wrapping_add(1).max(1);
        self.receipts.insert(self.token, (route, receipt));
        self.token
    }

    /// The receipt of the send with `token`, answered on `route` (back
    /// from its receiver); `None` where it names no send of ours, or not
    /// that one's receiver.
    pub(super) fn answered(&mut self, route: Route, token: u64) -> Option<Receipt> {
        let ours = self.receipts.get(&token).is_some_and(|(sent, _)| {
            sent.group == route.group && sent.to == route.from && sent.from == route.to
        });
        ours.then(|| self.receipts.remove(&token))
            .flatten()
            .map(|(_, r)| r)
    }

    /// Takes the receipts of `from`'s sends in `group` in runs before
    /// `epoch` (their runs are over: their works have ended).
    pub(super) fn forget(&mut self, group: u64, from: u32, epoch: u32) -> Vec<Receipt> {
        let old: Vec<u64> = self
            .receipts
            .iter()
            .filter(|(_, (r, _))| r.group == group && r.from == from && r.epoch != epoch)
            .map(|(&t, _)| t)
            .collect();
        old.iter()
            .filter_map(|t| self.receipts.remove(t))
            .map(|(_, r)| r)
            .collect()
    }

    /// Device steps' bytes for rank `to` of `group` land in `landing` from
    /// now on (`None`: in host memory).
    pub(super) fn land(&mut self, group: u64, to: u32, landing: Option<Arc<Landing>>) {
        match landing {
            Some(l) => self.landings.insert((group, to), l),
            None => self.landings.remove(&(group, to)),
        };
    }

    /// Where device steps' bytes for rank `to` of `group` land, if they
    /// land in a buffer of its own.
    pub(super) fn landing(&self, group: u64, to: u32) -> Option<Arc<Landing>> {
        self.landings.get(&(group, to)).cloned()
    }

    /// Takes the frames kept for `route`, oldest first.
    fn take_early(&mut self, route: &Route) -> impl Iterator<Item = Frame> + use<> {
        self.take_early_checked(route).into_iter().map(|e| e.frame)
    }

    /// The same, with what each is and where it came from.
    fn take_early_checked(&mut self, route: &Route) -> VecDeque<Early> {
        let frames = self.early.remove(route).unwrap_or_default();
        self.early_frames = self.early_frames.saturating_sub(frames.len());
        let bytes = frames
            .iter()
            .map(|e| e.frame.bytes())
            .fold(0, usize::saturating_add);
        self.early_bytes = self.early_bytes.saturating_sub(bytes);
        frames
    }

    /// Keeps `frame` (of `kind`, from process `sender`) until `route`
    /// opens, within the bounds; past them, says so.
    fn keep_early(
        &mut self,
        route: Route,
        frame: Frame,
        (kind, sender): (Kind, usize),
    ) -> Result<(), String> {
        let bytes = frame.bytes();
        let frames = self.early_frames.saturating_add(1);
        let total = self.early_bytes.saturating_add(bytes);
        if frames > EARLY_FRAMES || total > EARLY_BYTES {
            return Err(format!(
                "{frames} frames ({total} bytes) for routes not open here (at most \
                 {EARLY_FRAMES} frames, {EARLY_BYTES} bytes), the last for rank {} of group \
                 {:016x} in its run {}",
                route.to, route.group, route.epoch
            ));
        }
        self.early_frames = frames;
        self.early_bytes = total;
        self.early.entry(route).or_default().push_back(Early {
            frame,
            kind,
            sender,
        });
        Ok(())
    }

    /// Whether a frame on `route` from process `sender` may be taken by
    /// this process (`me`): its ranks must live where it says, in a group
    /// with ranks here. `Ok(false)`: the group has ended here, the frame
    /// is stale. A group not made here yet cannot be checked: its frames
    /// wait, bounded, and are checked when it is made (`member`).
    fn check(&self, route: Route, kind: Kind, sender: usize, me: usize) -> Result<bool, String> {
        let Some(weak) = self.groups.get(&route.group) else {
            return Ok(true);
        };
        let Some(layout) = weak.upgrade() else {
            return Ok(false);
        };
        let at = |rank: u32| {
            usize::try_from(rank)
                .ok()
                .and_then(|i| layout.process_of.get(i).copied())
        };
        let (to, from) = (at(route.to), at(route.from));
        let fine = match (kind, route.lane) {
            (Kind::Notice, NOTES) => usize::try_from(route.from).ok() == Some(sender),
            // A rank of the sender's returned.
            (Kind::Notice, DEPARTED) => from == Some(sender),
            // A failure names the rank it came from, which another
            // process's rank may have found (a mismatch with it).
            (Kind::Notice, _) => from.is_some(),
            _ => to == Some(me) && from == Some(sender) && usize::from(route.lane) < LANES,
        };
        let name = |p: Option<usize>| p.map_or("no process".into(), |p| format!("process {p}"));
        if fine {
            Ok(true)
        } else {
            Err(format!(
                "a frame (kind {}, lane {}) for rank {} (in {}) from rank {} (in {}) of group \
                 {:016x}, whose ranks are {}",
                kind as u8,
                route.lane,
                route.to,
                name(to),
                route.from,
                name(from),
                route.group,
                layout.process_of.len()
            ))
        }
    }
}

impl Frame {
    /// Bytes of host memory the frame holds.
    fn bytes(&self) -> usize {
        match &self.body {
            Arrived::Bytes(b) => b.capacity(),
            Arrived::Landed(_) => 0,
        }
        .saturating_add(HEADER)
    }
}

/// Hands a frame from process `sender` to its route in this process
/// (`me`), or keeps it until the route opens; a notice goes to whoever
/// listens for them. A frame of a group that has ended here comes back
/// (stale); one that is not what the engine sends is an error.
pub(super) fn deliver(
    routes: &Mutex<Routes>,
    route: Route,
    kind: Kind,
    frame: Frame,
    (sender, me): (usize, usize),
) -> Result<Option<Arrived>, String> {
    let mut r = lock(routes);
    if !r.check(route, kind, sender, me)? {
        return Ok(Some(frame.body));
    }
    if kind == Kind::Notice {
        let Arrived::Bytes(body) = frame.body else {
            return Ok(None);
        };
        let notice = match route.lane {
            DEPARTED => Notice::Gone(route),
            NOTES => Notice::Note(body),
            _ => Notice::Failed(route, String::from_utf8_lossy(&body).into_owned()),
        };
        match r.notices.get(&route.group) {
            Some(n) => {
                let _ = n.send(notice);
            }
            None => {
                // A process ahead of this one: its world here is not made yet.
                if r.unheard.len() >= EARLY_NOTICES {
                    r.unheard.pop_front();
                }
                r.unheard.push_back((route.group, notice));
            }
        }
        return Ok(None);
    }
    match r.open.get(&route) {
        Some(tx) => {
            if let Err(e) = tx.send(frame) {
                // The receiver is gone: keep it for a route opened anew.
                r.keep_early(route, e.0, (kind, sender))?;
            }
        }
        None => r.keep_early(route, frame, (kind, sender))?,
    }
    Ok(None)
}

#[cfg(test)]
#[allow(
    clippy::expect_used,
    clippy::panic,
    clippy::arithmetic_side_effects,
    reason = "a test: small sizes, a failed expectation is a failed test"
)]
mod tests {
    use super::*;

    /// A group's frames are taken only where its ranks live: to a rank of
    /// this process, from a rank of the sending process; a note
    /// names its process, a departure a rank of it, a failure a rank of
    /// the group; a group that ended here makes
    /// its frames stale; a group not made here yet cannot be checked.
    #[test]
    fn wire_checks_where_a_routes_ranks_live() {
        let layout = Arc::new(Layout {
            group: 9,
            process_of: vec![0, 0, 1, 1, 2, 2],
            meet: false,
            splits_meet: false,
        });
        let mut r = Routes::default();
        r.groups.insert(9, Arc::downgrade(&layout));
        let at = |to: u32, from: u32, lane: u8| Route {
            group: 9,
            epoch: 3,
            to,
            from,
            lane,
        };
        // This is process 1 (ranks 2, 3); the frame comes from process 2.
        let check = |route, kind| r.check(route, kind, 2, 1);
        for (to, from) in [(2, 4), (3, 5)] {
            assert_eq!(check(at(to, from, 0), Kind::Data), Ok(true));
            assert_eq!(check(at(to, from, 1), Kind::Device), Ok(true));
        }
        for (to, from, lane) in [
            (0, 4, 0),
            (2, 2, 0),
            (2, 0, 0),
            (6, 4, 0),
            (2, 6, 0),
            (2, 4, 2),
        ] {
            let Err(why) = check(at(to, from, lane), Kind::Data) else {
                panic!("a frame to {to} from {from} on lane {lane} was taken");
            };
            assert!(why.contains(&format!("for rank {to} ")), "{why}");
        }
        assert_eq!(check(at(0, 5, DEPARTED), Kind::Notice), Ok(true));
        assert!(check(at(0, 1, DEPARTED), Kind::Notice).is_err());
        assert_eq!(check(at(0, 1, 0), Kind::Notice), Ok(true));
        assert!(check(at(0, 6, 0), Kind::Notice).is_err());
        assert_eq!(check(at(0, 2, NOTES), Kind::Notice), Ok(true));
        assert!(check(at(0, 4, NOTES), Kind::Notice).is_err());
        // Another group: not made here yet.
        assert_eq!(
            r.check(
                Route {
                    group: 10,
                    ..at(0, 0, 0)
                },
                Kind::Data,
                2,
                1
            ),
            Ok(true)
        );
        drop(layout);
        assert_eq!(r.check(at(2, 4, 0), Kind::Data, 2, 1), Ok(false));
    }

    /// Frames that came before their group was made here are checked when
    /// it is: those that fit stay kept for their route, a process whose
    /// frame does not fit is named to be refused, and its frame goes.
    #[test]
    fn wire_checks_early_frames_when_their_group_is_made() {
        let frame = || Frame {
            header: [0u8; HEADER],
            body: Arrived::Bytes(vec![0u8; 8]),
            reply: None,
        };
        let at = |to: u32, from: u32| Route {
            group: 9,
            epoch: 0,
            to,
            from,
            lane: 0,
        };
        let mut r = Routes::default();
        // Process 1 (ranks 2, 3) to rank 0 here: fine. Process 2 claims
        // to send from rank 2, which lives in process 1.
        r.keep_early(at(0, 2), frame(), (Kind::Data, 1))
            .expect("room");
        r.keep_early(at(1, 2), frame(), (Kind::Data, 2))
            .expect("room");
        let layout = Arc::new(Layout {
            group: 9,
            process_of: vec![0, 0, 1, 1, 2, 2],
            meet: false,
            splits_meet: false,
        });
        let wrong = r.member(&layout, 0);
        assert_eq!(wrong.len(), 1, "{wrong:?}");
        assert_eq!(wrong[0].0, 2);
        assert!(
            wrong[0].1.contains("from rank 2 (in process 1)"),
            "{}",
            wrong[0].1
        );
        assert_eq!(r.early_frames, 1);
        assert_eq!(r.take_early(&at(0, 2)).count(), 1);
        assert_eq!(r.take_early(&at(1, 2)).count(), 0);
    }

    /// Frames for routes not open are kept up to `EARLY_FRAMES`, counted
    /// out again when their route opens; one more is an error naming the
    /// bound, and nothing is kept for it.
    #[test]
    fn wire_keeps_early_frames_within_bounds() {
        let frame = |len: usize| Frame {
            header: [0u8; HEADER],
            body: Arrived::Bytes(vec![0u8; len]),
            reply: None,
        };
        let route = |epoch: u32| Route {
            group: 1,
            epoch,
            to: 0,
            from: 1,
            lane: 0,
        };
        let mut r = Routes::default();
        for i in 0..EARLY_FRAMES {
            let epoch = u32::try_from(i % 2).expect("0 or 1");
            r.keep_early(route(epoch), frame(0), (Kind::Data, 1))
                .expect("within the bound");
        }
        let Err(why) = r.keep_early(route(0), frame(0), (Kind::Data, 1)) else {
            panic!("a frame past the bound was kept");
        };
        assert!(why.contains("for routes not open here"), "{why}");
        assert_eq!(r.early_frames, EARLY_FRAMES);
        assert_eq!(r.take_early(&route(1)).count(), EARLY_FRAMES / 2);
        assert_eq!(r.early_frames, EARLY_FRAMES / 2);
        r.keep_early(route(1), frame(100), (Kind::Data, 1))
            .expect("room again");
        // Bytes: one frame past EARLY_BYTES is refused.
        let mut r = Routes::default();
        r.keep_early(route(0), frame(EARLY_BYTES / 2), (Kind::Data, 1))
            .expect("half");
        assert!(
            r.keep_early(route(0), frame(EARLY_BYTES / 2), (Kind::Data, 1))
                .is_err()
        );
        assert_eq!(r.take_early(&route(0)).count(), 1);
        assert_eq!((r.early_frames, r.early_bytes), (0, 0));
    }
}
