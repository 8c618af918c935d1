//! How one collective runs, and the one function that chooses it.
//!
//! A [`Plan`] names a way to run a collective: the shared device's kernels,
//! a ring whose hops go through host memory (reducing on each rank's device
//! or on the host), a one-shot, a chain, and so on. Each collective offers
//! some of them; [`choose`] picks one from what every rank of the group
//! knows alike (the tuning that rank 0 measured and broadcast, the
//! placement, the collective's fingerprint), so every rank picks the same
//! plan without a word. A plan forced by the user always wins over the
//! rules, and one that cannot run here is refused with the reason, never
//! silently replaced.

use std::time::Duration;

use crate::runtime::collective::Collective;
use crate::runtime::cost::{Algorithm, CostModel, Rates, seconds};
use crate::runtime::fingerprint::Kind;

/// How one collective runs. [`Work::plan`](crate::Work::plan) says which
/// one ran; [`WorldConfig::with_plan`](crate::WorldConfig::with_plan) and
/// `WGPU_COLLECTIVES_PLAN` force one (the finer form of
/// [`Algorithm`](crate::Algorithm)). More may come, so matches need a
/// wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Plan {
    /// Ranks that share one device: kernels and device copies read every
    /// rank's tensors and write every rank's outputs in one submission, with
    /// no host copy. Offered by every collective except send and receive.
    Direct,
    /// The ring (all_reduce, reduce_scatter, all_gather, their coalesced
    /// forms, barrier, split) with hops through host memory, each rank's
    /// device doing its own work: WGSL reduction kernels where the
    /// collective reduces. The path every pair of discrete GPUs takes.
    DeviceRing,
    /// all_reduce's ring folded on the host: one download, the ring's
    /// steps on host memory, one upload. Cheapest where the adapter is the
    /// CPU itself.
    HostRing,
    /// all_reduce in one shot: every rank sends its whole input to every
    /// other and folds all n contributions itself, part by part in the
    /// ring's order (2 round trips, n times the bytes).
    OneShot,
    /// broadcast and reduce along a chain of ranks from or to the root.
    Chain,
    /// all_to_all in pairwise exchanges.
    Pairwise,
    /// gather and scatter: the root trades with every rank.
    Star,
    /// send and receive: one hop between a pair.
    PointToPoint,
}

impl Plan {
    /// Every plan, in the order the benchmark sweeps them.
    pub const ALL: [Plan; 8] = [
        Plan::Direct,
        Plan::DeviceRing,
        Plan::HostRing,
        Plan::OneShot,
        Plan::Chain,
        Plan::Pairwise,
        Plan::Star,
        Plan::PointToPoint,
    ];

    /// The plan named `s` (`direct`, `device-ring`, `host-ring`,
    /// `one-shot`, `chain`, `pairwise`, `star`, `p2p`), as
    /// `WGPU_COLLECTIVES_PLAN` takes them; `_` and `-` are alike.
    pub fn parse(s: &str) -> Option<Plan> {
        let s = s.trim().to_ascii_lowercase().replace('_', "-");
        match s.as_str() {
            "direct" => Some(Plan::Direct),
            "device-ring" | "devicering" => Some(Plan::DeviceRing),
            "host-ring" | "hostring" => Some(Plan::HostRing),
            "one-shot" | "oneshot" => Some(Plan::OneShot),
            "chain" => Some(Plan::Chain),
            "pairwise" => Some(Plan::Pairwise),
            "star" => Some(Plan::Star),
            "p2p" | "point-to-point" => Some(Plan::PointToPoint),
            _ => None,
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Plan::Direct => "direct",
            Plan::DeviceRing => "device-ring",
            Plan::HostRing => "host-ring",
            Plan::OneShot => "one-shot",
            Plan::Chain => "chain",
            Plan::Pairwise => "pairwise",
            Plan::Star => "star",
            Plan::PointToPoint => "p2p",
        }
    }

