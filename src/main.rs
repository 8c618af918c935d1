//! `wgpu-collectives`: the benchmark binary (nccl-tests for wgpu).
//!
//! `cargo run --release` measures all_reduce, f32, sum on 4 ranks from
//! 1 KiB to 64 MiB; `--help` lists the options.

mod bench;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use wgpu_collectives::{FoldOrder, Placement, Plan, ReduceOp, WorldConfig};

use bench::args::{self, Args};
use bench::{ceiling, report};

fn main() -> ExitCode {
    wgpu_collectives::init_logging();
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("ddp") {
        return match bench::ddp::run(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    if argv.get(1).map(String::as_str) == Some("tune") {
        return match bench::tune::run(&argv[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    let a = Args::parse();
    match run(&a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the sweep. Exit codes: 0 all right, 1 wrong elements, 3 average
/// busbw below `--min-bw`, 2 an error.
fn run(a: &Args) -> Result<ExitCode, Box<dyn std::error::Error>> {
    let ops = if a.collective.reduces() {
        args::ops(&a.op)?
    } else {
        vec![ReduceOp::Sum]
    };
    let dtypes = args::dtypes(&a.dtype)?;
    if a.min_bytes > a.max_bytes {
        return Err(format!(
            "-b {} is above -e {}: no size to measure",
            a.min_bytes, a.max_bytes
        )
        .into());
    }
    let mut config = WorldConfig::new(a.ranks).with_timeout(Duration::from_secs(a.timeout.max(1)));
    if let Some(b) = &a.backend {
        config = config.with_backends(wgpu::Backends::from_comma_list(b));
    }
    if let Some(name) = &a.adapter {
        config = config.with_adapter_name(name);
    }
    if let Some(p) = &a.placement {
        let placement = Placement::parse(p)
            .ok_or_else(|| format!("--placement {p:?}: auto, shared or per-rank"))?;
        config = config.with_placement(placement);
    }
    if let Some(f) = &a.fold_order {
        let order = FoldOrder::parse(f)
            .ok_or_else(|| format!("--fold-order {f:?}: canonical or fastest"))?;
        config = config.with_fold_order(order);
    }
    // `--plan all`: a world per plan besides the planner's own.
    let sweep = a.plan.as_deref() == Some("all");
    if let Some(p) = a.plan.as_deref().filter(|_| !sweep) {
        let plan = Plan::parse(p).ok_or_else(|| {
            let names: Vec<&str> = Plan::ALL.iter().map(|p| p.name()).collect();
            format!("--plan {p:?}: one of {} or all", names.join(", "))
        })?;
        config = config.with_plan(Some(plan));
    }
    let progress = std::io::stderr().is_terminal();
    let say = |what: &str| {
        if progress {
            eprint!("\r\x1b[K{what}");
            let _ = std::io::stderr().flush();
        }
    };
    say("finding adapters, making devices, measuring the cost model ...");
    let world = bench::world(config.clone())?;
    // Under mpirun every process measures; the one holding rank 0 prints.
    let lead = world.local_ranks().start == 0;
    let say = |what: &str| {
        if lead {
            say(what)
        }
    };
    macro_rules! out {
        ($($t:tt)*) => {
            if lead {
                println!($($t)*);
            }
        };
    }
    let roots = if a.collective.rooted() {
        a.roots.list(world.size())
    } else {
        vec![0]
    };
    if let Some(r) = roots.iter().find(|&&r| r >= world.size()) {
        return Err(format!("root {r} is not one of {} ranks", world.size()).into());
    }
    let bus_factor = a.collective.bus_factor(world.size());
    say("measuring the ceiling ...");
    let ceiling = ceiling::measure(&world, a.max_bytes, bus_factor)?;
    say("");
    if lead {
        print!("{}", bench::header(&world, a));
    }
    out!("{}", ceiling::lines(&ceiling));
    out!("#");
    out!("{}", bench::columns());

    let mut jobs = Vec::new();
    for bytes in args::sizes(a) {
        for &dtype in &dtypes {
            for &op in ops.iter().filter(|op| op.supports(dtype)) {
                for &root in &roots {
                    jobs.push((bytes, dtype, op, root));
                }
            }
        }
    }
    // The arguments with one job's root in `root`.
    let with_root = |root| Args { root, ..a.clone() };
    let mut rows = Vec::with_capacity(jobs.len());
    for (i, &(bytes, dtype, op, root)) in jobs.iter().enumerate() {
        if progress && lead {
            eprint!(
                "\r\x1b[K[{}/{}] {} bytes {} {}",
                i + 1,
                jobs.len(),
                bytes,
                dtype.name(),
                op.name()
            );
            let _ = std::io::stderr().flush();
        }
        let row = if sweep {
            // The planner's choice for this size: one untimed, unchecked call.
            let probe = Args {
                iters: 1,
                warmup: 0,
                check: 0,
                ..with_root(root)
            };
            bench::row(&world, &probe, dtype, op, bytes)?
        } else {
            bench::row(&world, &with_root(root), dtype, op, bytes)?
        };
        if progress && lead {
            eprint!("\r\x1b[K");
        }
        if !sweep {
            out!("{}", bench::line(&row));
        }
        rows.push(row);
    }
    if sweep {
        // A world per plan, one at a time (each holds its buffers), every
        // size under each plan that the collective offers and that can run
        // it; plans that cannot run here at all (the direct kernels between
        // devices of their own) make no world.
        let chosen: Vec<Option<Plan>> = rows.drain(..).map(|r| r.plan).collect();
        let mut by_job: Vec<Vec<bench::Row>> = jobs.iter().map(|_| Vec::new()).collect();
        for plan in Plan::ALL {
            say(&format!("measuring under the plan {plan} ..."));
            let Ok(w) = bench::world(config.clone().with_plan(Some(plan))) else {
                continue;
            };
            for (j, &(bytes, dtype, op, root)) in jobs.iter().enumerate() {
                match bench::row(&w, &with_root(root), dtype, op, bytes) {
                    // A plan the collective does not offer runs another: left out.
                    Ok(row) if row.plan != Some(plan) => {}
                    Ok(mut row) => {
                        row.chosen = chosen.get(j).copied().flatten() == Some(plan);
                        if let Some(rows) = by_job.get_mut(j) {
                            rows.push(row);
                        }
                    }
                    // A plan that cannot run this size (refused with the reason).
                    Err(wgpu_collectives::Error::InvalidArgument { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        say("");
        for row in by_job.into_iter().flatten() {
            out!("{}", bench::line(&row));
            rows.push(row);
        }
    }

    let timings: Vec<_> = rows
        .iter()
        .flat_map(|r| std::iter::once(&r.out_of_place).chain(r.in_place.as_ref()))
        .collect();
    let wrong: u64 = timings.iter().map(|t| t.wrong.unwrap_or(0)).sum();
    let avg = if timings.is_empty() {
        0.0
    } else {
        timings.iter().map(|t| t.busbw).sum::<f64>() / timings.len() as f64
    };
    let best = timings.iter().map(|t| t.busbw).fold(0.0, f64::max);
    // The ceiling at the best row's size, which is what that row is
    // compared with (the header's is at -e).
    let best_bytes = rows
        .iter()
        .find(|r| {
            std::iter::once(&r.out_of_place)
                .chain(r.in_place.as_ref())
                .any(|t| t.busbw == best)
        })
        .map_or(a.max_bytes, |r| r.bytes);
    let at_best = if best_bytes.clamp(4, 64 << 20).next_multiple_of(4) == ceiling.bytes {
        ceiling.clone()
    } else {
        say("measuring the ceiling at the best row's size ...");
        ceiling::measure(&world, best_bytes, bus_factor)?
    };
    say("");
    out!(
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
    out!("# Avg bus bandwidth    : {avg:.3} ");
    let busy: Vec<String> = rows
        .iter()
        .filter(|r| r.out_of_place.spread.iqr > bench::BUSY)
        .map(|r| r.bytes.to_string())
        .collect();
    if !busy.is_empty() {
        out!(
            "# Warning: the iterations varied by more than {:.0}% (interquartile range over \
             median) at {} of {} sizes ({} B): the machine was busy. Compare runs with \
             the repository's scripts/peers/ab (paired rounds), not one against another.",
            bench::BUSY * 100.0,
            busy.len(),
            rows.len(),
            busy.join(", ")
        );
    }
    out!(
        "# Best bus bandwidth   : {best:.3} GB/s = {:.0}% of the {:.3} GB/s ceiling at {}",
        if at_best.busbw > 0.0 {
            100.0 * best / at_best.busbw
        } else {
            0.0
        },
        at_best.busbw,
        ceiling::size(at_best.bytes)
    );
    out!("#");
    let mut split = None;
    if let (Some(&(bytes, dtype, op, root)), Some(row)) = (jobs.last(), rows.last()) {
        say("splitting the last row's time ...");
        let profiles = bench::time_split(&world, &with_root(root), dtype, op, bytes)?;
        say("");
        // The row's real size (a multiple of what every rank moves).
        let bytes = row.bytes;
        out!(
            "{}",
            bench::split_lines(
                bytes,
                dtype,
                a.collective.reduces().then_some(op),
                &profiles
            )
        );
        out!("#");
        split = Some((bytes, profiles));
    }

    if let (Some(path), true) = (&a.json, lead) {
        let split = split.as_ref().map(|(bytes, profiles)| report::Split {
            bytes: *bytes,
            profiles,
        });
        let doc = report::json(a, &world, &ceiling, &rows, avg, split);
        std::fs::write(path, doc).map_err(|e| format!("writing {path}: {e}"))?;
    }
    if let (Some(path), true) = (&a.plot, lead) {
        let adapter = world.adapters().first().map_or("?", |i| i.name.as_str());
        report::plot(
            path,
            a.collective.name(),
            world.size(),
            adapter,
            world.placement().name(),
            &ceiling,
            &rows,
        )?;
    }
    if wrong > 0 {
        return Ok(ExitCode::from(1));
    }
    if let Some(min) = a.min_bw {
        if avg < min {
            eprintln!("average busbw {avg:.3} GB/s is below --min-bw {min} GB/s");
            return Ok(ExitCode::from(3));
        }
    }
    Ok(ExitCode::SUCCESS)
}
