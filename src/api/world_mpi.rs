//! A world over several processes (feature `mpi`): each process holds
//! some of the ranks, MPI carries the bytes between processes.
//!
//! The processes agree on everything a decision depends on before any
//! rank runs: how many ranks each holds, the algorithm forced, the
//! timeout, and the cost model (process 0's measurement, for all). A job
//! whose processes disagree fails on every process with what each said,
//! instead of pairing the wrong collectives or hanging.
//!
//! A failure recorded in one process is passed on to the others, so that
//! their ranks fail at once as ranks of one process do. A process
//! that dies cannot say so: its peers' waits end at their deadline, naming
//! the rank they were waiting for.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crossbeam::channel::RecvTimeoutError;

use crate::algo::direct::Steps;
use crate::api::bootstrap::{check, devices_on, find_adapters};
use crate::api::config::{MAX_RANKS, Placement, Tune, WorldConfig};
use crate::api::tune::{self, Over, Tuned};
use crate::api::world::World;
use crate::device::lock;
use crate::error::{Error, Result};
use crate::runtime::cost::Algorithm;
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::fold_order::FoldOrder;
use crate::runtime::heal::Heal;
use crate::runtime::heal::span::{OverMpi, Span};
use crate::runtime::health::Health;
use crate::runtime::hop::Link;
use crate::runtime::plan::Plan;
use crate::runtime::planner::Figures;
use crate::runtime::tune::Table;
use crate::runtime::two_level::Tier;
use crate::transport::mpi::hub::{Hub, Notice, Route, Start};
use crate::transport::mpi::{Layout, ends, split_id};

#[cfg(test)]
mod junk;

/// MPI is initialised once per process and finalised when the last world
/// over it is dropped; it cannot be initialised again after that.
enum Slot {
    Never,
    Live(Weak<Hub>),
    Finished,
}

static HUB: Mutex<Slot> = Mutex::new(Slot::Never);

fn hub() -> Result<Arc<Hub>> {
    let mut slot = lock(&HUB);
    match &*slot {
        Slot::Live(w) => {
            if let Some(h) = w.upgrade() {
                return Ok(h);
            }
        }
        Slot::Finished => {}
        Slot::Never => {
            let h = Arc::new(Hub::start(Start::Init).map_err(|what| Error::Transport {
                process: None,
                what,
            })?);
            *slot = Slot::Live(Arc::downgrade(&h));
            return Ok(h);
        }
    }
    *slot = Slot::Finished;
    Err(Error::Transport {
        process: None,
        what: "MPI was finalised when this process's last world over it was dropped, \
               and cannot start again: keep one world for the whole job"
            .into(),
    })
}

impl World {
    /// A world over the processes of an MPI job (`mpirun -n P prog`): each
    /// process holds `config.ranks()` ranks, so the world has P times as
    /// many, and rank `p * config.ranks() + l` is local rank `l` of process
    /// `p`. [`Communicator::rank`](crate::Communicator::rank) and
    /// [`World::size`] are global; [`World::run`] runs this process's
    /// ranks ([`World::local_ranks`]) and returns their results. The same
    /// SPMD code runs unchanged.
    ///
    /// Within a process each rank gets a device of its own (spread over the
    /// adapters as [`World::new`] does) and hops between them go through
    /// host staging; hops between processes are MPI messages, sent and
    /// received by one thread per process. Every collective keeps the bits
    /// it has in one process (the fold order is fixed by the rank count,
    /// not by where ranks live).
    ///
    /// Every process must call it with the same rank count, algorithm and
    /// timeout, and must make its worlds in the same order; otherwise each
    /// gets [`Error::Transport`] naming what every process said. MPI is
    /// initialised by the first call (`MPI_THREAD_FUNNELED`, on a thread of
    /// the engine's) and finalised when the process's last such world is
    /// dropped, or left unfinalised after a failure, so that a dead peer
    /// cannot hold the exit. The engine's messages go on a duplicate of
    /// `MPI_COMM_WORLD`. In a program that initialises MPI itself, use
    /// [`from_mpi_comm`](Self::from_mpi_comm).
    pub fn from_mpi(config: WorldConfig) -> Result<World> {
        check(&config)?;
        World::over_hub(hub()?, config)
    }

