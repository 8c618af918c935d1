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
//! was measured under (`api/tune/cache.rs`), its last says it ended; each
//! point keeps its spread, so that the placement rule and healing can
//! tell a difference from noise. A file that does not parse, or was
//! measured under another key, is refused with the reason; lines that
//! start with `#` are comments, so that what `wgpu-collectives tune`
//! prints can be given back as it is.

use crate::runtime::cost::CostModel;
use crate::runtime::fingerprint::Kind;
use crate::runtime::plan::Plan;

/// The first line of a table's text.
const FORMAT: &str = "wgpu-collectives tuning 3";

/// One timed size of one plan: bytes per rank, the median seconds of its
/// calls, and their spread (interquartile range over the median).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Point {
    pub bytes: f64,
    pub secs: f64,
    pub spread: f64,
}

/// One plan's timed cost for one kind of collective: its points, by
/// ascending size.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cost {
    points: Vec<Point>,
}

impl Cost {
    /// The cost through `points` (bytes, seconds), in any order, spread
    /// unknown; `None` without one, or with one not finite or below zero.
    #[cfg(test)]
    pub(crate) fn new(points: Vec<(f64, f64)>) -> Option<Cost> {
        Cost::from_points(
            points
                .into_iter()
                .map(|(bytes, secs)| Point {
                    bytes,
                    secs,
                    spread: 0.0,
                })
                .collect(),
        )
    }

    /// The cost through `points`, in any order; `None` without one, or
    /// with a figure not finite or below zero.
    pub(crate) fn from_points(mut points: Vec<Point>) -> Option<Cost> {
        if points.is_empty()
            || points.iter().any(|p| {
                ![p.bytes, p.secs, p.spread]
                    .iter()
                    .all(|v| v.is_finite() && *v >= 0.0)
            })
        {
            return None;
        }
        points.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
        points.dedup_by(|a, b| a.bytes == b.bytes);
        Some(Cost { points })
    }

    /// This cost with the point at `p.bytes` set to `p` (added where
    /// there was none).
    pub(crate) fn with(&self, p: Point) -> Cost {
        let mut points: Vec<Point> = self
            .points
            .iter()
            .copied()
            .filter(|q| q.bytes != p.bytes)
            .collect();
        points.push(p);
        points.sort_by(|a, b| a.bytes.total_cmp(&b.bytes));
        Cost { points }
    }

    /// The largest size it was timed at (bytes).
    pub(crate) fn largest(&self) -> f64 {
        self.points.last().map_or(0.0, |p| p.bytes)
    }

    /// The points it was made from.
    pub(crate) fn points(&self) -> &[Point] {
        &self.points
    }

    /// The spread of the timed point nearest `bytes` (by ratio).
    pub(crate) fn spread_near(&self, bytes: usize) -> f64 {
        let x = bytes.max(1) as f64;
        let d = |p: &Point| (p.bytes.max(1.0) / x).ln().abs();
        self.points
            .iter()
            .min_by(|a, b| d(a).total_cmp(&d(b)))
            .map_or(0.0, |p| p.spread)
    }

