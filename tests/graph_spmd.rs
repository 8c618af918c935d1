//! Scheduling is SPMD-safe: passes decide alike on every rank, whatever
//! each rank reads of a result, and ranks whose graphs would issue
//! different collectives fail together before any of them is issued.
//! Plus overlap budgeted by cost: a collective gets the compute its time
//! needs, and the rest covers the next one.

mod common;

use common::world;
use wgpu_collectives::graph::passes::{
    DEFAULT_BUCKET_BYTES, bucket_all_reduces, dce, raise_comms, reorder_for_overlap, sink_waits,
};
use wgpu_collectives::graph::{Graph, Tracer, execute, verify};
use wgpu_collectives::{DType, Error, ReduceOp};

const LEN: usize = 256;

/// Two gradients all-reduced; with `log_norm`, the rank also reads the
/// first reduced gradient (to log its norm) before the second is issued.
fn two_gradients(log_norm: bool) -> Graph {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[LEN]);
    let g1 = t.scale(x, 1.0);
    let r1 = t.all_reduce(g1, ReduceOp::Sum);
    let mut outs = vec![r1];
    if log_norm {
        outs.push(t.mul(r1, r1));
    }
    let g2 = t.scale(x, 2.0);
    let r2 = t.all_reduce(g2, ReduceOp::Sum);
    outs.push(r2);
    t.finish(&outs)
}

fn pipeline(g: Graph) -> Graph {
    let g = bucket_all_reduces(raise_comms(sink_waits(dce(g))), DEFAULT_BUCKET_BYTES);
    verify(&g).unwrap_or_else(|e| panic!("{e}\n{}", g.print()));
    g
}

/// The collectives a graph issues, as printed lines without node ids.
fn collectives(g: &Graph) -> Vec<String> {
    g.collectives()
        .map(|n| {
            format!(
                "{} of {} tensors, {} elements",
                n.op.name(),
                n.args.len(),
                n.len()
            )
        })
        .collect()
}

#[test]
fn bucketing_decides_alike_whatever_a_rank_reads() {
    let (reader, other) = (
        pipeline(two_gradients(true)),
        pipeline(two_gradients(false)),
    );
    assert_eq!(
        collectives(&reader),
        collectives(&other),
        "\n{}\n{}",
        reader.print(),
        other.print()
    );
    assert_eq!(
        collectives(&reader),
        vec!["all_reduce_coalesced of 2 tensors, 512 elements"]
    );
    // The norm is read after the bucket's wait.
    let text = reader.print();
    let (wait, norm) = (
        text.find("wait_tensor").unwrap_or(0),
        text.find("mul(").unwrap_or(0),
    );
    assert!(wait < norm, "{text}");
}

#[test]
fn ranks_that_read_different_results_run_the_bucketed_graphs() {
    let w = world(2);
    let got = w
        .run(|c| -> Result<Vec<Vec<f32>>, Error> {
            let g = pipeline(two_gradients(c.rank() == 0));
            let x = c.tensor(&vec![c.rank() as f32 + 1.0; LEN])?;
            let run = execute(&g, c, &[("x", x)], false)?;
            run.outputs.iter().map(|t| t.to_vec::<f32>()).collect()
        })
        .expect("run");
    let rank0 = got[0].clone().expect("rank 0");
    let rank1 = got[1].clone().expect("rank 1");
    // Sum over ranks of (r + 1) is 3; times 1 and 2.
    assert_eq!(rank0, vec![vec![3.0; LEN], vec![9.0; LEN], vec![6.0; LEN]]);
    assert_eq!(rank1, vec![vec![3.0; LEN], vec![6.0; LEN]]);
}

