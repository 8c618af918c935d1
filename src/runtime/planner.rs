//! The one place a call's plan is chosen, once per call.
//!
//! [`decide`] picks a [`Plan`] from a small description of the call
//! ([`Call`]: the collective, its ranks, where they lie) and what every
//! rank of the group knows alike (the [`Tuning`] that rank 0 measured and
//! broadcast, with healing's table and exploration for this call), so
//! every rank picks the same plan without a word. It is asked once per
//! call: by each rank before it meets its peers where the ranks lie
//! apart, by the group's meeting where they share a device. The layers,
//! as NCCL's tuner sits behind `getCollInfo`: a forced plan wins; else
//! healing's exploration and the table's fastest; else the rules
//! (`Tune::Off`). What can run here is decided in one function
//! (`can_run`); a plan that cannot is refused with the reason, never
//! silently replaced.

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use crate::dtype::DType;
use crate::runtime::collectives::Collective;
use crate::runtime::cost::{Algorithm, CostModel, Rates};
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::flight::Flight;
use crate::runtime::fold_order::FoldOrder;
use crate::runtime::heal::Heal;
use crate::runtime::plan::Plan;
use crate::runtime::tune::Table;
use crate::runtime::two_level::Tier;

/// What the user forced, in every call's choice: the plan, the set of
/// plans an algorithm names, and the fold orders collectives may take
/// (agreed by every process).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Forced {
    pub algorithm: Algorithm,
    /// A plan, for the collectives that offer it.
    pub plan: Option<Plan>,
    pub fold: FoldOrder,
}

/// What was measured on rank 0's device, that every rank (every process)
/// decides from alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Figures {
    /// The hop model the rules price plans with.
    pub cost: CostModel,
    pub rates: Rates,
    /// Whether the ring between ranks of their own devices may fold on
    /// the host (`algo/fold.rs`): in a tuned world, where the host folded
    /// rank 0's adapter's bits (`same_bits.rs`); untuned, by the rule
    /// that it does where the adapter is the CPU.
    pub host_fold: bool,
    /// Units per invocation of the reduction kernel, as timed on rank 0's
    /// device (`kernel_shape.rs`); 0: by the rule.
    pub units: u64,
}

/// What the planner chooses from, in layers: what the user forced, what
/// timing the plans found, what was measured for the rules; and where the
/// world lies over processes. The same on every rank of a group.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    pub forced: Forced,
    pub figures: Figures,
    /// What timing the plans on the world's devices found (`tune.rs`),
    /// when the world was tuned: it chooses where it has the kind. Where
    /// the world heals, its healing's latest table.
    pub table: Option<Arc<Table>>,
    /// The world's healing (`heal/`): it replaces `table`, and explores
    /// (`Call::explore`), at each collective. Not a split's.
    pub heal: Option<Arc<Heal>>,
    /// How the world's ranks lie over processes that each hold ranks on
    /// one device: where two-level plans can run (a world over MPI's; not
    /// a split's).
    pub tier: Option<Arc<Tier>>,
}

impl Tuning {
    /// What the user forced and what was measured, untimed: no table, no
    /// healing, in one process.
    pub(crate) fn new(forced: Forced, figures: Figures) -> Tuning {
        Tuning {
            forced,
            figures,
            table: None,
            heal: None,
            tier: None,
        }
    }

    /// Whether the user forced a plan `what` offers.
    pub(crate) fn forces(&self, what: &Collective) -> bool {
        self.forced.plan.is_some_and(|p| what.plans().contains(&p))
    }
}

impl Figures {
    /// The figures as words, for processes to agree on rank 0's.
    #[cfg(feature = "mpi")]
    pub(crate) fn to_words(self) -> Vec<u64> {
        let mut w = self.cost.to_words().to_vec();
        w.extend([
            self.rates.host.to_bits(),
            self.rates.device.to_bits(),
            u64::from(self.host_fold),
            self.units,
        ]);
        w
    }

