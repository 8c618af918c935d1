//! From timed calls to a tuning table, on a machine that is busy.
//!
//! A shared machine makes some calls slow: a scheduler hiccup makes one
//! call 10x slow, a build in the next terminal makes every call slow for a
//! second. One sample per point, or a plan dropped on one bad point,
//! turned such moments into a choice cached for good (a direct kernel
//! timed 15x slow at 64 KiB was never timed again, and a ring ran where it
//! was several times faster). So the schedule here, after Triton's
//! `do_bench` and FFTW's planner:
//! - every plan at a size is timed in rounds, the plans interleaved
//!   (A B C, C B A, ...), so that drift and sustained load fall on all of
//!   them alike;
//! - a point is the median of its calls, kept with its spread (the
//!   interquartile range over the median); rounds are added while the
//!   spread is high and the budget lasts;
//! - a point that does not fit its plan's other points (dearer than a
//!   larger size, far above the line through its neighbours, too spread)
//!   or where the fastest plan changes from one size to the next is timed
//!   again, and the look with the lower median counts: load only ever
//!   slows a call;
//! - a plan leaves the race only when it was far behind at two sizes in a
//!   row.
//!
//! The schedule is a function of the samples alone (`run` takes the
//! timer), so every process of a world over MPI takes the same steps from
//! the same agreed samples, and the tests feed it noise.

use crate::runtime::fingerprint::Kind;
use crate::runtime::plan::Plan;
use crate::runtime::stats::summary;
use crate::runtime::tune::{Cost, Entry, Point};

/// One plan's timings of one kind: at each size, its looks (each the
/// times of its calls, in seconds).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Series {
    pub kind: Kind,
    pub plan: Plan,
    pub sizes: Vec<Timed>,
}

/// A size's looks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Timed {
    pub bytes: usize,
    pub looks: Vec<Vec<f64>>,
}

impl Timed {
    /// The point it makes: the look with the lowest median.
    pub(crate) fn point(&self) -> Option<Point> {
        self.looks
            .iter()
            .filter_map(|l| summary(l))
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(secs, spread)| Point {
                bytes: self.bytes as f64,
                secs,
                spread,
            })
    }
}

impl Series {
    fn at(&self, bytes: usize) -> Option<&Timed> {
        self.sizes.iter().find(|t| t.bytes == bytes)
    }

    fn point_at(&self, bytes: usize) -> Option<Point> {
        self.at(bytes).and_then(Timed::point)
    }

    /// Its points, by size.
    fn points(&self) -> Vec<Point> {
        self.sizes.iter().filter_map(Timed::point).collect()
    }
}

/// A point whose spread is above this is not trusted: it is timed again,
/// and a table that keeps one is cached marked for a second look.
pub(crate) const SPREAD: f64 = 0.3;

/// A point this many times above the line through its neighbours (or
/// above the line its smaller sizes run on, at the largest size) is timed
/// again.
const JUMP: f64 = 1.5;

/// A plan leaves the race at larger sizes only when it took more than
/// this many times its kind's best at each of its last two sizes (on
/// lavapipe, 4 ranks, no plan that far behind at 1 MiB came within 10% of
/// the best at 16 MiB).
pub(crate) const PRUNE: f64 = 2.5;

/// How often a size is timed: rounds (every contender once a round, the
/// order reversed each round), calls per contender a round, and at most
/// this many rounds while a spread stays high.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rounds {
    pub rounds: usize,
    pub calls: usize,
    pub most: usize,
}

/// The sizes a table is timed at (bytes per rank), and how often.
pub(crate) fn rounds(bytes: usize) -> Rounds {
    match bytes {
        b if b <= 64 << 10 => Rounds {
            rounds: 5,
            calls: 3,
            most: 8,
        },
        b if b <= 1 << 20 => Rounds {
            rounds: 4,
            calls: 2,
            most: 6,
        },
        _ => Rounds {
            rounds: 3,
            calls: 1,
            most: 4,
        },
    }
}

