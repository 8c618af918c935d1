//! The one thread of a process that calls MPI.
//!
//! Where the engine initialises MPI, it does so on this thread
//! (`MPI_THREAD_FUNNELED`: every call from the thread that initialised
//! it), so that `World::from_mpi` never depends on an MPI library built
//! for `MPI_THREAD_MULTIPLE`; inside an application that initialised MPI
//! itself, this thread calls MPI beside the application's, which needs
//! `MPI_THREAD_MULTIPLE` (`World::from_mpi_comm` checks). Either way the
//! hub works on its own duplicate of the communicator, so that no
//! message of the application's matches one of the engine's. Ranks hand it frames to
//! send; it keeps every send in flight at once (non-blocking, each holding
//! its bytes), probes for frames from any process, and routes each to the
//! channel of the rank and lane it is addressed to, where that rank's
//! receive waits with its own deadline. A frame that arrives before its
//! receiver has opened its route (another process ran ahead into a new
//! group) waits in the hub until the route opens.
//!
//! A frame is two MPI messages to the same process: a fixed-size head
//! (route, body length, receipt token, header) on tag `HEAD`, then the
//! body on tag
//! `BODY`. MPI keeps messages of one (source, tag) in order, so the k-th
//! body from a process belongs to its k-th head, and bodies land straight
//! in pooled buffers without a copy.
//!
//! Between frames the thread yields while anything is in flight and
//! sleeps (up to `IDLE_MAX`) when nothing is: MPI's progress needs calls,
//! but the ranks' devices need the cores.
//!
//! The wire is not trusted: a garbled head, a process of another version
//! or anything else on the engine's communicator must not make this
//! process allocate what its bytes say, abort, or pair a frame with the
//! wrong receiver. Every message is probed before it is received: a head
//! must be a head's size, of a known kind, with a body no longer than the
//! cap (the largest buffer this process's devices hold, or `NOTE_MAX` for
//! the hub's own notes), on a route whose ranks live where it says; the
//! body must be the length its head said; frames kept for routes not yet
//! open are bounded (`EARLY_FRAMES`, `EARLY_BYTES`). A process that breaks
//! any of this is refused: nothing more from it is taken (its messages are
//! received into nothing), and every group hears why, naming it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use mpi::datatype::Equivalence;
use mpi::point_to_point::{Message, Source, Status};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use super::Layout;
use super::raw::{self, Sending};
use super::wire::{
    DROPPED, HEAD, Head, Kind, REFUSED, TAG_BODY, TAG_HEAD, TAKEN, decode_head, encode_head, stamp,
};
pub(crate) use super::wire::{HEADER, Outgoing, Route};
use crate::device::lock;
use crate::transport::pool::Pool;
use crate::transport::staging::{Landed, Landing};
use crate::transport::{LANES, Receipt, Verdict};

/// How long a head's body may take to follow it.
const BODY_WAIT: Duration = Duration::from_secs(10);
/// Frames kept for routes not open yet (another process ran ahead), at
/// most, and their bytes: a process ahead by whole runs of traffic is
/// legitimate, one that sends without end is not.
const EARLY_FRAMES: usize = 1 << 16;
const EARLY_BYTES: usize = 1 << 30;

/// How long `MPI_Init` may take.
const INIT: Duration = Duration::from_secs(120);

/// How long a process on its way out waits for its last sends and
/// `MPI_Finalize`.
const FINISH: Duration = Duration::from_secs(20);
/// The same, after a failure.
const FINISH_FAILED: Duration = Duration::from_secs(3);

/// Sleeps between idle probes grow to this.
const IDLE_MAX: Duration = Duration::from_micros(500);
/// Idle probes that only yield before the sleeps start.
const SPINS: u32 = 64;

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
const DEPARTED: u8 = 1;
/// The lane of healing's notes (`runtime/heal/span.rs`).
const HEALING: u8 = 2;
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
    /// A note of the group's healing, from another process.
    Heal(Vec<u8>),
    /// `process` sent what no engine sends (`what`): nothing more from it
    /// is taken, and every run with its ranks fails.
    Refused { process: usize, what: String },
}

/// Head buffers kept for reuse.
const SPARE_HEADS: usize = 256;

/// How often a process tells the others it is alive.
const BEAT: Duration = Duration::from_millis(100);

// A send carries its mapping by value: boxing it would allocate per frame.
#[allow(clippy::large_enum_variant)]
enum Command {
    Send {
        process: usize,
        head: [u8; HEAD],
        body: Outgoing,
    },
    /// Every process's `mine`, in process order (a blocking all-gather:
    /// only while no frames are expected, when a world is made).
    AllGather {
        mine: Vec<u64>,
        reply: Sender<Vec<u64>>,
    },
    /// Says goodbye to every process and hears theirs, sends what is in
    /// flight (all within the limit), then frees the communicator (and
    /// finalises MPI where the hub initialised it).
    Finish(Duration),
    /// Sends `bytes` with `tag` as they are: a test's forged message.
    Raw {
        process: usize,
        tag: i32,
        bytes: Vec<u8>,
    },
}

