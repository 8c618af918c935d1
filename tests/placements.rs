//! The same bits everywhere: every collective, dtype and operator gives
//! bit-identical results whether the ranks share one device (the direct
//! kernels) or each has its own (the ring, the one-shot), because each
//! element's fold order is fixed by its index, the length and n alone.
//!
//! Inputs span many magnitudes and both signs, so that float sums in any
//! other order would round differently and show.

mod common;

use std::time::Duration;

use common::*;
use half::{bf16, f16};
use wgpu_collectives::{
    Algorithm, Communicator, DType, Element, Error, Placement, ReduceOp, World, WorldConfig,
};

const N: usize = 3;

/// Values whose float sums depend on the order they are added in.
fn values<T: Element>(rank: usize, len: usize, salt: u64) -> Vec<T> {
    let f = |i: usize| {
        let b = bits(rank, i, salt);
        let mag = f32::from_bits((b & 0x007f_ffff) | ((120 + (b >> 24) % 16) << 23));
        if b & 1 == 0 { mag } else { -mag }
    };
    let bytes: Vec<u8> = match T::DTYPE {
        DType::F32 => (0..len).flat_map(|i| f(i).to_le_bytes()).collect(),
        DType::F16 => (0..len)
            .flat_map(|i| f16::from_f32(f(i) * 0.25).to_le_bytes())
            .collect(),
        DType::BF16 => (0..len)
            .flat_map(|i| bf16::from_f32(f(i)).to_le_bytes())
            .collect(),
        _ => (0..len)
            .flat_map(|i| bits(rank, i, salt).to_le_bytes())
            .collect(),
    };
    bytemuck::pod_collect_to_vec(&bytes)
}

fn bytes_of<T: Element>(v: Vec<T>) -> Vec<u8> {
    bytemuck::cast_slice(&v).to_vec()
}

/// Every collective of one dtype, each result as bytes (a rooted reduce:
/// the root's only), in a fixed order.
fn program<T: Element>(c: &Communicator, out: &mut Vec<(String, Vec<u8>)>) -> Result<(), Error> {
    let (r, dtype) = (c.rank(), T::DTYPE);
    for op in ops_for(dtype) {
        for len in [1, 37, 1001] {
            let x = c.tensor(&values::<T>(r, len, 1))?;
            let y = c.all_reduce(&x, op)?.wait()?;
            out.push((
                format!("all_reduce {dtype} {op} {len}"),
                bytes_of(y.to_vec::<T>()?),
            ));
        }
        // Chunks of 41 start mid-unit (the host schedules run them on a
        // shared device too); chunks of 128 elements start where a kernel
        // can bind them on any adapter (the shared device's kernel).
        for per in [41, 128] {
            let x = c.tensor(&values::<T>(r, N * per, 2))?;
            let y = c.reduce_scatter(&x, op)?.wait()?;
            out.push((
                format!("reduce_scatter {dtype} {op} {per}"),
                bytes_of(y.to_vec::<T>()?),
            ));
        }
        let x = c.tensor(&values::<T>(r, 29, 3))?;
        let y = c.reduce(&x, op, 1)?.wait()?;
        if r == 1 {
            out.push((format!("reduce {dtype} {op}"), bytes_of(y.to_vec::<T>()?)));
        }
        let xs = [
            c.tensor(&values::<T>(r, 17, 4))?,
            c.tensor(&values::<T>(r, 40, 5))?,
        ];
        let ys = c.all_reduce_coalesced(&xs, op)?.wait_all()?;
        for (i, y) in ys.iter().enumerate() {
            out.push((
                format!("all_reduce_coalesced {dtype} {op} #{i}"),
                bytes_of(y.to_vec::<T>()?),
            ));
        }
    }
    let x = c.tensor(&values::<T>(r, 13, 6))?;
    let y = c.all_gather(&x)?.wait()?;
    out.push((format!("all_gather {dtype}"), bytes_of(y.to_vec::<T>()?)));
    let x = c.tensor(&values::<T>(r, 21, 7))?;
    let y = c.broadcast(&x, 2)?.wait()?;
    out.push((format!("broadcast {dtype}"), bytes_of(y.to_vec::<T>()?)));
    let send: Vec<usize> = (0..N).map(|j| (r + 2 * j) % 4 + 1).collect();
    let recv: Vec<usize> = (0..N).map(|i| (i + 2 * r) % 4 + 1).collect();
    let x = c.tensor(&values::<T>(r, send.iter().sum(), 8))?;
    let y = c.all_to_all(&x, Some(&send), Some(&recv))?.wait()?;
    out.push((format!("all_to_all {dtype}"), bytes_of(y.to_vec::<T>()?)));
    Ok(())
}

