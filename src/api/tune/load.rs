//! Whether other processes loaded the machine while the plans were timed.
//!
//! A table timed while a build or a training job held a core chose the
//! host ring (5 of 6 sizes, in one sitting) where the direct kernel runs
//! 1.6-4.8x faster on the quiet machine: under that load the two really
//! tie at 16 MiB, and the line through the points carried the tie down to
//! 16 KiB. No estimator tells such a table from a quiet one by its
//! samples alone, since the load is sustained and falls on every plan
//! alike. So, as ATLAS refuses to tune a throttled CPU, the tuner reads
//! what the kernel counts of every CPU's time (`/proc/stat`) and of its
//! own process's (`/proc/self/stat`, every thread: the ranks, the driver's
//! workers) around the timing, and a table timed while other processes
//! used more than [`BUSY`] of the machine decides nothing and is not
//! cached: the planner's rules decide for that world, and the next world
//! times again. Over MPI the processes of a world on one host are not one
//! another's load: each host's share is what its processes did not use.

/// CPU time counted since boot, in clock ticks: every CPU's busy and
/// total time, and this process's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticks {
    pub busy: u64,
    pub total: u64,
    pub own: u64,
}

/// One process's window of timing: its host, and the ticks it counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub host: u64,
    pub busy: u64,
    pub total: u64,
    pub own: u64,
}

impl Window {
    /// The window from `before` to `after` on `host`.
    pub(crate) fn between(host: u64, before: Ticks, after: Ticks) -> Window {
        Window {
            host,
            busy: after.busy.saturating_sub(before.busy),
            total: after.total.saturating_sub(before.total),
            own: after.own.saturating_sub(before.own),
        }
    }

    /// Its four figures, as processes exchange them.
    pub(crate) fn words(&self) -> [u64; 4] {
        [self.host, self.busy, self.total, self.own]
    }

    /// The windows in `words` (four each, as [`words`](Self::words)).
    pub(crate) fn from_words(words: &[u64]) -> Vec<Window> {
        words
            .chunks_exact(4)
            .filter_map(|w| match *w {
                [host, busy, total, own] => Some(Window {
                    host,
                    busy,
                    total,
                    own,
                }),
                _ => None,
            })
            .collect()
    }
}

/// The counts now; `None` where the system does not give them (not
/// Linux, or `/proc` unreadable): nothing is then known of the load.
pub(crate) fn now() -> Option<Ticks> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let own = std::fs::read_to_string("/proc/self/stat").ok()?;
    parse(&stat, &own)
}

/// The counts in `/proc/stat`'s text and `/proc/self/stat`'s.
fn parse(stat: &str, own: &str) -> Option<Ticks> {
    // cpu user nice system idle iowait irq softirq steal guest guest_nice:
    // guest time is counted in user time already.
    let all: Vec<u64> = stat
        .lines()
        .find(|l| l.starts_with("cpu "))?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let total = all.iter().try_fold(0u64, |s, &x| s.checked_add(x))?;
    let idle = all.get(3)?.checked_add(*all.get(4)?)?;
    // Fields after the command's closing parenthesis, from the state (3rd):
    // utime is the 14th, stime the 15th.
    let (_, rest) = own.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(Ticks {
        busy: total.checked_sub(idle)?,
        total,
        own: utime.checked_add(stime)?,
    })
}

/// This host, as the processes of a world tell hosts apart: a hash of
/// the kernel's boot id (processes in containers of one machine share it,
/// as they share the CPU times `/proc/stat` counts).
pub(crate) fn host() -> u64 {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    crate::hash::fnv1a(id.trim().bytes().map(u64::from))
}

/// The largest share of a host's CPU time that processes other than the
/// world's own used during `windows` (one per process): per host, its
/// busy time less what every process of the world there used, over its
/// total; 0 when nothing was counted.
pub(crate) fn others(windows: &[Window]) -> f64 {
    let mut worst: f64 = 0.0;
    for w in windows {
        // Each process read its host's counters at its own moments: the
        // host's figures are the widest window any of them saw.
        let same = || windows.iter().filter(|o| o.host == w.host);
        let busy = same().map(|o| o.busy).max().unwrap_or(0);
        let total = same().map(|o| o.total).max().unwrap_or(0);
        let ours = same().fold(0u64, |s, o| s.saturating_add(o.own));
        if total > 0 {
            worst = worst.max(busy.saturating_sub(ours) as f64 / total as f64);
        }
    }
    worst.clamp(0.0, 1.0)
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::float_cmp)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  915568 3 195836 7450959 1457 0 367 811 0 0\n\
                        cpu0 457000 1 97000 3725000 700 0 180 400 0 0\n";
    const OWN: &str = "14603 (wgpu collectives) S 1 2 3 4 5 6 7 8 9 10 1200 340 0 0 20 0 9";

    #[test]
    fn the_kernels_counts_are_read_as_they_are_laid_out() {
        let t = parse(STAT, OWN).expect("parses");
        let total = 915_568 + 3 + 195_836 + 7_450_959 + 1457 + 367 + 811;
        assert_eq!(t.total, total);
        assert_eq!(t.busy, total - 7_450_959 - 1457);
        // A command name with spaces and parentheses does not shift them.
        assert_eq!(t.own, 1200 + 340);
        assert_eq!(parse("intr 1 2\n", OWN), None);
        assert_eq!(parse(STAT, "14603 (x) S 1"), None);
    }

    fn window(host: u64, busy: u64, total: u64, own: u64) -> Window {
        Window {
            host,
            busy,
            total,
            own,
        }
    }

    #[test]
    fn other_processes_share_is_what_the_world_did_not_use() {
        // A quiet machine: the world used all that was busy.
        assert_eq!(others(&[window(1, 150, 260, 150)]), 0.0);
        // One core of two spun by another process.
        let spun = others(&[window(1, 250, 260, 120)]);
        assert!((spun - 0.5).abs() < 1e-12, "{spun}");
        // Two processes of the world on one host are not each other's load.
        assert_eq!(
            others(&[window(1, 200, 260, 100), window(1, 200, 258, 100)]),
            0.0
        );
        // On two hosts, the worse host counts.
        let two = others(&[window(1, 100, 200, 100), window(2, 150, 200, 50)]);
        assert!((two - 0.5).abs() < 1e-12, "{two}");
        // Nothing counted: nothing known.
        assert_eq!(others(&[]), 0.0);
        assert_eq!(others(&[window(1, 0, 0, 0)]), 0.0);
    }

    #[test]
    fn windows_travel_as_words() {
        let w = [window(7, 1, 2, 3), window(8, 4, 5, 6)];
        let words: Vec<u64> = w.iter().flat_map(Window::words).collect();
        assert_eq!(Window::from_words(&words), w);
        let before = Ticks {
            busy: 10,
            total: 100,
            own: 5,
        };
        let after = Ticks {
            busy: 60,
            total: 300,
            own: 25,
        };
        assert_eq!(Window::between(3, before, after), window(3, 50, 200, 20));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_counts_time() {
        let t = now().expect("/proc/stat and /proc/self/stat are readable here");
        assert!(t.total > 0 && t.busy <= t.total, "{t:?}");
    }
}
