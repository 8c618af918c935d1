//! Reduction operators.

use crate::device::tensor::DType;

/// How a collective combines the ranks' values, as `torch.distributed.ReduceOp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (truncating for integers).
    Avg,
    /// Bitwise and (integer dtypes only).
    BitAnd,
    /// Bitwise or (integer dtypes only).
    BitOr,
    /// Bitwise xor (integer dtypes only).
    BitXor,
}

impl ReduceOp {
    /// Every operator, in a fixed order.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
    ];

    /// The name nccl-tests prints (`sum`, `prod`, `min`, `max`, `avg`, `band`, `bor`, `bxor`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
        }
    }

    /// Whether the operator is defined on `dtype` (bitwise ones need integers).
    pub fn supports(self, dtype: DType) -> bool {
        !self.is_bitwise() || dtype.is_integer()
    }

    fn is_bitwise(self) -> bool {
        matches!(self, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor)
    }

    /// The `OP` override constant of `shaders/reduce.wgsl`; `Avg` reduces as a sum.
    pub(crate) fn shader_code(self) -> u32 {
        match self {
            ReduceOp::Sum | ReduceOp::Avg => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::BitAnd => 4,
            ReduceOp::BitOr => 5,
            ReduceOp::BitXor => 6,
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
