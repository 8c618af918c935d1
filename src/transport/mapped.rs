//! Mapped links: the slots a rank lends are host memory that every device
//! of its group imports, so a hop between separate devices is one device
//! copy into the slot and the receiver's kernel reading it in place, with
//! no map, no memcpy and no wgpu staging between them (`device/hostmem.rs`
//! says how; NCCL's SHM transport does the same).
//!
//! A slot is imported into the lender's device when it is made, and into
//! each other device the first time a rank there reads it; the imports
//! are kept for the slot's life, so that in steady state a hop makes
//! nothing. The host orders the two devices: a reader waits for the
//! lender's submission that filled the slot, and says which of its own
//! submissions reads it; the lender writes the slot again only once every
//! holder has let go and every such submission is done.

use std::sync::{Arc, Mutex};

use crate::device::hostmem::{self, HostMemory};
use crate::device::{RankDevice, Ticket, lock};

/// One lent slot in host memory, and its imports.
pub(crate) struct HostSlot {
    mem: Arc<HostMemory>,
    /// The import on each device that used it, by device key (the
    /// lender's first).
    imports: Mutex<Vec<(Arc<RankDevice>, wgpu::Buffer)>>,
    /// Submissions on readers' devices that read the slot and may still
    /// be running.
    readers: Mutex<Vec<(Arc<RankDevice>, Ticket)>>,
}

impl HostSlot {
    /// A slot of at least `bytes` lent by `owner` (whose device imports
    /// host memory, aligned as `align`), and its import there.
    pub(crate) fn new(
        owner: &Arc<RankDevice>,
        bytes: u64,
        align: u64,
    ) -> Result<(Arc<HostSlot>, wgpu::Buffer), String> {
        let mem = HostMemory::new(bytes, align)?;
        let buf = hostmem::import(&owner.device, &mem, "lent (host memory)")?;
        owner.count_resource();
        let mut imports = Vec::with_capacity(crate::MAX_RANKS);
        imports.push((owner.clone(), buf.clone()));
        let slot = HostSlot {
            mem,
            imports: Mutex::new(imports),
            readers: Mutex::new(Vec::with_capacity(crate::MAX_RANKS)),
        };
        Ok((Arc::new(slot), buf))
    }

    /// The slot's bytes on `dev`'s device: its import there, made on the
    /// first read from that device.
    pub(crate) fn on(&self, dev: &Arc<RankDevice>) -> Result<wgpu::Buffer, String> {
        let mut imports = lock(&self.imports);
        if let Some((_, b)) = imports.iter().find(|(d, _)| d.same_device(dev)) {
            return Ok(b.clone());
        }
        let b = hostmem::import(&dev.device, &self.mem, "borrowed (host memory)")?;
        dev.count_resource();
        imports.push((dev.clone(), b.clone()));
        Ok(b)
    }

    /// `t` on `dev` reads the slot: the lender writes it again only once
    /// `t` is done.
    pub(crate) fn read_by(&self, dev: &Arc<RankDevice>, t: Ticket) {
        lock(&self.readers).push((dev.clone(), t));
    }

    /// A reader's submission still running, if any (those done are
    /// forgotten).
    pub(crate) fn pending(&self) -> Option<(Arc<RankDevice>, Ticket)> {
        let mut readers = lock(&self.readers);
        readers.retain(|(d, t)| !d.is_done(*t));
        readers.first().cloned()
    }

    /// Forgets every reader: a device that failed reads nothing more.
    pub(crate) fn forget_readers(&self) {
        lock(&self.readers).clear();
    }

    /// The host memory, for reading on the host once filled.
    pub(crate) fn mem(&self) -> &HostMemory {
        &self.mem
    }
}

impl Drop for HostSlot {
    /// Forgets the bind groups that name its imports, so that the imports,
    /// then the memory, are freed.
    fn drop(&mut self) {
        for (dev, buf) in lock(&self.imports).iter() {
            dev.kernels.forget(std::slice::from_ref(buf));
        }
    }
}
