//! A fault costs the collective it hit, never the world: a submission that
//! fails validation, an overlap the engine refuses, a rank that panics
//! after a split. After each, the same world runs again and gives the CPU
//! reference's results. And the engine never touches bytes the user holds
//! behind their back.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use wgpu_collectives::{
    Communicator, DType, Error, Placement, ReduceOp, Tensor, World, WorldConfig, wgpu,
};

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

const PLACEMENTS: [Placement; 2] = [Placement::SharedDevice, Placement::DevicePerRank];

fn config(n: usize, placement: Placement) -> WorldConfig {
    WorldConfig::new(n)
        .with_placement(placement)
        .with_timeout(Duration::from_secs(20))
}

/// A world of `n` ranks made by the engine, or on devices the user made
/// (one device for every rank when they are to share it).
fn world(n: usize, placement: Placement, users: bool) -> World {
    if !users {
        return World::new(config(n, placement)).expect("a world");
    }
    let adapter = common::user_adapter();
    let make = || {
        wgpu_collectives::request_device(&adapter, &wgpu::DeviceDescriptor::default())
            .expect("a device")
    };
    let devices = if placement == Placement::SharedDevice {
        let d = make();
        vec![d; n]
    } else {
        (0..n).map(|_| make()).collect()
    };
    World::from_devices(devices, config(n, placement)).expect("a world on the user's devices")
}

fn user_buffer(c: &Communicator, bytes: u64, mapped: bool) -> wgpu::Buffer {
    c.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("the user's buffer"),
        size: bytes,
        usage: USAGE,
        mapped_at_creation: mapped,
    })
}

/// Every rank's all_reduce of `[rank + 1; len]` gives the sum, and a read
/// of a fresh tensor works: the world is healthy.
fn assert_healthy(w: &World, len: usize) {
    let n = w.size();
    let want = (n * (n + 1) / 2) as f32;
    let got = w
        .run(|c| -> Result<(Vec<f32>, Vec<f32>), Error> {
            let x = c.tensor(&vec![c.rank() as f32 + 1.0; len])?;
            let y = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            Ok((y.to_vec::<f32>()?, c.tensor(&[7.0f32; 3])?.to_vec::<f32>()?))
        })
        .expect("a run after the fault");
    for (rank, r) in got.into_iter().enumerate() {
        let (y, z) = r.unwrap_or_else(|e| panic!("rank {rank} after the fault: {e}"));
        assert_eq!(y, vec![want; len], "rank {rank}");
        assert_eq!(z, vec![7.0; 3], "rank {rank}");
    }
}

#[derive(Clone, Copy, Debug)]
enum Trigger {
    Destroyed,
    NeverUnmapped,
}

#[test]
fn a_submission_that_fails_validation_costs_one_collective() {
    for users in [false, true] {
        for placement in PLACEMENTS {
            for trigger in [Trigger::Destroyed, Trigger::NeverUnmapped] {
                let case = format!("users' devices {users}, {placement:?}, {trigger:?}");
                let w = world(3, placement, users);
                assert_healthy(&w, 40);
                let r = w
                    .run(|c| -> Result<Vec<f32>, Error> {
                        let x = if c.rank() == 1 {
                            let b = user_buffer(c, 64, matches!(trigger, Trigger::NeverUnmapped));
                            let x = c.wrap_buffer(&b, 0, DType::F32, 16)?;
                            if let Trigger::Destroyed = trigger {
                                b.destroy();
                            }
                            x
                        } else {
                            c.tensor(&[1.0f32; 16])?
                        };
                        c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?.to_vec()
                    })
                    .expect("the run itself");
                for (rank, e) in r.iter().enumerate() {
                    match e {
                        Ok(v) => panic!("{case}: rank {rank} succeeded with {v:?}"),
                        Err(Error::Device { rank: Some(1), .. }) if rank == 1 => {}
                        Err(Error::Device { .. }) | Err(Error::PeerFailed { peer: 1, .. }) => {}
                        Err(e) => panic!("{case}: rank {rank}: {e}"),
                    }
                }
                assert_healthy(&w, 40);
                assert_healthy(&w, 4099);
            }
        }
    }
}

