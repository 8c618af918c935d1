//! This process's end of MPI: what the ranks call.
//!
//! A rank sends a frame, opens the route its frames come on, tells the
//! other processes of a failure, a departure or a note, and waits; the
//! hub turns each into a command for the MPI thread (`pump.rs`) or an
//! entry of the routing table (`routes.rs`), and never blocks on MPI
//! itself. It starts the thread, and ends it within a bounded time.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};

use super::Layout;
pub(crate) use super::pump::Start;
use super::pump::{Command, Shared, serve};
pub(crate) use super::routes::{Arrived, Frame, Notice};
use super::routes::{DEPARTED, NOTES, Routes};
use super::wire::{DROPPED, Kind, REFUSED, TAKEN, encode_head};
pub(crate) use super::wire::{HEADER, Outgoing, Route};
use crate::device::lock;
use crate::transport::pool::Pool;
use crate::transport::staging::Landing;
use crate::transport::{Receipt, Verdict};

#[cfg(test)]
mod forge;

/// How long `MPI_Init` may take.
const INIT: Duration = Duration::from_secs(120);

/// How long a process on its way out waits for its last sends and
/// `MPI_Finalize`.
const FINISH: Duration = Duration::from_secs(20);
/// The same, after a failure.
const FINISH_FAILED: Duration = Duration::from_secs(3);

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
    /// checked against where its ranks live, while it lives, those that
    /// came before it was made too; a process whose frames do not fit is
    /// refused.
    pub(crate) fn member(&self, layout: &Arc<Layout>) {
        let wrong = lock(&self.routes).member(layout, self.process);
        for (process, why) in wrong {
            let _ = self.commands.send(Command::Refuse { process, why });
        }
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
        let token = receipt.map_or(0, |r| lock(&self.routes).awaiting(route, r));
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
        let gone = lock(&self.routes).forget(group, from, epoch);
        // Dropped untold, outside the lock.
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

    /// A note of `words` for group `group`'s run `epoch`: to process 0,
    /// or to every other process when `to_all` (a notice on lane 2).
    pub(crate) fn note(&self, group: u64, epoch: u32, to_all: bool, words: Vec<u8>) {
        let route = Route {
            group,
            epoch,
            to: 0,
            from: u32::try_from(self.process).unwrap_or(u32::MAX),
            lane: NOTES,
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
        lock(&self.routes).land(group, to, landing);
    }

    /// Where notices from other processes to `group` go from now on
    /// (those that came before first).
    pub(crate) fn on_notice(&self, group: u64, to: Sender<Notice>) {
        lock(&self.routes).listen(group, to);
    }

    /// Opens `route`: frames for it go to the returned channel (those that
    /// came early first). Frames kept for the route's earlier epochs are
    /// stale (a failed run's) and dropped.
    pub(crate) fn open(&self, route: Route) -> Receiver<Frame> {
        lock(&self.routes).open(route, &self.pool)
    }

    /// Closes `route`; frames that come for it later are kept until it
    /// opens again.
    pub(crate) fn close(&self, route: &Route) {
        lock(&self.routes).close(route);
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