    /// A world over the processes of `comm`, a communicator of an MPI the
    /// application initialised itself, as NCCL and `torch.distributed`
    /// are used inside MPI programs: process `p` of `comm` holds ranks
    /// `p * config.ranks()` on, as in [`from_mpi`](Self::from_mpi). Every
    /// process of `comm` must call it (it duplicates `comm`, a collective
    /// call), and the engine's messages go on that duplicate only, so the
    /// application's own, whatever their tags, never meet them. The
    /// engine's thread calls MPI beside the application's threads, so MPI
    /// must have been initialised with `MPI_THREAD_MULTIPLE` (else
    /// [`Error::Transport`] says so). MPI stays the application's: the
    /// world frees its duplicate when dropped and never finalises.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use mpi::traits::*;
    /// use wgpu_collectives::{ReduceOp, World, WorldConfig};
    ///
    /// let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Multiple)
    ///     .ok_or("MPI was initialised already")?;
    /// let comm = universe.world();
    /// let world = World::from_mpi_comm(&comm, WorldConfig::new(2))?;
    /// let sums = world.run(|c| {
    ///     let x = c.tensor(&[c.rank() as f32; 4])?;
    ///     c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
    /// })?;
    /// // The application's own MPI, beside the engine's.
    /// let mut ranks = 0i32;
    /// comm.all_reduce_into(
    ///     &(sums.len() as i32),
    ///     &mut ranks,
    ///     mpi::collective::SystemOperation::sum(),
    /// );
    /// assert_eq!(ranks as usize, world.size());
    /// # Ok(()) }
    /// ```
    pub fn from_mpi_comm(
        comm: &impl mpi::raw::AsRaw<Raw = mpi::ffi::MPI_Comm>,
        config: WorldConfig,
    ) -> Result<World> {
        check(&config)?;
        let transport = |what: String| Error::Transport {
            process: None,
            what,
        };
        if !mpi::environment::is_initialized() {
            return Err(transport(
                "World::from_mpi_comm: MPI is not initialised; initialise it with \
                 MPI_THREAD_MULTIPLE first, or let World::from_mpi initialise it"
                    .into(),
            ));
        }
        let level = mpi::environment::threading_support();
        if level != mpi::Threading::Multiple {
            return Err(transport(format!(
                "World::from_mpi_comm: MPI was initialised with {level:?}, but the engine's \
                 MPI thread calls MPI beside the application's threads: initialise it with \
                 MPI_THREAD_MULTIPLE (mpi::initialize_with_threading(Threading::Multiple))"
            )));
        }
        let dup = crate::transport::mpi::raw::duplicate(comm)
            .map_err(|c| transport(format!("MPI_Comm_dup failed (code {})", c.0)))?;
        let hub = Hub::start(Start::Given(dup)).map_err(transport)?;
        World::over_hub(Arc::new(hub), config)
    }

