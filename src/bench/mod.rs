//! The benchmark: nccl-tests' table for collectives over simulated ranks.
//!
//! Per size it measures out-of-place then in-place (where the collective
//! has one): warm-up iterations, then `iters` collectives issued back to
//! back on every rank and waited for, timed from a common start (a
//! barrier). The time printed is the slowest rank's mean; algbw = S/t and
//! busbw = algbw x the collective's bus factor, as nccl-tests defines them,
//! so the figures compare with nccl-tests' and OpenMPI's.

pub mod args;
pub mod ceiling;
mod data;
pub mod ddp;
pub mod ddp_train;
pub mod report;
pub mod tune;

use std::time::Instant;

use wgpu_collectives::{
    Communicator, DType, Error, Plan, Profile, ReduceOp, Tensor, Work, World, WorldConfig,
};

use args::{Args, Collective};

/// The median of `v` (the upper one of an even count); zero for none.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The benchmark's world: over the processes of an MPI job when it runs
/// under mpirun and was built with the `mpi` feature (`config`'s ranks in
/// each process), else in this process.
pub fn world(config: WorldConfig) -> Result<World, Error> {
    #[cfg(feature = "mpi")]
    if under_mpirun() {
        return World::from_mpi(config);
    }
    World::new(config)
}

/// Whether a launcher (OpenMPI's mpirun, or a PMI one) started this process.
#[cfg(feature = "mpi")]
fn under_mpirun() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// A rank's (mean seconds, wrong elements) made the world's: the slowest
/// rank's time and every rank's wrong elements, on every rank, so that the
/// process that prints (under mpirun, one of several) prints the whole
/// world's figures.
fn whole_world(
    c: &Communicator,
    (secs, wrong): (f64, Option<u64>),
) -> Result<(f64, Option<u64>), Error> {
    let slowest = c
        .all_reduce(&c.tensor(&[secs as f32])?, ReduceOp::Max)?
        .wait()?
        .to_vec::<f32>()?;
    let count = u32::try_from(wrong.unwrap_or(0)).unwrap_or(u32::MAX);
    let wrongs = c
        .all_reduce(&c.tensor(&[count])?, ReduceOp::Sum)?
        .wait()?
        .to_vec::<u32>()?;
    Ok((
        slowest.first().map_or(secs, |&s| f64::from(s).max(secs)),
        wrong.map(|_| wrongs.first().map_or(0, |&w| u64::from(w))),
    ))
}

/// One measured half of a row (out-of-place or in-place).
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: Option<u64>,
    /// How the timed batches varied on the slowest rank (of this
    /// process's).
    pub spread: Spread,
}

/// The timed iterations of one rank, in [`BATCHES`] batches, each batch's
/// time per call: fastest, median, slowest, and the interquartile range
/// over the median.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread {
    pub min_us: f64,
    pub median_us: f64,
    pub max_us: f64,
    pub iqr: f64,
}

impl Spread {
    /// The spread of `secs` (one per iteration).
    fn of(secs: &mut [f64]) -> Spread {
        secs.sort_by(f64::total_cmp);
        let q = |f: f64| {
            let i = (f * secs.len().saturating_sub(1) as f64).round() as usize;
            secs.get(i).copied().unwrap_or(0.0) * 1e6
        };
        let median_us = q(0.5);
        Spread {
            min_us: q(0.0),
            median_us,
            max_us: q(1.0),
            iqr: if median_us > 0.0 {
                (q(0.75) - q(0.25)) / median_us
            } else {
                0.0
            },
        }
    }
}

/// Batches the timed iterations of a row run in.
pub const BATCHES: usize = 5;

/// Above this interquartile range over the median, a row's iterations
/// varied as they do on a busy machine.
pub const BUSY: f64 = 0.3;

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub bytes: u64,
    pub count: usize,
    pub dtype: DType,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    pub out_of_place: Timing,
    pub in_place: Option<Timing>,
    /// The plan the timed collectives ran with (rank 0's; every rank's is
    /// the same), out of place.
    pub plan: Option<Plan>,
    /// Under `--plan all`: whether this row's plan is the one the planner
    /// chose for the size.
    pub chosen: bool,
}

