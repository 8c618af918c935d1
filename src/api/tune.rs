//! Tuning a world by timing its plans on its own devices, and the cache
//! that spares the next world on the same machine the measurement.
//!
//! When a world is made (`WGPU_COLLECTIVES_TUNE=measure` or `cached`, or
//! [`WorldConfig::with_tune`]), every plan that can run there times
//! all_reduce, reduce_scatter, all_gather and broadcast at a few sizes on
//! the world's own devices, through a world of its own over the same
//! devices and links of the same kind, and the planner then chooses from
//! the fitted lines (`runtime/tune.rs`). The table is cached in a file
//! named by a hash of its key (adapter, driver, backend, ranks,
//! placement, crate version), written to a temporary file and renamed, so
//! that two processes writing at once leave a whole file; one that does
//! not parse, or was measured under another key, is measured again and
//! rewritten. A forced plan or algorithm tunes nothing: it wins anyway.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::bootstrap::devices_on;
use crate::api::placement::Placement;
use crate::api::world::{World, WorldConfig};
use crate::device::RankDevice;
use crate::device::tensor::DType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::collectives::Collective;
use crate::runtime::collectives::all_gather::AllGather;
use crate::runtime::collectives::all_reduce::AllReduce;
use crate::runtime::collectives::broadcast::Broadcast;
use crate::runtime::collectives::reduce_scatter::ReduceScatter;
use crate::runtime::cost::Algorithm;
use crate::runtime::fingerprint::Kind;
use crate::runtime::kernel_shape;
use crate::runtime::plan::Plan;
use crate::runtime::planner::Tuning;
use crate::runtime::same_bits;
use crate::runtime::shared;
use crate::runtime::tune::{Cost, Entry, Table};
use crate::transport::MakePlace;
use crate::transport::local::mesh;

/// Whether a world times its plans (`WGPU_COLLECTIVES_TUNE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Tune {
    /// The planner's rules and cost model decide, as they were tuned on
    /// one lavapipe machine: for a world whose choices must not depend on
    /// timing (tests of the rules, reproducing a run elsewhere).
    Off,
    /// The cached table when there is one for this machine and world,
    /// else measure and cache (the default).
    #[default]
    Cached,
    /// Measure, and cache what was measured.
    Measure,
}

impl Tune {
    /// `off`, `cached` or `measure`.
    pub fn parse(s: &str) -> Option<Tune> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" => Some(Tune::Off),
            "cached" => Some(Tune::Cached),
            "measure" => Some(Tune::Measure),
            _ => None,
        }
    }
}

/// The collectives timed, and the sizes (bytes per rank).
pub(crate) const KINDS: [Kind; 4] = [
    Kind::AllReduce,
    Kind::ReduceScatter,
    Kind::AllGather,
    Kind::Broadcast,
];

/// The plans `kind` offers, as its unit says.
fn offers(kind: Kind) -> &'static [Plan] {
    let (dtype, len, op) = (DType::F32, 0, ReduceOp::Sum);
    let unit: Collective = match kind {
        Kind::AllReduce => AllReduce { dtype, len, op }.into(),
        Kind::ReduceScatter => ReduceScatter { dtype, len, op }.into(),
        Kind::AllGather => AllGather { dtype, len }.into(),
        _ => Broadcast {
            dtype,
            len,
            root: 0,
        }
        .into(),
    };
    unit.plans()
}
const SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

/// Past this much time spent measuring, no size above 1 MiB is timed.
const BUDGET: Duration = Duration::from_millis(1200);

/// Past 64 KiB, a plan is timed at the next size (16x larger) only when
/// it took at most this many times the best plan's time at this one: on
/// lavapipe, 4 ranks, no plan that far behind at 1 MiB came within 10%
/// of the best at 16 MiB, and the one-shot alone (10x behind there) cost
/// 0.8 s to time at 16 MiB. Those not timed are costed along their last
/// range.
const PRUNE: f64 = 2.5;

