//! The shared-device reduction kernel (`shaders/direct_reduce.wgsl`): n
//! windows read, one result written to m windows, all bound at once.
//!
//! WGSL cannot index bindings, so the n + m bindings and the unrolled fold
//! are generated per (n, m) and prepended to the template, as the dtype
//! preludes are; pipelines and bind groups are cached, so a collective in
//! steady state creates no wgpu resource.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use crate::device::{RankDevice, lock};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;

const TEMPLATE: &str = include_str!("../../shaders/direct_reduce.wgsl");
/// Invocations per workgroup, as `@workgroup_size` in the template.
const WORKGROUP: u64 = 64;
/// Bind groups kept per pipeline.
const BIND_CACHE: usize = 256;

/// A window of a buffer: (buffer, byte offset, bytes).
pub(crate) type Window = (wgpu::Buffer, u64, u64);

/// What a kernel folds: `inputs` windows (at least 2) into `outputs`, in
/// the given order (see `generated`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Fold {
    pub inputs: usize,
    pub outputs: usize,
    pub order: Order,
}

/// The order a kernel folds its inputs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Order {
    /// Binding order, every unit alike; every output gets the result.
    Bound,
    /// An all-reduce's parts (starting on multiples of `align` 16-byte
    /// blocks): part c from input c+1 round to input c, one workgroup row
    /// per part; every output gets the result.
    Parts { align: u32 },
    /// A reduce-scatter's chunks (each an output's length): chunk c from
    /// input c+1 round to input c, into output c only, one row per chunk.
    Chunks,
}

/// (dtype, operator code, divisor, fold).
type Key = (DType, u32, u32, Fold);

/// Bind groups recently made, with the windows they bind (and a hash of them).
type BindCache = VecDeque<(u64, Vec<Window>, wgpu::BindGroup)>;

/// The pipelines of the shared-device reduction, per device.
#[derive(Default)]
pub(crate) struct DirectKernels {
    pipelines: Mutex<HashMap<Key, DirectReducer>>,
}

/// One (dtype, op, divisor, n, m) pipeline, ready to dispatch.
#[derive(Clone)]
pub(crate) struct DirectReducer {
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
    inputs: usize,
    outputs: usize,
    unit_bytes: u64,
    binds: Arc<Mutex<BindCache>>,
}

/// The generated part of the kernel: bindings, `run` and `store`.
///
/// Rotating ([`Order::Parts`], [`Order::Chunks`]), one dispatch covers a
/// whole collective, a workgroup row per part: for an all-reduce the
/// kernel cuts the bound length into n parts as `algo::part_words` does
/// (in whole blocks, since ceil(ceil(w/4)/n) = ceil(w/(4n))), for a
/// reduce-scatter each chunk is an output's length; part c is folded from
/// input c+1 round to input c. A dispatch costs tens of microseconds on
/// lavapipe, so one instead of n matters for small sizes.
fn generated(inputs: usize, outputs: usize, order: Order, unit_bytes: u64) -> String {
    let mut s = String::new();
    let binding = |s: &mut String, at: usize, name: &str| {
        let _ = writeln!(
            s,
            "@group(0) @binding({at}) var<storage, read_write> {name}: array<U>;"
        );
    };
    for k in 0..inputs {
        binding(&mut s, k, &format!("a{k}"));
    }
    for j in 0..outputs {
        binding(&mut s, inputs.saturating_add(j), &format!("o{j}"));
    }
    let step = |k: usize| {
        if k.saturating_add(1) == inputs {
            "last"
        } else {
            "step"
        }
    };
    // The input at fold position k of row c: (c + k) mod n, by selects.
    // Every invocation loads all n inputs unconditionally (it needs each
    // once anyway): choosing the binding at run time instead (a switch)
    // moved bytes a third slower on lavapipe.
    let rotated = |s: &mut String| {
        for k in 0..inputs {
            let _ = writeln!(s, "    let v{k} = a{k}[i];");
        }
        let pick = |k: usize| {
            let mut e = "v0".to_string();
            for j in 1..inputs {
                e = format!("select({e}, v{j}, (c + {k}u) % {inputs}u == {j}u)");
            }
            e
        };
        let _ = writeln!(s, "    var acc = {};", pick(1));
        for k in 2..=inputs {
            let _ = writeln!(
                s,
                "    acc = {}(acc, {});",
                step(k.saturating_sub(1)),
                pick(k)
            );
        }
    };
    match order {
        Order::Bound => {
            s.push_str("fn fold(i: u32) -> U {\n    var acc = a0[i];\n");
            for k in 1..inputs {
                let _ = writeln!(s, "    acc = {}(acc, a{k}[i]);", step(k));
            }
            s.push_str(
                "    return acc;\n}\n\
                 fn run(gid: vec3<u32>, groups: vec3<u32>, wid: vec3<u32>) {\n\
                 \x20   let i = gid.x + gid.y * groups.x * 64u;\n\
                 \x20   if i < arrayLength(&o0) {\n        store(i, fold(i));\n    }\n}\n",
            );
        }
        Order::Parts { align } => {
            // In 16-byte blocks (a unit is a block, or half of one for the
            // 16-bit types): the bound window is the tensor's whole blocks.
            let upb = 16u64.checked_div(unit_bytes).unwrap_or(1);
            let _ = writeln!(
                s,
                "fn run(gid: vec3<u32>, groups: vec3<u32>, wid: vec3<u32>) {{\n    \
                 let per = (arrayLength(&a0) / {upb}u + {m}u) / {inputs}u;\n    \
                 let q = (per + {a}u) / {align}u * {align}u * {upb}u;\n    \
                 let c = wid.y;\n    let j = gid.x + gid.z * groups.x * 64u;\n    \
                 let i = c * q + j;\n    \
                 if j >= q || i >= arrayLength(&o0) {{\n        return;\n    }}",
                m = inputs.saturating_sub(1),
                a = align.saturating_sub(1),
            );
            rotated(&mut s);
            s.push_str("    store(i, acc);\n}\n");
        }
        Order::Chunks => {
            // Output c is chunk c: its length is the chunk's.
            s.push_str(
                "fn run(gid: vec3<u32>, groups: vec3<u32>, wid: vec3<u32>) {\n    \
                 let q = arrayLength(&o0);\n    \
                 let c = wid.y;\n    let j = gid.x + gid.z * groups.x * 64u;\n    \
                 let i = c * q + j;\n    \
                 if j >= q {\n        return;\n    }\n",
            );
            rotated(&mut s);
            s.push_str("    switch c {\n");
            for j in 0..outputs {
                let _ = writeln!(s, "        case {j}u: {{ o{j}[j] = acc; }}");
            }
            s.push_str("        default: {}\n    }\n}\n");
        }
    }
    s.push_str("fn store(i: u32, v: U) {\n");
    for j in 0..outputs {
        let _ = writeln!(s, "    o{j}[i] = v;");
    }
    s.push_str("}\n");
    s
}

