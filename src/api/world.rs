//! `World`: N simulated ranks, each on its own wgpu device, running SPMD code.
//!
//! Ranks are threads of one process, but nothing they share is implicit:
//! each has its own `Device` and `Queue` (several may come from one
//! adapter), and they talk only through the transport's links, as ranks in
//! separate processes would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::api::bootstrap::{adopt, check, devices_on, find_adapters};
use crate::api::comm::{Communicator, Reach, keep_unwound_links, release_unwound_links};
use crate::api::config::{HostLink, Placement, WorldConfig};
use crate::api::tune::timing::Bench;
use crate::api::tune::{Tuned, cache};
use crate::device::RankDevice;
use crate::error::{Error, Result, panic_message};
use crate::runtime::cost::{Algorithm, CostModel};
use crate::runtime::flight::FlightRecord;
use crate::runtime::heal::Heal;
use crate::runtime::health::Health;
use crate::runtime::hop::Link;
use crate::runtime::plan::Plan;
use crate::runtime::planner::Tuning;
use crate::runtime::split::Splits;
use crate::transport::local::mesh;

/// A group of simulated ranks.
pub struct World {
    /// The instance the adapters came from, when `World::new` made them.
    instance: Option<wgpu::Instance>,
    comms: Vec<Communicator>,
    adapters: Vec<wgpu::AdapterInfo>,
    pub(crate) health: Arc<Health>,
    tuning: Tuning,
    /// What tuning measured or read, when the world was tuned.
    pub(crate) tuned: Option<Tuned>,
    /// Set while a `run` is in progress (see [`World::run`]).
    running: AtomicBool,
    /// What carries hops between ranks on separate devices.
    host_link: Option<HostLink>,
    /// The placement in force: `SharedDevice` when every rank shares one
    /// device and collectives run there, else `DevicePerRank`.
    placement: Placement,
    /// The rank of `comms[0]`: ranks before it live in other processes.
    base: usize,
    /// Ranks in the world, in every process.
    size: usize,
    /// This process's end of MPI, in a world over several processes.
    #[cfg(feature = "mpi")]
    pub(crate) hub: Option<Arc<crate::transport::mpi::hub::Hub>>,
    /// The world's group id on the wire, in a world over several processes.
    #[cfg(feature = "mpi")]
    pub(crate) group: u64,
}

/// Ends a run, however it ends: the communicators take calls from any
/// thread again, and another run may start.
struct RunGuard<'a> {
    running: &'a AtomicBool,
    comms: &'a [Communicator],
    health: &'a Health,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        for c in self.comms {
            c.leave_run();
        }
        // A rank whose closure returned is gone for the run's peers only;
        // the user's threads may use its communicator next.
        self.health.end_run();
        self.running.store(false, Ordering::Release);
    }
}

impl Drop for World {
    /// Aborts whatever is still in flight, so that a rank waiting for a
    /// peer that will never issue fails at once instead of holding
    /// the drop for the whole timeout; then each communicator's progress
    /// thread drains its queue (every op fails at once) and is joined.
    /// Communicators made by `split` from this world fail from then on too.
    fn drop(&mut self) {
        #[cfg(feature = "mpi")]
        if let Some(hub) = &self.hub {
            // After a failure, MPI is left without MPI_Finalize, which a
            // dead peer could hold forever.
            hub.failed(self.health.failed());
        }
        // Every rank reports `Aborted` with its own rank and sequence number.
        self.health.fail(0, Error::Aborted { rank: 0, seq: 0 });
        // MPI ends with the world, not with the last link's drop, which a
        // progress thread may hold past the process's exit.
        #[cfg(feature = "mpi")]
        if let Some(hub) = &self.hub {
            hub.shutdown();
        }
    }
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "World({} ranks)", self.size())
    }
}

