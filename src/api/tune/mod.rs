//! Tuning a world by timing its plans on its own devices, and the cache
//! that spares the next world on the same machine the measurement.
//!
//! When a world is made (`WGPU_COLLECTIVES_TUNE=measure` or `cached`, or
//! [`WorldConfig::with_tune`]), every plan that can run there times
//! all_reduce, reduce_scatter, all_gather and broadcast at a few sizes on
//! the world's own devices, through a world of its own over the same
//! devices and links of the same kind (`timing.rs`), on a schedule that a
//! busy machine cannot fool (`runtime/estimate.rs`); the planner then
//! chooses from the points (`runtime/tune.rs`) and the table heals as the
//! world runs (`runtime/heal.rs`). The table is cached under a key naming
//! everything that changes speed (`cache.rs`); a table given by the user
//! ([`WorldConfig::with_tune_table`]) is taken as it is, under any key,
//! and never healed. A forced plan or algorithm tunes nothing: it wins
//! anyway.

pub(crate) mod cache;
pub(crate) mod load;
pub(crate) mod placement;
pub(crate) mod timing;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::api::config::{Tune, WorldConfig};
use crate::device::RankDevice;
use crate::error::{Error, Result};
use crate::runtime::cost::Algorithm;
use crate::runtime::estimate::{self, Series};
use crate::runtime::kernel_shape;
use crate::runtime::planner::Tuning;
use crate::runtime::same_bits;
use crate::runtime::tune::Table;

pub(crate) use placement::{Measured, placement_for};
pub(crate) use timing::KINDS;
#[cfg(feature = "mpi")]
pub(crate) use timing::{Over, measure_over};

/// A world's tuning: the table, its text (as the cache holds it), the
/// key it is kept under and the cache file it was read from or written
/// to; whether it heals (not a table the user gave).
#[derive(Debug, Clone)]
pub(crate) struct Tuned {
    pub table: Arc<Table>,
    pub text: String,
    pub key: String,
    pub path: Option<PathBuf>,
    pub heals: bool,
}

/// The table `config` gives ([`WorldConfig::with_tune_table`]), when it
/// gives one; text that is not a table is [`Error::InvalidArgument`]
/// naming the line.
pub(crate) fn given(config: &WorldConfig) -> Result<Option<Tuned>> {
    let Some(text) = config.tune_table() else {
        return Ok(None);
    };
    let table = Table::from_text(text, None).map_err(|why| Error::InvalidArgument {
        rank: None,
        what: format!("WorldConfig::with_tune_table: {why}"),
    })?;
    Ok(Some(Tuned {
        key: Table::key_of(text).unwrap_or_default().to_string(),
        table: Arc::new(table),
        text: text.to_string(),
        path: None,
        #[cfg(not(test))]
        heals: false,
        #[cfg(test)]
        heals: config.given_heals,
    }))
}

/// The tuning table for a world of `devices` (meeting on one device when
/// `meets`), as `config` asks: `None` when it tunes nothing.
pub(crate) fn table_for(
    config: &WorldConfig,
    devices: &[Arc<RankDevice>],
    meets: bool,
    tuning: &Tuning,
    benches: timing::Benches<'_>,
) -> Result<Option<Tuned>> {
    let mode = config.tune()?;
    // A given table is read, and junk refused, whether or not this world
    // then tunes (one rank, a plan forced), as every constructor does.
    let gift = given(config)?;
    let n = devices.len();
    if n < 2 || tuning.forced.plan.is_some() || tuning.forced.algorithm != Algorithm::Auto {
        return Ok(None);
    }
    if let Some(t) = gift {
        return Ok(Some(t));
    }
    if mode == Tune::Off {
        return Ok(None);
    }
    let key = cache::key(devices, n, meets, "one process");
    // One measurement at a time in a process: worlds made at once (a
    // test binary's threads) wait for the first to cache its table, and
    // no timing runs beside another.
    let _one = one_at_a_time();
    if mode == Tune::Cached {
        if let Some((table, text, path)) = cache::read(config, &key) {
            return Ok(Some(Tuned {
                table: Arc::new(table),
                text,
                key,
                path: Some(path),
                heals: true,
            }));
        }
    }
    let Some(first) = devices.first() else {
        return Ok(None);
    };
    let start = Instant::now();
    let tuning = &agreed(first, n, tuning)?;
    let timed = timing::measure(config, devices, meets, tuning, &KINDS, benches)?;
    keep(config, key, meets, &timed, tuning, start).map(Some)
}

