//! Random sequences of collectives on 2 to 5 ranks, under both placements,
//! with one injected fault each: a wrapped buffer destroyed before the
//! call, a wrapped buffer never unmapped, a rank that panics, a rank that
//! arrives after the timeout, a call that differs on one rank. The
//! collectives before the fault give the CPU reference's results; the
//! faulted one fails on every rank with the error its fault documents; and
//! the next run of the same world gives the reference's results again.
//!
//! The number of cases is `PROPTEST_CASES` (default 300, what CI runs).

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use wgpu_collectives::{Communicator, DType, Error, Placement, ReduceOp, World, WorldConfig, wgpu};

/// How long a collective may wait for a late rank: short, so that the
/// timeout faults are cheap, long enough that nothing else meets it.
const TIMEOUT: Duration = Duration::from_millis(700);

/// One collective every rank makes, on i32 data (exact under any order).
#[derive(Debug, Clone, Copy)]
enum Call {
    AllReduce { op: ReduceOp, len: usize },
    AllGather { len: usize },
    ReduceScatter { op: ReduceOp, per: usize },
    Broadcast { len: usize, root: usize },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// Rank `rank` all-reduces a view of a buffer it destroyed.
    Destroyed,
    /// Rank `rank` all-reduces a view of a buffer made mapped and never unmapped.
    NeverUnmapped,
    /// Rank `rank` panics instead of making the call.
    Panics,
    /// Rank `rank` makes the call after its peers' timeout.
    Late,
    /// Rank `rank` all-reduces one element more than its peers.
    Mismatched,
}

const OPS: [ReduceOp; 4] = [
    ReduceOp::Sum,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::BitXor,
];

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        (0..OPS.len(), 0usize..300).prop_map(|(o, len)| Call::AllReduce { op: OPS[o], len }),
        (0usize..100).prop_map(|len| Call::AllGather { len }),
        (0..OPS.len(), 0usize..60).prop_map(|(o, per)| Call::ReduceScatter { op: OPS[o], per }),
        (0usize..200, 0usize..5).prop_map(|(len, root)| Call::Broadcast { len, root }),
    ]
}

fn fault() -> impl Strategy<Value = Fault> {
    // Late faults cost a timeout each: fewer of them.
    prop_oneof![
        3 => Just(Fault::Destroyed),
        3 => Just(Fault::NeverUnmapped),
        3 => Just(Fault::Panics),
        1 => Just(Fault::Late),
        3 => Just(Fault::Mismatched),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    n: usize,
    placement: Placement,
    before: Vec<Call>,
    fault: Fault,
    rank: usize,
    after: Vec<Call>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        2usize..=5,
        prop_oneof![
            Just(Placement::SharedDevice),
            Just(Placement::DevicePerRank)
        ],
        proptest::collection::vec(call(), 0..3),
        fault(),
        0usize..5,
        proptest::collection::vec(call(), 1..3),
    )
        .prop_map(|(n, placement, before, fault, rank, after)| Case {
            n,
            placement,
            before,
            fault,
            rank: rank % n,
            after,
        })
}

/// One world per (ranks, placement), kept across cases: a fault must not
/// cost the world.
fn world_for(n: usize, placement: Placement) -> &'static World {
    static WORLDS: Mutex<Option<HashMap<(usize, bool), &'static World>>> = Mutex::new(None);
    let mut worlds = WORLDS.lock().unwrap_or_else(|p| p.into_inner());
    let shared = placement == Placement::SharedDevice;
    worlds
        .get_or_insert_with(HashMap::new)
        .entry((n, shared))
        .or_insert_with(|| {
            let config = WorldConfig::new(n)
                .with_placement(placement)
                .with_timeout(TIMEOUT);
            let w = World::new(config).unwrap_or_else(|e| panic!("a world of {n}: {e}"));
            Box::leak(Box::new(w))
        })
}

fn input(rank: usize, i: usize, salt: u64) -> i32 {
    bits(rank, i, salt) as i32
}

fn fold(op: ReduceOp, a: i32, b: i32) -> i32 {
    <i32 as Num>::combine(op, a, b)
}

/// Makes `call` on `c` (salt `k` picks the inputs) and checks the result
/// against the CPU reference.
fn run_call(c: &Communicator, call: Call, k: u64) -> Result<(), String> {
    let (n, r) = (c.size(), c.rank());
    let e = |e: Error| format!("rank {r}, {call:?}: {e}");
    let mine = |len: usize| -> Vec<i32> { (0..len).map(|i| input(r, i, k)).collect() };
    let theirs = |q: usize, i: usize| input(q, i, k);
    let (got, want): (Vec<i32>, Vec<i32>) = match call {
        Call::AllReduce { op, len } => {
            let x = c.tensor(&mine(len)).map_err(e)?;
            let y = c.all_reduce(&x, op).map_err(e)?.wait().map_err(e)?;
            let want = (0..len)
                .map(|i| (1..n).fold(theirs(0, i), |a, q| fold(op, a, theirs(q, i))))
                .collect();
            (y.to_vec().map_err(e)?, want)
        }
        Call::AllGather { len } => {
            let x = c.tensor(&mine(len)).map_err(e)?;
            let y = c.all_gather(&x).map_err(e)?.wait().map_err(e)?;
            let want = (0..n)
                .flat_map(|q| (0..len).map(move |i| theirs(q, i)))
                .collect();
            (y.to_vec().map_err(e)?, want)
        }
        Call::ReduceScatter { op, per } => {
            let x = c.tensor(&mine(per * n)).map_err(e)?;
            let y = c.reduce_scatter(&x, op).map_err(e)?.wait().map_err(e)?;
            let want = (r * per..(r + 1) * per)
                .map(|i| (1..n).fold(theirs(0, i), |a, q| fold(op, a, theirs(q, i))))
                .collect();
            (y.to_vec().map_err(e)?, want)
        }
        Call::Broadcast { len, root } => {
            let root = root % n;
            let x = c.tensor(&mine(len)).map_err(e)?;
            let y = c.broadcast(&x, root).map_err(e)?.wait().map_err(e)?;
            (
                y.to_vec().map_err(e)?,
                (0..len).map(|i| theirs(root, i)).collect(),
            )
        }
    };
    if got != want {
        return Err(format!("rank {r}, {call:?}: got {got:?}, want {want:?}"));
    }
    Ok(())
}

