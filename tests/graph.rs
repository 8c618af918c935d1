//! The traced-graph layer: schemas and effects, the printer, the tracer,
//! verify, and each pass (its output printed and checked in order, and
//! verified).

mod common;

use common::filecheck::check_order;
use wgpu_collectives::graph::passes::{
    DEFAULT_BUCKET_BYTES, bucket_all_reduces, dce, raise_comms, sink_waits,
};
use wgpu_collectives::graph::{Effect, Graph, Op, Tracer, effect, schema, verify};
use wgpu_collectives::{DType, ReduceOp};

fn checked(g: Graph) -> Graph {
    verify(&g).unwrap_or_else(|e| panic!("{e}\n{}", g.print()));
    g
}

fn expect(g: &Graph, lines: &[&str]) {
    check_order(&g.print(), lines).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn wait_tensor_mutates_and_collectives_are_ordered_effects() {
    assert_eq!(
        schema(&Op::WaitTensor),
        "_c10d_functional::wait_tensor(Tensor(a!) tensor) -> Tensor(a!)"
    );
    assert_eq!(effect(&Op::WaitTensor), Effect::Mutates);
    assert_eq!(effect(&Op::AllReduce(ReduceOp::Sum)), Effect::Collective);
    assert_eq!(
        effect(&Op::AllReduceCoalesced(ReduceOp::Sum)),
        Effect::Collective
    );
    assert_eq!(
        effect(&Op::Matmul {
            transpose_a: false,
            transpose_b: true
        }),
        Effect::Pure
    );
    assert!(schema(&Op::AllReduce(ReduceOp::Sum)).starts_with("_c10d_functional::all_reduce("));
}

#[test]
fn the_tracer_waits_right_after_each_collective() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[4, 8]);
    let w = t.input("w", DType::F32, &[8, 2]);
    let y = t.matmul(x, w, false, false);
    let r = t.all_reduce(y, ReduceOp::Sum);
    let g = checked(t.finish(&[r]));
    assert_eq!(
        g.print(),
        "%0 = input(\"x\")\n%1 = input(\"w\")\n%2 = matmul(%0, %1, transpose_a=false, transpose_b=false)\n\
         %3 = all_reduce(%2, \"sum\")\n%4 = wait_tensor(%3)\noutput(%4)\n"
    );
    assert_eq!(g.node(2).map(|n| n.shape.clone()), Some(vec![4, 2]));
}

/// all_reduce -> matmul -> wait_tensor -> matmul: independent compute
/// moves between the collective and its wait.
#[test]
fn sink_waits_moves_each_wait_to_its_first_user() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[4, 4]);
    let w = t.input("w", DType::F32, &[4, 4]);
    let a = t.matmul(x, w, false, false);
    let r = t.all_reduce(a, ReduceOp::Sum);
    let b = t.matmul(x, x, true, false);
    let c = t.matmul(r, b, false, false);
    let g = checked(t.finish(&[c]));
    expect(
        &g,
        &[
            "all_reduce(%2",
            "wait_tensor(%3)",
            "matmul(%0, %0",
            "matmul(%4",
        ],
    );
    let g = checked(sink_waits(g));
    expect(
        &g,
        &[
            "%3 = all_reduce(%2",
            "%5 = matmul(%0, %0",
            "%4 = wait_tensor(%3)",
            "%6 = matmul(%4, %5",
        ],
    );
}

#[test]
fn raise_comms_moves_a_collective_above_independent_compute() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[4, 4]);
    let a = t.relu(x);
    let b = t.matmul(x, x, false, true);
    let c = t.scale(b, 2.0);
    let r = t.all_reduce(a, ReduceOp::Max);
    let g = checked(t.finish(&[r, c]));
    expect(
        &g,
        &["= relu(%0)", "= matmul(", "= scale(", "= all_reduce(%1"],
    );
    let g = checked(raise_comms(g));
    expect(
        &g,
        &["= relu(%0)", "= all_reduce(%1", "= matmul(", "= scale("],
    );
}

#[test]
fn a_chain_of_dependent_collectives_keeps_its_order() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[2, 3]);
    let a = t.all_gather(x, 4);
    let b = t.all_gather(a, 4);
    let g = checked(t.finish(&[b]));
    assert_eq!(g.node(b).map(|n| n.shape.clone()), Some(vec![32, 3]));
    for g in [
        checked(sink_waits(g.clone())),
        checked(raise_comms(g.clone())),
        checked(raise_comms(sink_waits(g))),
    ] {
        expect(
            &g,
            &[
                "%1 = all_gather(%0)",
                "%2 = wait_tensor(%1)",
                "%3 = all_gather(%2)",
                "%4 = wait_tensor(%3)",
            ],
        );
    }
}

#[test]
fn dce_keeps_waits_and_collectives_whose_results_are_unused() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[8]);
    let unused = t.scale(x, 3.0);
    let _ = t.all_reduce(x, ReduceOp::Sum); // result used by nobody, on this rank
    let kept = t.relu(x);
    let g = checked(t.finish(&[kept]));
    let g = checked(dce(g));
    let text = g.print();
    assert!(
        !text.contains(&format!("%{unused} = scale")),
        "unused pure compute is dropped:\n{text}"
    );
    expect(&g, &["= all_reduce(%0", "= wait_tensor(", "= relu(%0)"]);
}

