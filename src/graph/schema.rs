//! Each op's schema, in PyTorch's notation, and the effect passes must respect.
//!
//! The schema is the contract: `wait_tensor(Tensor(a!) self) -> Tensor(a!)`
//! says it mutates its input (makes it ready), so it is never dead code;
//! collectives are ordered effects, so every rank keeps them, in the same
//! order. A pass asks `effect`, never the op's name.

use super::ir::Op;

/// What running a node does besides producing its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Nothing: the node may be dropped if unused, and moved freely within
    /// its dependencies.
    Pure,
    /// Talks to the other ranks: never dropped, and collectives keep their
    /// relative order on every rank.
    Collective,
    /// Mutates its input (`wait_tensor` makes it ready): never dropped.
    Mutates,
    /// A graph input or the output: fixed.
    Boundary,
}

/// The effect of `op`.
pub fn effect(op: &Op) -> Effect {
    match op {
        Op::Input(_) | Op::Output => Effect::Boundary,
        Op::WaitTensor => Effect::Mutates,
        o if o.is_collective() => Effect::Collective,
        _ => Effect::Pure,
    }
}

/// The schema of `op`, in PyTorch's notation.
pub fn schema(op: &Op) -> &'static str {
    match op {
        Op::Input(_) => "input(str name) -> Tensor",
        Op::Output => "output(Tensor[] values) -> ()",
        Op::Matmul { .. } => {
            "matmul(Tensor self, Tensor other, bool transpose_a=False, bool transpose_b=False) -> Tensor"
        }
        Op::Add => "add(Tensor self, Tensor other) -> Tensor",
        Op::Sub => "sub(Tensor self, Tensor other) -> Tensor",
        Op::Mul => "mul(Tensor self, Tensor other) -> Tensor",
        Op::Scale(_) => "scale(Tensor self, float factor) -> Tensor",
        Op::Relu => "relu(Tensor self) -> Tensor",
        Op::ReluGrad => "relu_grad(Tensor grad, Tensor self) -> Tensor",
        Op::SumRows => "sum(Tensor self, int dim=0) -> Tensor",
        Op::Concat => "concat(Tensor[] tensors) -> Tensor",
        Op::Split { .. } => "split(Tensor self, int parts, int index) -> Tensor",
        Op::Reshape => "reshape(Tensor self, int[] shape) -> Tensor",
        Op::AllReduce(_) => {
            "_c10d_functional::all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor"
        }
        Op::AllGather => {
            "_c10d_functional::all_gather_into_tensor(Tensor input, int group_size, str group_name) -> Tensor"
        }
        Op::ReduceScatter(_) => {
            "_c10d_functional::reduce_scatter_tensor(Tensor input, str reduce_op, int group_size, str group_name) -> Tensor"
        }
        Op::Broadcast(_) => {
            "_c10d_functional::broadcast(Tensor input, int src, str group_name) -> Tensor"
        }
        Op::AllToAll => {
            "_c10d_functional::all_to_all_single(Tensor input, int[]? output_split_sizes, int[]? input_split_sizes, str group_name) -> Tensor"
        }
        Op::AllToAllV { .. } => {
            "_c10d_functional::all_to_all_single(Tensor input, int[]? output_split_sizes, int[]? input_split_sizes, str group_name) -> Tensor"
        }
        Op::Reduce(..) => "reduce(Tensor input, str reduce_op, int dst, str group_name) -> Tensor",
        Op::AllReduceInPlace(_) => {
            "_c10d_functional::all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> Tensor(a!)"
        }
        Op::AllReduceCoalesced(_) => {
            "_c10d_functional::all_reduce_coalesced(Tensor[] inputs, str reduce_op, str group_name) -> Tensor[]"
        }
        Op::AllGatherCoalesced => {
            "_c10d_functional::all_gather_into_tensor_coalesced(Tensor[] inputs, int group_size, str group_name) -> Tensor[]"
        }
        Op::ReduceScatterCoalesced(_) => {
            "_c10d_functional::reduce_scatter_tensor_coalesced(Tensor[] inputs, str reduce_op, int group_size, str group_name) -> Tensor[]"
        }
        Op::Item(_) => "getitem(Tensor[] self, int index) -> Tensor",
        Op::WaitTensor => "_c10d_functional::wait_tensor(Tensor(a!) tensor) -> Tensor(a!)",
    }
}