/// How a collective of `bytes` (nccl-tests' size) maps onto tensors.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Elements of each rank's input.
    input: usize,
    /// The length `data::expected_output` calls per_rank.
    per_rank: usize,
    /// Bytes the row reports (the size rounded to what was moved).
    bytes: u64,
}

fn shape(coll: Collective, n: usize, dtype: DType, bytes: u64) -> Shape {
    let count = bytes as usize / dtype.size();
    let (input, per_rank, total) = match coll {
        Collective::AllReduce
        | Collective::Broadcast
        | Collective::Reduce
        | Collective::Sendrecv => (count, count, count),
        Collective::AllGather | Collective::Gather => (count / n, count / n, count / n * n),
        Collective::ReduceScatter | Collective::AllToAll | Collective::Scatter => {
            (count / n * n, count / n, count / n * n)
        }
        // Each rank's input is its own share (see `input_len`); per_rank
        // is the total the counts split.
        Collective::AllGatherV | Collective::ReduceScatterV => (count, count, count),
    };
    Shape {
        input,
        per_rank,
        bytes: (total * dtype.size()) as u64,
    }
}

/// Issues one collective. Out of place, into `out`: one output buffer for
/// the whole measurement, as nccl-tests' recvbuff (a new output per call
/// would measure the pool's rotation of buffers as well).
fn issue(
    c: &Communicator,
    a: &Args,
    x: &Tensor,
    out: &Tensor,
    op: ReduceOp,
    in_place: bool,
) -> Result<Work, Error> {
    match a.collective {
        Collective::AllReduce if in_place => c.all_reduce_in_place(x, op),
        Collective::AllReduce => c.all_reduce_into(x, out, op),
        Collective::AllGather => c.all_gather_into(x, out),
        Collective::ReduceScatter => c.reduce_scatter_into(x, out, op),
        Collective::Broadcast if in_place => c.broadcast_into(x, x, a.root),
        Collective::Broadcast => c.broadcast_into(x, out, a.root),
        Collective::Reduce if in_place => c.reduce_into(x, x, op, a.root),
        Collective::Reduce => c.reduce_into(x, out, op, a.root),
        Collective::AllToAll => {
            let n = c.size();
            let even = vec![x.len() / n.max(1); n];
            c.all_to_all_into(x, out, Some(&even), Some(&even))
        }
        Collective::Sendrecv => {
            let (n, r) = (c.size(), c.rank());
            c.group(|g| {
                if n > 1 {
                    g.send(x, (r + 1) % n)?;
                    g.recv(out, (r + n - 1) % n)?;
                }
                Ok(())
            })
        }
        Collective::Gather => c.gather_into(x, out, a.root),
        Collective::Scatter => c.scatter_into(x, out, a.root),
        Collective::AllGatherV => c.all_gather_v_into(x, out, &data::counts(c.size(), out.len())),
        Collective::ReduceScatterV => {
            c.reduce_scatter_v_into(x, out, &data::counts(c.size(), x.len()), op)
        }
    }
}

/// This rank's input length for a row whose shape gives `input`.
fn input_len(coll: Collective, n: usize, rank: usize, input: usize) -> usize {
    match coll {
        Collective::AllGatherV => data::counts(n, input).get(rank).copied().unwrap_or(0),
        _ => input,
    }
}

/// This rank's output length for a row whose shape gives `input`.
fn output_len(coll: Collective, n: usize, rank: usize, input: usize) -> usize {
    match coll {
        Collective::AllGather | Collective::Gather => input * n,
        Collective::ReduceScatter | Collective::Scatter => input / n.max(1),
        Collective::ReduceScatterV => data::counts(n, input).get(rank).copied().unwrap_or(0),
        _ => input,
    }
}

