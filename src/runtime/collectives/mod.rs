//! Collectives as units: each one a module that says, in one place, what
//! ranks compare of it, which plans it offers, when the shared device's
//! steps can run it and what they are, and what each rank does under the
//! other plans. The progress thread, the shared-device meeting and the
//! planner ask the unit and know no collective by name; adding one is a
//! module here, a line in the list (`runtime/list.rs`) and its public
//! calls (`api/comm.rs`).

pub(crate) mod all_gather;
pub(crate) mod all_gather_v;
pub(crate) mod all_reduce;
pub(crate) mod all_to_all;
pub(crate) mod barrier;
pub(crate) mod broadcast;
pub(crate) mod gather;
pub(crate) mod reduce;
pub(crate) mod reduce_scatter;
pub(crate) mod reduce_scatter_v;
pub(crate) mod scatter;
pub(crate) mod send_recv;
pub(crate) mod split;

use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::device::RankDevice;
use crate::device::tensor::Tensor;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::fingerprint::{Fingerprint, Kind};
use crate::runtime::health::Health;
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;
use crate::runtime::work_state::WorkState;

pub(crate) use split::SplitTable;

/// What ranks compare of a call besides its kind, dtype and operator: its
/// length, its root, and a hash of any list of lengths (0 for none).
pub(crate) struct Compared {
    pub len: Option<usize>,
    pub root: Option<usize>,
    pub shape: u64,
}

impl Compared {
    /// Nothing besides kind, dtype and operator.
    pub(crate) fn nothing() -> Compared {
        Compared {
            len: None,
            root: None,
            shape: 0,
        }
    }

    /// A length.
    pub(crate) fn len(len: usize) -> Compared {
        Compared {
            len: Some(len),
            ..Compared::nothing()
        }
    }

    /// A length and a root.
    pub(crate) fn rooted(len: usize, root: usize) -> Compared {
        Compared {
            root: Some(root),
            ..Compared::len(len)
        }
    }

    /// A list of lengths (a coalesced call's, a v-call's counts): their
    /// sum and their hash.
    pub(crate) fn lens(lens: &[usize]) -> Compared {
        Compared {
            len: Some(lens.iter().fold(0usize, |a, &l| a.saturating_add(l))),
            root: None,
            shape: Fingerprint::shape_of(lens),
        }
    }
}

/// Where a call is made: the caller's rank and its group's size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seat {
    pub rank: usize,
    pub size: usize,
}

/// A call's output as its unit lays it out, one per input (or one, for a
/// call without inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Its length; `None` where this rank's output is not the call's to
    /// check (a gather's off the root, a receive's own tensor).
    pub out: Option<usize>,
    /// Whether the output may be the input itself.
    pub in_place: bool,
    /// Elements the call needs in one buffer besides its tensors (a
    /// coalesced ring's concatenation), which must fit the device.
    pub scratch: usize,
}

impl Layout {
    /// An output of `len` elements, apart from the input.
    pub(crate) fn apart(len: usize) -> Layout {
        Layout {
            out: Some(len),
            in_place: false,
            scratch: 0,
        }
    }

    /// An output of `len` elements that may be the input itself.
    pub(crate) fn in_place(len: usize) -> Layout {
        Layout {
            in_place: true,
            ..Layout::apart(len)
        }
    }
}

/// Where a rank runs its part of a call under a host plan: its device,
/// its tensors (views its steps can work on where they lie), the call's
/// `Work`, the group's health and whether the rank shares its device with its peers.
pub(crate) struct Here<'a> {
    pub dev: &'a Arc<RankDevice>,
    pub ins: &'a [Tensor],
    pub outs: &'a [Tensor],
    pub state: &'a Arc<WorkState>,
    pub health: &'a Arc<Health>,
    pub shared: bool,
    /// How the world's ranks lie over processes sharing a device each,
    /// where two-level plans can run.
    pub tier: Option<&'a crate::runtime::two_level::Tier>,
}