    /// A world over `hub`'s processes, as `config` asks.
    fn over_hub(hub: Arc<Hub>, config: WorldConfig) -> Result<World> {
        let (process, processes) = (hub.process, hub.processes);
        let local = config.ranks();
        // No frame longer than this process's devices' largest buffer is
        // taken from the wire (set before any process can send one: they
        // all meet below first).
        let (_instance, adapters) = find_adapters(&config)?;
        hub.allow(
            adapters
                .iter()
                .map(|a| a.limits().max_buffer_size)
                .max()
                .unwrap_or(0),
        );
        let number = hub.worlds.fetch_add(1, Ordering::Relaxed);
        let algorithm = config.algorithm()?;
        let plan = config.plan()?;
        let timeout_ms = u64::try_from(config.timeout().as_millis()).unwrap_or(u64::MAX);
        let mode = config.tune()?;
        let modes = [Tune::Off, Tune::Cached, Tune::Measure];
        // A table given by the user, by a hash of its text (0: none).
        let gift = config
            .tune_table()
            .map_or(0, |t| crate::hash::fnv1a(t.bytes().map(u64::from)).max(1));
        let mine = vec![
            local as u64,
            number,
            algorithm as u64,
            timeout_ms,
            Plan::code(plan),
            modes.iter().position(|&m| m == mode).unwrap_or(0) as u64,
            gift,
            u64::from(config.heals()?),
            u64::from(config.fold_order()? == FoldOrder::Fastest),
        ];
        let said = hub
            .all_gather(mine.clone(), config.timeout())
            .map_err(|what| Error::Transport {
                process: Some(process),
                what,
            })?;
        if said.chunks(mine.len()).any(|s| s != mine.as_slice()) {
            let views: Vec<String> = said
                .chunks(mine.len())
                .enumerate()
                .map(|(process, s)| match s {
                    [l, n, a, t, p, m, g, h, f] => {
                        let a = [
                            Algorithm::Auto,
                            Algorithm::Ring,
                            Algorithm::OneShot,
                            Algorithm::Direct,
                        ]
                        .into_iter()
                        .find(|&x| x as u64 == *a)
                        .map_or("?", Algorithm::name);
                        let plan = Plan::from_code(*p).map_or("none", Plan::name);
                        let mode = usize::try_from(*m)
                            .ok()
                            .and_then(|m| modes.get(m))
                            .map_or("?", |m| m.name());
                        let table = if *g == 0 {
                            "none".to_string()
                        } else {
                            format!("{g:016x}")
                        };
                        let heal = if *h == 0 { "off" } else { "on" };
                        let fold = if *f == 0 {
                            FoldOrder::Canonical
                        } else {
                            FoldOrder::Fastest
                        };
                        format!(
                            "process {process}: {l} ranks, world #{n}, algorithm {a}, plan {plan}, \
                             timeout {t} ms, WGPU_COLLECTIVES_TUNE={mode}, table given by \
                             with_tune_table {table}, WGPU_COLLECTIVES_HEAL={heal}, \
                             WGPU_COLLECTIVES_FOLD_ORDER={}",
                            fold.name()
                        )
                    }
                    _ => format!("process {process}: ?"),
                })
                .collect();
            return Err(Error::Transport {
                process: Some(process),
                what: format!(
                    "the processes disagree on the world they make: {}",
                    views.join("; ")
                ),
            });
        }
        let total = local.saturating_mul(processes);
        if total > MAX_RANKS {
            return Err(Error::InvalidArgument {
                rank: None,
                what: format!(
                    "{processes} processes x {local} ranks = {total}: a world has at most {MAX_RANKS}"
                ),
            });
        }
        let base = process.saturating_mul(local);

        // Ranks of this process on one adapter share its device (one
        // owner, one queue), unless the placement asks for a device each
        // (then hops between them go through the host).
        let ranks = base..base.saturating_add(local);
        let devices = devices_on(&adapters, ranks, config.placement()?, &config)?;
        let first = devices.first().ok_or_else(|| Error::InvalidArgument {
            rank: None,
            what: "a world needs at least one rank".into(),
        })?;
        // Decisions must match across processes: process 0's figures
        // (its cost model, and whether the host folds its adapter's bits).
        let mut measured = config.tuning(first)?;
        let tunes = (mode != Tune::Off || gift != 0)
            && total >= 2
            && measured.forced.plan.is_none()
            && measured.forced.algorithm == Algorithm::Auto;
        if tunes && gift == 0 {
            measured = tune::agreed(first, total, &measured)?;
        }
        let figures = hub
            .all_gather(measured.figures.to_words(), config.timeout())
            .map_err(|what| Error::Transport {
                process: Some(process),
                what,
            })?;
        let mut tuning = measured;
        if let Some(f) = Figures::from_words(&figures) {
            tuning.figures = f;
        }

        let process_of: Vec<usize> = (0..total)
            .map(|r| r.checked_div(local).unwrap_or(0))
            .collect();
        // A split of this process's ranks alone meets on their device
        // when they share one: its collectives run the shared device's
        // kernels (the part of a two-level schedule inside a process); in
        // the world's own group, hops between them are device copies.
        let one_device = devices
            .first()
            .is_some_and(|first| devices.iter().all(|d| d.same_device(first)));
        let splits_meet = one_device;
        // Two-level plans run where every process's ranks share one
        // device whose kernels can bind them all: agreed, as every
        // process must offer the planner the same plans.
        let can = one_device && Steps::can_reduce(first, local);
        let tiered = local >= 2
            && processes >= 2
            && hub
                .all_gather(vec![u64::from(can)], config.timeout())
                .map_err(|what| Error::Transport {
                    process: Some(process),
                    what,
                })?
                .iter()
                .all(|&c| c == 1);
        let tier = |host_fold: bool| {
            tiered.then(|| Arc::new(Tier::new(base, local, processes, host_fold)))
        };
        tuning.tier = tier(tuning.figures.host_fold);
        let place = Place {
            hub: &hub,
            number,
            process_of: &process_of,
            local: (base, local),
            splits_meet,
        };
        // Process 0's table for every process: cached, or timed on the
        // world's own devices and links by all of them at once.
        let tuned = if tunes {
            Some(tuned_over(&place, &config, &devices, &tuning)?)
        } else {
            None
        };
        tuning.table = tuned.as_ref().map(|t| t.table.clone());
        if let Some(t) = &tuned {
            tuning.figures.units = t.table.units;
            if !t.heals {
                // A given table lets the host ring run only where it says
                // the host folded its own machine's bits too.
                tuning.figures.host_fold &= t.table.host_fold;
            }
        }
        // The exchange between processes folds on the host as the final
        // tuning says (a given table may have turned the host ring off).
        tuning.tier = tier(tuning.figures.host_fold);
        let group = split_id(u64::MAX, number, u32::MAX);
        if let Some(t) = tuned.as_ref().filter(|t| t.heals) {
            // Every process decides alike whether it heals: the table, the
            // tune mode and the healing were agreed above.
            if config.heals()? {
                tuning.heal = Some(heal_over(&hub, group, (process, processes), local, t));
            }
        }
        let layout = Layout {
            group,
            process_of: process_of.clone(),
            meet: false,
            splits_meet,
        };
        let links: Vec<Arc<Link>> = ends::<Fingerprint>(&hub, layout)
            .into_iter()
            .skip(base)
            .take(local)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::Transport {
                process: Some(process),
                what: "a rank of this process has no link".into(),
            })?;
        let config = config.with_placement(Placement::DevicePerRank);
        let heal = tuning.heal.clone();
        let mut world = World::assemble_with(None, devices, links, &config, (base, total), tuning)?;
        world.tuned = tuned;
        pass_failures_on(&hub, group, local, &world.health, heal);
        // A process that dies says nothing: the others notice its silence
        // within half the timeout, before their own waits run out.
        hub.watch(config.timeout().checked_div(2).unwrap_or_default());
        world.hub = Some(hub);
        world.group = group;
        tracing::info!(
            process,
            processes,
            local,
            total,
            "world over MPI: ranks {base}..{}",
            base.saturating_add(local)
        );
        Ok(world)
    }
}

