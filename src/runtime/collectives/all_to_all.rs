//! all_to_all: block j of rank r's input to rank j, where it lands at
//! the offset of the blocks from ranks before r. Counts differ between
//! ranks, so ranks compare them pair by pair (`Unit::pairs`), not in the
//! fingerprint. On a shared device, one device copy per block; otherwise
//! the pairwise exchange.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over counts whose totals were checked against the tensors' lengths when the call was made, and ranks below n <= MAX_RANKS"
)]

use crate::algo::direct::Steps;
use crate::algo::pairwise;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{
    Collective, Compared, Here, Layout, Seat, SplitTable, Unit, count_sum, missing, share,
};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// An all-to-all: `send[j]` elements to rank j, `recv[j]` from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AllToAll {
    pub dtype: DType,
    pub send: Vec<usize>,
    pub recv: Vec<usize>,
}

impl AllToAll {
    /// An all-to-all of `len` elements of `dtype` from `seat`, with the
    /// counts given, or even shares where none are (the length must then
    /// divide evenly); why not, when it cannot be.
    pub(crate) fn new(
        seat: Seat,
        dtype: DType,
        len: usize,
        send: Option<&[usize]>,
        recv: Option<&[usize]>,
    ) -> std::result::Result<AllToAll, String> {
        let even = || share(seat, len).map(|s| vec![s; seat.size]);
        let send = send.map_or_else(even, |c| Ok(c.to_vec()))?;
        // The sends are checked before the receives are made up.
        let sent = count_sum(seat, "send_counts", &send)?;
        if sent != len {
            return Err(format!(
                "send_counts {send:?} sum to {sent}, but the tensor has {len} elements"
            ));
        }
        Ok(AllToAll {
            dtype,
            send,
            recv: recv.map_or_else(even, |c| Ok(c.to_vec()))?,
        })
    }
}

impl Unit for AllToAll {
    fn dtype(&self) -> Option<DType> {
        Some(self.dtype)
    }

    fn compared(&self) -> Compared {
        Compared::nothing()
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        let me = seat.rank;
        let sent = count_sum(seat, "send_counts", &self.send)?;
        if sent != input {
            return Err(format!(
                "send_counts {:?} sum to {sent}, but the tensor has {input} elements",
                self.send
            ));
        }
        let len = count_sum(seat, "recv_counts", &self.recv)?;
        if self.send.get(me) != self.recv.get(me) {
            return Err(format!(
                "send_counts[{me}] = {:?} but recv_counts[{me}] = {:?}: what a rank sends \
                 itself is what it receives from itself",
                self.send.get(me),
                self.recv.get(me)
            ));
        }
        Ok(Layout::apart(len))
    }

    fn pairs(&self) -> Option<(&[usize], &[usize])> {
        Some((&self.send, &self.recv))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::Pairwise]
    }

    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        let size = self.dtype.size();
        let whole = calls
            .iter()
            .filter_map(|c| c.unit().pairs())
            .all(|(s, r)| s.iter().chain(r).all(|&c| (c * size) % 4 == 0));
        if whole {
            Ok(())
        } else {
            Err(
                "blocks of 16-bit elements of odd length start mid-word, where a copy cannot"
                    .into(),
            )
        }
    }

    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        calls: &[&Collective],
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        let size = self.dtype.size() as u64;
        for (r, call) in calls.iter().enumerate() {
            let Some((send, _)) = call.unit().pairs() else {
                continue;
            };
            let x = ins
                .get(r)
                .and_then(|x| x.first())
                .ok_or_else(|| missing(r))?;
            let mut from = 0u64;
            for (j, &count) in send.iter().enumerate() {
                let Some((_, recv)) = calls.get(j).and_then(|c| c.unit().pairs()) else {
                    continue;
                };
                let o = outs
                    .get(j)
                    .and_then(|o| o.first())
                    .ok_or_else(|| missing(j))?;
                let to: u64 = recv.iter().take(r).map(|&c| c as u64 * size).sum();
                let bytes = count as u64 * size;
                steps.copy(x.buffer(), from, o.buffer(), to, bytes);
                from += bytes;
            }
        }
        Ok(None)
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>> {
        let (Some(x), Some(out)) = (at.ins.first(), at.outs.first()) else {
            return Err(missing(p.rank()));
        };
        p.buf = x.buffer().clone();
        pairwise::all_to_all(
            p,
            self.dtype.size(),
            &self.send,
            &self.recv,
            x.used_bytes() as usize,
            out.buffer(),
            out.used_bytes() as usize,
        )?;
        Ok(None)
    }
}
