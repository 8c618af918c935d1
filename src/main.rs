//! `wgpu-collectives`: the benchmark binary (nccl-tests for wgpu).
//!
//! `cargo run --release` measures all_reduce, f32, sum on 4 ranks from
//! 1 KiB to 64 MiB; `--help` lists the options.

mod bench;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use wgpu_collectives::{World, WorldConfig};

use bench::args::{self, Args};

fn main() -> ExitCode {
    let a = Args::parse();
    match run(&a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the sweep; `Ok(false)` when any element was wrong.
fn run(a: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let ops = if a.collective.reduces() {
        args::ops(&a.op)?
    } else {
        vec![wgpu_collectives::ReduceOp::Sum]
    };
    if a.collective.rooted() && a.root >= a.ranks {
        return Err(format!("root {} is not one of {} ranks", a.root, a.ranks).into());
    }
    let dtypes = args::dtypes(&a.dtype)?;
    let mut config = WorldConfig::new(a.ranks).with_timeout(Duration::from_secs(a.timeout.max(1)));
    if let Some(b) = &a.backend {
        config = config.with_backends(wgpu::Backends::from_comma_list(b));
    }
    if let Some(name) = &a.adapter {
        config = config.with_adapter_name(name);
    }
    let world = World::new(config)?;
    println!("{}", bench::header(&world, a));

    let mut wrong = 0u64;
    let mut busbw = Vec::new();
    for bytes in args::sizes(a) {
        for &dtype in &dtypes {
            for &op in ops.iter().filter(|op| op.supports(dtype)) {
                let row = bench::row(&world, a, dtype, op, bytes)?;
                println!("{}", bench::line(&row));
                for t in std::iter::once(&row.out_of_place).chain(row.in_place.as_ref()) {
                    wrong += t.wrong.unwrap_or(0);
                    busbw.push(t.busbw);
                }
            }
        }
    }
    let avg = if busbw.is_empty() {
        0.0
    } else {
        busbw.iter().sum::<f64>() / busbw.len() as f64
    };
    println!(
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
    println!("# Avg bus bandwidth    : {avg:.3} ");
    println!("#");
    Ok(wrong == 0)
}