#[test]
fn graphs_that_issue_different_collectives_fail_on_every_rank_before_any_runs() {
    let w = world(2);
    let got = w
        .run(|c| -> Result<(), Error> {
            let g = two_gradients(false);
            // Rank 0 buckets, rank 1 does not: a rank-dependent pipeline.
            let g = if c.rank() == 0 {
                pipeline(g)
            } else {
                sink_waits(dce(g))
            };
            let x = c.tensor(&[1.0f32; LEN])?;
            execute(&g, c, &[("x", x)], false).map(|_| ())
        })
        .expect("run");
    for (rank, r) in got.into_iter().enumerate() {
        match r {
            Err(Error::Mismatch {
                seq, ours, theirs, ..
            }) => {
                assert_eq!(seq, 0, "rank {rank}: the first differing collective");
                assert!(ours.contains("collective 0"), "rank {rank}: {ours}");
                assert!(
                    ours.contains("passes [dce, sink_waits"),
                    "rank {rank}: {ours}"
                );
                let (mine, peer) = if rank == 0 {
                    ("all_reduce_coalesced", "all_reduce(")
                } else {
                    ("all_reduce(", "all_reduce_coalesced")
                };
                assert!(
                    ours.contains(mine) && theirs.contains(peer),
                    "rank {rank}: {ours} / {theirs}"
                );
            }
            other => panic!("rank {rank}: expected a mismatch, got {other:?}"),
        }
    }
    // Only the agreement's own all_gathers ran: no all_reduce of the graph.
    let record = w.flight_record().to_string();
    assert!(!record.contains("all_reduce"), "{record}");
}

fn cost() -> wgpu_collectives::graph::passes::GraphCost {
    common::graph_cost()
}

/// All_reduce A, four independent 64x64 matmuls, all_reduce B of a value
/// computed from A's result: A gets the matmuls its estimated time needs
/// (two: about 0.62 ms against 0.52 ms each), B the other two.
#[test]
fn overlap_keeps_compute_for_a_dependent_second_collective() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[64, 64]);
    let a = t.all_reduce(x, ReduceOp::Sum);
    let ms: Vec<_> = (0..4).map(|_| t.matmul(x, x, false, false)).collect();
    let from_a = t.scale(a, 0.5);
    let b = t.all_reduce(from_a, ReduceOp::Sum);
    let mut outs = ms.clone();
    outs.push(b);
    let g = dce(t.finish(&outs));
    let g = reorder_for_overlap(g, &cost());
    verify(&g).unwrap_or_else(|e| panic!("{e}\n{}", g.print()));
    let ops: Vec<String> = g
        .nodes
        .iter()
        .filter(|n| !matches!(n.op.name(), "input" | "output"))
        .map(|n| n.op.name().to_string())
        .collect();
    assert_eq!(
        ops,
        [
            "all_reduce",
            "matmul",
            "matmul",
            "wait_tensor",
            "scale",
            "all_reduce",
            "matmul",
            "matmul",
            "wait_tensor"
        ],
        "\n{}",
        g.print()
    );
}

/// Bucketing by cost: two gradients made together merge; a third made
/// four matmuls later (2.1 ms under `cost`, more than the 0.6 ms of one
/// collective's fixed cost, 6 hops of 0.1 ms) is all-reduced on its own,
/// so the first two need not wait for it.
#[test]
fn bucketing_by_cost_keeps_gradients_made_far_apart_in_separate_buckets() {
    use wgpu_collectives::graph::passes::bucket_by_cost;
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[64, 64]);
    let g1 = t.scale(x, 1.0);
    let g2 = t.scale(x, 2.0);
    let r1 = t.all_reduce(g1, ReduceOp::Sum);
    let r2 = t.all_reduce(g2, ReduceOp::Sum);
    let mut late = x;
    for _ in 0..4 {
        late = t.matmul(late, x, false, false);
    }
    let r3 = t.all_reduce(late, ReduceOp::Sum);
    let g = sink_waits(dce(t.finish(&[r1, r2, r3])));
    let by_cost = bucket_by_cost(g.clone(), DEFAULT_BUCKET_BYTES, &cost());
    verify(&by_cost).unwrap_or_else(|e| panic!("{e}\n{}", by_cost.print()));
    assert_eq!(
        collectives(&by_cost),
        [
            "all_reduce_coalesced of 2 tensors, 8192 elements",
            "all_reduce of 1 tensors, 4096 elements"
        ],
        "\n{}",
        by_cost.print()
    );
    assert!(by_cost.pipeline().ends_with("bucket_by_cost]"));
    // By bytes alone, all three merge into one bucket issued last.
    let by_bytes = bucket_all_reduces(g, DEFAULT_BUCKET_BYTES);
    assert_eq!(
        collectives(&by_bytes),
        ["all_reduce_coalesced of 3 tensors, 12288 elements"]
    );
}

