//! `wgpu-collectives tune`: makes a world that times its plans (or reads
//! its cached table) and prints the table and where it is cached.

use clap::Parser;
use wgpu_collectives::{Placement, Tune, WorldConfig};

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
}

/// Runs the subcommand on `argv` (after `tune`).
pub fn run(argv: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let a =
        TuneArgs::try_parse_from(std::iter::once("tune".to_string()).chain(argv.iter().cloned()))?;
    let placement = Placement::parse(&a.placement)
        .ok_or_else(|| format!("--placement {:?}: auto, shared or per-rank", a.placement))?;
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
    println!(
        "# {} ranks, placement {}, cached at {}",
        world.size(),
        world.placement().name(),
        world.tuning_cache().map_or(
            "nowhere (the cache could not be written)".to_string(),
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
