//! `Communicator`: one rank's view of a group, and how collectives are issued.
//!
//! A collective call only checks its arguments and queues an op for the
//! communicator's progress thread (`progress.rs`), which takes the output
//! from the device's pool when the op starts (see `progress::Output`); it
//! returns a [`Work`] at once, so the caller's thread is free to keep
//! issuing compute while the ring runs. Collectives of one communicator run
//! in issue order on every rank, which is what keeps every rank's steps in
//! the same order; two communicators (say, the rows and the columns of a
//! grid from `split`) have separate progress threads and run concurrently.

use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

use crossbeam::channel::{Sender, unbounded};

use crate::api::work::Work;
use crate::device::tensor::{DType, Element, Tensor};
use crate::device::{RankDevice, lock};
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::collectives::all_gather::{AllGather, AllGatherCoalesced};
use crate::runtime::collectives::all_gather_v::AllGatherV;
use crate::runtime::collectives::all_reduce::{AllReduce, AllReduceCoalesced};
use crate::runtime::collectives::all_to_all::AllToAll;
use crate::runtime::collectives::barrier::Barrier;
use crate::runtime::collectives::broadcast::Broadcast;
use crate::runtime::collectives::gather::Gather;
use crate::runtime::collectives::reduce::Reduce;
use crate::runtime::collectives::reduce_scatter::{ReduceScatter, ReduceScatterCoalesced};
use crate::runtime::collectives::reduce_scatter_v::ReduceScatterV;
use crate::runtime::collectives::scatter::Scatter;
use crate::runtime::collectives::send_recv::{Recv, Send};
use crate::runtime::collectives::split::Split;
use crate::runtime::collectives::{Collective, Seat};
use crate::runtime::flight::State;
use crate::runtime::health::Health;
use crate::runtime::hop::Link;
use crate::runtime::planner::Tuning;
use crate::runtime::profile::{Counters, Profile};
use crate::runtime::progress::{Inflight, Item, Op, Output, Progress};
use crate::runtime::shared;
use crate::runtime::split::Splits;
use crate::runtime::work_state::WorkState;
use crate::transport::Stager;

struct Issuer {
    /// The next collective's sequence number.
    seq: u64,
    /// The next send's sequence number to each peer, and the next
    /// receive's from each: each pair of ranks counts its own calls.
    sends: Vec<u64>,
    recvs: Vec<u64>,
    tx: Option<Sender<Op>>,
    /// The thread that issued the collectives now in flight (outside a run).
    owner: Option<ThreadId>,
    /// Which threads may issue, see [`Binding`].
    binding: Binding,
}

impl Issuer {
    /// Numbers `calls` with the next sequence numbers.
    fn number(&mut self, calls: impl Iterator<Item = Call>) -> Vec<Item> {
        calls
            .map(|c| {
                let counter = match &c.what {
                    Collective::Send(c) => self.sends.get_mut(c.peer),
                    Collective::Recv(c) => self.recvs.get_mut(c.peer),
                    _ => Some(&mut self.seq),
                };
                // Peers were checked against the group's size when the call was made.
                let seq = counter.map_or(0, |c| {
                    let s = *c;
                    *c = c.wrapping_add(1);
                    s
                });
                Item {
                    fp: c.what.fingerprint(seq),
                    what: c.what,
                    inputs: c.inputs,
                    outputs: c.outputs,
                }
            })
            .collect()
    }

    /// Starts every count again at 0 (a new run).
    fn restart(&mut self) {
        self.seq = 0;
        self.sends.iter_mut().for_each(|s| *s = 0);
        self.recvs.iter_mut().for_each(|s| *s = 0);
    }
}

/// Where a collective's output goes: a tensor the engine makes when the
/// call runs (the plain calls), or one the caller gives (the `_into` and
/// `_in_place` forms), so that each collective's checks are written once.
#[derive(Clone, Copy)]
pub(crate) enum Dest<'t> {
    New,
    Given(&'t Tensor),
}

/// Who may issue on a communicator.
///
/// Issue order is what pairs collectives across ranks. Two threads issuing
/// on one rank make that order a race, and same-shaped collectives would
/// survive it silently paired with the wrong peers. So:
/// - during `World::run`, a rank's communicator takes calls from that
///   rank's thread only (from the moment the run starts resetting it);
/// - outside a run, from one thread at a time: a call from another thread
///   while the first one's collectives are in flight fails, and fails the
///   group, so that the collectives already paired across the race fail
///   too instead of returning mixed results.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Binding {
    Free,
    Run(Option<ThreadId>),
}