    /// The figures `words` (from `to_words`) give.
    #[cfg(feature = "mpi")]
    pub(crate) fn from_words(words: &[u64]) -> Option<Figures> {
        match words {
            [c0, c1, c2, host, device, fold, units, ..] => Some(Figures {
                cost: CostModel::from_words(&[*c0, *c1, *c2])?,
                rates: Rates {
                    host: f64::from_bits(*host),
                    device: f64::from_bits(*device),
                },
                host_fold: *fold != 0,
                units: *units,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
impl Tuning {
    /// Figures for the planner's unit tests: nothing forced, no table, the
    /// host folding, a cost model of 50 us and 1 GB/s.
    pub(crate) fn for_tests() -> Tuning {
        Tuning::new(
            Forced {
                algorithm: Algorithm::Auto,
                plan: None,
                fold: FoldOrder::Canonical,
            },
            Figures {
                cost: CostModel {
                    alpha: Duration::from_micros(50),
                    beta: 1e9,
                    dispatch: Duration::from_micros(10),
                },
                rates: Rates {
                    host: 1e9,
                    device: 1e10,
                },
                host_fold: true,
                units: 1,
            },
        )
    }
}

/// The bytes each rank moves in `what`, as tuning tables count them.
pub(crate) fn bytes_of(what: &Collective) -> Option<usize> {
    what.unit()
        .compared()
        .len
        .zip(what.dtype())
        .and_then(|(len, dtype)| len.checked_mul(dtype.size()))
}

/// Why a two-level plan cannot run a collective: told only when a forced
/// plan is refused, so that deciding allocates nothing.
enum Unfit {
    /// The world is not over processes that each hold ranks on one device.
    NoTier,
    /// The fold orders allowed keep this dtype in the canonical order.
    Order(DType),
    /// The group is not the tier's processes x ranks.
    Shape {
        processes: usize,
        local: usize,
        n: usize,
    },
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::NoTier => write!(
                f,
                "it runs across processes whose ranks share one device each (a world over \
                 MPI, not a split of one)"
            ),
            Unfit::Order(dtype) => write!(
                f,
                "its fold order depends on the process layout, so {} runs it only under \
                 FoldOrder::Fastest (WorldConfig::with_fold_order, \
                 WGPU_COLLECTIVES_FOLD_ORDER=fastest)",
                dtype.name()
            ),
            Unfit::Shape {
                processes,
                local,
                n,
            } => write!(
                f,
                "it needs 2 or more processes of 2 or more ranks on one device each, and \
                 this group is {processes} processes x {local} ranks of {n}"
            ),
        }
    }
}

/// Whether a two-level plan can run `what` on `n` ranks, or why not:
/// where the world's processes each hold ranks on one device, and the
/// fold orders allowed free the collective's dtype. The same on every
/// rank: the tier and the fold order were agreed by every process.
fn two_level(tuning: &Tuning, what: &Collective, n: usize) -> Result<(), Unfit> {
    let tier = tuning.tier.as_ref().ok_or(Unfit::NoTier)?;
    if let Some(dtype) = what.dtype().filter(|&d| !tuning.forced.fold.frees(d)) {
        return Err(Unfit::Order(dtype));
    }
    if !tier.fits(n) {
        let (processes, local) = tier.shape();
        return Err(Unfit::Shape {
            processes,
            local,
            n,
        });
    }
    Ok(())
}

/// Where a call's ranks lie, as far as the planner needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lies {
    /// On devices of their own (or a pair's hop): no kernel reads another
    /// rank's buffers.
    Apart,
    /// On one device, or a single rank: whether the direct kernels can
    /// run the call, or why not (decided once for the group, from every
    /// rank's tensors, at its meeting).
    Shared(Result<(), String>),
}

/// A call as the planner sees it: what it is, over how many ranks, and
/// where they lie. Every field is the same on every rank of the group.
pub(crate) struct Call<'a> {
    pub what: &'a Collective,
    pub n: usize,
    pub lies: Lies,
    /// The plan healing explores at this call (the same on every rank:
    /// rank 0's checkpoint), taken where the table may choose it.
    pub explore: Option<Plan>,
}

/// Whom a decision is for: the ranks of the group (in `flight`, their
/// record) whose call `fp` it decides. Each rank's entry counts the
/// decisions taken for its call, so that a second one would show.
pub(crate) struct For<'a> {
    pub flight: &'a Flight,
    pub fp: &'a Fingerprint,
    pub ranks: Range<usize>,
}

/// Why a plan cannot run a call here: told only when a forced plan is
/// refused, so that deciding allocates nothing.
enum Cannot {
    /// The two-level plan, and why.
    TwoLevel(Unfit),
    /// The direct kernels between ranks that do not share a device.
    Apart { n: usize },
    /// The direct kernels on the shared device, and why not.
    Kernels(String),
}

impl std::fmt::Display for Cannot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cannot::TwoLevel(why) => write!(f, "{why}"),
            Cannot::Apart { n } => write!(f, "{}", apart(*n)),
            Cannot::Kernels(why) => write!(f, "{why}"),
        }
    }
}

/// Why the direct kernels cannot run between `n` ranks on devices of
/// their own (the world refuses such a forced plan with these words).
pub(crate) fn apart(n: usize) -> String {
    format!(
        "the {n} ranks do not share one device: its kernels read every rank's buffers, so \
         they need the ranks on one device (Placement::SharedDevice)"
    )
}

