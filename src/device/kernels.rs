//! The reduction kernel, specialised per dtype and operator, and its pipeline cache.
//!
//! One WGSL source (`shaders/reduce.wgsl`) serves every dtype: a small dtype
//! prelude is prepended, and the operator and the Avg divisor are pipeline
//! override constants, so the driver folds the branches away. Pipelines are
//! made once per (dtype, op, divisor) per device and cached: creating one
//! costs milliseconds (lavapipe compiles with LLVM), which no collective
//! should pay twice.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::device::{RankDevice, lock};
use crate::dtype::DType;
use crate::error::Result;
use crate::op::ReduceOp;

const REDUCE: &str = include_str!("../../shaders/reduce.wgsl");
/// The fold step both reduction kernels share (`shaders/fold.wgsl`).
pub(crate) const FOLD: &str = include_str!("../../shaders/fold.wgsl");
const PATCH_HALF: &str = include_str!("../../shaders/patch_half.wgsl");
/// Invocations per workgroup, as `@workgroup_size` in `shaders/reduce.wgsl`.
const WORKGROUP: u64 = 256;

/// The dtype's prelude (`shaders/dtype_*.wgsl`) and its order
/// (`shaders/order_*.wgsl`), which the fold step builds on.
pub(crate) fn prelude(dtype: DType) -> String {
    let (types, order) = match dtype {
        DType::F32 => (include_str!("../../shaders/dtype_f32.wgsl"), ORDER_FLOAT),
        DType::F16 => (include_str!("../../shaders/dtype_f16.wgsl"), ORDER_FLOAT),
        DType::BF16 => (include_str!("../../shaders/dtype_bf16.wgsl"), ORDER_FLOAT),
        DType::I32 => (include_str!("../../shaders/dtype_i32.wgsl"), ORDER_INT),
        DType::U32 => (include_str!("../../shaders/dtype_u32.wgsl"), ORDER_INT),
    };
    format!("{types}\n{order}")
}

const ORDER_FLOAT: &str = include_str!("../../shaders/order_float.wgsl");
const ORDER_INT: &str = include_str!("../../shaders/order_int.wgsl");

/// The WGSL of the reduction kernel for `dtype`, as the engine compiles it:
/// entry point `main`, bindings 0 (`dst`, read-write) and 1 (`src`), override
/// constants `OP` (0 sum, 1 prod, 2 min, 3 max, 4-6 bitwise and/or/xor) and
/// `DIVISOR`; 256 invocations per workgroup, each striding over 16-byte
/// units (8 bytes for 16-bit types); dispatch [`reduction_workgroups`]
/// workgroups. For benchmarks and tooling.
pub fn reduction_wgsl(dtype: DType) -> String {
    format!("{}\n{FOLD}\n{REDUCE}", prelude(dtype))
}

/// Units each invocation of the reduction kernel handles on a CPU adapter,
/// when the world was not tuned (a tuned world times the shapes,
/// `runtime/kernel_shape.rs`). There a workgroup costs a scheduling round
/// trip of the driver's thread pool, so one unit per invocation loses; but
/// a long grid-stride loop leaves a ring's 1 MiB slice to a handful of
/// workgroups that the pool cannot balance, each striding through memory.
/// A few units per invocation won in the all-reduce benchmark on lavapipe
/// (figures in docs/performance.md); never measured on a GPU.
const CPU_UNITS_PER_INVOCATION: u64 = 4;

/// Workgroups to dispatch for a `bytes`-byte reduction of `dtype` on an
/// adapter of `device_type` that allows `max_groups` per dimension, by the
/// untuned rule: one unit (16 bytes, 8 for 16-bit types) per invocation on
/// GPUs, a few on CPU adapters; the kernel's grid-stride loop covers
/// whatever is left.
pub fn reduction_workgroups(
    device_type: wgpu::DeviceType,
    dtype: DType,
    bytes: u64,
    max_groups: u32,
) -> u32 {
    workgroups(rule_units(device_type), dtype, bytes, max_groups)
}

/// Units per invocation by the untuned rule.
fn rule_units(device_type: wgpu::DeviceType) -> u64 {
    match device_type {
        wgpu::DeviceType::Cpu => CPU_UNITS_PER_INVOCATION,
        _ => 1,
    }
}

/// Workgroups for `bytes` of `dtype` at `per` units per invocation.
pub(crate) fn workgroups(per: u64, dtype: DType, bytes: u64, max_groups: u32) -> u32 {
    let units = bytes.checked_div(dtype.unit_bytes()).unwrap_or(0);
    let groups = units.div_ceil(WORKGROUP.saturating_mul(per.max(1)));
    groups.clamp(1, u64::from(max_groups.max(1))) as u32
}

