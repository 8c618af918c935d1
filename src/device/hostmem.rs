//! Host memory that several devices map: one allocation, imported into
//! each device as a buffer its copies and kernels read and write in place
//! (`VK_EXT_external_memory_host`).
//!
//! wgpu has no peer-to-peer between devices and no shared buffer between
//! two of its devices; every other way across goes through a map, a
//! memcpy and wgpu's own staging. Every Vulkan driver that matters can
//! import a host allocation instead, and two devices that import the same
//! one share its bytes with nothing in between (NCCL's SHM transport does
//! the same between GPUs without peer access). wgpu 30 reaches this only
//! through `wgpu::hal`, so this module opens devices with the extension,
//! allocates and imports the memory with `ash`, and wraps each import as a
//! `wgpu::Buffer`. It is the one place of the device layer that allows
//! `unsafe`.
//!
//! Lifetimes: an import's drop callback holds the allocation, so the
//! memory is freed only after the last buffer that imports it is
//! destroyed, which wgpu does once no submission uses it any more, on
//! every path (a failed collective, a lost device, a dropped world).
#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ffi::{CStr, c_void};
use std::ptr::NonNull;
use std::sync::Arc;

use ash::vk;
use wgpu::hal::api::Vulkan;

use super::{RankDevice, Ticket};
use wgpu::hal::vulkan as hv;

/// The Vulkan extension this module needs on every device that imports.
pub(crate) const EXTENSION: &CStr = ash::ext::external_memory_host::NAME;

/// The handle type of an import of host memory.
const HOST: vk::ExternalMemoryHandleTypeFlags =
    vk::ExternalMemoryHandleTypeFlags::HOST_ALLOCATION_EXT;

/// The import alignment `adapter` asks of host memory, or why it cannot
/// import host memory at all.
pub(crate) fn adapter_alignment(adapter: &wgpu::Adapter) -> Result<u64, String> {
    let name = adapter.get_info().name;
    // SAFETY: the guard is only read from, and dropped before this returns.
    let Some(hal) = (unsafe { adapter.as_hal::<Vulkan>() }) else {
        return Err(format!("{name} is not a Vulkan adapter"));
    };
    if !hal
        .physical_device_capabilities()
        .supports_extension(EXTENSION)
    {
        return Err(format!(
            "the Vulkan driver of {name} lacks {}",
            EXTENSION.to_string_lossy()
        ));
    }
    alignment(
        hal.shared_instance().raw_instance(),
        hal.raw_physical_device(),
        &name,
    )
}

/// The import alignment of `device` when it was opened with the extension
/// (by [`request_device`], or by whoever made it), else why it cannot
/// import.
pub(crate) fn device_alignment(device: &wgpu::Device) -> Result<u64, String> {
    device_imports(device)?;
    // SAFETY: the guard is only read from, and dropped before this returns.
    let Some(hal) = (unsafe { device.as_hal::<Vulkan>() }) else {
        return Err("the device is not a Vulkan device".into());
    };
    let name = device.adapter_info().name;
    alignment(
        hal.shared_instance().raw_instance(),
        hal.raw_physical_device(),
        &name,
    )
}

fn alignment(
    instance: &ash::Instance,
    physical: vk::PhysicalDevice,
    name: &str,
) -> Result<u64, String> {
    let mut host = vk::PhysicalDeviceExternalMemoryHostPropertiesEXT::default();
    let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut host);
    // SAFETY: the physical device belongs to this instance, and the chain
    // holds one structure of the extension, which the device supports
    // (both callers checked).
    unsafe { instance.get_physical_device_properties2(physical, &mut props) };
    if props.properties.api_version < vk::API_VERSION_1_1 {
        return Err(format!(
            "{name} is a Vulkan 1.0 device (importing host memory needs 1.1)"
        ));
    }
    Ok(host.min_imported_host_pointer_alignment.max(4096))
}

/// What `adapter.request_device(desc)` refuses before it opens anything
/// (wgpu-core's `Adapter::create_device_and_queue`): features the adapter
/// lacks, experimental features not opted into, limits past the
/// adapter's. Opening through the hal skips those checks, and the hal
/// then panics on some features or hands out a device that claims what
/// the driver does not have, so they are made here first.
fn refused(adapter: &wgpu::Adapter, desc: &wgpu::DeviceDescriptor<'_>) -> Result<(), String> {
    let missing = desc.required_features.difference(adapter.features());
    if !missing.is_empty() {
        return Err(format!("the adapter lacks the features {missing:?}"));
    }
    let experimental = desc
        .required_features
        .intersection(wgpu::Features::all_experimental_mask());
    if !experimental.is_empty() && !desc.experimental_features.is_enabled() {
        return Err(format!(
            "the experimental features {experimental:?} were asked for without opting in"
        ));
    }
    let mut over = Vec::new();
    desc.required_limits
        .check_limits_with_fail_fn(&adapter.limits(), false, |name, want, have| {
            over.push(format!("{name}: asked {want}, the adapter allows {have}"));
        });
    if !over.is_empty() {
        return Err(format!("limits past the adapter's: {}", over.join("; ")));
    }
    Ok(())
}

