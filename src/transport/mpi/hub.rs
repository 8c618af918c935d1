//! The one thread of a process that calls MPI.
//!
//! MPI is initialised on this thread (`MPI_THREAD_FUNNELED`: every call
//! from the thread that initialised it), so the engine never depends on
//! an MPI library built for `MPI_THREAD_MULTIPLE`. Ranks hand it frames to
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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use mpi::point_to_point::Source;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use super::raw::{self, Sending};
use crate::device::lock;
use crate::transport::pool::Pool;
use crate::transport::staging::{Landed, Landing};
use crate::transport::{Mapped, Receipt, Verdict};

/// Bytes of a frame's head: route (group 8, to 4, from 4, lane 1, kind 1,
/// epoch 4), body length 8, receipt token 8 (0: none), and the packet
/// header the runtime gives (up to `HEADER`).
pub(crate) const HEAD: usize = 38 + HEADER;
/// Most bytes of a packet header on the wire.
pub(crate) const HEADER: usize = 64;

const TAG_HEAD: i32 = 17;
const TAG_BODY: i32 = 18;

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

/// Where a frame goes: a rank (`to`) of a group, from a rank of it, on a lane.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct Route {
    pub group: u64,
    /// The run of the group the frame belongs to (see `Remote::drain`).
    pub epoch: u32,
    pub to: u32,
    pub from: u32,
    pub lane: u8,
}

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
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Data = 0,
    Notice = 1,
    /// A heartbeat: the process is alive.
    Beat = 2,
    /// The process finalises MPI: silence from it from now on is no failure.
    Bye = 3,
    /// Data that a device step reads: it lands where that rank's kernels
    /// read it, when a landing buffer is free.
    Device = 4,
    /// A receiver's word on a message whose sender asked for it (the
    /// head's token): taken, refused (the body says its call), dropped.
    Receipt = 5,
}

impl Kind {
    fn of(code: u8) -> Kind {
        match code {
            1 => Kind::Notice,
            2 => Kind::Beat,
            3 => Kind::Bye,
            4 => Kind::Device,
            5 => Kind::Receipt,
            _ => Kind::Data,
        }
    }
}

/// Head buffers kept for reuse.
const SPARE_HEADS: usize = 256;

/// How often a process tells the others it is alive.
const BEAT: Duration = Duration::from_millis(100);

/// The bytes of a frame to send: the hub's own (pooled), or a lent
/// buffer's mapping, sent in place and let go of once sent.
pub(crate) enum Outgoing {
    Bytes(Vec<u8>),
    Mapped(Mapped),
}

