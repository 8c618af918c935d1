//! One error type for the integration: the engine's own errors pass
//! through unchanged (they already name the rank, the sequence number and
//! what each side expected), and the burn side adds the two ways a burn
//! program can go wrong before the engine sees anything: a tensor the
//! engine cannot take, and a device it could not set up.

/// What went wrong, with the rank it happened on where there is one.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The engine failed the collective (a mismatch between ranks, a dead
    /// peer, a timeout, a lost device): see [`wgpu_collectives::Error`].
    #[error(transparent)]
    Engine(#[from] wgpu_collectives::Error),
    /// A tensor the collective cannot take: not a float, not on this
    /// rank's device, still tracked by autodiff, a shape that does not
    /// split evenly, or tensors that disagree in a `Vec`-shaped call.
    #[error("rank {rank}: {what}")]
    InvalidTensor {
        /// The rank whose tensor it was.
        rank: usize,
        /// What was expected and what came.
        what: String,
    },
    /// The burn devices could not be made: no adapter, a device request
    /// refused, or burn refusing to register a device.
    #[error("setting up burn's devices: {what}")]
    Setup {
        /// What failed, with the adapter or rank it failed on.
        what: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn tensor(rank: usize, what: impl Into<String>) -> Error {
        Error::InvalidTensor {
            rank,
            what: what.into(),
        }
    }

    pub(crate) fn setup(what: impl Into<String>) -> Error {
        Error::Setup { what: what.into() }
    }
}
