//! Random sequences of public calls, with random and absurd arguments, on
//! 1 to 5 ranks: nothing panics or hangs, every error is the one the call
//! documents, and every result equals the CPU reference.
//!
//! Every rank makes the same calls (as an SPMD program does) on its own
//! inputs. Arguments that are invalid are invalid on every rank, so they
//! must fail at the call with `InvalidArgument` (or `Device` for a buffer
//! larger than the adapter allows) and issue nothing; the valid calls
//! around them must still pair and give exact results. A zero-length wait
//! may give `Timeout`; nothing else may fail.
//!
//! The number of cases is `PROPTEST_CASES` (default 64, what CI runs).

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use half::{bf16, f16};
use proptest::prelude::*;
use wgpu_collectives::{Communicator, DType, Error, ReduceOp, Tensor, Work, World, WorldConfig};

/// One call every rank makes.
#[derive(Debug, Clone)]
enum Call {
    AllReduce {
        op: ReduceOp,
        len: usize,
        in_place: bool,
    },
    AllGather {
        len: usize,
    },
    /// Input length `len` (valid when divisible by n).
    ReduceScatter {
        op: ReduceOp,
        len: usize,
    },
    /// `root` may be past the last rank.
    Broadcast {
        len: usize,
        root: usize,
    },
    Reduce {
        op: ReduceOp,
        len: usize,
        root: usize,
    },
    /// Rank i sends `counts[i][j]` elements to rank j (a consistent matrix
    /// from `seed`), or, with `bad`, counts no rank can accept.
    AllToAll {
        seed: u64,
        most: usize,
        bad: Option<BadCounts>,
    },
    Barrier,
    /// A tensor whose byte size overflows or exceeds the adapter.
    Huge {
        len: usize,
    },
}

#[derive(Debug, Clone, Copy)]
enum BadCounts {
    /// One entry too many.
    TooMany,
    /// A send count of `usize::MAX`: the sum wraps.
    Wraps,
}

/// How the caller waits.
#[derive(Debug, Clone, Copy)]
enum WaitBy {
    Wait,
    /// `wait_timeout(Duration::MAX)`.
    Forever,
    /// `wait_timeout(ZERO)`: `Ok` or `Timeout`.
    Zero,
    /// `.await` (through `pollster`).
    Future,
}

fn op() -> impl Strategy<Value = ReduceOp> {
    proptest::sample::select(ReduceOp::ALL.to_vec())
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 0usize..40,
        3 => 40usize..5000,
        1 => 200_000usize..400_000,
    ]
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        3 => (op(), len(), any::<bool>()).prop_map(|(op, len, in_place)| Call::AllReduce { op, len, in_place }),
        1 => len().prop_map(|len| Call::AllGather { len }),
        1 => (op(), len()).prop_map(|(op, len)| Call::ReduceScatter { op, len }),
        1 => (len(), 0usize..7).prop_map(|(len, root)| Call::Broadcast { len, root }),
        1 => (op(), len(), 0usize..7).prop_map(|(op, len, root)| Call::Reduce { op, len, root }),
        1 => (any::<u64>(), 0usize..300, proptest::option::weighted(0.3, prop_oneof![
            Just(BadCounts::TooMany),
            Just(BadCounts::Wraps)
        ]))
            .prop_map(|(seed, most, bad)| Call::AllToAll { seed, most, bad }),
        1 => Just(Call::Barrier),
        1 => prop_oneof![
            Just(usize::MAX),
            Just((1usize << 61) + 1),
            Just(usize::MAX / 2 + 1),
            Just(1usize << 40),
        ]
        .prop_map(|len| Call::Huge { len }),
    ]
}

fn wait_by() -> impl Strategy<Value = WaitBy> {
    prop_oneof![
        4 => Just(WaitBy::Wait),
        1 => Just(WaitBy::Forever),
        1 => Just(WaitBy::Zero),
        1 => Just(WaitBy::Future),
    ]
}

/// A case: ranks, dtype, and groups of calls issued together, then waited.
fn case() -> impl Strategy<Value = (usize, DType, Vec<Vec<(Call, WaitBy)>>)> {
    (
        1usize..=5,
        proptest::sample::select(DType::ALL.to_vec()),
        proptest::collection::vec(proptest::collection::vec((call(), wait_by()), 1..4), 1..4),
    )
}

