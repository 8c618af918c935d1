//! Collectives as units: each one a module that says, in one place, what
//! ranks compare of it, which plans it offers, when the shared device's
//! steps can run it and what they are, and what each rank does under the
//! other plans. The progress thread, the shared-device meeting and the
//! planner ask the unit; adding a collective is a module here, a line in
//! [`Units`] and in the list of kinds (`fingerprint.rs`), and its public
//! calls.
//!
//! Collectives written before units still run from `progress.rs` and
//! `shared.rs` directly; they move here one by one.

pub(crate) mod all_gather_v;
pub(crate) mod broadcast;
pub(crate) mod gather;
pub(crate) mod reduce;
pub(crate) mod reduce_scatter_v;
pub(crate) mod scatter;

use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::fingerprint::Kind;
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// What ranks compare of a call besides its kind, dtype and operator: its
/// length, its root, and a hash of any list of lengths (0 for none).
pub(crate) struct Compared {
    pub len: Option<usize>,
    pub root: Option<usize>,
    pub shape: u64,
}

/// One collective, as a unit.
pub(crate) trait Unit {
    fn kind(&self) -> Kind;
    /// The element type of the tensors it moves.
    fn dtype(&self) -> DType;
    /// The reduction it applies, if it reduces.
    fn op(&self) -> Option<ReduceOp> {
        None
    }
    /// What every rank's call must agree on (with kind, dtype and op).
    fn compared(&self) -> Compared;
    /// The plans it offers, `Direct` first when it offers it.
    fn plans(&self) -> &'static [Plan];
    /// Whether `rank`'s call writes its outputs.
    fn writes_output(&self, _rank: usize) -> bool {
        true
    }
    /// Whether the shared device's steps can run the call of every rank
    /// (`ins[r]`, `outs[r]`: rank r's tensors), or why not.
    fn direct_feasible(
        &self,
        dev: &RankDevice,
        ins: &[&[Tensor]],
        outs: &[&[Tensor]],
    ) -> std::result::Result<(), String>;
    /// Records every rank's steps on the shared device (views every kernel
    /// can bind).
    fn direct_steps(
        &self,
        steps: &mut Steps<'_>,
        ins: &[Vec<Tensor>],
        outs: &[Vec<Tensor>],
    ) -> Result<()>;
    /// This rank's part under `plan` (any plan it offers but `Direct`),
    /// on views its steps can work on where they lie.
    fn run(
        &self,
        plan: Plan,
        p: &mut Prims<'_>,
        dev: &Arc<RankDevice>,
        ins: &[Tensor],
        outs: &[Tensor],
    ) -> Result<()>;
}

/// The collectives that are units: the one list the rest of the engine
/// reaches them through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Units {
    Broadcast(broadcast::Broadcast),
    AllGatherV(all_gather_v::AllGatherV),
    ReduceScatterV(reduce_scatter_v::ReduceScatterV),
    Reduce(reduce::Reduce),
    Gather(gather::Gather),
    Scatter(scatter::Scatter),
}

impl Units {
    /// The unit itself.
    pub(crate) fn unit(&self) -> &dyn Unit {
        match self {
            Units::Broadcast(u) => u,
            Units::AllGatherV(u) => u,
            Units::ReduceScatterV(u) => u,
            Units::Reduce(u) => u,
            Units::Gather(u) => u,
            Units::Scatter(u) => u,
        }
    }
}

/// Byte offsets of consecutive pieces of `counts` elements of `size`
/// bytes each, and their total: (offsets, total).
#[allow(
    clippy::arithmetic_side_effects,
    reason = "counts whose total was checked against a tensor's length when the call was made"
)]
pub(crate) fn offsets(counts: &[usize], size: usize) -> (Vec<usize>, usize) {
    let mut at = 0;
    let offs = counts
        .iter()
        .map(|c| {
            let o = at;
            at += c * size;
            o
        })
        .collect();
    (offs, at)
}

/// A call that reached its unit without its tensors (an internal error).
pub(crate) fn missing(rank: usize) -> Error {
    Error::device(
        rank,
        None,
        "a collective reached its steps without its tensors",
    )
}

/// A scratch buffer of `words` words from the device's pool.
pub(crate) fn scratch(dev: &Arc<RankDevice>, words: usize) -> Result<Tensor> {
    Tensor::output(dev, DType::U32, words)
}

/// `Ok` when the shared device's reduction kernel can bind the inputs of
/// `n` ranks in one pass, else why not.
pub(crate) fn reducible(dev: &RankDevice, n: usize) -> std::result::Result<(), String> {
    if Steps::can_reduce(dev, n) {
        Ok(())
    } else {
        Err(format!(
            "a reduction over {n} ranks binds more inputs than this adapter allows"
        ))
    }
}

/// The first tensor of every rank's list (the one a single-tensor
/// collective has).
pub(crate) fn firsts(ts: &[Vec<Tensor>]) -> Result<Vec<&Tensor>> {
    ts.iter()
        .enumerate()
        .map(|(r, t)| t.first().ok_or_else(|| missing(r)))
        .collect()
}

/// `Ok` when every rank's tensors hold whole 32-bit words (device copies
/// move nothing smaller), else why not.
pub(crate) fn whole_words(what: &str, ts: &[&[Tensor]]) -> std::result::Result<(), String> {
    if ts
        .iter()
        .flat_map(|t| t.iter())
        .all(|t| t.byte_len() % 4 == 0)
    {
        Ok(())
    } else {
        Err(format!(
            "{what} of 16-bit elements of odd length start mid-word, where a copy cannot"
        ))
    }
}
