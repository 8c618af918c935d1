//! Races on the shared device: what interleaves there, repeated.

mod common;

use common::*;
use wgpu_collectives::graph::passes::{
    GraphCost, bucket_all_reduces, dce, reorder_for_overlap, sink_waits,
};
use wgpu_collectives::graph::{Graph, Tracer, execute, verify};
use wgpu_collectives::{Communicator, DType, Error, ReduceOp, Tensor, World};

fn ints(seed: usize, rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (bits(rank, i, seed as u64) % 5) as f32 - 2.0)
        .collect()
}

fn program(n: usize) -> Graph {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[6, 4]);
    let w = t.input("w", DType::F32, &[4, 4]);
    let y = t.input("y", DType::F32, &[12]);
    let h = t.matmul(x, w, false, false);
    let r = t.relu(h);
    let gw = t.matmul(x, r, true, false);
    let a1 = t.all_reduce(gw, ReduceOp::Sum);
    let gb = t.sum_rows(r);
    let a2 = t.all_reduce(gb, ReduceOp::Sum);
    let ys = t.scale(y, 2.0);
    let a3 = t.all_reduce(ys, ReduceOp::Max);
    let ag = t.all_gather(gb, n);
    let dx = t.matmul(r, w, false, true);
    let sum = t.add(ag, a3);
    t.finish(&[a1, a2, sum, dx])
}

fn inputs(c: &Communicator) -> Result<Vec<(&'static str, Tensor)>, Error> {
    Ok(vec![
        ("x", c.tensor(&ints(1, c.rank(), 24))?),
        ("w", c.tensor(&ints(2, 0, 16))?),
        ("y", c.tensor(&ints(3, c.rank(), 12))?),
    ])
}

fn run(w: &World, g: &Graph) -> Vec<Vec<Vec<f32>>> {
    w.run(|c| -> Result<Vec<Vec<f32>>, Error> {
        let r = execute(g, c, &inputs(c)?, false)?;
        r.outputs.iter().map(|t| t.to_vec::<f32>()).collect()
    })
    .expect("run")
    .into_iter()
    .map(|r| r.expect("execute"))
    .collect()
}

#[test]
fn issue_program_repeated() {
    let n = 3;
    let w = world(n);
    let traced = program(n);
    let cost = GraphCost {
        comm: w.cost_model(),
        ranks: n,
        flops: 1e9,
        bytes: 1e9,
    };
    let scheduled = bucket_all_reduces(
        reorder_for_overlap(sink_waits(dce(traced.clone())), &cost),
        80,
    );
    verify(&scheduled).expect("scheduled");
    eprintln!("{}", scheduled.print());
    let want = run(&w, &traced);
    for i in 0..100 {
        let got = run(&w, &scheduled);
        for rank in 0..n {
            for o in 0..4 {
                assert_eq!(
                    got[rank][o], want[rank][o],
                    "rep {i} rank {rank} output {o}"
                );
            }
        }
    }
}