fn gradients(t: &mut Tracer, ops: &[ReduceOp], len: usize) -> Vec<usize> {
    let x = t.input("x", DType::F32, &[len]);
    ops.iter()
        .enumerate()
        .map(|(i, &op)| {
            let g = t.scale(x, i as f32 + 1.0);
            t.all_reduce(g, op)
        })
        .collect()
}

#[test]
fn bucketing_merges_only_adjacent_compatible_all_reduces() {
    let mut t = Tracer::new();
    let outs = gradients(
        &mut t,
        &[ReduceOp::Sum, ReduceOp::Sum, ReduceOp::Max, ReduceOp::Sum],
        1000,
    );
    let g = checked(sink_waits(t.finish(&outs)));
    let g = checked(bucket_all_reduces(g, DEFAULT_BUCKET_BYTES));
    let text = g.print();
    assert_eq!(text.matches("all_reduce_coalesced(").count(), 1, "{text}");
    assert_eq!(
        text.matches("= all_reduce(").count(),
        2,
        "the max and the last sum stay apart:\n{text}"
    );
    expect(
        &g,
        &[
            "= all_reduce_coalesced(%1, %4, \"sum\")",
            "= getitem(",
            "= getitem(",
            "= all_reduce(%7, \"max\")",
            "= all_reduce(%10, \"sum\")",
        ],
    );

    // A cap smaller than two tensors merges nothing.
    let mut t = Tracer::new();
    let outs = gradients(&mut t, &[ReduceOp::Sum, ReduceOp::Sum], 1000);
    let g = checked(bucket_all_reduces(sink_waits(t.finish(&outs)), 6000));
    assert!(!g.print().contains("coalesced"), "{}", g.print());
}

#[test]
fn bucketing_never_merges_across_a_dependency() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[100]);
    let a = t.all_reduce(x, ReduceOp::Sum);
    let b = t.all_reduce(a, ReduceOp::Sum); // needs a's result
    let g = checked(bucket_all_reduces(
        sink_waits(t.finish(&[b])),
        DEFAULT_BUCKET_BYTES,
    ));
    assert!(!g.print().contains("coalesced"), "{}", g.print());
}

#[test]
fn verify_names_the_nodes_that_break_an_invariant() {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[4]);
    let a = t.all_reduce(x, ReduceOp::Sum);
    let b = t.all_reduce(a, ReduceOp::Sum);
    let g = t.finish(&[b]);

    // A reader of a collective's result that skips the wait.
    let mut bad = g.clone();
    if let Some(n) = bad.nodes.iter_mut().find(|n| n.id == 3) {
        n.args = vec![1]; // the second all_reduce reads %1 (the first's result) directly
    }
    let e = verify(&bad).expect_err("reading without a wait");
    assert!(e.contains("%3") && e.contains("%1"), "{e}");

    // Collectives out of their traced order.
    let mut bad = g.clone();
    let (i, j) = (
        bad.nodes.iter().position(|n| n.id == 1).unwrap_or(0),
        bad.nodes.iter().position(|n| n.id == 3).unwrap_or(0),
    );
    bad.nodes.swap(i, j);
    assert!(verify(&bad).is_err());

    // A wait dropped (of a result nobody reads, so the order stays topological).
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[4]);
    let _ = t.all_reduce(x, ReduceOp::Sum);
    let mut bad = t.finish(&[x]);
    bad.nodes.retain(|n| n.op != Op::WaitTensor);
    let e = verify(&bad).expect_err("missing wait");
    assert!(e.contains("%1") && e.contains("0 wait_tensor"), "{e}");
}

fn cost() -> wgpu_collectives::graph::passes::GraphCost {
    common::graph_cost()
}

#[test]
fn reorder_for_overlap_covers_a_collective_with_independent_compute() {
    use wgpu_collectives::graph::passes::reorder_for_overlap;
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[64, 64]);
    let grad = t.matmul(x, x, false, false);
    let r = t.all_reduce(grad, ReduceOp::Sum);
    let a = t.matmul(x, x, true, false);
    let b = t.relu(a);
    let used = t.add(r, b);
    let g = checked(t.finish(&[used]));
    expect(
        &g,
        &[
            "= all_reduce(%1",
            "= wait_tensor(%2)",
            "= matmul(%0, %0, transpose_a=true",
            "= relu(",
            "= add(%3",
        ],
    );
    let once = checked(reorder_for_overlap(g.clone(), &cost()));
    expect(
        &once,
        &[
            "= all_reduce(%1",
            "= matmul(%0, %0, transpose_a=true",
            "= relu(",
            "= wait_tensor(%2)",
            "= add(%3",
        ],
    );
    assert_eq!(
        once,
        reorder_for_overlap(g, &cost()),
        "the same order every time (every rank)"
    );
}

#[test]
fn reorder_for_overlap_keeps_the_traced_order_of_collectives() {
    use wgpu_collectives::graph::passes::reorder_for_overlap;
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[32, 32]);
    let late = t.matmul(x, x, false, false);
    let first = t.all_reduce(late, ReduceOp::Sum); // traced first, ready late
    let second = t.all_reduce(x, ReduceOp::Max); // ready at once, traced second
    let g = checked(t.finish(&[first, second]));
    let g = checked(reorder_for_overlap(g, &cost()));
    expect(
        &g,
        &["= all_reduce(%1, \"sum\")", "= all_reduce(%0, \"max\")"],
    );
}