/// The table of what was `timed` since `start` under `key`, logged and
/// cached; refused (`refused`) when other processes loaded the machine
/// meanwhile.
pub(crate) fn keep(
    config: &WorldConfig,
    key: String,
    meets: bool,
    timed: &timing::Measurement,
    tuning: &Tuning,
    start: Instant,
) -> Result<Tuned> {
    let limit = config.busy_limit()?;
    if timed.others > limit {
        return Ok(refused(key, meets, tuning, timed.others, limit));
    }
    let series = &timed.series;
    let table = table_of(meets, series, tuning);
    tracing::info!(
        ms = start.elapsed().as_secs_f64() * 1e3,
        entries = table.entries.len(),
        second_look = table.second_look,
        others_percent = (timed.others * 100.0).round(),
        "world: plans timed on its devices"
    );
    let text = table.to_text(&key);
    let path = config
        .tune_cache()
        .map(|dir| dir.join(cache::file_name(&key)))
        .filter(|path| cache::write(path, &text, "the tuning table"));
    Ok(Tuned {
        table: Arc::new(table),
        text,
        key,
        path,
        heals: true,
    })
}

/// The first words of a refused table's text (`refused`).
pub(crate) const REFUSED: &str = "# refused:";

/// The table of a timing during which other processes used `others` of
/// the machine's CPU (`load.rs`), more than `limit`: no points, so that the planner's rules
/// decide, not kept in the cache and not healed, and its text says why.
pub(crate) fn refused(key: String, meets: bool, tuning: &Tuning, others: f64, limit: f64) -> Tuned {
    tracing::warn!(
        others_percent = (others * 100.0).round(),
        limit_percent = (limit * 100.0).round(),
        "world: other processes loaded the machine while its plans were timed; the timings \
         decide nothing and are not cached (the planner's rules decide; the next world times \
         again)"
    );
    let table = table_of(meets, &[], tuning);
    let text = format!(
        "{REFUSED} other processes used {:.0}% of this machine's CPU while the plans were \
         timed (more than {:.0}%): the planner's rules decide, and nothing is cached\n{}",
        others * 100.0,
        limit * 100.0,
        table.to_text(&key)
    );
    Tuned {
        table: Arc::new(table),
        text,
        key,
        path: None,
        heals: false,
    }
}

/// The table of `series`, timed now on ranks that meet on one device
/// when `meets`.
pub(crate) fn table_of(meets: bool, series: &[Series], tuning: &Tuning) -> Table {
    Table {
        entries: estimate::entries(series),
        host_fold: tuning.figures.host_fold,
        units: tuning.figures.units,
        shared: Some(meets),
        measured: Some(cache::now()),
        second_look: estimate::doubtful(series),
    }
}

/// `tuning` with what is measured on `first` before any plan is timed:
/// the reduction kernel's fastest shape (`runtime/kernel_shape.rs`, set on
/// `first`'s kernels), and whether the host folds its bits
/// (`runtime/same_bits.rs`: the host ring is offered only then).
pub(crate) fn agreed(first: &RankDevice, n: usize, tuning: &Tuning) -> Result<Tuning> {
    let ranks = u32::try_from(n).unwrap_or(u32::MAX);
    let mut agreed = tuning.clone();
    agreed.figures.units = kernel_shape::fastest(first)?;
    agreed.figures.host_fold = same_bits::host_fold_agrees(first, ranks)?;
    Ok(agreed)
}

/// Whether the host ring may run under a table given by the user: where
/// the table says the host folded its machine's adapter's bits, and the
/// host folds this one's too (a table from another machine must not make
/// results depend on the plan here).
pub(crate) fn given_host_fold(first: &RankDevice, n: usize, table: &Table) -> Result<bool> {
    let ranks = u32::try_from(n).unwrap_or(u32::MAX);
    Ok(table.host_fold && same_bits::host_fold_agrees(first, ranks)?)
}