struct Inner {
    rank: usize,
    size: usize,
    dev: Arc<RankDevice>,
    health: Arc<Health>,
    endpoint: Arc<Link>,
    timeout: Duration,
    issuer: Mutex<Issuer>,
    /// Ops queued or running on the progress thread.
    inflight: Arc<Inflight>,
    counters: Arc<Counters>,
    tuning: Tuning,
    progress: Mutex<Option<JoinHandle<()>>>,
    /// Where the group meets, when its ranks share one device.
    group: Option<Arc<shared::Group>>,
    splits: Arc<Splits>,
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

/// One call: what it is, and its tensors.
pub(crate) struct Call {
    what: Collective,
    inputs: Vec<Tensor>,
    outputs: Vec<Output>,
}

/// How a rank reaches the rest of its group: its end of the links (which
/// carries the meeting place when the whole group shares one device).
pub(crate) struct Reach {
    pub endpoint: Arc<Link>,
    /// The group's splits in progress (one registry per group).
    pub splits: Arc<Splits>,
}

impl Communicator {
    pub(crate) fn new(
        rank: usize,
        size: usize,
        dev: Arc<RankDevice>,
        reach: Reach,
        health: Arc<Health>,
        timeout: Duration,
        tuning: Tuning,
    ) -> Result<Communicator> {
        let Reach { endpoint, splits } = reach;
        let group = endpoint.meeting();
        let (tx, rx) = unbounded();
        let inflight = Arc::new(Inflight::default());
        let counters = Arc::new(Counters::default());
        let thread = Progress {
            counters: counters.clone(),
            tuning: tuning.clone(),
            stamps: None,
            rank,
            size,
            dev: dev.clone(),
            endpoint: endpoint.clone(),
            health: health.clone(),
            stage: Stager::new(dev.clone()),
            timeout,
            inflight: inflight.clone(),
            group: group.clone(),
            watch: None,
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
                    sends: vec![0; size],
                    recvs: vec![0; size],
                    tx: Some(tx),
                    owner: None,
                    binding: Binding::Free,
                }),
                inflight,
                counters,
                tuning,
                progress: Mutex::new(Some(handle)),
                group,
                splits,
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
    ///
    /// Submit to its queue and poll it from any thread, as any wgpu code
    /// does: the engine's own polls are made by one owner thread that never
    /// waits with a timeout, so they cannot race a user's (wgpu-core
    /// 30.0.2 can panic in a thread whose *timed* `PollType::Wait` expires
    /// while another thread polls: avoid timed waits of your own on a
    /// device you share, or they may panic in your thread).
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.dev.device
    }

