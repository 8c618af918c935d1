//! `wgpu-collectives tune`: makes a world that times its plans (or reads
//! its cached table) and prints the table and where it is cached.

use clap::Parser;
use wgpu_collectives::{DType, Error, Placement, ReduceOp, Tune, WorldConfig};

/// Times every plan on this machine's devices (or reads the cached
/// table) and prints the tuning table the planner would choose from.
#[derive(Debug, Parser)]
#[command(name = "wgpu-collectives tune")]
pub struct TuneArgs {
    /// Number of ranks.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,

    /// Where the ranks run: auto, shared or per-rank.
    #[arg(long, default_value = "auto")]
    pub placement: String,

    /// Measure again even when a table is cached (and cache it).
    #[arg(long)]
    pub measure: bool,

    /// Print what the planner chooses for all_reduce at 4 KiB to 64 MiB
    /// (x4) from the table in FILE (as this command prints it), one
    /// `choice BYTES PLACEMENT PLAN` line per size, and time nothing.
    #[arg(long, value_name = "FILE")]
    pub choices: Option<std::path::PathBuf>,
}

/// Runs the subcommand on `argv` (after `tune`).
pub fn run(argv: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let a =
        TuneArgs::try_parse_from(std::iter::once("tune".to_string()).chain(argv.iter().cloned()))?;
    let placement = Placement::parse(&a.placement)
        .ok_or_else(|| format!("--placement {:?}: auto, shared or per-rank", a.placement))?;
    if let Some(file) = &a.choices {
        return choices(a.ranks, placement, &std::fs::read_to_string(file)?);
    }
    let world = super::world(
        WorldConfig::new(a.ranks)
            .with_placement(placement)
            .with_tune(if a.measure {
                Tune::Measure
            } else {
                Tune::Cached
            }),
    )?;
    let Some(table) = world.tuning_table() else {
        return Err(
            "this world tunes nothing (a plan or an algorithm is forced, or it has one rank)"
                .into(),
        );
    };
    let refused = table.starts_with("# refused:");
    println!(
        "# {} ranks, placement {}, cached at {}",
        world.size(),
        world.placement().name(),
        world.tuning_cache().map_or(
            if refused {
                "nowhere (timed on a busy machine)".to_string()
            } else {
                "nowhere (the cache could not be written)".to_string()
            },
            |p| p.display().to_string()
        )
    );
    let measured = table
        .lines()
        .find_map(|l| l.strip_prefix("measured "))
        .and_then(|t| t.trim().parse::<u64>().ok());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match measured {
        Some(at) => println!(
            "# age: measured {} ago (unix time {at})",
            age(now.saturating_sub(at))
        ),
        None => println!("# age: unknown (the table does not say when it was measured)"),
    }
    println!(
        "# each line: kind, plan, then bytes each rank moves:seconds~spread at each size \
         timed: the median call, and the interquartile range over the median (the planner \
         costs a size between two along the line through them)"
    );
    if table.lines().any(|l| l == "second-look") {
        println!(
            "# second-look: some points stayed too spread to trust (a busy machine); this \
             world uses the table, the next one measures again"
        );
    }
    print!("{table}");
    Ok(())
}

/// `secs` as a person reads an age.
fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86_400),
    }
}

/// The planner's all_reduce choices from `table`: one call of each size,
/// and the plan it ran with.
fn choices(
    ranks: usize,
    placement: Placement,
    table: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let world = super::world(
        WorldConfig::new(ranks)
            .with_placement(placement)
            .with_tune_table(table),
    )?;
    let sizes: Vec<usize> = (0..8).map(|i| (4usize << 10) << (2 * i)).collect();
    let plans = world.run(|c| -> Result<Vec<String>, Error> {
        let mut out = Vec::with_capacity(sizes.len());
        for &bytes in &sizes {
            let x = c.zeros(DType::F32, bytes / 4)?;
            let _ = c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?;
            let plan = c.flight_record().ranks[c.rank()]
                .last()
                .and_then(|e| e.plan)
                .map_or("?", |p| p.name());
            out.push(plan.to_string());
        }
        Ok(out)
    })?;
    let first = plans.into_iter().next().ok_or("no rank")??;
    for (bytes, plan) in sizes.iter().zip(first) {
        println!("choice {bytes} {} {plan}", world.placement().name());
    }
    Ok(())
}
