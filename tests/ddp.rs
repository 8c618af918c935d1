//! Data-parallel training: every rank's parameters identical to the bit
//! after every step, the loss curve of N ranks that of one rank on the
//! whole batch, and the overlap schedule the same bits as the eager one.

mod common;

use common::world;
// The demo lives in the benchmark binary (it is not part of the library);
// it uses only the library's public API, so the test compiles it too.
#[allow(dead_code)]
#[path = "../src/bench/ddp_train.rs"]
mod ddp_train;

use ddp_train::{Mlp, Schedule, train};

const MODEL: Mlp = Mlp {
    layers: 3,
    hidden: 16,
    batch: 8,
    lr: 0.1,
    seed: 11,
    bucket_bytes: wgpu_collectives::graph::passes::DEFAULT_BUCKET_BYTES,
};

fn losses(runs: &[ddp_train::RankRun]) -> Vec<f32> {
    runs[0].steps.iter().map(|s| s.loss).collect()
}

#[test]
fn three_steps_on_2_and_4_ranks_keep_every_rank_identical() {
    for n in [2, 4] {
        let w = world(n);
        let runs = train(&w, &MODEL, 3, Schedule::Overlap, true).expect("train");
        for step in 0..3 {
            for (rank, r) in runs.iter().enumerate() {
                assert!(
                    r.weight_bits[step] == runs[0].weight_bits[step],
                    "{n} ranks, step {step}: rank {rank}'s weights differ from rank 0's"
                );
            }
        }
        let l = losses(&runs);
        assert!(
            l.iter().all(|v| v.is_finite()) && l[2] < l[0],
            "{n} ranks: the loss falls: {l:?}"
        );
    }
}

#[test]
fn n_ranks_follow_the_single_rank_full_batch_loss_curve() {
    let reference =
        losses(&train(&world(1), &MODEL, 20, Schedule::Eager, false).expect("one rank"));
    for n in [2, 4] {
        let curve =
            losses(&train(&world(n), &MODEL, 20, Schedule::Overlap, false).expect("n ranks"));
        for (step, (a, b)) in curve.iter().zip(&reference).enumerate() {
            assert!(
                ((a - b) / b).abs() <= 1e-4,
                "{n} ranks, step {step}: loss {a} vs {b} on one rank"
            );
        }
    }
}

#[test]
fn the_overlap_schedule_gives_the_eager_bits() {
    let w = world(2);
    let eager = train(&w, &MODEL, 3, Schedule::Eager, true).expect("eager");
    let overlap = train(&w, &MODEL, 3, Schedule::Overlap, true).expect("overlap");
    for rank in 0..2 {
        assert!(
            eager[rank].weight_bits == overlap[rank].weight_bits,
            "rank {rank}: weights differ between schedules"
        );
        let bits =
            |r: &ddp_train::RankRun| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&eager[rank]),
            bits(&overlap[rank]),
            "rank {rank}: losses differ between schedules"
        );
    }
}

#[test]
fn the_overlap_graph_verifies_and_buckets_gradients() {
    use wgpu_collectives::graph::passes::GraphCost;
    let w = world(2);
    let cost = GraphCost {
        comm: w.cost_model(),
        ranks: 2,
        flops: 1e10,
        bytes: 1e10,
    };
    let g = ddp_train::scheduled(
        MODEL.step_graph(2, false),
        Schedule::Overlap,
        &cost,
        MODEL.bucket_bytes,
    )
    .expect("verified");
    assert!(g.print().contains("all_reduce_coalesced"), "{}", g.print());
}

#[test]
fn fsdp_gives_the_ddp_losses_and_weights_bit_for_bit() {
    for n in [2, 4] {
        let w = world(n);
        let ddp = train(&w, &MODEL, 3, Schedule::Eager, true).expect("ddp");
        let fsdp = train(&w, &MODEL, 3, Schedule::Fsdp, true).expect("fsdp");
        let bits =
            |r: &ddp_train::RankRun| r.steps.iter().map(|s| s.loss.to_bits()).collect::<Vec<_>>();
        let (hh, k) = (MODEL.hidden * MODEL.hidden, MODEL.hidden * MODEL.hidden / n);
        for rank in 0..n {
            assert_eq!(
                bits(&ddp[rank]),
                bits(&fsdp[rank]),
                "{n} ranks, rank {rank}: losses differ"
            );
            // Each rank's shards are its slices of DDP's weights.
            for step in 0..3 {
                for l in 0..MODEL.layers {
                    let full = &ddp[rank].weight_bits[step][l * hh + rank * k..][..k];
                    let shard = &fsdp[rank].weight_bits[step][l * k..][..k];
                    assert!(
                        full == shard,
                        "{n} ranks, rank {rank}, step {step}, layer {l}"
                    );
                }
            }
        }
    }
}

/// FSDP's prefetch: the next layer's all_gather is issued before this
/// layer's forward matmul and waited for after it, so it overlaps it.
#[test]
fn fsdp_gathers_the_next_layer_during_this_layers_forward() {
    use wgpu_collectives::graph::Op;
    use wgpu_collectives::graph::passes::GraphCost;
    let model = Mlp {
        layers: 4,
        hidden: 512,
        batch: 64,
        ..MODEL
    };
    let cost = GraphCost {
        comm: wgpu_collectives::CostModel {
            alpha: std::time::Duration::from_micros(100),
            beta: 1e9,
            dispatch: std::time::Duration::from_micros(5),
        },
        ranks: 4,
        flops: 1e10,
        bytes: 1e10,
    };
    let g = ddp_train::scheduled(
        model.step_graph(4, true),
        Schedule::Fsdp,
        &cost,
        model.bucket_bytes,
    )
    .expect("verified");
    let pos = g.positions();
    let at = |id: usize| pos[&id];
    // Each layer's gather, its wait, and the forward matmul that reads it.
    let gathers: Vec<usize> = g
        .nodes
        .iter()
        .filter(|n| n.op == Op::AllGather)
        .map(|n| n.id)
        .collect();
    assert_eq!(gathers.len(), 4, "one gather per layer:\n{}", g.print());
    let wait_of = |c: usize| g.users(c)[0];
    let forward_of = |c: usize| {
        let reshape = g.users(wait_of(c))[0];
        g.users(reshape)
            .into_iter()
            .filter(|&u| {
                g.node(u).is_some_and(|n| {
                    matches!(
                        n.op,
                        Op::Matmul {
                            transpose_b: false,
                            ..
                        }
                    )
                })
            })
            .min_by_key(|&u| at(u))
            .expect("a forward matmul")
    };
    for l in 0..3 {
        let (this, next) = (gathers[l], gathers[l + 1]);
        assert!(
            at(next) < at(forward_of(this)) && at(forward_of(this)) < at(wait_of(next)),
            "layer {l}: the next gather is not overlapped with this forward:\n{}",
            g.print()
        );
    }
    // Gradients are reduce-scattered, one per layer.
    assert_eq!(
        g.nodes
            .iter()
            .filter(|n| matches!(n.op, Op::ReduceScatter(_)))
            .count(),
        4,
        "{}",
        g.print()
    );
}
