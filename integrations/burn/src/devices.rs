//! Making the ranks' wgpu devices once, for burn and the engine together.
//!
//! cubecl-wgpu lets a wgpu device be registered with it once, and burn
//! then sees it as one burn `Device`; the engine takes the same device and
//! queue through `World::from_devices`. So each rank's device is made here,
//! the way cubecl makes its own (every adapter feature but
//! `MAPPABLE_PRIMARY_BUFFERS`, the adapter's limits, memory-usage hints),
//! and handed to both. One device per rank, as burn would see one GPU per
//! rank: the engine carries hops between them through host memory both
//! devices import, where the driver can (else through host staging).

use burn_tensor::wgpu::{WgpuSetup, wgpu};

use crate::error::{Error, Result};

/// The adapter burn's ranks run on: the first whose name contains
/// `WGPU_ADAPTER_NAME` (case-insensitive) where that is set, preferring
/// real GPUs to CPU adapters, as the engine's own `World::new` chooses.
pub(crate) fn pick_adapter() -> Result<(wgpu::Instance, wgpu::Adapter)> {
    let desc = wgpu::InstanceDescriptor::new_without_display_handle().with_env();
    let backends = desc.backends;
    let instance = wgpu::Instance::new(desc);
    let mut adapters = pollster::block_on(instance.enumerate_adapters(backends));
    let name = std::env::var("WGPU_ADAPTER_NAME").ok();
    if let Some(name) = &name {
        let needle = name.to_lowercase();
        adapters.retain(|a| a.get_info().name.to_lowercase().contains(&needle));
    }
    let is_cpu = |a: &wgpu::Adapter| a.get_info().device_type == wgpu::DeviceType::Cpu;
    if adapters.iter().any(|a| !is_cpu(a)) {
        adapters.retain(|a| !is_cpu(a));
    }
    match adapters.into_iter().next() {
        Some(adapter) => Ok((instance, adapter)),
        None => Err(Error::setup(format!(
            "no wgpu adapter on backends {backends:?}{}",
            name.map(|n| format!(" with a name containing {n:?}"))
                .unwrap_or_default()
        ))),
    }
}

/// `ranks` devices (and queues) on `adapter`, each requested as cubecl-wgpu
/// requests the devices it makes itself.
pub(crate) fn request_setups(
    instance: &wgpu::Instance,
    adapter: &wgpu::Adapter,
    ranks: usize,
) -> Result<Vec<WgpuSetup>> {
    (0..ranks)
        .map(|rank| {
            // Through the engine's helper: a device able to import host
            // memory, so that hops between the ranks' devices go through
            // memory both map (it falls back to `request_device`).
            let (device, queue) = wgpu_collectives::request_device(adapter, &descriptor(adapter))
                .map_err(|e| {
                Error::setup(format!(
                    "rank {rank}: {} refused a device: {e}",
                    adapter.get_info().name
                ))
            })?;
            Ok(WgpuSetup {
                instance: instance.clone(),
                adapter: adapter.clone(),
                device,
                queue,
                backend: adapter.get_info().backend,
            })
        })
        .collect()
}

/// What cubecl-wgpu asks of a device it makes (`backend/wgsl.rs`): burn's
/// kernels are compiled for the adapter's features, so the device must
/// have them all.
#[allow(unsafe_code)]
fn descriptor(adapter: &wgpu::Adapter) -> wgpu::DeviceDescriptor<'static> {
    wgpu::DeviceDescriptor {
        label: Some("wgpu-collectives-burn rank"),
        required_features: adapter
            .features()
            .difference(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS),
        required_limits: adapter.limits(),
        // SAFETY: the opt-in cubecl-wgpu makes for every device it creates
        // (its passthrough shaders); burn's kernels on this device come from
        // cubecl as they would on a device cubecl made, and the engine uses
        // no experimental feature.
        experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
        memory_hints: wgpu::MemoryHints::MemoryUsage,
        trace: wgpu::Trace::Off,
    }
}
