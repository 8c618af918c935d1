//! A burn tensor lent to the engine where it lies, and handed back.
//!
//! A burn float tensor on wgpu is a cubecl handle: a range of one of
//! cubecl's pooled `wgpu::Buffer`s. Lending it is three steps: flush burn's
//! queued work on that device (cubecl batches kernels into command
//! encoders; the engine's submission must come after them on the shared
//! queue), pin the allocation (cubecl must not hand the range to another
//! tensor while the collective reads or writes it), and wrap the range as
//! an engine tensor with `Communicator::wrap_buffer`. burn never reads the
//! tensor back: the engine takes the bytes from burn's own buffer (between
//! devices of their own they cross host staging, as a hop between two GPUs
//! without peer access does). Handing back is building the burn tensor
//! again from the same handle once the collective has completed, so every
//! burn kernel submitted afterwards sees the result.
//!
//! burn shares a handle between tensors (a `clone` is a second reference,
//! not a copy), so a result is written in place only into a handle its
//! tensor owns alone (`can_mut`); anything else gets a fresh handle, as
//! burn's own in-place kernels decide.

use burn_cubecl::cubecl::server::Handle;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_dispatch::backends::Cube;
use burn_tensor::{DType as BurnDType, Device, Shape, Tensor};
use cubecl_runtime::storage::ManagedResource;
use cubecl_wgpu::{AutoCompiler, WgpuResource, WgpuServer};
use wgpu_collectives::{Communicator, DType};

use crate::error::{Error, Result};

/// A burn tensor's storage as the engine sees it, and what keeps it there.
pub(crate) struct Lent {
    /// The burn tensor: it holds the handle, so the memory stays this
    /// tensor's while the collective runs.
    pub(crate) cube: CubeTensor,
    /// The engine's view of the same bytes.
    pub(crate) view: wgpu_collectives::Tensor,
    /// Pins the allocation in place (cubecl neither frees, hands out
    /// again nor moves a range whose resource is held).
    _pin: ManagedResource<WgpuResource>,
}

/// What a burn tensor brings to a collective: its storage, in row-major
/// order, and its dims.
pub(crate) struct Taken<const D: usize> {
    pub(crate) cube: CubeTensor,
    pub(crate) dims: [usize; D],
    pub(crate) dtype: DType,
}

/// Takes `tensor` apart for rank `rank` on `device`: a float tensor of
/// this rank's device without autodiff, in row-major order (a strided
/// view is made contiguous first, by burn).
pub(crate) fn take<const D: usize>(
    rank: usize,
    device: &Device,
    tensor: Tensor<D>,
) -> Result<Taken<D>> {
    if tensor.is_autodiff() {
        return Err(Error::tensor(
            rank,
            "the tensor is tracked by autodiff; collectives take tensors without it \
             (a gradient from `grad`, or `tensor.inner()`), since a collective has no \
             backward here",
        ));
    }
    if &tensor.device() != device {
        return Err(Error::tensor(
            rank,
            format!(
                "the tensor is on {:?}, not on rank {rank}'s device {device:?}",
                tensor.device()
            ),
        ));
    }
    let dims = tensor.dims();
    let dtype = engine_dtype(rank, tensor.dtype())?;
    let cube = tensor.try_into_primitive::<Cube>().map_err(|e| {
        Error::tensor(
            rank,
            format!("the tensor is not a plain cubecl tensor on wgpu: {e:?}"),
        )
    })?;
    if cube.qparams.is_some() {
        return Err(Error::tensor(rank, "quantized tensors are not supported"));
    }
    // Untiles and copies only what is not row-major already.
    let cube = into_contiguous(cube);
    Ok(Taken { cube, dims, dtype })
}

/// A fresh burn tensor of `dims` like `like`, on its device; its contents
/// are undefined until a collective writes all of it.
pub(crate) fn fresh<const D: usize>(like: &CubeTensor, dims: [usize; D]) -> CubeTensor {
    empty_device_contiguous_dtype(
        like.client.clone(),
        like.device.clone(),
        Shape::new(dims),
        like.dtype,
    )
}

impl Lent {
    /// Lends `cube` to `comm`: burn's queued work on its device is
    /// submitted, the range pinned and wrapped.
    pub(crate) fn new(comm: &Communicator, cube: CubeTensor, dtype: DType) -> Result<Lent> {
        let rank = comm.rank();
        let len = cube.meta.shape().num_elements();
        // This also submits burn's queued work on the tensor's stream and
        // the caller's (cubecl executes and flushes both before it answers).
        let pin = resource(rank, &cube, cube.handle.clone())?;
        let r = pin.resource();
        let view = comm.wrap_buffer(&r.buffer, r.offset, dtype, len)?;
        Ok(Lent {
            cube,
            view,
            _pin: pin,
        })
    }

    /// The burn tensor again: to be called once the collective that wrote
    /// it has completed.
    pub(crate) fn into_tensor<const D: usize>(self) -> Tensor<D> {
        Tensor::from_primitive::<Cube>(self.cube)
    }
}

/// The pinned wgpu range behind `handle`.
fn resource(
    rank: usize,
    cube: &CubeTensor,
    handle: Handle,
) -> Result<ManagedResource<WgpuResource>> {
    cube.client
        .get_resource::<WgpuServer<AutoCompiler>>(handle)
        .map_err(|e| {
            Error::tensor(
                rank,
                format!("burn could not give the tensor's wgpu buffer: {e:?}"),
            )
        })
}

/// The engine's dtype for a burn float dtype.
fn engine_dtype(rank: usize, dtype: BurnDType) -> Result<DType> {
    match dtype {
        BurnDType::F32 => Ok(DType::F32),
        BurnDType::F16 => Ok(DType::F16),
        BurnDType::BF16 => Ok(DType::BF16),
        other => Err(Error::tensor(
            rank,
            format!("dtype {other:?}: collectives take f32, f16 and bf16 tensors"),
        )),
    }
}
