//! Executing traced graphs on ranks: values against a CPU reference, the
//! same bits whatever the schedule, a collective only one rank uses, and
//! the timeline as Chrome trace JSON.

mod common;

use common::*;
use wgpu_collectives::graph::passes::{
    DEFAULT_BUCKET_BYTES, bucket_all_reduces, dce, raise_comms, sink_waits,
};
use wgpu_collectives::graph::{Graph, Lane, Tracer, chrome_trace, execute, verify};
use wgpu_collectives::{Communicator, DType, Error, ReduceOp, Tensor};

const B: usize = 4; // batch rows per rank
const H: usize = 6; // width

/// Small integers: every product and sum below is exact in f32, so the
/// reference needs no tolerance whatever order a kernel sums in.
fn ints(seed: usize, rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (bits(rank, i, seed as u64) % 5) as f32 - 2.0)
        .collect()
}

/// One layer forward and backward with the weight gradient all-reduced,
/// and a second, independent gradient also all-reduced.
fn layer() -> Graph {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[B, H]);
    let w = t.input("w", DType::F32, &[H, H]);
    let dy = t.input("dy", DType::F32, &[B, H]);
    let z = t.matmul(x, w, false, false); // [B, H]
    let y = t.relu(z);
    let dz = t.relu_grad(dy, z);
    let dw = t.matmul(x, dz, true, false); // x^T dz: [H, H]
    let dw = t.all_reduce(dw, ReduceOp::Sum);
    let db = t.sum_rows(dz); // [H]
    let db = t.all_reduce(db, ReduceOp::Sum);
    let out = t.sum_rows(y);
    let flat = t.reshape(dw, &[H * H]);
    let both = t.concat(&[flat, db]);
    let first = t.split(both, 2, 0);
    let scaled = t.scale(out, 0.5);
    t.finish(&[dw, db, scaled, first])
}

fn mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, ta: bool) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        for c in 0..n {
            out[r * n + c] = (0..k)
                .map(|i| if ta { a[i * m + r] } else { a[r * k + i] } * b[i * n + c])
                .sum();
        }
    }
    out
}

fn reference(n: usize) -> Vec<Vec<f32>> {
    let w = ints(2, 0, H * H);
    let (mut dw, mut db) = (vec![0.0; H * H], vec![0.0; H]);
    let mut scaled = Vec::new();
    for r in 0..n {
        let (x, dy) = (ints(1, r, B * H), ints(3, r, B * H));
        let z = mm(&x, &w, B, H, H, false);
        let dz: Vec<f32> = dy
            .iter()
            .zip(&z)
            .map(|(&g, &v)| if v > 0.0 { g } else { 0.0 })
            .collect();
        for (acc, v) in dw.iter_mut().zip(mm(&x, &dz, H, B, H, true)) {
            *acc += v;
        }
        for (c, acc) in db.iter_mut().enumerate() {
            *acc += (0..B).map(|row| dz[row * H + c]).sum::<f32>();
        }
        if r == 0 {
            scaled = (0..H)
                .map(|c| (0..B).map(|row| z[row * H + c].max(0.0)).sum::<f32>() * 0.5)
                .collect();
        }
    }
    let both: Vec<f32> = dw.iter().chain(&db).copied().collect();
    let first = both[..both.len() / 2].to_vec();
    vec![dw, db, scaled, first]
}

fn inputs_for(c: &Communicator) -> Result<Vec<(&'static str, Tensor)>, Error> {
    Ok(vec![
        ("x", c.tensor(&ints(1, c.rank(), B * H))?),
        ("w", c.tensor(&ints(2, 0, H * H))?),
        ("dy", c.tensor(&ints(3, c.rank(), B * H))?),
    ])
}

fn run(w: &wgpu_collectives::World, g: &Graph) -> Vec<Vec<Vec<f32>>> {
    w.run(|c| -> Result<Vec<Vec<f32>>, Error> {
        let r = execute(g, c, &inputs_for(c)?, false)?;
        r.outputs.iter().map(|t| t.to_vec::<f32>()).collect()
    })
    .expect("run")
    .into_iter()
    .map(|r| r.expect("execute"))
    .collect()
}

#[test]
fn a_traced_layer_computes_what_the_cpu_does_on_every_rank() {
    let w = world(3);
    let g = layer();
    verify(&g).expect("traced graph");
    let got = run(&w, &g);
    let want = reference(3);
    for (rank, outs) in got.iter().enumerate() {
        assert_eq!(outs[0], want[0], "rank {rank}: all-reduced weight gradient");
        assert_eq!(outs[1], want[1], "rank {rank}: all-reduced bias gradient");
        assert_eq!(outs[3], want[3], "rank {rank}: concat then split");
    }
    assert_eq!(got[0][2], want[2], "rank 0: its own scaled output");
}