/// A world's tuning: the table, its text (as the cache holds it) and
/// the cache file it was read from or written to.
#[derive(Debug, Clone)]
pub(crate) struct Tuned {
    pub table: Arc<Table>,
    pub text: String,
    pub path: Option<PathBuf>,
}

/// The tuning table for a world of `devices` (meeting on one device when
/// `meets`), as `config` asks: `None` when it tunes nothing.
pub(crate) fn table_for(
    config: &WorldConfig,
    devices: &[Arc<RankDevice>],
    meets: bool,
    tuning: &Tuning,
) -> Result<Option<Tuned>> {
    let mode = config.tune()?;
    let n = devices.len();
    if mode == Tune::Off || n < 2 || tuning.plan.is_some() || tuning.algorithm != Algorithm::Auto {
        return Ok(None);
    }
    let Some(first) = devices.first() else {
        return Ok(None);
    };
    // One measurement at a time in a process: worlds made at once (a
    // test binary's threads) wait for the first to cache its table, and
    // no timing runs beside another.
    let _one = one_at_a_time();
    if mode == Tune::Cached {
        if let Some(t) = cached(config, first, n, meets) {
            return Ok(Some(t));
        }
    }
    let start = Instant::now();
    let tuning = &agreed(first, n, tuning)?;
    let entries = measure(config, devices, meets, tuning, &KINDS)?;
    Ok(Some(keep(
        config,
        (first, n, meets),
        entries,
        tuning,
        start,
    )))
}

/// The table of `entries`, measured since `start` for `n` ranks on
/// `first`'s adapter, logged and cached.
fn keep(
    config: &WorldConfig,
    (first, n, meets): (&RankDevice, usize, bool),
    entries: Vec<Entry>,
    tuning: &Tuning,
    start: Instant,
) -> Tuned {
    let table = Table {
        entries,
        host_fold: tuning.host_fold,
        units: tuning.units,
    };
    tracing::info!(
        ms = start.elapsed().as_secs_f64() * 1e3,
        entries = table.entries.len(),
        "world: plans timed on its devices"
    );
    let key = key(first, n, meets);
    let text = table.to_text(&key);
    let path = config
        .tune_cache()
        .map(|dir| dir.join(file_name(&key)))
        .filter(|path| cache(path, &text, "the tuning table"));
    Tuned {
        table: Arc::new(table),
        text,
        path,
    }
}

/// `tuning` with what is measured on `first` before any plan is timed:
/// the reduction kernel's fastest shape (`runtime/kernel_shape.rs`, set on
/// `first`'s kernels), and whether the host folds its bits
/// (`runtime/same_bits.rs`: the host ring is offered only then).
pub(crate) fn agreed(first: &RankDevice, n: usize, tuning: &Tuning) -> Result<Tuning> {
    let ranks = u32::try_from(n).unwrap_or(u32::MAX);
    Ok(Tuning {
        units: kernel_shape::fastest(first)?,
        host_fold: same_bits::host_fold_agrees(first, ranks)?,
        ..tuning.clone()
    })
}

/// The process-wide turn to measure (or read what the last turn cached).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A measurement that panicked left nothing half-done that matters.
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What `placement_for` measured: rank 0's figures and the tuning table.
pub(crate) type Measured = (Tuning, Option<Tuned>);

