//! The device side of a host hop: the mapped buffers a slice goes through
//! on its way off a device (read-back, or lent in place) and onto one
//! (upload), made once per communicator and reused, so that in steady
//! state a collective allocates nothing.
//!
//! wgpu has no peer-to-peer between devices, so a hop between two devices
//! goes through host memory: the sender copies a slice into a mapped
//! read-back buffer (or lends it, see `local.rs`); the receiver writes the
//! bytes into a mapped upload buffer and copies them on its device. On
//! adapters whose device memory is host memory (CPU and integrated GPUs),
//! kernels read the upload buffer directly.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crate::deadline::{Patience, Ring};
use crate::device::hostmem::HostImage;
use crate::device::tensor::Tensor;
use crate::device::{RankDevice, Signal, Ticket};
use crate::dtype::DType;
use crate::error::{Error, Result};

use super::local::{Loan, MAP_FAILED, MAP_PENDING, MAP_READY};
use super::mapped::HostSlot;

/// A mappable staging buffer and the state of its last map request.
struct Staging {
    buf: wgpu::Buffer,
    state: Arc<AtomicU8>,
    last_use: Option<Ticket>,
    /// Wakes the device's waiters when a map callback fires.
    signal: Arc<Signal>,
}

impl Staging {
    fn new(
        dev: &RankDevice,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped: bool,
    ) -> Result<Staging> {
        Ok(Staging {
            buf: dev.create_buffer(label, size, usage, mapped)?,
            state: Arc::new(AtomicU8::new(if mapped { MAP_READY } else { MAP_PENDING })),
            last_use: None,
            signal: dev.map_signal(),
        })
    }

    /// An import of host memory, used as it is (never mapped).
    fn imported(dev: &RankDevice, buf: wgpu::Buffer) -> Staging {
        Staging {
            buf,
            state: Arc::new(AtomicU8::new(MAP_READY)),
            last_use: None,
            signal: dev.map_signal(),
        }
    }

    /// Asks for the buffer to be mapped once the submission being encoded completes.
    fn arm(&self, enc: &wgpu::CommandEncoder, mode: wgpu::MapMode) {
        self.state.store(MAP_PENDING, Ordering::Release);
        let (state, signal) = (self.state.clone(), self.signal.clone());
        enc.map_buffer_on_submit(&self.buf, mode, .., move |r| {
            state.store(
                if r.is_ok() { MAP_READY } else { MAP_FAILED },
                Ordering::Release,
            );
            signal.notify();
        });
    }

    /// Waits until the map asked for by `arm` has happened.
    fn mapped(&self, dev: &RankDevice, p: &Patience, what: &str) -> Result<()> {
        let bell: Arc<dyn Ring> = dev.map_signal();
        p.until(
            || format!("the {what} buffer to be mapped for #{}", p.seq),
            &bell,
            |slice| {
                let seen = dev.generation();
                match self.state.load(Ordering::Acquire) {
                    MAP_READY => Ok(Some(())),
                    MAP_FAILED => Err(p.device_error(format!("mapping the {what} buffer failed"))),
                    _ if slice.rung() => Ok(None),
                    _ => {
                        // Reports the device's faults; else waits for the
                        // submission, then for its map callback.
                        match self.last_use {
                            Some(t) if !dev.is_done(t) => {
                                dev.poll_since(t, seen, slice.limit, Some(p.seq))?;
                            }
                            _ => {
                                dev.check(Some(p.seq))?;
                                dev.wait_change(seen, slice.limit);
                            }
                        }
                        Ok(None)
                    }
                }
            },
        )
    }
}

/// Upload buffers in flight at once: a receive can start while the previous
/// upload's copy is still running on the device.
const UPLOAD_SLOTS: usize = 3;

/// Read-back buffers that can be out on loan at once. A ring never has a
/// rank more than this many steps ahead of its successor on lent buffers,
/// and no cycle of waits can form: each rank drops what it received
/// before it waits for a buffer of its own.
const LEND_SLOTS: usize = 4;

