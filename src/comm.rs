//! `Communicator`: one rank's view of a group, and the progress thread that
//! runs its collectives.
//!
//! A collective call only checks its arguments, allocates its output and
//! queues an [`Op`]; it returns a [`Work`] at once. Each communicator has
//! its own progress thread (NCCL's proxy thread, Gloo's context) that takes
//! ops in issue order and drives their schedules, so the caller's thread is
//! free to keep issuing compute while the ring runs. Collectives of one
//! communicator never overlap each other on a rank, which is what keeps
//! every rank's steps in the same order.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, unbounded};

use crate::algo::{prims::Prims, ring};
use crate::device::{RankDevice, lock};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, Kind};
use crate::flight::State;
use crate::health::{Health, Waiter};
use crate::op::ReduceOp;
use crate::tensor::{DType, Element, Tensor};
use crate::transport::{Endpoint, Packet, Stager};
use crate::work::{Work, WorkState};

/// One queued collective.
struct Op {
    fp: Fingerprint,
    input: Tensor,
    output: Tensor,
    state: Arc<WorkState>,
}

struct Issuer {
    seq: u64,
    tx: Option<Sender<Op>>,
}

struct Inner {
    rank: usize,
    size: usize,
    dev: Arc<RankDevice>,
    health: Arc<Health>,
    endpoint: Arc<Endpoint>,
    timeout: Duration,
    issuer: Mutex<Issuer>,
    /// Ops queued or running on the progress thread.
    inflight: Arc<AtomicUsize>,
    progress: Mutex<Option<JoinHandle<()>>>,
}

/// One rank's handle to a group of ranks: it makes tensors on the rank's
/// device and issues collectives over the group.
pub struct Communicator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {})",
            self.inner.rank, self.inner.size
        )
    }
}

impl Communicator {
    pub(crate) fn new(
        rank: usize,
        size: usize,
        dev: Arc<RankDevice>,
        endpoint: Endpoint,
        health: Arc<Health>,
        timeout: Duration,
    ) -> Result<Communicator> {
        let (tx, rx) = unbounded();
        let endpoint = Arc::new(endpoint);
        let inflight = Arc::new(AtomicUsize::new(0));
        let thread = Progress {
            rank,
            size,
            dev: dev.clone(),
            endpoint: endpoint.clone(),
            health: health.clone(),
            stage: Stager::new(dev.clone()),
            timeout,
            inflight: inflight.clone(),
            gpu_pending: Arc::new(AtomicUsize::new(0)),
        };
        let handle = std::thread::Builder::new()
            .name(format!("progress-{rank}"))
            .spawn(move || thread.run(rx))
            .map_err(|e| Error::device(rank, None, format!("spawning the progress thread: {e}")))?;
        Ok(Communicator {
            inner: Arc::new(Inner {
                rank,
                size,
                dev,
                health,
                endpoint,
                timeout,
                issuer: Mutex::new(Issuer {
                    seq: 0,
                    tx: Some(tx),
                }),
                inflight,
                progress: Mutex::new(Some(handle)),
            }),
        })
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// This rank's wgpu device.
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.dev.device
    }