impl World {
    /// Finds adapters and creates one device per rank, spread round-robin
    /// over the matching adapters (GPUs preferred over CPU adapters).
    ///
    /// The first world of its kind on a machine times its plans on its
    /// devices (about 1.3 s for 4 ranks on 2 cores without a GPU) and
    /// writes what it found to a cache folder
    /// (`$XDG_CACHE_HOME/wgpu-collectives`, else
    /// `~/.cache/wgpu-collectives`); the next reads it in milliseconds.
    /// [`WorldConfig::with_tune_cache`] (or `WGPU_COLLECTIVES_TUNE_CACHE`)
    /// moves the folder, [`WorldConfig::with_tune`] with [`Tune::Off`](crate::Tune::Off)
    /// (or `WGPU_COLLECTIVES_TUNE=off`) turns the timing off, and
    /// [`WorldConfig::with_tune_table`] gives a table instead.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(2))?;
    /// assert_eq!(world.size(), 2);
    /// let ranks = world.run(|c| c.rank())?;
    /// assert_eq!(ranks, vec![0, 1]);
    /// # Ok(()) }
    /// ```
    pub fn new(config: WorldConfig) -> Result<World> {
        check(&config)?;
        let (instance, adapters) = find_adapters(&config)?;
        let devices = devices_on(&adapters, 0..config.ranks(), config.placement()?, &config)?;
        // Ranks that share an adapter, under a tuning Auto placement: both
        // placements are timed, and the faster kept.
        let (devices, config, measured) =
            crate::api::tune::placement_for(&config, &adapters, devices, &World::bench)?;
        Self::assemble_tuned(Some(instance), devices, &config, measured)
    }

    /// A world on devices the caller made (a framework such as burn or
    /// cubecl-wgpu that already holds them): rank r runs on `devices[r]`.
    /// A count other than `config`'s rank count is
    /// [`Error::InvalidArgument`]; `config`'s backend, adapter and required
    /// features and limits are not used.
    ///
    /// The engine takes the devices as they are: where one lacks a feature
    /// it likes (`MAPPABLE_PRIMARY_BUFFERS`, `TIMESTAMP_QUERY`) or has
    /// default limits, it falls back. It installs no global callbacks on
    /// them (`on_uncaptured_error`, device-lost: those belong to whoever
    /// made the devices) and catches its own errors in error scopes.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Devices a framework made (here, by hand) on the adapter WGPU_ADAPTER_NAME names.
    /// let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    /// let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(&instance, None))?;
    /// let devices = (0..2)
    ///     .map(|_| pollster::block_on(adapter.request_device(&Default::default())))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let world = World::from_devices(devices, WorldConfig::new(2))?;
    /// let sums = world.run(|c| -> Result<Vec<u32>, Error> {
    ///     let x = c.tensor(&[1u32; 3])?;
    ///     c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec()
    /// })?;
    /// assert_eq!(sums[1].clone()?, vec![2; 3]);
    /// # Ok(()) }
    /// ```
    pub fn from_devices(
        devices: Vec<(wgpu::Device, wgpu::Queue)>,
        config: WorldConfig,
    ) -> Result<World> {
        check(&config)?;
        if devices.len() != config.ranks() {
            return Err(Error::InvalidArgument {
                rank: None,
                what: format!(
                    "from_devices got {} devices for a world of {} ranks",
                    devices.len(),
                    config.ranks()
                ),
            });
        }
        let made = adopt(devices, &config)?;
        Self::assemble(None, made, &config)
    }

    fn assemble(
        instance: Option<wgpu::Instance>,
        devices: Vec<Arc<RankDevice>>,
        config: &WorldConfig,
    ) -> Result<World> {
        Self::assemble_tuned(instance, devices, config, None)
    }

    /// [`assemble`](Self::assemble), with the tuning already measured
    /// (`Some`) or still to be (`None`).
    fn assemble_tuned(
        instance: Option<wgpu::Instance>,
        devices: Vec<Arc<RankDevice>>,
        config: &WorldConfig,
        measured: Option<crate::api::tune::Measured>,
    ) -> Result<World> {
        // Ranks that share their device meet at a place their links carry.
        let n = config.ranks();
        let meets = Self::shares(config, &devices, n)?;
        let first = devices.first().ok_or_else(|| Error::InvalidArgument {
            rank: None,
            what: "a world needs at least one rank".into(),
        })?;
        // Measured where rank 0 runs: the planner decides from it (once:
        // choosing the placement may have measured it already).
        let (mut tuning, tuned) = match measured {
            Some(m) => m,
            None => {
                let tuning = config.tuning(first)?;
                let tuned =
                    crate::api::tune::table_for(config, &devices, meets, &tuning, &World::bench)?;
                (tuning, tuned)
            }
        };
        tuning.table = tuned.as_ref().map(|t| t.table.clone());
        if let Some(t) = &tuned {
            // Measured, not assumed from the adapter's type.
            tuning.figures.host_fold = t.table.host_fold;
            tuning.figures.units = t.table.units;
            if t.heals && n > 1 && !config.quiet && config.heals()? {
                let (key, path) = (t.key.clone(), t.path.clone());
                tuning.heal = Some(Arc::new(Heal::new(
                    t.table.clone(),
                    Box::new(move |table| {
                        if let Some(path) = &path {
                            cache::write(path, &table.to_text(&key), "the healed tuning table");
                        }
                    }),
                )));
            }
        }
        let links = mesh(n, meets);
        let mut world = Self::assemble_with(instance, devices, links, config, (0, n), tuning)?;
        world.tuned = tuned;
        Ok(world)
    }

