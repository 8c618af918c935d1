//! How a world comes to be, whichever way it is made (`World::new`,
//! `World::from_devices`, `World::from_mpi`): the configuration checked,
//! adapters found, a device per rank made or adopted (ranks that share an
//! adapter share its device unless the placement says otherwise), and the
//! figures the planner decides from measured on rank 0's device.

use std::sync::Arc;

use crate::api::config::{MAX_RANKS, Placement, WorldConfig};
use crate::device::RankDevice;
use crate::error::{Error, Result};

pub(crate) fn check(config: &WorldConfig) -> Result<()> {
    let n = config.ranks();
    if n == 0 || n > MAX_RANKS {
        return Err(Error::InvalidArgument {
            rank: None,
            what: format!("a world needs 1 to {MAX_RANKS} ranks, got {n}"),
        });
    }
    if config.timeout().is_zero() {
        return Err(Error::InvalidArgument {
            rank: None,
            what: "the timeout must be longer than zero".into(),
        });
    }
    Ok(())
}

pub(crate) fn find_adapters(config: &WorldConfig) -> Result<(wgpu::Instance, Vec<wgpu::Adapter>)> {
    let backends = config.backends();
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle().with_env();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    let mut all = pollster::block_on(instance.enumerate_adapters(backends));
    let name = config.adapter_name();
    if let Some(name) = &name {
        let needle = name.to_lowercase();
        all.retain(|a| a.get_info().name.to_lowercase().contains(&needle));
    }
    let is_cpu = |a: &wgpu::Adapter| a.get_info().device_type == wgpu::DeviceType::Cpu;
    if all.iter().any(|a| !is_cpu(a)) {
        all.retain(|a| !is_cpu(a));
    }
    if all.is_empty() {
        return Err(Error::NoAdapter {
            backends: format!("{backends:?}"),
            name: name
                .map(|n| format!(", name containing {n:?}"))
                .unwrap_or_default(),
        });
    }
    Ok((instance, all))
}

/// The devices of `ranks` (world ranks), spread round-robin over
/// `adapters` (all on the first under `SharedDevice`); ranks on one
/// adapter share its device unless `placement` gives each its own.
pub(crate) fn devices_on(
    adapters: &[wgpu::Adapter],
    ranks: std::ops::Range<usize>,
    placement: Placement,
    config: &WorldConfig,
) -> Result<Vec<Arc<RankDevice>>> {
    let wants = config.wants()?;
    let mut devices: Vec<Arc<RankDevice>> = Vec::with_capacity(ranks.len());
    // The device already made on each adapter, for ranks to share.
    let mut on_adapter: Vec<Option<Arc<RankDevice>>> = vec![None; adapters.len()];
    for (local, rank) in ranks.enumerate() {
        let at = match placement {
            Placement::SharedDevice => 0,
            _ => local.checked_rem(adapters.len()).unwrap_or(0),
        };
        let adapter = adapters.get(at).ok_or_else(|| Error::NoAdapter {
            backends: format!("{:?}", config.backends()),
            name: String::new(),
        })?;
        let shared = on_adapter.get(at).and_then(Option::as_ref);
        let dev = match (placement, shared) {
            (Placement::DevicePerRank, _) | (_, None) => {
                RankDevice::new(rank, adapter, config.timeout(), &wants)?
            }
            (_, Some(d)) => d.share(rank),
        };
        if let Some(slot @ None) = on_adapter.get_mut(at) {
            *slot = Some(dev.clone());
        }
        devices.push(dev);
    }
    Ok(devices)
}

/// The user's devices, rank r on `devices[r]`; the same device given for
/// several ranks is shared by them (one owner per device, whatever the
/// placement).
pub(crate) fn adopt(
    devices: Vec<(wgpu::Device, wgpu::Queue)>,
    config: &WorldConfig,
) -> Result<Vec<Arc<RankDevice>>> {
    let import = config.wants()?.import;
    let mut made: Vec<Arc<RankDevice>> = Vec::with_capacity(devices.len());
    for (rank, (device, queue)) in devices.into_iter().enumerate() {
        let dev = match made.iter().find(|d| d.device == device) {
            Some(d) => d.share(rank),
            None => RankDevice::adopt(rank, device, queue, config.timeout(), import)?,
        };
        made.push(dev);
    }
    Ok(made)
}
