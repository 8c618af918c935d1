//! Point-to-point, gather, scatter and groups: every call and dtype on 1
//! to 5 ranks under both placements, checked byte for byte against what
//! the CPU says each rank must end with.
//!
//! Payloads are arbitrary bit patterns (NaNs, denormals and all), since
//! nothing here reduces: any byte that moved wrong shows.

mod common;

use std::time::Duration;

use common::bits;
use half::{bf16, f16};
use wgpu_collectives::{
    Communicator, DType, Error, Placement, ReduceOp, Tensor, World, WorldConfig,
};

const PLACEMENTS: [Placement; 2] = [Placement::SharedDevice, Placement::DevicePerRank];

fn world(n: usize, placement: Placement) -> World {
    World::new(WorldConfig::new(n).with_placement(placement))
        .unwrap_or_else(|e| panic!("cannot build a {n}-rank {placement:?} world: {e}"))
}

/// `len` elements of `dtype` for `rank`, as bytes.
fn payload(dtype: DType, rank: usize, len: usize, salt: u64) -> Vec<u8> {
    (0..len)
        .flat_map(|i| bits(rank, i, salt).to_le_bytes()[..dtype.size()].to_vec())
        .collect()
}

fn tensor(c: &Communicator, dtype: DType, bytes: &[u8]) -> Result<Tensor, Error> {
    match dtype {
        DType::F32 => c.tensor::<f32>(&bytemuck::pod_collect_to_vec(bytes)),
        DType::F16 => c.tensor::<f16>(&bytemuck::pod_collect_to_vec(bytes)),
        DType::BF16 => c.tensor::<bf16>(&bytemuck::pod_collect_to_vec(bytes)),
        DType::I32 => c.tensor::<i32>(&bytemuck::pod_collect_to_vec(bytes)),
        _ => c.tensor::<u32>(&bytemuck::pod_collect_to_vec(bytes)),
    }
}

fn bytes(t: &Tensor) -> Result<Vec<u8>, Error> {
    Ok(match t.dtype() {
        DType::F32 => bytemuck::cast_slice(&t.to_vec::<f32>()?).to_vec(),
        DType::F16 => bytemuck::cast_slice(&t.to_vec::<f16>()?).to_vec(),
        DType::BF16 => bytemuck::cast_slice(&t.to_vec::<bf16>()?).to_vec(),
        DType::I32 => bytemuck::cast_slice(&t.to_vec::<i32>()?).to_vec(),
        _ => bytemuck::cast_slice(&t.to_vec::<u32>()?).to_vec(),
    })
}

/// Lengths: empty, odd (16-bit pieces that start mid-word), and, for one
/// dtype, more than one point-to-point slice (1 MiB).
fn lengths(dtype: DType) -> Vec<usize> {
    match dtype {
        DType::F32 => vec![0, 1, 7, 300_001],
        _ => vec![0, 1, 7, 64],
    }
}

/// One rank's results of every call, named, in a fixed order.
type Results = Vec<(String, Vec<u8>)>;

/// A call's name, the bytes it left, and the bytes the CPU expects.
type Checked = Vec<(String, Vec<u8>, Vec<u8>)>;

