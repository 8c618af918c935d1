//! The tuning table: what timing each plan on the world's own devices
//! found, and the plan it chooses for a size.
//!
//! Rules tuned on one machine choose badly on the next (two machines of
//! the same kind have differed 5x in how fast lavapipe runs the direct
//! kernel), so the engine times every feasible plan where it runs, as
//! cuBLAS and TVM time kernels. Each (kind, plan) is timed at a few sizes
//! and costed piecewise: between two timed sizes, the line through them
//! (a fixed and a per-byte cost for that range); below the smallest, its
//! time; above the largest, the last range's line. One least-squares line
//! over every size was tried first: a plan that is dearer at 16 MiB but
//! cheaper below pulled its line under the winner's there, and the
//! planner chose the slower ring. The planner takes the plan costed lowest
//! at the call's size. The table is text, so that a cache file can hold it
//! and be checked: its first line names the format, its second the key it
//! was measured under (adapter, driver, backend, ranks, placement, crate
//! version), its last says it ended; a file that does not parse, or was measured under another
//! key, is refused with the reason.

use crate::runtime::cost::CostModel;
use crate::runtime::fingerprint::Kind;
use crate::runtime::plan::Plan;

/// The first line of a table's text.
const FORMAT: &str = "wgpu-collectives tuning 2";

/// One plan's timed cost for one kind of collective: seconds at sizes
/// (bytes per rank), ascending.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cost {
    points: Vec<(f64, f64)>,
}

impl Cost {
    /// The cost through `points` (bytes, seconds), in any order; `None`
    /// without one, or with one not finite or below zero.
    pub(crate) fn new(mut points: Vec<(f64, f64)>) -> Option<Cost> {
        if points.is_empty()
            || points
                .iter()
                .any(|&(b, s)| !(b.is_finite() && s.is_finite() && b >= 0.0 && s >= 0.0))
        {
            return None;
        }
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        points.dedup_by(|a, b| a.0 == b.0);
        Some(Cost { points })
    }

    /// The largest size it was timed at (bytes).
    pub(crate) fn largest(&self) -> f64 {
        self.points.last().map_or(0.0, |p| p.0)
    }

    /// The sizes and times it was made from.
    pub(crate) fn points(&self) -> &[(f64, f64)] {
        &self.points
    }

    /// Its estimate of a call of `bytes`, in seconds (never below zero).
    pub(crate) fn at(&self, bytes: usize) -> f64 {
        let x = bytes as f64;
        let p = &self.points;
        let (Some(&first), Some(&last)) = (p.first(), p.last()) else {
            return 0.0;
        };
        if x <= first.0 {
            return first.1;
        }
        if let Some((a, b)) = p.windows(2).map(|w| (w[0], w[1])).find(|(_, b)| x <= b.0) {
            // Between two timed sizes: the line through them.
            return a.1 + (b.1 - a.1) * (x - a.0) / (b.0 - a.0);
        }
        // Beyond the largest: the last range's line, never falling.
        match p.len().checked_sub(2).and_then(|i| p.get(i)) {
            Some(&a) => last.1 + ((last.1 - a.1) / (last.0 - a.0)).max(0.0) * (x - last.0),
            // One size only: its time per byte.
            None if first.0 > 0.0 => first.1 * x / first.0,
            None => first.1,
        }
    }
}

/// The least-squares line (fixed seconds, seconds per byte) through
/// `points`, neither below zero; `None` without a point.
fn fit_line(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let first = points.first()?;
    if points.len() == 1 {
        return Some(if first.0 > 0.0 {
            (0.0, first.1 / first.0)
        } else {
            (first.1, 0.0)
        });
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    let fixed = my - slope * mx;
    if fixed >= 0.0 {
        return Some((fixed, slope));
    }
    // Through the origin instead.
    let sxx0: f64 = points.iter().map(|p| p.0 * p.0).sum();
    let sxy0: f64 = points.iter().map(|p| p.0 * p.1).sum();
    Some((
        0.0,
        if sxx0 > 0.0 {
            (sxy0 / sxx0).max(0.0)
        } else {
            0.0
        },
    ))
}

/// What timing found for one plan of one kind.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub kind: Kind,
    pub plan: Plan,
    pub cost: Cost,
}

/// Every (kind, plan) that was timed.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Table {
    pub entries: Vec<Entry>,
    /// Whether the host's fold gave the adapter's kernels' bits
    /// (`same_bits.rs`): the host ring is offered only then.
    pub host_fold: bool,
    /// Units per invocation the reduction kernel was timed fastest at
    /// (`kernel_shape.rs`).
    pub units: u64,
}