#[test]
fn a_read_back_of_a_destroyed_buffer_fails_alone() {
    for placement in PLACEMENTS {
        let w = world(2, placement, false);
        let c = w.communicator(0).expect("rank 0");
        let b = user_buffer(c, 64, false);
        let x = c.wrap_buffer(&b, 0, DType::F32, 16).expect("a view");
        b.destroy();
        assert!(x.to_vec::<f32>().is_err(), "{placement:?}");
        assert_eq!(
            c.tensor(&[2.0f32; 5])
                .and_then(|t| t.to_vec::<f32>())
                .expect("a read"),
            vec![2.0; 5]
        );
        assert_healthy(&w, 64);
    }
}

/// Reads a buffer back with the user's own staging buffer.
fn read_f32(c: &Communicator, buffer: &wgpu::Buffer) -> Vec<f32> {
    let staging = c.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("the user's staging"),
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = c.device().create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    c.queue().submit([enc.finish()]);
    let (tx, rx) = std::sync::mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    // The engine's owner thread polls; the callback runs there.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mapped = loop {
        if let Ok(r) = rx.try_recv() {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "the map never ran");
        c.synchronize().expect("synchronize");
    };
    mapped.expect("mapped");
    let v = bytemuck::pod_collect_to_vec(&staging.get_mapped_range(..).expect("a view"));
    staging.unmap();
    v
}

#[test]
fn a_buffer_taken_from_a_tensor_is_never_handed_out_again() {
    let w = world(1, Placement::Auto, false);
    let c = w.communicator(0).expect("rank 0");
    // Documented: the buffer is the tensor's while a clone of it lives.
    let y = c.tensor(&[3.0f32; 16]).expect("y");
    let held = y.clone();
    drop(y);
    let others: Vec<Tensor> = (0..8)
        .map(|_| c.tensor(&[100.0f32; 16]).expect("another"))
        .collect();
    assert_eq!(held.to_vec::<f32>().expect("read"), vec![3.0; 16]);
    drop(others);
    // into_buffer: the buffer leaves the pool for good.
    let kept = held.into_buffer();
    let others: Vec<Tensor> = (0..8)
        .map(|_| c.tensor(&[100.0f32; 16]).expect("another"))
        .collect();
    assert!(others.iter().all(|t| t.buffer() != &kept));
    assert_eq!(&read_f32(c, &kept)[..16], &[3.0; 16]);
    // A wrapped buffer is the user's: never pooled.
    let b = user_buffer(c, 64, false);
    c.queue()
        .write_buffer(&b, 0, bytemuck::cast_slice(&[5.0f32; 16]));
    drop(c.wrap_buffer(&b, 0, DType::F32, 16).expect("a view"));
    let others: Vec<Tensor> = (0..8)
        .map(|_| c.tensor(&[100.0f32; 16]).expect("another"))
        .collect();
    assert!(others.iter().all(|t| t.buffer() != &b));
    assert_eq!(read_f32(c, &b), vec![5.0; 16]);
}

/// Two ranks on one device, as `from_devices` is given it twice.
fn one_device_world(placement: Placement) -> World {
    let adapter = common::user_adapter();
    let d = wgpu_collectives::request_device(&adapter, &wgpu::DeviceDescriptor::default())
        .expect("a device");
    World::from_devices(vec![d.clone(), d], config(2, placement)).expect("a world")
}