/// Whether `plan` can run `call` here, or why not: the one place that
/// says so, for a forced plan and for the planner's own choice alike.
fn can_run(tuning: &Tuning, call: &Call<'_>, plan: Plan) -> Result<(), Cannot> {
    match (plan, &call.lies) {
        (Plan::TwoLevel, _) => two_level(tuning, call.what, call.n).map_err(Cannot::TwoLevel),
        (Plan::Direct, Lies::Apart) => Err(Cannot::Apart { n: call.n }),
        (Plan::Direct, Lies::Shared(Err(why))) => Err(Cannot::Kernels(why.clone())),
        _ => Ok(()),
    }
}

/// The plan `call` runs with, or why the forced plan cannot run: the one
/// decision taken for a call (by each rank alone where the ranks lie
/// apart, by the group's meeting where they share a device), recorded
/// for the ranks `whom` it decides for. Every input is the same on every
/// rank of the group (the tuning is rank 0's, the direct verdict is
/// decided once for the group), so every rank chooses alike.
pub(crate) fn decide(tuning: &Tuning, call: &Call<'_>, whom: For<'_>) -> Result<Plan, String> {
    let plan = choose(tuning, call);
    for r in whom.ranks {
        whom.flight.decided(r, whom.fp, plan.as_ref().ok().copied());
    }
    plan
}

/// What `decide` decides, recorded nowhere: a forced plan where it can
/// run; else the fastest plan the table timed among those that can run
/// here (healing's exploration first); else the rules.
fn choose(tuning: &Tuning, call: &Call<'_>) -> Result<Plan, String> {
    let what = call.what;
    let kind = what.kind();
    let offers = what.plans();
    if let Some(forced) = tuning.forced.plan.filter(|p| offers.contains(p)) {
        return match can_run(tuning, call, forced) {
            Ok(()) => Ok(forced),
            Err(Cannot::Apart { n }) => {
                Err(format!("the plan direct was forced, but {}", apart(n)))
            }
            Err(why) => Err(format!(
                "the plan {} was forced, but {} cannot run {}: {why}",
                forced.name(),
                if forced == Plan::Direct {
                    "its kernels"
                } else {
                    "it"
                },
                kind.name()
            )),
        };
    }
    let runs = |p: Plan| offers.contains(&p) && can_run(tuning, call, p).is_ok();
    // The algorithm names a set of all-reduce's plans; where none of them
    // can run here (the direct kernels between devices of their own), it
    // names none and the planner chooses as for `Auto`.
    let priced = what.unit().priced();
    let named = |p: Plan| priced.is_some() && tuning.forced.algorithm.admits(p);
    let any_named = offers.iter().any(|&p| named(p) && runs(p));
    let may = |p: Plan| runs(p) && (!any_named || named(p));
    // Measured: the plan timed fastest at this size, among those that
    // may run here.
    if let (Some(table), Some(bytes)) = (&tuning.table, bytes_of(what)) {
        // The host ring only where the host folds this adapter's bits.
        // The one-shot holds n contributions at once: not past 4x the
        // largest size it was timed at (an H200 timed it fastest at
        // 16 MiB, and the line through that chose it at 1 GiB, where its
        // 2 GiB of room was more than the device would give).
        let allowed = |p: Plan| {
            may(p)
                && (p != Plan::HostRing || tuning.figures.host_fold)
                && (p != Plan::OneShot
                    || table
                        .largest(kind, p)
                        .is_some_and(|b| bytes as f64 <= 4.0 * b))
        };
        if let Some(p) = call.explore.filter(|&p| allowed(p)) {
            return Ok(p);
        }
        if let Some(p) = table.choose(kind, bytes, allowed) {
            return Ok(p);
        }
    }
    // The rules: the direct kernels where they run; for a collective the
    // cost model prices (all-reduce), the cheaper of the one-shot and the
    // ring the ranks would run (on the host where the ranks lie apart and
    // the host folds), the ring on ties.
    if may(Plan::Direct) {
        return Ok(Plan::Direct);
    }
    if let Some(bytes) = priced {
        let ring = if tuning.figures.host_fold && call.lies == Lies::Apart && may(Plan::HostRing) {
            Plan::HostRing
        } else {
            Plan::DeviceRing
        };
        let price = |p: Plan| {
            if may(p) {
                let f = &tuning.figures;
                f.cost
                    .price(&f.rates, p, call.n, bytes)
                    .unwrap_or(Duration::MAX)
            } else {
                Duration::MAX
            }
        };
        return Ok(if price(Plan::OneShot) < price(ring) {
            Plan::OneShot
        } else {
            ring
        });
    }
    Ok(offers
        .iter()
        .copied()
        .find(|&p| p != Plan::Direct && may(p))
        .unwrap_or(Plan::PointToPoint))
}

