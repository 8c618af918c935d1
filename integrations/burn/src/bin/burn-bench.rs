//! All-reduce of burn f32 tensors through the engine, printed as
//! nccl-tests prints it, to be read beside burn's own `Tensor::all_reduce`
//! (`scripts/peers/burn-allreduce`) by `compare-allreduce`.
//!
//! Out-of-place is burn's calling shape exactly: `all_reduce(inputs.clone())`
//! on tensors that share their handles with `inputs`, so every call writes
//! fresh handles (as burn's own does). In-place feeds each call's results,
//! which own their handles, to the next. Every call waits for its result,
//! as burn's does. Both are checked against the sum computed on the host.

use std::process::ExitCode;
use std::time::Instant;

use burn_tensor::distributed::ReduceOperation;
use burn_tensor::{Tensor, TensorData};
use clap::Parser;
use wgpu_collectives::WorldConfig;
use wgpu_collectives_burn::{BurnWorld, Error};

/// All-reduce of burn tensors on one wgpu device per rank.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Ranks (burn devices, one wgpu device each).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "1M", value_parser = parse_bytes)]
    min_bytes: u64,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_bytes)]
    max_bytes: u64,
    /// Each size is the last times this.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 4)]
    factor: u64,
    /// Timed calls per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Untimed calls per size before the timed ones.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 3)]
    warmup: usize,
}

/// "64M" -> 67108864.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(mult))
        .ok_or_else(|| format!("not a byte count: {s:?} (examples: 1024, 4K, 64M)"))
}

/// Rank `rank`'s element `i`: a small integer, so the sum is exact in any
/// order.
fn value(rank: usize, i: usize) -> f32 {
    ((i % 13) + rank % 7) as f32
}

/// Timing of one column: seconds per call, and the elements that did not
/// match the host's sum.
struct Column {
    seconds: f64,
    wrong: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("burn-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, Error> {
    let n = args.ranks;
    let world = BurnWorld::new(WorldConfig::new(n))?;
    let info = world.world().adapters().first().cloned();
    let factor = if n > 1 {
        2.0 * (n as f64 - 1.0) / n as f64
    } else {
        0.0
    };
    println!(
        "# wgpu-collectives-burn: all_reduce of burn f32 tensors over {n} burn devices \
         (one wgpu device each); warmup {}, iters {}, each call waits for its result",
        args.warmup, args.iters
    );
    if let Some(info) = info {
        println!("#  adapter: {} [{:?}]", info.name, info.backend);
    }
    println!(
        "#  engine: placement {}, transport {}",
        world.world().placement().name(),
        world.world().transport()
    );
    println!("#");
    println!(
        "#{:>43}{:>34}{:>34}",
        "", "out-of-place (fresh handles)", "in-place (owned handles)"
    );
    println!(
        "#{:>11}{:>13}{:>9}{:>7}{:>7}{:>11}{:>8}{:>8}{:>7}{:>11}{:>8}{:>8}{:>7}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "#{:>11}{:>13}{:>9}{:>7}{:>7}{:>11}{:>8}{:>8}{:>7}{:>11}{:>8}{:>8}",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)"
    );
    let (mut wrong_total, mut busbw_sum, mut rows) = (0usize, 0.0, 0usize);
    let mut size = args.min_bytes.max(4);
    while size <= args.max_bytes {
        let count = usize::try_from(size / 4).unwrap_or(usize::MAX);
        let want: Vec<f32> = (0..count)
            .map(|i| (0..n).map(|r| value(r, i)).sum())
            .collect();
        let inputs: Vec<Tensor<1>> = world
            .devices()
            .iter()
            .enumerate()
            .map(|(r, d)| {
                let data: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
                Tensor::from_data(TensorData::new(data, [count]), d)
            })
            .collect();
        let oop = out_of_place(&world, &inputs, args, &want)?;
        let inp = in_place(&world, &inputs, args, &want)?;
        let bytes = count as f64 * 4.0;
        let cells = |c: &Column| {
            let algbw = bytes / c.seconds / 1e9;
            format!(
                "{:>11.1}{:>8.3}{:>8.3}{:>7}",
                c.seconds * 1e6,
                algbw,
                algbw * factor,
                c.wrong
            )
        };
        println!(
            "{:>12}{:>13}{:>9}{:>7}{:>7}{}{}",
            count * 4,
            count,
            "float",
            "sum",
            -1,
            cells(&oop),
            cells(&inp)
        );
        busbw_sum += bytes / oop.seconds / 1e9 * factor;
        rows += 1;
        wrong_total += oop.wrong + inp.wrong;
        drop(inputs);
        for device in world.devices() {
            device.memory_cleanup();
        }
        size = match size.checked_mul(args.factor.max(2)) {
            Some(s) => s,
            None => break,
        };
    }
    println!(
        "# Out of bounds values : {wrong_total} {}",
        if wrong_total == 0 { "OK" } else { "FAILED" }
    );
    println!(
        "# Avg bus bandwidth    : {:.6}",
        if rows > 0 {
            busbw_sum / rows as f64
        } else {
            0.0
        }
    );
    println!("#");
    Ok(wrong_total == 0)
}

/// burn's own calling shape: the inputs stay shared, results are fresh.
fn out_of_place(
    world: &BurnWorld,
    inputs: &[Tensor<1>],
    args: &Args,
    want: &[f32],
) -> Result<Column, Error> {
    for _ in 0..args.warmup {
        world.all_reduce(inputs.to_vec(), ReduceOperation::Sum)?;
    }
    let start = Instant::now();
    let mut outputs = Vec::new();
    for _ in 0..args.iters.max(1) {
        outputs = world.all_reduce(inputs.to_vec(), ReduceOperation::Sum)?;
    }
    let seconds = start.elapsed().as_secs_f64() / args.iters.max(1) as f64;
    Ok(Column {
        seconds,
        wrong: wrong(outputs, want),
    })
}

/// Results fed back as the next call's inputs, each owning its handle. The
/// first call's results are checked; later calls sum sums.
fn in_place(
    world: &BurnWorld,
    inputs: &[Tensor<1>],
    args: &Args,
    want: &[f32],
) -> Result<Column, Error> {
    // Copies that own their handles (`inputs` keeps its own).
    let owned: Vec<Tensor<1>> = inputs.iter().map(|t| t.clone().mul_scalar(1.0)).collect();
    let mut xs = world.all_reduce(owned, ReduceOperation::Sum)?;
    // The read holds a second reference only while it lasts.
    let wrong = wrong(xs.clone(), want);
    for _ in 0..args.warmup {
        xs = world.all_reduce(xs, ReduceOperation::Sum)?;
    }
    let start = Instant::now();
    for _ in 0..args.iters.max(1) {
        xs = world.all_reduce(xs, ReduceOperation::Sum)?;
    }
    let seconds = start.elapsed().as_secs_f64() / args.iters.max(1) as f64;
    Ok(Column { seconds, wrong })
}

/// Elements of `outputs` (every rank's) that differ from `want`.
fn wrong(outputs: Vec<Tensor<1>>, want: &[f32]) -> usize {
    outputs
        .into_iter()
        .map(|t| match t.try_into_vec_as::<f32>() {
            Ok(v) => {
                v.iter().zip(want).filter(|(a, b)| a != b).count()
                    + want.len().saturating_sub(v.len())
            }
            Err(_) => want.len(),
        })
        .sum()
}