#[test]
fn outputs_of_two_ranks_that_share_bytes_are_refused_under_every_placement() {
    for placement in PLACEMENTS {
        let w = one_device_world(placement);
        let shared = user_buffer(w.communicator(0).expect("rank 0"), 64, false);
        // Rank 0 writes elements [0, 8), rank 1 [4, 12): four shared.
        let r = w
            .run(|c| -> Result<Vec<f32>, Error> {
                let x = c.tensor(&[1.0f32; 16])?;
                let out = c.wrap_buffer(&shared, 16 * c.rank() as u64, DType::F32, 8)?;
                c.reduce_scatter_into(&x, &out, ReduceOp::Sum)?
                    .wait()?
                    .to_vec()
            })
            .expect("the run");
        for (rank, e) in r.iter().enumerate() {
            match e {
                Err(Error::InvalidArgument { what, .. }) if what.contains("shares bytes") => {}
                other => panic!("{placement:?}, rank {rank}: {other:?}"),
            }
        }
        // Outputs that touch without sharing a byte are fine.
        let r = w
            .run(|c| -> Result<Vec<f32>, Error> {
                let x = c.tensor(&[c.rank() as f32 + 1.0; 16])?;
                let out = c.wrap_buffer(&shared, 32 * c.rank() as u64, DType::F32, 8)?;
                c.reduce_scatter_into(&x, &out, ReduceOp::Sum)?
                    .wait()?
                    .to_vec()
            })
            .expect("the run");
        for (rank, v) in r.into_iter().enumerate() {
            assert_eq!(
                v.expect("touching outputs"),
                vec![3.0; 8],
                "{placement:?} {rank}"
            );
        }
        assert_healthy(&w, 33);
    }
}

#[test]
fn views_that_touch_without_sharing_a_byte_are_allowed() {
    for placement in PLACEMENTS {
        let w = World::new(config(2, placement)).expect("a world");
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32] {
            let per = 4 / dtype.size();
            let r = w
                .run(|c| -> Result<Vec<u8>, Error> {
                    let b = user_buffer(c, 8, false);
                    let one: Vec<u8> = match dtype {
                        DType::F32 => bytemuck::cast_slice(&[1.0f32]).to_vec(),
                        DType::F16 => bytemuck::cast_slice(&[half::f16::ONE; 2]).to_vec(),
                        DType::BF16 => bytemuck::cast_slice(&[half::bf16::ONE; 2]).to_vec(),
                        DType::I32 => bytemuck::cast_slice(&[1i32]).to_vec(),
                        _ => bytemuck::cast_slice(&[1u32]).to_vec(),
                    };
                    c.queue().write_buffer(&b, 0, &one);
                    let x = c.wrap_buffer(&b, 0, dtype, per)?;
                    let out = c.wrap_buffer(&b, 4, dtype, per)?;
                    let _ = c.all_reduce_into(&x, &out, ReduceOp::Sum)?.wait()?;
                    let two = read_bytes(c, &b);
                    Ok(two)
                })
                .expect("the run");
            for (rank, v) in r.into_iter().enumerate() {
                let v = v.unwrap_or_else(|e| panic!("{placement:?} {dtype} rank {rank}: {e}"));
                let want: Vec<u8> = match dtype {
                    DType::F32 => bytemuck::cast_slice(&[1.0f32, 2.0]).to_vec(),
                    DType::F16 => bytemuck::cast_slice(&[
                        half::f16::ONE,
                        half::f16::ONE,
                        half::f16::from_f32(2.0),
                        half::f16::from_f32(2.0),
                    ])
                    .to_vec(),
                    DType::BF16 => bytemuck::cast_slice(&[
                        half::bf16::ONE,
                        half::bf16::ONE,
                        half::bf16::from_f32(2.0),
                        half::bf16::from_f32(2.0),
                    ])
                    .to_vec(),
                    DType::I32 => bytemuck::cast_slice(&[1i32, 2]).to_vec(),
                    _ => bytemuck::cast_slice(&[1u32, 2]).to_vec(),
                };
                assert_eq!(v, want, "{placement:?} {dtype} rank {rank}");
            }
        }
    }
}

fn read_bytes(c: &Communicator, b: &wgpu::Buffer) -> Vec<u8> {
    bytemuck::cast_slice(&read_f32(c, b)).to_vec()
}

