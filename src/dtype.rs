//! Element types: what a tensor holds, as the kernels see it.
//!
//! Every kernel works on 32-bit words: 16-bit dtypes are packed two to a
//! word, so every adapter runs every dtype without `shader-f16`.

/// The element types a tensor can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    BF16,
    /// 32-bit signed integer.
    I32,
    /// 32-bit unsigned integer.
    U32,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::U32];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Whether this is an integer type (the bitwise reductions need one).
    pub fn is_integer(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// The short name nccl-tests prints (`float`, `half`, `bfloat16`, `int32`, `uint32`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float",
            DType::F16 => "half",
            DType::BF16 => "bfloat16",
            DType::I32 => "int32",
            DType::U32 => "uint32",
        }
    }

    /// Number of 32-bit words the kernels see for `len` elements: padded
    /// to whole 16-byte units, which is what one kernel invocation handles.
    ///
    /// Only for lengths of tensors that exist: their byte size was checked
    /// when they were made ([`DType::padded_bytes`]), so this cannot overflow.
    #[allow(clippy::arithmetic_side_effects)]
    pub(crate) fn words(self, len: usize) -> usize {
        (len * self.size()).div_ceil(16) * 4
    }

    /// Bytes of `len` elements padded to whole 16-byte units, or `None`
    /// when that does not fit in `u64` (nor `usize`).
    pub(crate) fn padded_bytes(self, len: usize) -> Option<u64> {
        let bytes = len.checked_mul(self.size())?;
        let padded = bytes.checked_next_multiple_of(16)?;
        u64::try_from(padded).ok()
    }

    /// Bytes of the unit the reduction kernel loads at once (see
    /// `shaders/reduce.wgsl`).
    pub(crate) fn unit_bytes(self) -> u64 {
        match self.size() {
            2 => 8,
            _ => 16,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that can live in a [`Tensor`](crate::Tensor): `f32`, `half::f16`,
/// `half::bf16`, `i32`, `u32`.
pub trait Element: bytemuck::Pod + Send + Sync + sealed::Sealed {
    /// The tensor dtype for this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    };
}
element!(f32, F32);
element!(half::f16, F16);
element!(half::bf16, BF16);
element!(i32, I32);
element!(u32, U32);