/// Every call on one rank, each result with the bytes the CPU expects.
fn program(c: &Communicator) -> Result<Checked, Error> {
    let (n, r) = (c.size(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut got = Vec::new();
    for dtype in DType::ALL {
        for len in lengths(dtype) {
            let mine = payload(dtype, r, len, 1);
            if n > 1 {
                // Send then receive, not grouped: sends never wait.
                let x = tensor(c, dtype, &mine)?;
                let out = c.zeros(dtype, len)?;
                let sent = c.send(&x, next)?;
                let _ = c.recv(&out, prev)?.wait()?;
                let _ = sent.wait()?;
                got.push((
                    format!("send/recv {dtype} {len}"),
                    bytes(&out)?,
                    payload(dtype, prev, len, 1),
                ));
                // Both ways round the ring in one group.
                let (from_prev, from_next) = (c.zeros(dtype, len)?, c.zeros(dtype, len)?);
                let back = tensor(c, dtype, &payload(dtype, r, len, 5))?;
                let _ = c
                    .group(|g| {
                        g.recv(&from_prev, prev)?;
                        g.send(&x, next)?;
                        g.recv(&from_next, next)?;
                        g.send(&back, prev)
                    })?
                    .wait()?;
                got.push((
                    format!("grouped from prev {dtype} {len}"),
                    bytes(&from_prev)?,
                    payload(dtype, prev, len, 1),
                ));
                got.push((
                    format!("grouped from next {dtype} {len}"),
                    bytes(&from_next)?,
                    payload(dtype, next, len, 5),
                ));
            }
            // gather at the last rank; elsewhere `out` must stay as it was.
            let root = n - 1;
            let x = tensor(c, dtype, &mine)?;
            let sentinel = payload(dtype, 99, 3, 2);
            let out = if r == root {
                c.zeros(dtype, n * len)?
            } else {
                tensor(c, dtype, &sentinel)?
            };
            let _ = c.gather_into(&x, &out, root)?.wait()?;
            let want = if r == root {
                (0..n).flat_map(|j| payload(dtype, j, len, 1)).collect()
            } else {
                sentinel
            };
            got.push((format!("gather {dtype} {len}"), bytes(&out)?, want));
            // scatter from rank n/2; elsewhere `x` is empty.
            let root = n / 2;
            let x = if r == root {
                let all: Vec<u8> = (0..n).flat_map(|j| payload(dtype, j, len, 3)).collect();
                tensor(c, dtype, &all)?
            } else {
                c.zeros(dtype, 0)?
            };
            let out = c.zeros(dtype, len)?;
            let _ = c.scatter_into(&x, &out, root)?.wait()?;
            got.push((
                format!("scatter {dtype} {len}"),
                bytes(&out)?,
                payload(dtype, r, len, 3),
            ));
        }
    }
    Ok(got)
}

#[test]
fn every_call_and_dtype_on_1_to_5_ranks_under_both_placements() {
    for placement in PLACEMENTS {
        for n in 1..=5 {
            let w = world(n, placement);
            let all = w.run(program).expect("run");
            for (r, results) in all.into_iter().enumerate() {
                for (what, got, want) in results.expect("rank") {
                    assert!(
                        got == want,
                        "{placement:?}, {n} ranks, rank {r}: {what}: got {} bytes {:02x?}.., \
                         want {} bytes {:02x?}..",
                        got.len(),
                        &got[..got.len().min(16)],
                        want.len(),
                        &want[..want.len().min(16)]
                    );
                }
            }
        }
    }
}

/// A grouped ring exchange, in both directions at once, mixed with a
/// collective of another dtype: one `Work`, no deadlock, every output.
#[test]
fn a_grouped_ring_exchange_completes() {
    for placement in PLACEMENTS {
        let w = world(4, placement);
        let got = w
            .run(|c| -> Result<Results, Error> {
                let (n, r) = (c.size(), c.rank());
                let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
                let a = tensor(c, DType::F16, &payload(DType::F16, r, 5, 4))?;
                let b = tensor(c, DType::I32, &payload(DType::I32, r, 3, 5))?;
                let (from_prev, from_next) = (c.zeros(DType::F16, 5)?, c.zeros(DType::I32, 3)?);
                let ones = c.tensor(&[1u32; 6])?;
                let count = c.zeros(DType::U32, 6)?;
                let outs = c
                    .group(|g| {
                        g.recv(&from_prev, prev)?;
                        g.recv(&from_next, next)?;
                        g.all_reduce_into(&ones, &count, ReduceOp::Sum)?;
                        g.send(&a, next)?;
                        g.send(&b, prev)
                    })?
                    .wait_all()?;
                let mut got = vec![("outputs".to_string(), vec![outs.len() as u8])];
                for (name, t) in [
                    ("from prev", &from_prev),
                    ("from next", &from_next),
                    ("count", &count),
                ] {
                    got.push((name.to_string(), bytes(t)?));
                }
                Ok(got)
            })
            .expect("run");
        for (r, results) in got.into_iter().enumerate() {
            let results = results.expect("rank");
            let want: Results = vec![
                ("outputs".into(), vec![5]),
                ("from prev".into(), payload(DType::F16, (r + 3) % 4, 5, 4)),
                ("from next".into(), payload(DType::I32, (r + 1) % 4, 3, 5)),
                ("count".into(), bytemuck::cast_slice(&[4u32; 6]).to_vec()),
            ];
            assert_eq!(results, want, "{placement:?}, rank {r}");
        }
    }
}

/// Pipeline parallelism: activations pass from stage to stage with
/// several micro-batches in flight; each stage adds its rank + 1.
/// A group's sends to several peers: one receiver takes its message and
/// returns from its closure long before the other receives. The sender's
/// wait must not take the first one's leaving for a send it never got
/// (CI once failed `a_grouped_ring_exchange_completes` so). The pause only
/// orders the two receivers; the result does not depend on how long.
#[test]
fn a_group_waits_for_a_late_receiver_after_an_early_one_leaves() {
    for placement in PLACEMENTS {
        let w = world(3, placement);
        let got = w
            .run(|c| -> Result<Vec<u8>, Error> {
                let x = tensor(c, DType::U32, &payload(DType::U32, c.rank(), 4, 9))?;
                match c.rank() {
                    0 => {
                        c.group(|g| {
                            g.send(&x, 1)?;
                            g.send(&x, 2)
                        })?
                        .wait_all()?;
                        Ok(Vec::new())
                    }
                    r => {
                        if r == 2 {
                            std::thread::sleep(Duration::from_millis(300));
                        }
                        let got = c.zeros(DType::U32, 4)?;
                        let _ = c.recv(&got, 0)?.wait()?;
                        bytes(&got)
                    }
                }
            })
            .expect("run");
        for (r, got) in got.into_iter().enumerate() {
            let got = got.unwrap_or_else(|e| panic!("{placement:?}, rank {r}: {e}"));
            let want = if r == 0 {
                Vec::new()
            } else {
                payload(DType::U32, 0, 4, 9)
            };
            assert_eq!(got, want, "{placement:?}, rank {r}");
        }
    }
}

#[test]
fn a_pipeline_passes_micro_batches_rank_to_rank() {
    const MICRO: usize = 6;
    const LEN: usize = 1000;
    for placement in PLACEMENTS {
        let w = world(4, placement);
        let got = w
            .run(|c| -> Result<Vec<Vec<f32>>, Error> {
                let (n, r) = (c.size(), c.rank());
                let mut finished = Vec::new();
                if r == 0 {
                    // Every micro-batch leaves at once.
                    let mut sends = Vec::new();
                    for m in 0..MICRO {
                        let act: Vec<f32> = (0..LEN).map(|i| (m * LEN + i) as f32 + 1.0).collect();
                        sends.push(c.send(&c.tensor(&act)?, 1)?);
                    }
                    for s in sends {
                        let _ = s.wait()?;
                    }
                    return Ok(finished);
                }
                let bufs: Vec<Tensor> = (0..MICRO)
                    .map(|_| c.zeros(DType::F32, LEN))
                    .collect::<Result<_, _>>()?;
                // All receives posted before the first is used.
                let recvs: Vec<_> = bufs
                    .iter()
                    .map(|b| c.recv(b, r - 1))
                    .collect::<Result<_, _>>()?;
                let mut sends = Vec::new();
                for work in recvs {
                    let mut act = work.wait()?.to_vec::<f32>()?;
                    act.iter_mut().for_each(|v| *v += r as f32 + 1.0);
                    if r + 1 < n {
                        sends.push(c.send(&c.tensor(&act)?, r + 1)?);
                    } else {
                        finished.push(act);
                    }
                }
                for s in sends {
                    let _ = s.wait()?;
                }
                Ok(finished)
            })
            .expect("run");
        let last = got
            .into_iter()
            .last()
            .expect("4 ranks")
            .expect("last stage");
        assert_eq!(last.len(), MICRO, "{placement:?}");
        for (m, act) in last.iter().enumerate() {
            let want: Vec<f32> = (0..LEN)
                .map(|i| (m * LEN + i) as f32 + 1.0 + 2.0 + 3.0 + 4.0)
                .collect();
            assert_eq!(act, &want, "{placement:?}, micro-batch {m}");
        }
    }
}

/// Point-to-point packets and collectives do not take each other's place:
/// rank 0 sends before an all_reduce, rank 1 receives after it.
#[test]
fn sends_and_collectives_interleave_in_any_order_across_ranks() {
    for placement in PLACEMENTS {
        let w = world(2, placement);
        let got = w
            .run(|c| -> Result<(Vec<i32>, Vec<i32>), Error> {
                let x = c.tensor(&[c.rank() as i32 + 1; 4])?;
                let out = c.zeros(DType::I32, 4)?;
                let sum = if c.rank() == 0 {
                    let sent = c.send(&c.tensor(&[7, 8, 9, 10])?, 1)?;
                    let s = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
                    let _ = sent.wait()?;
                    s
                } else {
                    let s = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
                    let _ = c.recv(&out, 0)?.wait()?;
                    s
                };
                Ok((sum.to_vec()?, out.to_vec()?))
            })
            .expect("run");
        let (sum, out) = got[1].clone().expect("rank 1");
        assert_eq!(sum, vec![3; 4], "{placement:?}");
        assert_eq!(out, vec![7, 8, 9, 10], "{placement:?}");
    }
}

#[test]
fn a_receive_of_another_length_or_dtype_is_a_mismatch_naming_both() {
    for placement in PLACEMENTS {
        for (len, dtype) in [(5, DType::F32), (4, DType::I32)] {
            let w = world(2, placement);
            // The send and the receive fail themselves, each told as its
            // own side sees it.
            let got = w.run(|c| -> Result<(), Error> {
                if c.rank() == 0 {
                    c.send(&c.tensor(&[1.0f32; 4])?, 1)?.wait().map(drop)
                } else {
                    c.recv(&c.zeros(dtype, len)?, 0)?.wait().map(drop)
                }
            });
            let errors = match got {
                Ok(per_rank) => per_rank,
                Err(e) => panic!("run failed as a whole: {e}"),
            };
            for (r, e) in errors.into_iter().enumerate() {
                let (mine, other) = if r == 0 {
                    ("send", "recv")
                } else {
                    ("recv", "send")
                };
                match e {
                    Err(Error::Mismatch {
                        rank,
                        ours,
                        peer,
                        theirs,
                        ..
                    }) => {
                        assert!(
                            ours.contains(mine) && theirs.contains(other),
                            "{placement:?}, rank {r}: {ours} / {theirs}"
                        );
                        assert_eq!((rank, peer), (r, 1 - r), "{placement:?}");
                        let (send, recv) = if r == 0 {
                            (&ours, &theirs)
                        } else {
                            (&theirs, &ours)
                        };
                        assert!(send.contains("to rank 1") && recv.contains("from rank 0"));
                    }
                    other => panic!("{placement:?}, rank {r}: expected a mismatch, got {other:?}"),
                }
            }
        }
    }
}

#[test]
fn a_send_to_itself_or_out_of_range_is_invalid() {
    let w = world(2, Placement::Auto);
    let got = w
        .run(|c| -> Result<Vec<String>, Error> {
            let x = c.tensor(&[1.0f32])?;
            let mut errors = Vec::new();
            for peer in [c.rank(), 2] {
                for e in [c.send(&x, peer).err(), c.recv(&x, peer).err()] {
                    match e {
                        Some(Error::InvalidArgument { what, .. }) => errors.push(what),
                        other => errors.push(format!("not invalid: {other:?}")),
                    }
                }
            }
            Ok(errors)
        })
        .expect("run");
    for errors in got {
        let errors = errors.expect("rank");
        assert_eq!(errors.len(), 4);
        assert!(
            errors[..2].iter().all(|e| e.contains("itself")),
            "{errors:?}"
        );
        assert!(
            errors[2..].iter().all(|e| e.contains("not a rank")),
            "{errors:?}"
        );
    }
}

#[test]
fn an_unmatched_receive_times_out_with_a_flight_record_naming_the_peer() {
    for placement in PLACEMENTS {
        let cfg = WorldConfig::new(2)
            .with_placement(placement)
            .with_timeout(Duration::from_millis(500));
        let w = World::new(cfg).expect("world");
        let got = w
            .run(|c| -> Result<(), Error> {
                if c.rank() == 1 {
                    let _ = c.recv(&c.zeros(DType::F32, 4)?, 0)?.wait()?;
                } else {
                    std::thread::sleep(Duration::from_secs(2));
                }
                Ok(())
            })
            .expect("run");
        match &got[1] {
            Err(Error::Timeout { what, flight, .. }) => {
                assert!(what.contains("rank 0"), "{placement:?}: {what}");
                assert!(flight.contains("recv"), "{placement:?}: {flight}");
            }
            other => panic!("{placement:?}: expected a timeout, got {other:?}"),
        }
    }
}

#[test]
fn a_dead_peer_fails_the_receiver() {
    for placement in PLACEMENTS {
        let cfg = WorldConfig::new(2)
            .with_placement(placement)
            .with_timeout(Duration::from_secs(60));
        let w = World::new(cfg).expect("world");
        let got = w
            .run(|c| -> Result<(), Error> {
                if c.rank() == 0 {
                    return Err(Error::InvalidArgument {
                        rank: Some(0),
                        what: "this rank gives up".into(),
                    });
                }
                let _ = c.recv(&c.zeros(DType::F32, 4)?, 0)?.wait()?;
                Ok(())
            })
            .expect("run");
        match &got[1] {
            Err(Error::PeerFailed { peer, .. }) => assert_eq!(*peer, 0, "{placement:?}"),
            other => panic!("{placement:?}: expected PeerFailed, got {other:?}"),
        }
    }
}