/// One collective, as a unit.
pub(crate) trait Unit {
    /// The element type of the tensors it moves (none for a barrier or a split).
    fn dtype(&self) -> Option<DType>;
    /// The reduction it applies, if it reduces.
    fn op(&self) -> Option<ReduceOp> {
        None
    }
    /// What every rank's call must agree on (with kind, dtype and op).
    fn compared(&self) -> Compared;
    /// Checks the call as `seat` made it, with an input of `input`
    /// elements (each input, for a coalesced call), and lays out its
    /// output; why the call is wrong, when it is.
    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String>;
    /// Whether `rank`'s call reads its inputs (a scatter's only at the root).
    fn reads_input(&self, _rank: usize) -> bool {
        true
    }
    /// The other end of a call between two ranks.
    fn peer(&self) -> Option<usize> {
        None
    }
    /// Counts that differ between ranks and must pair up instead (what
    /// rank a sends b, `.0[b]`, is what b receives from a, `.1[a]`).
    fn pairs(&self) -> Option<(&[usize], &[usize])> {
        None
    }
    /// The plans it offers, `Direct` first when it offers it.
    fn plans(&self) -> &'static [Plan];
    /// Bytes per rank, where the cost model prices its plans.
    fn priced(&self) -> Option<usize> {
        None
    }
    /// Whether `rank`'s call writes its outputs.
    fn writes_output(&self, _rank: usize) -> bool {
        true
    }
    /// Whether its steps under `plan` read and write views of whole words
    /// wherever they lie (no staging needed).
    fn any_view(&self, _plan: Plan) -> bool {
        false
    }
    /// Whether the shared device's steps can run every rank's call
    /// (`calls[r]`, `ins[r]`, `outs[r]`: rank r's), or why not.
    fn direct_feasible(
        &self,
        _dev: &RankDevice,
        _calls: &[&Collective],
        _ins: &[&[Tensor]],
        _outs: &[&[Tensor]],
    ) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Records every rank's steps on the shared device (views every kernel
    /// can bind); a split's table.
    fn direct_steps(
        &self,
        _steps: &mut Steps<'_>,
        _calls: &[&Collective],
        _ins: &[Vec<Tensor>],
        _outs: &[Vec<Tensor>],
    ) -> Result<Option<SplitTable>> {
        Ok(None)
    }
    /// This rank's part under `plan` (any plan it offers but `Direct`); a
    /// split's table.
    fn run(&self, plan: Plan, p: &mut Prims<'_>, at: &Here<'_>) -> Result<Option<SplitTable>>;
}

/// Makes the typed `Collective` from the list of collectives (`list.rs`).
macro_rules! units {
    ($($kind:ident($module:ident::$unit:ident) => $name:literal,)*) => {
        /// One collective, as one rank called it: its unit.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub(crate) enum Collective {
            $(#[doc = $name] $kind($module::$unit),)*
        }

        impl Collective {
            /// The unit itself.
            pub(crate) fn unit(&self) -> &dyn Unit {
                match self {
                    $(Collective::$kind(u) => u,)*
                }
            }

            pub(crate) fn kind(&self) -> Kind {
                match self {
                    $(Collective::$kind(_) => Kind::$kind,)*
                }
            }
        }

        $(impl From<$module::$unit> for Collective {
            fn from(u: $module::$unit) -> Collective {
                Collective::$kind(u)
            }
        })*
    };
}

crate::runtime::list::collectives!(units);

impl Collective {
    /// The element type of the tensors it moves.
    pub(crate) fn dtype(&self) -> Option<DType> {
        self.unit().dtype()
    }

    /// The reduction it applies.
    pub(crate) fn op(&self) -> Option<ReduceOp> {
        self.unit().op()
    }

    /// Whether `rank`'s call writes its outputs (a gather's output is
    /// only written at the root).
    pub(crate) fn writes_output(&self, rank: usize) -> bool {
        self.unit().writes_output(rank)
    }

    /// The plans it offers, `Direct` first when it offers it.
    pub(crate) fn plans(&self) -> &'static [Plan] {
        self.unit().plans()
    }

    /// The peer of a point-to-point call.
    pub(crate) fn peer(&self) -> Option<usize> {
        self.unit().peer()
    }

    /// What every rank's call must agree on, for the `seq`-th collective
    /// (the `seq`-th call between its pair, for a point-to-point call).
    pub(crate) fn fingerprint(&self, seq: u64) -> Fingerprint {
        let c = self.unit().compared();
        Fingerprint {
            seq,
            kind: self.kind(),
            dtype: self.dtype(),
            len: c.len,
            op: self.op(),
            root: c.root,
            shape: c.shape,
            peer: self.peer(),
        }
    }
}

/// `Ok` when `root` is a rank of the group, else why not.
pub(crate) fn root_of(seat: Seat, root: usize) -> std::result::Result<(), String> {
    if root < seat.size {
        Ok(())
    } else {
        Err(format!(
            "root {root} is not a rank of a group of {}",
            seat.size
        ))
    }
}

/// `len` elements gathered from every rank of the group, or why that overflows.
pub(crate) fn gathered(seat: Seat, len: usize) -> std::result::Result<usize, String> {
    len.checked_mul(seat.size).ok_or_else(|| {
        format!(
            "gathering {len} elements from {} ranks overflows",
            seat.size
        )
    })
}

/// This rank's even share of `len` elements, or why there is none.
pub(crate) fn share(seat: Seat, len: usize) -> std::result::Result<usize, String> {
    match (len.checked_rem(seat.size), len.checked_div(seat.size)) {
        (Some(0), Some(share)) => Ok(share),
        _ => Err(format!(
            "a tensor of {len} elements cannot be split evenly over {} ranks",
            seat.size
        )),
    }
}

/// The sum of `counts` (one per rank of the group, called `what`), or why
/// they are wrong.
pub(crate) fn count_sum(
    seat: Seat,
    what: &str,
    counts: &[usize],
) -> std::result::Result<usize, String> {
    if counts.len() != seat.size {
        return Err(format!(
            "{what} has {} entries, but the group has {} ranks",
            counts.len(),
            seat.size
        ));
    }
    counts
        .iter()
        .try_fold(0usize, |a, &c| a.checked_add(c))
        .ok_or_else(|| format!("{what} {counts:?}: their sum overflows"))
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
