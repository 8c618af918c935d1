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
use std::sync::atomic::{AtomicBool, Ordering};

use crate::device::{RankDevice, size_class};
pub use crate::dtype::{DType, Element};
use crate::error::{Error, Result};

/// A handle to a tensor on one rank's device.
///
/// Cloning is cheap and shares the buffer. All of a tensor's operations go
/// through the device of the rank that made it; passing it to another rank's
/// communicator is an error.
///
/// `#[must_use]`: an out-of-place collective (`all_reduce`, `broadcast`,
/// ...) leaves its input as it was and returns the result as a new tensor,
/// so dropping it is almost always the bug of a torch user, whose
/// `all_reduce` works in place. The compiler says so:
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// # use wgpu_collectives::*;
/// # fn sync(c: &Communicator, grad: &Tensor) -> Result<(), Error> {
/// c.all_reduce(grad, ReduceOp::Avg)?.wait()?; // `grad` is unchanged: refused
/// # Ok(()) }
/// # fn main() {}
/// ```
///
/// while the in-place form, or a result kept, compiles:
///
/// ```
/// #![deny(unused_must_use)]
/// # use wgpu_collectives::*;
/// # fn sync(c: &Communicator, grad: &Tensor) -> Result<(), Error> {
/// let _ = c.all_reduce_in_place(grad, ReduceOp::Avg)?.wait()?;
/// let mean = c.all_reduce(grad, ReduceOp::Avg)?.wait()?;
/// # drop(mean);
/// # Ok(()) }
/// # fn main() {}
/// ```
#[derive(Clone)]
#[must_use = "a tensor, perhaps a collective's output: an out-of-place call (`all_reduce`, \
              `broadcast`, ...) leaves its input as it was and its result is only here; an \
              `_in_place` call's is its input, and a group's `wait` gives its first call's \
              output (an empty tensor for a send; `wait_all` gives them all). \
              `let _ = ...` drops it on purpose"]
pub struct Tensor {
    inner: Arc<TensorInner>,
}

struct TensorInner {
    buffer: wgpu::Buffer,
    /// Where the tensor starts in the buffer, in bytes (0 unless wrapped).
    offset: u64,
    len: usize,
    dtype: DType,
    device: Arc<RankDevice>,
    /// Whether the engine made the buffer (from its pool, padded to whole
    /// 16-byte units that kernels may write), or wraps a user's.
    pooled: bool,
    /// Set by [`Tensor::into_buffer`]: the user owns the buffer now, so it
    /// never goes back to the pool.
    kept: AtomicBool,
}