fn results(config: WorldConfig) -> Vec<Vec<(String, Vec<u8>)>> {
    let w = World::new(config.with_timeout(Duration::from_secs(60))).expect("world");
    w.run(|c| -> Result<Vec<(String, Vec<u8>)>, Error> {
        let mut out = Vec::new();
        program::<f32>(c, &mut out)?;
        program::<f16>(c, &mut out)?;
        program::<bf16>(c, &mut out)?;
        program::<i32>(c, &mut out)?;
        program::<u32>(c, &mut out)?;
        // Parts of several ring slices each (a slice is at most 1 MiB).
        let x = c.tensor(&values::<f32>(c.rank(), 1_000_003, 9))?;
        let y = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
        out.push((
            "all_reduce f32 sum 1000003".into(),
            bytes_of(y.to_vec::<f32>()?),
        ));
        Ok(out)
    })
    .expect("run")
    .into_iter()
    .map(|r| r.expect("collectives"))
    .collect()
}

#[test]
fn every_collective_gives_the_same_bits_under_every_placement_and_algorithm() {
    let shared = WorldConfig::new(N).with_placement(Placement::SharedDevice);
    let want = results(shared);
    let others = [
        (
            "per-rank, auto",
            WorldConfig::new(N).with_placement(Placement::DevicePerRank),
        ),
        (
            "per-rank, ring",
            WorldConfig::new(N)
                .with_placement(Placement::DevicePerRank)
                .with_algorithm(Algorithm::Ring),
        ),
        (
            "per-rank, one-shot",
            WorldConfig::new(N)
                .with_placement(Placement::DevicePerRank)
                .with_algorithm(Algorithm::OneShot),
        ),
    ];
    for (name, config) in others {
        let got = results(config);
        for rank in 0..N {
            assert_eq!(got[rank].len(), want[rank].len(), "{name}, rank {rank}");
            for ((what, g), (_, w)) in got[rank].iter().zip(&want[rank]) {
                if g != w {
                    let at = g.iter().zip(w).position(|(a, b)| a != b);
                    panic!(
                        "{name}, rank {rank}, {what}: differs from the shared device at byte {at:?}"
                    );
                }
            }
        }
    }
    // And every rank holds the same bits (all-reduce: the same output everywhere).
    let reduced = |rank: usize| -> Vec<&(String, Vec<u8>)> {
        want[rank]
            .iter()
            .filter(|(what, _)| what.starts_with("all_reduce"))
            .collect()
    };
    for rank in 1..N {
        for (g, w) in reduced(rank).into_iter().zip(reduced(0)) {
            assert_eq!(g, w, "rank {rank} vs rank 0, {}", g.0);
        }
    }
}

/// One device with wgpu's default limits (8 storage buffers per stage), as a
/// framework might make it, given for every rank.
fn one_user_device(
    n: usize,
) -> Vec<(
    wgpu_collectives::wgpu::Device,
    wgpu_collectives::wgpu::Queue,
)> {
    let (device, queue) = wgpu_collectives::request_device(
        &user_adapter(),
        &wgpu_collectives::wgpu::DeviceDescriptor::default(),
    )
    .expect("a device with default features and limits");
    (0..n).map(|_| (device.clone(), queue.clone())).collect()
}

#[test]
fn one_device_given_for_every_rank_is_shared_and_too_many_inputs_fall_back() {
    // 3 ranks: 6 bindings fit wgpu's default 8, so the direct kernels run;
    // 8 ranks: 16 (or even 9) do not, so the host schedules run instead.
    for n in [3usize, 8] {
        // Auto, whatever WGPU_COLLECTIVES_PLACEMENT says: the devices decide.
        let config = WorldConfig::new(n).with_placement(Placement::Auto);
        let w = World::from_devices(one_user_device(n), config).expect("world");
        assert_eq!(w.placement(), Placement::SharedDevice, "{n} ranks");
        let got = w
            .run(|c| -> Result<(Vec<f32>, Vec<i32>), Error> {
                let x = c.tensor(&values::<f32>(c.rank(), 1001, 10))?;
                let sum = c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()?;
                let y = c.tensor(&vec![c.rank() as i32 + 1; 4 * n])?;
                let rs = c
                    .reduce_scatter(&y, ReduceOp::Sum)?
                    .wait()?
                    .to_vec::<i32>()?;
                Ok((sum, rs))
            })
            .expect("run");
        let per_rank = World::new(WorldConfig::new(n).with_placement(Placement::DevicePerRank))
            .expect("world")
            .run(|c| -> Result<Vec<f32>, Error> {
                let x = c.tensor(&values::<f32>(c.rank(), 1001, 10))?;
                c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
            })
            .expect("run");
        let want_rs = (1..=n as i32).sum::<i32>();
        for (rank, (r, p)) in got.into_iter().zip(per_rank).enumerate() {
            let (sum, rs) = r.expect("collectives");
            let p = p.expect("collectives");
            let at = sum
                .iter()
                .zip(&p)
                .position(|(a, b)| a.to_bits() != b.to_bits());
            assert!(
                at.is_none() && sum.len() == p.len(),
                "{n} ranks, rank {rank}: differs from a device per rank at element {at:?}"
            );
            assert_eq!(rs, vec![want_rs; 4], "{n} ranks, rank {rank}");
        }
    }
}

