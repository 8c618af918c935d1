//! What a collective is, in a form ranks can compare.
//!
//! Every packet carries its sender's fingerprint, so a rank that receives
//! data for a different collective (another kind, dtype, length, operator or
//! root) fails at once with both sides in the error, instead of reducing
//! the wrong bytes or waiting forever for a packet that will never come.

use crate::op::ReduceOp;
use crate::tensor::DType;

/// The kinds of collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
        }
    }
}

/// One collective call as every rank should see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    pub seq: u64,
    pub kind: Kind,
    pub dtype: DType,
    pub len: usize,
    pub op: Option<ReduceOp>,
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "#{} {}({}, len {}",
            self.seq,
            self.kind.name(),
            self.dtype,
            self.len
        )?;
        if let Some(op) = self.op {
            write!(f, ", {op}")?;
        }
        f.write_str(")")
    }
}
