//! barrier: no rank leaves before every rank has arrived. On a shared
//! device the meeting itself is the barrier; otherwise each rank relays
//! a token round the ring n-1 times.

use crate::algo::ring;
use crate::dtype::DType;
use crate::error::Result;
use crate::runtime::collectives::{Compared, Here, Layout, Seat, SplitTable, Unit};
use crate::runtime::plan::Plan;
use crate::runtime::prims::Prims;

/// A barrier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Barrier;

impl Unit for Barrier {
    fn dtype(&self) -> Option<DType> {
        None
    }

    fn compared(&self) -> Compared {
        Compared::nothing()
    }

    fn layout(&self, seat: Seat, input: usize) -> std::result::Result<Layout, String> {
        let _ = (seat, input);
        // Its `Work` gives an empty tensor.
        Ok(Layout::apart(0))
    }

    fn plans(&self) -> &'static [Plan] {
        &[Plan::Direct, Plan::DeviceRing]
    }

    fn run(&self, _plan: Plan, p: &mut Prims<'_>, _at: &Here<'_>) -> Result<Option<SplitTable>> {
        ring::barrier(p)?;
        Ok(None)
    }
}
