//! How one collective runs: a [`Plan`] names a way to run a collective
//! (the shared device's kernels, a ring whose hops go through host memory,
//! reducing on each rank's device or on the host, a one-shot, a chain, and
//! so on). Each collective offers some of them; `planner.rs` chooses.

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
    /// all_reduce over processes whose ranks share one device each: the
    /// direct kernels reduce each process's ranks into shards on their
    /// device, one rank per process and shard runs the ring between
    /// processes on its shard, and device copies spread the result. Its
    /// fold order differs from the ring's, so for floating-point dtypes it
    /// runs only under [`FoldOrder::Fastest`](crate::FoldOrder::Fastest).
    TwoLevel,
}

impl Plan {
    /// Every plan, in the order the benchmark sweeps them.
    pub const ALL: [Plan; 9] = [
        Plan::Direct,
        Plan::DeviceRing,
        Plan::HostRing,
        Plan::OneShot,
        Plan::Chain,
        Plan::Pairwise,
        Plan::Star,
        Plan::PointToPoint,
        Plan::TwoLevel,
    ];

    /// The plan named `s` (`direct`, `device-ring`, `host-ring`,
    /// `one-shot`, `chain`, `pairwise`, `star`, `p2p`, `two-level`), as
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
            "two-level" | "twolevel" => Some(Plan::TwoLevel),
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
            Plan::TwoLevel => "two-level",
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