/// A read-back buffer that is lent out, and the count of its holders.
struct LendSlot {
    /// The buffer the lender copies into: mapped for reading, or its
    /// import of `host` (never mapped then).
    staging: Staging,
    /// On a mapped link, the slot in host memory that `staging` imports.
    host: Option<Arc<HostSlot>>,
    hold: Arc<()>,
    /// Set while the owner waits for the last borrower to let go, so that
    /// only then does a dropped loan wake it.
    awaited: Arc<AtomicBool>,
}

/// The device side of hops for one communicator on one rank: a read-back
/// buffer, a ring of upload buffers and a scratch buffer the reductions read.
pub(crate) struct Stager {
    dev: Arc<RankDevice>,
    capacity: u64,
    readback: Option<Staging>,
    uploads: Vec<Staging>,
    next_upload: usize,
    used: Vec<usize>,
    readback_armed: bool,
    scratch: Option<wgpu::Buffer>,
    lends: Vec<LendSlot>,
    next_lend: usize,
    lend_armed: Option<usize>,
    /// Where bytes from another process land (see [`Landing`]), made with
    /// the other buffers where ring steps lend.
    landing: Option<Arc<Landing>>,
    /// Loans in host memory read in place by the submission being
    /// encoded: told its ticket once it is submitted.
    reading: Vec<Loan>,
    /// Where a host fold works in place, on a device that imports host
    /// memory (made on first use, grown as needed).
    image: Option<HostImage>,
}

impl Stager {
    pub(crate) fn new(dev: Arc<RankDevice>) -> Stager {
        Stager {
            dev,
            capacity: 0,
            readback: None,
            uploads: Vec::new(),
            next_upload: 0,
            used: Vec::new(),
            readback_armed: false,
            scratch: None,
            lends: Vec::new(),
            next_lend: 0,
            lend_armed: None,
            landing: None,
            reading: Vec::with_capacity(LEND_SLOTS),
            image: None,
        }
    }

    /// The host image for `bytes`, taken (give it back with
    /// [`Self::put_image`]), where this device imports host memory.
    pub(crate) fn take_image(&mut self, bytes: u64) -> Result<Option<HostImage>> {
        let Ok(align) = self.dev.imports else {
            return Ok(None);
        };
        match self.image.take() {
            Some(img) if img.len() >= bytes => Ok(Some(img)),
            _ => HostImage::new(&self.dev, bytes, align)
                .map(Some)
                .map_err(|why| Error::device(self.dev.rank, None, format!("a host image: {why}"))),
        }
    }

    /// Gives back the image [`Self::take_image`] took.
    pub(crate) fn put_image(&mut self, image: HostImage) {
        self.image = Some(image);
    }

    /// A pooled buffer of `words` words on this device, for bytes sent to
    /// a rank on the same device: back in the pool when dropped (safe
    /// while a submission still reads it: later users submit after).
    pub(crate) fn resident(&self, words: usize) -> Result<Tensor> {
        Tensor::output(&self.dev, DType::U32, words)
    }

    /// Whether ring steps lend their read-back buffers (see the module
    /// docs): where kernels read mapped buffers, or hops go through host
    /// memory both devices import.
    pub(crate) fn lends(&self) -> bool {
        self.dev.unified || self.lends_in_host_memory()
    }

    /// Whether the slots this rank lends are host memory every device of
    /// its group imports.
    pub(crate) fn lends_in_host_memory(&self) -> bool {
        self.dev.imports.is_ok()
    }

    /// Whether a rank can read `loan` in place: it is a slot in host
    /// memory, and this device imports host memory too.
    pub(crate) fn reads_in_place(&self, loan: &Loan) -> bool {
        loan.host.is_some() && self.lends_in_host_memory()
    }

    /// `loan`'s slot on this device, for the submission being encoded to
    /// read in place: its lender writes it again only once that
    /// submission is done.
    pub(crate) fn read_in_place(
        &mut self,
        loan: &Loan,
    ) -> std::result::Result<wgpu::Buffer, String> {
        let host = loan
            .host
            .as_ref()
            .ok_or("a loan read in place without host memory")?;
        let buf = host.on(&self.dev)?;
        self.reading.push(loan.clone());
        Ok(buf)
    }

