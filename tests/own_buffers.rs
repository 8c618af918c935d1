//! Your own devices and buffers: worlds on devices the user made, user
//! buffers in collectives without a copy, outputs the user chooses, and
//! stream order on the rank's queue.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use half::f16;
use wgpu_collectives::{DType, Error, Placement, ReduceOp, Tensor, World, WorldConfig, wgpu};

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// `n` devices made the way a framework makes them: default features and
/// limits, on the adapter `WGPU_ADAPTER_NAME` names (else the first).
fn user_devices(n: usize) -> Vec<(wgpu::Device, wgpu::Queue)> {
    let adapter = common::user_adapter();
    (0..n)
        .map(|_| {
            wgpu_collectives::request_device(&adapter, &wgpu::DeviceDescriptor::default())
                .expect("a device with default features and limits")
        })
        .collect()
}

/// A buffer of `words` u32 on `dev` holding `data` (the rest zero).
fn user_buffer(dev: &wgpu::Device, queue: &wgpu::Queue, bytes: u64, data: &[u8]) -> wgpu::Buffer {
    let b = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("user"),
        size: bytes,
        usage: USAGE,
        mapped_at_creation: false,
    });
    queue.write_buffer(&b, 0, data);
    b
}

/// Reads `buffer` back with the user's own staging buffer, as a wgpu user does.
fn read_back(dev: &wgpu::Device, queue: &wgpu::Queue, buffer: &wgpu::Buffer) -> Vec<u8> {
    let staging = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("user staging"),
        size: buffer.size(),
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut enc = dev.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(buffer, 0, &staging, 0, buffer.size());
    let idx = queue.submit([enc.finish()]);
    let (tx, rx) = mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    dev.poll(wgpu::PollType::Wait {
        submission_index: Some(idx),
        timeout: None,
    })
    .expect("the device finishes");
    // The map callback may run in another thread's poll (the engine's).
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the map callback ran")
        .expect("the map succeeded");
    let bytes = staging
        .get_mapped_range(..)
        .expect("a mapped view")
        .to_vec();
    staging.unmap();
    bytes
}

fn f32s(v: &[u8]) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(v)
}

#[test]
fn a_world_runs_on_devices_the_user_made() {
    let n = 3;
    let world = World::from_devices(user_devices(n), WorldConfig::new(n)).expect("a world");
    assert!(world.instance().is_none());
    let got = world
        .run(|c| {
            assert!(c.adapter().is_none());
            let x = c.tensor(
                &(0..1000)
                    .map(|i| (i % 7 + c.rank()) as f32)
                    .collect::<Vec<_>>(),
            )?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
        })
        .expect("the run");
    let want: Vec<f32> = (0..1000).map(|i| (3 * (i % 7) + 3) as f32).collect();
    for r in got {
        assert_eq!(r.expect("the rank's result"), want);
    }
}

#[test]
fn a_device_count_other_than_the_rank_count_is_an_error() {
    let e = World::from_devices(user_devices(2), WorldConfig::new(3)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("2 devices"), "{e}");
}

#[test]
fn the_world_new_makes_hands_out_its_instance_and_adapters() {
    let world = common::world(2);
    assert!(world.instance().is_some());
    for r in 0..2 {
        let c = world.communicator(r).expect("a rank");
        let adapter = c.adapter().expect("World::new made the adapter");
        assert_eq!(adapter.get_info().name, c.adapter_info().name);
    }
}

#[test]
fn required_features_and_limits_are_checked_against_the_adapter() {
    let world = common::world(1);
    let adapter = world
        .communicator(0)
        .and_then(|c| c.adapter())
        .expect("an adapter");
    let have = adapter.features();
    // A feature this adapter lacks, whatever the adapter.
    let missing = wgpu::Features::all()
        .iter()
        .find(|f| !have.contains(*f))
        .expect("an adapter without every feature");
    let e = World::new(WorldConfig::new(1).with_required_features(missing)).unwrap_err();
    assert!(e.to_string().contains("required features"), "{e}");
    let too_much = wgpu::Limits {
        max_buffer_size: u64::MAX,
        ..wgpu::Limits::downlevel_defaults()
    };
    let e = World::new(WorldConfig::new(1).with_required_limits(too_much)).unwrap_err();
    assert!(e.to_string().contains("max_buffer_size"), "{e}");
    // What the adapter has is granted, and the device shows it.
    let some = have & wgpu::Features::SHADER_F16;
    let w = World::new(
        WorldConfig::new(1)
            .with_required_features(some)
            .with_required_limits(wgpu::Limits::downlevel_defaults()),
    )
    .expect("a world with what the adapter has");
    let dev = w.communicator(0).expect("rank 0").device();
    assert!(dev.features().contains(some));
}

