//! Criterion micro-benchmarks of all_reduce on 4 simulated ranks.
//!
//! GPU work is timed with `iter_custom`: every rank issues the collectives
//! back to back and waits on the last one's fence; the time reported is the
//! slowest rank's, as nccl-tests reports it.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgpu_collectives::{ReduceOp, World, WorldConfig};

fn all_reduce(c: &mut Criterion) {
    let world = World::new(WorldConfig::new(4)).expect("a 4-rank world (is an adapter installed?)");
    let mut group = c.benchmark_group("all_reduce_f32_sum_4_ranks");
    group.sample_size(10);
    for bytes in [4usize << 10, 1 << 20, 16 << 20] {
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, &bytes| {
            b.iter_custom(|iters| {
                let times = world
                    .run(|comm| -> Result<Duration, wgpu_collectives::Error> {
                        let x = comm.tensor(&vec![1.0f32; bytes / 4])?;
                        comm.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?; // warm
                        let start = Instant::now();
                        let mut last = None;
                        for _ in 0..iters {
                            last = Some(comm.all_reduce_in_place(&x, ReduceOp::Sum)?);
                        }
                        if let Some(w) = last {
                            w.wait()?;
                        }
                        Ok(start.elapsed())
                    })
                    .expect("run");
                times
                    .into_iter()
                    .map(|t| t.expect("all_reduce"))
                    .max()
                    .unwrap_or_default()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, all_reduce);
criterion_main!(benches);