/// The process-wide turn to measure (or read what the last turn cached).
pub(crate) fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A measurement that panicked left nothing half-done that matters.
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::float_cmp)]
mod tests {
    use super::*;
    use crate::device::tensor::DType;
    use crate::op::ReduceOp;
    use crate::runtime::collectives::Collective;
    use crate::runtime::collectives::all_reduce::AllReduce;
    use crate::runtime::estimate::Timed;
    use crate::runtime::fingerprint::Kind;
    use crate::runtime::plan::Plan;
    use crate::runtime::planner;

    fn tuning() -> Tuning {
        Tuning::for_tests()
    }

    /// `plan`'s all_reduce taking `secs` per byte (and 50 µs) at 4 KiB to
    /// 16 MiB, five calls a point.
    fn series(plan: Plan, per_byte: f64) -> Series {
        Series {
            kind: Kind::AllReduce,
            plan,
            sizes: estimate::SIZES
                .iter()
                .map(|&bytes| Timed {
                    bytes,
                    looks: vec![vec![50e-6 + per_byte * bytes as f64; 5]],
                })
                .collect(),
        }
    }

    /// The plan the planner runs a 1 MiB all_reduce of 4 ranks on one
    /// device with, from `table`.
    fn chosen(table: &Arc<Table>) -> Plan {
        let what: Collective = AllReduce {
            dtype: DType::F32,
            len: 1 << 18,
            op: ReduceOp::Sum,
        }
        .into();
        let t = Tuning {
            table: Some(table.clone()),
            ..tuning()
        };
        planner::choose_for_tests(&t, &what, 4, planner::Lies::Shared(Ok(()))).expect("a plan")
    }

    #[test]
    fn a_table_timed_while_other_processes_loaded_the_machine_decides_nothing_and_is_not_cached() {
        let dir = std::env::temp_dir().join(format!("wgc-refused-{}", std::process::id()));
        let config = WorldConfig::new(4).with_tune_cache(&dir);
        // Timed so that the host ring wins everywhere (as a busy machine
        // can make it).
        let series = vec![series(Plan::HostRing, 1e-9), series(Plan::Direct, 3e-9)];
        let quiet = measurement(&series, 0.02);
        let kept = keep(
            &config,
            "quiet".into(),
            true,
            &quiet,
            &tuning(),
            Instant::now(),
        )
        .expect("kept");
        assert!(kept.heals);
        assert!(kept.path.as_ref().is_some_and(|p| p.exists()));
        assert_eq!(chosen(&kept.table), Plan::HostRing);

        let busy = measurement(&series, 0.43);
        let refused = keep(
            &config,
            "busy".into(),
            true,
            &busy,
            &tuning(),
            Instant::now(),
        )
        .expect("kept");
        assert!(!refused.heals);
        assert_eq!(refused.path, None);
        assert!(!dir.join(cache::file_name("busy")).exists());
        assert!(refused.table.entries.is_empty());
        assert!(refused.text.starts_with(REFUSED), "{}", refused.text);
        assert!(refused.text.contains("43%"), "{}", refused.text);
        // The rules decide: the direct kernel, where the ranks share a device.
        assert_eq!(chosen(&refused.table), Plan::Direct);
        // The text is a table as `with_tune_table` takes it.
        let again = Table::from_text(&refused.text, None).expect("a table");
        assert!(again.entries.is_empty());
        // A limit of 1 times whatever the load.
        let config = config.with_busy_limit(1.0);
        let anyway = keep(
            &config,
            "busy".into(),
            true,
            &busy,
            &tuning(),
            Instant::now(),
        )
        .expect("kept");
        assert!(anyway.heals && anyway.path.is_some());
        assert_eq!(chosen(&anyway.table), Plan::HostRing);
        assert!(
            WorldConfig::new(4)
                .with_busy_limit(1.5)
                .busy_limit()
                .is_err()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn measurement(series: &[Series], others: f64) -> timing::Measurement {
        timing::Measurement {
            series: series.to_vec(),
            others,
        }
    }
}