    /// Its estimate of a call of `bytes`, in seconds (never below zero).
    pub(crate) fn at(&self, bytes: usize) -> f64 {
        let x = bytes as f64;
        let p = &self.points;
        let (Some(first), Some(last)) = (p.first(), p.last()) else {
            return 0.0;
        };
        if x <= first.bytes {
            return first.secs;
        }
        if let Some((a, b)) = p
            .windows(2)
            .map(|w| (w[0], w[1]))
            .find(|(_, b)| x <= b.bytes)
        {
            // Between two timed sizes: the line through them.
            return a.secs + (b.secs - a.secs) * (x - a.bytes) / (b.bytes - a.bytes);
        }
        // Beyond the largest: the last range's line, never falling.
        match p.len().checked_sub(2).and_then(|i| p.get(i)) {
            Some(a) => {
                let slope = ((last.secs - a.secs) / (last.bytes - a.bytes)).max(0.0);
                last.secs + slope * (x - last.bytes)
            }
            // One size only: its time per byte.
            None if first.bytes > 0.0 => first.secs * x / first.bytes,
            None => first.secs,
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
    /// Whether it was timed with the ranks meeting on one device (the
    /// placement a given table asks for); `None`: not said.
    pub shared: Option<bool>,
    /// When it was measured (seconds since 1970), when known.
    pub measured: Option<u64>,
    /// Some point's spread stayed too high to trust: the world that
    /// measured it uses it, the next measures again.
    pub second_look: bool,
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
            .flat_map(|e| e.cost.points().iter().map(|p| p.bytes))
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
        if let Some(t) = self.measured {
            s += &format!("measured {t}\n");
        }
        if let Some(shared) = self.shared {
            s += if shared {
                "placement shared\n"
            } else {
                "placement per-rank\n"
            };
        }
        for e in &self.entries {
            s += &format!("{} {}", e.kind.name(), e.plan.name());
            for p in e.cost.points() {
                s += &format!(" {}:{:e}~{:.3}", p.bytes, p.secs, p.spread);
            }
            s += "\n";
        }
        s += if self.host_fold {
            "host-fold same-bits\n"
        } else {
            "host-fold other-bits\n"
        };
        s += &format!("kernel-units {}\n", self.units);
        if self.second_look {
            s += "second-look\n";
        }
        s + "end\n"
    }

    /// The key line of `text`, if it has one.
    pub(crate) fn key_of(text: &str) -> Option<&str> {
        text.lines()
            .filter(|l| !is_comment(l))
            .nth(1)
            .and_then(|l| l.trim_end().strip_prefix("key "))
    }

    /// The table `text` holds, when it was measured under `key` (`None`:
    /// under any key, as a table a user gives); else why not. Blank lines
    /// and lines that start with `#` are comments.
    pub(crate) fn from_text(text: &str, key: Option<&str>) -> Result<Table, String> {
        let mut lines = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !is_comment(l))
            .map(|(i, l)| (i.saturating_add(1), l.trim_end()));
        if lines.next().map(|l| l.1) != Some(FORMAT) {
            return Err(format!("not a tuning table of this format ({FORMAT:?})"));
        }
        match (lines.next().and_then(|l| l.1.strip_prefix("key ")), key) {
            (Some(k), Some(key)) if k != key => {
                return Err(format!("measured under {}, not {key:?}", quote(k)));
            }
            (Some(_), _) => {}
            (None, _) => return Err("no key line".into()),
        }
        let mut t = Table::default();
        let mut host_fold = None;
        let mut units = None;
        let mut ended = false;
        for (no, line) in lines {
            if ended {
                return Err(format!("line {no}: after the end"));
            }
            let bad = || format!("line {no}: {}", quote(line));
            let mut f = line.split_whitespace();
            let (Some(first), second) = (f.next(), f.next()) else {
                return Err(bad());
            };
            match (first, second) {
                ("end", None) => ended = true,
                ("second-look", None) => t.second_look = true,
                ("host-fold", Some("same-bits")) => host_fold = Some(true),
                ("host-fold", Some("other-bits")) => host_fold = Some(false),
                ("placement", Some("shared")) => t.shared = Some(true),
                ("placement", Some("per-rank")) => t.shared = Some(false),
                ("measured", Some(at)) => t.measured = Some(at.parse().map_err(|_| bad())?),
                ("kernel-units", Some(u)) => {
                    units = Some(u.parse::<u64>().ok().filter(|&u| u > 0).ok_or_else(bad)?);
                }
                (kind, Some(plan)) => {
                    let kind = Kind::ALL
                        .iter()
                        .copied()
                        .find(|k| k.name() == kind)
                        .ok_or_else(bad)?;
                    let plan = Plan::parse(plan).ok_or_else(bad)?;
                    let points = f
                        .map(|p| {
                            let (bytes, rest) = p.split_once(':')?;
                            let (secs, spread) = rest.split_once('~').unwrap_or((rest, "0"));
                            Some(Point {
                                bytes: bytes.parse().ok()?,
                                secs: secs.parse().ok()?,
                                spread: spread.parse().ok()?,
                            })
                        })
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(bad)?;
                    let cost = Cost::from_points(points).ok_or_else(bad)?;
                    t.entries.push(Entry { kind, plan, cost });
                }
                _ => return Err(bad()),
            }
        }
        if !ended {
            // Cut short: a line may have lost its last digits.
            return Err("no end line (truncated?)".into());
        }
        t.host_fold = host_fold.ok_or("no host-fold line")?;
        t.units = units.ok_or("no kernel-units line")?;
        Ok(t)
    }

