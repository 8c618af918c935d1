//! A bounded soak: 2,000 checked collectives (plus 200 dropped unwaited)
//! of random placement, dtype, op and length on 4 ranks, resident memory
//! flat between the first and the second thousand.

mod common;

use common::*;
use wgpu_collectives::{Communicator, DType, Error, ReduceOp};

const N: usize = 4;
const PER_BATCH: usize = 1000;
const MAX_BYTES: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Step {
    in_place: bool,
    dtype: DType,
    op: ReduceOp,
    len: usize,
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
            Step {
                in_place: next() % 2 == 0,
                dtype,
                op,
                len: bytes as usize / dtype.size(),
            }
        })
        .collect()
}

fn one<T: Num>(c: &Communicator, s: Step, drop_one: bool) -> Result<(), String> {
    if drop_one {
        // Issued and dropped unwaited: it must still complete (the checked
        // collective after it needs every rank past it) and leak nothing.
        let x = c
            .tensor(&inputs::<T>(s.op, c.rank(), s.len))
            .map_err(|e| format!("{s:?}: {e}"))?;
        drop(c.all_reduce(&x, s.op).map_err(|e| format!("{s:?}: {e}"))?);
    }
    let (_, y) =
        all_reduce::<T>(c, s.op, s.len, s.in_place).map_err(|e: Error| format!("{s:?}: {e}"))?;
    let got = y.to_vec::<T>().map_err(|e| format!("{s:?}: {e}"))?;
    let want = reference::<T>(s.op, N, s.len);
    check(&format!("rank {}, {s:?}", c.rank()), s.op, &got, &want);
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
        for (rank, r) in results.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        }
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
