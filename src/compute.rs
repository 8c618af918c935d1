//! Compute ops (matmul, element-wise, sum over rows) as WGSL kernels, for
//! the graph executor: the work that collectives overlap with.
//!
//! f32 only: these exist to give graphs real compute to schedule, not to
//! be a tensor library. Every kernel sums in a fixed order, so results are
//! the same bits on every rank and in every schedule.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::api::tensor::{DType, Tensor};
use crate::device::{RankDevice, lock};
use crate::error::{Error, Result};

const SOURCE: &str = include_str!("../shaders/compute.wgsl");

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
/// freed, so an op rarely sees the same buffers twice: a cache keyed on
/// buffers still made 942 bind groups over 22 repeats of a 3-layer
/// training step on 2 ranks, while keeping stale buffers alive. A
/// per-graph buffer plan would fix both.
#[derive(Default)]
pub(crate) struct Compute {
    pipelines: Mutex<Option<Arc<Pipelines>>>,
    params: Mutex<HashMap<Dims, wgpu::Buffer>>,
}

struct Pipelines {
    layout: wgpu::BindGroupLayout,
    matmul: wgpu::ComputePipeline,
    elementwise: wgpu::ComputePipeline,
    sum_rows: wgpu::ComputePipeline,
}

fn f32_only(dev: &RankDevice, t: &Tensor) -> Result<()> {
    if t.dtype() != DType::F32 {
        return Err(Error::invalid(
            dev.rank,
            format!("compute ops take f32 tensors, got {}", t.dtype()),
        ));
    }
    Ok(())
}

