//! The benchmark: nccl-tests' table for collectives over simulated ranks.
//!
//! Per size it measures out-of-place then in-place: warm-up iterations,
//! then `iters` collectives issued back to back on every rank and waited
//! for, timed from a common start (an all-reduce of one element acts as
//! the barrier). The time printed is the slowest rank's mean; algbw = S/t
//! and busbw = algbw x the collective's bus factor, as nccl-tests defines
//! them, so the figures compare with nccl-tests' and OpenMPI's.

pub mod args;
mod data;

use std::time::Instant;

use wgpu_collectives::{Communicator, DType, Error, ReduceOp, Tensor, Work, World};

use args::{Args, Collective};

/// One measured row half (out-of-place or in-place).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: Option<u64>,
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub bytes: u64,
    pub count: usize,
    pub dtype: DType,
    pub op: ReduceOp,
    pub out_of_place: Timing,
    pub in_place: Timing,
}

fn issue(
    c: &Communicator,
    coll: Collective,
    x: &Tensor,
    op: ReduceOp,
    in_place: bool,
) -> Result<Work, Error> {
    match (coll, in_place) {
        (Collective::AllReduce, false) => c.all_reduce(x, op),
        (Collective::AllReduce, true) => c.all_reduce_in_place(x, op),
    }
}

fn sync(c: &Communicator) -> Result<(), Error> {
    let t = c.zeros(DType::F32, 1)?;
    c.all_reduce_in_place(&t, ReduceOp::Sum)?.wait().map(|_| ())
}

/// Measures one placement of one size on this rank: (mean seconds, wrong elements).
fn measure(
    c: &Communicator,
    a: &Args,
    dtype: DType,
    op: ReduceOp,
    count: usize,
    in_place: bool,
) -> Result<(f64, Option<u64>), Error> {
    let x = data::tensor(c, dtype, op, count)?;
    for _ in 0..a.warmup {
        issue(c, a.collective, &x, op, in_place)?.wait()?;
    }
    sync(c)?;
    let start = Instant::now();
    let mut last = None;
    for _ in 0..a.iters {
        last = Some(issue(c, a.collective, &x, op, in_place)?);
    }
    if let Some(w) = last {
        w.wait()?;
    }
    let secs = start.elapsed().as_secs_f64() / a.iters.max(1) as f64;
    let mut wrong = None;
    for _ in 0..a.check {
        // Fresh input: in-place iterations have overwritten x.
        let x = data::tensor(c, dtype, op, count)?;
        let y = issue(c, a.collective, &x, op, in_place)?.wait()?;
        *wrong.get_or_insert(0) += data::wrong(&y, op, c.size())?;
    }
    Ok((secs, wrong))
}

fn timing(bytes: u64, per_rank: Vec<(f64, Option<u64>)>, factor: f64) -> Timing {
    let secs = per_rank.iter().map(|r| r.0).fold(0.0, f64::max);
    let wrong = per_rank.iter().try_fold(0, |acc, r| r.1.map(|w| acc + w));
    let algbw = if secs > 0.0 {
        bytes as f64 / secs / 1e9
    } else {
        0.0
    };
    Timing {
        us: secs * 1e6,
        algbw,
        busbw: algbw * factor,
        wrong,
    }
}

/// Runs one size for one dtype and op on every rank.
pub fn row(world: &World, a: &Args, dtype: DType, op: ReduceOp, bytes: u64) -> Result<Row, Error> {
    let count = (bytes as usize) / dtype.size();
    let bytes = (count * dtype.size()) as u64;
    let factor = a.collective.bus_factor(world.size());
    let mut halves = Vec::with_capacity(2);
    for in_place in [false, true] {
        let per_rank = world
            .run(|c| measure(c, a, dtype, op, count, in_place))?
            .into_iter()
            .collect::<Result<Vec<_>, Error>>()?;
        halves.push(timing(bytes, per_rank, factor));
    }
    Ok(Row {
        bytes,
        count,
        dtype,
        op,
        out_of_place: halves[0],
        in_place: halves[1],
    })
}

/// The table's header lines.
pub fn header(world: &World, a: &Args) -> String {
    let mut s = format!(
        "# {} over {} simulated ranks: minBytes {} maxBytes {} step: {} warmup iters: {} iters: {} validation: {}\n#\n# Using devices\n",
        a.collective.name(),
        world.size(),
        a.min_bytes,
        a.max_bytes,
        a.step_bytes
            .map_or(format!("{}(factor)", a.factor), |b| format!("{b}(bytes)")),
        a.warmup,
        a.iters,
        a.check,
    );
    for (rank, info) in world.adapters().iter().enumerate() {
        s += &format!(
            "#  Rank {rank:2} on {} [{:?}, {:?}] driver {} {}\n",
            info.name, info.backend, info.device_type, info.driver, info.driver_info
        );
    }
    s += "#\n";
    s += &format!("#{:>58}{:>34}\n", "out-of-place", "in-place");
    s += &format!(
        "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>10} {:>7} {:>7} {:>6} {:>10} {:>7} {:>7} {:>6}\n",
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
    s += &format!(
        "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>10} {:>7} {:>7} {:>6} {:>10} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    s
}

fn half(t: &Timing) -> String {
    let wrong = t.wrong.map_or("N/A".to_string(), |w| w.to_string());
    format!(
        "{:>10.1} {:>7.3} {:>7.3} {:>6}",
        t.us, t.algbw, t.busbw, wrong
    )
}

/// One table line, as nccl-tests prints it.
pub fn line(r: &Row) -> String {
    format!(
        " {:>11} {:>12} {:>8} {:>6} {:>6} {} {}",
        r.bytes,
        r.count,
        r.dtype.name(),
        r.op.name(),
        -1,
        half(&r.out_of_place),
        half(&r.in_place)
    )
}