/// Opens a device on `adapter` as `desc` asks, with the extension enabled,
/// or says why it cannot. It refuses what `adapter.request_device` would
/// refuse, before the hal sees it.
pub(crate) fn request_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
) -> Result<(wgpu::Device, wgpu::Queue), String> {
    refused(adapter, desc)?;
    adapter_alignment(adapter)?;
    let open = {
        // SAFETY: the guard is dropped before the device is made from it.
        let hal = unsafe { adapter.as_hal::<Vulkan>() }
            .ok_or_else(|| "the adapter is not a Vulkan adapter".to_string())?;
        let add = Box::new(|args: hv::CreateDeviceCallbackArgs<'_, '_, '_>| {
            if !args.extensions.contains(&EXTENSION) {
                args.extensions.push(EXTENSION);
            }
        });
        // SAFETY: the callback only adds an extension the physical device
        // supports (checked by `adapter_alignment`); it removes nothing.
        // The features and limits are the adapter's to give (`refused`).
        unsafe {
            hal.open_with_callback(
                desc.required_features,
                &desc.required_limits,
                &desc.memory_hints,
                Some(add),
            )
        }
        .map_err(|e| format!("opening a device with {}: {e}", EXTENSION.to_string_lossy()))?
    };
    // SAFETY: `open` was made from this adapter's hal adapter, with the
    // features `desc` asks for.
    unsafe { adapter.create_device_from_hal(open, desc) }.map_err(|e| e.to_string())
}

/// Whether `device` was opened with the extension (by [`request_device`],
/// or by whoever made it), or why it cannot import.
fn device_imports(device: &wgpu::Device) -> Result<(), String> {
    // SAFETY: the guard is only read from.
    let Some(hal) = (unsafe { device.as_hal::<Vulkan>() }) else {
        return Err("the device is not a Vulkan device".into());
    };
    if hal.enabled_device_extensions().contains(&EXTENSION) {
        Ok(())
    } else {
        Err(format!(
            "the device was opened without {} (open it with wgpu_collectives::request_device)",
            EXTENSION.to_string_lossy()
        ))
    }
}

/// A host allocation, page-aligned and zeroed, that devices import.
pub(crate) struct HostMemory {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is plain memory owned by this value; who writes
// it when is ordered by the submissions and holds of its users.
unsafe impl Send for HostMemory {}
// SAFETY: as above; `&HostMemory` hands out only raw pointers and copies.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    /// At least `bytes`, rounded up to `align` (a power of two).
    pub(crate) fn new(bytes: u64, align: u64) -> Result<Arc<HostMemory>, String> {
        let align = usize::try_from(align.max(4096))
            .ok()
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| format!("an import alignment of {align} bytes"))?;
        let size = usize::try_from(bytes.max(1))
            .ok()
            .and_then(|b| b.checked_next_multiple_of(align))
            .ok_or_else(|| format!("a host allocation of {bytes} bytes"))?;
        let layout = Layout::from_size_align(size, align)
            .map_err(|e| format!("a host allocation of {size} bytes: {e}"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| format!("allocating {size} bytes of host memory failed"))?;
        Ok(Arc::new(HostMemory { ptr, layout }))
    }

    /// Bytes allocated.
    pub(crate) fn len(&self) -> u64 {
        self.layout.size() as u64
    }

