//! The one function that chooses how a collective runs.
//!
//! [`choose`] picks a [`Plan`] from what every rank of the group knows
//! alike (the tuning that rank 0 measured and broadcast, the placement,
//! the collective's fingerprint), so every rank picks the same plan
//! without a word. A plan forced by the user always wins over the rules,
//! and one that cannot run here is refused with the reason, never
//! silently replaced.

use std::sync::Arc;
use std::time::Duration;

use crate::dtype::DType;
use crate::runtime::collectives::Collective;
use crate::runtime::cost::{Algorithm, CostModel, Rates, seconds};
use crate::runtime::fold_order::FoldOrder;
use crate::runtime::heal::Heal;
use crate::runtime::plan::Plan;
use crate::runtime::tune::Table;
use crate::runtime::two_level::Tier;

/// What the planner chooses from: what the user
/// forced, and figures measured on rank 0's device that every rank shares.
#[derive(Debug, Clone)]
pub(crate) struct Tuning {
    pub algorithm: Algorithm,
    /// A plan forced by the user, for the collectives that offer it.
    pub plan: Option<Plan>,
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
    /// What timing the plans on the world's devices found (`tune.rs`),
    /// when the world was tuned: it chooses where it has the kind.
    pub table: Option<Arc<Table>>,
    /// The world's healing (`heal.rs`): it replaces `table` and sets
    /// `prefer` at each collective. Not a split's.
    pub heal: Option<Arc<Heal>>,
    /// The plan this call runs where it can, as healing explores.
    pub prefer: Option<Plan>,
    /// The fold orders collectives may take (agreed by every process).
    pub fold: FoldOrder,
    /// How the world's ranks lie over processes that each hold ranks on
    /// one device: where two-level plans can run (a world over MPI's; not
    /// a split's).
    pub tier: Option<Arc<Tier>>,
}

impl Tuning {
    /// The figures every rank must decide from, as words (processes agree
    /// on rank 0's: see `with_figures`).
    #[cfg(feature = "mpi")]
    pub(crate) fn figures(&self) -> Vec<u64> {
        let mut w = self.cost.to_words().to_vec();
        w.extend([
            self.rates.host.to_bits(),
            self.rates.device.to_bits(),
            u64::from(self.host_fold),
            self.units,
        ]);
        w
    }

    /// This tuning with the figures `words` (from `figures`) give.
    #[cfg(feature = "mpi")]
    pub(crate) fn with_figures(self, words: &[u64]) -> Option<Tuning> {
        match words {
            [c0, c1, c2, host, device, fold, units, ..] => Some(Tuning {
                cost: CostModel::from_words(&[*c0, *c1, *c2])?,
                rates: Rates {
                    host: f64::from_bits(*host),
                    device: f64::from_bits(*device),
                },
                host_fold: *fold != 0,
                units: *units,
                ..self
            }),
            _ => None,
        }
    }