#[test]
fn a_user_buffer_is_all_reduced_in_place_without_touching_its_neighbours() {
    let n = 2;
    let world = World::from_devices(user_devices(n), WorldConfig::new(n)).expect("a world");
    // (offset in bytes, elements): the whole buffer, an offset view, and a
    // length that leaves a partial 16-byte unit.
    for (offset, len) in [(0u64, 1024usize), (12, 1000), (4, 7)] {
        let got = world
            .run(|c| {
                let (dev, queue) = (c.device(), c.queue());
                let total = 4 * 1024 + 64;
                let mut init = vec![0u8; total];
                for (i, w) in init.chunks_mut(4).enumerate() {
                    w.copy_from_slice(&(1000.0 + i as f32).to_le_bytes());
                }
                let first = offset as usize / 4;
                for i in 0..len {
                    let v = (c.rank() * 10 + i % 5) as f32;
                    init[(first + i) * 4..(first + i) * 4 + 4].copy_from_slice(&v.to_le_bytes());
                }
                let buf = user_buffer(dev, queue, total as u64, &init);
                let x = c.wrap_buffer(&buf, offset, DType::F32, len)?;
                assert_eq!(x.offset(), offset);
                assert_eq!(x.buffer(), &buf);
                let y = c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?;
                assert_eq!(y.buffer(), &buf);
                Ok::<_, Error>((f32s(&read_back(dev, queue, &buf)), y.to_vec::<f32>()?))
            })
            .expect("the run");
        for (rank, r) in got.into_iter().enumerate() {
            let (all, via_tensor) = r.expect("the rank's result");
            let first = offset as usize / 4;
            for (i, v) in all.iter().enumerate() {
                let want = if (first..first + len).contains(&i) {
                    (10 + 2 * ((i - first) % 5)) as f32
                } else {
                    1000.0 + i as f32
                };
                assert_eq!(
                    *v, want,
                    "rank {rank}, offset {offset}, len {len}, word {i}"
                );
            }
            assert_eq!(via_tensor, all[first..first + len]);
        }
    }
}

#[test]
fn a_sixteen_bit_view_of_odd_length_keeps_the_neighbouring_half_word() {
    let n = 2;
    let world = World::from_devices(user_devices(n), WorldConfig::new(n)).expect("a world");
    let len = 5usize; // elements 0..5 of the view: the 6th half-word is not ours
    let got = world
        .run(|c| {
            let (dev, queue) = (c.device(), c.queue());
            // 8 bytes before the view, the view, then sentinels.
            let mut halves: Vec<f16> = vec![f16::from_f32(-7.0); 32];
            for i in 0..len {
                halves[4 + i] = f16::from_f32((c.rank() + i) as f32);
            }
            let buf = user_buffer(dev, queue, 64, bytemuck::cast_slice(&halves));
            let x = c.wrap_buffer(&buf, 8, DType::F16, len)?;
            let out = user_buffer(dev, queue, 64, bytemuck::cast_slice(&halves));
            let o = c.wrap_buffer(&out, 8, DType::F16, len)?;
            let _ = c.all_reduce_into(&x, &o, ReduceOp::Sum)?.wait()?;
            let _ = c.all_reduce_in_place(&x, ReduceOp::Max)?.wait()?;
            let a: Vec<f16> = bytemuck::pod_collect_to_vec(&read_back(dev, queue, &out));
            let b: Vec<f16> = bytemuck::pod_collect_to_vec(&read_back(dev, queue, &buf));
            Ok::<_, Error>((a, b))
        })
        .expect("the run");
    for r in got {
        let (sum, max) = r.expect("the rank's result");
        for i in 0..32 {
            let (want_sum, want_max) = if (4..4 + len).contains(&i) {
                let k = (i - 4) as f32;
                (2.0 * k + 1.0, k + 1.0)
            } else {
                (-7.0, -7.0)
            };
            assert_eq!(sum[i].to_f32(), want_sum, "half-word {i} of the sum");
            assert_eq!(max[i].to_f32(), want_max, "half-word {i} of the max");
        }
    }
}

