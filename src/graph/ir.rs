//! The graph: nodes in program order, each producing one value.
//!
//! Node ids are stable: passes reorder `nodes` and add or drop nodes, but
//! never renumber, so a printed graph before and after a pass can be
//! compared line by line.

use std::collections::HashMap;
use std::fmt::Write;

use crate::DType;
use crate::ReduceOp;

/// A node's id (printed `%id`).
pub type NodeId = usize;

/// What a node computes.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A graph input, by name.
    Input(String),
    /// The graph's outputs (its arguments); produces no value.
    Output,
    /// Matrix product of two 2-D tensors, either transposed first.
    Matmul {
        /// Transpose the first operand.
        transpose_a: bool,
        /// Transpose the second operand.
        transpose_b: bool,
    },
    /// Element-wise sum.
    Add,
    /// Element-wise difference.
    Sub,
    /// Element-wise product.
    Mul,
    /// Multiplication by a constant.
    Scale(f32),
    /// max(x, 0).
    Relu,
    /// `grad` where the forward input was positive, else 0 (args: grad, input).
    ReluGrad,
    /// Sum over rows: `[m, n]` -> `[n]`.
    SumRows,
    /// Concatenation of 1-D tensors.
    Concat,
    /// Part `index` of `parts` equal parts of a 1-D tensor.
    Split {
        /// Number of parts.
        parts: usize,
        /// Which part.
        index: usize,
    },
    /// The same elements with another shape.
    Reshape,
    /// Functional all_reduce: returns a new (async) tensor.
    AllReduce(ReduceOp),
    /// Functional all_gather.
    AllGather,
    /// Functional reduce_scatter.
    ReduceScatter(ReduceOp),
    /// Functional broadcast from a root.
    Broadcast(usize),
    /// Functional all_to_all with equal splits.
    AllToAll,
    /// Functional all_to_all with this rank's counts (they differ between
    /// ranks: what a sends b is what b receives from a).
    AllToAllV {
        /// Elements sent to each rank.
        send: Vec<usize>,
        /// Elements received from each rank.
        recv: Vec<usize>,
    },
    /// Functional reduce to a root (elsewhere the value is what
    /// `Communicator::reduce` leaves there, which no one should read).
    Reduce(ReduceOp, usize),
    /// In-place all_reduce: reduces its input where it lies and returns
    /// it; nothing else may read the input.
    AllReduceInPlace(ReduceOp),
    /// One all_reduce over several tensors; its results are `Item`s.
    AllReduceCoalesced(ReduceOp),
    /// One all_gather over several tensors (each gathered as alone); its
    /// results are `Item`s.
    AllGatherCoalesced,
    /// One reduce_scatter over several tensors; its results are `Item`s.
    ReduceScatterCoalesced(ReduceOp),
    /// Result `i` of a coalesced collective.
    Item(usize),
    /// Makes a collective's result ready; mutates (and returns) its input.
    WaitTensor,
}

