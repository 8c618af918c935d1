//! Compute ops (matmul, element-wise, sum over rows) as WGSL kernels, for
//! the graph executor: the work that collectives overlap with.
//!
//! f32 only: these exist to give graphs real compute to schedule, not to
//! be a tensor library. Every kernel sums in a fixed order, so results are
//! the same bits on every rank and in every schedule.
//!
//! Built on the crate's public API only, as a user's kernels would be: the
//! tensor's own device and queue, outputs from `Tensor::new_empty`, errors
//! caught in error scopes. Pipelines are cached per device on the calling
//! thread (a rank's thread runs its graph), so they live as long as the
//! thread and are made once per device per thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::{DType, Error, Result, Tensor};

const SOURCE: &str = include_str!("../../shaders/compute.wgsl");

/// The element-wise ops, as `shaders/compute.wgsl` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elementwise {
    Add = 0,
    Sub = 1,
    Mul = 2,
    Scale = 3,
    Relu = 4,
    ReluGrad = 5,
}

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
struct Dims {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    /// An `f32`'s bits, so that `Dims` can key a map.
    factor: u32,
    len: u32,
    pad: [u32; 2],
}

/// Distinct parameter blocks kept per device; a graph step has a few
/// dozen shapes, so this is only a bound against unbounded growth.
const PARAMS_CACHE: usize = 256;

/// The compute pipelines of one device, made on first use, and the
/// parameter buffers of the op shapes seen so far (a training loop
/// repeats the same shapes).
///
/// Bind groups are still made per op: the executor takes outputs from the
/// device's pool, which hands back buffers in whatever order tensors were
/// freed, so an op rarely sees the same buffers twice, and a cache keyed
/// on buffers would mostly miss while keeping stale buffers alive. A
/// per-graph buffer plan would fix both.
struct Compute {
    pipelines: Pipelines,
    params: RefCell<HashMap<Dims, wgpu::Buffer>>,
}

/// Devices whose kernels a thread keeps; the oldest goes first.
const DEVICES_PER_THREAD: usize = 8;

thread_local! {
    static KERNELS: RefCell<Vec<(wgpu::Device, Rc<Compute>)>> = const { RefCell::new(Vec::new()) };
}

/// The compute kernels of `t`'s device, made on first use on this thread.
fn kernels(t: &Tensor) -> Result<Rc<Compute>> {
    let dev = t.device();
    if let Some(k) =
        KERNELS.with_borrow(|v| v.iter().find(|(d, _)| d == dev).map(|(_, k)| k.clone()))
    {
        return Ok(k);
    }
    let made = Rc::new(Compute {
        pipelines: Pipelines::new(dev, t.rank())?,
        params: RefCell::new(HashMap::new()),
    });
    KERNELS.with_borrow_mut(|v| {
        if v.len() >= DEVICES_PER_THREAD {
            v.remove(0);
        }
        v.push((dev.clone(), made.clone()));
    });
    Ok(made)
}

/// Runs `make` inside validation and out-of-memory error scopes on `dev`.
fn scoped<T>(dev: &wgpu::Device, rank: usize, what: &str, make: impl FnOnce() -> T) -> Result<T> {
    let oom = dev.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
    let validation = dev.push_error_scope(wgpu::ErrorFilter::Validation);
    let made = make();
    let v = pollster::block_on(validation.pop());
    let o = pollster::block_on(oom.pop());
    match v.or(o) {
        Some(e) => Err(Error::Device {
            rank: Some(rank),
            seq: None,
            what: format!("{what}: {e}"),
        }),
        None => Ok(made),
    }
}

fn invalid(rank: usize, what: String) -> Error {
    Error::InvalidArgument {
        rank: Some(rank),
        what,
    }
}

struct Pipelines {
    layout: wgpu::BindGroupLayout,
    matmul: wgpu::ComputePipeline,
    elementwise: wgpu::ComputePipeline,
    sum_rows: wgpu::ComputePipeline,
}

fn f32_only(t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(invalid(
            t.rank(),
            format!("compute ops take f32 tensors, got {}", t.dtype()),
        ));
    }
    Ok(())
}

/// Both of one rank (ranks that share a device still own their tensors).
fn same_device(a: &Tensor, b: &Tensor) -> Result<()> {
    if a.rank() != b.rank() || a.device() != b.device() {
        return Err(invalid(
            a.rank(),
            format!(
                "a compute op on tensors of rank {} and rank {}",
                a.rank(),
                b.rank()
            ),
        ));
    }
    Ok(())
}