/// One world per size, made once: building a world measures its cost model.
fn world_of(n: usize) -> &'static World {
    static WORLDS: OnceLock<Vec<World>> = OnceLock::new();
    let worlds = WORLDS.get_or_init(|| {
        (1..=5)
            .map(|n| {
                World::new(WorldConfig::new(n).with_timeout(Duration::from_secs(30)))
                    .unwrap_or_else(|e| panic!("cannot build a {n}-rank world: {e}"))
            })
            .collect()
    });
    &worlds[n - 1]
}

/// The all_to_all counts matrix of `seed`: `m[i][j]` from rank i to rank j.
fn matrix(seed: u64, most: usize, n: usize) -> Vec<Vec<usize>> {
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| bits(i, j, seed) as usize % (most + 1))
                .collect()
        })
        .collect()
}

/// What a call expects: a result to compare, or that it fails at the call.
enum Expect<T> {
    /// The output must equal this (`None`: not specified on this rank).
    Values(Option<Vec<T>>),
    /// The call itself must fail.
    Refused,
}

/// Issues `call` on `c`; returns its `Work` (or the call's error) and what
/// the output must be.
fn issue<T: Num>(c: &Communicator, call: &Call) -> (Result<Work, Error>, Expect<T>) {
    let (n, r) = (c.size(), c.rank());
    let valid_op = |op: ReduceOp| op.supports(T::DTYPE);
    let input = |op: ReduceOp, len: usize| c.tensor(&inputs::<T>(op, r, len));
    let issued = |x: Result<Tensor, Error>, f: &dyn Fn(&Tensor) -> Result<Work, Error>| {
        x.and_then(|x| f(&x))
    };
    match call {
        Call::AllReduce { op, len, in_place } => {
            let w = issued(input(*op, *len), &|x| {
                if *in_place {
                    c.all_reduce_in_place(x, *op)
                } else {
                    c.all_reduce(x, *op)
                }
            });
            let e = if valid_op(*op) {
                Expect::Values(Some(reference::<T>(*op, n, *len)))
            } else {
                Expect::Refused
            };
            (w, e)
        }
        Call::AllGather { len } => {
            let w = issued(input(ReduceOp::Sum, *len), &|x| c.all_gather(x));
            let want = (0..n)
                .flat_map(|j| inputs::<T>(ReduceOp::Sum, j, *len))
                .collect();
            (w, Expect::Values(Some(want)))
        }
        Call::ReduceScatter { op, len } => {
            let w = issued(input(*op, *len), &|x| c.reduce_scatter(x, *op));
            if !valid_op(*op) || len % n != 0 {
                return (w, Expect::Refused);
            }
            let m = len / n;
            let all = reference::<T>(*op, n, *len);
            (w, Expect::Values(Some(all[r * m..(r + 1) * m].to_vec())))
        }
        Call::Broadcast { len, root } => {
            let w = issued(input(ReduceOp::Sum, *len), &|x| c.broadcast(x, *root));
            if *root >= n {
                return (w, Expect::Refused);
            }
            (
                w,
                Expect::Values(Some(inputs::<T>(ReduceOp::Sum, *root, *len))),
            )
        }
        Call::Reduce { op, len, root } => {
            let w = issued(input(*op, *len), &|x| c.reduce(x, *op, *root));
            if *root >= n || !valid_op(*op) {
                return (w, Expect::Refused);
            }
            let want = (r == *root).then(|| reference::<T>(*op, n, *len));
            (w, Expect::Values(want))
        }
        Call::AllToAll { seed, most, bad } => {
            let m = matrix(*seed, *most, n);
            let mut send = m[r].clone();
            let recv: Vec<usize> = (0..n).map(|j| m[j][r]).collect();
            match bad {
                Some(BadCounts::TooMany) => send.push(0),
                Some(BadCounts::Wraps) => send[0] = usize::MAX,
                None => {}
            }
            let mine = inputs::<T>(ReduceOp::Sum, r, m[r].iter().sum());
            let w = issued(c.tensor(&mine), &|x| {
                c.all_to_all(x, Some(&send), Some(&recv))
            });
            if bad.is_some() {
                return (w, Expect::Refused);
            }
            // From rank j: its slice for this rank.
            let want = (0..n)
                .flat_map(|j| {
                    let theirs = inputs::<T>(ReduceOp::Sum, j, m[j].iter().sum());
                    let start: usize = m[j][..r].iter().sum();
                    theirs[start..start + m[j][r]].to_vec()
                })
                .collect();
            (w, Expect::Values(Some(want)))
        }
        Call::Barrier => (c.barrier(), Expect::Values(None)),
        Call::Huge { len } => {
            let w = c
                .zeros(T::DTYPE, *len)
                .and_then(|x| c.all_reduce(&x, ReduceOp::Max));
            (w, Expect::Refused)
        }
    }
}