    /// A world whose rank r talks through `links[r]` (the transport seam's tests).
    #[cfg(test)]
    fn assemble_on(
        instance: Option<wgpu::Instance>,
        devices: Vec<Arc<RankDevice>>,
        links: Vec<Arc<Link>>,
        config: &WorldConfig,
    ) -> Result<World> {
        let first = devices.first().ok_or_else(|| Error::InvalidArgument {
            rank: None,
            what: "a world needs at least one rank".into(),
        })?;
        // Measured where rank 0 runs: the planner decides from it.
        let tuning = config.tuning(first)?;
        let n = devices.len();
        Self::assemble_with(instance, devices, links, config, (0, n), tuning)
    }

    /// A world of `ranks.1` ranks of which these devices and links are
    /// ranks `ranks.0..`, with `tuning` agreed by all of them.
    /// Whether the `n` ranks meet on one device: when every rank shares
    /// it, unless the ranks are to model separate GPUs; a shared placement
    /// asked of ranks that do not share one is refused.
    fn shares(config: &WorldConfig, devices: &[Arc<RankDevice>], n: usize) -> Result<bool> {
        let asked = config.placement()?;
        let together = devices.len() == n
            && devices
                .first()
                .is_some_and(|first| devices.iter().all(|d| d.same_device(first)));
        if asked == Placement::SharedDevice && !together {
            return Err(Error::InvalidArgument {
                rank: None,
                what: format!(
                    "the shared placement was asked for (WorldConfig::with_placement or \
                     WGPU_COLLECTIVES_PLACEMENT=shared), but the {n} ranks do not all run on \
                     one device in this process ({} here, not all the same): give \
                     from_devices one device for every rank, or ask for another placement",
                    devices.len()
                ),
            });
        }
        Ok(n > 1 && asked != Placement::DevicePerRank && together)
    }

    /// What carries hops between this process's ranks on separate
    /// devices (`None` when they share one): mapped where every device
    /// imports host memory and staging was not asked for; forcing mapped
    /// where a device cannot is refused, naming the device and why.
    fn host_link_of(
        config: &WorldConfig,
        devices: &[Arc<RankDevice>],
        shared: bool,
    ) -> Result<Option<HostLink>> {
        if shared {
            return Ok(None);
        }
        let cannot = devices
            .iter()
            .find_map(|d| d.imports.as_ref().err().map(|why| (d.rank, why)));
        match (config.host_link()?, cannot) {
            (HostLink::Mapped, Some((rank, why))) => Err(Error::InvalidArgument {
                rank: Some(rank),
                what: format!(
                    "mapped host links were asked for (WorldConfig::with_host_link or \
                     WGPU_COLLECTIVES_HOST_LINK=mapped), but rank {rank}'s device cannot \
                     import host memory: {why}"
                ),
            }),
            (_, None) => Ok(Some(HostLink::Mapped)),
            (_, Some(_)) => Ok(Some(HostLink::Staging)),
        }
    }

    /// A world timing makes to time a plan (see `tune/timing.rs`'s
    /// `Benches`; what it runs is `api/timed.rs`'s).
    pub(crate) fn bench(
        devices: Vec<Arc<RankDevice>>,
        links: Vec<Arc<Link>>,
        config: &WorldConfig,
        ranks: (usize, usize),
        tuning: Tuning,
    ) -> Result<Box<dyn Bench>> {
        Ok(Box::new(World::assemble_with(
            None, devices, links, config, ranks, tuning,
        )?))
    }

