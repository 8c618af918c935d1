//! `wgpu-collectives ddp`: data-parallel training of an MLP on simulated
//! ranks, per schedule: per-step times and loss, then medians and the
//! ideal max(compute, comm).

use super::ddp_train::{Mlp, RankRun, Schedule, StepStats, default_cost, refit, train_with};
use super::median;
use clap::{Parser, ValueEnum};
use wgpu_collectives::WorldConfig;
use wgpu_collectives::graph::calibrate::Calibration;
use wgpu_collectives::graph::chrome_trace;

/// Which schedules to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// Each wait right after its all_reduce.
    Eager,
    /// sink_waits, reorder_for_overlap, bucketing by cost.
    Overlap,
    /// FSDP: weights sharded over the ranks, gathered per layer (prefetched
    /// during the previous layer), gradients reduce-scattered; the overlap
    /// passes.
    Fsdp,
}

/// Data-parallel training of an MLP: gradients averaged with all_reduce,
/// overlapped with backward by the graph passes.
#[derive(Debug, Parser)]
#[command(name = "wgpu-collectives ddp")]
pub struct DdpArgs {
    /// Simulated ranks.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Layers ([hidden x hidden] each).
    #[arg(long, default_value_t = 8)]
    pub layers: usize,
    /// Width (the default keeps a run under a minute on lavapipe).
    #[arg(long, default_value_t = 128)]
    pub hidden: usize,
    /// Global batch (split over the ranks).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Training steps.
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// The schedule to run (default: all three, eager first).
    #[arg(long, value_enum)]
    pub schedule: Option<Which>,
    /// SGD learning rate.
    #[arg(long, default_value_t = 0.01)]
    pub lr: f32,
    /// Seed of weights and data.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Gradient bucket cap in MiB for the overlap schedule (DDP's bucket_cap_mb).
    #[arg(long = "bucket-mb", default_value_t = 25.0)]
    pub bucket_mb: f64,
    /// Write the last step's timeline of every rank (last schedule run) as Chrome trace JSON.
    #[arg(long, value_name = "FILE.json")]
    pub trace: Option<String>,
    /// Draw that timeline as an SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub timeline: Option<String>,
    /// Refit the cost model to the first schedule's last step (every rank
    /// agrees on the figures) and schedule the others with it.
    #[arg(long)]
    pub refit: bool,
}

/// Prints how far the cost model's estimates were from the last step's
/// measurements (rank 0's): by the hop model measured on the adapter
/// (before tuning) and by the cost model the schedules used (the tuning
/// table's, in a tuned world).
fn calibration(runs: &[RankRun], tuned: bool) {
    let Some(run) = runs.first() else { return };
    let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.0}%", v * 100.0));
    let line = |label: &str, samples: &[wgpu_collectives::graph::calibrate::Sample]| {
        let c = Calibration::of(samples);
        println!(
            "# calibration{label} (rank 0, last step; median |estimated - measured| / measured): \
             collectives {} (estimated {:.2} ms, measured {:.2} ms in all), compute {}",
            pct(c.collectives),
            c.collective_totals.0.as_secs_f64() * 1e3,
            c.collective_totals.1.as_secs_f64() * 1e3,
            pct(c.compute)
        );
    };
    if tuned {
        line(" before, by the hop model", &run.hop_samples);
        line(" after, by the tuning table", &run.samples);
    } else {
        line("", &run.samples);
    }
}

/// Rank-mean of one figure per step.
fn per_step(runs: &[RankRun], f: fn(&StepStats) -> f64) -> Vec<f64> {
    let steps = runs.first().map_or(0, |r| r.steps.len());
    (0..steps)
        .map(|s| runs.iter().map(|r| f(&r.steps[s])).sum::<f64>() / runs.len().max(1) as f64)
        .collect()
}