impl AsRef<[u8]> for Outgoing {
    fn as_ref(&self) -> &[u8] {
        match self {
            Outgoing::Bytes(b) => b,
            Outgoing::Mapped(m) => m.as_ref(),
        }
    }
}

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
    /// Sends what is in flight (bounded), then finalises MPI.
    Finish,
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
    /// Initialises MPI on a thread of its own and starts serving.
    pub(crate) fn start() -> Result<Hub, String> {
        let (commands, rx) = unbounded();
        let routes = Arc::new(Mutex::new(Routes::default()));
        let pool = Arc::new(Pool::new(256));
        let (ready_tx, ready_rx) = bounded(1);
        let waiting = Arc::new(AtomicUsize::new(0));
        let liveness = Arc::new(AtomicU64::new(0));
        let (r, p, w, l) = (
            routes.clone(),
            pool.clone(),
            waiting.clone(),
            liveness.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("mpi-hub".into())
            .spawn(move || serve(rx, r, p, w, &l, ready_tx))
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
        r.notices.insert(group, to);
    }

    /// Opens `route`: frames for it go to the returned channel (those that
    /// came early first). Frames kept for the route's earlier epochs are
    /// stale (a failed run's) and dropped.
    pub(crate) fn open(&self, route: Route) -> Receiver<Frame> {
        let (tx, rx) = unbounded();
        let mut r = lock(&self.routes);
        r.early.retain(|k, _| {
            k.epoch >= route.epoch
                || Route {
                    epoch: route.epoch,
                    ..*k
                } != route
        });
        for f in r.early.remove(&route).into_iter().flatten() {
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
        let _ = self.commands.send(Command::Finish);
        let Some(t) = lock(&self.thread).take() else {
            return;
        };
        let deadline = crate::deadline::after(limit);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

fn encode_head(kind: Kind, route: Route, header: &[u8], body: usize, token: u64) -> [u8; HEAD] {
    let mut h = [0u8; HEAD];
    let mut at: usize = 0;
    let mut put = |b: &[u8]| {
        if let Some(d) = h.get_mut(at..at.saturating_add(b.len())) {
            d.copy_from_slice(b);
        }
        at = at.saturating_add(b.len());
    };
    put(&route.group.to_le_bytes());
    put(&route.to.to_le_bytes());
    put(&route.from.to_le_bytes());
    put(&[route.lane, kind as u8]);
    put(&route.epoch.to_le_bytes());
    put(&(body as u64).to_le_bytes());
    put(&token.to_le_bytes());
    put(header.get(..HEADER.min(header.len())).unwrap_or(&[]));
    h
}

/// A frame's head, as `encode_head` wrote it.
struct Head {
    route: Route,
    kind: Kind,
    len: usize,
    token: u64,
    header: [u8; HEADER],
}

fn decode_head(h: &[u8; HEAD]) -> Head {
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        if let Some(s) = h.get(i..i.saturating_add(8)) {
            b.copy_from_slice(s);
        }
        u64::from_le_bytes(b)
    };
    let u32_at = |i: usize| {
        let mut b = [0u8; 4];
        if let Some(s) = h.get(i..i.saturating_add(4)) {
            b.copy_from_slice(s);
        }
        u32::from_le_bytes(b)
    };
    let route = Route {
        group: u64_at(0),
        to: u32_at(8),
        from: u32_at(12),
        lane: h.get(16).copied().unwrap_or(0),
        epoch: u32_at(18),
    };
    let kind = Kind::of(h.get(17).copied().unwrap_or(0));
    let len = usize::try_from(u64_at(22)).unwrap_or(usize::MAX);
    let token = u64_at(30);
    let mut header = [0u8; HEADER];
    if let Some(s) = h.get(38..) {
        header.copy_from_slice(s);
    }
    Head {
        route,
        kind,
        len,
        token,
        header,
    }
}

/// A receipt's verdicts on the wire (its body's first byte).
const TAKEN: u8 = 0;
const REFUSED: u8 = 1;
const DROPPED: u8 = 2;

/// The MPI thread: initialises MPI, says so through `ready`, then serves.
fn serve(
    commands: Receiver<Command>,
    routes: Arc<Mutex<Routes>>,
    pool: Arc<Pool>,
    waiting: Arc<AtomicUsize>,
    liveness: &AtomicU64,
    ready: Sender<Result<(usize, usize), String>>,
) {
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        let _ = ready.send(Err(
            "MPI was already initialised in this process (one MPI world per process)".into(),
        ));
        return;
    };
    let world = universe.world();
    if let Err(e) = raw::errors_return(&world) {
        let _ = ready.send(Err(format!(
            "MPI_Comm_set_errhandler failed (code {})",
            e.0
        )));
        return;
    }
    let process = usize::try_from(world.rank()).unwrap_or(0);
    let processes = usize::try_from(world.size()).unwrap_or(1);
    let _ = ready.send(Ok((process, processes)));
    pump(&world, &commands, &routes, &pool, &waiting, liveness);
    drop(world);
    // MPI_Finalize: a dead peer can hold it; `Hub::finish` bounds the wait.
    drop(universe);
}

/// What the MPI thread keeps between rounds.
struct Pump<'a> {
    world: &'a SimpleCommunicator,
    routes: &'a Mutex<Routes>,
    pool: &'a Pool,
    /// Sends in flight, each holding its bytes.
    sending: Vec<Sending>,
    /// Spare head buffers: kept apart from the body pool, so that a body
    /// never lands in a buffer too small for it (and grows it anew).
    heads: Vec<Vec<u8>>,
    /// Told to finish, when: sends still in flight get `FINISH_FAILED`.
    finish: Option<Instant>,
    head: [u8; HEAD],
    /// When each process was last heard from (any frame, or a heartbeat).
    heard: Vec<Instant>,
    /// Processes that said goodbye, or were found silent.
    gone: Vec<bool>,
    /// When this process last sent its heartbeat.
    beat: Instant,
    /// How long a process may stay silent (ms; 0 until a world sets it).
    liveness: &'a AtomicU64,
}

