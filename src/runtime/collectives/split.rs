//! split: every rank's (color, key), exchanged so that each rank can
//! form its new group (`runtime/split.rs`). Colors and keys differ
//! between ranks: they are what the call exchanges, not what ranks
//! compare. On a shared device the meeting hands every rank's to the
//! last; otherwise they travel round the ring.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "ranks below n <= MAX_RANKS, and offsets within a 24-byte record"
)]

use crate::algo::direct::Steps;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{Collective, Compared, Here, Layout, Seat, Unit};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

pub(crate) use crate::runtime::work_state::SplitTable;

/// A split: this rank's color (`None`: no new group) and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Split {
    pub color: Option<u32>,
    pub key: usize,
}

impl Unit for Split {
    fn dtype(&self) -> Option<DType> {
        None
    }

    fn compared(&self) -> Compared {
        Compared::nothing()
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        let _ = (seat, input);
        Ok(Layout::apart(0))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
    }

    fn direct_steps(
        &self,
        _steps: &mut Steps<'_>,
        calls: &[&Collective],
        _ins: &[Vec<Tensor>],
        _outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        Ok(Some(
            calls
                .iter()
                .map(|c| match c {
                    Collective::Split(s) => (s.color, s.key),
                    _ => (None, 0),
                })
                .collect(),
        ))
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, _at: &Here<'_>) -> Result<Option<SplitTable>> {
        table(p, self.color, self.key).map(Some)
    }
}

/// Every rank's (color, key), gathered around the ring on the host.
fn table(p: &mut Prims, color: Option<u32>, key: usize) -> Result<SplitTable> {
    let (n, r) = (p.nranks, p.rank());
    let encode = |rank: usize, color: Option<u32>, key: usize| {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(&(rank as u64).to_le_bytes());
        v.extend_from_slice(&color.map_or(u64::MAX, u64::from).to_le_bytes());
        v.extend_from_slice(&(key as u64).to_le_bytes());
        v
    };
    let word = |d: &[u8], i: usize| {
        u64::from_le_bytes(
            d.get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 8]),
        )
    };
    let mut table = vec![(None, 0); n];
    if let Some(mine) = table.get_mut(r) {
        *mine = (color, key);
    }
    let mut carry = encode(r, color, key);
    for _ in 1..n {
        p.post((r + 1) % n, carry)?;
        let d = p.take((r + n - 1) % n, 24)?;
        let (rank, c, k) = (word(&d, 0) as usize, word(&d, 1), word(&d, 2) as usize);
        if let Some(slot) = table.get_mut(rank) {
            *slot = (u32::try_from(c).ok(), k);
        }
        carry = d;
    }
    p.recycle(carry);
    Ok(table)
}
