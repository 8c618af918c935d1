//! A table that ranks all_reduce's plans backwards heals as the world
//! runs: times the plans into a fresh cache, reverses all_reduce's
//! ranking there (the fastest plan's points swapped with the slowest's,
//! the second's with the third's), makes a world that reads it, runs
//! calls of all_reduce and prints the plan of each, checking that every
//! rank ran the same one at every call.
//!
//! `cargo run --release --example heal [RANKS] [CALLS] [BYTES] [PLACEMENT]`
//! (default 4 ranks, 300 calls of 1 MiB, placement shared; `scripts/heal`).

use std::path::Path;

use wgpu_collectives::{DType, Error, Placement, ReduceOp, Tune, World, WorldConfig};

/// The table at `path` with all_reduce's plans ranked backwards at every
/// size: the plan timed fastest at `bytes` costed as the fastest plan's
/// curve times the number of plans, the next times one less, down to the
/// slowest at the fastest's own curve; trusted (no second look). The
/// plans from the fastest, as the table had them.
fn reverse(path: &Path, bytes: usize) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    let points = |line: &str| -> Vec<(f64, f64)> {
        line.split_whitespace()
            .filter_map(|p| {
                let (b, rest) = p.split_once(':')?;
                let secs = rest.split('~').next()?;
                Some((b.parse().ok()?, secs.parse().ok()?))
            })
            .collect()
    };
    let mut lines: Vec<(String, Vec<(f64, f64)>)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("all_reduce ")?.split_once(' '))
        .map(|(plan, pts)| (plan.to_string(), points(pts)))
        .collect();
    // Fastest first: timed at `bytes` (by the time there), then those
    // left out of the race before it (by their last time).
    let key = |pts: &[(f64, f64)]| match pts.iter().find(|p| p.0 as usize == bytes) {
        Some(p) => (0, p.1),
        None => (1, pts.last().map_or(f64::INFINITY, |p| p.1)),
    };
    lines.sort_by(|a, b| {
        let (x, y) = (key(&a.1), key(&b.1));
        x.0.cmp(&y.0).then(x.1.total_cmp(&y.1))
    });
    let template = lines.first().ok_or("no all_reduce timed")?.1.clone();
    let n = lines.len();
    let mut out = String::new();
    for l in text.lines() {
        if l == "second-look" || l.starts_with("all_reduce ") {
            continue;
        }
        if l == "end" {
            for (i, (plan, _)) in lines.iter().enumerate() {
                let factor = (n - i) as f64;
                out += &format!("all_reduce {plan}");
                for (b, secs) in &template {
                    out += &format!(" {b}:{:e}~0.02", secs * factor);
                }
                out += "\n";
            }
        }
        out += &format!("{l}\n");
    }
    std::fs::write(path, out)?;
    Ok(lines.into_iter().map(|l| l.0).collect())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize| std::env::args().nth(i);
    let ranks: usize = arg(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let calls: usize = arg(2).and_then(|s| s.parse().ok()).unwrap_or(300);
    let bytes: usize = arg(3).and_then(|s| s.parse().ok()).unwrap_or(1 << 20);
    let placement = arg(4)
        .map(|s| Placement::parse(&s).ok_or(format!("placement {s:?}: shared or per-rank")))
        .transpose()?
        .unwrap_or(Placement::SharedDevice);
    let dir = std::env::temp_dir().join(format!("wgpu-collectives-heal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let config = |tune| {
        WorldConfig::new(ranks)
            .with_placement(placement)
            .with_tune(tune)
            .with_tune_cache(&dir)
            .with_healing(true)
    };
    let timed = World::new(config(Tune::Measure))?;
    let path = timed
        .tuning_cache()
        .ok_or("the table was not cached")?
        .to_path_buf();
    drop(timed);
    let ranked = reverse(&path, bytes)?;
    println!(
        "# {ranks} ranks, {} placement, all_reduce of {bytes} bytes; timed fastest first: {}",
        placement.name(),
        ranked.join(", ")
    );
    println!("# the table in {} now ranks them backwards", path.display());
    let w = World::new(config(Tune::Cached))?;
    let len = bytes / 4;
    let plans = w.run(|c| -> Result<Vec<String>, Error> {
        let x = c.zeros(DType::F32, len)?;
        let mut mine = Vec::with_capacity(calls);
        for _ in 0..calls {
            let _ = c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?;
            let plan = c.flight_record().ranks[c.rank()]
                .last()
                .and_then(|e| e.plan)
                .map_or("?", |p| p.name());
            mine.push(plan.to_string());
        }
        Ok(mine)
    })?;
    let plans: Vec<Vec<String>> = plans.into_iter().collect::<Result<_, _>>()?;
    let mut same = true;
    for (i, p0) in plans[0].iter().enumerate() {
        let all = plans.iter().all(|p| p.get(i) == Some(p0));
        same &= all;
        println!(
            "call {i:3}: {p0}{}",
            if all { "" } else { "  (ranks disagree!)" }
        );
    }
    let last = plans[0].last().cloned().unwrap_or_default();
    let settled = plans[0]
        .iter()
        .rposition(|p| *p != last)
        .map_or(0, |i| i + 1);
    println!("# every rank ran the same plan at every call: {same}");
    println!("# from call {settled} on: {last}");
    drop(w);
    println!("# the table cached now:");
    print!("{}", std::fs::read_to_string(&path)?);
    let _ = std::fs::remove_dir_all(&dir);
    if !same {
        return Err("the ranks ran different plans".into());
    }
    Ok(())
}
