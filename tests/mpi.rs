//! Collectives across processes, run under mpirun (feature `mpi`):
//! `mpirun -n P target/release/deps/mpi-*`, each process holding 2 ranks.
//! Every process runs the same checks in the same order (one MPI universe
//! per process, so no test harness); every rank checks its own result
//! against a CPU reference, and any failure makes the process exit 1.
//!
//! `WGPU_COLLECTIVES_MPI_TEST=kill` instead runs the failure check for
//! `mpirun --enable-recovery`: the last process exits in the middle of
//! a collective, and every other must end with an error naming one of its
//! ranks, well within the timeout (see .ci/run). `=disagree` checks that
//! processes asking for different rank counts all get an error;
//! `=disagree-tune`, `=disagree-given` and `=disagree-heal` the same of
//! tune modes, given tuning tables and healing. `=heal` checks that a world over several
//! processes heals as one: process 0 decides, every rank of every process
//! runs the same plan at every call, and process 0 rewrites its cache.
//! `=levels` checks what `from_mpi_comm` and `from_mpi` say where MPI is
//! not initialised, or initialised by the application (without
//! `MPI_THREAD_MULTIPLE`); the application that uses MPI itself is
//! `examples/mpi_app.rs`. `=two-level` checks the two-level plan (see
//! `two_levels`). Junk on the wire is a library test
//! (`api/world_mpi/junk.rs`): the forging is not public.

#[path = "common/mod.rs"]
mod common;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::{Num, check, inputs, ops_for, reference};
use half::{bf16, f16};
use wgpu_collectives::{
    Communicator, DType, Error, FoldOrder, Plan, ReduceOp, Tune, World, WorldConfig,
};

type Check = Result<(), String>;
/// A check every rank runs, made at run time.
type CheckFn = dyn Fn(&Communicator) -> Check + Sync;
/// A named check every rank runs.
type Named = (&'static str, fn(&Communicator) -> Check);

fn fail(what: &str, e: Error) -> String {
    format!("{what}: {e}")
}

/// all_reduce of every op on `T` at `lens`.
fn all_reduce<T: Num>(c: &Communicator, lens: &[usize]) -> Check {
    all_reduce_by::<T>(c, lens, None)
}

/// [`all_reduce`], each call checked to have run with `plan` where one is
/// given.
fn all_reduce_by<T: Num>(c: &Communicator, lens: &[usize], plan: Option<Plan>) -> Check {
    let n = c.size();
    for op in ops_for(T::DTYPE) {
        for &len in lens {
            let what = format!("all_reduce {} {op:?} len {len}", T::DTYPE.name());
            let x = c
                .tensor(&inputs::<T>(op, c.rank(), len))
                .map_err(|e| fail(&what, e))?;
            let y = c
                .all_reduce(&x, op)
                .and_then(|w| w.wait())
                .and_then(|t| t.to_vec::<T>())
                .map_err(|e| fail(&what, e))?;
            check(&what, op, &y, &reference::<T>(op, n, len));
            let ran = last_plan(c);
            if plan.is_some_and(|p| ran != Some(p)) {
                return Err(format!("{what}: ran {ran:?}, not {plan:?}"));
            }
        }
    }
    Ok(())
}

fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13) % 101) as f32 * 0.25)
        .collect()
}