    pub(crate) fn assemble_with(
        instance: Option<wgpu::Instance>,
        devices: Vec<Arc<RankDevice>>,
        links: Vec<Arc<Link>>,
        config: &WorldConfig,
        ranks: (usize, usize),
        tuning: Tuning,
    ) -> Result<World> {
        let (base, n) = ranks;
        if tuning.figures.units != 0 {
            // The kernel shape timed on rank 0's device, on every device.
            for d in &devices {
                d.kernels.set_units_per_invocation(tuning.figures.units);
            }
        }
        if links.len() != devices.len() || base.saturating_add(devices.len()) > n {
            return Err(Error::InvalidArgument {
                rank: None,
                what: format!(
                    "{} links for {} devices, ranks {base}.. of {n}",
                    links.len(),
                    devices.len()
                ),
            });
        }
        if devices.is_empty() {
            return Err(Error::InvalidArgument {
                rank: None,
                what: "a world needs at least one rank".into(),
            });
        }
        if !config.quiet {
            tracing::info!(
                ranks = n,
                algorithm = ?tuning.forced.algorithm,
                fence_us = tuning.figures.cost.alpha.as_secs_f64() * 1e6,
                hop_gbps = tuning.figures.cost.beta / 1e9,
                dispatch_us = tuning.figures.cost.dispatch.as_secs_f64() * 1e6,
                "world: cost model measured on rank 0's device"
            );
        }
        let shared = Self::shares(config, &devices, n)?;
        // The group meets where its links say: they carry the place.
        let group = links.first().and_then(|l| l.meeting());
        if shared != group.is_some() {
            return Err(Error::device(
                base,
                None,
                format!(
                    "internal: the {n} ranks {} one device, but their links {} a meeting place",
                    if shared { "share" } else { "do not share" },
                    if group.is_some() { "carry" } else { "carry no" }
                ),
            ));
        }
        let placement = if shared {
            Placement::SharedDevice
        } else {
            Placement::DevicePerRank
        };
        if tuning.forced.plan == Some(Plan::Direct) && !shared && n > 1 {
            return Err(Error::InvalidArgument {
                rank: None,
                what: format!(
                    "the plan direct was forced (WorldConfig::with_plan or \
                     WGPU_COLLECTIVES_PLAN=direct) with placement {}, but {}",
                    placement.name(),
                    crate::runtime::planner::apart(n)
                ),
            });
        }
        let host_link = Self::host_link_of(config, &devices, shared)?;
        for d in devices.iter().filter(|_| !config.quiet) {
            tracing::info!(
                rank = d.rank,
                adapter = %d.info.name,
                backend = ?d.info.backend,
                device = if d.adapter.is_some() { "made by the engine" } else { "the user's" },
                placement = placement.name(),
                transport = transport_name(placement, host_link),
                loans = d.unified,
                imports = ?d.imports,
                "world: rank device"
            );
        }
        // Which ranks of this process share a device (the rest live elsewhere).
        let keys = (0..n)
            .map(|r| {
                r.checked_sub(base)
                    .and_then(|i| devices.get(i))
                    .map(|d| d.key())
            })
            .collect();
        let health = Health::new(keys, config.flight_depth()?, config.flight_dump());
        let infos = devices.iter().map(|d| d.info.clone()).collect();
        let splits = Arc::new(Splits::default());
        let comms = links
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(i, (endpoint, dev))| {
                Communicator::new(
                    base.saturating_add(i),
                    n,
                    dev,
                    Reach {
                        endpoint,
                        splits: splits.clone(),
                    },
                    health.clone(),
                    config.timeout(),
                    tuning.clone(),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(World {
            placement,
            host_link,
            instance,
            comms,
            base,
            size: n,
            adapters: infos,
            health,
            tuning,
            tuned: None,
            running: AtomicBool::new(false),
            #[cfg(feature = "mpi")]
            hub: None,
            #[cfg(feature = "mpi")]
            group: 0,
        })
    }

    /// The wgpu instance the adapters came from, when [`World::new`] made
    /// the devices (`None` after [`World::from_devices`]): with
    /// [`Communicator::adapter`], `device()` and `queue()`, what a
    /// framework such as cubecl-wgpu needs to run on the same devices.
    pub fn instance(&self) -> Option<&wgpu::Instance> {
        self.instance.as_ref()
    }

    /// The placement in force, as [`WorldConfig::with_placement`] and the
    /// devices decided it: [`Placement::SharedDevice`] when every rank runs
    /// on one device and collectives run there without host copies, else
    /// [`Placement::DevicePerRank`].
    pub fn placement(&self) -> Placement {
        self.placement
    }

    /// What carries a collective's bytes between ranks, in words (the
    /// benchmark's header prints it).
    pub fn transport(&self) -> &'static str {
        #[cfg(feature = "mpi")]
        if self.hub.is_some() {
            return match self.host_link {
                None => "MPI between processes; a shared device within one",
                Some(HostLink::Mapped) => {
                    "MPI between processes; host memory both devices map within one"
                }
                Some(_) => "MPI between processes; in-process channels, host staging within one",
            };
        }
        transport_name(self.placement, self.host_link)
    }

    /// What carries this process's hops between ranks on separate devices:
    /// [`HostLink::Mapped`] (host memory both devices import) or
    /// [`HostLink::Staging`] (mapped staging buffers and host copies), as
    /// [`WorldConfig::with_host_link`] and the devices decided it; `None`
    /// where the ranks share one device and no hop crosses the host.
    pub fn host_link(&self) -> Option<HostLink> {
        self.host_link
    }

    /// Number of ranks (in every process, for a world over MPI).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Processes in the job, and ranks in this one: `(1, size)` for a
    /// world of one process.
    pub fn processes(&self) -> (usize, usize) {
        #[cfg(feature = "mpi")]
        if let Some(h) = &self.hub {
            return (h.processes, self.comms.len());
        }
        (1, self.comms.len())
    }

    /// The ranks that run in this process: all of them, except in a world
    /// over several processes (`World::from_mpi`, feature `mpi`).
    pub fn local_ranks(&self) -> std::ops::Range<usize> {
        self.base..self.base.saturating_add(self.comms.len())
    }

    /// The all-reduce algorithm in force: forced by `WorldConfig` or
    /// `WGPU_COLLECTIVES_ALGO`, else `Auto` (the cost model picks).
    pub fn algorithm(&self) -> Algorithm {
        self.tuning.forced.algorithm
    }

    /// The plan forced by `WorldConfig::with_plan` or
    /// `WGPU_COLLECTIVES_PLAN`, if any (else the planner chooses per call;
    /// [`Work::plan`](crate::Work::plan) says what it chose).
    pub fn plan(&self) -> Option<Plan> {
        self.tuning.forced.plan
    }

    /// The tuning table the planner chooses from, as its cache file holds
    /// it (each timed kind and plan, with its fixed and per-byte cost in
    /// seconds), when the world was tuned ([`WorldConfig::with_tune`]).
    pub fn tuning_table(&self) -> Option<&str> {
        self.tuned.as_ref().map(|t| t.text.as_str())
    }

    /// The file the tuning table was read from or cached in, if any.
    pub fn tuning_cache(&self) -> Option<&std::path::Path> {
        self.tuned.as_ref().and_then(|t| t.path.as_deref())
    }

    /// The cost model collectives are priced by (the graph layer's
    /// schedules): in a tuned world, the hop model fitted to the fastest
    /// plan's all-reduce at every size timed on its devices; otherwise the
    /// hop model measured on rank 0's adapter ([`hop_cost_model`](Self::hop_cost_model)).
    pub fn cost_model(&self) -> CostModel {
        self.tuned
            .as_ref()
            .and_then(|t| {
                t.table
                    .all_reduce_model(self.size(), self.tuning.figures.cost)
            })
            .unwrap_or(self.tuning.figures.cost)
    }

    /// The hop model measured on rank 0's adapter when the world was made
    /// (a fence round trip, a copy through the host): what the planner's
    /// rules price with when the world is not tuned.
    pub fn hop_cost_model(&self) -> CostModel {
        self.tuning.figures.cost
    }

    /// The adapter each rank of this process runs on, in rank order (every
    /// rank's, except in a world over several processes).
    pub fn adapters(&self) -> &[wgpu::AdapterInfo] {
        &self.adapters
    }

    /// Runs `f` on every rank at once, one thread per rank, and returns the
    /// results in rank order (in a world over several processes, those of
    /// this process's ranks, [`World::local_ranks`]).
    ///
    /// If a rank panics, the other ranks' pending and later collectives
    /// fail with [`Error::PeerFailed`] instead of hanging, and `run` returns
    /// [`Error::RankPanicked`] for the lowest such rank. The world can run
    /// again afterwards.
    ///
    /// One run at a time: a run starts every rank's sequence numbers at 0,
    /// so two runs at once would pair each other's collectives. A `run`
    /// called while another is in progress (from another thread) returns
    /// [`Error::InvalidArgument`] at once and touches nothing.
    ///
    /// After the run, the communicators serve the user's own threads
    /// ([`World::communicator`]) as they did before it: a rank that is late
    /// there is waited for, up to the timeout, as in a run.
    pub fn run<T, F>(&self, f: F) -> Result<Vec<T>>
    where
        T: Send,
        F: Fn(&Communicator) -> T + Sync,
    {
        let units = std::iter::repeat_with(|| ())
            .take(self.comms.len())
            .collect();
        self.run_with(units, |c, ()| f(c))
    }

    /// Like [`run`](Self::run), moving `states[r]` into rank r's closure:
    /// per-rank state that is `Send` but not `Sync` or `Clone` (a model
    /// replica, a channel end, a data loader). `states` must have one entry
    /// per rank, else [`Error::InvalidArgument`].
    pub fn run_with<S, T, F>(&self, states: Vec<S>, f: F) -> Result<Vec<T>>
    where
        S: Send,
        T: Send,
        F: Fn(&Communicator, S) -> T + Sync,
    {
        if states.len() != self.comms.len() {
            return Err(Error::InvalidArgument {
                rank: None,
                what: format!(
                    "run_with got {} states for {} ranks in this process",
                    states.len(),
                    self.comms.len()
                ),
            });
        }
        if self
            .running
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(Error::InvalidArgument {
                rank: None,
                what: "World::run called while another run of this world is in progress: \
                       two runs at once would pair each other's collectives"
                    .into(),
            });
        }
        let _guard = RunGuard {
            running: &self.running,
            comms: &self.comms,
            health: &self.health,
        };
        for c in &self.comms {
            c.enter_run();
        }
        for c in &self.comms {
            c.reset()?;
        }
        self.health.reset();
        if let Some(heal) = &self.tuning.heal {
            heal.new_run();
        }
        let f = &f;
        let outcomes: Vec<std::thread::Result<T>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .comms
                .iter()
                .zip(states)
                .map(|(c, state)| {
                    std::thread::Builder::new()
                        .name(format!("rank-{}", c.rank()))
                        .spawn_scoped(s, move || {
                            c.bind_run_thread();
                            keep_unwound_links();
                            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                                f(c, state)
                            }));
                            if let Err(p) = &r {
                                c.fail_group(Error::RankPanicked {
                                    rank: c.rank(),
                                    message: panic_message(p),
                                });
                            }
                            release_unwound_links();
                            c.depart();
                            r
                        })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h.join().and_then(|r| r),
                    Err(e) => Err(Box::new(format!("could not spawn the rank's thread: {e}")) as _),
                })
                .collect()
        });
        let mut results = Vec::with_capacity(outcomes.len());
        for (i, o) in outcomes.into_iter().enumerate() {
            match o {
                Ok(v) => results.push(v),
                Err(p) => {
                    return Err(Error::RankPanicked {
                        rank: self.base.saturating_add(i),
                        message: panic_message(&p),
                    });
                }
            }
        }
        Ok(results)
    }

    /// What every rank of the world last did: its recent collectives with
    /// their states and times (see [`FlightRecord`]; `Display` and
    /// `to_json` for people and tools).
    pub fn flight_record(&self) -> FlightRecord {
        self.health.flight_record()
    }

    /// Rank `r`'s communicator over the whole world, for use outside `run`
    /// (`None` for a rank of another process).
    pub fn communicator(&self, rank: usize) -> Option<&Communicator> {
        self.comms.get(rank.checked_sub(self.base)?)
    }
}