/// Serves until told to finish and its sends are done (or given up).
fn pump<'a>(
    world: &'a SimpleCommunicator,
    commands: &Receiver<Command>,
    routes: &'a Mutex<Routes>,
    pool: &'a Pool,
    waiting: &AtomicUsize,
    liveness: &'a AtomicU64,
) {
    let processes = usize::try_from(world.size()).unwrap_or(1);
    let mut p = Pump {
        world,
        routes,
        pool,
        sending: Vec::new(),
        heads: Vec::new(),
        finish: None,
        head: [0u8; HEAD],
        heard: vec![Instant::now(); processes],
        gone: (0..processes)
            .map(|q| i32::try_from(q).ok() == Some(world.rank()))
            .collect(),
        beat: Instant::now(),
        liveness,
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
        if let Some(since) = p.finish {
            if p.sending.is_empty() || since.elapsed() > FINISH_FAILED {
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
            Command::Finish => {
                self.tell_all(Kind::Bye);
                self.finish = Some(Instant::now());
            }
        }
    }

    /// Sends `kind` (no route, no body) to every process not gone.
    fn tell_all(&mut self, kind: Kind) {
        let head = encode_head(kind, Route::default(), &[], 0, 0);
        for q in 0..self.gone.len() {
            if !self.gone.get(q).copied().unwrap_or(true) {
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
        while let Some((msg, _)) = self
            .world
            .any_process()
            .immediate_matched_probe_with_tag(TAG_HEAD)
        {
            any = true;
            let status = msg.matched_receive_into(&mut self.head[..]);
            let Head {
                route,
                kind,
                len,
                token,
                header,
            } = decode_head(&self.head);
            // The body follows its head from the same process.
            let source = status.source_rank();
            let body = self.receive_body(source, route, kind, len);
            let from = usize::try_from(source).unwrap_or(usize::MAX);
            if let Some(t) = self.heard.get_mut(from) {
                *t = Instant::now();
            }
            match kind {
                Kind::Beat => {
                    if let Arrived::Bytes(b) = body {
                        self.pool.give(b);
                    }
                }
                Kind::Bye => {
                    if let Some(g) = self.gone.get_mut(from) {
                        *g = true;
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
                    deliver(
                        self.routes,
                        route,
                        kind,
                        Frame {
                            header,
                            body,
                            reply,
                        },
                    );
                }
            }
        }
        any
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

    /// Receives the `len` bytes of a frame's body from `source`: a device
    /// step's straight into a landing buffer of its rank when one is free,
    /// anything else into a pooled buffer.
    fn receive_body(&mut self, source: i32, route: Route, kind: Kind, len: usize) -> Arrived {
        let landing = match kind {
            Kind::Device => lock(self.routes)
                .landings
                .get(&(route.group, route.to))
                .cloned(),
            _ => None,
        };
        if let Some((landed, mut view)) = landing.and_then(|l| l.take(len)) {
            let ptr = view.slice(..).as_raw_element_ptr();
            match raw::receive_raw(self.world, source, TAG_BODY, ptr, len) {
                Ok(()) => return Arrived::Landed(landed),
                // The body is gone either way: the receiver's wait names
                // what is missing.
                Err(code) => {
                    tracing::error!(source, code = code.0, "MPI_Recv of a frame's body failed");
                    return Arrived::Bytes(Vec::new());
                }
            }
        }
        let mut body = self.pool.take_sized(len);
        self.world
            .process_at_rank(source)
            .receive_into_with_tag(&mut body[..], TAG_BODY);
        Arrived::Bytes(body)
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

/// Hands a frame to its route, or keeps it until the route opens; a
/// notice goes to whoever listens for them.
fn deliver(routes: &Mutex<Routes>, route: Route, kind: Kind, frame: Frame) {
    let mut r = lock(routes);
    if kind == Kind::Notice {
        let Arrived::Bytes(body) = frame.body else {
            return;
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
        return;
    }
    match r.open.get(&route) {
        Some(tx) => {
            if let Err(e) = tx.send(frame) {
                // The receiver is gone: keep it for a route opened anew.
                r.early.entry(route).or_default().push_back(e.0);
            }
        }
        None => r.early.entry(route).or_default().push_back(frame),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A head carries its route, kind, body length and header intact.
    #[test]
    fn a_head_decodes_to_what_was_encoded() {
        let route = Route {
            group: 0x0123_4567_89ab_cdef,
            epoch: 77,
            to: 5,
            from: 63,
            lane: 1,
        };
        let header: Vec<u8> = (0..HEADER).map(|i| (i * 3 + 1) as u8).collect();
        for kind in [
            Kind::Data,
            Kind::Notice,
            Kind::Beat,
            Kind::Bye,
            Kind::Device,
            Kind::Receipt,
        ] {
            let head = encode_head(kind, route, &header, 1 << 20, 0xfeed);
            let h = decode_head(&head);
            assert_eq!(h.route, route);
            assert!(h.kind == kind);
            assert_eq!(h.len, 1 << 20);
            assert_eq!(h.token, 0xfeed);
            assert_eq!(h.header.as_slice(), header.as_slice());
        }
    }
}
