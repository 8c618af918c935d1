//! How a world is configured: every setting a user gives in code
//! (`WorldConfig`'s methods) or in the environment (`WGPU_COLLECTIVES_*`,
//! `WGPU_BACKEND`, `WGPU_ADAPTER_NAME`), and the small enums they take.
//! The one module that reads the environment, so that what a setting
//! means, its default and its error are written once; it uses nothing
//! else of `api/`, so that every other module may use it. What each
//! setting does is the business of the module that acts on it.

use std::path::PathBuf;
use std::time::Duration;

use crate::device::{Import, RankDevice, Wants};
use crate::error::{Error, Result};
use crate::runtime::cost::{Algorithm, CostModel, Rates};
use crate::runtime::fold_order::FoldOrder;
use crate::runtime::plan::Plan;
use crate::runtime::planner::{Figures, Forced, Tuning};

/// Most ranks a world may have.
pub const MAX_RANKS: usize = 64;

/// How to build a [`World`](crate::World).
#[derive(Debug, Clone)]
pub struct WorldConfig {
    ranks: usize,
    backends: Option<wgpu::Backends>,
    adapter_name: Option<String>,
    timeout: Duration,
    algorithm: Option<Algorithm>,
    plan: Option<Option<Plan>>,
    fold_order: Option<FoldOrder>,
    required_features: wgpu::Features,
    required_limits: Option<wgpu::Limits>,
    flight_depth: Option<usize>,
    flight_dump: Option<std::path::PathBuf>,
    placement: Option<Placement>,
    host_link: Option<HostLink>,
    tune: Option<Tune>,
    tune_cache: Option<PathBuf>,
    tune_table: Option<String>,
    /// Tests only: a given table heals as a measured one does, so that
    /// healing runs on figures the test chose.
    #[cfg(test)]
    pub(crate) given_heals: bool,
    heal: Option<bool>,
    busy: Option<f64>,
    expected: Option<(usize, usize)>,
    /// A world tuning makes to time a plan: it logs nothing of its own.
    pub(crate) quiet: bool,
}

impl WorldConfig {
    /// A world of `ranks` ranks, with backends and adapter from the
    /// `WGPU_BACKEND` and `WGPU_ADAPTER_NAME` environment variables, and a
    /// 60 s timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use wgpu_collectives::WorldConfig;
    ///
    /// let config = WorldConfig::new(4).with_timeout(Duration::from_secs(10));
    /// assert_eq!(config.ranks(), 4);
    /// ```
    pub fn new(ranks: usize) -> WorldConfig {
        WorldConfig {
            ranks,
            backends: None,
            adapter_name: None,
            timeout: Duration::from_secs(60),
            algorithm: None,
            plan: None,
            fold_order: None,
            required_features: wgpu::Features::empty(),
            required_limits: None,
            flight_depth: None,
            flight_dump: None,
            placement: None,
            host_link: None,
            tune: None,
            tune_cache: None,
            tune_table: None,
            #[cfg(test)]
            given_heals: false,
            heal: None,
            busy: None,
            expected: None,
            quiet: false,
        }
    }

