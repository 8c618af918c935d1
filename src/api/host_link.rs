//! How bytes cross between ranks on separate devices of one process.
//!
//! Separate devices share no memory wgpu knows of, so a hop between them
//! crosses host memory. Where both devices can import host memory
//! (`VK_EXT_external_memory_host`, every current Vulkan driver), a hop's
//! bytes go through host memory both devices map: the sender's device
//! writes it, the receiver's kernels read it in place (NCCL's SHM
//! transport). Elsewhere (Metal, DX12, GL, a device opened without the
//! extension) they are staged: copied into a mapped buffer, out of it on
//! the host, and uploaded again.

use crate::error::{Error, Result};

/// Opens a device on `adapter` as `desc` asks, able to import host memory
/// where the adapter can (a Vulkan driver with
/// `VK_EXT_external_memory_host`), so that worlds on devices the user
/// makes ([`World::from_devices`](crate::World::from_devices)) get mapped
/// host links too; elsewhere it is `adapter.request_device(desc)`.
///
/// ```no_run
/// # fn main() -> wgpu_collectives::Result<()> {
/// use wgpu_collectives::{World, WorldConfig, request_device, wgpu};
///
/// let instance = wgpu::Instance::default();
/// let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
///     .expect("an adapter");
/// let devices = (0..2)
///     .map(|_| request_device(&adapter, &wgpu::DeviceDescriptor::default()))
///     .collect::<wgpu_collectives::Result<Vec<_>>>()?;
/// let world = World::from_devices(devices, WorldConfig::new(2))?;
/// # let _ = world;
/// # Ok(())
/// # }
/// ```
pub fn request_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
) -> Result<(wgpu::Device, wgpu::Queue)> {
    if let Ok(opened) = crate::device::hostmem::request_device(adapter, desc) {
        return Ok(opened);
    }
    pollster::block_on(adapter.request_device(desc)).map_err(|e| Error::Device {
        rank: None,
        seq: None,
        what: format!("requesting a device on {}: {e}", adapter.get_info().name),
    })
}