#[test]
fn bad_wraps_are_invalid_arguments() {
    // "Another device" needs ranks that model separate GPUs.
    let world =
        World::new(WorldConfig::new(2).with_placement(Placement::DevicePerRank)).expect("a world");
    let c0 = world.communicator(0).expect("rank 0");
    let c1 = world.communicator(1).expect("rank 1");
    let buf = user_buffer(c0.device(), c0.queue(), 256, &[0u8; 256]);
    let cases: Vec<(&str, Result<Tensor, Error>)> = vec![
        ("offset", c0.wrap_buffer(&buf, 2, DType::F32, 4)),
        ("out of range", c0.wrap_buffer(&buf, 0, DType::F32, 65)),
        (
            "out of range at an offset",
            c0.wrap_buffer(&buf, 252, DType::F16, 3),
        ),
        (
            "overflow",
            c0.wrap_buffer(&buf, 4, DType::F32, usize::MAX / 2),
        ),
        ("another device", c1.wrap_buffer(&buf, 0, DType::F32, 4)),
    ];
    let no_storage = c0.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 256,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let odd = c0.device().create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 254,
        usage: USAGE,
        mapped_at_creation: false,
    });
    let more = vec![
        ("usage", c0.wrap_buffer(&no_storage, 0, DType::F32, 4)),
        ("odd buffer size", c0.wrap_buffer(&odd, 0, DType::F16, 3)),
    ];
    for (what, r) in cases.into_iter().chain(more) {
        match r {
            Err(Error::InvalidArgument { .. }) => {}
            other => panic!("{what}: expected InvalidArgument, got {other:?}"),
        }
    }
    // The rank's device is still fine afterwards.
    let x = c0
        .wrap_buffer(&buf, 0, DType::F32, 64)
        .expect("a good wrap");
    assert_eq!(x.to_vec::<f32>().expect("a read"), vec![0.0; 64]);
}