/// all_gather, reduce_scatter (even and uneven), broadcast, reduce, all_to_all, barrier,
/// coalesced all_reduce, against the values every rank can compute.
fn the_others(c: &Communicator) -> Check {
    let (n, me) = (c.size(), c.rank());
    let len = 3001;
    let x = c.tensor(&values(me, len)).map_err(|e| fail("tensor", e))?;
    let get = |r: Result<wgpu_collectives::Tensor, Error>, what: &str| {
        r.and_then(|t| t.to_vec::<f32>()).map_err(|e| fail(what, e))
    };
    let all: Vec<f32> = (0..n).flat_map(|r| values(r, len)).collect();
    let gathered = get(c.all_gather(&x).and_then(|w| w.wait()), "all_gather")?;
    assert_eq!(gathered, all, "all_gather");

    let per = 1000;
    let big = c
        .tensor(&values(me, per * n))
        .map_err(|e| fail("tensor", e))?;
    let scattered = get(
        c.reduce_scatter(&big, ReduceOp::Max).and_then(|w| w.wait()),
        "reduce_scatter",
    )?;
    let want: Vec<f32> = (me * per..(me + 1) * per)
        .map(|i| {
            (0..n)
                .map(|r| values(r, per * n)[i])
                .fold(f32::MIN, f32::max)
        })
        .collect();
    assert_eq!(scattered, want, "reduce_scatter max");

    // The uneven forms, with counts that grow by rank (rank 0 gives none).
    let counts: Vec<usize> = (0..n).map(|r| 5 * r).collect();
    let mine = c
        .tensor(&values(me, counts[me]))
        .map_err(|e| fail("tensor", e))?;
    let gathered = get(
        c.all_gather_v(&mine, &counts).and_then(|w| w.wait()),
        "all_gather_v",
    )?;
    let want: Vec<f32> = (0..n).flat_map(|r| values(r, counts[r])).collect();
    assert_eq!(gathered, want, "all_gather_v");
    let total: usize = counts.iter().sum();
    let whole = c
        .tensor(&values(me, total))
        .map_err(|e| fail("tensor", e))?;
    let mine = get(
        c.reduce_scatter_v(&whole, &counts, ReduceOp::Max)
            .and_then(|w| w.wait()),
        "reduce_scatter_v",
    )?;
    let at: usize = counts[..me].iter().sum();
    let want: Vec<f32> = (at..at + counts[me])
        .map(|i| (0..n).map(|r| values(r, total)[i]).fold(f32::MIN, f32::max))
        .collect();
    assert_eq!(mine, want, "reduce_scatter_v max");

    let root = n - 1;
    let b = get(c.broadcast(&x, root).and_then(|w| w.wait()), "broadcast")?;
    assert_eq!(b, values(root, len), "broadcast from the last rank");

    let r = c
        .reduce(&x, ReduceOp::Min, 1)
        .and_then(|w| w.wait())
        .map_err(|e| fail("reduce", e))?;
    if me == 1 {
        let got = r.to_vec::<f32>().map_err(|e| fail("reduce", e))?;
        let want: Vec<f32> = (0..len)
            .map(|i| (0..n).map(|q| values(q, len)[i]).fold(f32::MAX, f32::min))
            .collect();
        assert_eq!(got, want, "reduce min to rank 1");
    }

    // all_to_all: rank r sends r + 1 + j elements to rank j.
    let send: Vec<usize> = (0..n).map(|j| me + 1 + j).collect();
    let recv: Vec<usize> = (0..n).map(|j| j + 1 + me).collect();
    let mine: Vec<u32> = (0..send.iter().sum::<usize>())
        .map(|i| (me * 1000 + i) as u32)
        .collect();
    let t = c.tensor(&mine).map_err(|e| fail("tensor", e))?;
    let got = c
        .all_to_all(&t, Some(&send), Some(&recv))
        .and_then(|w| w.wait())
        .and_then(|t| t.to_vec::<u32>())
        .map_err(|e| fail("all_to_all", e))?;
    let mut want = Vec::new();
    for j in 0..n {
        let start: usize = (0..me).map(|k| j + 1 + k).sum();
        want.extend((start..start + me + 1 + j).map(|i| (j * 1000 + i) as u32));
    }
    assert_eq!(got, want, "all_to_all");

    c.barrier()
        .and_then(|w| w.wait().map(drop))
        .map_err(|e| fail("barrier", e))?;

    let parts = [c.tensor(&[me as i32; 5]), c.tensor(&[1i32; 300])];
    let parts: Vec<_> = parts
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| fail("tensor", e))?;
    let sums = c
        .all_reduce_coalesced(&parts, ReduceOp::Sum)
        .and_then(|w| w.wait_all())
        .map_err(|e| fail("all_reduce_coalesced", e))?;
    let total = (0..n as i32).sum::<i32>();
    assert_eq!(
        sums[0].to_vec::<i32>().map_err(|e| fail("read", e))?,
        vec![total; 5]
    );
    assert_eq!(
        sums[1].to_vec::<i32>().map_err(|e| fail("read", e))?,
        vec![n as i32; 300]
    );
    Ok(())
}