    /// Starts the next collective on the first upload buffer, so that a
    /// repeated collective binds the same buffers every time (and finds
    /// its bind groups cached).
    pub(crate) fn rewind(&mut self) {
        self.next_upload = 0;
        self.next_lend = 0;
    }

    /// Forgets every staging buffer: after a failed collective their map
    /// states are unknown, so they are made afresh on next use.
    pub(crate) fn clear(&mut self) {
        self.forget_buffers();
        self.capacity = 0;
        self.readback = None;
        self.uploads.clear();
        self.used.clear();
        self.readback_armed = false;
        self.scratch = None;
        self.lends.clear();
        self.lend_armed = None;
        self.landing = None;
        self.reading.clear();
    }

    /// Forgets the bind groups of the buffers kernels read (uploads and
    /// scratch) before they are dropped, so that dropping frees them.
    fn forget_buffers(&self) {
        let bound: Vec<wgpu::Buffer> = self
            .uploads
            .iter()
            .map(|s| s.buf.clone())
            .chain(self.scratch.clone())
            .chain(
                self.landing
                    .iter()
                    .flat_map(|l| l.slots.iter().map(|s| s.buf.clone())),
            )
            .collect();
        self.dev.kernels.forget(&bound);
    }

    /// Makes sure every staging buffer holds at least `bytes`. Buffers are
    /// made on first use and only remade when a larger slice comes.
    pub(crate) fn reserve(&mut self, bytes: u64) -> Result<()> {
        if bytes <= self.capacity {
            return Ok(());
        }
        use wgpu::BufferUsages as U;
        self.forget_buffers();
        let dev = &self.dev;
        self.readback = Some(Staging::new(
            dev,
            "read-back",
            bytes,
            U::MAP_READ | U::COPY_DST,
            false,
        )?);
        // On unified memory the kernels read upload buffers directly.
        let upload = if dev.unified {
            U::MAP_WRITE | U::COPY_SRC | U::STORAGE
        } else {
            U::MAP_WRITE | U::COPY_SRC
        };
        self.uploads = (0..UPLOAD_SLOTS)
            .map(|_| Staging::new(dev, "upload", bytes, upload, true))
            .collect::<Result<_>>()?;
        self.scratch = if dev.unified {
            None
        } else {
            Some(dev.create_buffer("scratch", bytes, U::STORAGE | U::COPY_DST, false)?)
        };
        self.lends = if self.lends() {
            (0..LEND_SLOTS)
                .map(|_| {
                    let (staging, host) = match &dev.imports {
                        Ok(align) => {
                            let (host, buf) = HostSlot::new(dev, bytes, *align).map_err(|why| {
                                Error::device(
                                    dev.rank,
                                    None,
                                    format!("a mapped link's slot: {why}"),
                                )
                            })?;
                            (Staging::imported(dev, buf), Some(host))
                        }
                        Err(_) => (
                            Staging::new(dev, "lent", bytes, U::MAP_READ | U::COPY_DST, false)?,
                            None,
                        ),
                    };
                    Ok(LendSlot {
                        staging,
                        host,
                        hold: Arc::new(()),
                        awaited: Arc::new(AtomicBool::new(false)),
                    })
                })
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        self.landing = None;
        self.next_lend = 0;
        self.capacity = bytes;
        self.next_upload = 0;
        self.used.clear();
        Ok(())
    }

    /// Where bytes from another process may land, for slices up to the
    /// size `reserve` was given: made on first use, where kernels read
    /// upload buffers directly (`None` elsewhere).
    pub(crate) fn landing(&mut self) -> Result<Option<Arc<Landing>>> {
        if self.landing.is_none() && self.dev.unified && self.capacity > 0 {
            let dev = &self.dev;
            let usage = wgpu::BufferUsages::MAP_WRITE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::STORAGE;
            let slots = (0..LAND_SLOTS)
                .map(|_| {
                    Ok(LandSlot {
                        buf: dev.create_buffer("landing", self.capacity, usage, true)?,
                        state: Arc::new(AtomicU8::new(MAP_READY)),
                    })
                })
                .collect::<Result<_>>()?;
            self.landing = Some(Arc::new(Landing {
                slots,
                capacity: self.capacity,
                signal: dev.map_signal(),
            }));
        }
        Ok(self.landing.clone())
    }

    /// Records a copy of `src[off..off + bytes]` into the read-back buffer,
    /// to be mapped when the submission completes.
    pub(crate) fn encode_download(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        off: u64,
        bytes: u64,
        p: &Patience,
    ) -> Result<()> {
        let rb = self
            .readback
            .as_mut()
            .ok_or_else(|| p.device_error("staging used before reserve".into()))?;
        enc.copy_buffer_to_buffer(src, off, &rb.buf, 0, bytes);
        rb.arm(enc, wgpu::MapMode::Read);
        self.readback_armed = true;
        Ok(())
    }

    /// Records a copy of `src[off..off + bytes]` into the next buffer to
    /// lend, once its last borrower has let go of it.
    pub(crate) fn encode_lend(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        off: u64,
        bytes: u64,
        p: &Patience,
    ) -> Result<()> {
        let i = self.next_lend;
        let dev = self.dev.clone();
        let slot = self
            .lends
            .get_mut(i)
            .ok_or_else(|| p.device_error("lending before reserve".into()))?;
        let bell: Arc<dyn Ring> = dev.map_signal();
        let released = p.until(
            || format!("the next rank to let go of a lent buffer of #{}", p.seq),
            &bell,
            |slice| {
                if Arc::strong_count(&slot.hold) == 1 {
                    std::sync::atomic::fence(Ordering::Acquire);
                    // In host memory: readers' submissions done too.
                    let Some((reader, t)) = slot.host.as_ref().and_then(|h| h.pending()) else {
                        return Ok(Some(()));
                    };
                    if !slice.rung() {
                        let seen = reader.generation();
                        if reader.wait_quietly(t, seen, slice.limit).is_err() {
                            // A failed device reads nothing more.
                            if let Some(h) = &slot.host {
                                h.forget_readers();
                            }
                        }
                    }
                    return Ok(None);
                }
                let seen = dev.generation();
                slot.awaited.store(true, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                if Arc::strong_count(&slot.hold) == 1 {
                    // Pairs with the release of the borrowers' drops.
                    std::sync::atomic::fence(Ordering::Acquire);
                    return Ok(Some(()));
                }
                // The last loan dropped after the check wakes us (see `Loan::drop`).
                if !slice.rung() {
                    dev.wait_change(seen, slice.limit);
                }
                Ok(None)
            },
        );
        slot.awaited.store(false, Ordering::SeqCst);
        released?;
        // Its borrowers waited for the map; this only waits when one
        // dropped it unread (a failure). Host memory is never mapped.
        if slot.host.is_none() && slot.staging.last_use.is_some() {
            slot.staging.mapped(&self.dev, p, "lent")?;
            slot.staging.buf.unmap();
        }
        enc.copy_buffer_to_buffer(src, off, &slot.staging.buf, 0, bytes);
        if slot.host.is_none() {
            slot.staging.arm(enc, wgpu::MapMode::Read);
        }
        self.lend_armed = Some(i);
        self.next_lend = i
            .saturating_add(1)
            .checked_rem(self.lends.len())
            .unwrap_or(0);
        Ok(())
    }

    /// After the lending submission `filled`: the handle to post, at once.
    pub(crate) fn finish_lend(&mut self, bytes: u64, filled: Ticket, p: &Patience) -> Result<Loan> {
        // The slot `encode_lend` just used.
        let i = self
            .next_lend
            .checked_sub(1)
            .unwrap_or(self.lends.len().saturating_sub(1));
        let slot = self
            .lends
            .get(i)
            .ok_or_else(|| p.device_error("lending before reserve".into()))?;
        Ok(Loan {
            buf: slot.staging.buf.clone(),
            bytes,
            hold: Some(slot.hold.clone()),
            awaited: slot.awaited.clone(),
            state: slot.staging.state.clone(),
            owner: self.dev.clone(),
            filled,
            host: slot.host.clone(),
        })
    }

    /// After the download's submission: appends the slice to `out`.
    pub(crate) fn finish_download(
        &mut self,
        bytes: usize,
        out: &mut Vec<u8>,
        p: &Patience,
    ) -> Result<()> {
        let rb = self
            .readback
            .as_ref()
            .ok_or_else(|| p.device_error("staging used before reserve".into()))?;
        rb.mapped(&self.dev, p, "read-back")?;
        {
            let view = rb
                .buf
                .get_mapped_range(..bytes as u64)
                .map_err(|e| p.device_error(format!("read-back view: {e}")))?;
            out.extend_from_slice(&view);
        }
        rb.buf.unmap();
        Ok(())
    }

    /// Writes `data` into the next upload buffer and records its copy to
    /// `dst[dst_off..]`.
    pub(crate) fn encode_upload(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        data: &[u8],
        dst: &wgpu::Buffer,
        dst_off: u64,
        p: &Patience,
    ) -> Result<()> {
        let src = self.fill_upload(enc, data, p)?;
        enc.copy_buffer_to_buffer(&src, 0, dst, dst_off, data.len() as u64);
        Ok(())
    }

    /// Writes `data` where a kernel recorded next in `enc` can read it from
    /// offset 0: the upload buffer itself on unified memory, else the
    /// scratch buffer it is copied to.
    pub(crate) fn encode_upload_for_kernel(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        data: &[u8],
        p: &Patience,
    ) -> Result<wgpu::Buffer> {
        let src = self.fill_upload(enc, data, p)?;
        if self.dev.unified {
            return Ok(src);
        }
        let scratch = self
            .scratch
            .clone()
            .ok_or_else(|| p.device_error("staging used before reserve".into()))?;
        enc.copy_buffer_to_buffer(&src, 0, &scratch, 0, data.len() as u64);
        Ok(scratch)
    }

    /// Copies `data` into the next upload buffer, which is mapped again once
    /// the submission being encoded in `enc` completes.
    fn fill_upload(
        &mut self,
        enc: &wgpu::CommandEncoder,
        data: &[u8],
        p: &Patience,
    ) -> Result<wgpu::Buffer> {
        let i = self.next_upload;
        let slot = self
            .uploads
            .get(i)
            .ok_or_else(|| p.device_error("staging used before reserve".into()))?;
        slot.mapped(&self.dev, p, "upload")?;
        {
            let mut view = slot
                .buf
                .get_mapped_range_mut(..data.len() as u64)
                .map_err(|e| p.device_error(format!("upload view: {e}")))?;
            view.copy_from_slice(data);
        }
        slot.buf.unmap();
        slot.arm(enc, wgpu::MapMode::Write);
        self.used.push(i);
        self.next_upload = i
            .saturating_add(1)
            .checked_rem(self.uploads.len())
            .unwrap_or(0);
        Ok(slot.buf.clone())
    }

    /// Tells the stager which submission carried the uploads encoded since
    /// the last call, so that their next use waits for it.
    pub(crate) fn submitted(&mut self, t: Ticket) {
        for loan in self.reading.drain(..) {
            if let Some(h) = &loan.host {
                h.read_by(&self.dev, t);
            }
        }
        for i in self.used.drain(..) {
            if let Some(u) = self.uploads.get_mut(i) {
                u.last_use = Some(t);
            }
        }
        if let Some(i) = self.lend_armed.take() {
            if let Some(slot) = self.lends.get_mut(i) {
                slot.staging.last_use = Some(t);
            }
        }
        if std::mem::take(&mut self.readback_armed) {
            if let Some(rb) = self.readback.as_mut() {
                rb.last_use = Some(t);
            }
        }
    }
}

/// Landing buffers per rank: one more than a sender lends at once, so a
/// sender that runs ahead finds one free.
const LAND_SLOTS: usize = LEND_SLOTS + 1;

/// A slot is being written by the transport, or holds bytes not yet used.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
const LANDED: u8 = 3;

/// Mapped upload buffers that the transport receives another process's
/// bytes into, so that kernels read them where they landed: no copy after
/// the receive (NCCL's registered buffers). Only where kernels read upload
/// buffers directly (unified memory). A slot is free while mapped; the
/// transport takes one (free to landed), the rank that the bytes are for
/// unmaps it, reads it in a submission that maps it again, and the map
/// callback frees it. A frame that finds no free slot lands in host memory
/// instead and is copied, as before.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) struct Landing {
    slots: Vec<LandSlot>,
    capacity: u64,
    signal: Arc<Signal>,
}

#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
struct LandSlot {
    buf: wgpu::Buffer,
    state: Arc<AtomicU8>,
}

#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
impl Landing {
    /// A free slot for `bytes`, taken, with the view to write them
    /// through; `None` when none is free or the bytes do not fit.
    pub(crate) fn take(&self, bytes: usize) -> Option<(Landed, wgpu::BufferViewMut)> {
        let len = u64::try_from(bytes)
            .ok()
            .filter(|&b| b <= self.capacity && b > 0)?;
        self.slots.iter().find_map(|slot| {
            slot.state
                .compare_exchange(MAP_READY, LANDED, Ordering::AcqRel, Ordering::Acquire)
                .ok()?;
            let landed = Landed {
                buf: slot.buf.clone(),
                bytes: len,
                state: slot.state.clone(),
                signal: self.signal.clone(),
                used: AtomicBool::new(false),
            };
            // Dropping `landed` (a failed view) frees the slot again.
            let view = slot.buf.get_mapped_range_mut(..len).ok()?;
            Some((landed, view))
        })
    }
}

/// Bytes from another process in a landing slot, still mapped.
pub(crate) struct Landed {
    buf: wgpu::Buffer,
    bytes: u64,
    state: Arc<AtomicU8>,
    signal: Arc<Signal>,
    /// Unmapped for a submission, which frees the slot when it maps it again.
    used: AtomicBool,
}

impl Landed {
    /// Bytes landed.
    pub(crate) fn len(&self) -> usize {
        usize::try_from(self.bytes).unwrap_or(usize::MAX)
    }

