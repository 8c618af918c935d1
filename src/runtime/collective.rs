//! One description of a collective call, from which everything else about
//! it is derived: the fingerprint ranks compare (`fingerprint.rs`), the
//! flight record's line, the reductions it needs and the schedule the
//! progress thread runs.
//!
//! Each variant carries exactly what its call has: a barrier has no dtype,
//! an all_to_all has its counts (not a length), a split its color and key.

use crate::device::tensor::DType;
use crate::op::ReduceOp;
use crate::runtime::collectives::Units;
use crate::runtime::fingerprint::{Fingerprint, Kind};
use crate::runtime::plan::{self, Plan};

/// What `split` exchanges: every parent rank's (color, key), in parent rank order.
pub(crate) type SplitTable = Vec<(Option<u32>, usize)>;

/// One collective, as one rank called it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Collective {
    AllReduce {
        dtype: DType,
        len: usize,
        op: ReduceOp,
    },
    AllGather {
        dtype: DType,
        /// Elements each rank contributes.
        len: usize,
    },
    ReduceScatter {
        dtype: DType,
        /// Elements of the input (n times the output's).
        len: usize,
        op: ReduceOp,
    },
    /// Counts differ between ranks (what a sends b is what b receives from
    /// a), so they are checked hop by hop, not in the fingerprint.
    AllToAll {
        dtype: DType,
        send: Vec<usize>,
        recv: Vec<usize>,
    },
    Barrier,
    AllReduceCoalesced {
        dtype: DType,
        lens: Vec<usize>,
        op: ReduceOp,
    },
    AllGatherCoalesced {
        dtype: DType,
        lens: Vec<usize>,
    },
    ReduceScatterCoalesced {
        dtype: DType,
        lens: Vec<usize>,
        op: ReduceOp,
    },
    /// Color and key differ between ranks: they are what split exchanges.
    Split {
        color: Option<u32>,
        key: usize,
    },
    /// Point to point, paired by the (sender, receiver) pair's own
    /// sequence numbers.
    Send {
        dtype: DType,
        len: usize,
        peer: usize,
    },
    Recv {
        dtype: DType,
        len: usize,
        peer: usize,
    },
    /// A collective written as a unit (`runtime/collectives/`).
    Unit(Units),
}

impl Collective {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Collective::AllReduce { .. } => Kind::AllReduce,
            Collective::AllGather { .. } => Kind::AllGather,
            Collective::ReduceScatter { .. } => Kind::ReduceScatter,
            Collective::AllToAll { .. } => Kind::AllToAll,
            Collective::Barrier => Kind::Barrier,
            Collective::AllReduceCoalesced { .. } => Kind::AllReduceCoalesced,
            Collective::AllGatherCoalesced { .. } => Kind::AllGatherCoalesced,
            Collective::ReduceScatterCoalesced { .. } => Kind::ReduceScatterCoalesced,
            Collective::Split { .. } => Kind::Split,
            Collective::Send { .. } => Kind::Send,
            Collective::Recv { .. } => Kind::Recv,
            Collective::Unit(u) => u.unit().kind(),
        }
    }

    /// The element type of the tensors it moves.
    pub(crate) fn dtype(&self) -> Option<DType> {
        match self {
            Collective::AllReduce { dtype, .. }
            | Collective::AllGather { dtype, .. }
            | Collective::ReduceScatter { dtype, .. }
            | Collective::AllToAll { dtype, .. }
            | Collective::AllReduceCoalesced { dtype, .. }
            | Collective::AllGatherCoalesced { dtype, .. }
            | Collective::ReduceScatterCoalesced { dtype, .. }
            | Collective::Send { dtype, .. }
            | Collective::Recv { dtype, .. } => Some(*dtype),
            Collective::Unit(u) => Some(u.unit().dtype()),
            Collective::Barrier | Collective::Split { .. } => None,
        }
    }

    /// The reduction it applies.
    pub(crate) fn op(&self) -> Option<ReduceOp> {
        match self {
            Collective::AllReduce { op, .. }
            | Collective::ReduceScatter { op, .. }
            | Collective::AllReduceCoalesced { op, .. }
            | Collective::ReduceScatterCoalesced { op, .. } => Some(*op),
            Collective::Unit(u) => u.unit().op(),
            _ => None,
        }
    }

    /// Whether `rank`'s call writes its outputs (a gather's output is
    /// only written at the root).
    pub(crate) fn writes_output(&self, rank: usize) -> bool {
        match self {
            Collective::Unit(u) => u.unit().writes_output(rank),
            _ => true,
        }
    }

    /// The plans it offers, `Direct` first when it offers it.
    pub(crate) fn plans(&self) -> &'static [Plan] {
        match self {
            Collective::Unit(u) => u.unit().plans(),
            _ => plan::offered(self.kind()),
        }
    }

    /// The peer of a point-to-point call.
    pub(crate) fn peer(&self) -> Option<usize> {
        match self {
            Collective::Send { peer, .. } | Collective::Recv { peer, .. } => Some(*peer),
            _ => None,
        }
    }

    /// What every rank's call must agree on, for the `seq`-th collective
    /// (the `seq`-th call between its pair, for a point-to-point call).
    pub(crate) fn fingerprint(&self, seq: u64) -> Fingerprint {
        let (len, root, shape) = match self {
            Collective::AllReduce { len, .. }
            | Collective::AllGather { len, .. }
            | Collective::ReduceScatter { len, .. }
            | Collective::Send { len, .. }
            | Collective::Recv { len, .. } => (Some(*len), None, 0),
            Collective::AllReduceCoalesced { lens, .. }
            | Collective::AllGatherCoalesced { lens, .. }
            | Collective::ReduceScatterCoalesced { lens, .. } => (
                Some(lens.iter().fold(0usize, |a, &l| a.saturating_add(l))),
                None,
                Fingerprint::shape_of(lens),
            ),
            Collective::AllToAll { .. } | Collective::Barrier | Collective::Split { .. } => {
                (None, None, 0)
            }
            Collective::Unit(u) => {
                let c = u.unit().compared();
                (c.len, c.root, c.shape)
            }
        };
        Fingerprint {
            seq,
            kind: self.kind(),
            dtype: self.dtype(),
            len,
            op: self.op(),
            root,
            shape,
            peer: self.peer(),
        }
    }
}