/// Even and odd ranks split (each group spans every process), then
/// all-reduce; and a ring of sends and receives across processes.
fn split_and_p2p(c: &Communicator) -> Check {
    let (n, me) = (c.size(), c.rank());
    let sub = c
        .split(Some((me % 2) as u32), me)
        .map_err(|e| fail("split", e))?
        .ok_or("split gave no communicator")?;
    let x = sub.tensor(&[me as u32, 1]).map_err(|e| fail("tensor", e))?;
    let got = sub
        .all_reduce(&x, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .and_then(|t| t.to_vec::<u32>())
        .map_err(|e| fail("split all_reduce", e))?;
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    let want = vec![members.iter().sum::<usize>() as u32, members.len() as u32];
    assert_eq!(got, want, "all_reduce in the split group of rank {me}");

    let len = 300_001; // more than one slice
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let out = c.tensor(&vec![0f32; len]).map_err(|e| fail("tensor", e))?;
    let x = c.tensor(&values(me, len)).map_err(|e| fail("tensor", e))?;
    let got = c
        .group(|g| {
            g.send(&x, next)?;
            g.recv(&out, prev)?;
            Ok(())
        })
        .and_then(|w| w.wait_all())
        .and_then(|_| out.to_vec::<f32>())
        .map_err(|e| fail("send/recv ring", e))?;
    assert_eq!(
        got,
        values(prev, len),
        "rank {me} received from rank {prev}"
    );
    Ok(())
}

/// A split of one process's ranks (they share its device) meets there:
/// its all_reduce and all_gather run the shared device's kernels (the plan
/// forced through the environment, when one is), against the CPU's sum.
fn split_by_process(c: &Communicator) -> Check {
    let me = c.rank();
    // Every process holds 2 ranks (see `main`).
    let sub = c
        .split(Some((me / 2) as u32), me)
        .map_err(|e| fail("split", e))?
        .ok_or("split gave no communicator")?;
    let members = [me / 2 * 2, me / 2 * 2 + 1];
    let len = 300_001; // more than one slice
    let x = sub
        .tensor(&values(me, len))
        .map_err(|e| fail("tensor", e))?;
    let got = sub
        .all_reduce(&x, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .and_then(|t| t.to_vec::<f32>())
        .map_err(|e| fail("all_reduce in the process's split", e))?;
    let (a, b) = (values(members[0], len), values(members[1], len));
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    if got != want {
        return Err(format!("rank {me}: the process's split summed other bits"));
    }
    let forced = std::env::var("WGPU_COLLECTIVES_PLAN")
        .ok()
        .filter(|p| !p.is_empty() && p != "auto");
    let ran = sub.flight_record().ranks[sub.rank()]
        .last()
        .and_then(|e| e.plan);
    match (&forced, ran) {
        (None, Some(wgpu_collectives::Plan::Direct)) => {}
        (Some(f), Some(p)) if p.name() == f.as_str() => {}
        _ => {
            return Err(format!(
                "rank {me}: the process's split ran {ran:?} (forced: {forced:?}), not on its shared device"
            ));
        }
    }
    let gathered = sub
        .all_gather(&x)
        .and_then(|w| w.wait())
        .and_then(|t| t.to_vec::<f32>())
        .map_err(|e| fail("all_gather in the process's split", e))?;
    if gathered != [a, b].concat() {
        return Err(format!(
            "rank {me}: the process's split gathered other bytes"
        ));
    }
    Ok(())
}

/// A call that differs on one rank: every rank must fail, none hang.
fn mismatch(c: &Communicator) -> Check {
    let len = if c.rank() == 0 { 5 } else { 6 };
    let x = c.tensor(&vec![1f32; len]).map_err(|e| fail("tensor", e))?;
    match c.all_reduce(&x, ReduceOp::Sum).and_then(|w| w.wait()) {
        Ok(_) => Err(format!(
            "rank {}: a mismatched all_reduce succeeded",
            c.rank()
        )),
        Err(Error::Mismatch { .. } | Error::PeerFailed { .. }) => Ok(()),
        Err(e) => Err(format!("rank {}: expected a mismatch, got {e}", c.rank())),
    }
}

/// Under `mpirun --enable-recovery`: the last process exits in the
/// middle of a 64 MiB all_reduce, with slices in flight between the
/// processes; the others' ranks must report an error naming one of its
/// ranks in bounded time.
fn killed(world: &World, timeout: Duration) -> ExitCode {
    let (processes, local) = world.processes();
    let dying = world.local_ranks().contains(&(world.size() - 1));
    let start = Instant::now();
    let results = world.run(|c| -> Result<(), Error> {
        let x = c.tensor(&vec![1f32; 16 << 20])?;
        for i in 0.. {
            let work = c.all_reduce(&x, ReduceOp::Sum)?;
            if dying && i == 1 {
                // The whole process goes, as a crash would, while the
                // collective it issued runs (a 64 MiB all_reduce takes
                // well over 100 ms here).
                std::thread::sleep(Duration::from_millis(40));
                std::process::exit(9);
            }
            let _ = work.wait()?;
        }
        Ok(())
    });
    let took = start.elapsed();
    if dying {
        // It was to exit in its second collective: a first that failed
        // (a timeout, say) proves nothing of a death.
        println!("the process meant to die ended its run instead: {results:?}");
        return ExitCode::FAILURE;
    }
    let theirs: Vec<usize> = ((processes - 1) * local..processes * local).collect();
    let results = match results {
        Ok(r) if !r.is_empty() => r,
        Ok(_) => return ExitCode::FAILURE,
        Err(e) => {
            println!("survivor's run failed as a whole: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    for r in results {
        match r {
            Ok(()) => ok = false,
            Err(e) => {
                let text = e.to_string();
                // The error itself, not its flight record (which names
                // every rank).
                let head = text.lines().next().unwrap_or_default();
                let named = theirs.iter().any(|q| head.contains(&format!("rank {q}")));
                println!("survivor error after {took:?}: {text}");
                ok &= named;
            }
        }
    }
    ok &= took < timeout * 3;
    if ok {
        // .ci/run counts these lines: mpirun's own status is the dead
        // process's.
        println!("kill check passed on a survivor ({processes} processes)");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Process 0 asks for 2 ranks, the others for 1: every process must get
/// `Error::Transport` naming what each said, none a world or a hang.
fn disagree(case: &str) -> ExitCode {
    let process: usize = std::env::var("OMPI_COMM_WORLD_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let base = || WorldConfig::new(2).with_timeout(Duration::from_secs(10));
    let table = |p: usize| {
        format!(
            "wgpu-collectives tuning 3\nkey process {p}\n\
             all_reduce device-ring 4096:1e-4\nhost-fold other-bits\nkernel-units 1\nend\n"
        )
    };
    // Rank counts, tune modes, given tables: each disagreement an error on
    // every process, naming what differs, before anything is timed.
    let cases: [(&str, WorldConfig, &[&str]); 4] = [
        (
            "rank counts",
            WorldConfig::new(if process == 0 { 2 } else { 1 })
                .with_timeout(Duration::from_secs(10)),
            &["process 0: 2 ranks", "process 1: 1 ranks"],
        ),
        (
            "tune modes",
            base().with_tune(if process == 0 {
                Tune::Off
            } else {
                Tune::Measure
            }),
            &["WGPU_COLLECTIVES_TUNE=off", "WGPU_COLLECTIVES_TUNE=measure"],
        ),
        (
            "given tables",
            base().with_tune_table(table(process)),
            &["with_tune_table"],
        ),
        (
            "healing",
            base().with_healing(process == 0),
            &["WGPU_COLLECTIVES_HEAL=on", "WGPU_COLLECTIVES_HEAL=off"],
        ),
    ];
    // One world per job: a failed one ends MPI in the process.
    for (what, config, words) in cases.into_iter().filter(|c| c.0.starts_with(case)) {
        match World::from_mpi(config) {
            Err(Error::Transport { what: why, .. }) if words.iter().all(|w| why.contains(w)) => {
                println!("disagree check ({what}) passed on process {process}: {why}");
            }
            Err(e) => {
                println!(
                    "process {process}, {what}: expected Error::Transport naming {words:?}, got {e}"
                );
                return ExitCode::FAILURE;
            }
            Ok(_) => {
                println!(
                    "process {process}: a world was made from processes disagreeing on {what}"
                );
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// The last rank (in the last process) returns at once: rank 1's receive
/// from it fails within seconds naming it, not at the timeout (20 s),
/// though it lives in another process. (A send to it completes once MPI
/// Rank `r`'s `call` with rank `last`, which returned from its closure:
/// it must fail with `PeerFailed` naming `last`, well within the timeout.
fn told_at_once(
    r: usize,
    last: usize,
    what: &str,
    call: impl FnOnce() -> Result<wgpu_collectives::Tensor, Error>,
) -> Check {
    let start = Instant::now();
    match call().map(drop) {
        Err(Error::PeerFailed { peer, reason, .. })
            if peer == last && reason.contains(&format!("rank {last} returned")) =>
        {
            if start.elapsed() < Duration::from_secs(5) {
                Ok(())
            } else {
                Err(format!("rank {r}: told after {:?}", start.elapsed()))
            }
        }
        Err(e) => Err(format!(
            "rank {r}: expected PeerFailed naming rank {last}, got {e}"
        )),
        Ok(()) => Err(format!("rank {r}: a {what} a departed rank succeeded")),
    }
}

/// has its bytes, as `MPI_Send` of a small message does.)
fn departed_peer(c: &Communicator) -> Check {
    let (n, r) = (c.size(), c.rank());
    let last = n - 1;
    if r != 1 {
        return Ok(());
    }
    let x = c.tensor(&[1.0f32; 16]).map_err(|e| fail("a tensor", e))?;
    told_at_once(r, last, "receive from", || {
        c.recv(&x, last).and_then(|w| w.wait())
    })
}

/// Rank 1 sends to the last rank (another process's), which returns
/// without receiving: the send fails naming it, long before the timeout,
/// rather than completing once MPI had its bytes. Then rank 1 sends to
/// rank 2 (another process's too, with 2 or more), which receives: that
/// send completes only once it was matched, and the bytes arrive.
fn departed_receiver(c: &Communicator) -> Check {
    let (n, r) = (c.size(), c.rank());
    let last = n - 1;
    let x = c.tensor(&[1.0f32; 16]).map_err(|e| fail("a tensor", e))?;
    if r == 2 && last != 2 {
        let y = c
            .zeros(wgpu_collectives::DType::F32, 16)
            .map_err(|e| fail("zeros", e))?;
        let _ = c
            .recv(&y, 1)
            .and_then(|w| w.wait())
            .map_err(|e| fail("rank 2's receive", e))?;
        let got = y.to_vec::<f32>().map_err(|e| fail("read back", e))?;
        return (got == [1.0f32; 16])
            .then_some(())
            .ok_or(format!("rank 2 received {got:?}"));
    }
    if r != 1 {
        return Ok(());
    }
    if last != 2 {
        let _ = c
            .send(&x, 2)
            .and_then(|w| w.wait())
            .map_err(|e| fail("rank 1's send to rank 2", e))?;
    }
    told_at_once(r, last, "send to", || {
        c.send(&x, last).and_then(|w| w.wait())
    })
}

/// The plan each of a rank's all_reduce calls ran, as indices into
/// `Plan::ALL` (`u32::MAX`: none recorded).
fn plan_index(c: &Communicator) -> u32 {
    c.flight_record().ranks[c.rank()]
        .last()
        .and_then(|e| e.plan)
        .and_then(|p| wgpu_collectives::Plan::ALL.iter().position(|&q| q == p))
        .map_or(u32::MAX, |i| i as u32)
}

/// A world over every process heals a table that predicts 1 ns for
/// every all_reduce plan: any real call is slower than that by far, so
/// process 0 must explore (whatever the machine's speed or load: nothing
/// here depends on timing), every rank of every process must run the plan
/// it directs at every call, and process 0 must keep what it learned.
fn healing() -> ExitCode {
    // Only process 0 reads or writes a cache: each its own folder.
    let dir = std::env::temp_dir().join(format!("wgc-mpi-heal-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = |tune| {
        WorldConfig::new(2)
            .with_timeout(Duration::from_secs(60))
            .with_tune(tune)
            .with_tune_cache(&dir)
            .with_busy_limit(1.0)
            .with_healing(true)
    };
    let result = (|| -> Result<String, String> {
        let first = World::from_mpi(config(Tune::Measure)).map_err(|e| fail("measure", e))?;
        let process0 = first.local_ranks().start == 0;
        let path = first.tuning_cache().map(|p| p.to_path_buf());
        // (MPI ends with the last world: `first` lives on.)
        // Process 0 rewrites its cache: 1 ns for every all_reduce point.
        let mut forged = String::new();
        if process0 {
            let path = path.as_ref().ok_or("process 0 cached no table")?;
            let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            for line in text.lines().filter(|l| *l != "second-look") {
                let mut words = line.split_whitespace();
                if words.next() == Some("all_reduce") {
                    let plan = words.next().unwrap_or("?");
                    forged += &format!("all_reduce {plan} 4096:1e-9~0.01 1048576:1e-9~0.01\n");
                } else {
                    forged += line;
                    forged += "\n";
                }
            }
            std::fs::write(path, &forged).map_err(|e| e.to_string())?;
        }
        let world = World::from_mpi(config(Tune::Cached)).map_err(|e| fail("cached", e))?;
        if process0 && world.tuning_table() != Some(forged.as_str()) {
            return Err(format!(
                "the world did not read the forged table: {:?}",
                world.tuning_table()
            ));
        }
        let calls = 200;
        let len = 16 << 10;
        let runs = world
            .run(|c| -> Result<Vec<u32>, String> {
                let n = c.size() as f32;
                let x = c
                    .tensor(&vec![1.0f32; len])
                    .map_err(|e| fail("tensor", e))?;
                let mut plans = Vec::with_capacity(calls);
                for call in 0..calls {
                    let y = c
                        .all_reduce(&x, ReduceOp::Sum)
                        .and_then(|w| w.wait())
                        .and_then(|t| t.to_vec::<f32>())
                        .map_err(|e| fail(&format!("all_reduce #{call}"), e))?;
                    if y.iter().any(|&v| v != n) {
                        return Err(format!("all_reduce #{call}: not {n} everywhere"));
                    }
                    plans.push(plan_index(c));
                }
                // Every rank's plans, of every process.
                let all = c
                    .tensor(&plans)
                    .and_then(|t| c.all_gather(&t))
                    .and_then(|w| w.wait())
                    .and_then(|t| t.to_vec::<u32>())
                    .map_err(|e| fail("the plans", e))?;
                for (r, theirs) in all.chunks(calls).enumerate() {
                    if let Some(i) = (0..calls).find(|&i| theirs[i] != plans[i]) {
                        return Err(format!(
                            "call {i}: rank {r} ran plan #{}, rank {} plan #{}",
                            theirs[i],
                            c.rank(),
                            plans[i]
                        ));
                    }
                }
                Ok(plans)
            })
            .map_err(|e| fail("run", e))?;
        let mut plans = Vec::new();
        for r in runs {
            plans = r?;
        }
        let mut ran: Vec<u32> = plans.clone();
        ran.sort_unstable();
        ran.dedup();
        if ran.len() < 2 {
            return Err(format!("no plan but #{ran:?} ran: nothing was explored"));
        }
        if process0 {
            let path = path.as_ref().ok_or("no cache")?;
            let now = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            if now == forged {
                return Err("process 0 did not rewrite its cache with what it learned".into());
            }
        }
        drop((world, first));
        Ok(format!(
            "plans {ran:?} ran, the same on every rank at every call"
        ))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(what) => {
            println!("heal check passed: {what}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("heal check FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What `from_mpi_comm` and `from_mpi` say where MPI is not as they need
/// it: not initialised yet, initialised by the application without
/// `MPI_THREAD_MULTIPLE`, initialised by the application at all (for
/// `from_mpi`).
fn thread_levels() -> ExitCode {
    let expect = |what: &str, r: Result<World, Error>, needle: &str| -> Check {
        match r {
            Err(Error::Transport { what: text, .. }) if text.contains(needle) => Ok(()),
            Err(e) => Err(format!("{what}: {e} (wanted an error saying {needle:?})")),
            Ok(_) => Err(format!("{what}: a world was made")),
        }
    };
    let config = || WorldConfig::new(2).with_timeout(Duration::from_secs(20));
    let before = expect(
        "from_mpi_comm before MPI_Init",
        World::from_mpi_comm(&mpi::topology::SimpleCommunicator::world(), config()),
        "MPI is not initialised",
    );
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        eprintln!("levels check FAILED: MPI_Init_thread");
        return ExitCode::FAILURE;
    };
    let result = before
        .and_then(|()| {
            expect(
                "from_mpi_comm under MPI_THREAD_FUNNELED",
                World::from_mpi_comm(&universe.world(), config()),
                "initialise it with MPI_THREAD_MULTIPLE",
            )
        })
        .and_then(|()| {
            expect(
                "from_mpi where the application initialised MPI",
                World::from_mpi(config()),
                "World::from_mpi_comm",
            )
        });
    match result {
        Ok(()) => {
            println!("levels check passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("levels check FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The plan `c`'s last collective ran with.
fn last_plan(c: &Communicator) -> Option<Plan> {
    c.flight_record().ranks[c.rank()]
        .last()
        .and_then(|e| e.plan)
}

/// all_reduce of every op on `T` at `lens`, each in two levels.
fn in_two_levels<T: Num>(c: &Communicator, lens: &[usize]) -> Check {
    all_reduce_by::<T>(c, lens, Some(Plan::TwoLevel))
}

/// A two-level all_reduce in place, over a view the schedule cannot bind
/// where it lies: the bytes around the view untouched.
fn in_two_levels_on_a_view(c: &Communicator) -> Check {
    let len = 100_003;
    let x = c
        .tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), len + 3))
        .map_err(|e| fail("tensor", e))?;
    let view = c
        .wrap_buffer(x.buffer(), 12, DType::F32, len)
        .map_err(|e| fail("a view", e))?;
    let _ = c
        .all_reduce_in_place(&view, ReduceOp::Sum)
        .and_then(|w| w.wait())
        .map_err(|e| fail("two-level in place", e))?;
    let got = x.to_vec::<f32>().map_err(|e| fail("read back", e))?;
    let mut want = inputs::<f32>(ReduceOp::Sum, c.rank(), 3);
    let all = reference::<f32>(ReduceOp::Sum, c.size(), len + 3);
    want.extend_from_slice(&all[3..]);
    check(
        "two-level all_reduce in place on a view",
        ReduceOp::Sum,
        &got,
        &want,
    );
    if last_plan(c) != Some(Plan::TwoLevel) {
        return Err(format!("in place: ran {:?}", last_plan(c)));
    }
    Ok(())
}

/// A table in which all_reduce's two-level plan is the fastest at every
/// size, timed where the host does not fold the adapter's bits.
const TWO_LEVEL_FASTEST: &str = "wgpu-collectives tuning 3\nkey mpi test\n\
    all_reduce two-level 4096:1e-5~0.02 67108864:1e-3~0.02\n\
    all_reduce device-ring 4096:1e-4~0.02 67108864:1e-2~0.02\n\
    host-fold other-bits\nkernel-units 1\nend\n";

/// A world over MPI made as `config` says, or `None` once the reason
/// (`what` names the world) is printed.
fn made(config: WorldConfig, what: &str) -> Option<World> {
    World::from_mpi(config)
        .map_err(|e| eprintln!("World::from_mpi ({what}): {e}"))
        .ok()
}

/// `=two-level`: with `FoldOrder::Fastest` and the two-level plan forced,
/// every dtype and op against the CPU reference (inputs whose sums are
/// exact in any order), odd lengths whose shards differ, and in place on
/// a view. Then, in the canonical order, the forced plan still runs
/// integers but refuses floats, naming the opt-in. Last, chosen by a given
/// table where the host does not fold (a GPU's case): the exchange runs
/// the device ring.
fn two_levels() -> ExitCode {
    let base = WorldConfig::new(2)
        .with_timeout(Duration::from_secs(20))
        .with_plan(Some(Plan::TwoLevel));
    let Some(fastest) = made(base.clone().with_fold_order(FoldOrder::Fastest), "fastest") else {
        return ExitCode::FAILURE;
    };
    let named: Vec<(&str, Box<CheckFn>)> = vec![
        (
            "two-level f32",
            Box::new(|c: &Communicator| in_two_levels::<f32>(c, &[1, 7, 4099, 300_001])),
        ),
        (
            "two-level f16",
            Box::new(|c: &Communicator| in_two_levels::<f16>(c, &[7, 4099])),
        ),
        (
            "two-level bf16",
            Box::new(|c: &Communicator| in_two_levels::<bf16>(c, &[7, 4099])),
        ),
        (
            "two-level i32",
            Box::new(|c: &Communicator| in_two_levels::<i32>(c, &[7, 300_001])),
        ),
        (
            "two-level u32",
            Box::new(|c: &Communicator| in_two_levels::<u32>(c, &[7, 4099])),
        ),
        (
            "two-level in place on a view",
            Box::new(in_two_levels_on_a_view),
        ),
    ];
    let mut ok = passes(&fastest, &named);
    let Some(canonical) = made(base, "canonical") else {
        return ExitCode::FAILURE;
    };
    let refused: Vec<(&str, Box<CheckFn>)> = vec![
        (
            "two-level integers in the canonical order",
            Box::new(|c: &Communicator| in_two_levels::<i32>(c, &[4099])),
        ),
        (
            "two-level floats refused in the canonical order",
            Box::new(|c: &Communicator| {
                let x = c.tensor(&[1.0f32; 64]).map_err(|e| fail("tensor", e))?;
                // Refused by every rank itself, never reported as a
                // peer's failure.
                match c.all_reduce(&x, ReduceOp::Sum).and_then(|w| w.wait()) {
                    Err(Error::InvalidArgument { what: why, .. })
                        if why.contains("FoldOrder::Fastest") =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(format!("refused, but not naming the opt-in: {e}")),
                    Ok(_) => Err("a float all_reduce ran two-level in the canonical order".into()),
                }
            }),
        ),
    ];
    ok &= passes(&canonical, &refused);
    // Chosen by a given table where the host does not fold this adapter's
    // bits (as on a GPU): the exchange between processes runs the device
    // ring on a shard in device memory, not the host ring in a host image.
    let Some(on_devices) = made(
        WorldConfig::new(2)
            .with_timeout(Duration::from_secs(20))
            .with_fold_order(FoldOrder::Fastest)
            .with_tune_table(TWO_LEVEL_FASTEST),
        "a given table",
    ) else {
        return ExitCode::FAILURE;
    };
    let chosen: Vec<(&str, Box<CheckFn>)> = vec![
        (
            "two-level by the table, the device ring between processes, f32",
            Box::new(|c: &Communicator| in_two_levels::<f32>(c, &[7, 300_001])),
        ),
        (
            "two-level by the table, the device ring between processes, i32",
            Box::new(|c: &Communicator| in_two_levels::<i32>(c, &[4099])),
        ),
        (
            "two-level by the table, the device ring between processes, on a view",
            Box::new(in_two_levels_on_a_view),
        ),
    ];
    ok &= passes(&on_devices, &chosen);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs every named check on every rank of `world`, printing a line per
/// check for this process; whether all passed.
fn passes(world: &World, named: &[(&str, Box<CheckFn>)]) -> bool {
    let (processes, local) = world.processes();
    let me = world.local_ranks();
    let mut failed = false;
    for (name, f) in named {
        let start = Instant::now();
        let results =
            world.run(|c| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(c))));
        let mut line = Vec::new();
        match results {
            Err(e) => {
                failed = true;
                line.push(format!("run failed: {e}"));
            }
            Ok(rs) => {
                for (rank, r) in me.clone().zip(rs) {
                    match r {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => {
                            failed = true;
                            line.push(format!("rank {rank}: {e}"));
                        }
                        Err(_) => {
                            failed = true;
                            line.push(format!("rank {rank} panicked"));
                        }
                    }
                }
            }
        }
        let verdict = if line.is_empty() { "ok" } else { "FAILED" };
        println!(
            "process {} of {processes} (ranks {me:?}): {name}: {verdict} in {:?} {}",
            me.start / local.max(1),
            start.elapsed(),
            line.join("; ")
        );
    }
    !failed
}

fn main() -> ExitCode {
    let mode = std::env::var("WGPU_COLLECTIVES_MPI_TEST").unwrap_or_default();
    if mode == "heal" {
        return healing();
    }
    if mode == "levels" {
        return thread_levels();
    }
    if mode == "two-level" {
        return two_levels();
    }
    if let Some(case) = mode.strip_prefix("disagree") {
        // `disagree` (rank counts), `disagree-tune`, `disagree-given`,
        // `disagree-heal`.
        return disagree(match case {
            "-tune" => "tune",
            "-given" => "given",
            "-heal" => "heal",
            _ => "rank",
        });
    }
    let kill = mode == "kill";
    // The kill check waits out one timeout: a short one keeps CI short.
    let timeout = Duration::from_secs(if kill { 5 } else { 20 });
    let world = match World::from_mpi(WorldConfig::new(2).with_timeout(timeout)) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("World::from_mpi: {e}");
            return ExitCode::FAILURE;
        }
    };
    if kill {
        return killed(&world, timeout);
    }
    // The mismatch goes last: a failed run's late messages could reach a
    // later run (a world that failed is made anew, as in NCCL).
    let checks: [Named; 11] = [
        ("all_reduce f32", |c| all_reduce::<f32>(c, &[1, 7, 300_001])),
        ("all_reduce f16", |c| all_reduce::<f16>(c, &[7, 4099])),
        ("all_reduce bf16", |c| all_reduce::<bf16>(c, &[7, 4099])),
        ("all_reduce i32", |c| all_reduce::<i32>(c, &[7, 4099])),
        ("all_reduce u32", |c| all_reduce::<u32>(c, &[7, 4099])),
        ("the other collectives", the_others),
        ("split and point-to-point", split_and_p2p),
        (
            "a split of one process meets on its device",
            split_by_process,
        ),
        ("a receive whose peer returned", departed_peer),
        ("a send whose receiver returned", departed_receiver),
        ("one rank issues another length", mismatch),
    ];
    let mut failed = false;
    // Every process decides from one tuning table (process 0's): the
    // same text everywhere, and the same plan on every rank for a call.
    // A plan forced through the environment (CI runs the device ring so)
    // is not tuned for, and runs on every rank.
    let table = world.tuning_table().unwrap_or_default().to_string();
    let forced = std::env::var("WGPU_COLLECTIVES_PLAN").is_ok_and(|p| !p.is_empty() && p != "auto");
    let one_table = move |c: &Communicator| -> Check {
        if forced != table.is_empty() {
            return Err(format!(
                "a world with a forced plan ({forced}) is tuned ({})",
                !table.is_empty()
            ));
        }
        let h = table.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mine = c
            .tensor(&[h as u32, (h >> 32) as u32])
            .map_err(|e| fail("the table's hash", e))?;
        let all = c
            .all_gather(&mine)
            .and_then(|w| w.wait())
            .and_then(|t| t.to_vec::<u32>())
            .map_err(|e| fail("the tables' hashes", e))?;
        if all.chunks(2).any(|p| p != [h as u32, (h >> 32) as u32]) {
            return Err(format!("the ranks hold different tuning tables: {all:?}"));
        }
        for len in [1usize, 1000, 300_000] {
            let x = c
                .tensor(&vec![1.0f32; len])
                .map_err(|e| fail("all_reduce", e))?;
            let work = c
                .all_reduce(&x, ReduceOp::Sum)
                .map_err(|e| fail("all_reduce", e))?;
            let y = work
                .wait()
                .and_then(|t| t.to_vec::<f32>())
                .map_err(|e| fail("all_reduce", e))?;
            check(
                &format!("all_reduce len {len}"),
                ReduceOp::Sum,
                &y,
                &vec![c.size() as f32; len],
            );
            let plan = c.flight_record().ranks[c.rank()]
                .last()
                .and_then(|e| e.plan)
                .map_or(u32::MAX, |p| {
                    wgpu_collectives::Plan::ALL
                        .iter()
                        .position(|&q| q == p)
                        .unwrap_or(0) as u32
                });
            let plans = c
                .tensor(&[plan])
                .and_then(|t| c.all_gather(&t))
                .and_then(|w| w.wait())
                .and_then(|t| t.to_vec::<u32>())
                .map_err(|e| fail("the plans", e))?;
            if plans.iter().any(|&p| p != plan) {
                return Err(format!(
                    "len {len}: the ranks ran different plans: {plans:?}"
                ));
            }
        }
        Ok(())
    };
    let mut named: Vec<(&str, Box<CheckFn>)> = vec![(
        "one tuning table (or forced plan) everywhere",
        Box::new(one_table),
    )];
    named.extend(
        checks
            .iter()
            .map(|&(n, f)| (n, Box::new(f) as Box<CheckFn>)),
    );
    failed |= !passes(&world, &named);
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