/// Routes and frames that came early, shared with the ranks.
#[derive(Default)]
struct Routes {
    open: HashMap<Route, Sender<Frame>>,
    early: HashMap<Route, VecDeque<Frame>>,
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

/// Where a hub's communicator comes from.
pub(crate) enum Start {
    /// The hub initialises MPI (`MPI_THREAD_FUNNELED`, on its thread),
    /// works on a duplicate of `MPI_COMM_WORLD`, and finalises MPI when
    /// it ends.
    Init,
    /// The application initialised MPI: the hub works on this duplicate
    /// of the application's communicator, frees it when it ends, and
    /// leaves MPI as it found it.
    Given(raw::Duplicate),
}

impl Routes {
    /// Takes the frames kept for `route`, oldest first.
    fn take_early(&mut self, route: &Route) -> VecDeque<Frame> {
        let frames = self.early.remove(route).unwrap_or_default();
        self.early_frames = self.early_frames.saturating_sub(frames.len());
        let bytes = frames
            .iter()
            .map(Frame::bytes)
            .fold(0, usize::saturating_add);
        self.early_bytes = self.early_bytes.saturating_sub(bytes);
        frames
    }

    /// Keeps `frame` until `route` opens, within the bounds; past them,
    /// says so.
    fn keep_early(&mut self, route: Route, frame: Frame) -> Result<(), String> {
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
        self.early.entry(route).or_default().push_back(frame);
        Ok(())
    }

    /// Whether a frame on `route` from process `sender` may be taken by
    /// this process (`me`): its ranks must live where it says, in a group
    /// with ranks here. `Ok(false)`: the group has ended here, the frame
    /// is stale. A group not made here yet cannot be checked (its frames
    /// wait, bounded).
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
            (Kind::Notice, HEALING) => usize::try_from(route.from).ok() == Some(sender),
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

/// What the MPI thread shares with the ranks.
struct Shared {
    routes: Arc<Mutex<Routes>>,
    pool: Arc<Pool>,
    waiting: Arc<AtomicUsize>,
    liveness: Arc<AtomicU64>,
    cap: Arc<AtomicU64>,
}

/// This process's end of MPI.
pub(crate) struct Hub {
    commands: Sender<Command>,
    routes: Arc<Mutex<Routes>>,
    pool: Arc<Pool>,
    /// This process's rank among the job's processes, and their count.
    pub process: usize,
    pub processes: usize,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A failure was seen: MPI_Finalize gets less time.
    failed: AtomicBool,
    /// Ranks waiting for a frame from another process: while any is, the
    /// thread keeps probing instead of sleeping.
    waiting: Arc<AtomicUsize>,
    /// How long another process may stay silent before its ranks count as
    /// failed (ms; 0: not watched yet).
    liveness: Arc<AtomicU64>,
    /// Worlds made over this hub so far: every process makes them in the
    /// same order (SPMD), so the count names a world on the wire.
    pub worlds: AtomicU64,
    /// The longest data frame's body taken from the wire (bytes; 0 until
    /// a world says how large its devices' buffers are).
    cap: Arc<AtomicU64>,
}

/// A rank's wait for a frame, counted while it lasts (see `Hub::waiting`).
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drop for Hub {
    /// Sends what is still in flight, then finalises MPI (bounded: a
    /// process never hangs on its way out).
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Hub {
    /// Starts serving on a thread of its own, over a communicator that
    /// `start` says where it comes from.
    pub(crate) fn start(start: Start) -> Result<Hub, String> {
        let (commands, rx) = unbounded();
        let routes = Arc::new(Mutex::new(Routes::default()));
        let pool = Arc::new(Pool::new(256));
        let (ready_tx, ready_rx) = bounded(1);
        let waiting = Arc::new(AtomicUsize::new(0));
        let liveness = Arc::new(AtomicU64::new(0));
        let cap = Arc::new(AtomicU64::new(0));
        let shared = Shared {
            routes: routes.clone(),
            pool: pool.clone(),
            waiting: waiting.clone(),
            liveness: liveness.clone(),
            cap: cap.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("mpi-hub".into())
            .spawn(move || serve(start, rx, &shared, ready_tx))
            .map_err(|e| format!("spawning the MPI thread: {e}"))?;
        let (process, processes) = ready_rx.recv_timeout(INIT).map_err(|e| match e {
            RecvTimeoutError::Timeout => format!(
                "MPI_Init did not return within {INIT:?} (is this process started by mpirun?)"
            ),
            RecvTimeoutError::Disconnected => {
                "the MPI thread ended before MPI was initialised".to_string()
            }
        })??;
        Ok(Hub {
            commands,
            routes,
            pool,
            process,
            processes,
            thread: Mutex::new(Some(thread)),
            failed: AtomicBool::new(false),
            waiting,
            liveness,
            worlds: AtomicU64::new(0),
            cap,
        })
    }

    /// Data frames up to `bytes` long are taken from now on (the largest
    /// buffer a world's devices hold: no engine sends a longer one).
    pub(crate) fn allow(&self, bytes: u64) {
        self.cap.fetch_max(bytes, Ordering::AcqRel);
    }

    /// `layout`'s group has ranks in this process: frames for it are
    /// checked against where its ranks live, while it lives.
    pub(crate) fn member(&self, layout: &Arc<Layout>) {
        let mut r = lock(&self.routes);
        r.groups.retain(|_, l| l.strong_count() > 0);
        r.groups.insert(layout.group, Arc::downgrade(layout));
    }

    /// Sends `process` what no engine sends, as `what` names it, on the
    /// world `group` of `local` ranks per process (a test's injection: see
    /// `World::forge_wire`). Returns false for a name it does not know.
    pub(crate) fn forge(&self, process: usize, group: u64, local: usize, what: &str) -> bool {
        let raw = |tag: i32, bytes: Vec<u8>| Command::Raw {
            process,
            tag,
            bytes,
        };
        // A data frame from this process's first rank to the receiver's.
        let first = |p: usize| u32::try_from(p.saturating_mul(local)).unwrap_or(u32::MAX);
        let (me, them) = (first(self.process), first(process));
        let route = |to: u32| Route {
            group,
            epoch: 0,
            to,
            from: me,
            lane: 0,
        };
        let sends: Vec<Command> = match what {
            "short-head" => vec![raw(TAG_HEAD, vec![7; 7])],
            "stray-tag" => vec![raw(TAG_HEAD.wrapping_add(40), vec![0; 16])],
            "kind" => {
                let mut h = encode_head(Kind::Data, route(them), &[], 4, 0);
                if let Some(k) = h.get_mut(17) {
                    *k = 0xee;
                }
                vec![raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, vec![0; 4])]
            }
            "long-body" => {
                let h = encode_head(Kind::Data, route(them), &[], usize::MAX >> 1, 0);
                vec![raw(TAG_HEAD, h.to_vec())]
            }
            "short-body" => {
                let h = encode_head(Kind::Data, route(them), &[], 64, 0);
                vec![raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, vec![0; 8])]
            }
            "route" => {
                // To a rank of the sender's own process.
                let h = encode_head(Kind::Data, route(me), &[], 4, 0);
                vec![raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, vec![0; 4])]
            }
            "flood" => {
                let early = Route {
                    group: group ^ 0x5eed,
                    ..route(them)
                };
                let h = encode_head(Kind::Data, early, &[], 0, 0);
                (0..=EARLY_FRAMES)
                    .flat_map(|_| [raw(TAG_HEAD, h.to_vec()), raw(TAG_BODY, Vec::new())])
                    .collect()
            }
            _ => return false,
        };
        // Paced, a few hundred frames in flight at a time, as the engine's
        // own traffic is: a flood posted at once makes MPI's progress, not
        // the receiver's checks, what the test measures.
        let mut sent = 0usize;
        sends.into_iter().all(|c| {
            sent = sent.saturating_add(1);
            if sent % 512 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.commands.send(c).is_ok()
        })
    }