/// Checks one call's outcome on one rank; returns a description of what
/// is wrong, if anything.
fn judge<T: Num>(
    what: &str,
    op: ReduceOp,
    issued: Result<Work, Error>,
    expect: Expect<T>,
    by: WaitBy,
) -> Result<(), String> {
    let work = match (issued, &expect) {
        (Err(Error::InvalidArgument { .. }), Expect::Refused) => return Ok(()),
        (Err(Error::Device { what: w, .. }), Expect::Refused) if w.contains("max_buffer_size") => {
            return Ok(());
        }
        (Err(e), _) => return Err(format!("{what}: the call failed: {e}")),
        (Ok(_), Expect::Refused) => return Err(format!("{what}: an invalid call was issued")),
        (Ok(w), _) => w,
    };
    let out = match by {
        WaitBy::Wait => work.wait(),
        WaitBy::Forever => work.wait_timeout(Duration::MAX),
        WaitBy::Zero => match work.wait_timeout(Duration::ZERO) {
            Err(Error::Timeout { .. }) => return Ok(()),
            other => other,
        },
        WaitBy::Future => pollster::block_on(work),
    };
    let out = out.map_err(|e| format!("{what}: waiting failed: {e}"))?;
    let Expect::Values(Some(want)) = expect else {
        return Ok(());
    };
    let got = out
        .to_vec::<T>()
        .map_err(|e| format!("{what}: reading the output: {e}"))?;
    let exact = op != ReduceOp::Avg || T::DTYPE.is_integer();
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let ok = if exact {
            g.raw() == w.raw()
        } else {
            T::ulps(*g, *w) <= 2
        };
        if !ok {
            return Err(format!("{what}: element {i} is {g:?}, want {w:?}"));
        }
    }
    Ok(())
}

fn op_of(call: &Call) -> ReduceOp {
    match call {
        Call::AllReduce { op, .. } | Call::ReduceScatter { op, .. } | Call::Reduce { op, .. } => {
            *op
        }
        _ => ReduceOp::Sum,
    }
}

/// Runs the groups on every rank; the first problem found, if any.
fn run_case<T: Num>(n: usize, groups: &[Vec<(Call, WaitBy)>]) -> Result<(), String> {
    let results = world_of(n)
        .run(|c| -> Result<(), String> {
            for (g, group) in groups.iter().enumerate() {
                let issued: Vec<_> = group.iter().map(|(call, _)| issue::<T>(c, call)).collect();
                for (k, ((call, by), (w, e))) in group.iter().zip(issued).enumerate() {
                    let what = format!("rank {}, group {g}, call {k} ({call:?}, {by:?})", c.rank());
                    judge(&what, op_of(call), w, e, *by)?;
                }
            }
            Ok(())
        })
        .map_err(|e| format!("run: {e}"))?;
    results.into_iter().collect()
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        max_shrink_iters: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_public_calls_never_panic_hang_or_give_wrong_results(
        (n, dtype, groups) in case()
    ) {
        let outcome = match dtype {
            DType::F32 => run_case::<f32>(n, &groups),
            DType::F16 => run_case::<f16>(n, &groups),
            DType::BF16 => run_case::<bf16>(n, &groups),
            DType::I32 => run_case::<i32>(n, &groups),
            DType::U32 => run_case::<u32>(n, &groups),
        };
        if let Err(e) = outcome {
            prop_assert!(false, "{n} ranks, {dtype}: {e}");
        }
    }
}