/// The graph ops FSDP and MoE need: bucketed all_gathers and
/// reduce_scatters, reduce, in-place all_reduce_ and an uneven
/// all_to_all, executed against what the CPU says, bucketed or not.
#[test]
fn fsdp_and_moe_ops_run_and_bucket_to_the_same_values() {
    const N: usize = 3;
    fn program(rank: usize) -> Graph {
        let mut t = Tracer::new();
        let x = t.input("x", DType::F32, &[6]);
        let g1 = t.all_gather(x, N);
        let g2 = t.all_gather(x, N);
        let s1 = t.reduce_scatter(g1, ReduceOp::Sum, N);
        let s2 = t.reduce_scatter(g2, ReduceOp::Sum, N);
        let s3 = t.reduce_scatter(g1, ReduceOp::Max, N);
        let red = t.reduce(x, ReduceOp::Sum, 1);
        let copy = t.scale(x, 1.0);
        let inplace = t.all_reduce_(copy, ReduceOp::Max);
        // Rank r sends r + 1 elements to each rank, so receives j + 1 from rank j.
        let send = vec![rank + 1; N];
        let recv: Vec<usize> = (0..N).map(|j| j + 1).collect();
        let part = t.split(x, 2, 0); // 3 elements
        let cat = t.concat(&vec![part; rank + 1]); // r + 1 elements for each of 3 ranks
        let a2a = t.all_to_all_uneven(cat, &send, &recv);
        t.finish(&[g1, g2, s1, s2, s3, red, inplace, a2a])
    }
    let x = |r: usize| -> Vec<f32> { (0..6).map(|i| (10 * r + i) as f32).collect() };
    let w = world(N);
    let scheduled = |r: usize| {
        let cost = cost();
        let g = bucket_all_reduces(sink_waits(dce(program(r))), DEFAULT_BUCKET_BYTES);
        let g2 = wgpu_collectives::graph::passes::bucket_by_cost(
            sink_waits(dce(program(r))),
            DEFAULT_BUCKET_BYTES,
            &cost,
        );
        (g, g2)
    };
    let text = scheduled(0).0.print();
    assert!(
        text.contains("all_gather_coalesced") && text.contains("reduce_scatter_coalesced"),
        "{text}"
    );
    let got = w
        .run(|c| -> Result<Vec<Vec<Vec<f32>>>, Error> {
            let r = c.rank();
            let (bucketed, by_cost) = scheduled(r);
            let mut all = Vec::new();
            for g in [program(r), bucketed, by_cost] {
                verify(&g).unwrap_or_else(|e| panic!("{e}\n{}", g.print()));
                let run = execute(&g, c, &[("x", c.tensor(&x(r))?)], false)?;
                all.push(
                    run.outputs
                        .iter()
                        .map(|t| t.to_vec::<f32>())
                        .collect::<Result<_, _>>()?,
                );
            }
            Ok(all)
        })
        .expect("run");
    let gathered: Vec<f32> = (0..N).flat_map(x).collect();
    for (r, runs) in got.into_iter().enumerate() {
        let runs = runs.expect("rank");
        let sum: Vec<f32> = (0..6 * N).map(|i| N as f32 * gathered[i]).collect();
        let chunk = |v: &[f32]| v[r * 6..(r + 1) * 6].to_vec();
        let max: Vec<f32> = gathered.clone();
        let reduced: Vec<f32> = (0..6).map(|i| (0..N).map(|j| x(j)[i]).sum()).collect();
        let most = x(N - 1);
        let a2a: Vec<f32> = (0..N)
            .flat_map(|j| {
                let cat: Vec<f32> = x(j)[..3].repeat(j + 1);
                cat[r * (j + 1)..(r + 1) * (j + 1)].to_vec()
            })
            .collect();
        for (i, outs) in runs.iter().enumerate() {
            assert_eq!(outs[0], gathered, "rank {r}, run {i}: all_gather");
            assert_eq!(outs[1], gathered, "rank {r}, run {i}: all_gather");
            assert_eq!(
                outs[2],
                chunk(&sum),
                "rank {r}, run {i}: reduce_scatter sum"
            );
            assert_eq!(
                outs[3],
                chunk(&sum),
                "rank {r}, run {i}: reduce_scatter sum"
            );
            assert_eq!(
                outs[4],
                chunk(&max),
                "rank {r}, run {i}: reduce_scatter max"
            );
            if r == 1 {
                assert_eq!(outs[5], reduced, "run {i}: reduce at the root");
            }
            assert_eq!(outs[6], most, "rank {r}, run {i}: all_reduce_ max");
            assert_eq!(outs[7], a2a, "rank {r}, run {i}: uneven all_to_all");
        }
    }
}

