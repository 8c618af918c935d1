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
        MODEL.step_graph(2),
        Schedule::Overlap,
        &cost,
        MODEL.bucket_bytes,
    )
    .expect("verified");
    assert!(g.print().contains("all_reduce_coalesced"), "{}", g.print());
}