impl Pipelines {
    fn new(d: &wgpu::Device, rank: usize) -> Result<Pipelines> {
        let entry = |binding, ty| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        use wgpu::BufferBindingType as B;
        scoped(d, rank, "compiling shaders/compute.wgsl", || {
            let layout = d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("compute"),
                entries: &[
                    entry(0, B::Uniform),
                    entry(1, B::Storage { read_only: true }),
                    entry(2, B::Storage { read_only: true }),
                    entry(3, B::Storage { read_only: false }),
                ],
            });
            let pl = d.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("compute"),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("compute.wgsl"),
                source: wgpu::ShaderSource::Wgsl(SOURCE.into()),
            });
            let pipeline = |entry: &str| {
                d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                })
            };
            Pipelines {
                matmul: pipeline("matmul"),
                elementwise: pipeline("elementwise"),
                sum_rows: pipeline("sum_rows"),
                layout,
            }
        })
    }
}

impl Compute {
    /// Runs one kernel on `a`'s device. The kernels index from the start
    /// of their buffers: operands that are views at an offset are copied
    /// first (a graph's own tensors never are).
    fn run(
        &self,
        which: fn(&Pipelines) -> &wgpu::ComputePipeline,
        dims: Dims,
        [a, b]: [&Tensor; 2],
        out_len: usize,
        groups: (u32, u32),
    ) -> Result<Tensor> {
        same_device(a, b)?;
        let (dev, rank) = (a.device(), a.rank());
        let out = a.new_empty(DType::F32, out_len)?;
        if out_len == 0 {
            return Ok(out);
        }
        let (a, b) = (at_start(a)?, at_start(b)?);
        let uniform = self.params(dev, rank, dims)?;
        let p = &self.pipelines;
        scoped(dev, rank, "running a compute op", || {
            let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &p.layout,
                entries: &[
                    entry(0, &uniform),
                    entry(1, a.buffer()),
                    entry(2, b.buffer()),
                    entry(3, out.buffer()),
                ],
            });
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                pass.set_pipeline(which(p));
                pass.set_bind_group(0, &bind, &[]);
                pass.dispatch_workgroups(groups.0.max(1), groups.1.max(1), 1);
            }
            a.queue().submit([enc.finish()]);
        })?;
        Ok(out)
    }

    /// The uniform buffer holding `dims`, made (mapped, so without a
    /// staging copy) the first time these parameters come.
    fn params(&self, dev: &wgpu::Device, rank: usize, dims: Dims) -> Result<wgpu::Buffer> {
        if let Some(b) = self.params.borrow().get(&dims) {
            return Ok(b.clone());
        }
        let uniform = scoped(dev, rank, "making a compute op's parameters", || {
            let b = dev.create_buffer(&wgpu::BufferDescriptor {
                label: Some("compute dims"),
                size: 32,
                usage: wgpu::BufferUsages::UNIFORM,
                mapped_at_creation: true,
            });
            if let Ok(mut view) = b.get_mapped_range_mut(..) {
                view.copy_from_slice(bytemuck::bytes_of(&dims));
            }
            b.unmap();
            b
        })?;
        let mut params = self.params.borrow_mut();
        if params.len() >= PARAMS_CACHE {
            params.clear();
        }
        params.insert(dims, uniform.clone());
        Ok(uniform)
    }
}

/// `a @ b` for 2-D `a` (`[m, k]`, or `[k, m]` transposed) and `b`
/// (`[k, n]`, or `[n, k]` transposed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    a: &Tensor,
    b: &Tensor,
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
) -> Result<Tensor> {
    f32_only(a)?;
    f32_only(b)?;
    let rank = a.rank();
    let what = || format!("matmul of [{m}, {k}] x [{k}, {n}]");
    let (ak, kn) = (product(rank, m, k, &what)?, product(rank, k, n, &what)?);
    if a.len() != ak || b.len() != kn {
        return Err(invalid(
            rank,
            format!("{} on {} and {} elements", what(), a.len(), b.len()),
        ));
    }
    let out_len = product(rank, m, n, &what)?;
    let (m32, n32, k32) = (
        dim(rank, m, &what)?,
        dim(rank, n, &what)?,
        dim(rank, k, &what)?,
    );
    let dims = Dims {
        m: m32,
        n: n32,
        k: k32,
        flags: u32::from(ta) | (u32::from(tb) << 1),
        factor: 0,
        len: 0,
        pad: [0; 2],
    };
    kernels(a)?.run(
        |p| &p.matmul,
        dims,
        [a, b],
        out_len,
        (n32.div_ceil(8), m32.div_ceil(8)),
    )
}

/// An element-wise op (`b` is ignored by the unary ones; pass `a`).
pub(crate) fn elementwise(op: Elementwise, a: &Tensor, b: &Tensor, factor: f32) -> Result<Tensor> {
    f32_only(a)?;
    f32_only(b)?;
    let rank = a.rank();
    if b.len() != a.len() {
        return Err(invalid(
            rank,
            format!("element-wise op on {} and {} elements", a.len(), b.len()),
        ));
    }
    let len = a.len();
    let len32 = dim(rank, len, &|| {
        format!("an element-wise op on {len} elements")
    })?;
    let dims = Dims {
        m: 0,
        n: 0,
        k: 0,
        flags: op as u32,
        factor: factor.to_bits(),
        len: len32,
        pad: [0; 2],
    };
    let groups = len32.div_ceil(256);
    let x = groups.min(a.device().limits().max_compute_workgroups_per_dimension);
    kernels(a)?.run(
        |p| &p.elementwise,
        dims,
        [a, b],
        len,
        (x, groups.div_ceil(x.max(1))),
    )
}