impl DirectKernels {
    /// The kernel applying `fold` with `op`; the last step divides by
    /// `divisor` when it is non-zero. A count the adapter cannot bind is
    /// the caller's to avoid ([`fits`]).
    pub(crate) fn get(
        &self,
        dev: &RankDevice,
        dtype: DType,
        op: ReduceOp,
        divisor: u32,
        fold: Fold,
    ) -> Result<DirectReducer> {
        let key = (dtype, op.shader_code(), divisor, fold);
        let Fold {
            inputs,
            outputs,
            order,
        } = fold;
        if let Some(r) = lock(&self.pipelines).get(&key) {
            return Ok(r.clone());
        }
        if inputs < 2 || outputs < 1 || !fits(dev, inputs, outputs) {
            return Err(Error::device(
                dev.rank,
                None,
                format!(
                    "a direct reduction of {inputs} inputs into {outputs} outputs cannot be bound here"
                ),
            ));
        }
        let source = format!(
            "{}\n{}\n{}\n{}",
            crate::device::kernels::prelude(dtype),
            crate::device::kernels::FOLD,
            generated(inputs, outputs, order, dtype.unit_bytes()),
            TEMPLATE
        );
        let entries: Vec<wgpu::BindGroupLayoutEntry> = (0..inputs.saturating_add(outputs))
            .map(|b| wgpu::BindGroupLayoutEntry {
                binding: u32::try_from(b).unwrap_or(u32::MAX),
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: false },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            })
            .collect();
        let constants = [("OP", f64::from(key.1)), ("DIVISOR", f64::from(divisor))];
        dev.count_resource();
        let (pipeline, layout) = dev.scoped(
            &format!("compiling shaders/direct_reduce.wgsl for {inputs} {dtype} inputs ({op})"),
            |d| {
                let module = d.create_shader_module(wgpu::ShaderModuleDescriptor {
                    label: Some("direct_reduce.wgsl"),
                    source: wgpu::ShaderSource::Wgsl(source.into()),
                });
                let layout = d.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                    label: Some("direct_reduce"),
                    entries: &entries,
                });
                let pl = d.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                    label: Some("direct_reduce"),
                    bind_group_layouts: &[Some(&layout)],
                    immediate_size: 0,
                });
                let pipeline = d.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some("direct_reduce"),
                    layout: Some(&pl),
                    module: &module,
                    entry_point: Some("main"),
                    compilation_options: wgpu::PipelineCompilationOptions {
                        constants: &constants,
                        zero_initialize_workgroup_memory: false,
                    },
                    cache: None,
                });
                (pipeline, layout)
            },
        )?;
        let r = DirectReducer {
            pipeline,
            layout,
            inputs,
            outputs,
            unit_bytes: dtype.unit_bytes(),
            binds: Arc::default(),
        };
        lock(&self.pipelines).insert(key, r.clone());
        Ok(r)
    }
}

