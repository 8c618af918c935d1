//! Which fold orders a world's collectives may take. Every plan folds each
//! element in the ring's order (DESIGN.md), so no choice of plan,
//! placement or process layout changes a result; a two-level plan across
//! processes folds each process's ranks first, an order that depends on
//! how the ranks are spread over processes. Floating-point sums of one set
//! of values differ by that order, so such plans run for floats only where
//! the user says bits may change with the layout; integer sums, products,
//! minima, maxima and bitwise folds do not depend on the order, so they may
//! take them always.

use crate::dtype::DType;

/// The fold orders a world's collectives may take
/// ([`WorldConfig::with_fold_order`](crate::WorldConfig::with_fold_order),
/// `WGPU_COLLECTIVES_FOLD_ORDER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FoldOrder {
    /// Every element folded in the ring's order, whatever the plan, the
    /// placement or the process layout: the same bits for the same inputs
    /// and rank count. The default.
    #[default]
    Canonical,
    /// Plans whose order depends on the process layout may run for
    /// floating-point dtypes too ([`Plan::TwoLevel`](crate::Plan::TwoLevel)):
    /// results may differ in their last bits between, say, 2 processes x 2
    /// ranks and 1 x 4, as NCCL's do between its trees and rings.
    Fastest,
}

impl FoldOrder {
    /// The order named `s` (`canonical` or `fastest`), as
    /// `WGPU_COLLECTIVES_FOLD_ORDER` takes them.
    pub fn parse(s: &str) -> Option<FoldOrder> {
        match s.trim().to_ascii_lowercase().as_str() {
            "canonical" => Some(FoldOrder::Canonical),
            "fastest" => Some(FoldOrder::Fastest),
            _ => None,
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            FoldOrder::Canonical => "canonical",
            FoldOrder::Fastest => "fastest",
        }
    }

    /// Whether a collective of `dtype` may fold in an order of its own:
    /// always for integers, whose folds do not depend on the order, and
    /// for floats only when the user allows it.
    pub(crate) fn frees(self, dtype: DType) -> bool {
        dtype.is_integer() || self == FoldOrder::Fastest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_only_integers_are_free_by_default() {
        for f in [FoldOrder::Canonical, FoldOrder::Fastest] {
            assert_eq!(FoldOrder::parse(f.name()), Some(f));
        }
        assert_eq!(FoldOrder::parse(" Fastest "), Some(FoldOrder::Fastest));
        assert_eq!(FoldOrder::parse("fast"), None);
        assert!(FoldOrder::Canonical.frees(DType::I32));
        assert!(FoldOrder::Canonical.frees(DType::U32));
        assert!(!FoldOrder::Canonical.frees(DType::F32));
        assert!(!FoldOrder::Canonical.frees(DType::BF16));
        assert!(FoldOrder::Fastest.frees(DType::F16));
    }
}
