//! One collective's life, from the call to its completion: its typed
//! description and fingerprint, the progress thread that runs it in issue
//! order, the hops it makes, the group's health and flight record, and
//! the cost model that picks its algorithm.

pub(crate) mod claims;
pub(crate) mod collectives;
pub(crate) mod cost;
pub(crate) mod estimate;
pub(crate) mod fingerprint;
pub(crate) mod flight;
pub(crate) mod fold_order;
pub(crate) mod heal;
pub(crate) mod health;
pub(crate) mod hop;
pub(crate) mod host_oneshot;
pub(crate) mod host_ring;
pub(crate) mod kernel_shape;
pub(crate) mod list;
pub(crate) mod plan;
pub(crate) mod planner;
pub(crate) mod prims;
pub(crate) mod profile;
pub(crate) mod progress;
pub(crate) mod same_bits;
pub(crate) mod shared;
pub(crate) mod split;
pub(crate) mod stand_in;
pub(crate) mod stats;
pub(crate) mod tune;
pub(crate) mod two_level;
pub(crate) mod waiter;
pub(crate) mod work_state;
