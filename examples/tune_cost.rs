//! What tuning adds to making a world: `World::new` on 4 ranks with
//! tuning off, measuring into a cold cache, and reading a warm one,
//! medians of 5 each, interleaved.
//!
//! `cargo run --release --example tune_cost [RANKS]`

use std::time::Instant;

use wgpu_collectives::{Error, Tune, World, WorldConfig};

fn main() -> Result<(), Error> {
    let ranks = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let dir = std::env::temp_dir().join(format!("tune-cost-{}", std::process::id()));
    let make = |tune: Tune| -> Result<f64, Error> {
        let t = Instant::now();
        let w = World::new(
            WorldConfig::new(ranks)
                .with_tune(tune)
                .with_tune_cache(&dir),
        )?;
        let secs = t.elapsed().as_secs_f64();
        drop(w);
        Ok(secs)
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut off, mut cold, mut warm) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        off.push(make(Tune::Off)?);
        let _ = std::fs::remove_dir_all(&dir);
        cold.push(make(Tune::Cached)?);
        warm.push(make(Tune::Cached)?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (off, cold, warm) = (median(off), median(cold), median(warm));
    println!("{ranks} ranks, World::new, medians of 5:");
    println!("  tuning off        {:8.1} ms", off * 1e3);
    println!(
        "  cold cache        {:8.1} ms  (+{:.1} ms)",
        cold * 1e3,
        (cold - off) * 1e3
    );
    println!(
        "  warm cache        {:8.1} ms  (+{:.1} ms)",
        warm * 1e3,
        (warm - off) * 1e3
    );
    Ok(())
}