/// What one rank measured of one placement of one size: mean seconds,
/// wrong elements, the plan, and how the iterations varied.
type Measured = (f64, Option<u64>, Option<Plan>, Spread);

/// Measures one placement of one size on this rank.
fn measure(
    c: &Communicator,
    a: &Args,
    dtype: DType,
    op: ReduceOp,
    s: Shape,
    in_place: bool,
) -> Result<Measured, Error> {
    let (n, r) = (c.size(), c.rank());
    let x = data::tensor(c, dtype, op, input_len(a.collective, n, r, s.input))?;
    let out = c.zeros(dtype, output_len(a.collective, n, r, s.input))?;
    for _ in 0..a.warmup {
        let _ = issue(c, a, &x, &out, op, in_place)?.wait()?;
    }
    let _ = c.barrier()?.wait()?;
    // In batches, each issued back to back and waited for at its end:
    // each batch's time per call is one sample of the spread (per call,
    // waits return in bunches, as the device finishes several at once).
    let batches = a.iters.clamp(1, BATCHES);
    let mut each = Vec::with_capacity(batches);
    let start = Instant::now();
    let mut before = start;
    for b in 0..batches {
        let calls = a.iters / batches + usize::from(b < a.iters % batches);
        let mut last = None;
        for _ in 0..calls {
            last = Some(issue(c, a, &x, &out, op, in_place)?);
        }
        if let Some(w) = last {
            let _ = w.wait()?;
        }
        let now = Instant::now();
        each.push(now.duration_since(before).as_secs_f64() / calls.max(1) as f64);
        before = now;
    }
    let secs = start.elapsed().as_secs_f64() / a.iters.max(1) as f64;
    let spread = Spread::of(&mut each);
    let plan = ran_with(c);
    let mut wrong = None;
    for _ in 0..a.check {
        // Fresh input: in-place iterations have overwritten x.
        let x = data::tensor(c, dtype, op, input_len(a.collective, n, r, s.input))?;
        let y = issue(c, a, &x, &out, op, in_place)?.wait()?;
        let want = |k| {
            let w = data::expected_output(a.collective, op, n, r, a.root, s.per_rank, k);
            // --corrupt: expect something no collective produces.
            w.map(|(v, avg)| {
                if a.corrupt {
                    (v + 1, avg.map(|x| x + 1.0))
                } else {
                    (v, avg)
                }
            })
        };
        *wrong.get_or_insert(0) += data::wrong(&y, n, &want)?;
    }
    Ok((secs, wrong, plan, spread))
}

/// The plan this rank's last collective ran with, from its flight record.
fn ran_with(c: &Communicator) -> Option<Plan> {
    let record = c.flight_record();
    record.ranks.get(c.rank())?.last()?.plan
}

fn timing(bytes: u64, per_rank: &[Measured], factor: f64) -> Timing {
    let secs = per_rank.iter().map(|r| r.0).fold(0.0, f64::max);
    // The row's rank: the slowest.
    let spread = per_rank
        .iter()
        .max_by(|x, y| x.0.total_cmp(&y.0))
        .map(|r| r.3)
        .unwrap_or_default();
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
        spread,
    }
}

/// Runs one size for one dtype and op on every rank.
pub fn row(world: &World, a: &Args, dtype: DType, op: ReduceOp, bytes: u64) -> Result<Row, Error> {
    let s = shape(a.collective, world.size(), dtype, bytes);
    let factor = a.collective.bus_factor(world.size());
    let mut halves = Vec::with_capacity(2);
    let mut plan = None;
    let placements: &[bool] = if a.collective.has_in_place() {
        &[false, true]
    } else {
        &[false]
    };
    for &in_place in placements {
        let processes = world.processes().0;
        let per_rank = world
            .run(|c| {
                let m = measure(c, a, dtype, op, s, in_place)?;
                if processes > 1 {
                    let (plan, spread) = (m.2, m.3);
                    whole_world(c, (m.0, m.1)).map(|(t, w)| (t, w, plan, spread))
                } else {
                    Ok(m)
                }
            })?
            .into_iter()
            .collect::<Result<Vec<_>, Error>>()?;
        if !in_place {
            plan = per_rank.first().and_then(|m| m.2);
        }
        halves.push(timing(s.bytes, &per_rank, factor));
    }
    Ok(Row {
        bytes: s.bytes,
        count: (s.bytes / dtype.size() as u64) as usize,
        dtype,
        op: a.collective.reduces().then_some(op),
        root: a.collective.rooted().then_some(a.root),
        out_of_place: halves[0],
        in_place: halves.get(1).copied(),
        plan,
        chosen: false,
    })
}

