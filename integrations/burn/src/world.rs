//! A world of ranks whose devices burn sees, and burn's own calling shape
//! (`Vec` of one tensor per device, as `Tensor::all_reduce` takes).

use burn_tensor::wgpu::WgpuSetup;
use burn_tensor::{Device, Tensor};
use wgpu_collectives::{World, WorldConfig};

use crate::collective::{Kind, Reduction, check};
use crate::devices::{pick_adapter, request_setups};
use crate::error::{Error, Result};
use crate::rank::Rank;

/// Ranks on wgpu devices that burn and the engine share: rank r's tensors
/// live on [`devices()[r]`](Self::devices).
///
/// The `Vec`-shaped calls issue every rank's part from the calling thread,
/// so a world takes them from one thread at a time (the engine pairs
/// collectives by issue order; a second thread issuing while the first's
/// calls are in flight fails the group rather than pair them wrongly).
pub struct BurnWorld {
    world: World,
    devices: Vec<Device>,
}

impl BurnWorld {
    /// `config.ranks()` new devices on one adapter (the first whose name
    /// contains `WGPU_ADAPTER_NAME`, real GPUs before CPU adapters), each
    /// registered with burn as a device of its own, as burn would see one
    /// GPU per rank. The engine takes `config`'s timeout, placement and
    /// algorithm; its adapter choice is this one.
    pub fn new(config: WorldConfig) -> Result<BurnWorld> {
        let (instance, adapter) = pick_adapter()?;
        let setups = request_setups(&instance, &adapter, config.ranks())?;
        BurnWorld::from_setups(setups, config)
    }