/// A reduction pipeline ready to dispatch.
#[derive(Clone)]
pub(crate) struct Reducer {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    dtype: DType,
    binds: Arc<Mutex<BindCache>>,
    units: Arc<AtomicU64>,
}

#[derive(Default)]
pub(crate) struct Kernels {
    modules: Mutex<HashMap<DType, wgpu::ShaderModule>>,
    layout: Mutex<Option<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>>,
    reducers: Mutex<HashMap<(DType, u32, u32), Reducer>>,
    binds: Arc<Mutex<BindCache>>,
    /// `shaders/patch_half.wgsl`, made on first use.
    patch: Mutex<Option<wgpu::ComputePipeline>>,
    /// Units per invocation, as timed on this device; 0: by the rule.
    units: Arc<AtomicU64>,
}

/// (dst, dst offset, src, src offset, bytes): the windows a reduction binds.
type BindKey = (wgpu::Buffer, u64, wgpu::Buffer, u64, u64);

/// Bind groups recently used, oldest evicted first: in steady state the
/// same windows of the same (pooled) buffers recur, and a collective then
/// creates no wgpu resource at all. A cached bind group keeps its buffers
/// alive, which the bound on entries keeps small.
#[derive(Default)]
pub(crate) struct BindCache {
    groups: HashMap<BindKey, wgpu::BindGroup>,
    order: VecDeque<BindKey>,
}

/// Bind groups kept per device.
const BIND_CACHE: usize = 512;

impl BindCache {
    fn get(&self, key: &BindKey) -> Option<wgpu::BindGroup> {
        self.groups.get(key).cloned()
    }

    fn put(&mut self, key: BindKey, group: wgpu::BindGroup) {
        if self.order.len() == BIND_CACHE {
            if let Some(old) = self.order.pop_front() {
                self.groups.remove(&old);
            }
        }
        self.order.push_back(key.clone());
        self.groups.insert(key, group);
    }

    /// Drops every bind group that binds one of `buffers`: a cached group
    /// keeps its buffers alive, so without this a buffer the engine let go
    /// of would stay resident until 512 later bindings pushed it out.
    fn forget(&mut self, buffers: &[wgpu::Buffer]) {
        let bound = |k: &BindKey| buffers.iter().any(|b| *b == k.0 || *b == k.2);
        self.order.retain(|k| !bound(k));
        self.groups.retain(|k, _| !bound(k));
    }
}

impl Kernels {
    /// Makes the reduction kernel take `units` units per invocation (as
    /// timed on this device); 0 goes back to the rule.
    pub(crate) fn set_units_per_invocation(&self, units: u64) {
        self.units.store(units, Ordering::Relaxed);
    }

