//! Where ranks run: whether ranks on one adapter share its device.
//!
//! Ranks that share a device can read each other's buffers, so their
//! collectives need no host copy at all (see `runtime/shared.rs`); ranks
//! on devices of their own model separate GPUs, whose bytes cross the
//! host.

use crate::error::{Error, Result};

/// Where a [`World`](crate::World)'s ranks run.
///
/// ```
/// use wgpu_collectives::{Placement, WorldConfig};
///
/// let config = WorldConfig::new(4).with_placement(Placement::DevicePerRank);
/// assert_eq!(Placement::parse("shared"), Some(Placement::SharedDevice));
/// # let _ = config;
/// ```
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// Ranks on one adapter share one device and queue; ranks on
    /// different adapters have their own.
    #[default]
    Auto,
    /// Every rank on one device (the first adapter's).
    SharedDevice,
    /// A device per rank, as separate GPUs would have: every hop goes
    /// through host memory.
    DevicePerRank,
}

impl Placement {
    /// Parses `auto`, `shared` or `per-rank` (as `WGPU_COLLECTIVES_PLACEMENT`
    /// takes them).
    pub fn parse(s: &str) -> Option<Placement> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Placement::Auto),
            "shared" | "shared-device" | "shared_device" => Some(Placement::SharedDevice),
            "per-rank" | "per_rank" | "device-per-rank" | "device_per_rank" => {
                Some(Placement::DevicePerRank)
            }
            _ => None,
        }
    }

    /// The name [`Placement::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Placement::Auto => "auto",
            Placement::SharedDevice => "shared",
            Placement::DevicePerRank => "per-rank",
        }
    }

    /// `WGPU_COLLECTIVES_PLACEMENT`, else `Auto`.
    pub(crate) fn from_env() -> Result<Placement> {
        match std::env::var("WGPU_COLLECTIVES_PLACEMENT") {
            Ok(s) if !s.is_empty() => Placement::parse(&s).ok_or_else(|| Error::InvalidArgument {
                rank: None,
                what: format!(
                    "WGPU_COLLECTIVES_PLACEMENT={s:?}: expected auto, shared or per-rank"
                ),
            }),
            _ => Ok(Placement::Auto),
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