/// The sizes timed.
pub(crate) const SIZES: [usize; 4] = [4 << 10, 64 << 10, 1 << 20, 16 << 20];

/// What the schedule asks of whoever times: `calls` calls of `kind` of
/// `bytes` per rank under `plan`, their seconds (`None`: the plan does not
/// run this; `warm`: one call first, not timed).
pub(crate) struct Ask {
    pub kind: Kind,
    pub plan: Plan,
    pub bytes: usize,
    pub calls: usize,
    pub warm: bool,
}

/// Times `contenders` at `sizes` through `time`, as the module says, and
/// returns what was timed. `spent` says when the budget is gone: past it,
/// no size above 1 MiB starts, no rounds are added and no second look is
/// taken above 1 MiB.
pub(crate) fn run<E>(
    contenders: &[(Kind, Plan)],
    sizes: &[usize],
    mut time: impl FnMut(&Ask) -> Result<Option<Vec<f64>>, E>,
    mut spent: impl FnMut() -> Result<bool, E>,
) -> Result<Vec<Series>, E> {
    let mut series: Vec<Series> = contenders
        .iter()
        .map(|&(kind, plan)| Series {
            kind,
            plan,
            sizes: Vec::new(),
        })
        .collect();
    // Whether a contender still runs: one that could not run a size
    // runs no larger one.
    let mut alive = vec![true; series.len()];
    for (i, &bytes) in sizes.iter().enumerate() {
        let big = bytes > 1 << 20;
        if big && spent()? {
            tracing::debug!(bytes, "tuning: budget spent");
            break;
        }
        let done = sizes.get(..i).unwrap_or(&[]);
        // A plan about to leave the race has its last point timed again
        // first, beside the best there: one bad look must not prune it.
        if let Some(&last) = done.last() {
            let doubted: Vec<usize> = (0..series.len())
                .filter(|&s| alive.get(s) == Some(&true) && pruned(&series, s, done))
                .filter(|&s| {
                    series
                        .get(s)
                        .and_then(|x| x.at(last))
                        .is_some_and(|t| t.looks.len() == 1)
                })
                .collect();
            if !(doubted.is_empty() || (last > 1 << 20 && spent()?)) {
                let mut turn = doubted.clone();
                for &s in &doubted {
                    let best = series.get(s).and_then(|x| best(&series, x.kind, last));
                    let rival =
                        (0..series.len()).find(|&r| {
                            series.get(r).zip(series.get(s)).zip(best).is_some_and(
                                |((x, y), (plan, _))| x.kind == y.kind && x.plan == plan,
                            )
                        });
                    if let Some(r) = rival.filter(|r| !turn.contains(r)) {
                        turn.push(r);
                    }
                }
                look(&mut series, &turn, last, &mut alive, &mut time, &mut spent)?;
            }
        }
        // Far behind twice, the second time confirmed: out for good.
        for s in 0..series.len() {
            if alive.get(s) == Some(&true) && pruned(&series, s, done) {
                if let Some(a) = alive.get_mut(s) {
                    *a = false;
                }
            }
        }
        let turn: Vec<usize> = (0..series.len())
            .filter(|&s| alive.get(s) == Some(&true))
            .collect();
        let grown = look(&mut series, &turn, bytes, &mut alive, &mut time, &mut spent)?;
        if !grown {
            break;
        }
    }
    // Second looks: each suspect size, its suspects interleaved.
    let suspects = second_looks(&series);
    let mut by_size: Vec<usize> = suspects.iter().map(|&(_, b)| b).collect();
    by_size.sort_unstable();
    by_size.dedup();
    for bytes in by_size {
        if bytes > 1 << 20 && spent()? {
            continue;
        }
        let turn: Vec<usize> = suspects
            .iter()
            .filter(|&&(_, b)| b == bytes)
            .map(|&(s, _)| s)
            .collect();
        tracing::debug!(bytes, suspects = turn.len(), "tuning: a second look");
        look(&mut series, &turn, bytes, &mut alive, &mut time, &mut spent)?;
    }
    Ok(series)
}

