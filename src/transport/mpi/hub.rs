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
//! (route, header, body length) on tag `HEAD`, then the body on tag
//! `BODY`. MPI keeps messages of one (source, tag) in order, so the k-th
//! body from a process belongs to its k-th head, and bodies land straight
//! in pooled buffers without a copy.
//!
//! Between frames the thread yields while anything is in flight and
//! sleeps (up to `IDLE_MAX`) when nothing is: MPI's progress needs calls,
//! but the ranks' devices need the cores.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use crossbeam::queue::ArrayQueue;
use mpi::point_to_point::Source;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use super::raw::{self, Sending};
use crate::device::lock;

/// Bytes of a frame's head: route (group 8, to 4, from 4, lane 1, kind 1,
/// epoch 4), body length 8, and the packet header the runtime gives (up
/// to `HEADER`).
pub(crate) const HEAD: usize = 30 + HEADER;
/// Most bytes of a packet header on the wire.
pub(crate) const HEADER: usize = 64;

const TAG_HEAD: i32 = 17;
const TAG_BODY: i32 = 18;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    pub body: Vec<u8>,
}

/// A message for a whole group rather than one rank (a failure to
/// announce): the group's route (its `from` the rank that failed), and
/// the text.
pub(crate) type Notice = (Route, String);

enum Kind {
    Data = 0,
    Notice = 1,
}

enum Command {
    Send {
        process: usize,
        head: [u8; HEAD],
        body: Vec<u8>,
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
}

/// This process's end of MPI.
pub(crate) struct Hub {
    commands: Sender<Command>,
    routes: Arc<Mutex<Routes>>,
    pool: Arc<ArrayQueue<Vec<u8>>>,
    /// This process's rank among the job's processes, and their count.
    pub process: usize,
    pub processes: usize,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// A failure was seen: leave MPI without finalising it.
    failed: AtomicBool,
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
        let pool = Arc::new(ArrayQueue::new(256));
        let (ready_tx, ready_rx) = bounded(1);
        let (r, p) = (routes.clone(), pool.clone());
        let thread = std::thread::Builder::new()
            .name("mpi-hub".into())
            .spawn(move || serve(rx, r, p, ready_tx))
            .map_err(|e| format!("spawning the MPI thread: {e}"))?;
        let (process, processes) = ready_rx
            .recv()
            .map_err(|_| "the MPI thread ended before MPI was initialised".to_string())??;
        Ok(Hub {
            commands,
            routes,
            pool,
            process,
            processes,
            thread: Mutex::new(Some(thread)),
            failed: AtomicBool::new(false),
        })
    }

    /// Sends a frame to `process`.
    pub(crate) fn send(&self, process: usize, route: Route, header: &[u8], body: Vec<u8>) -> bool {
        let head = encode_head(Kind::Data, route, header, body.len());
        self.commands
            .send(Command::Send {
                process,
                head,
                body,
            })
            .is_ok()
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
            let head = encode_head(Kind::Notice, route, &[], body.len());
            let _ = self.commands.send(Command::Send {
                process,
                head,
                body: body.clone(),
            });
        }
    }

    /// Where notices from other processes to `group` go from now on.
    pub(crate) fn on_notice(&self, group: u64, to: Sender<Notice>) {
        lock(&self.routes).notices.insert(group, to);
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
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v
    }

    /// Returns a buffer to the pool.
    pub(crate) fn recycle(&self, v: Vec<u8>) {
        let _ = self.pool.push(v);
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
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}

fn encode_head(kind: Kind, route: Route, header: &[u8], body: usize) -> [u8; HEAD] {
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
    put(header.get(..HEADER.min(header.len())).unwrap_or(&[]));
    h
}

fn decode_head(h: &[u8; HEAD]) -> (Route, bool, usize, [u8; HEADER]) {
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
    let notice = h.get(17).copied() == Some(Kind::Notice as u8);
    let body = usize::try_from(u64_at(22)).unwrap_or(usize::MAX);
    let mut header = [0u8; HEADER];
    if let Some(s) = h.get(30..) {
        header.copy_from_slice(s);
    }
    (route, notice, body, header)
}

/// The MPI thread: initialises MPI, says so through `ready`, then serves.
fn serve(
    commands: Receiver<Command>,
    routes: Arc<Mutex<Routes>>,
    pool: Arc<ArrayQueue<Vec<u8>>>,
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
    pump(&world, &commands, &routes, &pool);
    drop(world);
    // MPI_Finalize: a dead peer can hold it; `Hub::finish` bounds the wait.
    drop(universe);
}

/// What the MPI thread keeps between rounds.
struct Pump<'a> {
    world: &'a SimpleCommunicator,
    routes: &'a Mutex<Routes>,
    pool: &'a ArrayQueue<Vec<u8>>,
    /// Sends in flight, each holding its bytes.
    sending: Vec<Sending>,
    /// Told to finish, when: sends still in flight get `FINISH_FAILED`.
    finish: Option<std::time::Instant>,
    head: [u8; HEAD],
}

/// Serves until told to finish and its sends are done (or given up).
fn pump(
    world: &SimpleCommunicator,
    commands: &Receiver<Command>,
    routes: &Mutex<Routes>,
    pool: &ArrayQueue<Vec<u8>>,
) {
    let mut p = Pump {
        world,
        routes,
        pool,
        sending: Vec::new(),
        finish: None,
        head: [0u8; HEAD],
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
        if let Some(since) = p.finish {
            if p.sending.is_empty() || since.elapsed() > FINISH_FAILED {
                return;
            }
        }
        if busy {
            idle = 0;
        } else if !p.sending.is_empty() || idle < SPINS {
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
                let mut first = self.pool.pop().unwrap_or_default();
                first.clear();
                first.extend_from_slice(&head);
                for (tag, bytes) in [(TAG_HEAD, first), (TAG_BODY, body)] {
                    match raw::isend(self.world, to, tag, bytes) {
                        Ok(s) => self.sending.push(s),
                        Err((code, bytes)) => {
                            tracing::error!(process, code = code.0, "MPI_Isend failed");
                            let _ = self.pool.push(bytes);
                        }
                    }
                }
            }
            Command::AllGather { mine, reply } => {
                let n = usize::try_from(self.world.size()).unwrap_or(1);
                let mut all = vec![0u64; mine.len().saturating_mul(n)];
                self.world.all_gather_into(&mine[..], &mut all[..]);
                let _ = reply.send(all);
            }
            Command::Finish => self.finish = Some(std::time::Instant::now()),
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
            let (route, notice, len, header) = decode_head(&self.head);
            let mut body = self.pool.pop().unwrap_or_default();
            body.clear();
            body.resize(len, 0);
            // The body follows its head from the same process.
            self.world
                .process_at_rank(status.source_rank())
                .receive_into_with_tag(&mut body[..], TAG_BODY);
            deliver(self.routes, route, notice, Frame { header, body });
        }
        any
    }

    /// Retires the sends that are done; whether any was.
    fn reap(&mut self) -> bool {
        let mut any = false;
        let mut i = 0;
        while let Some(s) = self.sending.get_mut(i) {
            match s.test() {
                Ok(Some(bytes)) => {
                    let _ = self.pool.push(bytes);
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
fn deliver(routes: &Mutex<Routes>, route: Route, notice: bool, frame: Frame) {
    let mut r = lock(routes);
    if notice {
        if let Some(n) = r.notices.get(&route.group) {
            let text = String::from_utf8_lossy(&frame.body).into_owned();
            let _ = n.send((route, text));
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