#[test]
fn verify_refuses_a_read_of_what_an_in_place_collective_overwrites() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[4]);
    let y = t.scale(x, 2.0);
    let r = t.all_reduce_(y, ReduceOp::Sum);
    let stale = t.add(y, r); // reads y after all_reduce_ overwrote it
    let e = verify(&t.finish(&[stale])).expect_err("a stale read");
    assert!(e.contains("overwrites"), "{e}");
}

/// Four layers, each gathering its weights (64 x 64 f32, 16 KiB) just
/// before use and dropping them after: one gathered weight live at a time.
fn gathered_layers() -> Graph {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[1, 64]);
    let outs: Vec<usize> = (0..4)
        .map(|l| {
            let shard = t.input(&format!("w{l}"), DType::F32, &[16, 64]);
            let w = t.all_gather(shard, 4);
            t.matmul(x, w, false, false)
        })
        .collect();
    t.finish(&outs)
}

#[test]
fn peak_memory_is_estimated_from_tensor_sizes() {
    use wgpu_collectives::graph::passes::peak_bytes;
    let g = gathered_layers();
    // As traced, one gathered weight (16 KiB) is live at a time; reordered
    // to prefetch every gather at once, all four are.
    let traced = peak_bytes(&g);
    let all_at_once = peak_bytes(&reorder_for_overlap(g.clone(), &cost()));
    assert!(
        all_at_once > traced + 2 * 16384,
        "prefetching every gather holds four weights: {all_at_once} vs {traced}"
    );
}

#[test]
fn reordering_within_a_bound_prefetches_only_what_fits() {
    use wgpu_collectives::graph::passes::{peak_bytes, reorder_for_overlap_within};
    let g = gathered_layers();
    let bound = peak_bytes(&g) + 16384; // room for one gather ahead
    let within = reorder_for_overlap_within(g.clone(), &cost(), bound);
    verify(&within).unwrap_or_else(|e| panic!("{e}\n{}", within.print()));
    assert!(peak_bytes(&within) <= bound, "{}", within.print());
    // One gather ahead: layer l + 1's gather is issued before layer l's matmul.
    let pos = within.positions();
    let gathers: Vec<usize> = within.collectives().map(|n| n.id).collect();
    let matmuls: Vec<usize> = within
        .nodes
        .iter()
        .filter(|n| n.op.name() == "matmul")
        .map(|n| n.id)
        .collect();
    for l in 0..3 {
        assert!(
            pos[&gathers[l + 1]] < pos[&matmuls[l]],
            "layer {l}: the next gather is not prefetched:\n{}",
            within.print()
        );
    }
    assert!(
        pos[&matmuls[0]] < pos[&gathers[2]],
        "more than one gather ahead:\n{}",
        within.print()
    );
    // A bound below the traced order's own peak keeps the graph as it was.
    let kept = reorder_for_overlap_within(g.clone(), &cost(), 0);
    assert_eq!(kept.nodes, g.nodes);
}