/// Failures recorded in this process go to the others, and theirs come
/// here, for the world's group. A failure belongs to its run: one from a
/// run this process has not started yet waits for it (a process may run
/// ahead into the next run and fail there), one from a run it has left is
/// stale. A process found silent (dead, or hung) fails every run from
/// then on, naming its ranks.
fn pass_failures_on(
    hub: &Arc<Hub>,
    group: u64,
    local: usize,
    health: &Arc<Health>,
    heal: Option<Arc<Heal>>,
) {
    let out = hub.clone();
    health.announce_to(Box::new(move |run, origin, error| {
        let origin = u32::try_from(origin).unwrap_or(u32::MAX);
        out.notify(group, run, origin, &error.to_string());
    }));
    let away = hub.clone();
    health.depart_to(Box::new(move |run, rank| {
        away.depart(group, run, u32::try_from(rank).unwrap_or(u32::MAX));
    }));
    let (tx, rx) = crossbeam::channel::unbounded::<Notice>();
    hub.on_notice(group, tx);
    let process = hub.process;
    let health = Arc::downgrade(health);
    let spawned = std::thread::Builder::new()
        .name("mpi-notices".into())
        .spawn(move || {
            let mut later: Vec<(Route, String)> = Vec::new();
            // Ranks of other processes that returned, in a run.
            let mut departed: Vec<Route> = Vec::new();
            let mut dead: Vec<(usize, Error)> = Vec::new();
            loop {
                // Ends when the hub, and with it the sender, is gone. With
                // nothing held for a later run it wakes only for notices.
                let idle = later.is_empty() && dead.is_empty() && departed.is_empty();
                match rx.recv_timeout(Duration::from_millis(if idle { 1000 } else { 5 })) {
                    Ok(Notice::Failed(route, text)) => later.push((route, text)),
                    Ok(Notice::Gone(route)) => departed.push(route),
                    Ok(Notice::Note(words)) => {
                        if let Some(heal) = &heal {
                            heal.receive(&words);
                        }
                    }
                    Ok(Notice::Silent { process, quiet }) => {
                        let first = process.saturating_mul(local);
                        let last = first.saturating_add(local.saturating_sub(1));
                        let reason = format!(
                            "process {process} (ranks {first} to {last}) has sent nothing, not \
                             even its heartbeat, for {quiet:.1?}: it died or hangs"
                        );
                        dead.push((
                            first,
                            Error::PeerFailed {
                                rank: first,
                                seq: 0,
                                doing: String::new(),
                                peer: first,
                                reason,
                                flight: String::new(),
                            },
                        ));
                    }
                    Ok(Notice::Refused {
                        process: from,
                        what,
                    }) => {
                        let first = from.saturating_mul(local);
                        let last = first.saturating_add(local.saturating_sub(1));
                        dead.push((
                            first,
                            Error::Transport {
                                process: Some(process),
                                what: format!(
                                    "process {from} (ranks {first} to {last}) sent what no \
                                     engine sends, so nothing more from it is taken: {what}"
                                ),
                            },
                        ));
                    }
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
                let Some(h) = health.upgrade() else { return };
                let now = h.runs();
                // A departure belongs to its run: one from a run not
                // started here yet waits for it, one from a run left is stale.
                departed.retain(|route| route.epoch >= now);
                for route in departed.iter().filter(|r| r.epoch == now) {
                    h.gone_elsewhere(now, usize::try_from(route.from).unwrap_or(usize::MAX));
                }
                departed.retain(|route| route.epoch != now);
                later.retain(|(route, _)| route.epoch >= now);
                let (due, rest) = std::mem::take(&mut later)
                    .into_iter()
                    .partition::<Vec<_>, _>(|(route, _)| route.epoch == now);
                later = rest;
                let due = due
                    .into_iter()
                    .map(|(route, text)| (usize::try_from(route.from).unwrap_or(usize::MAX), text));
                let due = due.map(|(origin, reason)| {
                    (
                        origin,
                        Error::PeerFailed {
                            rank: origin,
                            seq: 0,
                            doing: String::new(),
                            peer: origin,
                            reason,
                            flight: String::new(),
                        },
                    )
                });
                // A dead or refused process fails every run, this one and
                // every later one (from its start: `Health::reset`).
                for (origin, error) in due {
                    h.fail_elsewhere(Some(now), origin, error);
                }
                for (origin, error) in dead.drain(..) {
                    h.fail_for_good(origin, error);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no thread for failures from other processes: they will be seen at deadlines");
    }
}

/// The healing of the world `group`'s table `t` (`runtime/heal.rs`),
/// reaching its other processes through `hub`: this is `process` of
/// `processes`, with `local` ranks. Only process 0 rewrites the cache.
fn heal_over(
    hub: &Arc<Hub>,
    group: u64,
    (process, processes): (usize, usize),
    local: usize,
    t: &Tuned,
) -> Arc<Heal> {
    let (key, path) = (t.key.clone(), t.path.clone().filter(|_| process == 0));
    let span = Span {
        local,
        processes,
        decides: process == 0,
        relay: Arc::new(OverMpi {
            hub: Arc::downgrade(hub),
            group,
        }),
    };
    Arc::new(Heal::across(
        t.table.clone(),
        Box::new(move |table| {
            if let Some(path) = &path {
                tune::cache::write(path, &table.to_text(&key), "the healed tuning table");
            }
        }),
        span,
    ))
}

/// Where a world over MPI lives: the hub, its number, which process
/// holds each rank, and this process's (first rank, rank count).
struct Place<'a> {
    hub: &'a Arc<Hub>,
    number: u64,
    process_of: &'a [usize],
    local: (usize, usize),
    /// Whether splits of this process's ranks meet: where they share
    /// one device (and hop between each other by device copies).
    splits_meet: bool,
}

/// The tuning table every process of the world uses: process 0's cached
/// one, or one timed by every process together over links of the world's
/// own kind (each plan's world a group of its own), every timing agreed
/// (the slowest process's) so that every process times the same calls;
/// process 0's text is then every process's, and process 0 caches it.
fn tuned_over(
    place: &Place<'_>,
    config: &WorldConfig,
    devices: &[Arc<crate::device::RankDevice>],
    tuning: &crate::runtime::planner::Tuning,
) -> Result<Tuned> {
    let hub = place.hub;
    let process = hub.process;
    let total = place.process_of.len();
    let limit = config.timeout();
    let transport = |what: String| Error::Transport {
        process: Some(process),
        what,
    };
    if let Some(given) = tune::given(config)? {
        // The same text on every process: the world agreed on its hash.
        return Ok(given);
    }
    // Ranks sharing a device hop by device copies, ranks on a device each
    // through the host: tables of the one are not the other's.
    let shared = if place.splits_meet {
        " on one device"
    } else {
        ""
    };
    let layout = format!("{} processes x {}{shared}", hub.processes, place.local.1);
    let key = tune::cache::key(devices, total, false, &layout);
    let cached = (process == 0 && config.tune()? == Tune::Cached)
        .then(|| tune::cache::read(config, &key))
        .flatten();
    let start = std::time::Instant::now();
    // Where process 0's table is kept: read from, or written to.
    let mut path = cached.as_ref().map(|t| t.2.clone());
    let text = match share_text(hub, cached.as_ref().map(|t| t.1.as_str()), limit)
        .map_err(transport)?
    {
        Some(text) => text,
        None => {
            let (base, local) = place.local;
            let links = |i: usize| -> Result<Vec<Arc<Link>>> {
                let layout = Layout {
                    group: split_id(u64::MAX - 1, place.number, u32::try_from(i).unwrap_or(0)),
                    process_of: place.process_of.to_vec(),
                    meet: false,
                    splits_meet: place.splits_meet,
                };
                ends::<Fingerprint>(hub, layout)
                    .into_iter()
                    .skip(base)
                    .take(local)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| transport("a rank of this process has no link".into()))
            };
            // Each figure the largest any process measured.
            let agree = |v: &[f64]| -> Result<Vec<f64>> {
                let all = hub
                    .all_gather(v.iter().map(|x| x.to_bits()).collect(), limit)
                    .map_err(transport)?;
                // Times are not negative: their bits order as they do.
                Ok((0..v.len())
                    .map(|i| {
                        let bits = all.iter().skip(i).step_by(v.len().max(1)).copied();
                        f64::from_bits(bits.max().unwrap_or(0))
                    })
                    .collect())
            };
            let gather = |v: &[u64]| -> Result<Vec<u64>> {
                hub.all_gather(v.to_vec(), limit).map_err(transport)
            };
            let over = Over {
                ranks: (base, total),
                links: &links,
                agree: &agree,
                gather: &gather,
                benches: &World::bench,
            };
            let timed = tune::measure_over(config, devices, false, tuning, &tune::KINDS, &over)?;
            // Every process knows the load (it was agreed); process 0's
            // limit decides, as its text is every process's.
            let most = config.busy_limit()?;
            let busy = timed.others > most;
            let mine = if busy {
                tune::refused(key.clone(), false, tuning, timed.others, most).text
            } else {
                tune::table_of(false, &timed.series, tuning).to_text(&key)
            };
            let text = share_text(hub, (process == 0).then_some(mine.as_str()), limit)
                .map_err(transport)?
                .ok_or_else(|| transport("process 0 sent no tuning table".into()))?;
            tracing::info!(
                ms = start.elapsed().as_secs_f64() * 1e3,
                "world over MPI: plans timed by every process together"
            );
            if process == 0 && !busy {
                // Only process 0 keeps a cache.
                path = config
                    .tune_cache()
                    .map(|d| d.join(tune::cache::file_name(&key)))
                    .filter(|p| tune::cache::write(p, &text, "the tuning table"));
            }
            text
        }
    };
    let table = Table::from_text(&text, None)
        .map_err(|why| transport(format!("process 0's tuning table: {why}")))?;
    Ok(Tuned {
        table: Arc::new(table),
        path,
        key: Table::key_of(&text).unwrap_or_default().to_string(),
        // A table timed on a busy machine decides nothing: nothing to heal.
        heals: !text.starts_with(tune::REFUSED),
        text,
    })
}

/// Process 0's `text` (the others pass `None`), on every process; `None`
/// when process 0 has none.
fn share_text(
    hub: &Hub,
    text: Option<&str>,
    limit: Duration,
) -> std::result::Result<Option<String>, String> {
    let len = text.map_or(0, |t| (t.len() as u64).saturating_add(1));
    let lens = hub.all_gather(vec![len], limit)?;
    let Some(bytes) = lens
        .first()
        .and_then(|l| l.checked_sub(1))
        .and_then(|b| usize::try_from(b).ok())
    else {
        return Ok(None);
    };
    let words = bytes.div_ceil(8);
    let mut mine = vec![0u64; words];
    if let Some(t) = text.filter(|t| t.len() == bytes) {
        for (w, chunk) in mine.iter_mut().zip(t.as_bytes().chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
    }
    let all = hub.all_gather(mine, limit)?;
    let first: Vec<u8> = all
        .iter()
        .take(words)
        .flat_map(|w| w.to_le_bytes())
        .take(bytes)
        .collect();
    String::from_utf8(first)
        .map(Some)
        .map_err(|_| "process 0's tuning table is not text".into())
}