/// `choose` for the unit tests of the planner's users.
#[cfg(test)]
pub(crate) fn choose_for_tests(
    tuning: &Tuning,
    what: &Collective,
    n: usize,
    lies: Lies,
) -> Result<Plan, String> {
    explored_for_tests(tuning, what, n, lies, None)
}

/// [`choose_for_tests`], where healing explores `explore`.
#[cfg(test)]
pub(crate) fn explored_for_tests(
    tuning: &Tuning,
    what: &Collective,
    n: usize,
    lies: Lies,
    explore: Option<Plan>,
) -> Result<Plan, String> {
    choose(
        tuning,
        &Call {
            what,
            n,
            lies,
            explore,
        },
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::op::ReduceOp;
    use crate::runtime::collectives::all_reduce::AllReduce;

    /// A table in which the two-level plan is the fastest all_reduce at
    /// every size, the host ring the next.
    fn two_level_fastest() -> Arc<Table> {
        let text = "wgpu-collectives tuning 3\nkey test\n\
                    all_reduce two-level 65536:1e-4~0.02 16777216:1e-2~0.02\n\
                    all_reduce host-ring 65536:2e-4~0.02 16777216:2e-2~0.02\n\
                    all_reduce device-ring 65536:3e-4~0.02 16777216:3e-2~0.02\n\
                    host-fold same-bits\nkernel-units 1\nend\n";
        Arc::new(Table::from_text(text, None).unwrap())
    }

    /// 2 processes x 2 ranks on one device each, deciding by `table`.
    fn tuning(fold: FoldOrder, tier: bool, plan: Option<Plan>) -> Tuning {
        let t = Tuning::for_tests();
        Tuning {
            forced: Forced {
                plan,
                fold,
                ..t.forced
            },
            table: Some(two_level_fastest()),
            tier: tier.then(|| Arc::new(Tier::new(2, 2, 2, true))),
            ..t
        }
    }

    fn all_reduce(dtype: DType) -> Collective {
        AllReduce {
            dtype,
            len: 1 << 20,
            op: ReduceOp::Sum,
        }
        .into()
    }

    #[test]
    fn floats_take_the_two_level_plan_only_when_the_fold_order_is_free() {
        let canonical = tuning(FoldOrder::Canonical, true, None);
        let fastest = tuning(FoldOrder::Fastest, true, None);
        // Floats keep the canonical order's fastest plan unless the user
        // opted in; integers take the two-level plan either way.
        assert_eq!(
            choose_for_tests(&canonical, &all_reduce(DType::F32), 4, Lies::Apart),
            Ok(Plan::HostRing)
        );
        assert_eq!(
            choose_for_tests(&canonical, &all_reduce(DType::BF16), 4, Lies::Apart),
            Ok(Plan::HostRing)
        );
        assert_eq!(
            choose_for_tests(&fastest, &all_reduce(DType::F32), 4, Lies::Apart),
            Ok(Plan::TwoLevel)
        );
        assert_eq!(
            choose_for_tests(&canonical, &all_reduce(DType::I32), 4, Lies::Apart),
            Ok(Plan::TwoLevel)
        );
        assert_eq!(
            choose_for_tests(&canonical, &all_reduce(DType::U32), 4, Lies::Apart),
            Ok(Plan::TwoLevel)
        );
        // Without processes sharing a device each, or over a group that
        // is not the world's shape, never.
        let flat = tuning(FoldOrder::Fastest, false, None);
        assert_eq!(
            choose_for_tests(&flat, &all_reduce(DType::I32), 4, Lies::Apart),
            Ok(Plan::HostRing)
        );
        assert_eq!(
            choose_for_tests(&fastest, &all_reduce(DType::I32), 2, Lies::Apart),
            Ok(Plan::HostRing)
        );
    }

    #[test]
    fn a_forced_two_level_plan_that_cannot_run_says_why() {
        let forced = tuning(FoldOrder::Canonical, true, Some(Plan::TwoLevel));
        let why = choose_for_tests(&forced, &all_reduce(DType::F32), 4, Lies::Apart).unwrap_err();
        assert!(why.contains("FoldOrder::Fastest"), "{why}");
        assert_eq!(
            choose_for_tests(&forced, &all_reduce(DType::I32), 4, Lies::Apart),
            Ok(Plan::TwoLevel)
        );
        let flat = tuning(FoldOrder::Fastest, false, Some(Plan::TwoLevel));
        let why = choose_for_tests(&flat, &all_reduce(DType::F32), 4, Lies::Apart).unwrap_err();
        assert!(why.contains("across processes"), "{why}");
        let odd = tuning(FoldOrder::Fastest, true, Some(Plan::TwoLevel));
        let why = choose_for_tests(&odd, &all_reduce(DType::F32), 6, Lies::Apart).unwrap_err();
        assert!(why.contains("2 processes x 2 ranks of 6"), "{why}");
    }
}