/// The cost model refit to measurements: collectives whose fixed part took
/// twice and per-byte part three times the estimate come out with twice
/// the latency and a third of the bandwidth, on every rank alike.
#[test]
fn a_refit_scales_the_model_to_what_ran_on_every_rank() {
    use std::time::Duration;
    use wgpu_collectives::graph::calibrate::{Calibration, Sample, What, refit};
    let base = cost();
    let sample = |node, fixed_us: u64, rest_us: u64| Sample {
        node,
        what: What::Collective,
        fixed: Duration::from_micros(fixed_us),
        predicted: Duration::from_micros(fixed_us + rest_us),
        measured: Duration::from_micros(2 * fixed_us + 3 * rest_us),
    };
    let samples = vec![
        sample(1, 600, 100),
        sample(2, 600, 2000),
        sample(3, 300, 50),
    ];
    let c = Calibration::of(&samples);
    let off = c.collectives.expect("collective samples");
    assert!(off > 0.5 && off < 2.0, "{off}");
    let w = world(2);
    let fits = w.run(|comm| refit(comm, &samples, &base)).expect("run");
    let fits: Vec<_> = fits.into_iter().map(|f| f.expect("refit")).collect();
    assert_eq!(fits[0], fits[1], "every rank gets the same figures");
    let f = fits[0];
    let ratio = f.comm.alpha.as_secs_f64() / base.comm.alpha.as_secs_f64();
    assert!((ratio - 2.0).abs() < 1e-3, "latency x{ratio}");
    let ratio = base.comm.beta / f.comm.beta;
    assert!((ratio - 3.0).abs() < 1e-3, "bandwidth / {ratio}");
    assert_eq!(
        (f.flops, f.bytes),
        (base.flops, base.bytes),
        "no compute samples"
    );
}

/// A run's timeline gives a sample for each compute op and for each
/// collective whose wait blocked (as every eager wait does).
#[test]
fn a_timeline_gives_samples_of_compute_and_blocked_collectives() {
    use wgpu_collectives::graph::calibrate::{What, samples};
    let w = world(2);
    let got = w
        .run(|c| -> Result<(usize, usize), Error> {
            let g = two_gradients(false);
            let run = execute(&g, c, &[("x", c.tensor(&[1.0f32; LEN])?)], true)?;
            let s = samples(&g, &run, &cost());
            let colls = s.iter().filter(|s| s.what == What::Collective).count();
            Ok((s.len() - colls, colls))
        })
        .expect("run");
    for r in got {
        let (compute, colls) = r.expect("rank");
        assert_eq!(compute, 2, "two scales");
        assert!(colls <= 2, "at most the two all_reduces");
    }
}

/// Process groups in graphs: on a 2 x 2 grid, a sum over each row then
/// over each column is the sum over all four ranks; adjacent all_reduces
/// on different groups are never bucketed together.
#[test]
fn collectives_run_on_the_process_groups_they_were_traced_on() {
    use wgpu_collectives::graph::execute_on;
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[8]);
    let rows = t.group(1).all_reduce(x, ReduceOp::Sum);
    let both = t.group(2).all_reduce(rows, ReduceOp::Sum);
    let also = t.group(2).all_reduce(x, ReduceOp::Sum);
    let all = t.group(0).all_reduce(x, ReduceOp::Sum);
    let g = pipeline(t.finish(&[both, all, also]));
    assert!(g.print().contains("group=1") && g.print().contains("group=2"));
    // The two on group 2 are bucketed; nothing across groups.
    assert_eq!(
        g.collectives()
            .map(|n| (n.op.name(), n.group))
            .collect::<Vec<_>>(),
        [
            ("all_reduce", 1),
            ("all_reduce_coalesced", 2),
            ("all_reduce", 0)
        ],
        "{}",
        g.print()
    );
    let w = world(4);
    let got = w
        .run(|c| -> Result<Vec<Vec<f32>>, Error> {
            let r = c.rank();
            let row = c.split(Some((r / 2) as u32), r)?.expect("a row");
            let col = c.split(Some((r % 2) as u32), r)?.expect("a column");
            let x = c.tensor(&[r as f32 + 1.0; 8])?;
            let run = execute_on(&g, &[c, &row, &col], &[("x", x)], false)?;
            run.outputs.iter().map(|t| t.to_vec::<f32>()).collect()
        })
        .expect("run");
    for (r, outs) in got.into_iter().enumerate() {
        let outs = outs.expect("rank");
        assert_eq!(outs[0], vec![10.0; 8], "rank {r}: rows then columns");
        assert_eq!(outs[1], vec![10.0; 8], "rank {r}: everyone");
        // The column of rank r: ranks r % 2 and r % 2 + 2.
        let col = (r % 2 + 1 + r % 2 + 3) as f32;
        assert_eq!(outs[2], vec![col; 8], "rank {r}: its column");
    }
}