/// The devices, configuration and tuning a world is made with: when
/// `config` tunes and leaves the placement to the engine (`Auto`), and
/// its ranks share an adapter, all_reduce is timed under both placements
/// (a device per rank made for the second), the one whose best plans take
/// less over the expected sizes is kept, and only it has its other
/// collectives timed; the choice is cached beside the tables. Otherwise
/// as they came, tuning still to be done (`None`).
#[allow(
    clippy::type_complexity,
    reason = "the three things a world is assembled from, once"
)]
pub(crate) fn placement_for(
    config: &WorldConfig,
    adapters: &[wgpu::Adapter],
    devices: Vec<Arc<RankDevice>>,
) -> Result<(Vec<Arc<RankDevice>>, WorldConfig, Option<Measured>)> {
    let n = devices.len();
    let unchanged = (devices.clone(), config.clone(), None);
    let Some(first) = devices.first().cloned() else {
        return Ok(unchanged);
    };
    let together = devices.iter().all(|d| d.same_device(&first));
    let mode = config.tune()?;
    if config.placement()? != Placement::Auto || mode == Tune::Off || n < 2 || !together {
        return Ok(unchanged);
    }
    let tuning = config.tuning(&first)?;
    if tuning.plan.is_some() || tuning.algorithm != Algorithm::Auto {
        // A forced plan tunes nothing; the figures are measured already.
        return Ok((devices, config.clone(), Some((tuning, None))));
    }
    let shared_cfg = config.clone().with_placement(Placement::SharedDevice);
    let apart_cfg = config.clone().with_placement(Placement::DevicePerRank);
    let (lo, hi) = config.expected_bytes();
    let choice_key = format!(
        "{} | expects {lo}-{hi} bytes",
        key(&first, n, false).replace("per-rank", "placement")
    );
    let choice_path = config.tune_cache().map(|d| d.join(file_name(&choice_key)));
    let one = one_at_a_time();
    if mode == Tune::Cached {
        let was = choice_path
            .as_deref()
            .and_then(|p| read_choice(p, &choice_key));
        if let Some(shared) = was {
            // The chosen placement's own table, read (or measured).
            drop(one);
            let (devices, cfg) = if shared {
                (devices, shared_cfg)
            } else {
                let apart = devices_on(adapters, 0..n, Placement::DevicePerRank, config)?;
                (apart, apart_cfg)
            };
            let tuned = table_for(&cfg, &devices, shared, &tuning)?;
            return Ok((devices, cfg, Some((tuning, tuned))));
        }
    }
    let start = Instant::now();
    let tuning = agreed(&first, n, &tuning)?;
    let ar = [Kind::AllReduce];
    let on_shared = measure(&shared_cfg, &devices, true, &tuning, &ar)?;
    let apart = devices_on(adapters, 0..n, Placement::DevicePerRank, config)?;
    let on_apart = measure(&apart_cfg, &apart, false, &tuning, &ar)?;
    // The best plan's all-reduce at each power of 4 in the expected range.
    let mut sizes = Vec::new();
    let mut s = lo.max(1);
    while s <= hi {
        sizes.push(s);
        s = s.saturating_mul(4);
        if s == usize::MAX {
            break;
        }
    }
    let table = |entries: Vec<Entry>| Table {
        entries,
        host_fold: tuning.host_fold,
        units: tuning.units,
    };
    let (on_shared, on_apart) = (table(on_shared), table(on_apart));
    let best = |t: &Table, bytes: usize| {
        t.best(Kind::AllReduce, bytes, |_| true)
            .map_or(f64::INFINITY, |(_, secs)| secs)
    };
    let shared_total: f64 = sizes.iter().map(|&b| best(&on_shared, b)).sum();
    let apart_total: f64 = sizes.iter().map(|&b| best(&on_apart, b)).sum();
    let shared_wins = sizes
        .iter()
        .filter(|&&b| best(&on_shared, b) <= best(&on_apart, b))
        .count();
    let keep_shared = shared_total <= apart_total;
    tracing::info!(
        placement = if keep_shared { "shared" } else { "per-rank" },
        expected_bytes = ?(lo, hi),
        shared_ms = shared_total * 1e3,
        per_rank_ms = apart_total * 1e3,
        sizes_shared_faster = shared_wins,
        sizes = sizes.len(),
        "world: placement chosen by timing both"
    );
    let rest: Vec<Kind> = KINDS.into_iter().filter(|k| !ar.contains(k)).collect();
    let (devices, cfg, mut entries) = if keep_shared {
        drop(apart);
        (devices, shared_cfg, on_shared.entries)
    } else {
        (apart, apart_cfg, on_apart.entries)
    };
    entries.extend(measure(&cfg, &devices, keep_shared, &tuning, &rest)?);
    let tuned = keep(&cfg, (&first, n, keep_shared), entries, &tuning, start);
    if let Some(path) = &choice_path {
        let text = format!(
            "{CHOICE}\nkey {choice_key}\nshared {shared_total:e}\nper-rank {apart_total:e}\nend\n"
        );
        cache(path, &text, "the placement chosen");
    }
    Ok((devices, cfg, Some((tuning, Some(tuned)))))
}