/// Sum over the `m` rows of `a` (`[m, n]`): `[n]`.
pub(crate) fn sum_rows(a: &Tensor, m: usize, n: usize) -> Result<Tensor> {
    f32_only(a)?;
    let rank = a.rank();
    let what = || format!("sum over the rows of [{m}, {n}]");
    if product(rank, m, n, &what)? != a.len() {
        return Err(invalid(rank, format!("{} on {} elements", what(), a.len())));
    }
    let (m32, n32) = (dim(rank, m, &what)?, dim(rank, n, &what)?);
    let dims = Dims {
        m: m32,
        n: n32,
        k: 0,
        flags: 0,
        factor: 0,
        len: 0,
        pad: [0; 2],
    };
    kernels(a)?.run(|p| &p.sum_rows, dims, [a, a], n, (n32.div_ceil(64), 1))
}

/// `a * b`, or an invalid argument naming `what` when it overflows.
fn product(rank: usize, a: usize, b: usize, what: &dyn Fn() -> String) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| invalid(rank, format!("{}: {a} x {b} overflows", what())))
}

/// A dimension as the kernels take it (`u32`), or an invalid argument.
fn dim(rank: usize, v: usize, what: &dyn Fn() -> String) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        invalid(
            rank,
            format!("{}: {v} does not fit the kernels' 32-bit indices", what()),
        )
    })
}

fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
    }
}

/// `t` itself when it starts its buffer, else a copy that does.
fn at_start(t: &Tensor) -> Result<Tensor> {
    if t.offset() == 0 {
        return Ok(t.clone());
    }
    concat(std::slice::from_ref(t), t.len())
}

/// A new tensor of `len` elements holding `parts` one after another (their
/// dtype; each part's bytes a multiple of 4, as the device copies them).
pub(crate) fn concat(parts: &[Tensor], len: usize) -> Result<Tensor> {
    let Some(first) = parts.first() else {
        return Err(invalid(0, "concat of no parts".into()));
    };
    let (dev, rank, dtype) = (first.device(), first.rank(), first.dtype());
    let out = first.new_empty(dtype, len)?;
    let total = len
        .checked_mul(dtype.size())
        .and_then(|b| u64::try_from(b).ok())
        .ok_or_else(|| invalid(rank, format!("concat of {len} elements overflows")))?;
    let mut enc = dev.create_command_encoder(&Default::default());
    let mut off = 0u64;
    for p in parts {
        same_device(first, p)?;
        let bytes = p
            .len()
            .checked_mul(dtype.size())
            .and_then(|b| u64::try_from(b).ok());
        let end = bytes.and_then(|b| off.checked_add(b));
        let (Some(bytes), Some(end)) = (bytes, end) else {
            return Err(invalid(rank, "concat: the parts' sizes overflow".into()));
        };
        if end > total || p.dtype() != dtype {
            return Err(invalid(
                rank,
                format!("concat of parts that do not make {len} {dtype} elements"),
            ));
        }
        if bytes % 4 != 0 || off % 4 != 0 {
            return Err(invalid(
                rank,
                "concat of 16-bit tensors of odd length".into(),
            ));
        }
        if bytes > 0 {
            enc.copy_buffer_to_buffer(p.buffer(), p.offset(), out.buffer(), off, bytes);
        }
        off = end;
    }
    scoped(dev, rank, "concatenating tensors", || {
        first.queue().submit([enc.finish()]);
    })?;
    Ok(out)
}

/// A new tensor of elements `start..start + len` of `t`.
pub(crate) fn slice(t: &Tensor, start: usize, len: usize) -> Result<Tensor> {
    let (dev, rank, size) = (t.device(), t.rank(), t.dtype().size());
    let end = start.checked_add(len);
    if end.is_none_or(|end| end > t.len()) {
        return Err(invalid(
            rank,
            format!(
                "split of elements {start}..+{len} of a tensor of {}",
                t.len()
            ),
        ));
    }
    let out = t.new_empty(t.dtype(), len)?;
    // Within `t`, whose byte size was checked when it was made.
    let (off, bytes) = (
        start.saturating_mul(size) as u64,
        len.saturating_mul(size) as u64,
    );
    if off % 4 != 0 || bytes % 4 != 0 {
        return Err(invalid(
            rank,
            "split of 16-bit tensors at odd offsets".into(),
        ));
    }
    if bytes > 0 {
        let from = off.saturating_add(t.offset());
        scoped(dev, rank, "slicing a tensor", || {
            let mut enc = dev.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(t.buffer(), from, out.buffer(), 0, bytes);
            t.queue().submit([enc.finish()]);
        })?;
    }
    Ok(out)
}
