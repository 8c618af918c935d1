//! The tuning table: what timing each plan on the world's own devices
//! found, and the plan it chooses for a size.
//!
//! Rules tuned on one machine choose badly on the next (two machines of
//! the same kind have differed 5x in how fast lavapipe runs the direct
//! kernel), so the engine can time every feasible plan where it runs, as
//! cuBLAS and TVM time kernels. Each (kind, plan) timed at a few sizes is
//! fitted to a line, seconds = fixed + bytes x per_byte (least squares,
//! neither term below zero); the planner takes the plan whose line is
//! lowest at the call's size. The table is text, so that a cache file can
//! hold it and be checked: its first line names the format, its second
//! the key it was measured under (adapter, driver, backend, ranks,
//! placement, crate version); a file that does not parse, or was measured
//! under another key, is refused with the reason.

use crate::runtime::fingerprint::Kind;
use crate::runtime::plan::Plan;

/// The first line of a table's text.
const FORMAT: &str = "wgpu-collectives tuning 1";

/// One plan's cost for one kind of collective, as a line in the bytes
/// each rank moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Line {
    /// Seconds whatever the size.
    pub fixed: f64,
    /// Seconds per byte.
    pub per_byte: f64,
}

impl Line {
    /// Its estimate of a call of `bytes`, in seconds.
    pub(crate) fn at(&self, bytes: usize) -> f64 {
        self.fixed + self.per_byte * bytes as f64
    }

    /// The least-squares line through `points` (bytes, seconds), neither
    /// term below zero; `None` without a point.
    pub(crate) fn fit(points: &[(f64, f64)]) -> Option<Line> {
        let n = points.len() as f64;
        let (first, rest) = points.split_first()?;
        if rest.is_empty() {
            // One size: all of it per byte, or all fixed for an empty call.
            return Some(if first.0 > 0.0 {
                Line {
                    fixed: 0.0,
                    per_byte: first.1 / first.0,
                }
            } else {
                Line {
                    fixed: first.1,
                    per_byte: 0.0,
                }
            });
        }
        let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let slope = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
        let fixed = my - slope * mx;
        if fixed >= 0.0 {
            return Some(Line {
                fixed,
                per_byte: slope,
            });
        }
        // The best line through the origin instead.
        let sxx0: f64 = points.iter().map(|p| p.0 * p.0).sum();
        let sxy0: f64 = points.iter().map(|p| p.0 * p.1).sum();
        Some(Line {
            fixed: 0.0,
            per_byte: if sxx0 > 0.0 {
                (sxy0 / sxx0).max(0.0)
            } else {
                0.0
            },
        })
    }
}

/// What timing found for one plan of one kind.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Entry {
    pub kind: Kind,
    pub plan: Plan,
    pub line: Line,
}

/// Every (kind, plan) that was timed.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Table {
    pub entries: Vec<Entry>,
}

impl Table {
    /// The plan of `kind` whose line is lowest at `bytes`, among those
    /// `allowed`; `None` when the table has none for it.
    pub(crate) fn choose(
        &self,
        kind: Kind,
        bytes: usize,
        allowed: impl Fn(Plan) -> bool,
    ) -> Option<Plan> {
        self.entries
            .iter()
            .filter(|e| e.kind == kind && allowed(e.plan))
            .min_by(|a, b| a.line.at(bytes).total_cmp(&b.line.at(bytes)))
            .map(|e| e.plan)
    }

    /// Its text, measured under `key` (one line, no newline).
    pub(crate) fn to_text(&self, key: &str) -> String {
        let mut s = format!("{FORMAT}\nkey {key}\n");
        for e in &self.entries {
            s += &format!(
                "{} {} {:e} {:e}\n",
                e.kind.name(),
                e.plan.name(),
                e.line.fixed,
                e.line.per_byte
            );
        }
        s
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
        for (i, line) in lines.enumerate() {
            let bad = || format!("line {}: {line:?}", i.saturating_add(3));
            let f: Vec<&str> = line.split_whitespace().collect();
            let [kind, plan, fixed, per_byte] = f[..] else {
                return Err(bad());
            };
            let kind = Kind::ALL
                .iter()
                .copied()
                .find(|k| k.name() == kind)
                .ok_or_else(bad)?;
            let plan = Plan::parse(plan).ok_or_else(bad)?;
            let num = |s: &str| {
                s.parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(bad)
            };
            entries.push(Entry {
                kind,
                plan,
                line: Line {
                    fixed: num(fixed)?,
                    per_byte: num(per_byte)?,
                },
            });
        }
        Ok(Table { entries })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::float_cmp)]
mod tests {
    use super::*;

    #[test]
    fn a_line_fits_points_on_it_and_never_goes_below_zero() {
        let l = Line::fit(&[(0.0, 1e-3), (1e6, 2e-3), (2e6, 3e-3)]).unwrap();
        assert!((l.fixed - 1e-3).abs() < 1e-12 && (l.per_byte - 1e-9).abs() < 1e-18);
        // Falling times: no negative slope, no negative fixed cost.
        let l = Line::fit(&[(1e3, 5e-3), (1e6, 1e-3)]).unwrap();
        assert!(l.per_byte >= 0.0 && l.fixed >= 0.0, "{l:?}");
        // A steep line whose intercept would be negative goes through 0.
        let l = Line::fit(&[(1e3, 1e-6), (1e6, 1e-2)]).unwrap();
        assert_eq!(l.fixed, 0.0);
        assert!(l.per_byte > 0.0);
        assert_eq!(Line::fit(&[]), None);
    }

    #[test]
    fn the_table_chooses_the_lowest_line_among_the_allowed() {
        let line = |fixed, per_byte| Line { fixed, per_byte };
        let t = Table {
            entries: vec![
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::OneShot,
                    line: line(1e-5, 1e-8),
                },
                Entry {
                    kind: Kind::AllReduce,
                    plan: Plan::HostRing,
                    line: line(1e-3, 1e-9),
                },
                Entry {
                    kind: Kind::AllGather,
                    plan: Plan::DeviceRing,
                    line: line(0.0, 0.0),
                },
            ],
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
    }

    #[test]
    fn the_text_round_trips_and_refuses_another_key_or_junk() {
        let t = Table {
            entries: vec![Entry {
                kind: Kind::ReduceScatter,
                plan: Plan::Direct,
                line: Line {
                    fixed: 1.5e-5,
                    per_byte: 3.25e-10,
                },
            }],
        };
        let text = t.to_text("llvmpipe|4 ranks");
        assert_eq!(Table::from_text(&text, "llvmpipe|4 ranks"), Ok(t));
        assert!(Table::from_text(&text, "llvmpipe|8 ranks").is_err());
        for junk in [
            "",
            "hello",
            &text.replace("direct", "warp"),
            &text[..text.len() - 9],
        ] {
            assert!(
                Table::from_text(junk, "llvmpipe|4 ranks").is_err(),
                "{junk:?}"
            );
        }
    }
}