    /// The pipeline computing `dst = op(dst, src)`, then dividing by
    /// `divisor` when it is non-zero.
    pub(crate) fn reducer(
        &self,
        dev: &RankDevice,
        dtype: DType,
        op: ReduceOp,
        divisor: u32,
    ) -> Result<Reducer> {
        let key = (dtype, op.shader_code(), divisor);
        if let Some(r) = lock(&self.reducers).get(&key) {
            return Ok(r.clone());
        }
        let (layout, pipeline_layout) = self.layouts(dev)?;
        let module = self.module(dev, dtype)?;
        let constants = [("OP", f64::from(key.1)), ("DIVISOR", f64::from(divisor))];
        dev.count_resource();
        let pipeline = dev.scoped(&format!("compiling the {dtype} {op} reduction"), |d| {
            d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("reduce"),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            })
        })?;
        let r = Reducer {
            pipeline,
            layout,
            dtype,
            binds: self.binds.clone(),
            units: self.units.clone(),
        };
        lock(&self.reducers).insert(key, r.clone());
        Ok(r)
    }

    /// Records a write of the low half-word of `src`'s first word over the
    /// low half-word of `dst`'s word at byte `at` (a multiple of 4),
    /// keeping its high half (see `shaders/patch_half.wgsl`). Not a hot
    /// path: the last element of a 16-bit view of odd length.
    pub(crate) fn patch_half(
        &self,
        dev: &RankDevice,
        enc: &mut wgpu::CommandEncoder,
        dst: &wgpu::Buffer,
        at: u64,
        src: &wgpu::Buffer,
    ) -> Result<()> {
        let (layout, pipeline_layout) = self.layouts(dev)?;
        let pipeline = {
            let mut slot = lock(&self.patch);
            match slot.as_ref() {
                Some(p) => p.clone(),
                None => {
                    dev.count_resource();
                    let p = dev.scoped("compiling shaders/patch_half.wgsl", |d| {
                        let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some("patch_half.wgsl"),
                            source: wgpu::ShaderSource::Wgsl(PATCH_HALF.into()),
                        });
                        d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                            label: Some("patch_half"),
                            layout: Some(&pipeline_layout),
                            module: &module,
                            entry_point: Some("main"),
                            compilation_options: Default::default(),
                            cache: None,
                        })
                    })?;
                    *slot = Some(p.clone());
                    p
                }
            }
        };
        // Bound from an aligned offset at or below the word, so the index
        // within the binding is below the alignment in words.
        let align = u64::from(dev.limits.min_storage_buffer_offset_alignment.max(4));
        let base = at.saturating_sub(at.checked_rem(align).unwrap_or(0));
        let index = at.saturating_sub(base) / 4;
        let size = dst.size().saturating_sub(base).min(align.saturating_mul(2)) & !3;
        let group = dev.scoped("binding a half-word patch", |d| {
            d.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("patch_half"),
                layout: &layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: dst,
                            offset: base,
                            size: wgpu::BufferSize::new(size),
                        }),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: src,
                            offset: 0,
                            size: wgpu::BufferSize::new(16),
                        }),
                    },
                ],
            })
        })?;
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &group, &[]);
        // `index` is below the alignment in words (at most 64 on any adapter).
        pass.dispatch_workgroups(u32::try_from(index.saturating_add(1)).unwrap_or(1), 1, 1);
        Ok(())
    }

    /// Forgets the cached bind groups of `buffers`, which are being dropped.
    pub(crate) fn forget(&self, buffers: &[wgpu::Buffer]) {
        if !buffers.is_empty() {
            lock(&self.binds).forget(buffers);
        }
    }

    fn module(&self, dev: &RankDevice, dtype: DType) -> Result<wgpu::ShaderModule> {
        if let Some(m) = lock(&self.modules).get(&dtype) {
            return Ok(m.clone());
        }
        let source = reduction_wgsl(dtype);
        dev.count_resource();
        let m = dev.scoped(&format!("compiling shaders/reduce.wgsl for {dtype}"), |d| {
            d.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("reduce.wgsl"),
                source: wgpu::ShaderSource::Wgsl(source.into()),
            })
        })?;
        lock(&self.modules).insert(dtype, m.clone());
        Ok(m)
    }

    fn layouts(&self, dev: &RankDevice) -> Result<(wgpu::BindGroupLayout, wgpu::PipelineLayout)> {
        let mut slot = lock(&self.layout);
        if let Some(l) = slot.as_ref() {
            return Ok(l.clone());
        }
        let entry = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        dev.count_resource();
        let made = dev.scoped("creating the reduction layouts", |d| {
            let bgl = d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("reduce"),
                entries: &[entry(0, false), entry(1, true)],
            });
            let pl = d.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("reduce"),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
            (bgl, pl)
        })?;
        *slot = Some(made.clone());
        Ok(made)
    }
}

impl Reducer {
    /// Records `dst[dst_off..][..bytes] = op(dst, src[src_off..][..bytes])`.
    /// Offsets must be multiples of the adapter's storage offset alignment,
    /// `bytes` a multiple of 16 and at most one slice; the schedules
    /// guarantee all three.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn encode(
        &self,
        dev: &RankDevice,
        enc: &mut wgpu::CommandEncoder,
        dst: &wgpu::Buffer,
        dst_off: u64,
        src: &wgpu::Buffer,
        src_off: u64,
        bytes: u64,
        stamps: Option<(wgpu::QuerySet, u32)>,
    ) -> Result<()> {
        let key = (dst.clone(), dst_off, src.clone(), src_off, bytes);
        let cached = lock(&self.binds).get(&key);
        let bind = match cached {
            Some(b) => b,
            None => self.bind(dev, key)?,
        };
        let per = match self.units.load(Ordering::Relaxed) {
            0 => rule_units(dev.info.device_type),
            timed => timed,
        };
        let groups = workgroups(
            per,
            self.dtype,
            bytes,
            dev.limits.max_compute_workgroups_per_dimension,
        );
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: stamps
                .as_ref()
                .map(|(set, i)| wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: Some(*i),
                    end_of_pass_write_index: Some(i.saturating_add(1)),
                }),
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups, 1, 1);
        Ok(())
    }

    /// Makes (and caches) the bind group for one reduction's windows.
    fn bind(&self, dev: &RankDevice, key: BindKey) -> Result<wgpu::BindGroup> {
        let (dst, dst_off, src, src_off, bytes) = &key;
        let size = wgpu::BufferSize::new(*bytes);
        dev.count_resource();
        let bind = dev.scoped("binding a reduction", |d| {
            d.create_bind_group(&wgpu::BindGroupDescriptor {
                label: None,
                layout: &self.layout,
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: dst,
                            offset: *dst_off,
                            size,
                        }),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: src,
                            offset: *src_off,
                            size,
                        }),
                    },
                ],
            })
        })?;
        lock(&self.binds).put(key, bind.clone());
        Ok(bind)
    }
}