    /// A world over wgpu devices the caller made: each is registered with
    /// burn once (burn allows one registration per device, so none of them
    /// may have been registered before) and handed to the engine.
    pub fn from_setups(setups: Vec<WgpuSetup>, config: WorldConfig) -> Result<BurnWorld> {
        let engine_devices = setups
            .iter()
            .map(|s| (s.device.clone(), s.queue.clone()))
            .collect();
        let devices = setups
            .into_iter()
            .enumerate()
            .map(|(rank, setup)| {
                Device::wgpu_options()
                    .setup(setup)
                    .init()
                    .map_err(|e| Error::setup(format!("rank {rank}: burn refused the device: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let world = World::from_devices(engine_devices, config)?;
        Ok(BurnWorld { world, devices })
    }

    /// Rank r's burn device, for r in `0..size()`.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// How many ranks.
    pub fn size(&self) -> usize {
        self.devices.len()
    }

    /// The engine's world, for what this crate does not wrap.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// Runs `f` once per rank, each on a thread of its own, as SPMD code
    /// (see [`World::run`]: a rank that panics fails the others' calls
    /// instead of hanging them).
    pub fn run<T, F>(&self, f: F) -> Result<Vec<T>>
    where
        T: Send,
        F: Fn(&Rank) -> T + Sync,
    {
        let states = self.devices.iter().collect();
        Ok(self
            .world
            .run_with(states, |comm, device| f(&Rank { comm, device }))?)
    }

    /// Like [`run`](Self::run), moving `states[r]` into rank r's closure.
    pub fn run_with<S, T, F>(&self, states: Vec<S>, f: F) -> Result<Vec<T>>
    where
        S: Send,
        T: Send,
        F: Fn(&Rank, S) -> T + Sync,
    {
        if states.len() != self.size() {
            return Err(wgpu_collectives::Error::InvalidArgument {
                rank: None,
                what: format!(
                    "run_with got {} states for {} ranks",
                    states.len(),
                    self.size()
                ),
            }
            .into());
        }
        let states = self.devices.iter().zip(states).collect();
        Ok(self.world.run_with(states, |comm, (device, state)| {
            f(&Rank { comm, device }, state)
        })?)
    }

    /// burn's `Tensor::all_reduce`, done by the engine: `tensors[r]` on
    /// rank r's device, all of one shape and dtype; result r on device r.
    /// Each is written in place when its tensor owns its handle alone.
    pub fn all_reduce<const D: usize>(
        &self,
        tensors: Vec<Tensor<D>>,
        op: impl Reduction,
    ) -> Result<Vec<Tensor<D>>> {
        self.call(Kind::AllReduce(op.reduce_op()), tensors)
    }

    /// burn's `Tensor::all_gather` along dimension 0.
    pub fn all_gather<const D: usize>(&self, tensors: Vec<Tensor<D>>) -> Result<Vec<Tensor<D>>> {
        self.call(Kind::AllGather, tensors)
    }

    /// burn's `Tensor::reduce_scatter` along dimension 0, whose size must
    /// split into `size()` even chunks.
    pub fn reduce_scatter<const D: usize>(
        &self,
        tensors: Vec<Tensor<D>>,
        op: impl Reduction,
    ) -> Result<Vec<Tensor<D>>> {
        self.call(Kind::ReduceScatter(op.reduce_op()), tensors)
    }

    /// burn's `Tensor::broadcast`: `tensor` lives on rank `root`'s device;
    /// result r is a copy on device r (result `root` is `tensor` itself,
    /// untouched).
    pub fn broadcast<const D: usize>(
        &self,
        tensor: Tensor<D>,
        root: usize,
    ) -> Result<Vec<Tensor<D>>> {
        let (dims, dtype) = (tensor.dims(), tensor.dtype());
        let mut tensor = Some(tensor);
        let tensors = (0..self.size())
            .map(|r| match (r == root, &self.devices.get(r)) {
                (true, _) => tensor.take(),
                (false, Some(device)) => Some(Tensor::<D>::empty(dims, (*device, dtype))),
                (false, None) => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                Error::tensor(
                    root,
                    format!("broadcast: root {root} of {} ranks", self.size()),
                )
            })?;
        self.call(Kind::Broadcast { root }, tensors)
    }

    /// Checks every rank's tensor before any rank issues, then lends and
    /// issues rank by rank from this thread (the engine queues each at
    /// once), then waits for all.
    fn call<const D: usize>(&self, kind: Kind, tensors: Vec<Tensor<D>>) -> Result<Vec<Tensor<D>>> {
        self.check(&tensors)?;
        let checked = tensors
            .into_iter()
            .zip(&self.devices)
            .enumerate()
            .map(|(r, (t, device))| check(self.comm(r)?, device, kind, t))
            .collect::<Result<Vec<_>>>()?;
        let mut running = Vec::with_capacity(checked.len());
        for (r, c) in checked.into_iter().enumerate() {
            let issued = self
                .comm(r)
                .and_then(|comm| c.lend(comm).and_then(|s| Ok((s.issue(comm)?, s))));
            match issued {
                Ok((work, staged)) => running.push((staged, work)),
                Err(e) => {
                    // A device that failed to hand over its tensor: the
                    // ranks already running would wait for this one until
                    // the deadline, so the group is aborted (as NCCL's
                    // ncclCommAbort) and fails at once.
                    if let Some(comm) = self.world.communicator(0) {
                        comm.abort();
                    }
                    return Err(e);
                }
            }
        }
        running.into_iter().map(|(s, w)| s.finish(w)).collect()
    }

    /// One tensor per rank, all of one shape and dtype (burn's own check,
    /// returned as an error).
    fn check<const D: usize>(&self, tensors: &[Tensor<D>]) -> Result<()> {
        if tensors.len() != self.size() {
            return Err(Error::tensor(
                0,
                format!(
                    "{} tensors for {} ranks: one per rank",
                    tensors.len(),
                    self.size()
                ),
            ));
        }
        if let Some(first) = tensors.first() {
            let (dims, dtype) = (first.dims(), first.dtype());
            for (r, t) in tensors.iter().enumerate() {
                if t.dims() != dims || t.dtype() != dtype {
                    return Err(Error::tensor(
                        r,
                        format!(
                            "dims {:?} and dtype {:?}, but rank 0's are {dims:?} and {dtype:?}",
                            t.dims(),
                            t.dtype()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn comm(&self, rank: usize) -> Result<&wgpu_collectives::Communicator> {
        self.world
            .communicator(rank)
            .ok_or_else(|| Error::tensor(rank, "no such rank in this world"))
    }
}
