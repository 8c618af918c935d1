//! Which of the job's other processes are still there.
//!
//! A process that dies, or hangs, says nothing: its peers would wait for
//! it to their deadlines. So while a world watches (`Hub::watch`), every
//! process sends a heartbeat at least every `BEAT` (and four times per
//! window), any message counts as one, and a process silent for longer
//! than the window is gone: its groups hear it at once. A process on its
//! way out says goodbye, and waits for the goodbyes of those still there,
//! so that nothing of a world is left on the wire when its communicator
//! is freed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a process tells the others it is alive, at least.
const BEAT: Duration = Duration::from_millis(100);

/// What the MPI thread knows of the other processes.
pub(super) struct Liveness<'a> {
    /// This process.
    me: usize,
    /// How long a process may stay silent (ms; 0 until a world sets it).
    window: &'a AtomicU64,
    /// When each process was last heard from (any frame, or a heartbeat).
    heard: Vec<Instant>,
    /// Processes that said goodbye, or were found silent, or were refused.
    gone: Vec<bool>,
    /// Processes that said goodbye.
    bye: Vec<bool>,
    /// When this process last sent its heartbeat.
    beat: Instant,
}

impl<'a> Liveness<'a> {
    /// `me` among `processes`, none heard from yet, silent for at most
    /// `window` once a world sets it.
    pub(super) fn new(me: usize, processes: usize, window: &'a AtomicU64) -> Self {
        let now = Instant::now();
        Liveness {
            me,
            window,
            heard: vec![now; processes],
            gone: (0..processes).map(|q| q == me).collect(),
            bye: vec![false; processes],
            beat: now,
        }
    }

    /// The job's processes.
    pub(super) fn processes(&self) -> usize {
        self.gone.len()
    }

    /// `from` sent something.
    pub(super) fn heard(&mut self, from: usize) {
        if let Some(t) = self.heard.get_mut(from) {
            *t = Instant::now();
        }
    }

    /// Every process took part in a blocking collective: however long it
    /// kept this thread, none of them is silent.
    pub(super) fn heard_all(&mut self) {
        let now = Instant::now();
        self.heard.iter_mut().for_each(|t| *t = now);
    }

    /// `from` said goodbye: the last it sends here.
    pub(super) fn said_bye(&mut self, from: usize) {
        self.forget(from);
        if let Some(b) = self.bye.get_mut(from) {
            *b = true;
        }
    }

    /// `from` is no longer watched (it was refused): its silence is no
    /// news.
    pub(super) fn forget(&mut self, from: usize) {
        if let Some(g) = self.gone.get_mut(from) {
            *g = true;
        }
    }

    /// Whether every other process is gone (said goodbye, or was found
    /// silent or refused).
    pub(super) fn all_gone(&self) -> bool {
        self.gone.iter().all(|&g| g)
    }

    /// Whether `q`, another process, is still there.
    pub(super) fn alive(&self, q: usize) -> bool {
        q != self.me && !self.gone.get(q).copied().unwrap_or(true)
    }

    /// Whether `q`, another process, may still hear a goodbye: it is
    /// there, or it said its own and waits for ours.
    pub(super) fn hears_bye(&self, q: usize) -> bool {
        q != self.me && (self.bye.get(q).copied().unwrap_or(false) || self.alive(q))
    }

    /// Whether this process's heartbeat is due now (never while it is
    /// finishing, nor before a world watches).
    pub(super) fn beat_due(&mut self, finishing: bool) -> bool {
        let window = self.window();
        if window.is_zero() || finishing {
            return false;
        }
        let due = self.beat.elapsed() >= BEAT.min(window.checked_div(4).unwrap_or_default());
        if due {
            self.beat = Instant::now();
        }
        due
    }

    /// A process still counted as there that has been silent for longer
    /// than the window, with how long: it is gone from now on.
    pub(super) fn next_silent(&mut self, finishing: bool) -> Option<(usize, Duration)> {
        let window = self.window();
        if window.is_zero() || finishing {
            return None;
        }
        let q = (0..self.processes())
            .find(|&q| self.alive(q) && self.heard.get(q).is_some_and(|t| t.elapsed() > window))?;
        self.forget(q);
        Some((
            q,
            self.heard.get(q).map_or(Duration::ZERO, Instant::elapsed),
        ))
    }

    fn window(&self) -> Duration {
        Duration::from_millis(self.window.load(Ordering::Acquire))
    }
}