    /// This rank's wgpu queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.dev.queue
    }

    /// The adapter this rank runs on.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.inner.dev.info
    }

    /// Number of wgpu resources (buffers, pipelines, bind groups) this
    /// rank's device has created through the engine so far.
    pub fn resources_created(&self) -> u64 {
        self.inner.dev.resources_created()
    }

    /// A tensor on this rank's device holding `data`.
    pub fn tensor<T: Element>(&self, data: &[T]) -> Result<Tensor> {
        Tensor::from_slice(&self.inner.dev, data)
    }

    /// A zero-filled tensor on this rank's device.
    pub fn zeros(&self, dtype: DType, len: usize) -> Result<Tensor> {
        Tensor::zeros(&self.inner.dev, dtype, len)
    }

    /// Sum (or another reduction) of `x` over all ranks, into a new tensor.
    /// Returns at once; `x` must not be written until the `Work` completes.
    pub fn all_reduce(&self, x: &Tensor, op: ReduceOp) -> Result<Work> {
        self.check_reduce(x, op)?;
        let out = Tensor::output(&self.inner.dev, x.dtype(), x.len())?;
        self.issue(Kind::AllReduce, x.clone(), out, Some(op))
    }

    /// Like [`all_reduce`](Self::all_reduce), leaving the result in `x`.
    pub fn all_reduce_in_place(&self, x: &Tensor, op: ReduceOp) -> Result<Work> {
        self.check_reduce(x, op)?;
        self.issue(Kind::AllReduce, x.clone(), x.clone(), Some(op))
    }

    fn check_tensor(&self, x: &Tensor) -> Result<()> {
        if !Arc::ptr_eq(x.device(), &self.inner.dev) {
            return Err(Error::invalid(
                self.inner.rank,
                format!(
                    "the tensor lives on rank {}'s device, but this communicator is rank {}'s",
                    x.rank(),
                    self.inner.dev.rank
                ),
            ));
        }
        Ok(())
    }

    fn check_reduce(&self, x: &Tensor, op: ReduceOp) -> Result<()> {
        self.check_tensor(x)?;
        if !op.supports(x.dtype()) {
            return Err(Error::invalid(
                self.inner.rank,
                format!("reduce op {op} needs an integer dtype, got {}", x.dtype()),
            ));
        }
        Ok(())
    }

    fn issue(
        &self,
        kind: Kind,
        input: Tensor,
        output: Tensor,
        op: Option<ReduceOp>,
    ) -> Result<Work> {
        let inner = &self.inner;
        let state = WorkState::new();
        let mut issuer = lock(&inner.issuer);
        let fp = Fingerprint {
            seq: issuer.seq,
            kind,
            dtype: input.dtype(),
            len: input.len(),
            op,
        };
        let tx = issuer.tx.as_ref().ok_or_else(|| Error::Aborted {
            rank: inner.rank,
            seq: fp.seq,
        })?;
        inner.inflight.fetch_add(1, Ordering::AcqRel);
        let op = Op {
            fp,
            input,
            output: output.clone(),
            state: state.clone(),
        };
        if tx.send(op).is_err() {
            inner.inflight.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::device(
                inner.rank,
                Some(fp.seq),
                "the progress thread has stopped",
            ));
        }
        issuer.seq += 1;
        inner.health.flight.record(inner.rank, fp, State::Enqueued);
        Ok(Work::new(
            state,
            vec![output],
            inner.dev.clone(),
            inner.health.clone(),
            fp,
            inner.rank,
            inner.timeout,
        ))
    }

    /// Aborts the communicator, as `ncclCommAbort`: every pending and
    /// later collective fails with [`Error::Aborted`] on every rank of the
    /// group (until the next `World::run`).
    pub fn abort(&self) {
        let inner = &self.inner;
        let seq = lock(&inner.issuer).seq;
        inner.health.fail(
            inner.rank,
            Error::Aborted {
                rank: inner.rank,
                seq,
            },
        );
    }

    /// Marks this rank as failed for the whole group (its closure panicked).
    pub(crate) fn fail_group(&self, error: Error) {
        self.inner.health.fail(self.inner.rank, error);
    }

    /// Called when this rank's closure has returned: once its queued
    /// collectives have finished, peers waiting for anything more from it
    /// fail at once instead of at their timeout.
    pub(crate) fn depart(&self) {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.timeout * 2;
        while inner.inflight.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        inner.health.set_gone(inner.rank);
    }

    /// Prepares for a new `World::run`: waits for the previous run's
    /// collectives to resolve, drops their stray packets, and starts the
    /// sequence again at 0 with a clean failure record.
    pub(crate) fn reset(&self) -> Result<()> {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.timeout * 2;
        while inner.inflight.load(Ordering::Acquire) > 0 {
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    rank: inner.rank,
                    seq: lock(&inner.issuer).seq,
                    what: "the previous run's collectives to finish".into(),
                    after: inner.timeout * 2,
                    flight: inner.health.flight.report(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        inner.endpoint.drain();
        lock(&inner.issuer).seq = 0;
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the progress thread once it has run what was queued.
        lock(&self.issuer).tx = None;
        if let Some(h) = lock(&self.progress).take() {
            let _ = h.join();
        }
    }
}

/// The progress thread's state: everything it needs, nothing shared with
/// callers except through the op queue, `Health` and `WorkState`.
struct Progress {
    rank: usize,
    size: usize,
    dev: Arc<RankDevice>,
    endpoint: Arc<Endpoint>,
    health: Arc<Health>,
    stage: Stager,
    timeout: Duration,
    inflight: Arc<AtomicUsize>,
    /// Issued ops whose final submission the device has not reported done.
    gpu_pending: Arc<AtomicUsize>,
}

/// How often an idle progress thread polls the device while some `Work`
/// still waits for its fence (so that futures are woken).
const IDLE_POLL: Duration = Duration::from_millis(2);

impl Progress {
    fn run(mut self, rx: Receiver<Op>) {
        loop {
            let idle = if self.gpu_pending.load(Ordering::Acquire) > 0 {
                IDLE_POLL
            } else {
                Duration::from_millis(200)
            };
            let op = match rx.recv_timeout(idle) {
                Ok(op) => op,
                Err(RecvTimeoutError::Timeout) => {
                    self.dev.poll_now();
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            op.state.start();
            self.health
                .flight
                .record(self.rank, op.fp, State::InProgress);
            let result = match self.health.check(self.rank, op.fp.seq) {
                Err(e) => Err(e),
                Ok(()) => {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.execute(&op)))
                        .unwrap_or_else(|p| {
                            Err(Error::device(
                                self.rank,
                                Some(op.fp.seq),
                                format!("internal error: {}", panic_message(&p)),
                            ))
                        })
                }
            };
            match result {
                Ok(idx) => {
                    self.health
                        .flight
                        .record(self.rank, op.fp, State::Completed);
                    self.gpu_pending.fetch_add(1, Ordering::AcqRel);
                    let (state, pending) = (op.state.clone(), self.gpu_pending.clone());
                    op.state.issued(idx);
                    self.dev.queue.on_submitted_work_done(move || {
                        state.gpu_done();
                        pending.fetch_sub(1, Ordering::AcqRel);
                    });
                }
                Err(e) => {
                    // The ring is broken for everyone: make peers fail now, not at their timeout.
                    let origin = match &e {
                        Error::PeerFailed { peer, .. } => *peer,
                        _ => self.rank,
                    };
                    self.health.fail(origin, e.clone());
                    self.health.flight.record(self.rank, op.fp, State::Failed);
                    self.stage.clear();
                    op.state.fail(e);
                }
            }
            self.inflight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Runs one collective's schedule; returns the submission that last
    /// writes its output.
    fn execute(&mut self, op: &Op) -> Result<wgpu::SubmissionIndex> {
        let seq = Some(op.fp.seq);
        let dev = self.dev.clone();
        let out = op.output.buffer();
        let waiter = Waiter {
            dev: &dev,
            health: &self.health,
            rank: self.rank,
            fp: op.fp,
            timeout: self.timeout,
        };
        // Agree on what runs before moving any data: a rank that issued
        // something else (or nothing) is caught here, on every rank, even
        // when one side would have sent no bytes at all.
        if self.size > 1 {
            handshake(&self.endpoint, &waiter, self.size)?;
        }
        let mut enc = dev.encoder();
        if op.input.buffer() != out && op.input.used_bytes() > 0 {
            enc.copy_buffer_to_buffer(op.input.buffer(), 0, out, 0, op.input.used_bytes());
        }
        let first = dev.submit(enc, seq)?;
        let (reduce, finish) = match (op.fp.op, self.size > 1 && op.fp.len > 0) {
            (Some(r), true) => {
                let divisor = if r == ReduceOp::Avg {
                    self.size as u32
                } else {
                    0
                };
                (
                    Some(dev.kernels.reducer(&dev, op.fp.dtype, r, 0)?),
                    Some(dev.kernels.reducer(&dev, op.fp.dtype, r, divisor)?),
                )
            }
            _ => (None, None),
        };
        let mut p = Prims {
            w: waiter,
            link: &self.endpoint,
            stage: &mut self.stage,
            buf: out,
            reduce,
            finish,
            nranks: self.size,
            last: None,
        };
        match op.fp.kind {
            Kind::AllReduce => ring::all_reduce(&mut p, op.input.words())?,
        }
        Ok(p.last.unwrap_or(first))
    }
}

/// Sends this rank's fingerprint to the next rank of the ring and checks
/// the previous rank's against it.
fn handshake(link: &Endpoint, w: &Waiter, n: usize) -> Result<()> {
    let data = link.buffer();
    link.post(
        (w.rank + 1) % n,
        Packet {
            fp: w.fp,
            from: w.rank,
            data,
        },
    )?;
    let p = link.take((w.rank + n - 1) % n, 0, w)?;
    link.recycle(p.data);
    Ok(())
}

pub(crate) fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_string()
    }
}