    /// The estimated time of an all-reduce of `bytes` on `n` ranks under
    /// `plan`; `None` for a plan all-reduce does not offer.
    pub(crate) fn price(&self, plan: Plan, n: usize, bytes: usize) -> Option<Duration> {
        let c = &self.cost;
        match plan {
            Plan::DeviceRing => Some(c.ring_all_reduce(n, bytes)),
            Plan::OneShot => Some(c.one_shot_all_reduce(n, bytes)),
            Plan::HostRing => {
                if n < 2 {
                    return Some(Duration::ZERO);
                }
                // Down and up once, then the ring's 2(n-1) steps of S/n
                // and n-1 folds of S/n, all in host memory.
                let s = bytes as f64;
                let steps = 3.0 * n.saturating_sub(1) as f64 * s / n as f64;
                Some(seconds(
                    c.alpha.as_secs_f64() + s / c.beta + steps / self.rates.host,
                ))
            }
            Plan::Direct => {
                // One submission: a kernel per part reads n inputs and
                // writes n outputs on the device.
                let moved = 2.0 * n as f64 * bytes as f64;
                Some(seconds(
                    c.alpha.as_secs_f64()
                        + n as f64 * c.dispatch.as_secs_f64()
                        + moved / (2.0 * self.rates.device),
                ))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
impl Tuning {
    /// Figures for the planner's unit tests: nothing forced, no table, the
    /// host folding, a cost model of 50 us and 1 GB/s.
    pub(crate) fn for_tests() -> Tuning {
        Tuning {
            algorithm: Algorithm::Auto,
            plan: None,
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
            table: None,
            heal: None,
            prefer: None,
            fold: FoldOrder::Canonical,
            tier: None,
        }
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
    if let Some(dtype) = what.dtype().filter(|&d| !tuning.fold.frees(d)) {
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

/// Whether the direct kernels can run a collective here: `None` when the
/// ranks do not share a device, else `Ok` or why they cannot.
pub(crate) type DirectVerdict = Option<Result<(), String>>;

/// Why the forced plan cannot run `what` on `n` ranks, where that is
/// known before the ranks meet (`shares`: whether they share one device).
/// It is decided from what every rank holds alike, so each rank refuses
/// the call itself, before it looks for a peer's failure: every rank
/// reports `InvalidArgument`, none a peer's refusal as `PeerFailed`
/// (which of those a rank saw was a race).
pub(crate) fn refused(
    tuning: &Tuning,
    what: &Collective,
    n: usize,
    shares: bool,
) -> Option<String> {
    let forced = tuning.plan.filter(|p| what.plans().contains(p))?;
    match forced {
        Plan::TwoLevel => two_level(tuning, what, n).err().map(|why| {
            format!(
                "the plan two-level was forced, but it cannot run {}: {why}",
                what.kind().name()
            )
        }),
        Plan::Direct if !shares => Some(format!(
            "the plan direct was forced, but the {n} ranks do not share one device: its \
             kernels read every rank's buffers, so they need the ranks on one device \
             (Placement::SharedDevice)"
        )),
        _ => None,
    }
}

/// The plan `what` runs with on `n` ranks, or why the forced plan cannot
/// run. `direct` says whether the shared device's kernels can run it.
/// Every input is the same on every rank of the group (the tuning is
/// rank 0's, the direct verdict is decided once for the group), so every
/// rank chooses alike.
pub(crate) fn choose(
    tuning: &Tuning,
    what: &Collective,
    n: usize,
    direct: &DirectVerdict,
) -> Result<Plan, String> {
    let kind = what.kind();
    let offers = what.plans();
    if let Some(forced) = tuning.plan.filter(|p| offers.contains(p)) {
        if let Some(why) = refused(tuning, what, n, direct.is_some()) {
            return Err(why);
        }
        return match (forced, direct) {
            (Plan::Direct, Some(Err(why))) => Err(format!(
                "the plan direct was forced, but its kernels cannot run {}: {why}",
                kind.name()
            )),
            (p, _) => Ok(p),
        };
    }
    // The ring the planner would run where the ranks have devices of their own.
    let ring = if tuning.host_fold && direct.is_none() {
        Plan::HostRing
    } else {
        Plan::DeviceRing
    };
    let direct_ok = matches!(direct, Some(Ok(())));
    // Measured: the plan timed fastest at this size, among those that
    // can run here.
    if let (Some(table), Algorithm::Auto) = (&tuning.table, tuning.algorithm) {
        if let Some(bytes) = bytes_of(what) {
            // The host ring only where the host folds this adapter's bits.
            // The one-shot holds n contributions at once: not past 4x the
            // largest size it was timed at (an H200 timed it fastest at
            // 16 MiB, and the line through that chose it at 1 GiB, where
            // its 2 GiB of room was more than the device would give).
            let allowed = |p: Plan| {
                offers.contains(&p)
                    && (p != Plan::Direct || direct_ok)
                    && (p != Plan::TwoLevel || two_level(tuning, what, n).is_ok())
                    && (p != Plan::HostRing || tuning.host_fold)
                    && (p != Plan::OneShot
                        || table
                            .largest(kind, p)
                            .is_some_and(|b| bytes as f64 <= 4.0 * b))
            };
            if let Some(p) = tuning.prefer.filter(|&p| allowed(p)) {
                return Ok(p);
            }
            if let Some(p) = table.choose(kind, bytes, allowed) {
                return Ok(p);
            }
        }
    }
    // A collective whose plans the cost model prices: today's all-reduce.
    if let Some(bytes) = what.unit().priced() {
        match tuning.algorithm {
            Algorithm::Ring => return Ok(ring),
            Algorithm::OneShot => return Ok(Plan::OneShot),
            _ => {}
        }
        if direct_ok {
            return Ok(Plan::Direct);
        }
        let price = |p| tuning.price(p, n, bytes).unwrap_or(Duration::MAX);
        return Ok(if price(Plan::OneShot) < price(ring) {
            Plan::OneShot
        } else {
            ring
        });
    }
    if matches!(direct, Some(Ok(()))) {
        return Ok(Plan::Direct);
    }
    Ok(offers
        .iter()
        .copied()
        .find(|&p| p != Plan::Direct)
        .unwrap_or(Plan::PointToPoint))
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
        Tuning {
            plan,
            table: Some(two_level_fastest()),
            fold,
            tier: tier.then(|| Arc::new(Tier::new(2, 2, 2, true))),
            ..Tuning::for_tests()
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
            choose(&canonical, &all_reduce(DType::F32), 4, &None),
            Ok(Plan::HostRing)
        );
        assert_eq!(
            choose(&canonical, &all_reduce(DType::BF16), 4, &None),
            Ok(Plan::HostRing)
        );
        assert_eq!(
            choose(&fastest, &all_reduce(DType::F32), 4, &None),
            Ok(Plan::TwoLevel)
        );
        assert_eq!(
            choose(&canonical, &all_reduce(DType::I32), 4, &None),
            Ok(Plan::TwoLevel)
        );
        assert_eq!(
            choose(&canonical, &all_reduce(DType::U32), 4, &None),
            Ok(Plan::TwoLevel)
        );
        // Without processes sharing a device each, or over a group that
        // is not the world's shape, never.
        let flat = tuning(FoldOrder::Fastest, false, None);
        assert_eq!(
            choose(&flat, &all_reduce(DType::I32), 4, &None),
            Ok(Plan::HostRing)
        );
        assert_eq!(
            choose(&fastest, &all_reduce(DType::I32), 2, &None),
            Ok(Plan::HostRing)
        );
    }

    #[test]
    fn a_forced_two_level_plan_that_cannot_run_says_why() {
        let forced = tuning(FoldOrder::Canonical, true, Some(Plan::TwoLevel));
        let why = choose(&forced, &all_reduce(DType::F32), 4, &None).unwrap_err();
        assert!(why.contains("FoldOrder::Fastest"), "{why}");
        assert_eq!(
            choose(&forced, &all_reduce(DType::I32), 4, &None),
            Ok(Plan::TwoLevel)
        );
        let flat = tuning(FoldOrder::Fastest, false, Some(Plan::TwoLevel));
        let why = choose(&flat, &all_reduce(DType::F32), 4, &None).unwrap_err();
        assert!(why.contains("across processes"), "{why}");
        let odd = tuning(FoldOrder::Fastest, true, Some(Plan::TwoLevel));
        let why = choose(&odd, &all_reduce(DType::F32), 6, &None).unwrap_err();
        assert!(why.contains("2 processes x 2 ranks of 6"), "{why}");
    }
}
