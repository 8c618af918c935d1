//! The ceiling: what the machine allows, measured before the sweep, so the
//! table can say how close the engine gets.
//!
//! Ranks that share one device read and write each other's buffers there:
//! an out-of-place collective must read and write every rank's bytes once,
//! so busbw cannot exceed the device copy rate times the bus factor over
//! n. Ranks on devices of their own cross host memory (wgpu has no
//! peer-to-peer), so on a GPU the host-device-host path bounds bus
//! bandwidth; on a CPU adapter the "devices" are the host's own memory,
//! which all n ranks share: busbw cannot exceed about the host memcpy
//! bandwidth over n.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::median;
use wgpu_collectives::{Communicator, World};

/// Figures in GB/s (the fence in microseconds).
#[derive(Debug, Clone)]
pub struct Ceiling {
    pub bytes: u64,
    pub device_copy: f64,
    pub host_memcpy: f64,
    pub round_trip: f64,
    pub fence_us: f64,
    /// The most busbw the machine allows, and why.
    pub busbw: f64,
    pub why: String,
}

/// Waits for `idx` as any wgpu user does. Without a timeout: wgpu-core
/// 30.0.2 can panic in a thread whose timed wait expires while another
/// thread (here, the engine's device owner) polls the same device.
fn wait(c: &Communicator, idx: wgpu::SubmissionIndex) -> Result<(), String> {
    c.device()
        .poll(wgpu::PollType::Wait {
            submission_index: Some(idx),
            timeout: None,
        })
        .map(|_| ())
        .map_err(|e| format!("waiting for the device: {e}"))
}

/// Maps `buf` once the submission in `enc` completes; the returned flag
/// turns true when it has (callbacks may run on another polling thread).
fn map_on_submit(
    enc: &wgpu::CommandEncoder,
    buf: &wgpu::Buffer,
    mode: wgpu::MapMode,
) -> Arc<AtomicBool> {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    enc.map_buffer_on_submit(buf, mode, .., move |_| d.store(true, Ordering::Release));
    done
}

fn until_mapped(c: &Communicator, flag: &AtomicBool) -> Result<(), String> {
    let give_up = Instant::now() + Duration::from_secs(60);
    while !flag.load(Ordering::Acquire) {
        if Instant::now() > give_up {
            return Err("a map never completed".into());
        }
        let _ = c.device().poll(wgpu::PollType::Poll);
        std::thread::yield_now();
    }
    Ok(())
}

fn buffer(dev: &wgpu::Device, size: u64, usage: wgpu::BufferUsages, mapped: bool) -> wgpu::Buffer {
    dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("ceiling"),
        size,
        usage,
        mapped_at_creation: mapped,
    })
}

