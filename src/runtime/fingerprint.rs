//! What a collective is, in a form ranks can compare.
//!
//! Every collective starts with a handshake that carries its fingerprint,
//! and every packet carries it too, so a rank that issued a different
//! collective (another kind, dtype, length, operator, root or shape) fails
//! at once with both sides in the error, instead of reducing the wrong
//! bytes or waiting forever for a packet that will never come.

use crate::api::tensor::DType;
use crate::op::ReduceOp;

/// The kinds of collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    Barrier,
    AllReduceCoalesced,
    AllGatherCoalesced,
    ReduceScatterCoalesced,
    Split,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "all_reduce",
            Kind::AllGather => "all_gather",
            Kind::ReduceScatter => "reduce_scatter",
            Kind::Broadcast => "broadcast",
            Kind::Reduce => "reduce",
            Kind::AllToAll => "all_to_all",
            Kind::Barrier => "barrier",
            Kind::AllReduceCoalesced => "all_reduce_coalesced",
            Kind::AllGatherCoalesced => "all_gather_coalesced",
            Kind::ReduceScatterCoalesced => "reduce_scatter_coalesced",
            Kind::Split => "split",
        }
    }
}

/// One collective call as every rank should see it: derived from its
/// [`Collective`](crate::runtime::collective::Collective), small and `Copy` so that
/// every packet can carry it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint {
    pub seq: u64,
    pub kind: Kind,
    /// `None` for calls that move no tensor (barrier, split).
    pub dtype: Option<DType>,
    /// Elements per rank (the sum over tensors for coalesced calls);
    /// `None` where ranks' lengths differ (all_to_all) or there are none.
    pub len: Option<usize>,
    pub op: Option<ReduceOp>,
    pub root: Option<usize>,
    /// Hash of the tensor lengths of a coalesced call (0 otherwise).
    pub shape: u64,
}

impl Fingerprint {
    /// Bytes per rank, where every rank moves the same.
    pub(crate) fn bytes(&self) -> Option<usize> {
        self.len?.checked_mul(self.dtype?.size())
    }

    /// A hash of `lens` that two ranks agree on exactly when the lists are equal.
    pub(crate) fn shape_of(lens: &[usize]) -> u64 {
        // FNV-1a over the lengths and their count.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in std::iter::once(lens.len()).chain(lens.iter().copied()) {
            for b in (v as u64).to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        h
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{} {}(", self.seq, self.kind.name())?;
        let mut sep = "";
        if let Some(dtype) = self.dtype {
            write!(f, "{dtype}")?;
            sep = ", ";
        }
        if let Some(len) = self.len {
            write!(f, "{sep}len {len}")?;
            sep = ", ";
        }
        if let Some(op) = self.op {
            write!(f, "{sep}{op}")?;
            sep = ", ";
        }
        if let Some(root) = self.root {
            write!(f, "{sep}root {root}")?;
            sep = ", ";
        }
        if self.shape != 0 {
            write!(f, "{sep}shape {:016x}", self.shape)?;
        }
        f.write_str(")")
    }
}