    /// This rank's wgpu queue. Collectives follow stream order on it: a
    /// collective sees everything submitted before the call, and work
    /// submitted after its `Work` completes sees its result.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.dev.queue
    }

    /// The adapter this rank runs on, when the engine made its device
    /// ([`World::new`](crate::World::new)); `None` for a device the user
    /// handed in ([`World::from_devices`](crate::World::from_devices)).
    pub fn adapter(&self) -> Option<&wgpu::Adapter> {
        self.inner.dev.adapter.as_ref()
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

    /// What every rank of this communicator's group last did (see
    /// [`World::flight_record`](crate::World::flight_record)).
    pub fn flight_record(&self) -> crate::FlightRecord {
        self.inner.health.flight_record()
    }

    /// Waits (at most the world's timeout) until the device has run
    /// everything submitted to this rank's queue so far, by the engine or
    /// anyone else, as `torch.cuda.synchronize()` does.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.dev.finish_all()
    }

    /// Starts (or stops) recording where this communicator's collectives
    /// spend their time on this rank; read it with [`take_profile`](Self::take_profile).
    pub fn set_profiling(&self, on: bool) {
        self.inner.counters.set(on);
    }

    /// The time recorded since profiling started or was last read, which
    /// then starts again from zero.
    pub fn take_profile(&self) -> Profile {
        self.inner.counters.take(self.inner.dev.timestamps)
    }

    /// A tensor on this rank's device holding `data`.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     let x = c.tensor(&[half::bf16::from_f32(1.5); 3])?;
    ///     assert_eq!((x.len(), x.dtype(), x.rank()), (3, DType::BF16, c.rank()));
    ///     Ok(x.to_vec::<half::bf16>()?.iter().map(|v| v.to_f32()).collect())
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![1.5; 3]);
    /// # Ok(()) }
    /// ```
    pub fn tensor<T: Element>(&self, data: &[T]) -> Result<Tensor> {
        Tensor::from_slice(&self.inner.dev, data)
    }

    /// A zero-filled tensor on this rank's device.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     c.zeros(DType::F32, 3)?.to_vec::<f32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![0.0; 3]);
    /// # Ok(()) }
    /// ```
    pub fn zeros(&self, dtype: DType, len: usize) -> Result<Tensor> {
        Tensor::zeros(&self.inner.dev, dtype, len)
    }

    /// A tensor that views `len` elements of the user's `buffer` from byte
    /// `offset`, with no copy: collectives read and write the buffer
    /// itself, never a byte of it outside the view (a 16-bit view of odd
    /// length leaves the neighbouring half-word as it was).
    ///
    /// The buffer must belong to this rank's device and have `STORAGE`,
    /// `COPY_SRC` and `COPY_DST` usage and a size that is a multiple of 4
    /// bytes; `offset` must be a multiple of 4 bytes (wgpu's copy
    /// alignment; the 256-byte binding alignment is the engine's concern,
    /// not yours); the view must fit in the buffer. Anything else is
    /// [`Error::InvalidArgument`].
    ///
    /// Views that start the buffer and hold whole 16-byte units are used
    /// where they lie; others are copied to a pooled buffer on the device
    /// and back, around the collective. Stream order holds either way (see
    /// [`Communicator::queue`]).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     // A buffer of the user's own, 8 floats; the view is the middle 4.
    ///     let buffer = c.device().create_buffer(&wgpu::BufferDescriptor {
    ///         label: Some("mine"),
    ///         size: 32,
    ///         usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
    ///         mapped_at_creation: false,
    ///     });
    ///     c.queue().write_buffer(&buffer, 8, bytemuck::cast_slice(&[c.rank() as f32 + 1.0; 4]));
    ///     let view = c.wrap_buffer(&buffer, 8, DType::F32, 4)?;
    ///     let _ = c.all_reduce_in_place(&view, ReduceOp::Sum)?.wait()?;
    ///     view.to_vec::<f32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![3.0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn wrap_buffer(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        dtype: DType,
        len: usize,
    ) -> Result<Tensor> {
        Tensor::view(&self.inner.dev, buffer, offset, dtype, len)
    }

    /// A new output of `len` elements, made when the op starts; its size is
    /// checked now, so that a tensor too large fails at the call.
    fn output(&self, dtype: DType, len: usize) -> Result<Output> {
        let dev = &self.inner.dev;
        Tensor::buffer_size(dev, dtype, len)?;
        Ok(Output::New { dtype, len })
    }

    /// Sum (or another reduction) of `x` over all ranks, into a new tensor.
    /// Returns at once; `x` must not be written until the `Work` completes.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     let x = c.tensor(&[c.rank() as f32 + 1.0; 4])?; // rank 0: 1s, rank 1: 2s
    ///     c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![3.0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn all_reduce(&self, x: &Tensor, op: ReduceOp) -> Result<Work> {
        self.one(AllReduce::of(x, op), x, Dest::New)
    }

    /// Like [`all_reduce`](Self::all_reduce), leaving the result in `x`.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     let x = c.tensor(&[c.rank() as f32 + 1.0; 4])?; // rank 0: 1s, rank 1: 2s
    ///     let _ = c.all_reduce_in_place(&x, ReduceOp::Max)?.wait()?;
    ///     x.to_vec::<f32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![2.0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_in_place(&self, x: &Tensor, op: ReduceOp) -> Result<Work> {
        self.all_reduce_into(x, x, op)
    }

    /// Like [`all_reduce`](Self::all_reduce), into `out` (a tensor of this
    /// rank of `x`'s dtype and length, wrapped or not; `x` itself for in
    /// place). `wait()` returns `out`.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     let x = c.tensor(&[c.rank() as f32 + 1.0; 4])?; // rank 0: 1s, rank 1: 2s
    ///     let out = c.zeros(DType::F32, 4)?;
    ///     let _ = c.all_reduce_into(&x, &out, ReduceOp::Sum)?.wait()?;
    ///     out.to_vec::<f32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![3.0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp) -> Result<Work> {
        self.one(AllReduce::of(x, op), x, Dest::Given(out))
    }

    /// Every rank's `x`, concatenated in rank order: length n x len.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[c.rank() as i32; 2])?;
    ///     c.all_gather(&x)?.wait()?.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![0, 0, 1, 1]);
    /// # Ok(()) }
    /// ```
    pub fn all_gather(&self, x: &Tensor) -> Result<Work> {
        self.one(AllGather::of(x), x, Dest::New)
    }

    /// Reduces `x` over all ranks and gives rank r the r-th of n equal
    /// slices; `x.len()` must be divisible by n.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[1, 2, 3, 4])?;
    ///     c.reduce_scatter(&x, ReduceOp::Sum)?.wait()?.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![2, 4]);
    /// assert_eq!(got[1].clone()?, vec![6, 8]);
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter(&self, x: &Tensor, op: ReduceOp) -> Result<Work> {
        self.one(ReduceScatter::of(x, op), x, Dest::New)
    }

    /// Every rank's `x`, concatenated in rank order, where rank r gives
    /// `counts[r]` elements (`x.len()` must equal `counts[rank]`; every
    /// rank passes the same counts): torch's uneven `all_gather`,
    /// `MPI_Allgatherv`.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let counts = [1, 3];
    ///     let x = c.tensor(&vec![c.rank() as i32 + 1; counts[c.rank()]])?;
    ///     c.all_gather_v(&x, &counts)?.wait()?.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![1, 2, 2, 2]);
    /// # Ok(()) }
    /// ```
    pub fn all_gather_v(&self, x: &Tensor, counts: &[usize]) -> Result<Work> {
        self.one(AllGatherV::of(x, counts), x, Dest::New)
    }

    /// The reduction of every rank's `x`, of which rank r gets `counts[r]`
    /// elements, from the offset of the counts before it (`x.len()` must
    /// equal their sum; every rank passes the same counts):
    /// `MPI_Reduce_scatter`.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[1, 2, 3])?;
    ///     c.reduce_scatter_v(&x, &[1, 2], ReduceOp::Sum)?.wait()?.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![2]);
    /// assert_eq!(got[1].clone()?, vec![4, 6]);
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter_v(&self, x: &Tensor, counts: &[usize], op: ReduceOp) -> Result<Work> {
        self.one(ReduceScatterV::of(x, counts, op), x, Dest::New)
    }

    /// The root's `x` on every rank, in a new tensor (every rank passes a
    /// tensor of the same dtype and length; only the root's values matter).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[10 * c.rank() as i32 + 1])?;
    ///     c.broadcast(&x, 1)?.wait()?.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![11]);
    /// # Ok(()) }
    /// ```
    pub fn broadcast(&self, x: &Tensor, root: usize) -> Result<Work> {
        self.one(Broadcast::of(x, root), x, Dest::New)
    }

    /// The reduction of every rank's `x`, in the root's output. Other
    /// ranks' outputs hold the partial reduction they passed on.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[c.rank() as i32 + 1])?;
    ///     c.reduce(&x, ReduceOp::Sum, 0)?.wait()?.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![3]); // at the root
    /// # Ok(()) }
    /// ```
    pub fn reduce(&self, x: &Tensor, op: ReduceOp, root: usize) -> Result<Work> {
        self.one(Reduce::of(x, op, root), x, Dest::New)
    }

    /// Sends `send_counts[j]` elements of `x` (in order) to rank j and
    /// receives `recv_counts[j]` from it, rank-major in the output. `None`
    /// splits `x` evenly (its length must then be divisible by n). Counts
    /// that disagree between ranks fail on every rank involved.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let r = 10 * c.rank() as i32;
    ///     // Uneven: rank 0 sends one element to each rank, rank 1 both to rank 0.
    ///     let send = if c.rank() == 0 { [1, 1] } else { [2, 0] };
    ///     let recv = if c.rank() == 0 { [1, 2] } else { [1, 0] };
    ///     let x = c.tensor(&[r, r + 1])?;
    ///     c.all_to_all(&x, Some(&send), Some(&recv))?.wait()?.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![0, 10, 11]);
    /// assert_eq!(got[1].clone()?, vec![1]);
    /// # Ok(()) }
    /// ```
    pub fn all_to_all(
        &self,
        x: &Tensor,
        send_counts: Option<&[usize]>,
        recv_counts: Option<&[usize]>,
    ) -> Result<Work> {
        let what = self.all_to_all_of(x, send_counts, recv_counts)?;
        self.one(what, x, Dest::New)
    }

    /// Like [`all_gather`](Self::all_gather), into `out` (n x `x.len()`
    /// elements of `x`'s dtype, not overlapping `x`).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[c.rank() as i32; 2])?;
    ///     let out = c.zeros(DType::I32, 4)?;
    ///     let _ = c.all_gather_into(&x, &out)?.wait()?;
    ///     out.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![0, 0, 1, 1]);
    /// # Ok(()) }
    /// ```
    pub fn all_gather_into(&self, x: &Tensor, out: &Tensor) -> Result<Work> {
        self.one(AllGather::of(x), x, Dest::Given(out))
    }

    /// Like [`reduce_scatter`](Self::reduce_scatter), into `out`
    /// (`x.len()` / n elements of `x`'s dtype, not overlapping `x`).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[1, 2, 3, 4])?;
    ///     let out = c.zeros(DType::I32, 2)?;
    ///     let _ = c.reduce_scatter_into(&x, &out, ReduceOp::Sum)?.wait()?;
    ///     out.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![6, 8]);
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp) -> Result<Work> {
        self.one(ReduceScatter::of(x, op), x, Dest::Given(out))
    }

    /// Like [`all_gather_v`](Self::all_gather_v), into `out` (the sum of
    /// `counts` elements of `x`'s dtype, not overlapping `x`).
    pub fn all_gather_v_into(&self, x: &Tensor, out: &Tensor, counts: &[usize]) -> Result<Work> {
        self.one(AllGatherV::of(x, counts), x, Dest::Given(out))
    }

    /// Like [`reduce_scatter_v`](Self::reduce_scatter_v), into `out`
    /// (`counts[rank]` elements of `x`'s dtype, not overlapping `x`).
    pub fn reduce_scatter_v_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        counts: &[usize],
        op: ReduceOp,
    ) -> Result<Work> {
        self.one(ReduceScatterV::of(x, counts, op), x, Dest::Given(out))
    }

    /// Like [`broadcast`](Self::broadcast), into `out` (`x`'s dtype and
    /// length; `x` itself for in place).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[10 * c.rank() as i32 + 1])?;
    ///     let out = c.zeros(DType::I32, 1)?;
    ///     let _ = c.broadcast_into(&x, &out, 1)?.wait()?;
    ///     out.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![11]);
    /// # Ok(()) }
    /// ```
    pub fn broadcast_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<Work> {
        self.one(Broadcast::of(x, root), x, Dest::Given(out))
    }

    /// Like [`broadcast`](Self::broadcast), in place, as torch's
    /// `dist.broadcast(t, src)` and NCCL's `ncclBroadcast` with one buffer:
    /// the root's `x` is sent, every other rank's `x` receives it.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     let w = c.tensor(&[10.0 * c.rank() as f32; 4])?; // the root's: 10s
    ///     let _ = c.broadcast_in_place(&w, 1)?.wait()?;
    ///     w.to_vec::<f32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![10.0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn broadcast_in_place(&self, x: &Tensor, root: usize) -> Result<Work> {
        self.broadcast_into(x, x, root)
    }

    /// Like [`reduce`](Self::reduce), into `out` (`x`'s dtype and length;
    /// `x` itself for in place).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[c.rank() as i32 + 1])?;
    ///     let out = c.zeros(DType::I32, 1)?;
    ///     let _ = c.reduce_into(&x, &out, ReduceOp::Sum, 0)?.wait()?;
    ///     out.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![3]); // at the root
    /// # Ok(()) }
    /// ```
    pub fn reduce_into(&self, x: &Tensor, out: &Tensor, op: ReduceOp, root: usize) -> Result<Work> {
        self.one(Reduce::of(x, op, root), x, Dest::Given(out))
    }

    /// Like [`reduce`](Self::reduce), in place, as torch's
    /// `dist.reduce(t, dst)`: the root's `x` holds the reduction
    /// afterwards; every other rank's `x` is left as it was.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[c.rank() as i32 + 1; 2])?;
    ///     let _ = c.reduce_in_place(&x, ReduceOp::Sum, 0)?.wait()?;
    ///     x.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![3, 3]); // the root
    /// assert_eq!(got[1].clone()?, vec![2, 2]); // unchanged
    /// # Ok(()) }
    /// ```
    pub fn reduce_in_place(&self, x: &Tensor, op: ReduceOp, root: usize) -> Result<Work> {
        self.reduce_into(x, x, op, root)
    }

    /// Like [`all_to_all`](Self::all_to_all), into `out` (the sum of the
    /// receive counts, elements of `x`'s dtype, not overlapping `x`).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let r = 10 * c.rank() as i32;
    ///     let x = c.tensor(&[r, r + 1])?; // piece j goes to rank j
    ///     let out = c.zeros(DType::I32, 2)?;
    ///     let _ = c.all_to_all_into(&x, &out, None, None)?.wait()?;
    ///     out.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![1, 11]);
    /// # Ok(()) }
    /// ```
    pub fn all_to_all_into(
        &self,
        x: &Tensor,
        out: &Tensor,
        send_counts: Option<&[usize]>,
        recv_counts: Option<&[usize]>,
    ) -> Result<Work> {
        let what = self.all_to_all_of(x, send_counts, recv_counts)?;
        self.one(what, x, Dest::Given(out))
    }

    /// Gathers every rank's `x` into the root's `out` (n x `x.len()`
    /// elements, rank-major), as `MPI_Gather`. Off the root `out` is not
    /// touched (it may be empty); `wait()` returns it everywhere.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = c.tensor(&[c.rank() as i32 + 1; 2])?;
    ///     let out = c.zeros(DType::I32, if c.rank() == 1 { 4 } else { 0 })?;
    ///     let _ = c.gather_into(&x, &out, 1)?.wait()?;
    ///     out.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![1, 1, 2, 2]);
    /// # Ok(()) }
    /// ```
    pub fn gather_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<Work> {
        self.one(Gather::of(x, root), x, Dest::Given(out))
    }

    /// Scatters the root's `x` (n x `out.len()` elements): rank r's `out`
    /// gets slice r, as `MPI_Scatter`. Off the root `x` is not read (it
    /// may be empty).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<i32>, Error> {
    ///     let x = if c.rank() == 0 { c.tensor(&[1, 2, 3, 4])? } else { c.zeros(DType::I32, 0)? };
    ///     let out = c.zeros(DType::I32, 2)?;
    ///     let _ = c.scatter_into(&x, &out, 0)?.wait()?;
    ///     out.to_vec::<i32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![3, 4]);
    /// # Ok(()) }
    /// ```
    pub fn scatter_into(&self, x: &Tensor, out: &Tensor, root: usize) -> Result<Work> {
        self.one(Scatter::of(out, root), x, Dest::Given(out))
    }

    /// Sends `x` to rank `peer`, which receives it with
    /// [`recv`](Self::recv): the k-th send from this rank to `peer` pairs
    /// with `peer`'s k-th receive from this rank (each pair counts its own
    /// calls; collectives keep theirs). A receive of another dtype or length
    /// fails both sides with [`Error::Mismatch`], the send's own `Work`
    /// and the receive's, each told as its side sees it. Posting the send
    /// does not wait for the receive (the bytes are buffered on the way,
    /// so the calls issued after it go on), but its `Work` completes, as
    /// `MPI_Issend`'s does, once `x` has been read *and* the receiver has
    /// matched it (for a receiver in another process: once `x` has been
    /// read); `wait()` gives an empty tensor. So wait for a send after
    /// issuing the receives it may depend on, or put them in one
    /// [`group`](Self::group). Like collectives, sends and receives run in
    /// this rank's issue order.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<f32>, Error> {
    ///     let out = c.zeros(DType::F32, 3)?;
    ///     if c.rank() == 0 {
    ///         let _ = c.send(&c.tensor(&[1.0f32, 2.0, 3.0])?, 1)?.wait()?;
    ///     } else {
    ///         let _ = c.recv(&out, 0)?.wait()?;
    ///     }
    ///     out.to_vec::<f32>()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![1.0, 2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    pub fn send(&self, x: &Tensor, peer: usize) -> Result<Work> {
        self.one(Send::of(x, peer), x, Dest::New)
    }

    /// Receives into `out` what rank `peer` sends with
    /// [`send`](Self::send) (see there for the pairing); `wait()` returns
    /// `out`.
    pub fn recv(&self, out: &Tensor, peer: usize) -> Result<Work> {
        self.issue(self.call(Recv::of(out, peer).into(), &[], Dest::Given(out))?)
    }

    /// Completes once every rank has called it.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<usize, Error> {
    ///     let _ = c.barrier()?.wait()?; // every rank has arrived
    ///     Ok(c.rank())
    /// })?;
    /// assert_eq!(got.into_iter().collect::<Result<Vec<_>, _>>()?, vec![0, 1]);
    /// # Ok(()) }
    /// ```
    pub fn barrier(&self) -> Result<Work> {
        self.issue(self.call(Barrier.into(), &[], Dest::New)?)
    }

    /// All-reduces several tensors of one dtype in one ring pass over their
    /// concatenation; `wait_all` gives the outputs in order.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<Vec<f32>>, Error> {
    ///     let xs = [c.tensor(&[1.0f32])?, c.tensor(&[2.0f32; 3])?];
    ///     let outs = c.all_reduce_coalesced(&xs, ReduceOp::Sum)?.wait_all()?;
    ///     outs.iter().map(|t| t.to_vec::<f32>()).collect()
    /// })?;
    /// assert_eq!(got[0].clone()?, vec![vec![2.0], vec![4.0; 3]]);
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_coalesced(&self, xs: &[Tensor], op: ReduceOp) -> Result<Work> {
        self.issue(self.call(AllReduceCoalesced::of(xs, op).into(), xs, Dest::New)?)
    }

    /// `all_gather` of several tensors of one dtype as one `Work`.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<Vec<u32>>, Error> {
    ///     let xs = [c.tensor(&[c.rank() as u32])?, c.tensor(&[7u32; 2])?];
    ///     let outs = c.all_gather_coalesced(&xs)?.wait_all()?;
    ///     outs.iter().map(|t| t.to_vec::<u32>()).collect()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![vec![0, 1], vec![7; 4]]);
    /// # Ok(()) }
    /// ```
    pub fn all_gather_coalesced(&self, xs: &[Tensor]) -> Result<Work> {
        self.issue(self.call(AllGatherCoalesced::of(xs).into(), xs, Dest::New)?)
    }

    /// `reduce_scatter` of several tensors of one dtype as one `Work`.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// let got = world.run(|c| -> Result<Vec<Vec<u32>>, Error> {
    ///     let xs = [c.tensor(&[1u32, 2])?, c.tensor(&[3u32, 4, 5, 6])?];
    ///     let outs = c.reduce_scatter_coalesced(&xs, ReduceOp::Sum)?.wait_all()?;
    ///     outs.iter().map(|t| t.to_vec::<u32>()).collect()
    /// })?;
    /// assert_eq!(got[1].clone()?, vec![vec![4], vec![10, 12]]);
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter_coalesced(&self, xs: &[Tensor], op: ReduceOp) -> Result<Work> {
        self.issue(self.call(ReduceScatterCoalesced::of(xs, op).into(), xs, Dest::New)?)
    }

    /// Splits the group, as `ncclCommSplit`: a collective over this
    /// communicator (every rank must call it). Ranks passing the same
    /// `color` form a new communicator, ordered by (`key`, rank here);
    /// `None` takes part but gets no communicator.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(4))?;
    /// let got = world.run(|c| -> Result<(usize, usize, i32), Error> {
    ///     // Even and odd ranks, each its own group of 2.
    ///     let Some(sub) = c.split(Some(c.rank() as u32 % 2), c.rank())? else { unreachable!() };
    ///     let x = sub.tensor(&[c.rank() as i32])?;
    ///     let sum = sub.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<i32>()?;
    ///     Ok((sub.rank(), sub.size(), sum[0]))
    /// })?;
    /// assert_eq!(got[3].clone()?, (1, 2, 1 + 3)); // rank 3 is the odd group's rank 1
    /// # Ok(()) }
    /// ```
    pub fn split(&self, color: Option<u32>, key: usize) -> Result<Option<Communicator>> {
        let work = self.issue(Call {
            what: Collective::Split(Split { color, key }),
            inputs: Vec::new(),
            outputs: Vec::new(),
        })?;
        let seq = work.seq();
        let all = work.wait_split()?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(usize, usize)> = all
            .iter()
            .enumerate()
            .filter(|(_, (c, _))| *c == Some(color))
            .map(|(rank, (_, key))| (*key, rank))
            .collect();
        members.sort_unstable();
        let parents: Vec<usize> = members.iter().map(|&(_, rank)| rank).collect();
        let me = parents
            .iter()
            .position(|&r| r == self.rank())
            .ok_or_else(|| {
                Error::device(
                    self.rank(),
                    Some(seq),
                    "split: this rank is missing from its own color",
                )
            })?;
        let inner = &self.inner;
        let (endpoint, joined) =
            inner
                .splits
                .join(&inner.health, &*inner.endpoint, (seq, color), &parents, me)?;
        // A group that meets where its parent did not (one process's
        // ranks of a world over several) has plans its parent's table
        // never timed: the rules decide for it, the same on every member.
        let mut tuning = inner.tuning.clone();
        // A split's sequence numbers are its own: it keeps its parent's
        // first table and does not heal.
        tuning.heal = None;
        // Nor does it lie over processes as the world does.
        tuning.tier = None;
        if inner.group.is_none() && endpoint.meeting().is_some() {
            tuning.table = None;
        }
        Communicator::new(
            me,
            parents.len(),
            inner.dev.clone(),
            Reach {
                endpoint,
                splits: joined.splits,
            },
            joined.health,
            inner.timeout,
            tuning,
        )
        .map(Some)
    }

    fn check_tensor(&self, x: &Tensor) -> Result<()> {
        if !Arc::ptr_eq(x.rank_device(), &self.inner.dev) {
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

    /// This rank's seat in the group, as units check calls against it.
    fn seat(&self) -> Seat {
        Seat {
            rank: self.rank(),
            size: self.size(),
        }
    }

    /// An all_to_all of `x` with the counts given (even shares where none are).
    pub(crate) fn all_to_all_of(
        &self,
        x: &Tensor,
        send_counts: Option<&[usize]>,
        recv_counts: Option<&[usize]>,
    ) -> Result<AllToAll> {
        AllToAll::new(self.seat(), x.dtype(), x.len(), send_counts, recv_counts)
            .map_err(|why| Error::invalid(self.rank(), why))
    }

    /// Issues the one-tensor call `what` of `x` into `dest`.
    fn one(&self, what: impl Into<Collective>, x: &Tensor, dest: Dest) -> Result<Work> {
        self.issue(self.call(what.into(), std::slice::from_ref(x), dest)?)
    }

    /// The one path every call takes: its tensors this rank's and of its
    /// dtype, its operator defined on that dtype, and its unit's own
    /// checks and layout (`Unit::layout`). It has an output per input (one
    /// when it has none): new, or the caller's `dest` checked against the
    /// layout alike, so `foo(&x)` is `foo_into` with a new output.
    pub(crate) fn call(&self, what: Collective, xs: &[Tensor], dest: Dest) -> Result<Call> {
        let me = self.rank();
        let unit = what.unit();
        let dtype = unit.dtype().unwrap_or(DType::F32);
        let reads = unit.reads_input(me);
        for x in xs {
            self.check_tensor(x)?;
            if reads && x.dtype() != dtype {
                return Err(Error::invalid(
                    me,
                    format!(
                        "{}: its tensors must share a dtype: {dtype} and {}",
                        what.kind().name(),
                        x.dtype()
                    ),
                ));
            }
        }
        if let Some(op) = unit.op().filter(|op| !op.supports(dtype)) {
            return Err(Error::invalid(
                me,
                format!("reduce op {op} needs an integer dtype, got {dtype}"),
            ));
        }
        // One output per input; a call without inputs (a barrier, a
        // receive) still has one, but a coalesced call over no tensors
        // has none, as torch's coalescing manager over nothing.
        let coalesced = matches!(
            what,
            Collective::AllReduceCoalesced(_)
                | Collective::AllGatherCoalesced(_)
                | Collective::ReduceScatterCoalesced(_)
        );
        let count = if coalesced { xs.len() } else { xs.len().max(1) };
        let mut outputs = Vec::with_capacity(count);
        for i in 0..count {
            let x = xs.get(i);
            let layout = unit
                .layout(self.seat(), x.map_or(0, Tensor::len))
                .map_err(|why| Error::invalid(me, why))?;
            // The same for every input: checked once.
            if i == 0 && layout.scratch > 0 {
                Tensor::buffer_size(&self.inner.dev, dtype, layout.scratch)?;
            }
            let out = match (dest, layout.out) {
                (Dest::New, len) => self.output(dtype, len.unwrap_or(0))?,
                (Dest::Given(out), None) => {
                    self.check_tensor(out)?;
                    Output::Given(out.clone())
                }
                (Dest::Given(out), Some(len)) => {
                    self.given(dtype, x.filter(|_| reads), out, len, layout.in_place)?
                }
            };
            outputs.push(out);
        }
        Ok(Call {
            what,
            inputs: xs.to_vec(),
            outputs,
        })
    }

    /// Checks an output the caller gives: this rank's, of `dtype` and
    /// `len` elements, and either the input `x` itself (when `in_place`
    /// is allowed) or sharing no byte with it.
    fn given(
        &self,
        dtype: DType,
        x: Option<&Tensor>,
        out: &Tensor,
        len: usize,
        in_place: bool,
    ) -> Result<Output> {
        self.check_tensor(out)?;
        let me = self.rank();
        if out.dtype() != dtype {
            return Err(Error::invalid(
                me,
                format!(
                    "the output is a {} tensor, the input a {dtype} one",
                    out.dtype(),
                ),
            ));
        }
        if out.len() != len {
            return Err(Error::invalid(
                me,
                format!("the output has {} elements, {len} expected", out.len()),
            ));
        }
        if let Some(x) = x {
            let same = x.same_view(out);
            if (same && !in_place) || (!same && x.overlaps(out)) {
                return Err(Error::invalid(
                    me,
                    if same {
                        "this collective cannot run in place: give an output apart from the input"
                            .to_string()
                    } else {
                        "the output overlaps the input without being it".to_string()
                    },
                ));
            }
        }
        Ok(Output::Given(out.clone()))
    }

    fn issue(&self, call: Call) -> Result<Work> {
        self.issue_all(std::iter::once(call))
    }

    /// Queues `calls` as one op (one call, or a group's): collectives take
    /// the next sequence numbers of the group, sends and receives the next
    /// of their pair's.
    pub(crate) fn issue_all(&self, calls: impl IntoIterator<Item = Call>) -> Result<Work> {
        let mut calls = calls.into_iter().peekable();
        let inner = &self.inner;
        let state = WorkState::new();
        let mut issuer = lock(&inner.issuer);
        let kind = calls.peek().map_or("group", |c| c.what.kind().name());
        let me = std::thread::current().id();
        let busy = inner.inflight.get();
        match issuer.binding {
            Binding::Run(Some(t)) if t == me => {}
            Binding::Run(_) => {
                return Err(Error::invalid(
                    inner.rank,
                    format!(
                        "{} issued from a thread other than rank {}'s during World::run: \
                         issue order pairs collectives across ranks, so in a run each \
                         communicator takes calls from its rank's thread only",
                        kind, inner.rank
                    ),
                ));
            }
            Binding::Free if busy > 0 && issuer.owner.is_some_and(|o| o != me) => {
                let e = Error::invalid(
                    inner.rank,
                    format!(
                        "{} issued from a second thread while {busy} collective(s) issued by \
                         another thread are in flight on this communicator: issue order \
                         pairs collectives across ranks, so a communicator takes calls from \
                         one thread at a time; the group is failed so that nothing pairs \
                         across the race",
                        kind
                    ),
                );
                inner.health.fail(inner.rank, e.clone());
                return Err(e);
            }
            Binding::Free => {}
        }
        if issuer.tx.is_none() {
            return Err(Error::Aborted {
                rank: inner.rank,
                seq: issuer.seq,
            });
        }
        // An empty group's Work is named after the place it takes in the
        // sequence; a group's after its first call.
        let empty = Collective::Barrier(Barrier).fingerprint(issuer.seq);
        let items = issuer.number(calls);
        let fp = items.first().map_or(empty, |it| it.fp);
        issuer.owner = Some(me);
        inner.inflight.add();
        let shape = items
            .iter()
            .flat_map(|it| it.outputs.first())
            .next()
            .map_or((0, DType::F32), Output::shape);
        // Recorded before the progress thread can see the op, so that its
        // "in progress" is never overwritten by a late "enqueued".
        for it in &items {
            inner
                .health
                .flight
                .record(inner.rank, it.fp, State::Enqueued);
            tracing::debug!(rank = inner.rank, seq = it.fp.seq, call = %it.fp, "issued");
        }
        let op = Op {
            items,
            state: state.clone(),
        };
        let sent = match issuer.tx.as_ref() {
            Some(tx) => tx.send(op).map_err(|e| e.into_inner().items),
            None => Err(op.items),
        };
        if let Err(items) = sent {
            inner.inflight.done();
            for it in items {
                inner.health.flight.record(inner.rank, it.fp, State::Failed);
            }
            return Err(Error::device(
                inner.rank,
                Some(fp.seq),
                "the progress thread has stopped",
            ));
        }
        Ok(Work::new(
            state,
            shape,
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
        let deadline = crate::deadline::after(inner.timeout.saturating_mul(2));
        inner.inflight.wait_idle(deadline);
        inner.health.set_gone(inner.rank);
    }

    /// A run is starting: no thread may issue until its rank thread is bound.
    pub(crate) fn enter_run(&self) {
        lock(&self.inner.issuer).binding = Binding::Run(None);
    }

    /// The calling thread is this rank's thread for the run.
    pub(crate) fn bind_run_thread(&self) {
        lock(&self.inner.issuer).binding = Binding::Run(Some(std::thread::current().id()));
    }

    /// The run is over: any thread may issue again, one at a time.
    pub(crate) fn leave_run(&self) {
        let mut issuer = lock(&self.inner.issuer);
        issuer.binding = Binding::Free;
        issuer.owner = None;
    }

    /// Prepares for a new `World::run`: waits for the previous run's
    /// collectives to resolve, drops their stray packets, and starts the
    /// sequence again at 0.
    pub(crate) fn reset(&self) -> Result<()> {
        let inner = &self.inner;
        let deadline = crate::deadline::after(inner.timeout.saturating_mul(2));
        if !inner.inflight.wait_idle(deadline) {
            return Err(Error::Timeout {
                rank: inner.rank,
                seq: lock(&inner.issuer).seq,
                what: "the previous run's collectives to finish".into(),
                after: inner.timeout.saturating_mul(2),
                flight: inner.health.flight.report(),
            });
        }
        inner.endpoint.drain();
        if let Some(g) = &inner.group {
            g.clear();
        }
        if let Some(t) = &inner.tuning.tier {
            t.clear();
        }
        inner.splits.clear();
        lock(&inner.issuer).restart();
        Ok(())
    }
}

thread_local! {
    /// On a rank thread of `World::run`, while its closure may unwind: the
    /// links of communicators dropped by the unwinding (a split's child,
    /// say). Closing them at once would tell peers "its end of the link is
    /// gone" before the run has recorded the panic, and that, not the
    /// panic, would be the failure they report.
    static UNWOUND_LINKS: std::cell::RefCell<Option<Vec<Arc<Link>>>> =
        const { std::cell::RefCell::new(None) };
}

/// This thread runs a rank's closure: links dropped while it unwinds are
/// kept until [`release_unwound_links`].
pub(crate) fn keep_unwound_links() {
    UNWOUND_LINKS.with(|l| *l.borrow_mut() = Some(Vec::new()));
}

/// The closure has returned or its panic is recorded: the links it
/// dropped while unwinding close now.
pub(crate) fn release_unwound_links() {
    let links = UNWOUND_LINKS.with(|l| l.borrow_mut().take());
    drop(links);
}

impl Drop for Inner {
    fn drop(&mut self) {
        if std::thread::panicking() {
            UNWOUND_LINKS.with(|l| {
                if let Ok(mut l) = l.try_borrow_mut() {
                    if let Some(kept) = l.as_mut() {
                        kept.push(self.endpoint.clone());
                    }
                }
            });
        }
        // Closing the queue ends the progress thread once it has run what was queued.
        lock(&self.issuer).tx = None;
        if let Some(h) = lock(&self.progress).take() {
            let _ = h.join();
        }
    }
}