impl Compute {
    fn pipelines(&self, dev: &RankDevice) -> Result<Arc<Pipelines>> {
        let mut slot = lock(&self.pipelines);
        if let Some(p) = slot.as_ref() {
            return Ok(p.clone());
        }
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
        dev.count_resource();
        let made = dev.scoped("compiling shaders/compute.wgsl", |d| {
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
        })?;
        let made = Arc::new(made);
        *slot = Some(made.clone());
        Ok(made)
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        dev: &Arc<RankDevice>,
        which: fn(&Pipelines) -> &wgpu::ComputePipeline,
        dims: Dims,
        a: &Tensor,
        b: &Tensor,
        out_len: usize,
        groups: (u32, u32),
    ) -> Result<Tensor> {
        let p = self.pipelines(dev)?;
        let out = Tensor::output(dev, DType::F32, out_len)?;
        if out_len == 0 {
            return Ok(out);
        }
        let uniform = self.params(dev, dims)?;
        let bind = Self::bind(dev, &p, [&uniform, a.buffer(), b.buffer(), out.buffer()])?;
        let mut enc = dev.encoder();
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            pass.set_pipeline(which(&p));
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(groups.0.max(1), groups.1.max(1), 1);
        }
        dev.submit(enc, None)?;
        Ok(out)
    }

    /// The uniform buffer holding `dims`, made (mapped, so without a
    /// staging copy) the first time these parameters come.
    fn params(&self, dev: &RankDevice, dims: Dims) -> Result<wgpu::Buffer> {
        if let Some(b) = lock(&self.params).get(&dims) {
            return Ok(b.clone());
        }
        let uniform = dev.create_buffer("compute dims", 32, wgpu::BufferUsages::UNIFORM, true)?;
        {
            let mut view = uniform
                .get_mapped_range_mut(..)
                .map_err(|e| Error::device(dev.rank, None, format!("compute dims view: {e}")))?;
            view.copy_from_slice(bytemuck::bytes_of(&dims));
        }
        uniform.unmap();
        let mut params = lock(&self.params);
        if params.len() >= PARAMS_CACHE {
            params.clear();
        }
        params.insert(dims, uniform.clone());
        Ok(uniform)
    }

    /// The bind group of one op: parameters, `a`, `b`, output.
    fn bind(
        dev: &RankDevice,
        p: &Pipelines,
        buffers: [&wgpu::Buffer; 4],
    ) -> Result<wgpu::BindGroup> {
        let [uniform, a, b, out] = buffers;
        dev.count_resource();
        dev.scoped("binding a compute op", |d| {
            d.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &p.layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: uniform.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: a.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 2,
                        resource: b.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 3,
                        resource: out.as_entire_binding(),
                    },
                ],
            })
        })
    }

    /// `a @ b` for 2-D `a` (`[m, k]`, or `[k, m]` transposed) and `b`
    /// (`[k, n]`, or `[n, k]` transposed).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &self,
        dev: &Arc<RankDevice>,
        a: &Tensor,
        b: &Tensor,
        m: usize,
        k: usize,
        n: usize,
        ta: bool,
        tb: bool,
    ) -> Result<Tensor> {
        f32_only(dev, a)?;
        f32_only(dev, b)?;
        let what = || format!("matmul of [{m}, {k}] x [{k}, {n}]");
        let (ak, kn) = (product(dev, m, k, &what)?, product(dev, k, n, &what)?);
        if a.len() != ak || b.len() != kn {
            return Err(Error::invalid(
                dev.rank,
                format!("{} on {} and {} elements", what(), a.len(), b.len()),
            ));
        }
        let out_len = product(dev, m, n, &what)?;
        let (m32, n32, k32) = (
            dim(dev, m, &what)?,
            dim(dev, n, &what)?,
            dim(dev, k, &what)?,
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
        self.run(
            dev,
            |p| &p.matmul,
            dims,
            a,
            b,
            out_len,
            (n32.div_ceil(8), m32.div_ceil(8)),
        )
    }

    /// An element-wise op (`b` is ignored by the unary ones; pass `a`).
    pub(crate) fn elementwise(
        &self,
        dev: &Arc<RankDevice>,
        op: Elementwise,
        a: &Tensor,
        b: &Tensor,
        factor: f32,
    ) -> Result<Tensor> {
        f32_only(dev, a)?;
        f32_only(dev, b)?;
        if b.len() != a.len() {
            return Err(Error::invalid(
                dev.rank,
                format!("element-wise op on {} and {} elements", a.len(), b.len()),
            ));
        }
        let len = a.len();
        let len32 = dim(dev, len, &|| {
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
        let x = groups.min(dev.limits.max_compute_workgroups_per_dimension);
        self.run(
            dev,
            |p| &p.elementwise,
            dims,
            a,
            b,
            len,
            (x, groups.div_ceil(x.max(1))),
        )
    }

    /// Sum over the `m` rows of `a` (`[m, n]`): `[n]`.
    pub(crate) fn sum_rows(
        &self,
        dev: &Arc<RankDevice>,
        a: &Tensor,
        m: usize,
        n: usize,
    ) -> Result<Tensor> {
        f32_only(dev, a)?;
        let what = || format!("sum over the rows of [{m}, {n}]");
        if product(dev, m, n, &what)? != a.len() {
            return Err(Error::invalid(
                dev.rank,
                format!("{} on {} elements", what(), a.len()),
            ));
        }
        let (m32, n32) = (dim(dev, m, &what)?, dim(dev, n, &what)?);
        let dims = Dims {
            m: m32,
            n: n32,
            k: 0,
            flags: 0,
            factor: 0,
            len: 0,
            pad: [0; 2],
        };
        self.run(dev, |p| &p.sum_rows, dims, a, a, n, (n32.div_ceil(64), 1))
    }
}

/// `a * b`, or an invalid argument naming `what` when it overflows.
fn product(dev: &RankDevice, a: usize, b: usize, what: &dyn Fn() -> String) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::invalid(dev.rank, format!("{}: {a} x {b} overflows", what())))
}

/// A dimension as the kernels take it (`u32`), or an invalid argument.
fn dim(dev: &RankDevice, v: usize, what: &dyn Fn() -> String) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::invalid(
            dev.rank,
            format!("{}: {v} does not fit the kernels' 32-bit indices", what()),
        )
    })
}