#[test]
fn every_into_call_lands_in_the_callers_output() {
    let n = 3;
    let world = World::from_devices(user_devices(n), WorldConfig::new(n)).expect("a world");
    let got = world
        .run(|c| {
            let r = c.rank() as i32;
            let (dev, queue) = (c.device(), c.queue());
            let x = c.tensor(&(0..6).map(|i| r * 100 + i).collect::<Vec<i32>>())?;
            // Every output is a view at an offset of a user buffer.
            let out = |len: usize| -> Result<(wgpu::Buffer, Tensor), Error> {
                let b = user_buffer(dev, queue, 4 * (len as u64 + 3), &[0u8; 0]);
                let t = c.wrap_buffer(&b, 8, DType::I32, len)?;
                Ok((b, t))
            };
            let read = |t: &Tensor| t.to_vec::<i32>();
            let (_b1, o1) = out(6)?;
            let w = c.all_reduce_into(&x, &o1, ReduceOp::Sum)?.wait()?;
            assert!(w.buffer() == o1.buffer() && w.offset() == o1.offset());
            let (_b2, o2) = out(18)?;
            let _ = c.all_gather_into(&x, &o2)?.wait()?;
            let (_b3, o3) = out(2)?;
            let _ = c.reduce_scatter_into(&x, &o3, ReduceOp::Max)?.wait()?;
            let (_b4, o4) = out(6)?;
            let _ = c.broadcast_into(&x, &o4, 2)?.wait()?;
            let (_b5, o5) = out(6)?;
            let _ = c.reduce_into(&x, &o5, ReduceOp::Sum, 1)?.wait()?;
            let (_b6, o6) = out(6)?;
            let _ = c.all_to_all_into(&x, &o6, None, None)?.wait()?;
            Ok::<_, Error>([&o1, &o2, &o3, &o4, &o5, &o6].map(read))
        })
        .expect("the run");
    let x = |r: i32| (0..6).map(move |i| r * 100 + i);
    for (rank, res) in got.into_iter().enumerate() {
        let [sum, gathered, scattered, bcast, reduced, a2a] = res.expect("the rank ran");
        assert_eq!(
            sum.expect("all_reduce_into"),
            x(0).map(|v| 3 * v + 300).collect::<Vec<_>>()
        );
        assert_eq!(
            gathered.expect("all_gather_into"),
            (0..3).flat_map(x).collect::<Vec<_>>()
        );
        assert_eq!(
            scattered.expect("reduce_scatter_into"),
            x(2).skip(2 * rank).take(2).collect::<Vec<_>>()
        );
        assert_eq!(bcast.expect("broadcast_into"), x(2).collect::<Vec<_>>());
        if rank == 1 {
            assert_eq!(
                reduced.expect("reduce_into"),
                x(0).map(|v| 3 * v + 300).collect::<Vec<_>>()
            );
        }
        assert_eq!(
            a2a.expect("all_to_all_into"),
            (0..3)
                .flat_map(|j| x(j).skip(2 * rank).take(2))
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn bad_outputs_are_invalid_arguments() {
    let world = common::world(2);
    let c0 = world.communicator(0).expect("rank 0");
    let c1 = world.communicator(1).expect("rank 1");
    let x = c0.tensor(&[1.0f32; 8]).expect("x");
    let wrong_dtype = c0.zeros(DType::I32, 8).expect("an i32 tensor");
    let wrong_len = c0.zeros(DType::F32, 9).expect("a longer tensor");
    let elsewhere = c1.zeros(DType::F32, 8).expect("rank 1's tensor");
    let buf = user_buffer(c0.device(), c0.queue(), 256, &[0u8; 0]);
    let a = c0.wrap_buffer(&buf, 0, DType::F32, 16).expect("a view");
    let overlapping = c0.wrap_buffer(&buf, 16, DType::F32, 16).expect("a view");
    let cases = [
        ("dtype", c0.all_reduce_into(&x, &wrong_dtype, ReduceOp::Sum)),
        ("length", c0.broadcast_into(&x, &wrong_len, 0)),
        (
            "another rank",
            c0.reduce_into(&x, &elsewhere, ReduceOp::Sum, 0),
        ),
        ("gather length", c0.all_gather_into(&x, &wrong_len)),
        (
            "scatter length",
            c0.reduce_scatter_into(&x, &wrong_len, ReduceOp::Sum),
        ),
        (
            "all_to_all length",
            c0.all_to_all_into(&x, &wrong_len, None, None),
        ),
        (
            "overlap",
            c0.all_reduce_into(&a, &overlapping, ReduceOp::Sum),
        ),
        ("all_gather in place", c0.all_gather_into(&a, &a)),
    ];
    for (what, r) in cases {
        match r {
            Err(Error::InvalidArgument { .. }) => {}
            other => panic!("{what}: expected InvalidArgument, got {other:?}"),
        }
    }
}

#[test]
fn collectives_follow_stream_order_on_the_ranks_queue() {
    let n = 2;
    let world = World::from_devices(user_devices(n), WorldConfig::new(n)).expect("a world");
    let got = world
        .run(|c| {
            let (dev, queue) = (c.device(), c.queue());
            let len = 1 << 16;
            let src_data: Vec<f32> = (0..len).map(|i| (c.rank() + i % 3) as f32).collect();
            let src = user_buffer(dev, queue, 4 * len as u64, bytemuck::cast_slice(&src_data));
            let grad = user_buffer(dev, queue, 4 * len as u64, &[0u8; 0]);
            // The user's own work, submitted and not waited for.
            let mut enc = dev.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&src, 0, &grad, 0, 4 * len as u64);
            queue.submit([enc.finish()]);
            let x = c.wrap_buffer(&grad, 0, DType::F32, len)?;
            let _ = c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?;
            // Work submitted after the wait sees the result.
            let mut enc = dev.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&grad, 0, &src, 0, 4 * len as u64);
            queue.submit([enc.finish()]);
            Ok::<_, Error>(f32s(&read_back(dev, queue, &src)))
        })
        .expect("the run");
    let want: Vec<f32> = (0..1 << 16).map(|i| (1 + 2 * (i % 3)) as f32).collect();
    for r in got {
        assert_eq!(r.expect("the rank's result"), want);
    }
}

/// On a device the user made, the engine installs no global callbacks: the
/// user's own uncaptured-error handler still gets the user's errors, and
/// the engine's own validation stays in its error scopes.
#[test]
fn the_users_error_handler_stays_the_users() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let devices = user_devices(2);
    let seen = Arc::new(AtomicUsize::new(0));
    for (dev, _) in &devices {
        let seen = seen.clone();
        dev.on_uncaptured_error(Arc::new(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let world = World::from_devices(devices, WorldConfig::new(2)).expect("a world");
    let c0 = world.communicator(0).expect("rank 0");
    // The engine's refusal of a bad wrap is caught in its own scope.
    let other = world.communicator(1).expect("rank 1");
    let foreign = user_buffer(other.device(), other.queue(), 256, &[0u8; 0]);
    assert!(c0.wrap_buffer(&foreign, 0, DType::F32, 4).is_err());
    assert_eq!(
        seen.load(Ordering::SeqCst),
        0,
        "the engine's error reached the user's handler"
    );
    // A user's own mistake goes to the user's handler.
    let _bad = c0.device().create_buffer(&wgpu::BufferDescriptor {
        label: Some("invalid on purpose"),
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::MAP_WRITE,
        mapped_at_creation: false,
    });
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the user's handler did not run"
    );
    // And collectives are unaffected.
    let got = world
        .run(|c| {
            c.all_reduce(&c.tensor(&[1u32; 8])?, ReduceOp::Sum)?
                .wait()?
                .to_vec::<u32>()
        })
        .expect("the run");
    for r in got {
        assert_eq!(r.expect("the rank's result"), vec![2u32; 8]);
    }
}