impl Drop for TensorInner {
    fn drop(&mut self) {
        if self.pooled && !self.kept.load(Ordering::Acquire) {
            self.device.recycle_buffer(self.buffer.clone());
        }
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
                offset: 0,
                len,
                dtype,
                device: device.clone(),
                pooled: true,
                kept: AtomicBool::new(false),
            }),
        }
    }

    /// A view of `len` elements of a user's `buffer` from byte `offset`
    /// (see `Communicator::wrap_buffer`, which documents what is refused).
    pub(crate) fn view(
        device: &Arc<RankDevice>,
        buffer: &wgpu::Buffer,
        offset: u64,
        dtype: DType,
        len: usize,
    ) -> Result<Tensor> {
        let rank = device.rank;
        let bad = |what: String| Err(Error::invalid(rank, format!("wrap_buffer: {what}")));
        let need = Self::USAGE;
        if !buffer.usage().contains(need) {
            return bad(format!(
                "the buffer's usage {:?} lacks {:?} (collectives bind it, and copy in and out of it)",
                buffer.usage(),
                need.difference(buffer.usage())
            ));
        }
        if offset % 4 != 0 {
            return bad(format!("offset {offset} is not a multiple of 4 bytes"));
        }
        if buffer.size() % 4 != 0 {
            return bad(format!(
                "the buffer's size ({} bytes) is not a multiple of 4",
                buffer.size()
            ));
        }
        let bytes = len
            .checked_mul(dtype.size())
            .and_then(|b| u64::try_from(b).ok());
        let end = bytes.and_then(|b| offset.checked_add(b));
        match end {
            Some(end) if end <= buffer.size() => {}
            _ => {
                return bad(format!(
                    "{len} {dtype} elements from byte {offset} do not fit a buffer of {} bytes",
                    buffer.size()
                ));
            }
        }
        // wgpu's `Buffer` cannot say which device made it: a command that
        // uses it on this device fails validation when it is another's.
        device
            .scoped("checking the buffer's device", |d| {
                let mut enc = d.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("wrap_buffer check"),
                });
                enc.clear_buffer(buffer, offset, Some(0));
                drop(enc.finish());
            })
            .map_err(|e| {
                Error::invalid(
                    rank,
                    format!(
                        "wrap_buffer: the buffer is not usable on rank {rank}'s device                          (made by another device?): {e}"
                    ),
                )
            })?;
        Ok(Tensor {
            inner: Arc::new(TensorInner {
                buffer: buffer.clone(),
                offset,
                len,
                dtype,
                device: device.clone(),
                pooled: false,
                kept: AtomicBool::new(false),
            }),
        })
    }

    /// Whether collectives can work on the tensor where it lies: it starts
    /// its buffer and kernels may write all of its padded 16-byte units.
    /// Other views (a user's buffer at an offset, or whose length leaves a
    /// partial unit that belongs to someone else) are staged, and so is an
    /// empty view, whose buffer may be too small to bind (its stand-in is
    /// an engine tensor of no elements; nothing is copied in or out).
    pub(crate) fn direct(&self) -> bool {
        let i = &self.inner;
        i.pooled
            || (i.offset == 0
                && i.len > 0
                && i.len
                    .checked_mul(i.dtype.size())
                    .is_some_and(|b| b % 16 == 0))
    }

    /// Whether `self` and `other` are the same elements of the same buffer.
    pub(crate) fn same_view(&self, other: &Tensor) -> bool {
        self.buffer() == other.buffer()
            && self.inner.offset == other.inner.offset
            && self.inner.len == other.inner.len
            && self.inner.dtype == other.inner.dtype
    }

    /// Whether the view is whole 32-bit words from a word boundary, which
    /// host copies read and write exactly (offsets are multiples of 4 by
    /// `wrap_buffer`'s check; a 16-bit view of odd length is not).
    pub(crate) fn whole_words(&self) -> bool {
        self.byte_len() % 4 == 0
    }

    /// [`offset`](Self::offset) in 32-bit words.
    pub(crate) fn word_offset(&self) -> usize {
        usize::try_from(self.inner.offset / 4).unwrap_or(usize::MAX)
    }

    /// Whether `self` and `other` share any byte of their elements. The
    /// padding of an engine-made tensor is its own (one tensor per pooled
    /// buffer), and a wrapped view is never written past its elements
    /// (views that are not whole 16-byte units are staged), so views that
    /// touch without sharing a byte do not overlap.
    pub(crate) fn overlaps(&self, other: &Tensor) -> bool {
        if self.buffer() != other.buffer() || self.is_empty() || other.is_empty() {
            return false;
        }
        let range = |t: &Tensor| {
            let start = t.inner.offset;
            (start, start.saturating_add(t.byte_len()))
        };
        let ((a0, a1), (b0, b1)) = (range(self), range(other));
        a0 < b1 && b0 < a1
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

    /// Bytes of the elements themselves (no padding).
    pub(crate) fn byte_len(&self) -> u64 {
        // The size was checked when the tensor was made.
        self.inner
            .len
            .checked_mul(self.inner.dtype.size())
            .map_or(0, |b| b as u64)
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

    /// The wgpu buffer holding the tensor: the engine's own, or the one a
    /// user wrapped ([`Communicator::wrap_buffer`](crate::Communicator::wrap_buffer)).
    ///
    /// A lend, as torch's `data_ptr()` is: an engine-made buffer is this
    /// tensor's while any clone of the `Tensor` lives. When the last clone
    /// is dropped the buffer goes back to the rank's pool, and a later
    /// tensor (a collective's output, [`Communicator::tensor`](crate::Communicator::tensor))
    /// may take it and overwrite its bytes, even if a clone of the
    /// `wgpu::Buffer` is still held. To use the bytes past the tensor, keep
    /// a clone of the tensor, or take the buffer for good with
    /// [`into_buffer`](Self::into_buffer). A buffer the user wrapped is
    /// the user's and never enters the pool.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.inner.buffer
    }

    /// The buffer, which from now on belongs to the caller: it never goes
    /// back to the engine's pool, so no later tensor takes it (other clones
    /// of this tensor still see it; see [`buffer`](Self::buffer)).
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(1))?;
    /// let c = world.communicator(0).expect("rank 0");
    /// let weights: wgpu::Buffer = c.tensor(&[1.0f32; 4])?.into_buffer();
    /// let other = c.tensor(&[2.0f32; 4])?; // never lands in `weights`
    /// assert!(other.buffer() != &weights);
    /// # Ok(()) }
    /// ```
    pub fn into_buffer(self) -> wgpu::Buffer {
        self.inner.kept.store(true, Ordering::Release);
        self.inner.buffer.clone()
    }

    /// Where the tensor starts in [`buffer`](Self::buffer), in bytes (0
    /// for the engine's own tensors).
    pub fn offset(&self) -> u64 {
        self.inner.offset
    }

    pub(crate) fn rank_device(&self) -> &Arc<RankDevice> {
        &self.inner.device
    }

    /// The wgpu device holding the tensor (its rank's).
    pub fn device(&self) -> &wgpu::Device {
        &self.inner.device.device
    }

    /// The queue of the tensor's rank: work on the tensor submitted here
    /// is in stream order with the rank's collectives.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.inner.device.queue
    }

    /// A new tensor of `len` elements on the same rank's device, whose
    /// contents are unspecified (its buffer comes from the device's pool,
    /// as a collective's output does): for outputs about to be overwritten.
    ///
    /// ```
    /// # use wgpu_collectives::*;
    /// # fn main() -> Result<(), Error> {
    /// let world = World::new(WorldConfig::new(1))?;
    /// let c = world.communicator(0).expect("rank 0");
    /// let x = c.tensor(&[1.0f32; 4])?;
    /// let out = x.new_empty(DType::F32, 4)?; // same rank, same device
    /// let _ = c.all_reduce_into(&x, &out, ReduceOp::Sum)?.wait()?;
    /// assert_eq!(out.to_vec::<f32>()?, vec![1.0; 4]);
    /// # Ok(()) }
    /// ```
    pub fn new_empty(&self, dtype: DType, len: usize) -> Result<Tensor> {
        Tensor::output(&self.inner.device, dtype, len)
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
        dev.read_buffer(self.buffer(), self.inner.offset, bytes)?;
        Ok(out)
    }
}