#[test]
fn traced_and_scheduled_graphs_give_the_same_bits() {
    let w = world(2);
    let traced = layer();
    let scheduled = bucket_all_reduces(
        raise_comms(sink_waits(dce(traced.clone()))),
        DEFAULT_BUCKET_BYTES,
    );
    verify(&scheduled).unwrap_or_else(|e| panic!("{e}\n{}", scheduled.print()));
    assert!(
        scheduled.print().contains("all_reduce_coalesced"),
        "{}",
        scheduled.print()
    );
    let (a, b) = (run(&w, &traced), run(&w, &scheduled));
    let bits = |v: &Vec<Vec<Vec<f32>>>| -> Vec<Vec<Vec<u32>>> {
        v.iter()
            .map(|r| {
                r.iter()
                    .map(|t| t.iter().map(|x| x.to_bits()).collect())
                    .collect()
            })
            .collect()
    };
    assert!(bits(&a) == bits(&b), "schedules differ");
}

/// Only rank 0 uses the all-reduce's result; DCE on each rank keeps the
/// collective anyway, so every rank runs it and nothing hangs.
#[test]
fn a_collective_only_rank_0_uses_runs_on_every_rank() {
    let w = world(4);
    let got = w
        .run(|c| -> Result<Vec<f32>, Error> {
            let mut t = Tracer::new();
            let x = t.input("x", DType::F32, &[5]);
            let r = t.all_reduce(x, ReduceOp::Sum);
            let mine = t.scale(x, 2.0);
            let g = dce(t.finish(&[if c.rank() == 0 { r } else { mine }]));
            verify(&g).map_err(|e| Error::InvalidArgument {
                rank: Some(c.rank()),
                what: e,
            })?;
            let x = c.tensor(&[c.rank() as f32 + 1.0; 5])?;
            execute(&g, c, &[("x", x)], false)?.outputs[0].to_vec::<f32>()
        })
        .expect("run");
    for (rank, r) in got.into_iter().enumerate() {
        let want = if rank == 0 {
            10.0
        } else {
            2.0 * (rank as f32 + 1.0)
        };
        assert_eq!(r.expect("rank"), vec![want; 5], "rank {rank}");
    }
}

#[test]
fn the_timeline_is_chrome_trace_json_with_compute_and_comm() {
    let w = world(2);
    let g = sink_waits(layer());
    let runs = w
        .run(|c| -> Result<_, Error> {
            Ok((c.rank(), execute(&g, c, &inputs_for(c)?, true)?.timeline))
        })
        .expect("run")
        .into_iter()
        .map(|r| r.expect("execute"))
        .collect::<Vec<_>>();
    for (rank, events) in &runs {
        assert!(
            events
                .iter()
                .any(|e| e.lane == Lane::Comm && e.name.contains("all_reduce")),
            "rank {rank}: {events:?}"
        );
        assert!(
            events
                .iter()
                .any(|e| e.lane == Lane::Compute && e.name.contains("matmul")),
            "rank {rank}: {events:?}"
        );
        assert!(
            events.iter().all(|e| e.end_us >= e.start_us),
            "rank {rank}: {events:?}"
        );
    }
    let views: Vec<(usize, &[wgpu_collectives::graph::Event])> =
        runs.iter().map(|(r, e)| (*r, e.as_slice())).collect();
    let json: serde_json::Value = serde_json::from_str(&chrome_trace(&views)).expect("valid JSON");
    let events = json["traceEvents"].as_array().expect("traceEvents");
    assert!(events.iter().all(|e| e["ph"] == "X"));
    assert!(
        events.iter().any(|e| e["pid"] == 1 && e["tid"] == 1),
        "rank 1's comm lane"
    );
}

