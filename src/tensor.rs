//! Tensors: one rank's device buffer, typed.
//!
//! A `Tensor` is a cheap handle (an `Arc`) so that a collective in flight can
//! keep its input and output alive after the caller has dropped theirs: the
//! progress thread holds a clone until the device has finished with it.
//!
//! Buffers are sized in whole 16-byte units of 32-bit words, because every
//! kernel works on vectors of `u32` words: 16-bit dtypes are packed two to a
//! word, and the padding after the last element is reduced along with the
//! rest but never read back. This is what lets every adapter run every dtype without
//! `shader-f16`.

use std::sync::Arc;

use crate::device::{RankDevice, size_class};
use crate::error::{Error, Result};

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

/// A Rust type that can live in a [`Tensor`]: `f32`, `half::f16`,
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

/// A handle to a tensor on one rank's device.
///
/// Cloning is cheap and shares the buffer. All of a tensor's operations go
/// through the device of the rank that made it; passing it to another rank's
/// communicator is an error.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

struct TensorInner {
    buffer: wgpu::Buffer,
    len: usize,
    dtype: DType,
    device: Arc<RankDevice>,
}

impl Drop for TensorInner {
    fn drop(&mut self) {
        self.device.recycle_buffer(self.buffer.clone());
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("rank", &self.rank())
            .field("dtype", &self.dtype())
            .field("len", &self.len())
            .finish()
    }
}

impl Tensor {
    /// Usage of every tensor buffer: kernels read and write it, transfers copy in and out.
    pub(crate) const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
        .union(wgpu::BufferUsages::COPY_SRC)
        .union(wgpu::BufferUsages::COPY_DST);

    /// A tensor holding `data`. The buffer comes from the device's pool
    /// when one fits, and the bytes go through the queue, so they land
    /// after whatever the device still does with the buffer's last owner.
    pub(crate) fn from_slice<T: Element>(device: &Arc<RankDevice>, data: &[T]) -> Result<Tensor> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let size = Self::buffer_size(device, T::DTYPE, data.len())?;
        let buffer = device.reuse_buffer(size, Self::USAGE)?;
        device.write_buffer(&buffer, bytes)?;
        Ok(Self::wrap(device, buffer, T::DTYPE, data.len()))
    }

    /// A zero-filled tensor.
    pub(crate) fn zeros(device: &Arc<RankDevice>, dtype: DType, len: usize) -> Result<Tensor> {
        let buffer = device.reuse_buffer(Self::buffer_size(device, dtype, len)?, Self::USAGE)?;
        device.clear_buffer(&buffer)?;
        Ok(Self::wrap(device, buffer, dtype, len))
    }

    /// A tensor for a collective's output: its buffer may come from the
    /// device's pool with stale contents, so the collective must write all of it.
    pub(crate) fn output(device: &Arc<RankDevice>, dtype: DType, len: usize) -> Result<Tensor> {
        let buffer = device.reuse_buffer(Self::buffer_size(device, dtype, len)?, Self::USAGE)?;
        Ok(Self::wrap(device, buffer, dtype, len))
    }

    fn wrap(device: &Arc<RankDevice>, buffer: wgpu::Buffer, dtype: DType, len: usize) -> Tensor {
        Tensor {
            inner: Arc::new(TensorInner {
                buffer,
                len,
                dtype,
                device: device.clone(),
            }),
        }
    }

    /// Whole 16-byte units, rounded up to a size class so that freed
    /// buffers fit later tensors of similar size (see `device::size_class`).
    /// A length whose byte size overflows is an invalid argument; one
    /// larger than the adapter allows is refused by the device.
    pub(crate) fn buffer_size(device: &RankDevice, dtype: DType, len: usize) -> Result<u64> {
        let exact = dtype.padded_bytes(len).ok_or_else(|| {
            Error::invalid(
                device.rank,
                format!("a {dtype} tensor of {len} elements: its size in bytes overflows"),
            )
        })?;
        device.check_buffer_size("tensor", exact)?;
        let class = size_class(exact);
        Ok(if class > device.limits.max_buffer_size {
            exact
        } else {
            class
        })
    }

    /// Bytes of the tensor that kernels and copies touch (whole 16-byte units).
    pub(crate) fn used_bytes(&self) -> u64 {
        self.inner.dtype.padded_bytes(self.inner.len).unwrap_or(0)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// The rank (in the world) whose device holds this tensor.
    pub fn rank(&self) -> usize {
        self.inner.device.rank
    }

    /// Number of 32-bit words the kernels see (a multiple of 4).
    pub(crate) fn words(&self) -> usize {
        self.inner.dtype.words(self.inner.len)
    }

    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.inner.buffer
    }

    pub(crate) fn device(&self) -> &Arc<RankDevice> {
        &self.inner.device
    }

    /// Copies the tensor back to the host.
    ///
    /// Waits (with the world's timeout) for every submission on this rank's
    /// device that was made before the call, so reading the output of a
    /// collective whose `Work` has completed always sees the result.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let dev = &self.inner.device;
        if T::DTYPE != self.dtype() {
            return Err(Error::invalid(
                dev.rank,
                format!(
                    "to_vec::<{}>() on a {} tensor: the element type must match the dtype",
                    T::DTYPE,
                    self.dtype()
                ),
            ));
        }
        let mut out = vec![T::zeroed(); self.len()];
        let bytes = bytemuck::cast_slice_mut::<T, u8>(&mut out);
        if bytes.is_empty() {
            return Ok(out);
        }
        dev.read_buffer(self.buffer(), 0, bytes)?;
        Ok(out)
    }
}