/// The first line of a cached placement choice.
const CHOICE: &str = "wgpu-collectives placement 1";

/// What the cache says of a placement chosen under `key` (the best
/// all-reduce's seconds over the expected sizes under each): shared
/// (`true`, the lesser or equal) or a device per rank; `None` when it
/// holds no good choice.
fn read_choice(path: &Path, key: &str) -> Option<bool> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %e, "world: reading the tuning cache");
            }
            return None;
        }
    };
    let lines: Vec<&str> = text.lines().collect();
    let secs = |line: &str, name: &str| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v >= 0.0)
    };
    let choice = match lines[..] {
        [CHOICE, k, shared, apart, "end"] if k.strip_prefix("key ") == Some(key) => {
            secs(shared, "shared")
                .zip(secs(apart, "per-rank"))
                .map(|(s, a)| s <= a)
        }
        _ => None,
    };
    if choice.is_none() {
        tracing::warn!(path = %path.display(), "world: ignoring the cached placement choice; measuring again");
    }
    choice
}

/// The cached table for `n` ranks on `first`'s adapter (meeting on one
/// device when `meets`), when there is a good one; a bad one is warned
/// of (and measured again by the caller).
fn cached(config: &WorldConfig, first: &RankDevice, n: usize, meets: bool) -> Option<Tuned> {
    cached_under(config, &key(first, n, meets))
}

/// The cached table measured under `key`, when there is a good one.
pub(crate) fn cached_under(config: &WorldConfig, key: &str) -> Option<Tuned> {
    let path = config.tune_cache()?.join(file_name(key));
    match std::fs::read_to_string(&path) {
        Ok(text) => match Table::from_text(&text, key) {
            Ok(table) => {
                tracing::info!(path = %path.display(), "world: tuning table from the cache");
                Some(Tuned {
                    table: Arc::new(table),
                    text,
                    path: Some(path),
                })
            }
            Err(why) => {
                tracing::warn!(
                    path = %path.display(),
                    why,
                    "world: ignoring the cached tuning table; measuring again"
                );
                None
            }
        },
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %e, "world: reading the tuning cache");
            }
            None
        }
    }
}

/// What a table is measured under, on one line.
pub(crate) fn key(first: &RankDevice, n: usize, meets: bool) -> String {
    let i = &first.info;
    format!(
        "{} | {} {} | {:?} | {n} ranks | {} | {}",
        i.name,
        i.driver,
        i.driver_info,
        i.backend,
        if meets { "shared" } else { "per-rank" },
        env!("CARGO_PKG_VERSION")
    )
    .replace(['\n', '\r'], " ")
}

/// The cache file's name for `key`.
pub(crate) fn file_name(key: &str) -> String {
    format!(
        "{:016x}.tune",
        crate::hash::fnv1a(key.bytes().map(u64::from))
    )
}

/// Writes `text` to `path` whole: into a temporary file beside it, then
/// renamed over it.
fn store(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{}.{}.{nanos}.tmp",
        path.file_name().and_then(|f| f.to_str()).unwrap_or("tune"),
        std::process::id()
    ));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Stores `text` at `path` ([`store`]); a failure is warned of, naming
/// `what`, and leaves the world uncached. Whether it was stored.
pub(crate) fn cache(path: &Path, text: &str, what: &str) -> bool {
    match store(path, text) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "world: could not cache {what}");
            false
        }
    }
}