/// The faulted call on `c`: what the faulty rank and its peers do.
fn faulted(c: &Communicator, case: &Case) -> Result<(), Error> {
    let faulty = c.rank() == case.rank;
    let usage =
        wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
    let x = match (faulty, case.fault) {
        (true, Fault::Destroyed | Fault::NeverUnmapped) => {
            let b = c.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("faulty"),
                size: 64,
                usage,
                mapped_at_creation: case.fault == Fault::NeverUnmapped,
            });
            let x = c.wrap_buffer(&b, 0, DType::I32, 16)?;
            if case.fault == Fault::Destroyed {
                b.destroy();
            }
            x
        }
        (true, Fault::Panics) => panic!("injected panic on rank {}", c.rank()),
        (true, Fault::Late) => {
            std::thread::sleep(TIMEOUT + Duration::from_millis(200));
            c.tensor(&[1i32; 16])?
        }
        (true, Fault::Mismatched) => c.tensor(&[1i32; 17])?,
        _ => c.tensor(&[1i32; 16])?,
    };
    c.all_reduce(&x, ReduceOp::Sum)?.wait().map(drop)
}

/// Whether `e`, on `rank`, is the error `case`'s fault documents.
fn documented(case: &Case, rank: usize, e: &Error) -> bool {
    let f = case.rank;
    match (case.fault, e) {
        // The faulty rank's submission fails validation; its peers learn
        // it from the group (on a shared device, the device's one
        // submission carries every rank's steps: a device error on each).
        (Fault::Destroyed | Fault::NeverUnmapped, Error::Device { rank: Some(r), .. }) => {
            *r == rank && (rank == f || case.placement == Placement::SharedDevice)
        }
        (Fault::Destroyed | Fault::NeverUnmapped, Error::PeerFailed { peer, .. }) => {
            *peer == f && rank != f
        }
        (Fault::Panics, Error::PeerFailed { peer, reason, .. }) => {
            *peer == f && reason.contains("injected panic")
        }
        (Fault::Late, Error::Timeout { .. }) => true,
        (Fault::Mismatched, Error::Mismatch { .. }) => true,
        _ => false,
    }
}

/// The injected panics say so in a line, without the default hook's
/// backtrace: with `RUST_BACKTRACE` set, symbolising the first one took
/// longer on a loaded machine than the peers' 700 ms timeout, so a peer
/// timed out before the panic was recorded (the engine records it when
/// the closure's unwinding ends, after the hook). Other panics (a failed
/// assertion) keep the default hook.
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let injected = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("injected panic"));
            if injected {
                eprintln!("{info}");
            } else {
                default(info);
            }
        }));
    });
}

fn run_case(case: &Case) -> Result<(), String> {
    quiet_injected_panics();
    let w = world_for(case.n, case.placement);
    let faults = Mutex::new(Vec::new());
    // The fault comes after every rank has its results of the calls
    // before it: a failure fails the group's collectives still in flight,
    // and those are not what this checks.
    let settled = std::sync::Barrier::new(case.n);
    let first = w.run(|c| -> Result<(), String> {
        let before = case
            .before
            .iter()
            .enumerate()
            .try_for_each(|(k, call)| run_call(c, *call, k as u64));
        settled.wait();
        before?;
        let r = faulted(c, case);
        faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((c.rank(), r));
        Ok(())
    });
    match (case.fault, first) {
        (Fault::Panics, Err(Error::RankPanicked { rank, .. })) if rank == case.rank => {}
        (Fault::Panics, other) => return Err(format!("the panicking run gave {other:?}")),
        (_, Ok(results)) => results.into_iter().collect::<Result<(), String>>()?,
        (_, Err(e)) => return Err(format!("the faulted run: {e}")),
    }
    let faults = faults.into_inner().unwrap_or_else(|p| p.into_inner());
    let expected = if case.fault == Fault::Panics {
        case.n - 1
    } else {
        case.n
    };
    if faults.len() != expected {
        return Err(format!(
            "{} ranks reported the fault, {expected} expected",
            faults.len()
        ));
    }
    for (rank, r) in faults {
        match r {
            Err(e) if documented(case, rank, &e) => {}
            Err(e) => return Err(format!("rank {rank}: undocumented error: {e}")),
            Ok(()) => return Err(format!("rank {rank}: the faulted call succeeded")),
        }
    }
    let next = w
        .run(|c| -> Result<(), String> {
            for (k, call) in case.after.iter().enumerate() {
                run_call(c, *call, 100 + k as u64)?;
            }
            Ok(())
        })
        .map_err(|e| format!("the run after the fault: {e}"))?;
    next.into_iter().collect()
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    ProptestConfig {
        cases,
        max_shrink_iters: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_fault_costs_the_collective_it_hit_and_nothing_after(case in case()) {
        if let Err(e) = run_case(&case) {
            prop_assert!(false, "{case:?}: {e}");
        }
    }
}