/// What every world needs of its config: a rank count in range and a timeout.
fn transport_name(placement: Placement, link: Option<HostLink>) -> &'static str {
    match (placement, link) {
        (Placement::SharedDevice, _) => "shared device (kernels read peers' buffers, no host copy)",
        (_, Some(HostLink::Mapped)) => "in-process channels, host memory both devices map",
        _ => "in-process channels, host staging",
    }
}

#[cfg(test)]
mod decisions;

#[cfg(test)]
#[allow(
    clippy::expect_used,
    clippy::arithmetic_side_effects,
    reason = "a test: a failed expectation is a failed test, and its sizes are small"
)]
mod tests {
    //! The transport seam: the schedules run unchanged over a backend that
    //! cannot lend buffers (as one between processes could not), and give
    //! the same bits as over the in-process one.
    use super::*;
    use crate::ReduceOp;
    use crate::device::{Import, Wants};
    use crate::runtime::hop::Packet;
    use crate::transport::{Lane, Transport};
    use std::time::Duration;

    /// The in-process links, as a backend without loans: every hop's bytes
    /// travel in the packet.
    struct NoLoans(Arc<Link>);

    impl Transport<crate::runtime::fingerprint::Fingerprint> for NoLoans {
        fn send(
            &self,
            peer: usize,
            lane: Lane,
            p: Packet,
        ) -> std::result::Result<(), crate::transport::Closed> {
            self.0.send(peer, lane, p)
        }
        fn recv(
            &self,
            peer: usize,
            lane: Lane,
            limit: Duration,
        ) -> std::result::Result<Option<Packet>, crate::transport::Closed> {
            self.0.recv(peer, lane, limit)
        }
        fn wake(&self) -> &Arc<crate::transport::Wake> {
            self.0.wake()
        }
        fn meeting(&self) -> Option<Arc<crate::runtime::shared::Group>> {
            self.0.meeting()
        }
        fn carries_loans(&self, _peer: usize) -> bool {
            false
        }
        fn split(&self, seq: u64, color: u32, members: &[usize]) -> Vec<Option<Arc<Link>>> {
            self.0.split(seq, color, members)
        }
        fn drain(&self) {
            self.0.drain();
        }
        fn buffer(&self) -> Vec<u8> {
            self.0.buffer()
        }
        fn recycle(&self, bytes: Vec<u8>) {
            self.0.recycle(bytes);
        }
    }