    /// Where the ranks run (default: the `WGPU_COLLECTIVES_PLACEMENT`
    /// environment variable, else [`Placement::Auto`]: ranks on one
    /// adapter share its device).
    pub fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = Some(placement);
        self
    }

    pub(crate) fn placement(&self) -> Result<Placement> {
        match self.placement {
            Some(p) => Ok(p),
            None => Placement::from_env(),
        }
    }

    /// What carries bytes between ranks on separate devices (default: the
    /// `WGPU_COLLECTIVES_HOST_LINK` environment variable, else
    /// [`HostLink::Auto`]: host memory both devices map, where they can).
    /// Forcing [`HostLink::Mapped`] on devices that cannot import host
    /// memory makes the world an [`Error::InvalidArgument`] saying why.
    pub fn with_host_link(mut self, link: HostLink) -> Self {
        self.host_link = Some(link);
        self
    }

    pub(crate) fn host_link(&self) -> Result<HostLink> {
        match self.host_link {
            Some(l) => Ok(l),
            None => HostLink::from_env(),
        }
    }

    /// Collectives each rank's flight record keeps (default: the
    /// `WGPU_COLLECTIVES_FLIGHT_DEPTH` environment variable, else 64).
    pub fn with_flight_depth(mut self, depth: usize) -> Self {
        self.flight_depth = Some(depth);
        self
    }

    /// Where the first failure of a group (a timeout, a mismatch, a peer
    /// failure) writes the flight record as JSON: `PATH.ranks-LO-HI.json`,
    /// with the group's world ranks (default: the
    /// `WGPU_COLLECTIVES_FLIGHT_DUMP` environment variable, else nowhere).
    pub fn with_flight_dump(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.flight_dump = Some(path.into());
        self
    }

    pub(crate) fn flight_depth(&self) -> Result<usize> {
        if let Some(d) = self.flight_depth {
            return Ok(d.max(1));
        }
        match std::env::var("WGPU_COLLECTIVES_FLIGHT_DEPTH") {
            Ok(s) if !s.is_empty() => {
                s.parse::<usize>()
                    .ok()
                    .filter(|&d| d > 0)
                    .ok_or_else(|| Error::InvalidArgument {
                        rank: None,
                        what: format!(
                            "WGPU_COLLECTIVES_FLIGHT_DEPTH={s:?}: expected a count above 0"
                        ),
                    })
            }
            _ => Ok(crate::runtime::flight::DEFAULT_DEPTH),
        }
    }

    pub(crate) fn flight_dump(&self) -> Option<std::path::PathBuf> {
        self.flight_dump.clone().or_else(|| {
            std::env::var_os("WGPU_COLLECTIVES_FLIGHT_DUMP")
                .filter(|s| !s.is_empty())
                .map(Into::into)
        })
    }

    /// Features the devices [`World::new`](crate::World::new) makes must have (on top of
    /// those the engine turns on where the adapter has them, for example
    /// for a framework that will share the devices). An adapter without
    /// them makes `World::new` fail, naming what is missing.
    pub fn with_required_features(mut self, features: wgpu::Features) -> Self {
        self.required_features = features;
        self
    }

    /// Limits the devices [`World::new`](crate::World::new) makes must meet. They get every
    /// limit their adapter has; an adapter below these makes `World::new`
    /// fail, naming each limit.
    pub fn with_required_limits(mut self, limits: wgpu::Limits) -> Self {
        self.required_limits = Some(limits);
        self
    }

    /// Which wgpu backends to look for adapters on.
    pub fn with_backends(mut self, backends: wgpu::Backends) -> Self {
        self.backends = Some(backends);
        self
    }

    /// Only use adapters whose name contains `name` (case-insensitive).
    pub fn with_adapter_name(mut self, name: &str) -> Self {
        self.adapter_name = Some(name.to_string());
        self
    }

    /// How long any collective may wait for its peers or its device.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Forces an all-reduce algorithm, as `NCCL_ALGO` does (default: the
    /// `WGPU_COLLECTIVES_ALGO` environment variable, else `Auto`).
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = Some(algorithm);
        self
    }

    /// Forces the plan collectives run with, for every collective that
    /// offers it (see [`Plan`]); the others run as the planner chooses.
    /// `None` lets the planner choose for all (default: the
    /// `WGPU_COLLECTIVES_PLAN` environment variable, unless
    /// [`with_algorithm`](Self::with_algorithm) was called, else `None`). A plan
    /// forced here wins over an [`Algorithm`]; one that cannot run (the
    /// direct kernels between separate devices, say) makes the world, or
    /// the call, fail with [`Error::InvalidArgument`] naming why, never a
    /// silent fallback.
    pub fn with_plan(mut self, plan: Option<Plan>) -> Self {
        self.plan = Some(plan);
        self
    }

    /// The fold orders its collectives may take (default: the
    /// `WGPU_COLLECTIVES_FOLD_ORDER` environment variable, `canonical` or
    /// `fastest`, else [`FoldOrder::Canonical`]). Under
    /// [`FoldOrder::Fastest`] a world over processes whose ranks share one
    /// device each may all-reduce floats in two levels
    /// ([`Plan::TwoLevel`]): their bits then change with the process
    /// layout (2 processes x 2 ranks against 1 x 4, say). Integer dtypes
    /// take such plans whatever this says, since their folds do not depend
    /// on the order. Every process of a world must ask for the same.
    ///
    /// ```
    /// use wgpu_collectives::{FoldOrder, WorldConfig};
    ///
    /// let config = WorldConfig::new(2).with_fold_order(FoldOrder::Fastest);
    /// # let _ = config;
    /// ```
    pub fn with_fold_order(mut self, order: FoldOrder) -> Self {
        self.fold_order = Some(order);
        self
    }

    /// The fold orders allowed: `with_fold_order`'s, else
    /// `WGPU_COLLECTIVES_FOLD_ORDER`'s, else canonical.
    pub(crate) fn fold_order(&self) -> Result<FoldOrder> {
        if let Some(f) = self.fold_order {
            return Ok(f);
        }
        match std::env::var("WGPU_COLLECTIVES_FOLD_ORDER") {
            Ok(s) if !s.trim().is_empty() => {
                FoldOrder::parse(&s).ok_or_else(|| Error::InvalidArgument {
                    rank: None,
                    what: format!(
                        "WGPU_COLLECTIVES_FOLD_ORDER={s:?}: expected canonical or fastest"
                    ),
                })
            }
            _ => Ok(FoldOrder::Canonical),
        }
    }

    /// Whether the world times its plans on its devices when it is made,
    /// and the planner chooses from what it measured (see [`Tune`];
    /// default: the `WGPU_COLLECTIVES_TUNE` environment variable, `off`,
    /// `cached` or `measure`, else [`Tune::Cached`]). A forced plan or
    /// algorithm tunes nothing.
    pub fn with_tune(mut self, tune: Tune) -> Self {
        self.tune = Some(tune);
        self
    }

    /// The folder tuning tables are cached in (default: the
    /// `WGPU_COLLECTIVES_TUNE_CACHE` environment variable, else
    /// `$XDG_CACHE_HOME/wgpu-collectives`, else
    /// `$HOME/.cache/wgpu-collectives`).
    pub fn with_tune_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.tune_cache = Some(dir.into());
        self
    }

    /// The tuning table the planner chooses from, as `wgpu-collectives
    /// tune` prints it or a cache file holds it (comments included),
    /// whatever machine its key names: to reproduce another machine's
    /// choices, or to test what the planner does with given figures. The
    /// world measures nothing, reads and writes no cache, and the table
    /// never heals. Text that is not a table makes [`World::new`](crate::World::new) fail
    /// with [`Error::InvalidArgument`] naming the line.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let table = "# my laptop's
    /// wgpu-collectives tuning 3
    /// key anything
    /// host-fold other-bits
    /// kernel-units 1
    /// all_reduce device-ring 4096:1e-4 1048576:2e-3
    /// all_reduce one-shot 4096:5e-5 1048576:9e-3
    /// end
    /// ";
    /// let world = World::new(
    ///     WorldConfig::new(2)
    ///         .with_placement(Placement::DevicePerRank)
    ///         .with_tune_table(table),
    /// )?;
    /// let plans = world.run(|c| -> Result<_, Error> {
    ///     let x = c.tensor(&[1.0f32; 1024])?;
    ///     let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
    ///     Ok(c.flight_record().ranks[c.rank()].last().and_then(|e| e.plan))
    /// })?;
    /// assert_eq!(plans[0].clone()?, Some(Plan::OneShot));
    /// # Ok(()) }
    /// ```
    pub fn with_tune_table(mut self, text: impl Into<String>) -> Self {
        self.tune_table = Some(text.into());
        self
    }

    pub(crate) fn tune_table(&self) -> Option<&str> {
        self.tune_table.as_deref()
    }

    /// Whether a tuned world corrects its table as it runs: when its
    /// collectives take longer than the table predicted, or a rival plan
    /// is predicted within the noise, the calls themselves time the
    /// contenders, every rank switches at the same collective, and the
    /// cache is rewritten (default: the `WGPU_COLLECTIVES_HEAL`
    /// environment variable, `on` or `off`, else on). A table given by
    /// [`with_tune_table`](Self::with_tune_table) never heals; nor does a
    /// group `split` makes. Over MPI, process 0 decides for every process
    /// (whose settings must agree).
    pub fn with_healing(mut self, heal: bool) -> Self {
        self.heal = Some(heal);
        self
    }

    pub(crate) fn heals(&self) -> Result<bool> {
        if let Some(h) = self.heal {
            return Ok(h);
        }
        match std::env::var("WGPU_COLLECTIVES_HEAL") {
            Ok(s) if !s.trim().is_empty() => match s.trim().to_ascii_lowercase().as_str() {
                "on" | "1" | "yes" => Ok(true),
                "off" | "0" | "no" => Ok(false),
                _ => Err(Error::InvalidArgument {
                    rank: None,
                    what: format!("WGPU_COLLECTIVES_HEAL={s:?}: on or off"),
                }),
            },
            _ => Ok(true),
        }
    }

    /// The largest share (0 to 1) of the machine's CPU time that other
    /// processes may use while a world times its plans: a table timed on
    /// a busier machine decides nothing and is not cached (the planner's
    /// rules decide, and the next world times again), since a core held
    /// by a build or a training job made the plans tie that are 1.6-4.8x
    /// apart on a quiet machine. 1 times whatever the load, for a machine
    /// that is never quiet (default: the `WGPU_COLLECTIVES_TUNE_BUSY`
    /// environment variable, in percent, else 10%).
    pub fn with_busy_limit(mut self, share: f64) -> Self {
        self.busy = Some(share);
        self
    }

    pub(crate) fn busy_limit(&self) -> Result<f64> {
        if let Some(b) = self.busy.filter(|b| (0.0..=1.0).contains(b)) {
            return Ok(b);
        }
        if let Some(b) = self.busy {
            return Err(Error::InvalidArgument {
                rank: None,
                what: format!("WorldConfig::with_busy_limit({b}): a share from 0 to 1"),
            });
        }
        match std::env::var("WGPU_COLLECTIVES_TUNE_BUSY") {
            Ok(s) if !s.trim().is_empty() => s
                .trim()
                .trim_end_matches('%')
                .parse::<f64>()
                .ok()
                .filter(|p| (0.0..=100.0).contains(p))
                .map(|p| p / 100.0)
                .ok_or_else(|| Error::InvalidArgument {
                    rank: None,
                    what: format!("WGPU_COLLECTIVES_TUNE_BUSY={s:?}: a percentage from 0 to 100"),
                }),
            _ => Ok(BUSY),
        }
    }

    /// The sizes (bytes per rank) the world's collectives will mostly
    /// move, from `lo` to `hi`: where timing finds each placement faster
    /// at some of them, a tuning `Auto` placement keeps the one faster
    /// over these (default: 1 MiB to 64 MiB).
    pub fn with_expected_bytes(mut self, lo: usize, hi: usize) -> Self {
        self.expected = Some((lo.min(hi), hi.max(lo)));
        self
    }

    pub(crate) fn expected_bytes(&self) -> (usize, usize) {
        self.expected.unwrap_or((1 << 20, 64 << 20))
    }

    pub(crate) fn tune(&self) -> Result<Tune> {
        if let Some(t) = self.tune {
            return Ok(t);
        }
        match std::env::var("WGPU_COLLECTIVES_TUNE") {
            Ok(s) if !s.trim().is_empty() => {
                Tune::parse(&s).ok_or_else(|| Error::InvalidArgument {
                    rank: None,
                    what: format!("WGPU_COLLECTIVES_TUNE={s:?}: off, cached or measure"),
                })
            }
            _ => Ok(Tune::default()),
        }
    }

    pub(crate) fn tune_cache(&self) -> Option<PathBuf> {
        self.tune_cache
            .clone()
            .or_else(|| {
                std::env::var_os("WGPU_COLLECTIVES_TUNE_CACHE")
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(default_dir)
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn wants(&self) -> Result<Wants> {
        Ok(Wants {
            features: self.required_features,
            limits: self.required_limits.clone(),
            import: match self.host_link()? {
                HostLink::Auto => Import::IfAble,
                HostLink::Mapped => Import::Required,
                HostLink::Staging => Import::Never,
            },
        })
    }

    pub(crate) fn algorithm(&self) -> Result<Algorithm> {
        if let Some(a) = self.algorithm {
            return Ok(a);
        }
        match std::env::var("WGPU_COLLECTIVES_ALGO") {
            Ok(s) if !s.is_empty() => Algorithm::parse(&s).ok_or_else(|| Error::InvalidArgument {
                rank: None,
                what: format!("WGPU_COLLECTIVES_ALGO={s:?}: expected ring, oneshot or auto"),
            }),
            _ => Ok(Algorithm::Auto),
        }
    }

    /// The forced plan: `with_plan`'s, else `WGPU_COLLECTIVES_PLAN`'s
    /// unless the code chose an algorithm (what code sets wins over the
    /// environment).
    pub(crate) fn plan(&self) -> Result<Option<Plan>> {
        if let Some(p) = self.plan {
            return Ok(p);
        }
        if self.algorithm.is_some() {
            return Ok(None);
        }
        match std::env::var("WGPU_COLLECTIVES_PLAN") {
            Ok(s) if !s.is_empty() && s.trim() != "auto" => {
                Plan::parse(&s)
                    .map(Some)
                    .ok_or_else(|| Error::InvalidArgument {
                        rank: None,
                        what: format!(
                            "WGPU_COLLECTIVES_PLAN={s:?}: expected auto, {}",
                            Plan::ALL.map(Plan::name).join(", ")
                        ),
                    })
            }
            _ => Ok(None),
        }
    }

    /// What the planner decides from, with the figures measured on `first`.
    pub(crate) fn tuning(&self, first: &RankDevice) -> Result<Tuning> {
        Ok(Tuning::new(
            Forced {
                algorithm: self.algorithm()?,
                plan: self.plan()?,
                fold: self.fold_order()?,
            },
            Figures {
                cost: CostModel::measure(first)?,
                rates: Rates::measure(first)?,
                host_fold: first.info.device_type == wgpu::DeviceType::Cpu,
                units: 0,
            },
        ))
    }

    pub(crate) fn backends(&self) -> wgpu::Backends {
        self.backends
            .or_else(wgpu::Backends::from_env)
            .unwrap_or(wgpu::Backends::PRIMARY)
    }

    pub(crate) fn adapter_name(&self) -> Option<String> {
        self.adapter_name
            .clone()
            .or_else(|| std::env::var("WGPU_ADAPTER_NAME").ok())
            .filter(|s| !s.is_empty())
    }
}

/// The largest share of the machine's CPU time (all cores) other
/// processes may use while the plans are timed. One busy core of two is
/// a half; a quiet machine of this project's kind shows under 1%.
pub(crate) const BUSY: f64 = 0.1;

/// The default cache folder: `$XDG_CACHE_HOME/wgpu-collectives`, else
/// `$HOME/.cache/wgpu-collectives`.
fn default_dir() -> Option<PathBuf> {
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

/// Where a [`World`](crate::World)'s ranks run.
///
/// ```
/// use wgpu_collectives::{Placement, WorldConfig};
///
/// let config = WorldConfig::new(4).with_placement(Placement::DevicePerRank);
/// assert_eq!(Placement::parse("shared"), Some(Placement::SharedDevice));
/// # let _ = config;
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Ranks on one adapter share one device and queue; ranks on
    /// different adapters have their own.
    #[default]
    Auto,
    /// Every rank on one device (the first adapter's).
    SharedDevice,
    /// A device per rank, as separate GPUs would have: every hop goes
    /// through host memory.
    DevicePerRank,
}

impl Placement {
    /// Parses `auto`, `shared` or `per-rank` (as `WGPU_COLLECTIVES_PLACEMENT`
    /// takes them).
    pub fn parse(s: &str) -> Option<Placement> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Placement::Auto),
            "shared" | "shared-device" | "shared_device" => Some(Placement::SharedDevice),
            "per-rank" | "per_rank" | "device-per-rank" | "device_per_rank" => {
                Some(Placement::DevicePerRank)
            }
            _ => None,
        }
    }

    /// The name [`Placement::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Auto => "auto",
            Placement::SharedDevice => "shared",
            Placement::DevicePerRank => "per-rank",
        }
    }

    /// `WGPU_COLLECTIVES_PLACEMENT`, else `Auto`.
    pub(crate) fn from_env() -> Result<Placement> {
        match std::env::var("WGPU_COLLECTIVES_PLACEMENT") {
            Ok(s) if !s.is_empty() => Placement::parse(&s).ok_or_else(|| Error::InvalidArgument {
                rank: None,
                what: format!(
                    "WGPU_COLLECTIVES_PLACEMENT={s:?}: expected auto, shared or per-rank"
                ),
            }),
            _ => Ok(Placement::Auto),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What carries bytes between ranks on separate devices
/// ([`WorldConfig::with_host_link`](crate::WorldConfig::with_host_link),
/// or `WGPU_COLLECTIVES_HOST_LINK=auto|mapped|staging`).
///
/// ```
/// use wgpu_collectives::{HostLink, WorldConfig};
///
/// let config = WorldConfig::new(4).with_host_link(HostLink::Staging);
/// assert_eq!(HostLink::parse("mapped"), Some(HostLink::Mapped));
/// # let _ = config;
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostLink {
    /// Mapped where every device of the world can import host memory,
    /// else staged.
    #[default]
    Auto,
    /// Host memory both devices import: no map, no memcpy, no staging. A
    /// world whose devices cannot import it is refused, saying why.
    Mapped,
    /// Through mapped staging buffers and host copies, as on any backend.
    Staging,
}

impl HostLink {
    /// Parses `auto`, `mapped` or `staging`.
    pub fn parse(s: &str) -> Option<HostLink> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(HostLink::Auto),
            "mapped" => Some(HostLink::Mapped),
            "staging" | "staged" => Some(HostLink::Staging),
            _ => None,
        }
    }

    /// The name [`HostLink::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            HostLink::Auto => "auto",
            HostLink::Mapped => "mapped",
            HostLink::Staging => "staging",
        }
    }

    /// `WGPU_COLLECTIVES_HOST_LINK`, else `Auto`.
    pub(crate) fn from_env() -> Result<HostLink> {
        match std::env::var("WGPU_COLLECTIVES_HOST_LINK") {
            Ok(s) if !s.is_empty() => HostLink::parse(&s).ok_or_else(|| Error::InvalidArgument {
                rank: None,
                what: format!("WGPU_COLLECTIVES_HOST_LINK={s:?}: expected auto, mapped or staging"),
            }),
            _ => Ok(HostLink::Auto),
        }
    }
}

impl std::fmt::Display for HostLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a world times its plans (`WGPU_COLLECTIVES_TUNE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Tune {
    /// The planner's rules and cost model decide, as they were tuned on
    /// one lavapipe machine: for a world whose choices must not depend on
    /// timing (tests of the rules, reproducing a run elsewhere). Nothing
    /// heals.
    Off,
    /// The cached table when there is one for this machine and world,
    /// else measure and cache (the default); the table heals as the
    /// world runs.
    #[default]
    Cached,
    /// Measure, and cache what was measured; the table heals as the
    /// world runs.
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

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Tune::Off => "off",
            Tune::Cached => "cached",
            Tune::Measure => "measure",
        }
    }
}
