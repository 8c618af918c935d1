//! Prints a traced graph (one layer's backward with two gradient
//! all-reduces) before and after the passes.
//! `cargo run --release --example schedule`

use wgpu_collectives::graph::passes::{
    DEFAULT_BUCKET_BYTES, GraphCost, bucket_all_reduces, dce, reorder_for_overlap, sink_waits,
};
use wgpu_collectives::graph::{Tracer, verify};
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
    Ok(())
}