    /// A small number that names the plan on the wire (processes agree on
    /// a forced plan); 0 is "none".
    pub(crate) fn code(plan: Option<Plan>) -> u64 {
        plan.and_then(|p| Plan::ALL.iter().position(|&q| q == p))
            .map_or(0, |i| {
                u64::try_from(i).unwrap_or(u64::MAX).saturating_add(1)
            })
    }

    /// The plan `code` gave.
    pub(crate) fn from_code(code: u64) -> Option<Plan> {
        let i = usize::try_from(code.checked_sub(1)?).ok()?;
        Plan::ALL.get(i).copied()
    }
}

impl std::fmt::Display for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the planner (`runtime/plan.rs`) chooses from: what the user
/// forced, and figures measured on rank 0's device that every rank shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tuning {
    pub algorithm: Algorithm,
    /// A plan forced by the user, for the collectives that offer it.
    pub plan: Option<Plan>,
    pub cost: CostModel,
    pub rates: Rates,
    /// Whether the ring between ranks of their own devices folds on the
    /// host (`algo/fold.rs`): where rank 0's adapter is the CPU.
    pub host_fold: bool,
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
        ]);
        w
    }

    /// This tuning with the figures `words` (from `figures`) give.
    #[cfg(feature = "mpi")]
    pub(crate) fn with_figures(self, words: &[u64]) -> Option<Tuning> {
        match words {
            [c0, c1, c2, host, device, fold, ..] => Some(Tuning {
                cost: CostModel::from_words(&[*c0, *c1, *c2])?,
                rates: Rates {
                    host: f64::from_bits(*host),
                    device: f64::from_bits(*device),
                },
                host_fold: *fold != 0,
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

/// The plans `kind` offers, the default way first after `Direct`.
pub(crate) fn offered(kind: Kind) -> &'static [Plan] {
    match kind {
        Kind::AllReduce => &[
            Plan::Direct,
            Plan::DeviceRing,
            Plan::HostRing,
            Plan::OneShot,
        ],
        Kind::AllReduceCoalesced
        | Kind::ReduceScatter
        | Kind::ReduceScatterCoalesced
        | Kind::AllGather
        | Kind::AllGatherCoalesced
        | Kind::Barrier
        | Kind::Split => &[Plan::Direct, Plan::DeviceRing],
        Kind::Reduce => &[Plan::Direct, Plan::Chain],
        Kind::AllToAll => &[Plan::Direct, Plan::Pairwise],
        Kind::Gather | Kind::Scatter => &[Plan::Direct, Plan::Star],
        Kind::Send | Kind::Recv => &[Plan::PointToPoint],
        // Units say their own (`Collective::plans`).
        _ => &[],
    }
}

/// Whether the direct kernels can run a collective here: `None` when the
/// ranks do not share a device, else `Ok` or why they cannot.
pub(crate) type DirectVerdict = Option<Result<(), String>>;

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
        return match (forced, direct) {
            (Plan::Direct, None) => Err(format!(
                "the plan direct was forced, but the {n} ranks do not share one device: its \
                 kernels read every rank's buffers, so they need the ranks on one device \
                 (Placement::SharedDevice)"
            )),
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
    if let Collective::AllReduce { dtype, len, .. } = what {
        let bytes = dtype.words(*len).saturating_mul(4);
        match tuning.algorithm {
            Algorithm::Ring => return Ok(ring),
            Algorithm::OneShot => return Ok(Plan::OneShot),
            _ => {}
        }
        if matches!(direct, Some(Ok(()))) {
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_codes_too() {
        for p in Plan::ALL {
            assert_eq!(Plan::parse(p.name()), Some(p));
            assert_eq!(Plan::from_code(Plan::code(Some(p))), Some(p));
        }
        assert_eq!(Plan::parse("HOST_RING"), Some(Plan::HostRing));
        assert_eq!(Plan::parse("ring"), None);
        assert_eq!(Plan::from_code(Plan::code(None)), None);
    }
}