#[test]
fn ranks_that_share_a_device_must_not_share_the_bytes_a_collective_writes() {
    use wgpu_collectives::wgpu;
    let w = World::new(WorldConfig::new(2).with_placement(Placement::SharedDevice)).expect("world");
    let c0 = w.communicator(0).expect("rank 0");
    let buffer = c0.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("one buffer for two ranks"),
        size: 512,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let ones: Vec<u8> = bytemuck::cast_slice(&[1.0f32; 128]).to_vec();
    c0.queue().write_buffer(&buffer, 0, &ones);
    // Both ranks wrap the same bytes: refused on every rank, nothing written.
    let clash = w
        .run(|c| -> Result<(), Error> {
            let x = c.wrap_buffer(&buffer, 0, DType::F32, 64)?;
            c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("run");
    for (rank, r) in clash.into_iter().enumerate() {
        match r {
            Err(Error::InvalidArgument { what, .. }) => {
                assert!(what.contains("shares bytes"), "rank {rank}: {what}")
            }
            other => panic!("rank {rank}: expected InvalidArgument, got {other:?}"),
        }
    }
    // Disjoint halves of the one buffer are fine.
    let sums = w
        .run(|c| -> Result<Vec<f32>, Error> {
            let x = c.wrap_buffer(&buffer, 256 * c.rank() as u64, DType::F32, 64)?;
            c.all_reduce_in_place(&x, ReduceOp::Sum)?
                .wait()?
                .to_vec::<f32>()
        })
        .expect("run");
    for (rank, s) in sums.into_iter().enumerate() {
        assert_eq!(s.expect("all_reduce"), vec![2.0; 64], "rank {rank}");
    }
}

#[test]
fn one_device_given_for_every_rank_can_still_model_separate_gpus() {
    // One owner for the one device, but the host schedules carry the bytes.
    let n = 3;
    let w = World::from_devices(
        one_user_device(n),
        WorldConfig::new(n).with_placement(Placement::DevicePerRank),
    )
    .expect("world");
    assert_eq!(w.placement(), Placement::DevicePerRank);
    let got = w
        .run(|c| -> Result<Vec<f32>, Error> {
            let x = c.tensor(&values::<f32>(c.rank(), 1001, 11))?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
        })
        .expect("run");
    let shared = World::from_devices(one_user_device(n), WorldConfig::new(n))
        .expect("world")
        .run(|c| -> Result<Vec<f32>, Error> {
            let x = c.tensor(&values::<f32>(c.rank(), 1001, 11))?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
        })
        .expect("run");
    for (rank, (a, b)) in got.into_iter().zip(shared).enumerate() {
        let (a, b) = (a.expect("per-rank"), b.expect("shared"));
        let at = a
            .iter()
            .zip(&b)
            .position(|(x, y)| x.to_bits() != y.to_bits());
        assert!(at.is_none(), "rank {rank}: differs at element {at:?}");
    }
}

/// A part longer than the adapter allows workgroups in one dimension
/// (65535 on most GPUs: a 256 MiB all-reduce over 4 ranks failed
/// validation on an H200) goes on in another: here a device whose limit
/// is 4 workgroups, shared by 3 ranks, runs the direct kernels' all-reduce
/// (a part per row) and reduce-scatter (a chunk per row) on parts of 16
/// workgroups, against the reference.
#[test]
fn the_direct_kernels_cover_parts_longer_than_one_dispatch_dimension() {
    let adapter = common::user_adapter();
    let limits = wgpu::Limits {
        max_compute_workgroups_per_dimension: 4,
        ..adapter.limits()
    };
    let d = wgpu_collectives::request_device(
        &adapter,
        &wgpu::DeviceDescriptor {
            required_limits: limits,
            ..Default::default()
        },
    )
    .expect("a device with few workgroups per dimension");
    let w = World::from_devices(
        vec![d.clone(), d.clone(), d],
        WorldConfig::new(N)
            .with_placement(Placement::SharedDevice)
            .with_plan(Some(wgpu_collectives::Plan::Direct)),
    )
    .expect("a world");
    let len = N * 4096;
    let got = w
        .run(|c| -> Result<(Vec<u32>, Vec<u32>), Error> {
            let x: Vec<u32> = (0..len as u32).map(|i| i * 3 + c.rank() as u32).collect();
            let x = c.tensor(&x)?;
            let sum = c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<u32>()?;
            let part = c
                .reduce_scatter(&x, ReduceOp::Sum)?
                .wait()?
                .to_vec::<u32>()?;
            Ok((sum, part))
        })
        .expect("run");
    let want: Vec<u32> = (0..len as u32).map(|i| i * 9 + 3).collect();
    for (rank, r) in got.into_iter().enumerate() {
        let (sum, part) = r.expect("rank");
        assert!(
            sum == want,
            "rank {rank}: all_reduce differs from the reference"
        );
        let per = len / N;
        assert!(
            part == want[rank * per..(rank + 1) * per],
            "rank {rank}: reduce_scatter differs from the reference"
        );
    }
}