    /// Watches the other processes from now on: one silent (not even a
    /// heartbeat) for longer than `window` is reported to every group's
    /// listener. The shortest window asked for wins.
    pub(crate) fn watch(&self, window: Duration) {
        let ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
        let _ = self
            .liveness
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(if now == 0 { ms } else { now.min(ms) })
            });
    }

    /// Counts a rank as waiting for a frame until the guard drops.
    pub(crate) fn wait(&self) -> Waiting<'_> {
        self.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(&self.waiting)
    }

    /// Sends a frame to `process`; `receipt`, when given, is told what
    /// the receiver says of it (or dropped, untold, when its route's run
    /// ends first: see `forget`).
    pub(crate) fn send(
        &self,
        process: usize,
        route: Route,
        header: &[u8],
        body: Outgoing,
        receipt: Option<Receipt>,
    ) -> bool {
        let kind = match body {
            Outgoing::Mapped(_) => Kind::Device,
            Outgoing::Bytes(_) => Kind::Data,
        };
        let token = receipt.map_or(0, |r| {
            let mut routes = lock(&self.routes);
            routes.token = routes.token.wrapping_add(1).max(1);
            let token = routes.token;
            routes.receipts.insert(token, (route, r));
            token
        });
        let head = encode_head(kind, route, header, body.as_ref().len(), token);
        self.commands
            .send(Command::Send {
                process,
                head,
                body,
            })
            .is_ok()
    }

    /// Tells the sender in `process` of the message that came on `route`
    /// with `token` what its receiver said of it.
    pub(crate) fn answer(&self, process: usize, route: Route, token: u64, verdict: Verdict) {
        let body = match verdict {
            Verdict::Taken => vec![TAKEN],
            Verdict::Refused(theirs) => {
                let mut b = vec![REFUSED];
                b.extend_from_slice(theirs.as_bytes());
                b
            }
            Verdict::Dropped => vec![DROPPED],
        };
        let head = encode_head(Kind::Receipt, route, &[], body.len(), token);
        let _ = self.commands.send(Command::Send {
            process,
            head,
            body: Outgoing::Bytes(body),
        });
    }

    /// Drops the receipts of `from`'s sends in `group` in runs before
    /// `epoch` (their runs are over: their works have ended).
    pub(crate) fn forget(&self, group: u64, from: u32, epoch: u32) {
        let mut routes = lock(&self.routes);
        let old: Vec<u64> = routes
            .receipts
            .iter()
            .filter(|(_, (r, _))| r.group == group && r.from == from && r.epoch != epoch)
            .map(|(&t, _)| t)
            .collect();
        let gone: Vec<(Route, Receipt)> = old
            .iter()
            .filter_map(|t| routes.receipts.remove(t))
            .collect();
        drop(routes);
        drop(gone);
    }

    /// Tells every other process's group `group` that `from` failed in
    /// run `epoch`, and why.
    pub(crate) fn notify(&self, group: u64, epoch: u32, from: u32, text: &str) {
        self.failed(true);
        let body = text.as_bytes().to_vec();
        let route = Route {
            group,
            epoch,
            to: 0,
            from,
            lane: 0,
        };
        for process in (0..self.processes).filter(|&p| p != self.process) {
            let head = encode_head(Kind::Notice, route, &[], body.len(), 0);
            let _ = self.commands.send(Command::Send {
                process,
                head,
                body: Outgoing::Bytes(body.clone()),
            });
        }
    }

    /// Tells every other process's group `group` that its rank `from`
    /// returned from its closure in run `epoch` (a notice on lane 1: not
    /// a failure).
    pub(crate) fn depart(&self, group: u64, epoch: u32, from: u32) {
        let route = Route {
            group,
            epoch,
            to: 0,
            from,
            lane: DEPARTED,
        };
        for process in (0..self.processes).filter(|&p| p != self.process) {
            let head = encode_head(Kind::Notice, route, &[], 0, 0);
            let _ = self.commands.send(Command::Send {
                process,
                head,
                body: Outgoing::Bytes(Vec::new()),
            });
        }
    }

    /// Healing's `words` for group `group`'s run `epoch`: to process 0,
    /// or to every other process when `to_all` (a notice on lane 2).
    pub(crate) fn heal(&self, group: u64, epoch: u32, to_all: bool, words: Vec<u8>) {
        let route = Route {
            group,
            epoch,
            to: 0,
            from: u32::try_from(self.process).unwrap_or(u32::MAX),
            lane: HEALING,
        };
        let head = encode_head(Kind::Notice, route, &[], words.len(), 0);
        if !to_all {
            let _ = self.commands.send(Command::Send {
                process: 0,
                head,
                body: Outgoing::Bytes(words),
            });
            return;
        }
        for process in (0..self.processes).filter(|&p| p != self.process) {
            let _ = self.commands.send(Command::Send {
                process,
                head,
                body: Outgoing::Bytes(words.clone()),
            });
        }
    }

    /// Device steps' bytes for rank `to` of `group` land in `landing` from
    /// now on (`None`: in host memory).
    pub(crate) fn land(&self, group: u64, to: u32, landing: Option<Arc<Landing>>) {
        let mut r = lock(&self.routes);
        match landing {
            Some(l) => r.landings.insert((group, to), l),
            None => r.landings.remove(&(group, to)),
        };
    }

    /// Where notices from other processes to `group` go from now on
    /// (those that came before first).
    pub(crate) fn on_notice(&self, group: u64, to: Sender<Notice>) {
        let mut r = lock(&self.routes);
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut r.unheard)
            .into_iter()
            .partition(|(g, _)| *g == group);
        r.unheard = rest;
        for (_, notice) in mine {
            let _ = to.send(notice);
        }
        for (process, what) in &r.refused {
            let _ = to.send(Notice::Refused {
                process: *process,
                what: what.clone(),
            });
        }
        r.notices.insert(group, to);
    }

    /// Opens `route`: frames for it go to the returned channel (those that
    /// came early first). Frames kept for the route's earlier epochs are
    /// stale (a failed run's) and dropped.
    pub(crate) fn open(&self, route: Route) -> Receiver<Frame> {
        let (tx, rx) = unbounded();
        let mut r = lock(&self.routes);
        let stale: Vec<Route> = r
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
            for f in r.take_early(&k) {
                if let Arrived::Bytes(b) = f.body {
                    self.pool.give(b);
                }
            }
        }
        for f in r.take_early(&route) {
            let _ = tx.send(f);
        }
        r.open.insert(route, tx);
        rx
    }

    /// Closes `route`; frames that come for it later are kept until it
    /// opens again.
    pub(crate) fn close(&self, route: &Route) {
        lock(&self.routes).open.remove(route);
    }

    /// Every process's `mine` (each the same length), in process order.
    pub(crate) fn all_gather(&self, mine: Vec<u64>, limit: Duration) -> Result<Vec<u64>, String> {
        let (reply, rx) = bounded(1);
        self.commands
            .send(Command::AllGather { mine, reply })
            .map_err(|_| "the MPI thread has stopped".to_string())?;
        rx.recv_timeout(limit)
            .map_err(|_| format!("the processes did not all meet within {limit:?}"))
    }

    /// An empty buffer from the pool.
    pub(crate) fn buffer(&self) -> Vec<u8> {
        self.pool.take()
    }

    /// Returns a buffer to the pool.
    pub(crate) fn recycle(&self, v: Vec<u8>) {
        self.pool.give(v);
    }

    /// Records that the process saw a failure (then MPI is not finalised).
    pub(crate) fn failed(&self, failed: bool) {
        if failed {
            self.failed.store(true, Ordering::Release);
        }
    }

    /// Sends what is in flight and finalises MPI, once; waits a bounded
    /// time for it (then the process may end without it, which mpirun
    /// reports). After a failure a peer may be dead and `MPI_Finalize`
    /// wait for it: then the wait is shorter.
    pub(crate) fn shutdown(&self) {
        let failed = self.failed.load(Ordering::Acquire);
        self.finish(if failed { FINISH_FAILED } else { FINISH });
    }

    fn finish(&self, limit: Duration) {
        let _ = self.commands.send(Command::Finish(limit));
        let Some(t) = lock(&self.thread).take() else {
            return;
        };
        // The MPI thread gives up at `limit`; freeing the communicator or
        // finalising takes a moment more.
        let deadline = crate::deadline::after(limit.saturating_add(FINISH_FAILED));
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

/// The MPI thread: initialises MPI, says so through `ready`, then serves.
fn serve(
    start: Start,
    commands: Receiver<Command>,
    shared: &Shared,
    ready: Sender<Result<(usize, usize), String>>,
) {
    let (universe, world) = match start {
        Start::Init => {
            let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            else {
                let _ = ready.send(Err(
                    "MPI was already initialised in this process: an application that \
                     initialises MPI itself makes its worlds with World::from_mpi_comm"
                        .into(),
                ));
                return;
            };
            // The engine's messages never match the application's.
            let world = universe.world().duplicate();
            (Some(universe), world)
        }
        Start::Given(dup) => (None, dup.adopt()),
    };
    if let Err(e) = raw::errors_return(&world) {
        let _ = ready.send(Err(format!(
            "MPI_Comm_set_errhandler failed (code {})",
            e.0
        )));
        return;
    }
    let process = usize::try_from(world.rank()).unwrap_or(0);
    let processes = usize::try_from(world.size()).unwrap_or(1);
    let generation = agree_generation(&world, processes);
    let _ = ready.send(Ok((process, processes)));
    pump(&world, generation, &commands, shared);
    // MPI_Comm_free of the duplicate.
    drop(world);
    // MPI_Finalize, where the hub initialised MPI: a dead peer can hold
    // it; `Hub::finish` bounds the wait.
    drop(universe);
}

/// The next generation this process's hubs may take (see
/// `agree_generation`).
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

/// This hub's generation, the same on every process of `world`, and
/// greater than that of every hub any of them had before.
///
/// A communicator freed by one hub may give its context id to the next
/// one duplicated (`World::from_mpi_comm` after a world is dropped), and
/// Open MPI hands a message that arrives for a freed context to the next
/// communicator that takes it: a message of the old world that was still
/// on its way (a heartbeat, a goodbye, a frame of a failed run) would be
/// taken as the new world's. Every head carries its hub's generation, and
/// a head of another one is dropped with its body.
fn agree_generation(world: &SimpleCommunicator, processes: usize) -> u64 {
    let next = GENERATIONS.load(Ordering::Acquire);
    let mut all = vec![0u64; processes];
    world.all_gather_into(&next, &mut all[..]);
    let generation = all.into_iter().max().unwrap_or(next);
    GENERATIONS.fetch_max(generation.saturating_add(1), Ordering::AcqRel);
    generation
}

/// What the MPI thread keeps between rounds.
struct Pump<'a> {
    world: &'a SimpleCommunicator,
    routes: &'a Mutex<Routes>,
    pool: &'a Pool,
    /// The longest data frame taken (see `Hub::allow`).
    cap: &'a AtomicU64,
    /// This process's rank among the job's.
    me: usize,
    /// This hub's generation (`agree_generation`).
    generation: u64,
    /// Processes refused: their messages are received into nothing.
    refused: Vec<bool>,
    /// Sends in flight, each holding its bytes.
    sending: Vec<Sending>,
    /// Spare head buffers: kept apart from the body pool, so that a body
    /// never lands in a buffer too small for it (and grows it anew).
    heads: Vec<Vec<u8>>,
    /// Told to finish: when, and how long it may take.
    finish: Option<(Instant, Duration)>,
    head: [u8; HEAD],
    /// When each process was last heard from (any frame, or a heartbeat).
    heard: Vec<Instant>,
    /// Processes that said goodbye, or were found silent, or were refused.
    gone: Vec<bool>,
    /// Processes that said goodbye.
    bye: Vec<bool>,
    /// When this process last sent its heartbeat.
    beat: Instant,
    /// How long a process may stay silent (ms; 0 until a world sets it).
    liveness: &'a AtomicU64,
}