#[test]
fn empty_views_do_nothing_and_succeed() {
    for placement in PLACEMENTS {
        let w = World::new(config(3, placement)).expect("a world");
        let r = w
            .run(|c| -> Result<usize, Error> {
                let b = user_buffer(c, 0, false);
                let e = c.wrap_buffer(&b, 0, DType::F32, 0)?;
                let b2 = user_buffer(c, 16, false);
                let e2 = c.wrap_buffer(&b2, 8, DType::F32, 0)?;
                let mut lens = c.all_reduce_in_place(&e, ReduceOp::Sum)?.wait()?.len();
                lens += c.all_reduce_into(&e, &e2, ReduceOp::Max)?.wait()?.len();
                lens += c.broadcast_into(&e, &e2, 0)?.wait()?.len();
                let g = c.group(|g| {
                    g.all_reduce_into(&e, &e2, ReduceOp::Sum)?;
                    g.all_gather_into(&e, &e2)
                })?;
                lens += g.wait_all()?.iter().map(Tensor::len).sum::<usize>();
                Ok(lens)
            })
            .expect("the run");
        for (rank, v) in r.into_iter().enumerate() {
            assert_eq!(v.unwrap_or_else(|e| panic!("{placement:?} {rank}: {e}")), 0);
        }
        assert_healthy(&w, 9);
    }
}

#[test]
fn a_rank_that_panics_after_a_split_is_the_failure_reported() {
    for placement in PLACEMENTS {
        let w = World::new(config(3, placement)).expect("a world");
        let seen = Mutex::new(Vec::new());
        let r = w.run(|c| {
            let child = c.split(Some(0), c.rank());
            if c.rank() == 1 {
                panic!("rank 1 gives up");
            }
            let got = child.and_then(|child| {
                let child = child.ok_or_else(|| Error::InvalidArgument {
                    rank: None,
                    what: "no child".into(),
                })?;
                let x = child.tensor(&[1.0f32; 8])?;
                child.all_reduce(&x, ReduceOp::Sum)?.wait()
            });
            seen.lock()
                .expect("lock")
                .push((c.rank(), got.map(|t| t.len())));
        });
        match r {
            Err(Error::RankPanicked { rank: 1, message }) => {
                assert!(message.contains("gives up"), "{message}")
            }
            other => panic!("{placement:?}: {other:?}"),
        }
        for (rank, got) in seen.into_inner().expect("lock") {
            match got {
                Err(Error::PeerFailed {
                    peer: 1,
                    reason,
                    doing,
                    ..
                }) => {
                    assert!(
                        reason.contains("gives up"),
                        "{placement:?} {rank}: {reason} {doing}"
                    );
                    assert!(
                        doing.contains("all_reduce"),
                        "{placement:?} {rank}: {doing}"
                    );
                }
                other => panic!("{placement:?}, rank {rank}: {other:?}"),
            }
        }
        assert_healthy(&w, 16);
    }
}

#[test]
fn an_empty_group_completes() {
    for placement in PLACEMENTS {
        let w = World::new(config(2, placement)).expect("a world");
        let r = w
            .run(|c| -> Result<(usize, usize), Error> {
                let one = c.group(|_| Ok(()))?.wait()?.len();
                let all = c.group(|_| Ok(()))?.wait_all()?.len();
                Ok((one, all))
            })
            .expect("the run");
        for (rank, v) in r.into_iter().enumerate() {
            assert_eq!(
                v.unwrap_or_else(|e| panic!("{placement:?} {rank}: {e}")),
                (0, 0)
            );
        }
        assert_healthy(&w, 5);
    }
}

#[test]
fn the_shared_placement_on_separate_devices_is_refused() {
    let adapter = common::user_adapter();
    let devices: Vec<_> = (0..2)
        .map(|_| {
            wgpu_collectives::request_device(&adapter, &wgpu::DeviceDescriptor::default())
                .expect("a device")
        })
        .collect();
    match World::from_devices(devices, config(2, Placement::SharedDevice)) {
        Err(Error::InvalidArgument { what, .. }) => {
            assert!(what.contains("shared placement"), "{what}")
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}