/// The same layer run eagerly, with the all-reduces' values passed straight
/// on as async tensors, gives the traced graph's bits.
#[test]
fn eager_with_async_tensors_gives_the_traced_bits() {
    use wgpu_collectives::graph::eager::{self, AsyncTensor};
    let w = world(2);
    let traced = run(&w, &layer());
    let eager = w
        .run(|c| -> Result<Vec<Vec<f32>>, Error> {
            let i = inputs_for(c)?;
            let (x, wt, dy) = (&i[0].1, &i[1].1, &i[2].1);
            let z = eager::matmul(x, wt, [B, H, H], false, false)?;
            let y = eager::relu(&z)?;
            let dz = eager::relu_grad(dy, &z)?;
            let dw = eager::matmul(x, &dz, [H, B, H], true, false)?;
            let dw = AsyncTensor::new(c.all_reduce(&dw, ReduceOp::Sum)?);
            assert_eq!(
                (dw.len(), dw.dtype(), dw.is_ready()),
                (H * H, DType::F32, false),
                "length and dtype do not wait"
            );
            let db = AsyncTensor::new(c.all_reduce(&eager::sum_rows(&dz, B, H)?, ReduceOp::Sum)?);
            let scaled = eager::scale(&eager::sum_rows(&y, B, H)?, 0.5)?;
            // The async values go straight into compute: the first read waits.
            let dw2 = eager::add(&dw, &dw)?;
            assert!(dw.is_ready());
            let halved = eager::scale(&dw2, 0.5)?;
            Ok(vec![
                halved.to_vec::<f32>()?,
                db.to_vec::<f32>()?,
                scaled.to_vec::<f32>()?,
            ])
        })
        .expect("run");
    for (rank, (t, e)) in traced.iter().zip(eager).enumerate() {
        let e = e.expect("eager");
        for k in 0..3 {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&t[k]), bits(&e[k]), "rank {rank}, output {k}");
        }
    }
}

#[test]
fn reorder_for_overlap_runs_and_gives_the_same_bits() {
    use wgpu_collectives::graph::passes::{GraphCost, reorder_for_overlap};
    let w = world(2);
    let cost = GraphCost {
        comm: w.cost_model(),
        ranks: 2,
        flops: 1e9,
        bytes: 1e9,
    };
    let scheduled = reorder_for_overlap(layer(), &cost);
    verify(&scheduled).unwrap_or_else(|e| panic!("{e}\n{}", scheduled.print()));
    assert!(run(&w, &layer()) == run(&w, &scheduled));
}

/// Every collective kind between compute: traced, scheduled by each pass
/// and by all of them, the same bits.
#[test]
fn a_graph_of_every_collective_gives_the_same_bits_in_every_schedule() {
    use wgpu_collectives::graph::passes::{GraphCost, reorder_for_overlap};
    let n = 4;
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[8, 4]);
    let a = t.matmul(x, x, true, false); // [4, 4]
    let g1 = t.all_gather(a, n); // [16, 4]
    let s = t.reduce_scatter(g1, ReduceOp::Sum, n); // [4, 4]
    let r = t.relu(x);
    let b = t.broadcast(r, 2);
    let flat = t.reshape(b, &[32]);
    let e = t.all_to_all(flat);
    let m = t.mul(s, a);
    let sum = t.sum_rows(m);
    let out = t.all_reduce(sum, ReduceOp::Max);
    let traced = t.finish(&[out, e, g1]);
    verify(&traced).expect("traced");
    let w = world(n);
    let cost = GraphCost {
        comm: w.cost_model(),
        ranks: n,
        flops: 1e9,
        bytes: 1e9,
    };
    let schedules = [
        traced.clone(),
        sink_waits(traced.clone()),
        raise_comms(traced.clone()),
        reorder_for_overlap(traced.clone(), &cost),
        bucket_all_reduces(
            raise_comms(sink_waits(dce(traced.clone()))),
            DEFAULT_BUCKET_BYTES,
        ),
    ];
    let results: Vec<_> = schedules
        .iter()
        .map(|g| {
            verify(g).unwrap_or_else(|e| panic!("{e}\n{}", g.print()));
            w.run(|c| -> Result<Vec<Vec<u32>>, Error> {
                let x = c.tensor(&ints(7, c.rank(), 32))?;
                let r = execute(g, c, &[("x", x)], false)?;
                r.outputs
                    .iter()
                    .map(|t| Ok(t.to_vec::<f32>()?.iter().map(|v| v.to_bits()).collect()))
                    .collect()
            })
            .expect("run")
            .into_iter()
            .map(|r| r.expect("execute"))
            .collect::<Vec<_>>()
        })
        .collect();
    for (k, r) in results.iter().enumerate().skip(1) {
        assert!(
            *r == results[0],
            "schedule {k} differs from the traced graph"
        );
    }
    // And the last output is the gathered matrices, rank-major.
    let a_of = |rank: usize| mm_t(&ints(7, rank, 32));
    let gathered: Vec<u32> = (0..n).flat_map(a_of).map(f32::to_bits).collect();
    assert_eq!(results[0][1][2], gathered, "all_gather of x^T x");
}

/// x^T x for x of [8, 4].
fn mm_t(x: &[f32]) -> Vec<f32> {
    mm(x, x, 4, 8, 4, true)
}
