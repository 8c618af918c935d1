//! Prints traced graphs before and after the passes: one layer's DDP
//! backward (two gradient all-reduces), and a two-layer FSDP step (each
//! layer's weight shards gathered before its forward, its gradient
//! reduce-scattered after its backward).
//! `cargo run --release --example schedule`

use wgpu_collectives::graph::passes::{
    DEFAULT_BUCKET_BYTES, GraphCost, bucket_all_reduces, bucket_by_cost, dce, reorder_for_overlap,
    sink_waits,
};
use wgpu_collectives::graph::{Graph, Tracer, verify};
use wgpu_collectives::{CostModel, DType, ReduceOp};

fn main() -> Result<(), String> {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[256, 1024]);
    let w = t.input("w", DType::F32, &[1024, 1024]);
    let dy = t.input("dy", DType::F32, &[256, 1024]);
    let z = t.matmul(x, w, false, false);
    let dz = t.relu_grad(dy, z);
    let dw = t.matmul(x, dz, true, false);
    let dw = t.all_reduce(dw, ReduceOp::Avg);
    let db = t.sum_rows(dz);
    let db = t.all_reduce(db, ReduceOp::Avg);
    let dx = t.matmul(dz, w, false, true); // needs no collective: overlaps them
    let unused = t.scale(dx, 2.0);
    let _ = unused;
    let traced = t.finish(&[dx, dw, db]);
    verify(&traced)?;
    println!("traced:\n{}", traced.print());

    let cost = GraphCost {
        comm: CostModel {
            alpha: std::time::Duration::from_micros(80),
            beta: 1.5e9,
            dispatch: std::time::Duration::from_micros(50),
        },
        ranks: 4,
        flops: 5e10,
        bytes: 5e9,
    };
    let scheduled = bucket_all_reduces(
        reorder_for_overlap(sink_waits(dce(traced)), &cost),
        DEFAULT_BUCKET_BYTES,
    );
    verify(&scheduled)?;
    println!(
        "after dce, sink_waits, reorder_for_overlap, bucket_all_reduces:\n{}",
        scheduled.print()
    );

    let fsdp = fsdp_step();
    verify(&fsdp)?;
    println!("FSDP, traced:\n{}", fsdp.print());
    let scheduled = bucket_by_cost(
        reorder_for_overlap(sink_waits(dce(fsdp)), &cost),
        DEFAULT_BUCKET_BYTES,
        &cost,
    );
    verify(&scheduled)?;
    println!(
        "FSDP after dce, sink_waits, reorder_for_overlap, bucket_by_cost:\n{}",
        scheduled.print()
    );
    Ok(())
}

/// Two layers of 1024, four ranks: each holds a quarter of each weight.
fn fsdp_step() -> Graph {
    const H: usize = 1024;
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[256, H]);
    let dy = t.input("dy", DType::F32, &[256, H]);
    let shards = [
        t.input("w0", DType::F32, &[H / 4, H]),
        t.input("w1", DType::F32, &[H / 4, H]),
    ];
    let mut ws = Vec::new();
    let mut act = x;
    let mut acts = Vec::new();
    for s in shards {
        let w = t.all_gather(s, 4);
        ws.push(w);
        acts.push(act);
        act = t.matmul(act, w, false, false);
    }
    let mut dz = dy;
    let mut outs = Vec::new();
    for l in (0..2).rev() {
        let dw = t.matmul(acts[l], dz, true, false);
        outs.push(t.reduce_scatter(dw, ReduceOp::Avg, 4));
        dz = t.matmul(dz, ws[l], false, true);
    }
    outs.push(dz);
    outs.push(act); // the prediction
    t.finish(&outs)
}