/// Where one collective's time goes on each rank (see `Profile`), measured
/// over the timed iterations of one more run of `bytes`.
pub fn time_split(
    world: &World,
    a: &Args,
    dtype: DType,
    op: ReduceOp,
    bytes: u64,
) -> Result<Vec<Profile>, Error> {
    let s = shape(a.collective, world.size(), dtype, bytes);
    world
        .run(|c| {
            let (n, r) = (c.size(), c.rank());
            let x = data::tensor(c, dtype, op, input_len(a.collective, n, r, s.input))?;
            let out = c.zeros(dtype, output_len(a.collective, n, r, s.input))?;
            for _ in 0..a.warmup.max(1) {
                let _ = issue(c, a, &x, &out, op, false)?.wait()?;
            }
            let _ = c.barrier()?.wait()?;
            let _ = c.take_profile();
            c.set_profiling(true);
            for _ in 0..a.iters.max(1) {
                let _ = issue(c, a, &x, &out, op, false)?.wait()?;
            }
            c.set_profiling(false);
            Ok(c.take_profile())
        })?
        .into_iter()
        .collect()
}

/// The time-split lines: per collective, averaged over ranks.
pub fn split_lines(bytes: u64, dtype: DType, op: Option<ReduceOp>, profiles: &[Profile]) -> String {
    let n = profiles.len().max(1) as f64;
    let per = |f: fn(&Profile) -> std::time::Duration| {
        profiles
            .iter()
            .map(|p| f(p).as_secs_f64() * 1e3 / p.collectives.max(1) as f64)
            .sum::<f64>()
            / n
    };
    let (k, t, w) = (per(|p| p.kernels), per(|p| p.transfers), per(|p| p.waiting));
    let total = (k + t + w).max(f64::MIN_POSITIVE);
    let gpu = profiles.iter().all(|p| p.gpu_timestamps);
    let mut s = format!(
        "# Time split at {bytes} B ({} {}, out-of-place; ms per collective, mean over ranks; \
         kernels overlap the host's transfers and waits, shares are of the sum):\n",
        dtype.name(),
        op.map_or("none", ReduceOp::name)
    );
    if gpu {
        s += &format!(
            "#   reduction kernels (GPU timestamps) {k:9.3} ms {:5.1}%\n",
            100.0 * k / total
        );
    } else {
        s += "#   reduction kernels                  not measured: the adapter has no TIMESTAMP_QUERY\n";
    }
    s += &format!(
        "#   transfers (device<->host)          {t:9.3} ms {:5.1}%\n",
        100.0 * t / total
    );
    s += &format!(
        "#   waiting for peers                  {w:9.3} ms {:5.1}%",
        100.0 * w / total
    );
    s
}