/// Serves until told to finish and its sends are done (or given up).
fn pump<'a>(
    world: &'a SimpleCommunicator,
    generation: u64,
    commands: &Receiver<Command>,
    shared: &'a Shared,
) {
    let processes = usize::try_from(world.size()).unwrap_or(1);
    let waiting = &shared.waiting;
    let mut p = Pump {
        world,
        routes: &shared.routes,
        pool: &shared.pool,
        cap: &shared.cap,
        me: usize::try_from(world.rank()).unwrap_or(0),
        generation,
        refused: vec![false; processes],
        sending: Vec::new(),
        heads: Vec::new(),
        finish: None,
        head: [0u8; HEAD],
        heard: vec![Instant::now(); processes],
        gone: (0..processes)
            .map(|q| i32::try_from(q).ok() == Some(world.rank()))
            .collect(),
        bye: vec![false; processes],
        beat: Instant::now(),
        liveness: &shared.liveness,
    };
    let mut idle: u32 = 0;
    loop {
        let mut busy = false;
        while let Ok(c) = commands.try_recv() {
            busy = true;
            p.handle(c);
        }
        busy |= p.receive();
        busy |= p.reap();
        p.keep_alive();
        // Every process's goodbye heard (each the last it sends here) and
        // ours sent: nothing of this hub is left on the wire.
        if let Some((since, limit)) = p.finish {
            let heard = p.gone.iter().all(|&g| g);
            if (p.sending.is_empty() && heard) || since.elapsed() > limit {
                return;
            }
        }
        if busy {
            idle = 0;
        } else if !p.sending.is_empty() || waiting.load(Ordering::Acquire) > 0 || idle < SPINS {
            // MPI progresses only inside calls: keep calling, but let the
            // ranks' threads run in between.
            idle = idle.saturating_add(1);
            std::thread::yield_now();
        } else {
            idle = idle.saturating_add(1);
            let shift = idle.saturating_sub(SPINS).min(5);
            let nap = Duration::from_micros(16u64 << shift).min(IDLE_MAX);
            match commands.recv_timeout(nap) {
                Ok(c) => {
                    p.handle(c);
                    idle = 0;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

impl Pump<'_> {
    fn handle(&mut self, c: Command) {
        match c {
            Command::Send {
                process,
                head,
                body,
            } => {
                let to = i32::try_from(process).unwrap_or(i32::MAX);
                let mut first = self.heads.pop().unwrap_or_default();
                first.clear();
                first.extend_from_slice(&head);
                self.stamp(&mut first);
                for (tag, bytes) in [(TAG_HEAD, Outgoing::Bytes(first)), (TAG_BODY, body)] {
                    match raw::isend(self.world, to, tag, bytes) {
                        Ok(s) => self.sending.push(s),
                        Err((code, bytes)) => {
                            tracing::error!(process, code = code.0, "MPI_Isend failed");
                            self.give_back(bytes);
                        }
                    }
                }
            }
            Command::AllGather { mine, reply } => {
                let n = usize::try_from(self.world.size()).unwrap_or(1);
                let mut all = vec![0u64; mine.len().saturating_mul(n)];
                self.world.all_gather_into(&mine[..], &mut all[..]);
                let _ = reply.send(all);
                // Every process took part: however long it blocked this
                // thread, none of them is silent.
                let now = Instant::now();
                self.heard.iter_mut().for_each(|t| *t = now);
            }
            Command::Finish(limit) => {
                self.farewell();
                self.finish = Some((Instant::now(), limit));
            }
            Command::Raw {
                process,
                tag,
                mut bytes,
            } => {
                // A forged head is this hub's (else it would be dropped
                // as another's, not refused).
                if tag == TAG_HEAD && bytes.len() == HEAD {
                    self.stamp(&mut bytes);
                }
                let to = i32::try_from(process).unwrap_or(i32::MAX);
                match raw::isend(self.world, to, tag, Outgoing::Bytes(bytes)) {
                    Ok(s) => self.sending.push(s),
                    Err((code, _)) => tracing::error!(process, code = code.0, "MPI_Isend failed"),
                }
            }
        }
    }

    /// Refuses process `from` for `why`: nothing more from it is taken,
    /// and every group hears it (those made later too).
    fn refuse(&mut self, from: usize, why: String) {
        let Some(r) = self.refused.get_mut(from).filter(|r| !**r) else {
            return;
        };
        *r = true;
        // Its silence is no news from now on.
        if let Some(g) = self.gone.get_mut(from) {
            *g = true;
        }
        tracing::error!(process = from, why, "MPI: a process sent junk; refused");
        let mut routes = lock(self.routes);
        for n in routes.notices.values() {
            let _ = n.send(Notice::Refused {
                process: from,
                what: why.clone(),
            });
        }
        routes.refused.push((from, why));
    }

    /// Writes this hub's generation into `head`.
    fn stamp(&self, head: &mut [u8]) {
        stamp(head, self.generation);
    }

    /// Says goodbye to every other process that may still hear it: those
    /// that said theirs too (they wait for ours), not those found silent
    /// or refused.
    fn farewell(&mut self) {
        self.tell(Kind::Bye, |p, q| {
            p.bye.get(q).copied().unwrap_or(false) || !p.gone.get(q).copied().unwrap_or(true)
        });
    }

    /// Sends `kind` (no route, no body) to every process not gone.
    fn tell_all(&mut self, kind: Kind) {
        self.tell(kind, |p, q| !p.gone.get(q).copied().unwrap_or(true));
    }

    /// Sends `kind` (no route, no body) to every other process `to` names.
    fn tell(&mut self, kind: Kind, to: impl Fn(&Self, usize) -> bool) {
        let head = encode_head(kind, Route::default(), &[], 0, 0);
        for q in 0..self.gone.len() {
            if q != self.me && to(self, q) {
                self.handle(Command::Send {
                    process: q,
                    head,
                    body: Outgoing::Bytes(Vec::new()),
                });
            }
        }
    }

    /// Sends the heartbeat when it is due, and tells the groups of a
    /// process silent for longer than the liveness window.
    fn keep_alive(&mut self) {
        let window = Duration::from_millis(self.liveness.load(Ordering::Acquire));
        if window.is_zero() || self.finish.is_some() {
            return;
        }
        if self.beat.elapsed() >= BEAT.min(window.checked_div(4).unwrap_or_default()) {
            self.beat = Instant::now();
            self.tell_all(Kind::Beat);
        }
        for q in 0..self.gone.len() {
            let quiet = self.heard.get(q).map_or(Duration::ZERO, Instant::elapsed);
            if quiet > window && !self.gone.get(q).copied().unwrap_or(true) {
                if let Some(g) = self.gone.get_mut(q) {
                    *g = true;
                }
                tracing::error!(process = q, ?quiet, "MPI: a process has gone silent");
                for n in lock(self.routes).notices.values() {
                    let _ = n.send(Notice::Silent { process: q, quiet });
                }
            }
        }
    }

    /// Takes every frame that has come; whether there was any.
    fn receive(&mut self) -> bool {
        let mut any = false;
        while let Some((msg, status)) = self.world.any_process().immediate_matched_probe() {
            any = true;
            let source = status.source_rank();
            let from = usize::try_from(source).unwrap_or(usize::MAX);
            if let Some(t) = self.heard.get_mut(from) {
                *t = Instant::now();
            }
            if self.refused.get(from).copied().unwrap_or(true) {
                raw::discard(msg);
                continue;
            }
            if let Err(why) = self.take(msg, &status) {
                self.refuse(from, why);
            }
        }
        any
    }

    /// Takes the frame whose head `msg` is, with its body; what is wrong
    /// with it, if anything is (then the sender is refused).
    fn take(&mut self, msg: Message, status: &Status) -> Result<(), String> {
        let (source, tag) = (status.source_rank(), status.tag());
        let from = usize::try_from(source).unwrap_or(usize::MAX);
        let count = usize::try_from(status.count(u8::equivalent_datatype())).ok();
        if tag != TAG_HEAD || count != Some(HEAD) {
            raw::discard(msg);
            return Err(format!(
                "a message of {} bytes with tag {tag} where a frame's head ({HEAD} bytes, tag \
                 {TAG_HEAD}) was due",
                count.map_or("an uncountable number of".into(), |c| c.to_string())
            ));
        }
        let into = std::ptr::NonNull::from(&mut self.head).cast();
        raw::matched_receive(msg, into, HEAD)
            .map_err(|c| format!("receiving a frame's head failed (MPI error {})", c.0))?;
        let Head {
            route,
            kind,
            len,
            token,
            generation,
            header,
        } = decode_head(&self.head)?;
        if generation != self.generation {
            // An earlier communicator's, on its way when that was freed
            // (`agree_generation`): not this world's, and no fault.
            let (msg, _) = self.body_of(source)?;
            raw::discard(msg);
            tracing::debug!(
                process = from,
                generation,
                ours = self.generation,
                "MPI: a frame of an earlier communicator; dropped"
            );
            return Ok(());
        }
        let most = kind.most(usize::try_from(self.cap.load(Ordering::Acquire)).unwrap_or(0));
        if len > most {
            return Err(format!(
                "a head (kind {}) that announces a body of {len} bytes, where at most {most} \
                 come",
                kind as u8
            ));
        }
        // It must be the length the head said.
        let (msg, status) = self.body_of(source)?;
        let count = usize::try_from(status.count(u8::equivalent_datatype())).ok();
        if count != Some(len) {
            raw::discard(msg);
            return Err(format!(
                "a body of {} bytes after a head that announced {len}",
                count.map_or("an uncountable number of".into(), |c| c.to_string())
            ));
        }
        let body = self.receive_body(msg, route, kind, len)?;
        match kind {
            Kind::Beat | Kind::Bye => {
                if kind == Kind::Bye {
                    if let Some(g) = self.gone.get_mut(from) {
                        *g = true;
                    }
                    if let Some(b) = self.bye.get_mut(from) {
                        *b = true;
                    }
                }
                if let Arrived::Bytes(b) = body {
                    self.pool.give(b);
                }
            }
            Kind::Receipt => {
                if let Arrived::Bytes(b) = body {
                    self.resolve(from, route, token, &b);
                    self.pool.give(b);
                }
            }
            Kind::Notice | Kind::Data | Kind::Device => {
                let reply = (token != 0).then_some((from, token));
                let frame = Frame {
                    header,
                    body,
                    reply,
                };
                if let Some(Arrived::Bytes(b)) =
                    deliver(self.routes, route, kind, frame, (from, self.me))?
                {
                    self.pool.give(b);
                }
            }
        }
        Ok(())
    }

    /// The body that follows a head from `source`: MPI keeps their order,
    /// and the sender posts both at once, so it must come.
    fn body_of(&self, source: i32) -> Result<(Message, Status), String> {
        let due = crate::deadline::after(BODY_WAIT);
        loop {
            let next = self
                .world
                .process_at_rank(source)
                .immediate_matched_probe_with_tag(TAG_BODY);
            match next {
                Some(m) => return Ok(m),
                None if Instant::now() < due => std::thread::yield_now(),
                None => return Err(format!("a head without its body within {BODY_WAIT:?}")),
            }
        }
    }

    /// A receipt from process `from` for the send with `token`, which went
    /// to the rank that `route` (back) comes from: the send's receipt is
    /// told. One that names no send of ours, or not that one's receiver,
    /// is dropped.
    fn resolve(&self, from: usize, route: Route, token: u64, body: &[u8]) {
        let mut routes = lock(self.routes);
        let ours = routes.receipts.get(&token).is_some_and(|(sent, _)| {
            sent.group == route.group && sent.to == route.from && sent.from == route.to
        });
        let Some((_, receipt)) = ours.then(|| routes.receipts.remove(&token)).flatten() else {
            drop(routes);
            tracing::warn!(
                process = from,
                token,
                "MPI: a receipt for no send of ours; dropped"
            );
            return;
        };
        drop(routes);
        receipt.tell(match body.split_first() {
            Some((&TAKEN, _)) => Verdict::Taken,
            Some((&REFUSED, theirs)) => Verdict::Refused(String::from_utf8_lossy(theirs).into()),
            _ => Verdict::Dropped,
        });
    }

    /// Receives the `len` bytes of a frame's body, probed as `msg`: a
    /// device step's straight into a landing buffer of its rank when one
    /// is free, anything else into a pooled buffer.
    fn receive_body(
        &mut self,
        msg: Message,
        route: Route,
        kind: Kind,
        len: usize,
    ) -> Result<Arrived, String> {
        let failed = |c: raw::Code| format!("receiving a frame's body failed (MPI error {})", c.0);
        let landing = match kind {
            Kind::Device => lock(self.routes)
                .landings
                .get(&(route.group, route.to))
                .cloned(),
            _ => None,
        };
        if let Some((landed, mut view)) = landing.and_then(|l| l.take(len)) {
            let ptr = view.slice(..).as_raw_element_ptr();
            raw::matched_receive(msg, ptr, len).map_err(failed)?;
            return Ok(Arrived::Landed(landed));
        }
        let mut body = self.pool.take_sized(len);
        let ptr =
            std::ptr::NonNull::new(body.as_mut_ptr()).unwrap_or(std::ptr::NonNull::dangling());
        match raw::matched_receive(msg, ptr, len) {
            Ok(()) => Ok(Arrived::Bytes(body)),
            Err(c) => {
                self.pool.give(body);
                Err(failed(c))
            }
        }
    }

    /// Returns a sent buffer: a head's to the spare heads, a body's to the
    /// pool, a mapping to its owner (by letting go of it).
    fn give_back(&mut self, bytes: Outgoing) {
        let Outgoing::Bytes(bytes) = bytes else {
            return;
        };
        if bytes.capacity() <= HEAD {
            if self.heads.len() < SPARE_HEADS {
                self.heads.push(bytes);
            }
        } else {
            self.pool.give(bytes);
        }
    }

    /// Retires the sends that are done; whether any was.
    fn reap(&mut self) -> bool {
        let mut any = false;
        let mut i = 0;
        while let Some(s) = self.sending.get_mut(i) {
            match s.test() {
                Ok(Some(bytes)) => {
                    self.give_back(bytes);
                    self.sending.swap_remove(i);
                    any = true;
                }
                Ok(None) => i = i.saturating_add(1),
                Err(code) => {
                    tracing::error!(code = code.0, "MPI_Test failed");
                    self.sending.swap_remove(i);
                }
            }
        }
        any
    }
}

/// Hands a frame from process `sender` to its route in this process
/// (`me`), or keeps it until the route opens; a notice goes to whoever
/// listens for them. A frame of a group that has ended here comes back
/// (stale); one that is not what the engine sends is an error.
fn deliver(
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
            HEALING => Notice::Heal(body),
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
                r.keep_early(route, e.0)?;
            }
        }
        None => r.keep_early(route, frame)?,
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
    /// this process, from a rank of the sending process; a healing note
    /// names its process, a departure a rank of it, a failure a rank of
    /// the group; a group that ended here makes
    /// its frames stale; a group not made here yet cannot be checked.
    #[test]
    fn wire_checks_where_a_routes_ranks_live() {
        let layout = Arc::new(Layout {
            group: 9,
            process_of: vec![0, 0, 1, 1, 2, 2],
            meet: None,
            splits_meet: None,
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
        assert_eq!(check(at(0, 2, HEALING), Kind::Notice), Ok(true));
        assert!(check(at(0, 4, HEALING), Kind::Notice).is_err());
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
            r.keep_early(route(epoch), frame(0))
                .expect("within the bound");
        }
        let Err(why) = r.keep_early(route(0), frame(0)) else {
            panic!("a frame past the bound was kept");
        };
        assert!(why.contains("for routes not open here"), "{why}");
        assert_eq!(r.early_frames, EARLY_FRAMES);
        assert_eq!(r.take_early(&route(1)).len(), EARLY_FRAMES / 2);
        assert_eq!(r.early_frames, EARLY_FRAMES / 2);
        r.keep_early(route(1), frame(100)).expect("room again");
        // Bytes: one frame past EARLY_BYTES is refused.
        let mut r = Routes::default();
        r.keep_early(route(0), frame(EARLY_BYTES / 2))
            .expect("half");
        assert!(r.keep_early(route(0), frame(EARLY_BYTES / 2)).is_err());
        assert_eq!(r.take_early(&route(0)).len(), 1);
        assert_eq!((r.early_frames, r.early_bytes), (0, 0));
    }
}
