//! Building a graph from code shaped like eager code.
//!
//! Each collective is followed at once by its `wait_tensor`, and the value
//! handed back is the wait's: the safe baseline that passes then improve.

use super::ir::{Graph, Node, NodeId, Op};
use crate::DType;
use crate::ReduceOp;

/// Records ops into a graph; each method returns the new value's id.
#[derive(Debug, Default)]
pub struct Tracer {
    graph: Graph,
    collectives: u64,
    /// The process group collectives are traced on now.
    group: usize,
}

impl Tracer {
    /// An empty graph.
    pub fn new() -> Tracer {
        Tracer::default()
    }

    fn push(&mut self, op: Op, args: Vec<NodeId>, dtype: DType, shape: Vec<usize>) -> NodeId {
        let id = self.graph.nodes.len();
        let op_is_collective = op.is_collective();
        let seq = op_is_collective.then(|| {
            let seq = self.collectives;
            self.collectives = seq.wrapping_add(1);
            seq
        });
        self.graph.nodes.push(Node {
            id,
            op,
            args,
            dtype,
            shape,
            seq,
            group: if op_is_collective { self.group } else { 0 },
        });
        id
    }

    /// Traces the collectives that follow on process group `group` (an
    /// index into the communicators `execute_on` is given; 0, the default,
    /// is the first).
    pub fn group(&mut self, group: usize) -> &mut Tracer {
        self.group = group;
        self
    }

    fn shape(&self, id: NodeId) -> (DType, Vec<usize>) {
        self.graph
            .node(id)
            .map_or((DType::F32, Vec::new()), |n| (n.dtype, n.shape.clone()))
    }

    /// A named input.
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> NodeId {
        self.push(Op::Input(name.into()), Vec::new(), dtype, shape.to_vec())
    }

    /// `a @ b`, either transposed first.
    pub fn matmul(&mut self, a: NodeId, b: NodeId, transpose_a: bool, transpose_b: bool) -> NodeId {
        let ((dtype, sa), (_, sb)) = (self.shape(a), self.shape(b));
        let rows = if transpose_a { sa.get(1) } else { sa.first() }
            .copied()
            .unwrap_or(0);
        let cols = if transpose_b { sb.first() } else { sb.get(1) }
            .copied()
            .unwrap_or(0);
        self.push(
            Op::Matmul {
                transpose_a,
                transpose_b,
            },
            vec![a, b],
            dtype,
            vec![rows, cols],
        )
    }

    fn elementwise(&mut self, op: Op, args: Vec<NodeId>) -> NodeId {
        let (dtype, shape) = self.shape(args[0]);
        self.push(op, args, dtype, shape)
    }

    /// `a + b`.
    pub fn add(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.elementwise(Op::Add, vec![a, b])
    }

    /// `a - b`.
    pub fn sub(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.elementwise(Op::Sub, vec![a, b])
    }

    /// `a * b`.
    pub fn mul(&mut self, a: NodeId, b: NodeId) -> NodeId {
        self.elementwise(Op::Mul, vec![a, b])
    }

    /// `a * factor`.
    pub fn scale(&mut self, a: NodeId, factor: f32) -> NodeId {
        self.elementwise(Op::Scale(factor), vec![a])
    }

    /// `max(a, 0)`.
    pub fn relu(&mut self, a: NodeId) -> NodeId {
        self.elementwise(Op::Relu, vec![a])
    }

    /// `grad` where `x > 0`, else 0.
    pub fn relu_grad(&mut self, grad: NodeId, x: NodeId) -> NodeId {
        self.elementwise(Op::ReluGrad, vec![grad, x])
    }

    /// Sum over rows: `[m, n]` -> `[n]`.
    pub fn sum_rows(&mut self, a: NodeId) -> NodeId {
        let (dtype, s) = self.shape(a);
        self.push(
            Op::SumRows,
            vec![a],
            dtype,
            vec![s.get(1).copied().unwrap_or(0)],
        )
    }

    /// `a` with another shape (same number of elements).
    pub fn reshape(&mut self, a: NodeId, shape: &[usize]) -> NodeId {
        let (dtype, _) = self.shape(a);
        self.push(Op::Reshape, vec![a], dtype, shape.to_vec())
    }