/// The default cache folder: `$XDG_CACHE_HOME/wgpu-collectives`, else
/// `$HOME/.cache/wgpu-collectives`.
pub(crate) fn default_cache() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("wgpu-collectives"))
}

/// One plan's world, and the kinds it runs with their (bytes, seconds)
/// timed so far.
type Timing = (Plan, World, Vec<(Kind, Vec<(f64, f64)>)>);

/// Times `kinds` under every plan that can run on `devices`, each plan
/// through a world of its own with that plan forced, size by size
/// across the plans (so that the budget, when it runs out, leaves every
/// plan timed at the same sizes).
fn measure(
    config: &WorldConfig,
    devices: &[Arc<RankDevice>],
    meets: bool,
    tuning: &Tuning,
    kinds: &[Kind],
) -> Result<Vec<Entry>> {
    let n = devices.len();
    let here = Over {
        ranks: (0, n),
        links: &|_| Ok(mesh(n, meets.then_some(shared::place as MakePlace))),
        agree: &|v| Ok(v),
    };
    measure_over(config, devices, meets, tuning, kinds, &here)
}

/// Where the plans are timed: the world's ranks (the first here, and how
/// many in all), the links of the world timing plan number `i`, and the
/// agreement of every process on a figure (the largest any measured), so
/// that every process times the same calls in the same order.
pub(crate) struct Over<'a> {
    pub ranks: (usize, usize),
    pub links: &'a dyn Fn(usize) -> Result<Vec<Arc<crate::runtime::hop::Link>>>,
    pub agree: &'a dyn Fn(f64) -> Result<f64>,
}

/// [`measure`], over `over`: a world of this process's ranks, or of
/// several processes' (`world_mpi.rs`).
pub(crate) fn measure_over(
    config: &WorldConfig,
    devices: &[Arc<RankDevice>],
    meets: bool,
    tuning: &Tuning,
    kinds: &[Kind],
    over: &Over<'_>,
) -> Result<Vec<Entry>> {
    let start = Instant::now();
    // A plan that did not run, or not at this size, is infinitely slow.
    let agreed_time = |w: &World, kind, bytes, plan, iters| -> Result<Option<f64>> {
        let secs = time(w, kind, bytes, plan, iters)?.unwrap_or(f64::INFINITY);
        let all = (over.agree)(secs)?;
        Ok(all.is_finite().then_some(all))
    };
    let spent = || -> Result<bool> {
        Ok((over.agree)(start.elapsed().as_secs_f64())? > BUDGET.as_secs_f64())
    };
    let mut runs: Vec<Timing> = Vec::new();
    for (i, plan) in Plan::ALL.into_iter().enumerate() {
        if (plan == Plan::Direct && !meets) || (plan == Plan::HostRing && !tuning.host_fold) {
            continue;
        }
        let offered: Vec<Kind> = kinds
            .iter()
            .copied()
            .filter(|&k| offers(k).contains(&plan))
            .collect();
        if offered.is_empty() {
            continue;
        }
        let forced = Tuning {
            plan: Some(plan),
            table: None,
            ..tuning.clone()
        };
        let links = (over.links)(i)?;
        let mut config = config.clone().with_plan(Some(plan));
        config.quiet = true;
        let w = World::assemble_with(None, devices.to_vec(), links, &config, over.ranks, forced)?;
        // Every kind once first: its kernels compile on first use, which
        // would count as part of its smallest size's time. A kind that
        // runs another plan here is not timed under this one.
        let mut timed = Vec::new();
        for kind in offered {
            if agreed_time(&w, kind, SIZES[0], plan, 1)?.is_some() {
                timed.push((kind, Vec::new()));
            }
        }
        runs.push((plan, w, timed));
    }
    for (i, bytes) in SIZES.into_iter().enumerate() {
        // Enough calls that a small size is not one scheduler hiccup,
        // few enough at the large ones to fit the budget.
        let iters = match bytes {
            b if b <= 64 << 10 => 9,
            b if b <= 1 << 20 => 5,
            _ => 3,
        };
        // Who is timed at this size: every (plan, kind) timed at the last
        // one, past 64 KiB only those within PRUNE of that kind's best
        // there, fastest first (so that the budget, should it run out,
        // cuts the slowest).
        let mut turn: Vec<(usize, usize, f64)> = Vec::new();
        for (r, (_, _, timed)) in runs.iter().enumerate() {
            for (k, (kind, points)) in timed.iter().enumerate() {
                if points.len() != i {
                    continue; // a size it could not run cuts the larger ones
                }
                let last = points.last().map_or(0.0, |p| p.1);
                let best = runs
                    .iter()
                    .flat_map(|run| run.2.iter())
                    .filter(|(k2, p2)| k2 == kind && p2.len() == i)
                    .filter_map(|(_, p2)| p2.last().map(|p| p.1))
                    .fold(f64::INFINITY, f64::min);
                if bytes > 64 << 10 && last > best * PRUNE {
                    continue;
                }
                turn.push((r, k, last));
            }
        }
        turn.sort_by(|a, b| a.2.total_cmp(&b.2));
        for (r, k, _) in turn {
            if bytes > 1 << 20 && spent()? {
                tracing::debug!(bytes, "world: tuning's budget spent");
                break;
            }
            let Some((plan, w, timed)) = runs.get_mut(r) else {
                continue;
            };
            let Some((kind, points)) = timed.get_mut(k) else {
                continue;
            };
            if let Some(secs) = agreed_time(w, *kind, bytes, *plan, iters)? {
                tracing::debug!(
                    kind = kind.name(),
                    plan = plan.name(),
                    bytes,
                    us = secs * 1e6,
                    "world: timed"
                );
                points.push((bytes as f64, secs));
            }
        }
    }
    Ok(runs
        .into_iter()
        .flat_map(|(plan, _, timed)| {
            timed.into_iter().filter_map(move |(kind, points)| {
                Cost::new(points).map(|cost| Entry { kind, plan, cost })
            })
        })
        .collect())
}