/// Runs the training; returns the process exit status.
pub fn run(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let a = DdpArgs::parse_from(std::iter::once("ddp".to_string()).chain(args.iter().cloned()));
    let world = super::world(WorldConfig::new(a.ranks))?;
    // Under mpirun every process trains; the one holding rank 0 prints.
    let lead = world.local_ranks().start == 0;
    macro_rules! out {
        ($($t:tt)*) => {
            if lead {
                println!($($t)*);
            }
        };
    }
    let m = Mlp {
        layers: a.layers,
        hidden: a.hidden,
        batch: a.batch,
        lr: a.lr,
        seed: a.seed,
        bucket_bytes: (a.bucket_mb * (1 << 20) as f64) as usize,
    };
    out!(
        "# ddp: {} ranks on {}, {} layers of {}, batch {}, {} steps, lr {}, buckets of {} MiB",
        world.size(),
        world.adapters().first().map_or("?", |i| i.name.as_str()),
        a.layers,
        a.hidden,
        a.batch,
        a.steps,
        a.lr,
        a.bucket_mb
    );
    let schedules: Vec<(Schedule, &str)> = match a.schedule {
        Some(Which::Eager) => vec![(Schedule::Eager, "eager")],
        Some(Which::Overlap) => vec![(Schedule::Overlap, "overlap")],
        Some(Which::Fsdp) => vec![(Schedule::Fsdp, "fsdp")],
        None => vec![
            (Schedule::Eager, "eager"),
            (Schedule::Overlap, "overlap"),
            (Schedule::Fsdp, "fsdp"),
        ],
    };
    let mut summary = Vec::new();
    let mut last = None;
    let mut cost = default_cost(&world);
    for (i, (s, name)) in schedules.into_iter().enumerate() {
        let runs = train_with(&world, &m, a.steps, s, false, &cost)?;
        out!(
            "#\n# schedule {name}\n# {:>4} {:>10} {:>12} {:>10} {:>12} {:>12}",
            "step",
            "time(ms)",
            "compute(ms)",
            "comm(ms)",
            "exposed(ms)",
            "loss"
        );
        let (t, c, k, e) = (
            per_step(&runs, |s| s.step_us / 1e3),
            per_step(&runs, |s| s.compute_us / 1e3),
            per_step(&runs, |s| s.comm_us / 1e3),
            per_step(&runs, |s| s.exposed_us / 1e3),
        );
        for (i, st) in runs[0].steps.iter().enumerate() {
            out!(
                "  {:>4} {:>10.2} {:>12.2} {:>10.2} {:>12.2} {:>12.6}",
                i,
                t[i],
                c[i],
                k[i],
                e[i],
                st.loss
            );
        }
        summary.push((name, median(t), median(c), median(k), median(e)));
        if let Some(agree) = runs.first().and_then(|r| r.weights_agree) {
            if !agree {
                return Err(format!(
                    "schedule {name}: the ranks' weights differ after {} steps",
                    a.steps
                )
                .into());
            }
            out!(
                "# weights after {} steps: the same bits on all {} ranks",
                a.steps,
                world.size()
            );
        }
        if lead {
            calibration(
                &runs,
                world.tuning_table().is_some() && (i == 0 || !a.refit),
            );
        }
        if a.refit && i == 0 {
            cost = refit(&world, &runs, &cost)?;
            out!(
                "# cost model refit to this schedule: hop {:.1} us + {:.3} GB/s, \
                 dispatch {:.1} us, matmul {:.2} GFLOP/s, element-wise {:.2} GB/s",
                cost.comm.alpha.as_secs_f64() * 1e6,
                cost.comm.beta / 1e9,
                cost.comm.dispatch.as_secs_f64() * 1e6,
                cost.flops / 1e9,
                cost.bytes / 1e9
            );
        }
        last = Some(runs);
    }
    // The eager schedule overlaps nothing, so its in-flight time is what
    // the communication costs; the overlap schedule's includes time spent
    // hidden behind compute.
    let comm_cost = summary.first().map_or(0.0, |s| s.3);
    out!(
        "#\n# medians over steps (ms): {:>10} {:>12} {:>10} {:>12} {:>10}",
        "step",
        "compute",
        "comm",
        "exposed",
        "ideal"
    );
    for (name, t, c, k, e) in &summary {
        out!(
            "#   {name:<22} {t:>10.2} {c:>12.2} {k:>10.2} {e:>12.2} {:>10.2}",
            c.max(comm_cost)
        );
    }
    out!(
        "#   (comm: issue to end of wait; ideal: max(compute, the {} schedule's comm))",
        summary.first().map_or("", |s| s.0)
    );
    if let Some(runs) = last {
        let views: Vec<(usize, &[wgpu_collectives::graph::Event])> = runs
            .iter()
            .enumerate()
            .map(|(r, run)| (r, run.timeline.as_slice()))
            .collect();
        if let Some(path) = &a.trace {
            std::fs::write(path, chrome_trace(&views))
                .map_err(|e| format!("writing {path}: {e}"))?;
        }
        if let Some(path) = &a.timeline {
            super::report::timeline(path, &views)?;
        }
    }
    Ok(())
}
