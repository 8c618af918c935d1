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
    println!(
        "# each line: kind, plan, then bytes each rank moves:seconds at each size timed \
         (the planner costs a size between two along the line through them)"
    );
    print!("{table}");
    Ok(())
}