    /// 1-D concatenation.
    pub fn concat(&mut self, parts: &[NodeId]) -> NodeId {
        let dtype = self.shape(parts[0]).0;
        let len = parts
            .iter()
            .map(|&p| self.shape(p).1.iter().product::<usize>())
            .sum();
        self.push(Op::Concat, parts.to_vec(), dtype, vec![len])
    }

    /// Part `index` of `parts` equal parts of 1-D `a`.
    pub fn split(&mut self, a: NodeId, parts: usize, index: usize) -> NodeId {
        let (dtype, s) = self.shape(a);
        let len = s
            .iter()
            .fold(1usize, |a, &d| a.saturating_mul(d))
            .checked_div(parts)
            .unwrap_or(0);
        self.push(Op::Split { parts, index }, vec![a], dtype, vec![len])
    }

    fn collective(&mut self, op: Op, args: Vec<NodeId>, dtype: DType, shape: Vec<usize>) -> NodeId {
        let c = self.push(op, args, dtype, shape.clone());
        self.push(Op::WaitTensor, vec![c], dtype, shape)
    }

    /// all_reduce, waited on at once; returns the wait's value.
    pub fn all_reduce(&mut self, a: NodeId, op: ReduceOp) -> NodeId {
        let (dtype, shape) = self.shape(a);
        self.collective(Op::AllReduce(op), vec![a], dtype, shape)
    }

    /// all_gather over `ranks` ranks (rank-major along the first dimension).
    pub fn all_gather(&mut self, a: NodeId, ranks: usize) -> NodeId {
        let (dtype, mut shape) = self.shape(a);
        if let Some(d) = shape.first_mut() {
            *d = d.saturating_mul(ranks);
        }
        self.collective(Op::AllGather, vec![a], dtype, shape)
    }

    /// reduce_scatter over `ranks` ranks (the first dimension split).
    pub fn reduce_scatter(&mut self, a: NodeId, op: ReduceOp, ranks: usize) -> NodeId {
        let (dtype, mut shape) = self.shape(a);
        if let Some(d) = shape.first_mut() {
            *d = d.checked_div(ranks).unwrap_or(0);
        }
        self.collective(Op::ReduceScatter(op), vec![a], dtype, shape)
    }

    /// broadcast from `root`.
    pub fn broadcast(&mut self, a: NodeId, root: usize) -> NodeId {
        let (dtype, shape) = self.shape(a);
        self.collective(Op::Broadcast(root), vec![a], dtype, shape)
    }

    /// all_to_all with equal splits.
    pub fn all_to_all(&mut self, a: NodeId) -> NodeId {
        let (dtype, shape) = self.shape(a);
        self.collective(Op::AllToAll, vec![a], dtype, shape)
    }

    /// all_to_all with this rank's counts (`send[j]` elements to rank j,
    /// `recv[j]` from it); the result has `sum(recv)` elements.
    pub fn all_to_all_uneven(&mut self, a: NodeId, send: &[usize], recv: &[usize]) -> NodeId {
        let (dtype, _) = self.shape(a);
        let len = recv.iter().fold(0usize, |s, &c| s.saturating_add(c));
        let op = Op::AllToAllV {
            send: send.to_vec(),
            recv: recv.to_vec(),
        };
        self.collective(op, vec![a], dtype, vec![len])
    }

    /// reduce to `root` (elsewhere the rank's partial result).
    pub fn reduce(&mut self, a: NodeId, op: ReduceOp, root: usize) -> NodeId {
        let (dtype, shape) = self.shape(a);
        self.collective(Op::Reduce(op, root), vec![a], dtype, shape)
    }

    /// In-place all_reduce (`all_reduce_`): `a` is reduced where it lies;
    /// use the returned value, never `a`, afterwards.
    pub fn all_reduce_(&mut self, a: NodeId, op: ReduceOp) -> NodeId {
        let (dtype, shape) = self.shape(a);
        self.collective(Op::AllReduceInPlace(op), vec![a], dtype, shape)
    }

    /// The graph's outputs; returns the finished graph.
    pub fn finish(mut self, outputs: &[NodeId]) -> Graph {
        self.push(Op::Output, outputs.to_vec(), DType::F32, Vec::new());
        self.graph
    }
}