/// Measures on the device of this process's first rank (rank 0's in one
/// process) with `bytes` (clamped to 1..64 MiB) per copy.
/// Measures the ceiling for a collective of `bytes` whose busbw is its
/// algbw times `bus_factor`.
pub fn measure(world: &World, bytes: u64, bus_factor: f64) -> Result<Ceiling, String> {
    use wgpu::BufferUsages as U;
    let c: &Communicator = world
        .communicator(world.local_ranks().start)
        .ok_or("no rank in this process")?;
    let dev = c.device();
    // At the size it is compared with (copies of a few KiB run at their
    // latency, not at the memory's bandwidth), up to 64 MiB.
    let bytes = bytes.clamp(4, 64 << 20).next_multiple_of(4);
    let reps = 5;

    let (a, b) = (
        buffer(dev, bytes, U::STORAGE | U::COPY_SRC | U::COPY_DST, false),
        buffer(dev, bytes, U::STORAGE | U::COPY_SRC | U::COPY_DST, false),
    );
    let mut copy = Vec::new();
    for i in 0..=reps {
        let mut enc = dev.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&a, 0, &b, 0, bytes);
        let t = Instant::now();
        wait(c, c.queue().submit([enc.finish()]))?;
        if i > 0 {
            copy.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
    }

    let (src, mut dst) = (vec![1u8; bytes as usize], vec![0u8; bytes as usize]);
    let mut memcpy = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        memcpy.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    std::hint::black_box(&dst);

    let up = buffer(dev, bytes, U::MAP_WRITE | U::COPY_SRC, true);
    let down = buffer(dev, bytes, U::MAP_READ | U::COPY_DST, false);
    let mut trip = Vec::new();
    let mut up_ready: Option<Arc<AtomicBool>> = None;
    for i in 0..=reps {
        let t = Instant::now();
        if let Some(f) = &up_ready {
            until_mapped(c, f)?;
        }
        up.get_mapped_range_mut(..)
            .map_err(|e| e.to_string())?
            .copy_from_slice(&src);
        up.unmap();
        let mut enc = dev.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&up, 0, &a, 0, bytes);
        enc.copy_buffer_to_buffer(&a, 0, &down, 0, bytes);
        let got = map_on_submit(&enc, &down, wgpu::MapMode::Read);
        up_ready = Some(map_on_submit(&enc, &up, wgpu::MapMode::Write));
        wait(c, c.queue().submit([enc.finish()]))?;
        until_mapped(c, &got)?;
        dst.copy_from_slice(&down.get_mapped_range(..).map_err(|e| e.to_string())?);
        down.unmap();
        if i > 0 {
            trip.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
        }
    }

    let mut fence = Vec::new();
    for i in 0..=50 {
        let mut enc = dev.create_command_encoder(&Default::default());
        drop(enc.begin_compute_pass(&Default::default()));
        let t = Instant::now();
        wait(c, c.queue().submit([enc.finish()]))?;
        if i > 0 {
            fence.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }

    let (host_memcpy, round_trip) = (median(memcpy), median(trip));
    let n = world.size();
    let cpu = world
        .adapters()
        .iter()
        .all(|a| a.device_type == wgpu::DeviceType::Cpu);
    let (busbw, why) = if world.placement() == wgpu_collectives::Placement::SharedDevice {
        // Every rank's bytes are read once and written once on the one
        // device: n·S bytes copied, so algbw is at most the copy rate / n.
        (
            median(copy.clone()) * bus_factor / n as f64,
            format!(
                "device copy x bus factor {bus_factor:.2} / {n} ranks (the ranks share one device: each rank's bytes read and written once)"
            ),
        )
    } else if cpu {
        (
            host_memcpy / n as f64,
            format!(
                "host memcpy / {n} ranks (a CPU adapter: the ranks share the host's memory bandwidth)"
            ),
        )
    } else {
        (
            round_trip,
            "the host-device-host round trip (every hop crosses host memory)".to_string(),
        )
    };
    // However fast the bytes move, a collective takes at least one fence
    // round trip: at small sizes that is the bound.
    let fence_us = median(fence);
    let by_latency = bytes as f64 * bus_factor / (fence_us * 1e3).max(f64::MIN_POSITIVE);
    let (busbw, why) = if by_latency < busbw {
        (
            by_latency,
            format!(
                "{} x bus factor {bus_factor:.2} / one fence round trip (at this size the latency bounds it)",
                size(bytes)
            ),
        )
    } else {
        (busbw, why)
    };
    Ok(Ceiling {
        bytes,
        device_copy: median(copy),
        host_memcpy,
        round_trip,
        fence_us,
        busbw,
        why,
    })
}

/// `bytes` as a person reads it: 4 KiB, 16 MiB, 1 GiB, 300 B.
pub fn size(bytes: u64) -> String {
    for (shift, unit) in [(30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    format!("{bytes} B")
}

/// The lines printed above the table.
pub fn lines(c: &Ceiling) -> String {
    format!(
        "# Ceiling (rank 0's adapter, copies of {}, medians):\n\
         #   device copy (copy_buffer_to_buffer)   {:8.3} GB/s\n\
         #   host memcpy                           {:8.3} GB/s\n\
         #   host-device-host round trip           {:8.3} GB/s\n\
         #   fence round trip (empty submit, wait) {:8.1} us\n\
         #   bus bandwidth ceiling                 {:8.3} GB/s = {}",
        size(c.bytes),
        c.device_copy,
        c.host_memcpy,
        c.round_trip,
        c.fence_us,
        c.busbw,
        c.why
    )
}