/// One look at `bytes` for the contenders `turn`, interleaved in rounds;
/// whether any of them ran it.
fn look<E>(
    series: &mut [Series],
    turn: &[usize],
    bytes: usize,
    alive: &mut [bool],
    time: &mut impl FnMut(&Ask) -> Result<Option<Vec<f64>>, E>,
    spent: &mut impl FnMut() -> Result<bool, E>,
) -> Result<bool, E> {
    let how = rounds(bytes);
    let mut got: Vec<Option<Vec<f64>>> = vec![Some(Vec::new()); turn.len()];
    let mut round = 0usize;
    loop {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..turn.len()).collect()
        } else {
            (0..turn.len()).rev().collect()
        };
        for k in order {
            let (Some(&s), Some(slot)) = (turn.get(k), got.get_mut(k)) else {
                continue;
            };
            let (Some(samples), Some(one)) = (slot.as_mut(), series.get(s)) else {
                continue;
            };
            let ask = Ask {
                kind: one.kind,
                plan: one.plan,
                bytes,
                calls: how.calls,
                warm: round == 0 && bytes > 1 << 20,
            };
            match time(&ask)? {
                Some(t) => samples.extend(t),
                None => *slot = None,
            }
        }
        round = round.saturating_add(1);
        if round < how.rounds {
            continue;
        }
        let unsettled = got
            .iter()
            .flatten()
            .any(|s| summary(s).is_some_and(|(_, spread)| spread > SPREAD));
        if !unsettled || round >= how.most || spent()? {
            break;
        }
    }
    let mut any = false;
    for (k, samples) in got.into_iter().enumerate() {
        let Some(&s) = turn.get(k) else { continue };
        match samples {
            Some(samples) if !samples.is_empty() => {
                any = true;
                if let Some(one) = series.get_mut(s) {
                    match one.sizes.iter_mut().find(|t| t.bytes == bytes) {
                        Some(t) => t.looks.push(samples),
                        None => one.sizes.push(Timed {
                            bytes,
                            looks: vec![samples],
                        }),
                    }
                }
            }
            _ => {
                if let Some(a) = alive.get_mut(s) {
                    *a = false;
                }
            }
        }
    }
    Ok(any)
}