/// The title and the devices, above the ceiling.
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
    let m = world.cost_model();
    let shared = world.placement() == wgpu_collectives::Placement::SharedDevice;
    let algo = match (world.plan(), world.algorithm()) {
        _ if a.plan.as_deref() == Some("all") => {
            "every plan that runs each size, forced, one row each; * marks the planner's choice"
                .to_string()
        }
        (Some(plan), _) => format!("plan {plan} (forced) where the collective offers it"),
        (None, wgpu_collectives::Algorithm::Auto | wgpu_collectives::Algorithm::Direct) => {
            if shared {
                "auto: the direct kernels on the shared device where they can run it (plan column)"
                    .to_string()
            } else {
                "auto: the planner's choice per size (plan column)".to_string()
            }
        }
        (None, forced) => format!("{} (forced)", forced.name()),
    };
    s += &format!(
        "#  plan: {algo} (cost model from rank 0: fence {:.1} us, hop {:.3} GB/s, dispatch {:.1} us)\n",
        m.alpha.as_secs_f64() * 1e6,
        m.beta / 1e9,
        m.dispatch.as_secs_f64() * 1e6
    );
    // Left to the engine, a tuned world timed both placements.
    let auto = a.placement.as_deref().is_none_or(|p| p == "auto")
        && std::env::var("WGPU_COLLECTIVES_PLACEMENT")
            .map_or(true, |p| p.trim().is_empty() || p.trim() == "auto");
    let tuned = world.tuning_table().is_some();
    s += &format!(
        "#  placement: {} (transport: {}){}\n",
        world.placement(),
        world.transport(),
        if tuned && auto {
            ", the faster of both as timed here"
        } else {
            ""
        }
    );
    if tuned {
        s += &format!(
            "#  tuning: the planner chooses from plans timed on these devices (table: {})\n",
            world
                .tuning_cache()
                .map_or("not cached".to_string(), |p| p.display().to_string())
        );
    }
    let (processes, local) = world.processes();
    if processes > 1 {
        s += &format!(
            "#  processes: {processes} x {local} local ranks (MPI); the ranks below are this process's, the others' devices are theirs\n"
        );
    }
    for (rank, info) in world.local_ranks().zip(world.adapters()) {
        s += &format!(
            "#  Rank {rank:2} on {} [{:?}, {:?}] driver {} {}\n",
            info.name, info.backend, info.device_type, info.driver, info.driver_info
        );
    }
    s
}

/// The table's column headings.
pub fn columns() -> String {
    let mut s = format!(
        "#{:>58}{:>34}{:>13}{:>25}\n",
        "out-of-place", "in-place", "", "out-of-place batches"
    );
    s += &format!(
        "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>10} {:>7} {:>7} {:>6} {:>10} {:>7} {:>7} {:>6} {:>12} {:>6} {:>9} {:>9}\n",
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
        "#wrong",
        "plan",
        "iqr",
        "min",
        "max"
    );
    s += &format!(
        "#{:>11} {:>12} {:>8} {:>6} {:>6} {:>10} {:>7} {:>7} {:>6} {:>10} {:>7} {:>7} {:>6} {:>12} {:>6} {:>9} {:>9}",
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
        "",
        "",
        "(%)",
        "(us)",
        "(us)"
    );
    s
}

fn half(t: Option<&Timing>) -> String {
    match t {
        None => format!("{:>10} {:>7} {:>7} {:>6}", "N/A", "N/A", "N/A", "N/A"),
        Some(t) => {
            let wrong = t.wrong.map_or("N/A".to_string(), |w| w.to_string());
            format!(
                "{:>10.1} {:>7.3} {:>7.3} {:>6}",
                t.us, t.algbw, t.busbw, wrong
            )
        }
    }
}

/// One table line, as nccl-tests prints it.
pub fn line(r: &Row) -> String {
    format!(
        " {:>11} {:>12} {:>8} {:>6} {:>6} {} {} {:>12} {:>6.0} {:>9.1} {:>9.1}",
        r.bytes,
        r.count,
        r.dtype.name(),
        r.op.map_or("none", ReduceOp::name),
        r.root.map_or(-1, |x| x as i64),
        half(Some(&r.out_of_place)),
        half(r.in_place.as_ref()),
        match (r.plan, r.chosen) {
            (None, _) => "?".to_string(),
            (Some(p), false) => p.name().to_string(),
            (Some(p), true) => format!("{}*", p.name()),
        },
        r.out_of_place.spread.iqr * 100.0,
        r.out_of_place.spread.min_us,
        r.out_of_place.spread.max_us,
    )
}
