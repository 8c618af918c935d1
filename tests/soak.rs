//! A bounded soak: 2,000 checked collectives (plus 200 dropped unwaited)
//! of random kind, dtype, op and length on 4 ranks, resident memory flat
//! between the first and the second thousand.

mod common;

use common::*;
use wgpu_collectives::{Communicator, DType, Error, ReduceOp, Tensor};

const N: usize = 4;
const PER_BATCH: usize = 1000;
const MAX_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
enum Kind {
    AllReduce,
    AllReduceInPlace,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Barrier,
    AllReduceCoalesced,
}

const KINDS: [Kind; 9] = [
    Kind::AllReduce,
    Kind::AllReduceInPlace,
    Kind::AllGather,
    Kind::ReduceScatter,
    Kind::Broadcast,
    Kind::Reduce,
    Kind::AllToAll,
    Kind::Barrier,
    Kind::AllReduceCoalesced,
];

#[derive(Clone, Copy, Debug)]
struct Step {
    kind: Kind,
    dtype: DType,
    op: ReduceOp,
    /// Elements per rank, a multiple of N (so every kind can split it).
    len: usize,
    root: usize,
}

/// The same plan on every rank, from a fixed seed.
fn plan(seed: u64, count: usize) -> Vec<Step> {
    let mut s = seed;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..count)
        .map(|_| {
            let kind = KINDS[(next() % KINDS.len() as u64) as usize];
            let dtype = DType::ALL[(next() % 5) as usize];
            let ops = ops_for(dtype);
            let op = ops[(next() % ops.len() as u64) as usize];
            // Lengths spread over orders of magnitude, 0 included.
            let bytes = match next() % 4 {
                0 => next() % 64,
                1 => next() % 4096,
                2 => next() % 65536,
                _ => next() % MAX_BYTES,
            };
            let len = bytes as usize / dtype.size() / N * N;
            Step {
                kind,
                dtype,
                op,
                len,
                root: (next() % N as u64) as usize,
            }
        })
        .collect()
}

/// Runs one step on this rank and checks it against the CPU reference.
fn one<T: Num>(c: &Communicator, s: Step, drop_one: bool) -> Result<(), String> {
    let err = |e: Error| format!("{s:?}: {e}");
    let (r, len, op) = (c.rank(), s.len, s.op);
    let mine = |rank: usize| inputs::<T>(op, rank, len);
    let x = c.tensor(&mine(r)).map_err(err)?;
    if drop_one {
        // Issued and dropped unwaited: it must still complete (the checked
        // collective after it needs every rank past it) and leak nothing.
        drop(c.all_reduce(&x, op).map_err(err)?);
    }
    let what = format!("rank {r}, {s:?}");
    let read = |t: Tensor| t.to_vec::<T>().map_err(err);
    let m = len / N;
    match s.kind {
        Kind::AllReduce | Kind::AllReduceInPlace => {
            let y = if matches!(s.kind, Kind::AllReduce) {
                c.all_reduce(&x, op)
            } else {
                c.all_reduce_in_place(&x, op)
            };
            let got = read(y.and_then(|w| w.wait()).map_err(err)?)?;
            check(&what, op, &got, &reference::<T>(op, N, len));
        }
        Kind::AllGather => {
            let got = read(c.all_gather(&x).and_then(|w| w.wait()).map_err(err)?)?;
            let want: Vec<T> = (0..N).flat_map(mine).collect();
            check(&what, ReduceOp::Sum, &got, &want);
        }
        Kind::ReduceScatter => {
            let got = read(
                c.reduce_scatter(&x, op)
                    .and_then(|w| w.wait())
                    .map_err(err)?,
            )?;
            let full = reference::<T>(op, N, len);
            check(&what, op, &got, &full[r * m..(r + 1) * m]);
        }
        Kind::Broadcast => {
            let got = read(
                c.broadcast(&x, s.root)
                    .and_then(|w| w.wait())
                    .map_err(err)?,
            )?;
            check(&what, ReduceOp::Sum, &got, &mine(s.root));
        }
        Kind::Reduce => {
            let got = read(
                c.reduce(&x, op, s.root)
                    .and_then(|w| w.wait())
                    .map_err(err)?,
            )?;
            if r == s.root {
                check(&what, op, &got, &reference::<T>(op, N, len));
            }
        }
        Kind::AllToAll => {
            let got = read(
                c.all_to_all(&x, None, None)
                    .and_then(|w| w.wait())
                    .map_err(err)?,
            )?;
            let want: Vec<T> = (0..N)
                .flat_map(|j| mine(j)[r * m..(r + 1) * m].to_vec())
                .collect();
            check(&what, ReduceOp::Sum, &got, &want);
        }
        Kind::Barrier => {
            let _ = c.barrier().and_then(|w| w.wait()).map_err(err)?;
        }
        Kind::AllReduceCoalesced => {
            let y = c.tensor(&mine(r)[..m]).map_err(err)?;
            let outs = c
                .all_reduce_coalesced(&[x, y], op)
                .and_then(|w| w.wait_all())
                .map_err(err)?;
            check(
                &what,
                op,
                &read(outs[0].clone())?,
                &reference::<T>(op, N, len),
            );
            check(
                &what,
                op,
                &read(outs[1].clone())?,
                &reference::<T>(op, N, m),
            );
        }
    }
    Ok(())
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm resident field");
    pages * 4096
}

#[test]
fn two_thousand_random_collectives_are_right_and_memory_stays_flat() {
    let w = world(N);
    let steps = plan(0x5eed_1234_abcd_0001, 2 * PER_BATCH);
    let mut rss = Vec::new();
    for batch in steps.chunks(PER_BATCH) {
        let results = w
            .run(|c| -> Result<(), String> {
                for (i, &s) in batch.iter().enumerate() {
                    let d = i % 10 == 0;
                    match s.dtype {
                        DType::F32 => one::<f32>(c, s, d)?,
                        DType::F16 => one::<half::f16>(c, s, d)?,
                        DType::BF16 => one::<half::bf16>(c, s, d)?,
                        DType::I32 => one::<i32>(c, s, d)?,
                        DType::U32 => one::<u32>(c, s, d)?,
                    }
                }
                Ok(())
            })
            .expect("run");
        // Report every rank: the first failure explains the others.
        let failures: Vec<String> = results
            .into_iter()
            .enumerate()
            .filter_map(|(rank, r)| r.err().map(|e| format!("rank {rank}: {e}")))
            .collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        rss.push(resident_bytes());
    }
    let (first, last) = (rss[0], rss[1]);
    assert!(
        last <= first + first / 10 + (32 << 20),
        "resident memory grew from {} MiB after the first thousand to {} MiB after the second",
        first >> 20,
        last >> 20
    );
}