/// The best (lowest) time of `kind` at `bytes` among `series`.
fn best(series: &[Series], kind: Kind, bytes: usize) -> Option<(Plan, f64)> {
    series
        .iter()
        .filter(|s| s.kind == kind)
        .filter_map(|s| s.point_at(bytes).map(|p| (s.plan, p.secs)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Whether contender `s` leaves the race before the next size: it was
/// timed at the last two of `done` and took more than [`PRUNE`] times its
/// kind's best at both.
pub(crate) fn pruned(series: &[Series], s: usize, done: &[usize]) -> bool {
    let Some(one) = series.get(s) else {
        return true;
    };
    let last_two = match done {
        [.., a, b] => [*a, *b],
        _ => return false,
    };
    last_two.iter().all(|&bytes| {
        let (Some(mine), Some((_, best))) = (one.point_at(bytes), best(series, one.kind, bytes))
        else {
            return false;
        };
        mine.secs > best * PRUNE
    })
}

/// The (contender, size) points to time again: a point dearer than its
/// plan's next larger size, far above the line through its neighbours
/// (at the largest size, above the line of the range below), or too
/// spread; and where a kind's fastest plan changes between two sizes, both
/// plans at both sizes (one bad point there would move a choice). Points
/// already looked at twice are left as they are.
pub(crate) fn second_looks(series: &[Series]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    let mut add = |s: usize, bytes: usize| {
        let once = series
            .get(s)
            .and_then(|x| x.at(bytes))
            .is_some_and(|t| t.looks.len() == 1);
        if once && !out.contains(&(s, bytes)) {
            out.push((s, bytes));
        }
    };
    for (s, one) in series.iter().enumerate() {
        let p = one.points();
        for (i, pt) in p.iter().enumerate() {
            let bytes = pt.bytes as usize;
            let prev = i.checked_sub(1).and_then(|j| p.get(j));
            let next = p.get(i.saturating_add(1));
            let line = match (prev, next) {
                (Some(a), Some(b)) => {
                    Some(a.secs + (b.secs - a.secs) * (pt.bytes - a.bytes) / (b.bytes - a.bytes))
                }
                (Some(a), None) => {
                    let before = i.checked_sub(2).and_then(|j| p.get(j));
                    let slope = match before {
                        Some(z) => ((a.secs - z.secs) / (a.bytes - z.bytes)).max(0.0),
                        None if a.bytes > 0.0 => a.secs / a.bytes,
                        None => 0.0,
                    };
                    Some(a.secs + slope * (pt.bytes - a.bytes))
                }
                _ => None,
            };
            let floor = prev.map_or(0.0, |a| a.secs);
            let jumps = line.is_some_and(|l| pt.secs > l.max(floor) * JUMP);
            let falls = next.is_some_and(|b| pt.secs > b.secs * JUMP);
            if jumps || falls || pt.spread > SPREAD {
                add(s, bytes);
            }
        }
    }
    // Where the winner changes.
    let mut kinds: Vec<Kind> = series.iter().map(|s| s.kind).collect();
    kinds.dedup();
    for kind in kinds {
        for w in sizes_of(series, kind).windows(2) {
            let [a, b] = [w[0], w[1]];
            let (Some((pa, _)), Some((pb, _))) = (best(series, kind, a), best(series, kind, b))
            else {
                continue;
            };
            if pa == pb {
                continue;
            }
            for (s, one) in series.iter().enumerate() {
                if one.kind == kind && (one.plan == pa || one.plan == pb) {
                    add(s, a);
                    add(s, b);
                }
            }
        }
    }
    out
}

/// The sizes any plan of `kind` was timed at, ascending.
pub(crate) fn sizes_of(series: &[Series], kind: Kind) -> Vec<usize> {
    let mut sizes: Vec<usize> = series
        .iter()
        .filter(|s| s.kind == kind)
        .flat_map(|s| s.sizes.iter().map(|t| t.bytes))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The table's entries: each contender's points.
pub(crate) fn entries(series: &[Series]) -> Vec<Entry> {
    series
        .iter()
        .filter_map(|s| {
            Cost::from_points(s.points()).map(|cost| Entry {
                kind: s.kind,
                plan: s.plan,
                cost,
            })
        })
        .collect()
}

/// Whether a point the planner decides by is still too spread to trust
/// after its second look: the table is then cached marked for one.
pub(crate) fn doubtful(series: &[Series]) -> bool {
    series
        .iter()
        .flat_map(Series::points)
        .any(|p| p.spread > SPREAD)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::arithmetic_side_effects,
    reason = "a test: small sizes, a failed expectation is a failed test"
)]
mod tests {
    use super::*;
    use crate::runtime::tune::Table;

    /// A clean machine: seconds per call of each plan of all_reduce and
    /// all_gather (fixed + per byte), with crossovers: the host ring wins
    /// at 4 KiB, the direct kernel from 64 KiB; the device ring is never
    /// best, the one-shot only at the smallest sizes of all_gather.
    fn clean(kind: Kind, plan: Plan, bytes: usize) -> f64 {
        let b = bytes as f64;
        match (kind, plan) {
            (Kind::AllReduce, Plan::Direct) => 3.0e-4 + 1.0e-9 * b,
            (Kind::AllReduce, Plan::HostRing) => 1.0e-4 + 3.0e-9 * b,
            (Kind::AllReduce, Plan::DeviceRing) => 9.0e-4 + 2.5e-9 * b,
            (Kind::AllReduce, Plan::OneShot) => 2.0e-4 + 8.0e-9 * b,
            (Kind::AllGather, Plan::Direct) => 2.0e-4 + 0.6e-9 * b,
            (_, _) => 1.5e-4 + 2.0e-9 * b,
        }
    }

    const CONTENDERS: [(Kind, Plan); 6] = [
        (Kind::AllReduce, Plan::Direct),
        (Kind::AllReduce, Plan::HostRing),
        (Kind::AllReduce, Plan::DeviceRing),
        (Kind::AllReduce, Plan::OneShot),
        (Kind::AllGather, Plan::Direct),
        (Kind::AllGather, Plan::DeviceRing),
    ];

    /// A generator of the same noise every run (xorshift).
    struct Noise(u64);
    impl Noise {
        fn unit(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// The table timing under `noisy` gives (it maps a clean time, the
    /// ask and its look number to a noisy time).
    fn tuned(mut noisy: impl FnMut(f64, &Ask, usize) -> f64) -> Table {
        let mut looks = std::collections::HashMap::new();
        let series = run(
            &CONTENDERS,
            &SIZES,
            |ask: &Ask| -> Result<Option<Vec<f64>>, ()> {
                // The look: how many rounds at this size this contender has had.
                let n = looks.entry((ask.kind, ask.plan, ask.bytes)).or_insert(0);
                let clean = clean(ask.kind, ask.plan, ask.bytes);
                let look = *n / rounds(ask.bytes).rounds;
                *n += 1;
                Ok(Some(
                    (0..ask.calls).map(|_| noisy(clean, ask, look)).collect(),
                ))
            },
            || Ok(false),
        )
        .unwrap();
        Table {
            entries: entries(&series),
            ..Table::default()
        }
    }

    /// The plan each kind chooses at sizes across the range and past it.
    fn choices(t: &Table) -> Vec<(Kind, usize, Option<Plan>)> {
        let mut v = Vec::new();
        for kind in [Kind::AllReduce, Kind::AllGather] {
            let mut b = 1usize << 10;
            while b <= 256 << 20 {
                v.push((kind, b, t.choose(kind, b, |_| true)));
                b *= 2;
            }
        }
        v
    }

    #[test]
    fn clean_samples_choose_the_clean_winners() {
        let t = tuned(|c, _, _| c);
        let c = choices(&t);
        let at = |kind, b: usize| c.iter().find(|x| x.0 == kind && x.1 == b).unwrap().2;
        assert_eq!(at(Kind::AllReduce, 4 << 10), Some(Plan::HostRing));
        assert_eq!(at(Kind::AllReduce, 1 << 20), Some(Plan::Direct));
        assert_eq!(at(Kind::AllReduce, 64 << 20), Some(Plan::Direct));
        assert_eq!(at(Kind::AllGather, 16 << 20), Some(Plan::Direct));
    }

    #[test]
    fn ten_x_spikes_in_a_fifth_of_the_samples_change_no_choice() {
        let want = choices(&tuned(|c, _, _| c));
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        let got = choices(&tuned(|c, _, _| {
            // +-3% jitter on every call, and one call in five 10x.
            let jitter = 1.0 + 0.06 * (noise.unit() - 0.5);
            if noise.unit() < 0.2 {
                c * 10.0
            } else {
                c * jitter
            }
        }));
        assert_eq!(got, want);
    }

    #[test]
    fn a_plan_slowed_3x_through_one_of_its_points_is_timed_again() {
        let want = choices(&tuned(|c, _, _| c));
        // Sustained load on one plan for the whole window of one point's
        // first look, at each point of the plans that win somewhere.
        for (kind, plan) in [
            (Kind::AllReduce, Plan::Direct),
            (Kind::AllReduce, Plan::HostRing),
            (Kind::AllGather, Plan::Direct),
        ] {
            for bytes in SIZES {
                let got = choices(&tuned(|c, ask, look| {
                    if ask.kind == kind && ask.plan == plan && ask.bytes == bytes && look == 0 {
                        c * 3.0
                    } else {
                        c
                    }
                }));
                assert_eq!(got, want, "{kind:?} {plan} slowed at {bytes}");
            }
        }
    }

    #[test]
    fn a_bimodal_plan_is_costed_by_its_usual_mode() {
        let want = choices(&tuned(|c, _, _| c));
        let mut noise = Noise(42);
        // The direct kernel: one call in three at 1.8x (a second queue's
        // work landing on it), the others as clean.
        let got = choices(&tuned(|c, ask, _| {
            if ask.plan == Plan::Direct && noise.unit() < 0.34 {
                c * 1.8
            } else {
                c
            }
        }));
        assert_eq!(got, want);
    }

    #[test]
    fn no_plan_is_pruned_on_one_point() {
        // The direct kernel 20x slow at 64 KiB's first look only: it is
        // still timed at 1 and 16 MiB.
        let mut looks = std::collections::HashMap::new();
        let series = run(
            &CONTENDERS[..3],
            &SIZES,
            |ask: &Ask| -> Result<Option<Vec<f64>>, ()> {
                let n = looks.entry((ask.plan, ask.bytes)).or_insert(0);
                let slow = ask.plan == Plan::Direct
                    && ask.bytes == 64 << 10
                    && *n < rounds(ask.bytes).rounds;
                *n += 1;
                let c = clean(ask.kind, ask.plan, ask.bytes);
                Ok(Some(vec![if slow { c * 20.0 } else { c }; ask.calls]))
            },
            || Ok(false),
        )
        .unwrap();
        let direct = &series[0];
        assert_eq!(
            direct.sizes.iter().map(|t| t.bytes).collect::<Vec<_>>(),
            SIZES.to_vec()
        );
        // And the bad point had its second look.
        let bad = direct.at(64 << 10).unwrap();
        assert_eq!(bad.looks.len(), 2);
        assert!(
            (bad.point().unwrap().secs - clean(Kind::AllReduce, Plan::Direct, 64 << 10)).abs()
                < 1e-12
        );
    }

    #[test]
    fn a_plan_far_behind_twice_leaves_the_race() {
        // The device ring is more than 2.5x the best at 4 and 64 KiB.
        let series = run(
            &CONTENDERS[..3],
            &SIZES,
            |ask: &Ask| -> Result<Option<Vec<f64>>, ()> {
                let c = if ask.plan == Plan::DeviceRing {
                    1.0
                } else {
                    clean(ask.kind, ask.plan, ask.bytes)
                };
                Ok(Some(vec![c; ask.calls]))
            },
            || Ok(false),
        )
        .unwrap();
        let ring = &series[2];
        assert_eq!(
            ring.sizes.iter().map(|t| t.bytes).collect::<Vec<_>>(),
            vec![4 << 10, 64 << 10]
        );
    }

    #[test]
    fn rounds_interleave_the_contenders_and_reverse() {
        let mut order = Vec::new();
        run(
            &CONTENDERS[..3],
            &SIZES[..1],
            |ask: &Ask| -> Result<Option<Vec<f64>>, ()> {
                order.push(ask.plan);
                Ok(Some(vec![clean(ask.kind, ask.plan, ask.bytes); ask.calls]))
            },
            || Ok(false),
        )
        .unwrap();
        let (d, h, r) = (Plan::Direct, Plan::HostRing, Plan::DeviceRing);
        assert_eq!(&order[..6], &[d, h, r, r, h, d]);
    }

    #[test]
    fn a_spent_budget_stops_the_large_sizes() {
        let mut asked = Vec::new();
        let mut calls = 0;
        run(
            &CONTENDERS[..2],
            &SIZES,
            |ask: &Ask| -> Result<Option<Vec<f64>>, ()> {
                asked.push(ask.bytes);
                Ok(Some(vec![clean(ask.kind, ask.plan, ask.bytes); ask.calls]))
            },
            || {
                calls += 1;
                Ok(true)
            },
        )
        .unwrap();
        assert!(asked.iter().all(|&b| b <= 1 << 20), "{asked:?}");
        assert!(calls > 0);
    }
}