impl Table {
    /// The plan of `kind` costed lowest at `bytes`, among those
    /// `allowed`, with its cost in seconds; `None` when the table has
    /// none for it.
    ///
    /// A plan left untimed at a size others were timed at (pruned, or cut
    /// by the budget) competes only up to 4x the largest size it was
    /// timed at: beyond, its line runs on from small sizes where fixed
    /// costs hid its per-byte cost (the host ring, timed at 4 and 64 KiB
    /// only, was costed under the direct kernels at 1 MiB and chosen at
    /// 0.44x their speed).
    pub(crate) fn best(
        &self,
        kind: Kind,
        bytes: usize,
        allowed: impl Fn(Plan) -> bool,
    ) -> Option<(Plan, f64)> {
        let timed = |e: &Entry| e.cost.largest();
        let mine = || {
            self.entries
                .iter()
                .filter(|e| e.kind == kind && allowed(e.plan))
        };
        let reach = mine().map(timed).fold(0.0, f64::max);
        let need = (bytes as f64).min(reach);
        mine()
            .filter(|e| timed(e) * 4.0 >= need)
            .map(|e| (e.plan, e.cost.at(bytes)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The largest size (bytes per rank) `plan` was timed at for `kind`.
    pub(crate) fn largest(&self, kind: Kind, plan: Plan) -> Option<f64> {
        self.entries
            .iter()
            .find(|e| e.kind == kind && e.plan == plan)
            .map(|e| e.cost.largest())
    }

    /// The plan of `kind` costed lowest at `bytes`, among those `allowed`.
    pub(crate) fn choose(
        &self,
        kind: Kind,
        bytes: usize,
        allowed: impl Fn(Plan) -> bool,
    ) -> Option<Plan> {
        self.best(kind, bytes, allowed).map(|(p, _)| p)
    }

    /// The hop model whose ring all-reduce of `n` ranks best matches the
    /// fastest plan's all-reduce at every size timed (least squares over
    /// the fixed and the per-byte parts, neither below zero), with
    /// `base`'s dispatch cost: how the graph layer prices collectives from
    /// what was measured. `None` without an all-reduce timed.
    pub(crate) fn all_reduce_model(&self, n: usize, base: CostModel) -> Option<CostModel> {
        let steps = n.checked_sub(1).filter(|&s| s > 0)? as f64;
        let mut sizes: Vec<f64> = self
            .entries
            .iter()
            .filter(|e| e.kind == Kind::AllReduce)
            .flat_map(|e| e.cost.points().iter().map(|p| p.0))
            .collect();
        sizes.sort_by(f64::total_cmp);
        sizes.dedup();
        let points: Vec<(f64, f64)> = sizes
            .into_iter()
            .filter_map(|b| Some((b, self.best(Kind::AllReduce, b as usize, |_| true)?.1)))
            .collect();
        let (fixed, per_byte) = fit_line(&points)?;
        // ring_all_reduce: 2(n-1)(alpha + b/(n beta)) + (n-1) dispatch.
        let dispatch = base.dispatch.as_secs_f64();
        let alpha = ((fixed - steps * dispatch) / (2.0 * steps)).max(0.0);
        let beta = if per_byte > 0.0 {
            2.0 * steps / (n as f64 * per_byte)
        } else {
            base.beta
        };
        Some(CostModel {
            alpha: std::time::Duration::try_from_secs_f64(alpha).ok()?,
            beta,
            dispatch: base.dispatch,
        })
    }

    /// Its text, measured under `key` (one line, no newline).
    pub(crate) fn to_text(&self, key: &str) -> String {
        let mut s = format!("{FORMAT}\nkey {key}\n");
        for e in &self.entries {
            s += &format!("{} {}", e.kind.name(), e.plan.name());
            for (bytes, secs) in e.cost.points() {
                s += &format!(" {bytes}:{secs:e}");
            }
            s += "\n";
        }
        s += if self.host_fold {
            "host-fold same-bits\n"
        } else {
            "host-fold other-bits\n"
        };
        s += &format!("kernel-units {}\n", self.units);
        s + "end\n"
    }

    /// The table `text` holds, when it was measured under `key`; else why not.
    pub(crate) fn from_text(text: &str, key: &str) -> Result<Table, String> {
        let mut lines = text.lines();
        if lines.next() != Some(FORMAT) {
            return Err(format!("not a tuning table of this format ({FORMAT:?})"));
        }
        match lines.next().and_then(|l| l.strip_prefix("key ")) {
            Some(k) if k == key => {}
            Some(k) => return Err(format!("measured under {k:?}, not {key:?}")),
            None => return Err("no key line".into()),
        }
        let mut entries = Vec::new();
        let mut host_fold = None;
        let mut units = None;
        let mut ended = false;
        for (i, line) in lines.enumerate() {
            if ended {
                return Err(format!("line {}: after the end", i.saturating_add(3)));
            }
            if line == "end" {
                ended = true;
                continue;
            }
            match line.strip_prefix("host-fold ") {
                Some("same-bits") => {
                    host_fold = Some(true);
                    continue;
                }
                Some("other-bits") => {
                    host_fold = Some(false);
                    continue;
                }
                _ => {}
            }
            let bad = || format!("line {}: {line:?}", i.saturating_add(3));
            if let Some(u) = line.strip_prefix("kernel-units ") {
                units = Some(u.parse::<u64>().ok().filter(|&u| u > 0).ok_or_else(bad)?);
                continue;
            }
            let mut f = line.split_whitespace();
            let (Some(kind), Some(plan)) = (f.next(), f.next()) else {
                return Err(bad());
            };
            let kind = Kind::ALL
                .iter()
                .copied()
                .find(|k| k.name() == kind)
                .ok_or_else(bad)?;
            let plan = Plan::parse(plan).ok_or_else(bad)?;
            let points = f
                .map(|p| {
                    let (b, s) = p.split_once(':')?;
                    Some((b.parse::<f64>().ok()?, s.parse::<f64>().ok()?))
                })
                .collect::<Option<Vec<_>>>()
                .ok_or_else(bad)?;
            let cost = Cost::new(points).ok_or_else(bad)?;
            entries.push(Entry { kind, plan, cost });
        }
        if !ended {
            // Cut short: a line may have lost its last digits.
            return Err("no end line (truncated?)".into());
        }
        let host_fold = host_fold.ok_or("no host-fold line")?;
        let units = units.ok_or("no kernel-units line")?;
        Ok(Table {
            entries,
            host_fold,
            units,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::float_cmp)]
mod tests {
    use super::*;

    fn cost(points: &[(f64, f64)]) -> Cost {
        Cost::new(points.to_vec()).unwrap()
    }

    #[test]
    fn a_cost_goes_through_its_points_and_along_its_ranges() {
        let c = cost(&[(1e6, 3e-3), (0.0, 1e-3), (2e6, 4e-3)]);
        assert_eq!(c.at(0), 1e-3);
        assert_eq!(c.at(1_000_000), 3e-3);
        assert!((c.at(500_000) - 2e-3).abs() < 1e-12);
        // Beyond the largest size, the last range's line.
        assert!((c.at(4_000_000) - 6e-3).abs() < 1e-12);
        // Below the smallest, its time; never below zero.
        let c = cost(&[(4096.0, 5e-4), (65536.0, 4e-4), (1e6, 1e-3)]);
        assert_eq!(c.at(16), 5e-4);
        assert_eq!(c.at(65536), 4e-4);
        // A falling range costs no less than where it ended.
        let falling = cost(&[(1e3, 5e-3), (1e6, 1e-3)]);
        assert_eq!(falling.at(10_000_000), 1e-3);
        // One size: its time per byte.
        assert_eq!(cost(&[(1e3, 1e-3)]).at(2000), 2e-3);
        assert_eq!(Cost::new(vec![]), None);
        assert_eq!(Cost::new(vec![(1.0, f64::NAN)]), None);
        assert_eq!(Cost::new(vec![(1.0, -1.0)]), None);
    }

    #[test]
    fn the_table_chooses_the_lowest_cost_among_the_allowed() {
        let t = Table {
            entries: vec![
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::OneShot,
                    cost: cost(&[(0.0, 1e-5), (1e6, 1e-2)]),
                },
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::HostRing,
                    cost: cost(&[(0.0, 1e-3), (1e6, 2e-3)]),
                },
                Entry {
                    kind: Kind::AllGather,
                    plan: Plan::DeviceRing,
                    cost: cost(&[(0.0, 0.0)]),
                },
            ],
            host_fold: true,
            units: 4,
        };
        assert_eq!(
            t.choose(Kind::AllReduce, 1024, |_| true),
            Some(Plan::OneShot)
        );
        assert_eq!(
            t.choose(Kind::AllReduce, 1 << 30, |_| true),
            Some(Plan::HostRing)
        );
        assert_eq!(
            t.choose(Kind::AllReduce, 1024, |p| p != Plan::OneShot),
            Some(Plan::HostRing)
        );
        assert_eq!(t.choose(Kind::Broadcast, 1024, |_| true), None);
        let (plan, secs) = t.best(Kind::AllReduce, 1_000_000, |_| true).unwrap();
        assert_eq!((plan, secs), (Plan::HostRing, 2e-3));
    }

    #[test]
    fn a_plan_slower_where_it_was_timed_is_not_chosen_there() {
        // What one line over every size got wrong: the device ring is
        // cheaper below 16 MiB but dearer at it.
        let ring = cost(&[(4096.0, 2e-4), (1048576.0, 3e-3), (16777216.0, 9e-2)]);
        let host = cost(&[(4096.0, 9e-4), (1048576.0, 4e-3), (16777216.0, 6e-2)]);
        let t = Table {
            entries: vec![
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::DeviceRing,
                    cost: ring,
                },
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::HostRing,
                    cost: host,
                },
            ],
            host_fold: true,
            units: 4,
        };
        assert_eq!(
            t.choose(Kind::AllReduce, 16 << 20, |_| true),
            Some(Plan::HostRing)
        );
        assert_eq!(
            t.choose(Kind::AllReduce, 64 << 20, |_| true),
            Some(Plan::HostRing)
        );
        assert_eq!(
            t.choose(Kind::AllReduce, 1 << 20, |_| true),
            Some(Plan::DeviceRing)
        );
    }

    #[test]
    fn a_plan_untimed_where_others_were_does_not_win_there_by_its_line() {
        // Lavapipe, 4 ranks sharing a device: the host ring was pruned
        // after 64 KiB; its line from there ran under the direct kernels.
        let t = Table {
            entries: vec![
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::Direct,
                    cost: cost(&[
                        (4096.0, 2.7e-4),
                        (65536.0, 3.3e-4),
                        (1048576.0, 1.97e-3),
                        (16777216.0, 1.56e-2),
                    ]),
                },
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::HostRing,
                    cost: cost(&[(4096.0, 1.09e-3), (65536.0, 1.12e-3)]),
                },
            ],
            host_fold: true,
            units: 4,
        };
        for bytes in [1usize << 20, 4 << 20, 64 << 20, 1 << 30] {
            assert_eq!(
                t.choose(Kind::AllReduce, bytes, |_| true),
                Some(Plan::Direct),
                "{bytes}"
            );
        }
        // Where only the host ring may run, it is all there is.
        assert_eq!(
            t.choose(Kind::AllReduce, 1 << 20, |p| p == Plan::HostRing),
            Some(Plan::HostRing)
        );
    }

    #[test]
    fn the_hop_model_fitted_to_a_table_prices_its_best_all_reduce() {
        // 4 ranks, best plan at each size: 1 ms + 1 ns per byte.
        let t = Table {
            entries: vec![Entry {
                kind: Kind::AllReduce,
                plan: Plan::HostRing,
                cost: cost(&[(4096.0, 1e-3 + 4096e-9), (16777216.0, 1e-3 + 16777216e-9)]),
            }],
            host_fold: true,
            units: 4,
        };
        let base = CostModel {
            alpha: std::time::Duration::from_micros(7),
            beta: 1e9,
            dispatch: std::time::Duration::from_micros(30),
        };
        let m = t.all_reduce_model(4, base).unwrap();
        for bytes in [4096usize, 1 << 20, 16 << 20] {
            let want = 1e-3 + bytes as f64 * 1e-9;
            let got = m.ring_all_reduce(4, bytes).as_secs_f64();
            assert!((got - want).abs() < 1e-6, "{bytes}: {got} vs {want}");
        }
        assert_eq!(m.dispatch, base.dispatch);
        assert_eq!(Table::default().all_reduce_model(4, base), None);
        assert_eq!(t.all_reduce_model(1, base), None);
    }

    #[test]
    fn the_text_round_trips_and_refuses_another_key_or_junk() {
        let t = Table {
            entries: vec![Entry {
                kind: Kind::ReduceScatter,
                plan: Plan::Direct,
                cost: cost(&[(4096.0, 1.5e-5), (65536.0, 3.25e-4)]),
            }],
            host_fold: true,
            units: 4,
        };
        let text = t.to_text("llvmpipe|4 ranks");
        assert_eq!(Table::from_text(&text, "llvmpipe|4 ranks"), Ok(t.clone()));
        assert!(Table::from_text(&text, "llvmpipe|8 ranks").is_err());
        let other = Table {
            host_fold: false,
            ..t.clone()
        };
        let back = Table::from_text(&other.to_text("k"), "k");
        assert_eq!(back.map(|b| b.host_fold), Ok(false));
        for junk in [
            "",
            "hello",
            &text.replace("direct", "warp"),
            &text.replace("65536:", "65536"),
            &text.replace("3.25e-4", "-3.25e-4"),
            &text[..text.len() - 9],
            &text.replace("end\n", ""),
            &text.replace("host-fold same-bits\n", ""),
            &text.replace("kernel-units 4\n", ""),
            &text.replace("kernel-units 4\n", "kernel-units 0\n"),
        ] {
            assert!(
                Table::from_text(junk, "llvmpipe|4 ranks").is_err(),
                "{junk:?}"
            );
        }
    }
}