    /// The first `len` bytes. The caller has waited for the submission
    /// that wrote them, and no device writes them while the borrow lives
    /// (the slot's holds say so).
    pub(crate) fn bytes(&self, len: usize) -> Result<&[u8], String> {
        if len > self.layout.size() {
            return Err(format!(
                "reading {len} bytes of a {}-byte host allocation",
                self.layout.size()
            ));
        }
        // SAFETY: in the allocation (checked), initialised (zeroed at
        // allocation, written by devices since), and not written while the
        // borrow lives (the caller's contract, as for `read_into`).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) })
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout; every import holds an `Arc`
        // of this value until its buffer is destroyed, so none is left.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Host memory imported into one device, which the host reads and writes
/// in place between the device's uses of it (a host fold's image: the
/// device copies the tensor in, the host folds, the device copies it out,
/// with no map and no memcpy either way).
pub(crate) struct HostImage {
    mem: Arc<HostMemory>,
    buf: wgpu::Buffer,
    /// The last submission that used `buf`: the host touches the bytes
    /// only once it is done.
    last: Option<Ticket>,
}

impl HostImage {
    /// An image of at least `bytes` on `dev`'s device (which imports host
    /// memory aligned as `align`).
    pub(crate) fn new(dev: &RankDevice, bytes: u64, align: u64) -> Result<HostImage, String> {
        let mem = HostMemory::new(bytes, align)?;
        let buf = import(&dev.device, &mem, "host image")?;
        dev.count_resource();
        Ok(HostImage {
            mem,
            buf,
            last: None,
        })
    }

    /// Bytes it holds.
    pub(crate) fn len(&self) -> u64 {
        self.mem.len()
    }

    /// The device's view, for copies recorded in a submission that the
    /// caller then reports with [`Self::used_by`].
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buf
    }

    /// `t` uses the device's view.
    pub(crate) fn used_by(&mut self, t: Ticket) {
        self.last = Some(t);
    }

    /// The last submission that used the device's view.
    pub(crate) fn last_use(&self) -> Option<Ticket> {
        self.last
    }

    /// The first `len` bytes, for the host to read and write, once the
    /// last submission that used them on `dev` is done.
    pub(crate) fn bytes_mut(&mut self, dev: &RankDevice, len: usize) -> Result<&mut [u8], String> {
        if let Some(t) = self.last.filter(|t| !dev.is_done(*t)) {
            return Err(format!(
                "the host image is still in use by submission {t:?}"
            ));
        }
        if len as u64 > self.mem.len() {
            return Err(format!(
                "{len} bytes of a {}-byte host image",
                self.mem.len()
            ));
        }
        // SAFETY: in the allocation (checked) and initialised; no device
        // uses it (every submission that did is done, checked above, and
        // none is made while this `&mut self` borrow lives), and the
        // memory is this image's alone: no other Rust reference to it
        // exists (imports hold it only to free it).
        Ok(unsafe { std::slice::from_raw_parts_mut(self.mem.ptr.as_ptr(), len) })
    }
}

/// Imports `mem` into `device` (opened with the extension) as a buffer of
/// its whole length, for copies both ways and kernels.
pub(crate) fn import(
    device: &wgpu::Device,
    mem: &Arc<HostMemory>,
    label: &str,
) -> Result<wgpu::Buffer, String> {
    device_imports(device)?;
    let size = mem.len();
    let hal_buffer = {
        // SAFETY: the guard is dropped before the buffer is handed to wgpu;
        // the raw device and instance are only used to make, bind and (in
        // the drop callback) free objects of this device.
        let hal = unsafe { device.as_hal::<Vulkan>() }
            .ok_or_else(|| "the device is not a Vulkan device".to_string())?;
        let raw = hal.raw_device().clone();
        let instance = hal.shared_instance().raw_instance();
        let ext = ash::ext::external_memory_host::Device::new(instance, &raw);
        let mut external = vk::ExternalMemoryBufferCreateInfo::default().handle_types(HOST);
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(
                vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST
                    | vk::BufferUsageFlags::STORAGE_BUFFER,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE)
            .push_next(&mut external);
        // SAFETY: a valid create info on this device.
        let buffer = unsafe { raw.create_buffer(&info, None) }
            .map_err(|e| format!("creating a buffer to import host memory into: {e}"))?;
        // Frees the buffer (and memory) made so far when a step fails.
        let fail = |memory: Option<vk::DeviceMemory>, why: String| {
            // SAFETY: made above on this device, never handed to wgpu, and
            // not used by any submission.
            unsafe {
                raw.destroy_buffer(buffer, None);
                if let Some(m) = memory {
                    raw.free_memory(m, None);
                }
            }
            Err(why)
        };
        // SAFETY: `buffer` is a live buffer of this device.
        let needs = unsafe { raw.get_buffer_memory_requirements(buffer) };
        let mut host = vk::MemoryHostPointerPropertiesEXT::default();
        let ptr = mem.ptr.as_ptr().cast::<c_void>().cast_const();
        // SAFETY: the extension is enabled on this device (checked), `ptr`
        // is a live allocation aligned as the adapter asks.
        let got = unsafe {
            (ext.fp().get_memory_host_pointer_properties_ext)(raw.handle(), HOST, ptr, &mut host)
        };
        if got != vk::Result::SUCCESS {
            return fail(
                None,
                format!("the device cannot import this host memory: {got}"),
            );
        }
        if needs.size > size {
            return fail(
                None,
                format!(
                    "the buffer needs {} bytes, the host memory has {size}",
                    needs.size
                ),
            );
        }
        // SAFETY: the physical device belongs to this instance.
        let types =
            unsafe { instance.get_physical_device_memory_properties(hal.raw_physical_device()) };
        let usable = needs.memory_type_bits & host.memory_type_bits;
        let coherent =
            vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let pick = |want: vk::MemoryPropertyFlags| {
            types
                .memory_types_as_slice()
                .iter()
                .enumerate()
                .find(|(i, t)| usable & (1u32 << i) != 0 && t.property_flags.contains(want))
                .and_then(|(i, _)| u32::try_from(i).ok())
        };
        let Some(type_index) = pick(coherent).or_else(|| pick(vk::MemoryPropertyFlags::empty()))
        else {
            return fail(
                None,
                "no memory type of the device can import this host memory".into(),
            );
        };
        let mut import = vk::ImportMemoryHostPointerInfoEXT::default()
            .handle_type(HOST)
            .host_pointer(ptr.cast_mut());
        let alloc = vk::MemoryAllocateInfo::default()
            .allocation_size(size)
            .memory_type_index(type_index)
            .push_next(&mut import);
        // SAFETY: imports `size` bytes at `ptr`, all of them `mem`'s, which
        // outlives the import (the drop callback below holds it).
        let memory = match unsafe { raw.allocate_memory(&alloc, None) } {
            Ok(m) => m,
            Err(e) => return fail(None, format!("importing host memory: {e}")),
        };
        // SAFETY: both live objects of this device, the memory unbound.
        if let Err(e) = unsafe { raw.bind_buffer_memory(buffer, memory, 0) } {
            return fail(Some(memory), format!("binding imported host memory: {e}"));
        }
        let keep = mem.clone();
        let free = Box::new(move || {
            // SAFETY: wgpu runs this once, when it drops the buffer: after
            // every submission that used it, and before the device goes
            // (wgpu's buffer holds its device). The host memory goes last.
            unsafe {
                raw.destroy_buffer(buffer, None);
                raw.free_memory(memory, None);
            }
            drop(keep);
        });
        // SAFETY: `buffer` stays alive until the callback destroys it;
        // wgpu never maps it (it is not made mappable).
        unsafe { hv::Buffer::from_raw_externally_owned(buffer, free) }
    };
    let desc = wgpu::BufferDescriptor {
        label: Some(label),
        size,
        usage: wgpu::BufferUsages::COPY_SRC
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    };
    // SAFETY: made on this device with the usages `desc` names, its memory
    // bound and initialised (zeroed), of non-zero size.
    Ok(unsafe { device.create_buffer_from_hal::<Vulkan>(hal_buffer, &desc) })
}

#[cfg(test)]
#[allow(
    clippy::expect_used,
    reason = "a test: a failed expectation is a failed test"
)]
mod tests {
    use super::*;

