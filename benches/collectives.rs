//! Criterion micro-benchmarks: the reduction kernel per dtype, one
//! host-staged hop between two ranks, the fence round trip, and all_reduce
//! on 4 ranks.
//!
//! GPU work is timed with `iter_custom` and a fence wait; collectives
//! report the slowest rank's time, as nccl-tests does.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use wgpu_collectives::{DType, ReduceOp, World, WorldConfig, reduction_wgsl, reduction_workgroups};

fn world(n: usize) -> World {
    World::new(WorldConfig::new(n)).expect("a world (is an adapter installed?)")
}

fn wait(comm: &wgpu_collectives::Communicator, idx: wgpu::SubmissionIndex) {
    // Without a timeout, see `Communicator::device`.
    comm.device()
        .poll(wgpu::PollType::Wait {
            submission_index: Some(idx),
            timeout: None,
        })
        .expect("the device finishes");
}

/// dst = dst + src over 4 MiB, per dtype: bytes reduced per second.
fn reduction_kernel(c: &mut Criterion) {
    let w = world(1);
    let comm = w.communicator(0).expect("rank 0");
    let dev = comm.device();
    let bytes: u64 = 4 << 20;
    let buffer = || {
        dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    };
    let (dst, src) = (buffer(), buffer());
    let mut group = c.benchmark_group("reduction_kernel_4MiB");
    group.throughput(Throughput::Bytes(bytes));
    for dtype in DType::ALL {
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: None,
            source: wgpu::ShaderSource::Wgsl(reduction_wgsl(dtype).into()),
        });
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: None,
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[("OP", 0.0)],
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: dst.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: src.as_entire_binding(),
                },
            ],
        });
        let groups = reduction_workgroups(
            comm.adapter_info().device_type,
            dtype,
            bytes,
            dev.limits().max_compute_workgroups_per_dimension,
        );
        group.bench_function(BenchmarkId::from_parameter(dtype.name()), |b| {
            b.iter_custom(|iters| {
                let mut enc = dev.create_command_encoder(&Default::default());
                for _ in 0..iters {
                    let mut pass = enc.begin_compute_pass(&Default::default());
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, &bind, &[]);
                    pass.dispatch_workgroups(groups, 1, 1);
                }
                let start = Instant::now();
                wait(comm, comm.queue().submit([enc.finish()]));
                start.elapsed()
            })
        });
    }
    group.finish();
}

/// Submit an empty pass and wait for it.
fn fence_round_trip(c: &mut Criterion) {
    let w = world(1);
    let comm = w.communicator(0).expect("rank 0");
    let dev = comm.device();
    c.bench_function("fence_round_trip", |b| {
        b.iter(|| {
            let mut enc = dev.create_command_encoder(&Default::default());
            drop(enc.begin_compute_pass(&Default::default()));
            wait(comm, comm.queue().submit([enc.finish()]));
        })
    });
}

/// Times `iters` back-to-back collectives on every rank; the slowest rank's time.
fn timed(
    world: &World,
    iters: u64,
    bytes: usize,
    one: impl Fn(
        &wgpu_collectives::Communicator,
        &wgpu_collectives::Tensor,
    ) -> Result<wgpu_collectives::Work, wgpu_collectives::Error>
    + Sync,
) -> Duration {
    let times = world
        .run(|comm| -> Result<Duration, wgpu_collectives::Error> {
            let x = comm.tensor(&vec![1.0f32; bytes / 4])?;
            let _ = one(comm, &x)?.wait()?; // warm
            let _ = comm.barrier()?.wait()?;
            let start = Instant::now();
            let mut last = None;
            for _ in 0..iters {
                last = Some(one(comm, &x)?);
            }
            if let Some(w) = last {
                let _ = w.wait()?;
            }
            Ok(start.elapsed())
        })
        .expect("run");
    times
        .into_iter()
        .map(|t| t.expect("collective"))
        .max()
        .unwrap_or_default()
}

/// One host-staged hop: a broadcast from rank 0 to rank 1.
fn hop(c: &mut Criterion) {
    let w = world(2);
    let mut group = c.benchmark_group("hop_2_ranks");
    group.sample_size(10);
    for bytes in [4usize << 10, 1 << 20, 16 << 20] {
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, &bytes| {
            b.iter_custom(|iters| timed(&w, iters, bytes, |comm, x| comm.broadcast(x, 0)))
        });
    }
    group.finish();
}

fn all_reduce(c: &mut Criterion) {
    let w = world(4);
    let mut group = c.benchmark_group("all_reduce_f32_sum_4_ranks");
    group.sample_size(10);
    for bytes in [4usize << 10, 1 << 20, 16 << 20] {
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::from_parameter(bytes), &bytes, |b, &bytes| {
            b.iter_custom(|iters| {
                timed(&w, iters, bytes, |comm, x| {
                    comm.all_reduce_in_place(x, ReduceOp::Sum)
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, reduction_kernel, fence_round_trip, hop, all_reduce);
criterion_main!(benches);
