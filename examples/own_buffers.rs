//! Your own devices and buffers: each rank's own kernel writes a gradient
//! into a buffer of its own, the engine all-reduces that buffer in place
//! (no copy, no round trip through the host), and the rank reads it with
//! its own staging buffer.
//!
//! Run with `cargo run --release --example own_buffers`.

use std::sync::mpsc;
use std::time::Duration;

use wgpu_collectives::{Communicator, DType, Error, ReduceOp, World, WorldConfig, wgpu};

const RANKS: usize = 4;
const LEN: u32 = 1 << 20;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Devices made the way a framework makes them (burn, cubecl, a
    // hand-written engine): default features and limits.
    let instance =
        wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle().with_env());
    // WGPU_ADAPTER_NAME picks one by name (say, llvmpipe), else the default.
    let adapter = pollster::block_on(wgpu::util::initialize_adapter_from_env_or_default(
        &instance, None,
    ))?;
    println!("adapter: {}", adapter.get_info().name);
    // Through the engine's helper, so that ranks on separate devices can
    // share host memory (it falls back to `adapter.request_device`).
    let devices = (0..RANKS)
        .map(|_| wgpu_collectives::request_device(&adapter, &Default::default()))
        .collect::<Result<Vec<_>, _>>()?;
    let world = World::from_devices(devices, WorldConfig::new(RANKS))?;

    let sums = world.run(|comm| -> Result<Vec<f32>, Error> {
        let grad = fill_gradient(comm);
        // The user's buffer, all-reduced where it lies. The fill above was
        // submitted to the same queue and not waited for: the collective
        // comes after it in stream order, as with NCCL.
        let view = comm.wrap_buffer(&grad, 0, DType::F32, LEN as usize)?;
        let _ = comm.all_reduce_in_place(&view, ReduceOp::Sum)?.wait()?;
        Ok(read_back(comm, &grad))
    })?;

    // sum over ranks of (r + 1) * i = i * n(n + 1)/2
    let factor = (RANKS * (RANKS + 1) / 2) as f32;
    for (rank, got) in sums.into_iter().enumerate() {
        let got = got?;
        let wrong = (0..LEN as usize)
            .filter(|&i| got[i] != factor * i as f32)
            .count();
        println!("rank {rank}: grad[1000] = {}, {wrong} wrong", got[1000]);
        if wrong > 0 {
            return Err(format!("rank {rank}: {wrong} wrong elements").into());
        }
    }
    Ok(())
}

/// The rank's own kernel fills a buffer it owns.
fn fill_gradient(comm: &Communicator) -> wgpu::Buffer {
    let (dev, queue) = (comm.device(), comm.queue());
    let grad = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("grad"),
        size: u64::from(LEN) * 4,
        // What a collective needs of a buffer it works on.
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("example_fill.wgsl"),
        source: wgpu::ShaderSource::Wgsl(include_str!("../shaders/example_fill.wgsl").into()),
    });
    let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("fill"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants: &[("RANK", comm.rank() as f64)],
            ..Default::default()
        },
        cache: None,
    });
    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("fill"),
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[wgpu::BindGroupEntry {
            binding: 0,
            resource: grad.as_entire_binding(),
        }],
    });
    let mut enc = dev.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(LEN.div_ceil(64), 1, 1);
    }
    queue.submit([enc.finish()]);
    grad
}

/// Reads `buffer` with the rank's own staging buffer.
fn read_back(comm: &Communicator, buffer: &wgpu::Buffer) -> Vec<f32> {
    let (dev, queue) = (comm.device(), comm.queue());
    let staging = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("staging"),
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = dev.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    let index = queue.submit([enc.finish()]);
    let (tx, rx) = mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    // Wait without a timeout: the engine polls this device too, and
    // wgpu 30.0.2 can panic in a thread whose timed wait expires then.
    dev.poll(wgpu::PollType::Wait {
        submission_index: Some(index),
        timeout: None,
    })
    .expect("the device finishes");
    // The map callback runs in whichever thread polled: maybe the engine's.
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the map callback ran")
        .expect("mapping the staging buffer");
    let data = bytemuck::pod_collect_to_vec(&staging.get_mapped_range(..).expect("a view"));
    staging.unmap();
    data
}
