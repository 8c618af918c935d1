//! What a collective is, in a form ranks can compare.
//!
//! Every collective starts with a handshake that carries its fingerprint,
//! and every packet carries it too, so a rank that issued a different
//! collective (another kind, dtype, length, operator, root or shape) fails
//! at once with both sides in the error, instead of reducing the wrong
//! bytes or waiting forever for a packet that will never come.

use crate::device::tensor::DType;
use crate::op::ReduceOp;

/// Makes `Kind` from the list of collectives (`list.rs`): the enum, each
/// one's name, and the wire order (`Kind::ALL`).
macro_rules! kinds {
    ($($kind:ident($module:ident::$unit:ident) => $name:literal,)*) => {
        /// The kinds of collective.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub(crate) enum Kind {
            $(#[doc = $name] $kind,)*
        }

        impl Kind {
            /// Every kind, in the order of their wire codes.
            #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
            pub(crate) const ALL: &'static [Kind] = &[$(Kind::$kind,)*];

            pub(crate) fn name(self) -> &'static str {
                match self {
                    $(Kind::$kind => $name,)*
                }
            }
        }
    };
}

crate::runtime::list::collectives!(kinds);

impl Kind {
    /// Whether calls of this kind pair between two ranks (with the pair's
    /// own sequence numbers) rather than across the group.
    pub(crate) fn point_to_point(self) -> bool {
        matches!(self, Kind::Send | Kind::Recv)
    }
}

/// One collective call as every rank should see it: derived from its
/// [`Collective`](crate::runtime::collectives::Collective), small and `Copy` so that
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
    /// A send's receiver, a receive's sender.
    pub peer: Option<usize>,
}

/// What tells a call apart among a rank's calls: collectives by their
/// sequence number, point-to-point calls by theirs within (kind, peer).
pub(crate) type Key = (u64, Option<(Kind, usize)>);

impl Fingerprint {
    /// See [`Key`].
    pub(crate) fn key(&self) -> Key {
        let lane = match (self.kind.point_to_point(), self.peer) {
            (true, Some(peer)) => Some((self.kind, peer)),
            _ => None,
        };
        (self.seq, lane)
    }

    /// Whether a packet headed `theirs` belongs to this call: the same
    /// collective, or for a receive, the send it pairs with (the same
    /// pair sequence number, dtype and length, addressed to this rank).
    pub(crate) fn pairs_with(&self, theirs: &Fingerprint) -> bool {
        match self.kind {
            Kind::Recv => {
                theirs.kind == Kind::Send
                    && (self.seq, self.dtype, self.len) == (theirs.seq, theirs.dtype, theirs.len)
            }
            _ => self == theirs,
        }
    }

    /// Bytes per rank, where every rank moves the same.
    pub(crate) fn bytes(&self) -> Option<usize> {
        self.len?.checked_mul(self.dtype?.size())
    }

    /// A hash of `lens` that two ranks agree on exactly when the lists are equal.
    pub(crate) fn shape_of(lens: &[usize]) -> u64 {
        crate::hash::fnv1a(
            std::iter::once(lens.len())
                .chain(lens.iter().copied())
                .map(|v| v as u64),
        )
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
            sep = ", ";
        }
        match (self.kind, self.peer) {
            (Kind::Send, Some(peer)) => write!(f, "{sep}to rank {peer}")?,
            (Kind::Recv, Some(peer)) => write!(f, "{sep}from rank {peer}")?,
            _ => {}
        }
        f.write_str(")")
    }
}

/// On the wire between processes: each field little-endian, `None` as all
/// ones (no count, rank or code reaches it).
#[cfg(feature = "mpi")]
impl crate::transport::mpi::Header for Fingerprint {
    fn encode(&self, out: &mut [u8; crate::transport::mpi::hub::HEADER]) {
        let code = |i: Option<usize>| i.map_or(u8::MAX, |i| u8::try_from(i).unwrap_or(u8::MAX));
        let num = |v: Option<usize>| v.map_or(u64::MAX, |v| v as u64);
        let fields = [
            self.seq,
            num(self.len),
            num(self.root),
            self.shape,
            num(self.peer),
        ];
        for (slot, v) in out.chunks_exact_mut(8).zip(fields) {
            slot.copy_from_slice(&v.to_le_bytes());
        }
        let codes = [
            code(Kind::ALL.iter().position(|&k| k == self.kind)),
            code(
                self.dtype
                    .and_then(|d| DType::ALL.iter().position(|&x| x == d)),
            ),
            code(
                self.op
                    .and_then(|o| ReduceOp::ALL.iter().position(|&x| x == o)),
            ),
        ];
        if let Some(tail) = out.get_mut(40..43) {
            tail.copy_from_slice(&codes);
        }
    }

    fn decode(bytes: &[u8; crate::transport::mpi::hub::HEADER]) -> Option<Self> {
        let word = |i: usize| -> Option<u64> {
            let mut b = [0u8; 8];
            b.copy_from_slice(bytes.get(i.checked_mul(8)?..i.checked_mul(8)?.checked_add(8)?)?);
            Some(u64::from_le_bytes(b))
        };
        let num = |v: u64| (v != u64::MAX).then(|| usize::try_from(v).ok()).flatten();
        let code = |i: usize| {
            bytes
                .get(i)
                .copied()
                .filter(|&c| c != u8::MAX)
                .map(usize::from)
        };
        Some(Fingerprint {
            seq: word(0)?,
            len: num(word(1)?),
            root: num(word(2)?),
            shape: word(3)?,
            peer: num(word(4)?),
            kind: *Kind::ALL.get(code(40)?)?,
            dtype: match code(41) {
                None => None,
                Some(i) => Some(*DType::ALL.get(i)?),
            },
            op: match code(42) {
                None => None,
                Some(i) => Some(*ReduceOp::ALL.get(i)?),
            },
        })
    }
}

#[cfg(all(test, feature = "mpi"))]
#[allow(
    clippy::expect_used,
    reason = "a test: a failed expectation is a failed test"
)]
mod wire {
    use super::*;
    use crate::transport::mpi::Header;
    use crate::transport::mpi::hub::HEADER;

    /// Every field of every kind survives the wire, `None`s included, and
    /// bytes that are not a header are refused rather than misread.
    #[test]
    fn a_fingerprint_crosses_the_wire_unchanged() {
        let mut n = 0u64;
        for &kind in Kind::ALL {
            for dtype in std::iter::once(None).chain(DType::ALL.map(Some)) {
                for op in [None, Some(ReduceOp::Avg), Some(ReduceOp::BitXor)] {
                    n += 1;
                    let fp = Fingerprint {
                        seq: n * 0x1_0000_0001,
                        kind,
                        dtype,
                        len: (n % 3 != 0).then_some(n as usize * 7),
                        op,
                        root: (n % 2 == 0).then_some(3),
                        shape: n.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                        peer: (n % 5 == 0).then_some(62),
                    };
                    let mut wire = [0u8; HEADER];
                    fp.encode(&mut wire);
                    assert_eq!(Fingerprint::decode(&wire), Some(fp));
                }
            }
        }
        let mut junk = [0u8; HEADER];
        junk[40] = 200; // no such kind
        assert_eq!(Fingerprint::decode(&junk), None);
    }
}