/// Seconds one `kind` of `bytes` per rank takes on `w` (the slowest
/// rank's median of `iters` calls, after one untimed), when it runs with
/// `plan`; `None` when it runs another (the kind does not offer it) or
/// cannot run this size with it.
fn time(w: &World, kind: Kind, bytes: usize, plan: Plan, iters: usize) -> Result<Option<f64>> {
    let n = w.size();
    let len = (bytes / 4).max(1).next_multiple_of(n);
    let per_rank = w.run(|c| -> Result<Option<f64>> {
        let x = c.zeros(DType::F32, len)?;
        let once = || -> Result<()> {
            let work = match kind {
                Kind::AllReduce => c.all_reduce_in_place(&x, ReduceOp::Sum)?,
                Kind::ReduceScatter => c.reduce_scatter(&x, ReduceOp::Sum)?,
                Kind::AllGather => c.all_gather(&x)?,
                _ => c.broadcast_in_place(&x, 0)?,
            };
            work.wait().map(|_| ())
        };
        let t = Instant::now();
        once()?;
        let first = t.elapsed().as_secs_f64();
        let ran = c
            .flight_record()
            .ranks
            .get(c.rank())
            .and_then(|r| r.last())
            .and_then(|e| e.plan);
        if ran != Some(plan) {
            return Ok(None);
        }
        // Small sizes leave out the first call (pools growing to the size);
        // a large one is dear enough that it counts, the median absorbing it.
        let mut times = Vec::with_capacity(iters);
        if bytes > 1 << 20 {
            times.push(first);
        }
        let _ = c.barrier()?.wait()?;
        while times.len() < iters {
            let t = Instant::now();
            once()?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        Ok(times.get(times.len() / 2).copied())
    })?;
    let mut slowest: f64 = 0.0;
    for r in per_rank {
        match r {
            Ok(Some(secs)) => slowest = slowest.max(secs),
            Ok(None) | Err(Error::InvalidArgument { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(slowest))
}