/// A compute pass, with GPU timestamps around it when profiling.
fn pass_descriptor(stamps: Option<&(wgpu::QuerySet, u32)>) -> wgpu::ComputePassDescriptor<'_> {
    wgpu::ComputePassDescriptor {
        label: None,
        timestamp_writes: stamps.map(|(set, i)| wgpu::ComputePassTimestampWrites {
            query_set: set,
            beginning_of_pass_write_index: Some(*i),
            end_of_pass_write_index: Some(i.saturating_add(1)),
        }),
    }
}

/// Whether `inputs + outputs` storage buffers can be bound in one pass here.
pub(crate) fn fits(dev: &RankDevice, inputs: usize, outputs: usize) -> bool {
    inputs.saturating_add(outputs) <= dev.limits.max_storage_buffers_per_shader_stage as usize
}

impl DirectReducer {
    /// Records the reduction of `windows` (the inputs in fold order, then
    /// the outputs; all the same size, a multiple of 16 bytes, at offsets
    /// the adapter can bind) in one compute pass.
    pub(crate) fn encode(
        &self,
        dev: &RankDevice,
        enc: &mut wgpu::CommandEncoder,
        windows: &[Window],
        stamps: Option<(wgpu::QuerySet, u32)>,
    ) -> Result<()> {
        let Some(&(_, _, bytes)) = windows.first() else {
            return Ok(());
        };
        if windows.len() != self.inputs.saturating_add(self.outputs) {
            return Err(Error::device(
                dev.rank,
                None,
                format!(
                    "a direct reduction of {} inputs and {} outputs given {} windows",
                    self.inputs,
                    self.outputs,
                    windows.len()
                ),
            ));
        }
        let bind = self.bind(dev, windows)?;
        let units = bytes.checked_div(self.unit_bytes).unwrap_or(0);
        let groups = units.div_ceil(WORKGROUP);
        if groups == 0 {
            return Ok(());
        }
        let max = u64::from(dev.limits.max_compute_workgroups_per_dimension.max(1));
        let x = groups.min(max);
        let y = groups.div_ceil(x);
        let mut pass = enc.begin_compute_pass(&pass_descriptor(stamps.as_ref()));
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(
            u32::try_from(x).unwrap_or(u32::MAX),
            u32::try_from(y).unwrap_or(u32::MAX),
            1,
        );
        Ok(())
    }

    /// Records a rotating reduction (see `generated`): `parts` rows of
    /// `part_units` units each, one workgroup row per part (a row longer
    /// than the adapter allows goes on in z).
    pub(crate) fn encode_parts(
        &self,
        dev: &RankDevice,
        enc: &mut wgpu::CommandEncoder,
        windows: &[Window],
        parts: usize,
        part_units: u64,
        stamps: Option<(wgpu::QuerySet, u32)>,
    ) -> Result<()> {
        let bind = self.bind(dev, windows)?;
        let groups = part_units.div_ceil(WORKGROUP);
        if groups == 0 {
            return Ok(());
        }
        // A part longer than one dimension's workgroups (65535 x 64 units
        // on most GPUs: a 256 MiB all-reduce over 4 ranks) continues in z.
        let max = u64::from(dev.limits.max_compute_workgroups_per_dimension.max(1));
        let x = groups.min(max);
        let z = groups.div_ceil(x);
        let mut pass = enc.begin_compute_pass(&pass_descriptor(stamps.as_ref()));
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(
            u32::try_from(x).unwrap_or(u32::MAX),
            u32::try_from(parts).unwrap_or(u32::MAX),
            u32::try_from(z).unwrap_or(u32::MAX),
        );
        Ok(())
    }

    /// The bind group of `windows`, from the cache when they were bound before.
    fn bind(&self, dev: &RankDevice, windows: &[Window]) -> Result<wgpu::BindGroup> {
        let mut h = DefaultHasher::new();
        windows.hash(&mut h);
        let hash = h.finish();
        {
            let cache = lock(&self.binds);
            if let Some((_, _, g)) = cache
                .iter()
                .find(|(k, w, _)| *k == hash && w.as_slice() == windows)
            {
                return Ok(g.clone());
            }
        }
        let entries: Vec<wgpu::BindGroupEntry> = windows
            .iter()
            .enumerate()
            .map(|(b, (buffer, offset, size))| wgpu::BindGroupEntry {
                binding: u32::try_from(b).unwrap_or(u32::MAX),
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer,
                    offset: *offset,
                    size: wgpu::BufferSize::new(*size),
                }),
            })
            .collect();
        dev.count_resource();
        let group = dev.scoped("binding a direct reduction", |d| {
            d.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("direct_reduce"),
                layout: &self.layout,
                entries: &entries,
            })
        })?;
        let mut cache = lock(&self.binds);
        if cache.len() >= BIND_CACHE {
            cache.pop_front();
        }
        cache.push_back((hash, windows.to_vec(), group.clone()));
        Ok(group)
    }
}