    /// The table with `kind`'s `plan` costed `p` at `p.bytes` (the point
    /// there replaced, or added).
    pub(crate) fn with_point(&self, kind: Kind, plan: Plan, p: Point) -> Table {
        let mut t = self.clone();
        match t
            .entries
            .iter_mut()
            .find(|e| e.kind == kind && e.plan == plan)
        {
            Some(e) => e.cost = e.cost.with(p),
            None => {
                if let Some(cost) = Cost::from_points(vec![p]) {
                    t.entries.push(Entry { kind, plan, cost });
                }
            }
        }
        t
    }
}

/// Most characters of a table's line an error quotes.
const QUOTED: usize = 200;

/// `line` quoted for an error: whole when short, else its first
/// [`QUOTED`] characters and how long it was (a table is text from a file
/// or a user, and a line of megabytes must not make an error as long).
fn quote(line: &str) -> String {
    match line.char_indices().nth(QUOTED) {
        None => format!("{line:?}"),
        Some((cut, _)) => format!(
            "{:?}... ({} characters in all)",
            &line[..cut],
            line.chars().count()
        ),
    }
}

/// Whether a table's line is a comment (or blank).
fn is_comment(line: &str) -> bool {
    let l = line.trim();
    l.is_empty() || l.starts_with('#')
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn a_long_junk_line_is_quoted_in_part_with_its_length() {
        let text = format!("{FORMAT}\nkey k\n{}\nend\n", "x".repeat(10 << 20));
        let why = Table::from_text(&text, None).unwrap_err();
        assert!(why.len() < 400, "{} bytes of error", why.len());
        assert!(why.contains("line 3"), "{why}");
        assert!(
            why.contains(&format!("({} characters in all)", 10 << 20)),
            "{why}"
        );
        assert!(why.contains(&"x".repeat(QUOTED)), "{why}");
        // A short line is quoted whole; a long key likewise cut.
        let short = Table::from_text(&format!("{FORMAT}\nkey k\nbogus line\nend\n"), None);
        assert_eq!(short.unwrap_err(), "line 3: \"bogus line\"");
        let long_key = format!("{FORMAT}\nkey {}\nend\n", "é".repeat(1000));
        let why = Table::from_text(&long_key, Some("mine")).unwrap_err();
        assert!(
            why.contains("(1000 characters in all)") && why.len() < 800,
            "{why}"
        );
    }

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
            ..Table::default()
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
            ..Table::default()
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
            ..Table::default()
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
            ..Table::default()
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
            shared: Some(true),
            measured: Some(1_733_000_000),
            second_look: true,
        };
        let text = t.to_text("llvmpipe|4 ranks");
        assert_eq!(
            Table::from_text(&text, Some("llvmpipe|4 ranks")),
            Ok(t.clone())
        );
        // The spread is kept, to three places.
        let spread = Table {
            entries: vec![Entry {
                kind: Kind::AllReduce,
                plan: Plan::HostRing,
                cost: Cost::from_points(vec![Point {
                    bytes: 4096.0,
                    secs: 1e-4,
                    spread: 0.125,
                }])
                .unwrap(),
            }],
            ..t.clone()
        };
        assert_eq!(
            Table::from_text(&spread.to_text("k"), Some("k")),
            Ok(spread.clone())
        );
        // As a user gives it: comments and blank lines anywhere, any key.
        let given = format!(
            "# printed by wgpu-collectives tune\n\n{}",
            text.replace("end\n", "# the end\nend\n")
        );
        assert_eq!(Table::from_text(&given, None), Ok(t.clone()));
        assert_eq!(Table::key_of(&given), Some("llvmpipe|4 ranks"));
        assert!(Table::from_text(&given, Some("another machine")).is_err());
        assert!(Table::from_text(&text, Some("llvmpipe|8 ranks")).is_err());
        let other = Table {
            host_fold: false,
            ..t.clone()
        };
        let back = Table::from_text(&other.to_text("k"), Some("k"));
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
            &text.replace("placement shared", "placement everywhere"),
            &text.replace("measured 1733000000", "measured yesterday"),
            &text.replace("wgpu-collectives tuning 3", "wgpu-collectives tuning 2"),
        ] {
            assert!(
                Table::from_text(junk, Some("llvmpipe|4 ranks")).is_err(),
                "{junk:?}"
            );
        }
    }
}