    /// Bytes one device writes into imported host memory are what another
    /// device, importing the same memory, copies out of it.
    #[test]
    fn two_devices_share_one_allocation() {
        let config = crate::WorldConfig::new(2);
        let (_instance, adapters) =
            crate::api::bootstrap::find_adapters(&config).expect("an adapter");
        let adapter = &adapters[0];
        let align = adapter_alignment(adapter).expect("the adapter imports host memory");
        let open =
            || request_device(adapter, &wgpu::DeviceDescriptor::default()).expect("a device");
        let (a, qa) = open();
        let (b, qb) = open();
        let mem = HostMemory::new(1 << 16, align).expect("host memory");
        let on_a = import(&a, &mem, "on a").expect("import into a");
        let on_b = import(&b, &mem, "on b").expect("import into b");
        let words: Vec<u32> = (0..1u32 << 14)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        let src = wgpu::util::DeviceExt::create_buffer_init(
            &a,
            &wgpu::util::BufferInitDescriptor {
                label: None,
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::COPY_SRC,
            },
        );
        let mut enc = a.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&src, 0, &on_a, 0, mem.len());
        qa.submit([enc.finish()]);
        a.poll(wgpu::PollType::wait_indefinitely())
            .expect("a's copy");
        let back = b.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: mem.len(),
            usage: wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::MAP_READ,
            mapped_at_creation: false,
        });
        let mut enc = b.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&on_b, 0, &back, 0, mem.len());
        qb.submit([enc.finish()]);
        back.slice(..)
            .map_async(wgpu::MapMode::Read, |r| r.expect("map"));
        b.poll(wgpu::PollType::wait_indefinitely())
            .expect("b's copy");
        let got: Vec<u32> =
            bytemuck::cast_slice(&back.slice(..).get_mapped_range().expect("view")).to_vec();
        assert_eq!(got, words);
        let host = mem.bytes(64).expect("read");
        assert_eq!(host, bytemuck::cast_slice::<u32, u8>(&words[..16]));
        // The memory outlives both imports, however they are dropped.
        drop(mem);
        drop((on_a, on_b));
    }
}
