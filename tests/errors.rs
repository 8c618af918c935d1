//! Bad input gives a clear error, never a panic or a hang; a panicking rank
//! fails its peers instead of leaving them waiting.

mod common;

use std::time::{Duration, Instant};

use common::*;
use wgpu_collectives::{DType, Error, Placement, ReduceOp, World, WorldConfig};

#[test]
fn zero_or_too_many_ranks_is_an_error() {
    for n in [0, 65] {
        match World::new(WorldConfig::new(n)) {
            Err(Error::InvalidArgument { what, .. }) => {
                assert!(what.contains(&n.to_string()), "{what}")
            }
            other => panic!("{n} ranks: expected InvalidArgument, got {other:?}"),
        }
    }
}

#[test]
fn an_adapter_name_that_matches_nothing_says_how_to_get_one() {
    match World::new(WorldConfig::new(2).with_adapter_name("no such adapter 1234")) {
        Err(e @ Error::NoAdapter { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("mesa-vulkan-drivers"), "{msg}");
            assert!(msg.contains("no such adapter 1234"), "{msg}");
        }
        other => panic!("expected NoAdapter, got {other:?}"),
    }
}

#[test]
fn bitwise_op_on_a_float_is_an_error_and_leaves_the_input() {
    let w = world(2);
    let results = w
        .run(|c| {
            let x = c.tensor(&[1.5f32, 2.5, 3.5])?;
            let errs: Vec<Error> = [ReduceOp::BitAnd, ReduceOp::BitOr, ReduceOp::BitXor]
                .into_iter()
                .filter_map(|op| c.all_reduce_in_place(&x, op).err())
                .collect();
            Ok::<_, Error>((errs, x.to_vec::<f32>()?))
        })
        .expect("run");
    for r in results {
        let (errs, x) = r.expect("rank");
        assert_eq!(errs.len(), 3, "every bitwise op on f32 must fail");
        for e in errs {
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            assert!(e.to_string().contains("integer"), "{e}");
        }
        assert_eq!(x, vec![1.5, 2.5, 3.5]);
    }
}

#[test]
fn a_tensor_from_another_ranks_communicator_is_an_error() {
    // Under every placement: ranks that share a device still own their tensors.
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = World::new(WorldConfig::new(2).with_placement(placement)).expect("world");
        assert_eq!(w.placement(), placement);
        let (c0, c1) = (
            w.communicator(0).expect("rank 0"),
            w.communicator(1).expect("rank 1"),
        );
        let t = c0.tensor(&[1i32, 2, 3]).expect("tensor");
        match c1.all_reduce(&t, ReduceOp::Sum) {
            Err(Error::InvalidArgument { what, .. }) => {
                assert!(what.contains("rank 0"), "{placement}: {what}")
            }
            other => panic!("{placement}: expected InvalidArgument, got {other:?}"),
        }
        assert_eq!(t.to_vec::<i32>().expect("read"), vec![1, 2, 3]);
        // An eager graph op on two ranks' tensors, likewise.
        let (a, b) = (
            c0.tensor(&[1.0f32; 4]).expect("a"),
            c1.tensor(&[2.0f32; 4]).expect("b"),
        );
        match wgpu_collectives::graph::eager::add(&a, &b) {
            Err(Error::InvalidArgument { what, .. }) => {
                assert!(
                    what.contains("rank 0") && what.contains("rank 1"),
                    "{placement}: {what}"
                )
            }
            other => panic!("{placement}: expected InvalidArgument, got {other:?}"),
        }
    }
}

#[test]
fn reading_with_the_wrong_element_type_is_an_error() {
    let w = world(1);
    let c = w.communicator(0).expect("rank 0");
    let t = c.zeros(DType::BF16, 5).expect("zeros");
    match t.to_vec::<f32>() {
        Err(Error::InvalidArgument { what, .. }) => assert!(what.contains("bfloat16"), "{what}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert_eq!(
        t.to_vec::<half::bf16>().expect("read"),
        vec![half::bf16::ZERO; 5]
    );
}

#[test]
fn a_tensor_too_large_for_the_device_is_an_error() {
    let w = world(1);
    let c = w.communicator(0).expect("rank 0");
    let max = c.device().limits().max_buffer_size;
    match c.zeros(DType::F32, (max / 4 + 1024) as usize) {
        Err(Error::Device { what, .. }) => assert!(what.contains("max_buffer_size"), "{what}"),
        other => panic!("expected a Device error, got {other:?}"),
    }
}

#[test]
fn a_panicking_rank_fails_its_peers_and_the_world_runs_again() {
    let w = World::new(WorldConfig::new(3).with_timeout(Duration::from_secs(30))).expect("world");
    let start = Instant::now();
    let r = w.run(|c| {
        if c.rank() == 1 {
            panic!("rank 1 gives up");
        }
        let x = c.tensor(&[1.0f32; 1000])?;
        c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
    });
    match r {
        Err(Error::RankPanicked { rank: 1, message }) => {
            assert!(message.contains("gives up"), "{message}")
        }
        other => panic!("expected RankPanicked for rank 1, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "peers waited {:?}",
        start.elapsed()
    );

    let again = w
        .run(|c| -> Result<Vec<f32>, Error> {
            let x = c.tensor(&[c.rank() as f32 + 1.0; 10])?;
            c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()
        })
        .expect("second run");
    for r in again {
        assert_eq!(r.expect("rank"), vec![6.0; 10]);
    }
}

/// A mismatch on one rank of four: every rank's error says what it
/// issued itself, what the other side issued, and names a rank whose call
/// differs from its own, under both placements.
#[test]
fn a_mismatch_names_each_ranks_own_call_and_the_rank_that_differs() {
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        let w = World::new(
            WorldConfig::new(4)
                .with_placement(placement)
                .with_timeout(Duration::from_secs(30)),
        )
        .expect("a world");
        let r = w
            .run(|c| -> Result<(), Error> {
                let len = if c.rank() == 1 { 999 } else { 1000 };
                let x = c.tensor(&vec![1.0f32; len])?;
                c.all_reduce(&x, ReduceOp::Sum)?.wait().map(drop)
            })
            .expect("the run");
        let call = |len: usize| format!("#0 all_reduce(float, len {len}, sum)");
        for (rank, res) in r.into_iter().enumerate() {
            let e = res.expect_err("a mismatch");
            let text = e.to_string();
            let Error::Mismatch {
                rank: me,
                ours,
                peer,
                theirs,
                ..
            } = &e
            else {
                panic!("{placement:?} rank {rank}: {text}");
            };
            assert_eq!(*me, rank, "{placement:?}: {text}");
            let (mine, other) = if rank == 1 { (999, 1000) } else { (1000, 999) };
            assert_eq!(*ours, call(mine), "{placement:?} rank {rank}: {text}");
            assert_eq!(*theirs, call(other), "{placement:?} rank {rank}: {text}");
            if rank == 1 {
                assert_ne!(*peer, 1, "{placement:?}: {text}");
            } else {
                assert_eq!(*peer, 1, "{placement:?} rank {rank}: {text}");
            }
            assert!(
                text.starts_with(&format!(
                    "collective mismatch on rank {rank}, seq 0: this rank issued {}, but rank {peer} issued {}",
                    call(mine),
                    call(other)
                )),
                "{placement:?} rank {rank}: {text}"
            );
            assert!(text.contains("flight record"), "{text}");
        }
    }
}