    fn world(n: usize, loans: bool) -> World {
        let config = WorldConfig::new(n);
        let (instance, adapters) = find_adapters(&config).expect("an adapter");
        let wants = Wants {
            features: wgpu::Features::empty(),
            limits: None,
            import: Import::IfAble,
        };
        let devices = (0..n)
            .map(|r| RankDevice::new(r, &adapters[r % adapters.len()], config.timeout(), &wants))
            .collect::<Result<Vec<_>>>()
            .expect("devices");
        // A device per rank: no meeting.
        let links = mesh(n, false)
            .into_iter()
            .map(|l| {
                if loans {
                    l
                } else {
                    Arc::new(NoLoans(l)) as Arc<Link>
                }
            })
            .collect();
        World::assemble_on(Some(instance), devices, links, &config).expect("a world")
    }

    #[test]
    fn schedules_give_the_same_bits_over_either_backend() {
        let len = 300_001; // several slices, an odd tail
        let run = |w: &World| {
            w.run(|c| -> Result<Vec<Vec<f32>>> {
                let x: Vec<f32> = (0..len)
                    .map(|i| ((i * 7 + c.rank() * 13) % 101) as f32 * 0.37)
                    .collect();
                let t = c.tensor(&x)?;
                Ok(vec![
                    c.all_reduce(&t, ReduceOp::Sum)?.wait()?.to_vec()?,
                    c.all_gather(&t)?.wait()?.to_vec()?,
                    c.broadcast(&t, 1)?.wait()?.to_vec()?,
                ])
            })
            .expect("the run")
        };
        let (lent, copied) = (run(&world(3, true)), run(&world(3, false)));
        for (r, (a, b)) in lent.into_iter().zip(copied).enumerate() {
            let (a, b) = (a.expect("over loans"), b.expect("over copies"));
            for (k, (x, y)) in a.iter().zip(&b).enumerate() {
                let same =
                    x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "rank {r}, collective {k}: the backends disagree");
            }
            // And against a reference where order cannot matter: the gather.
            let want: Vec<f32> = (0..3)
                .flat_map(|q| (0..len).map(move |i| ((i * 7 + q * 13) % 101) as f32 * 0.37))
                .collect();
            assert_eq!(b[1], want, "rank {r}: all_gather over copies");
        }
    }
}