    /// The buffer holding the bytes from offset 0, for a kernel or copy
    /// recorded in `enc`; the slot is freed once that submission is done.
    pub(crate) fn encode_use(&self, enc: &wgpu::CommandEncoder) -> &wgpu::Buffer {
        if !self.used.swap(true, Ordering::AcqRel) {
            self.buf.unmap();
            let (state, signal) = (self.state.clone(), self.signal.clone());
            enc.map_buffer_on_submit(&self.buf, wgpu::MapMode::Write, .., move |r| {
                state.store(
                    if r.is_ok() { MAP_READY } else { MAP_FAILED },
                    Ordering::Release,
                );
                signal.notify();
            });
        }
        &self.buf
    }

    /// Appends the bytes to `out`, for a rank that folds on the host.
    #[allow(unsafe_code)]
    pub(crate) fn read_into(&self, out: &mut Vec<u8>) -> Result<(), String> {
        if self.used.load(Ordering::Acquire) {
            return Err("a landing buffer was read after its use".into());
        }
        let mut view = self
            .buf
            .get_mapped_range_mut(..self.bytes)
            .map_err(|e| format!("landing view: {e}"))?;
        let mut w = view.slice(..);
        let ptr = w.as_raw_element_ptr();
        let len = self.len();
        out.reserve(len);
        // SAFETY: landing buffers exist only on unified memory, where a
        // mapping is ordinary host memory; the view maps `len` bytes the
        // transport wrote, and nothing writes them while this slot is
        // landed. `out` has room for `len` more bytes, written before the
        // length grows over them.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr.as_ptr(), out.as_mut_ptr().add(out.len()), len);
            out.set_len(out.len().saturating_add(len));
        }
        Ok(())
    }
}

impl Drop for Landed {
    /// Frees a slot that no submission used: it is still mapped.
    fn drop(&mut self) {
        if !self.used.load(Ordering::Acquire) {
            self.state.store(MAP_READY, Ordering::Release);
        }
    }
}
