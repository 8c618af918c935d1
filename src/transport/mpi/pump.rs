//! The one thread of a process that calls MPI.
//!
//! Where the engine initialises MPI, it does so on this thread
//! (`MPI_THREAD_FUNNELED`: every call from the thread that initialised
//! it), so that `World::from_mpi` never depends on an MPI library built
//! for `MPI_THREAD_MULTIPLE`; inside an application that initialised MPI
//! itself, this thread calls MPI beside the application's, which needs
//! `MPI_THREAD_MULTIPLE` (`World::from_mpi_comm` checks). Either way it
//! works on its own duplicate of the communicator, so that no message of
//! the application's matches one of the engine's. The ranks hand it
//! commands (`hub.rs`); it keeps every send in flight at once
//! (non-blocking, each holding its bytes), probes for frames from any
//! process, and hands each to the routing table (`routes.rs`).
//!
//! A frame is two MPI messages to the same process: a fixed-size head
//! (route, body length, receipt token, header) on tag `HEAD`, then the
//! body on tag `BODY` (`wire.rs`). MPI keeps messages of one (source,
//! tag) in order, so the k-th body from a process belongs to its k-th
//! head, and bodies land straight in pooled buffers without a copy.
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
//! the notices), on a route whose ranks live where it says; the body must
//! be the length its head said. A process that breaks any of this is
//! refused: nothing more from it is taken (its messages are received into
//! nothing), and every group hears why, naming it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender};
use mpi::datatype::Equivalence;
use mpi::point_to_point::{Message, Source, Status};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::CommunicatorCollectives;

use super::liveness::Liveness;
use super::raw::{self, Sending};
use super::routes::{Arrived, Frame, Notice, Routes, deliver};
use super::wire::{
    HEAD, Head, Kind, Outgoing, REFUSED, Route, TAG_BODY, TAG_HEAD, TAKEN, decode_head,
    encode_head, stamp,
};
use crate::device::lock;
use crate::transport::Verdict;
use crate::transport::pool::Pool;

/// How long a head's body may take to follow it.
const BODY_WAIT: Duration = Duration::from_secs(10);
/// Sleeps between idle probes grow to this.
const IDLE_MAX: Duration = Duration::from_micros(500);
/// Idle probes that only yield before the sleeps start.
const SPINS: u32 = 64;

/// Head buffers kept for reuse.
const SPARE_HEADS: usize = 256;

// A send carries its mapping by value: boxing it would allocate per frame.
#[allow(clippy::large_enum_variant)]
pub(super) enum Command {
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
    /// Refuses `process`, for `why`: frames it sent before their group was
    /// made here did not fit it.
    Refuse { process: usize, why: String },
    /// Sends `bytes` with `tag` as they are: a test's forged message
    /// (`forge.rs`).
    #[cfg(test)]
    Raw {
        process: usize,
        tag: i32,
        bytes: Vec<u8>,
    },
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

/// What the MPI thread shares with the ranks.
pub(super) struct Shared {
    pub routes: Arc<Mutex<Routes>>,
    pub pool: Arc<Pool>,
    pub waiting: Arc<AtomicUsize>,
    pub liveness: Arc<AtomicU64>,
    pub cap: Arc<AtomicU64>,
}

/// The MPI thread: initialises MPI, says so through `ready`, then serves.
pub(super) fn serve(
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
    /// Which processes are still there.
    live: Liveness<'a>,
}

/// Serves until told to finish and its sends are done (or given up).
fn pump<'a>(
    world: &'a SimpleCommunicator,
    generation: u64,
    commands: &Receiver<Command>,
    shared: &'a Shared,
) {
    let processes = usize::try_from(world.size()).unwrap_or(1);
    let me = usize::try_from(world.rank()).unwrap_or(0);
    let waiting = &shared.waiting;
    let mut p = Pump {
        world,
        routes: &shared.routes,
        pool: &shared.pool,
        cap: &shared.cap,
        me,
        generation,
        refused: vec![false; processes],
        sending: Vec::new(),
        heads: Vec::new(),
        finish: None,
        head: [0u8; HEAD],
        live: Liveness::new(me, processes, &shared.liveness),
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
            if (p.sending.is_empty() && p.live.all_gone()) || since.elapsed() > limit {
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
                self.live.heard_all();
            }
            Command::Refuse { process, why } => self.refuse(process, why),
            Command::Finish(limit) => {
                self.farewell();
                self.finish = Some((Instant::now(), limit));
            }
            #[cfg(test)]
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
        self.live.forget(from);
        tracing::error!(process = from, why, "MPI: a process sent junk; refused");
        lock(self.routes).refuse(from, why);
    }

    /// Writes this hub's generation into `head`.
    fn stamp(&self, head: &mut [u8]) {
        stamp(head, self.generation);
    }

    /// Says goodbye to every other process that may still hear it: those
    /// that said theirs too (they wait for ours), not those found silent
    /// or refused.
    fn farewell(&mut self) {
        self.tell(Kind::Bye, |l, q| l.hears_bye(q));
    }

    /// Sends `kind` (no route, no body) to every other process `to` names.
    fn tell(&mut self, kind: Kind, to: impl Fn(&Liveness<'_>, usize) -> bool) {
        let head = encode_head(kind, Route::default(), &[], 0, 0);
        for q in 0..self.live.processes() {
            if to(&self.live, q) {
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
        let finishing = self.finish.is_some();
        if self.live.beat_due(finishing) {
            self.tell(Kind::Beat, |l, q| l.alive(q));
        }
        while let Some((process, quiet)) = self.live.next_silent(finishing) {
            tracing::error!(process, ?quiet, "MPI: a process has gone silent");
            lock(self.routes).tell_groups(|| Notice::Silent { process, quiet });
        }
    }

    /// Takes every frame that has come; whether there was any.
    fn receive(&mut self) -> bool {
        let mut any = false;
        while let Some((msg, status)) = self.world.any_process().immediate_matched_probe() {
            any = true;
            let source = status.source_rank();
            let from = usize::try_from(source).unwrap_or(usize::MAX);
            self.live.heard(from);
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
                    self.live.said_bye(from);
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
        let receipt = lock(self.routes).answered(route, token);
        let Some(receipt) = receipt else {
            tracing::warn!(
                process = from,
                token,
                "MPI: a receipt for no send of ours; dropped"
            );
            return;
        };
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
            Kind::Device => lock(self.routes).landing(route.group, route.to),
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