impl Op {
    /// The op's name as printed.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input(_) => "input",
            Op::Output => "output",
            Op::Matmul { .. } => "matmul",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Scale(_) => "scale",
            Op::Relu => "relu",
            Op::ReluGrad => "relu_grad",
            Op::SumRows => "sum",
            Op::Concat => "concat",
            Op::Split { .. } => "split",
            Op::Reshape => "reshape",
            Op::AllReduce(_) => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter(_) => "reduce_scatter",
            Op::Broadcast(_) => "broadcast",
            Op::AllToAll | Op::AllToAllV { .. } => "all_to_all",
            Op::Reduce(..) => "reduce",
            Op::AllReduceInPlace(_) => "all_reduce_",
            Op::AllReduceCoalesced(_) => "all_reduce_coalesced",
            Op::AllGatherCoalesced => "all_gather_coalesced",
            Op::ReduceScatterCoalesced(_) => "reduce_scatter_coalesced",
            Op::Item(_) => "getitem",
            Op::WaitTensor => "wait_tensor",
        }
    }

    /// Whether the op is a collective (an ordered effect).
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            Op::AllReduce(_)
                | Op::AllGather
                | Op::ReduceScatter(_)
                | Op::Broadcast(_)
                | Op::AllToAll
                | Op::AllToAllV { .. }
                | Op::Reduce(..)
                | Op::AllReduceInPlace(_)
        ) || self.is_coalesced()
    }

    /// Whether the op is a collective over several tensors, whose results
    /// are read through `Item`s.
    pub fn is_coalesced(&self) -> bool {
        matches!(
            self,
            Op::AllReduceCoalesced(_) | Op::AllGatherCoalesced | Op::ReduceScatterCoalesced(_)
        )
    }

    fn attrs(&self) -> Option<String> {
        Some(match self {
            Op::Input(name) => format!("{name:?}"),
            Op::Matmul {
                transpose_a,
                transpose_b,
            } => format!("transpose_a={transpose_a}, transpose_b={transpose_b}"),
            Op::Scale(s) => format!("{s:?}"),
            Op::Split { parts, index } => format!("parts={parts}, index={index}"),
            Op::AllReduce(r)
            | Op::ReduceScatter(r)
            | Op::AllReduceCoalesced(r)
            | Op::ReduceScatterCoalesced(r)
            | Op::AllReduceInPlace(r) => format!("{:?}", r.name()),
            Op::Broadcast(root) => format!("root={root}"),
            Op::Reduce(r, root) => format!("{:?}, root={root}", r.name()),
            Op::AllToAllV { send, recv } => format!("send={send:?}, recv={recv:?}"),
            Op::Item(i) => i.to_string(),
            _ => return None,
        })
    }
}

/// One node: an op applied to earlier nodes' values.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Stable id.
    pub id: NodeId,
    /// What it computes.
    pub op: Op,
    /// Argument nodes, in order.
    pub args: Vec<NodeId>,
    /// Element type of the value.
    pub dtype: DType,
    /// Shape of the value.
    pub shape: Vec<usize>,
    /// For collectives: the order in which they were traced. Every rank
    /// traces the same program, so this order is the same everywhere and
    /// passes must keep it.
    pub seq: Option<u64>,
    /// For collectives: the process group it runs on, an index into the
    /// communicators the executor is given (0: the first, the whole group;
    /// others from `split`, say the rows and the columns of a grid).
    pub group: usize,
}

impl Node {
    /// Number of elements of the value.
    pub fn len(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Whether the value has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the value.
    pub fn bytes(&self) -> usize {
        self.len().saturating_mul(self.dtype.size())
    }
}

/// A graph: nodes in program order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Graph {
    /// The nodes, in the order they run.
    pub nodes: Vec<Node>,
    /// The passes that made it from the traced graph, in order (named in
    /// the error when ranks' scheduled graphs disagree).
    pub passes: Vec<String>,
}

impl Graph {
    /// The node with `id`.
    pub fn node(&self, id: NodeId) -> Option<&Node> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Each node's position in the current order.
    pub fn positions(&self) -> HashMap<NodeId, usize> {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id, i))
            .collect()
    }

    /// The nodes that take `id` as an argument, in order.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|n| n.args.contains(&id))
            .map(|n| n.id)
            .collect()
    }

    /// A fresh id.
    pub fn next_id(&self) -> NodeId {
        self.nodes
            .iter()
            .map(|n| n.id.saturating_add(1))
            .max()
            .unwrap_or(0)
    }

    /// `self` with `pass` added to its pipeline.
    pub(crate) fn after(mut self, pass: &str) -> Graph {
        self.passes.push(pass.to_string());
        self
    }

    /// The pass pipeline as the errors name it: `[dce, sink_waits]`.
    pub fn pipeline(&self) -> String {
        format!("[{}]", self.passes.join(", "))
    }

    /// The collectives, in the order they run.
    pub fn collectives(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.op.is_collective())
    }

    /// One stable line per node, e.g. `%4 = all_reduce(%3, "sum")`.
    pub fn print(&self) -> String {
        let mut s = String::new();
        for n in &self.nodes {
            let mut args: Vec<String> = n.args.iter().map(|a| format!("%{a}")).collect();
            if let Some(a) = n.op.attrs() {
                args.push(a);
            }
            if n.group != 0 {
                args.push(format!("group={}", n.group));
            }
            let call = format!("{}({})", n.op.name(), args.join(", "));
            let _ = match n.op {
                Op::Output => writeln!(s, "{call}"),
                _ => writeln!(s, "%{} = {call}", n.id),
            };
        }
        s
    }
}
