//! Moving slices between ranks.
//!
//! wgpu has no peer-to-peer between devices, so every hop goes through host
//! memory: the sender copies a slice of its buffer into a mapped read-back
//! buffer and into a [`Packet`]; the receiver writes the packet into a
//! mapped upload buffer and copies it on its device. The hop itself is the
//! narrow seam [`Endpoint::post`] / [`Endpoint::take`]: today an in-process
//! channel, later (ranks in several processes) an MPI message, with nothing
//! above this module knowing which.
//!
//! Ranks in one process can do with one host copy per hop instead of two:
//! the sender *lends* its mapped read-back buffer ([`Lent`]) and the
//! receiver copies straight out of it into its own upload buffer. A lent
//! buffer is reused only when every holder has dropped its handle, and a
//! receiver that forwards the same bytes (the all-gather half of a ring)
//! passes the handle on rather than copying again. Ring steps lend on
//! adapters whose upload buffers kernels read directly (CPU and integrated
//! GPUs), where the host copies are what a hop costs.
//!
//! A buffer is lent as soon as the copy into it is submitted, not when it
//! lands: the borrower waits for the sender's fence (its map callback)
//! when it reads. So the sender's progress thread never blocks on its own
//! device in a ring step; it goes on to the next slice (receiving it,
//! copying it to its upload buffer) while its device still reduces and
//! copies this one. That is the pipelining of NCCL's slices, with the
//! fence wait moved to the one rank that needs the bytes.
//!
//! Packets are recycled through a pool shared by the group, so in steady
//! state a collective allocates no host memory; device staging buffers are
//! made once per communicator and reused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use crossbeam::channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use crossbeam::queue::ArrayQueue;

use crate::device::{RankDevice, Signal, Ticket};
use crate::error::{Error, Result};
use crate::fingerprint::Fingerprint;
use crate::health::Waiter;

/// One slice in flight from one rank to another, with the sender's view of
/// which collective it belongs to. The bytes are `data`, or the lent
/// buffer when there is one.
pub(crate) struct Packet {
    pub fp: Fingerprint,
    pub from: usize,
    pub data: Vec<u8>,
    pub lent: Option<Lent>,
}

impl Packet {
    fn len(&self) -> usize {
        self.lent
            .as_ref()
            .map_or(self.data.len(), |l| l.bytes as usize)
    }
}

/// A read-back buffer of another rank, lent for reading its first `bytes`
/// once the owner's submission `filled` has landed them and mapped it. Its
/// owner reuses it only once every `Lent` of it is gone.
#[derive(Clone)]
pub(crate) struct Lent {
    buf: wgpu::Buffer,
    bytes: u64,
    _hold: Arc<()>,
    /// The map state, set by the map callback.
    state: Arc<AtomicU8>,
    owner: Arc<RankDevice>,
    /// The owner's rank in the communicator.
    owner_rank: usize,
    filled: Ticket,
}

impl Lent {
    /// The lent bytes, once they have landed (polling the owner's device
    /// until they have). Should the owner's device fail, the owner may be
    /// waiting on someone else and never see it: the failure is recorded
    /// as the owner's, for the whole group (and this rank reports
    /// `PeerFailed`, naming it).
    pub(crate) fn view(&self, w: &Waiter) -> Result<wgpu::BufferView> {
        let owner = self.owner_rank;
        let failed = |why: String| -> Result<Option<()>> {
            let what = format!(
                "its device failed to fill a slice it lent to rank {}: {why}",
                w.rank
            );
            w.health
                .fail(owner, Error::device(owner, Some(w.fp.seq), what));
            w.health.check(w.rank, w.fp.seq)?;
            Ok(None)
        };
        w.until(
            || format!("rank {owner}'s device to finish a slice of {}", w.fp),
            |tick| {
                let seen = self.owner.generation();
                match self.state.load(Ordering::Acquire) {
                    MAP_READY => Ok(Some(())),
                    MAP_FAILED => failed("mapping it failed".into()),
                    // Filled: the map callback is on its way.
                    _ if self.owner.is_done(self.filled) => {
                        self.owner.wait_change(seen, tick);
                        Ok(None)
                    }
                    _ => match self.owner.wait_quietly(self.filled, tick) {
                        Err(e) => failed(e),
                        Ok(_) => Ok(None),
                    },
                }
            },
        )?;
        // The owner's device may be lost between the map and this read
        // (it finished its own part and went on): that is the owner's
        // failure too, not this rank's.
        self.buf.get_mapped_range(..self.bytes).or_else(|e| {
            failed(format!("reading it failed: {e}"))?;
            Err(w.device_error(format!("reading a lent buffer: {e}")))
        })
    }
}

/// One rank's ends of the links to every other rank of a group.
pub(crate) struct Endpoint {
    rank: usize,
    to: Vec<Sender<Packet>>,
    from: Vec<Receiver<Packet>>,
    pool: Arc<ArrayQueue<Vec<u8>>>,
}

/// Links between every pair of `n` ranks; entry `r` is rank `r`'s endpoint.
pub(crate) fn mesh(n: usize) -> Vec<Endpoint> {
    let pool = Arc::new(ArrayQueue::new(
        n.clamp(1, crate::MAX_RANKS).saturating_mul(4),
    ));
    // links[a][b]: a -> b
    let links: Vec<Vec<(Sender<Packet>, Receiver<Packet>)>> = (0..n)
        .map(|_| (0..n).map(|_| unbounded()).collect())
        .collect();
    (0..n)
        .map(|r| Endpoint {
            rank: r,
            to: (0..n).map(|p| links[r][p].0.clone()).collect(),
            from: (0..n).map(|p| links[p][r].1.clone()).collect(),
            pool: pool.clone(),
        })
        .collect()
}

impl Endpoint {
    /// Sends `packet` to `peer` without blocking.
    pub(crate) fn post(&self, peer: usize, packet: Packet) -> Result<()> {
        self.to[peer].send(packet).map_err(|_| Error::PeerFailed {
            rank: self.rank,
            seq: 0,
            peer,
            reason: "its endpoint is gone".into(),
        })
    }

    /// Receives the next packet from `peer`, checking that it belongs to the
    /// collective `w` is running and carries `bytes` bytes.
    pub(crate) fn take(&self, peer: usize, bytes: usize, w: &Waiter) -> Result<Packet> {
        let rx = &self.from[peer];
        let p = w.until(
            || match bytes {
                0 => format!("rank {peer} to join {}", w.fp),
                _ => format!("rank {peer} to send {bytes} bytes of {}", w.fp),
            },
            |tick| match rx.recv_timeout(tick) {
                Ok(p) => Ok(Some(p)),
                Err(RecvTimeoutError::Timeout) if w.health.is_gone(peer) => match rx.try_recv() {
                    Ok(p) => Ok(Some(p)),
                    // A peer that left after a failure is reported with that
                    // failure (recorded before it left), not as a departure.
                    Err(_) => w
                        .health
                        .check(self.rank, w.fp.seq)
                        .and(Err(Error::PeerFailed {
                            rank: self.rank,
                            seq: w.fp.seq,
                            peer,
                            reason: format!(
                                "rank {peer} returned from its closure without issuing {}",
                                w.fp
                            ),
                        })),
                },
                Err(RecvTimeoutError::Timeout) => Ok(None),
                Err(RecvTimeoutError::Disconnected) => Err(Error::PeerFailed {
                    rank: self.rank,
                    seq: w.fp.seq,
                    peer,
                    reason: "its endpoint is gone".into(),
                }),
            },
        )?;
        let (ours, theirs) = if p.fp != w.fp {
            (w.fp.to_string(), p.fp.to_string())
        } else {
            // Same collective, different schedule: only a bug would get here.
            (
                format!("{} expecting {bytes} bytes", w.fp),
                format!("{} sending {} bytes", p.fp, p.len()),
            )
        };
        if p.fp != w.fp || p.len() != bytes {
            return Err(Error::Mismatch {
                rank: self.rank,
                seq: w.fp.seq,
                ours,
                peer: p.from,
                theirs,
            });
        }
        Ok(p)
    }

    /// An empty host buffer from the pool.
    pub(crate) fn buffer(&self) -> Vec<u8> {
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v
    }

    /// Returns a packet's buffer to the pool.
    pub(crate) fn recycle(&self, v: Vec<u8>) {
        let _ = self.pool.push(v);
    }

    /// Drops packets left over from an earlier, failed run.
    pub(crate) fn drain(&self) {
        for rx in &self.from {
            while let Ok(p) = rx.try_recv() {
                self.recycle(p.data);
            }
        }
    }
}

const MAP_PENDING: u8 = 0;
const MAP_READY: u8 = 1;
const MAP_FAILED: u8 = 2;

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
    fn mapped(&self, w: &Waiter, what: &str) -> Result<()> {
        w.until(
            || format!("the {what} buffer to be mapped for {}", w.fp),
            |tick| {
                let seen = w.dev.generation();
                match self.state.load(Ordering::Acquire) {
                    MAP_READY => Ok(Some(())),
                    MAP_FAILED => Err(w.device_error(format!("mapping the {what} buffer failed"))),
                    _ => {
                        // Reports the device's faults; else waits for the
                        // submission, then for its map callback.
                        match self.last_use {
                            Some(t) if !w.dev.is_done(t) => {
                                w.dev.poll_for(t, tick, Some(w.fp.seq))?;
                            }
                            _ => {
                                w.dev.check(Some(w.fp.seq))?;
                                w.dev.wait_change(seen, tick);
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
    staging: Staging,
    hold: Arc<()>,
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
        }
    }

    /// Whether ring steps lend their read-back buffers (see the module docs).
    pub(crate) fn lends(&self) -> bool {
        self.dev.unified
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
    }

    /// Forgets the bind groups of the buffers kernels read (uploads and
    /// scratch) before they are dropped, so that dropping frees them.
    fn forget_buffers(&self) {
        let bound: Vec<wgpu::Buffer> = self
            .uploads
            .iter()
            .map(|s| s.buf.clone())
            .chain(self.scratch.clone())
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
                    Ok(LendSlot {
                        staging: Staging::new(
                            dev,
                            "lent",
                            bytes,
                            U::MAP_READ | U::COPY_DST,
                            false,
                        )?,
                        hold: Arc::new(()),
                    })
                })
                .collect::<Result<_>>()?
        } else {
            Vec::new()
        };
        self.next_lend = 0;
        self.capacity = bytes;
        self.next_upload = 0;
        self.used.clear();
        Ok(())
    }

    /// Records a copy of `src[off..off + bytes]` into the read-back buffer,
    /// to be mapped when the submission completes.
    pub(crate) fn encode_download(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        off: u64,
        bytes: u64,
        w: &Waiter,
    ) -> Result<()> {
        let rb = self
            .readback
            .as_mut()
            .ok_or_else(|| w.device_error("staging used before reserve".into()))?;
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
        w: &Waiter,
    ) -> Result<()> {
        let i = self.next_lend;
        let slot = self
            .lends
            .get_mut(i)
            .ok_or_else(|| w.device_error("lending before reserve".into()))?;
        w.until(
            || format!("the next rank to let go of a lent buffer of {}", w.fp),
            |tick| {
                if Arc::strong_count(&slot.hold) == 1 {
                    // Pairs with the release of the borrowers' drops.
                    std::sync::atomic::fence(Ordering::Acquire);
                    return Ok(Some(()));
                }
                std::thread::sleep(tick.min(std::time::Duration::from_micros(100)));
                Ok(None)
            },
        )?;
        // Its borrowers waited for the map; this only waits when one
        // dropped it unread (a failure).
        if slot.staging.last_use.is_some() {
            slot.staging.mapped(w, "lent")?;
            slot.staging.buf.unmap();
        }
        enc.copy_buffer_to_buffer(src, off, &slot.staging.buf, 0, bytes);
        slot.staging.arm(enc, wgpu::MapMode::Read);
        self.lend_armed = Some(i);
        self.next_lend = i
            .saturating_add(1)
            .checked_rem(self.lends.len())
            .unwrap_or(0);
        Ok(())
    }

    /// After the lending submission `filled`: the handle to post, at once.
    pub(crate) fn finish_lend(&mut self, bytes: u64, filled: Ticket, w: &Waiter) -> Result<Lent> {
        // The slot `encode_lend` just used.
        let i = self
            .next_lend
            .checked_sub(1)
            .unwrap_or(self.lends.len().saturating_sub(1));
        let slot = self
            .lends
            .get(i)
            .ok_or_else(|| w.device_error("lending before reserve".into()))?;
        Ok(Lent {
            buf: slot.staging.buf.clone(),
            bytes,
            _hold: slot.hold.clone(),
            state: slot.staging.state.clone(),
            owner: self.dev.clone(),
            owner_rank: w.rank,
            filled,
        })
    }

    /// After the download's submission: appends the slice to `out`.
    pub(crate) fn finish_download(
        &mut self,
        bytes: usize,
        out: &mut Vec<u8>,
        w: &Waiter,
    ) -> Result<()> {
        let rb = self
            .readback
            .as_ref()
            .ok_or_else(|| w.device_error("staging used before reserve".into()))?;
        rb.mapped(w, "read-back")?;
        {
            let view = rb
                .buf
                .get_mapped_range(..bytes as u64)
                .map_err(|e| w.device_error(format!("read-back view: {e}")))?;
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
        w: &Waiter,
    ) -> Result<()> {
        let src = self.fill_upload(enc, data, w)?;
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
        w: &Waiter,
    ) -> Result<wgpu::Buffer> {
        let src = self.fill_upload(enc, data, w)?;
        if self.dev.unified {
            return Ok(src);
        }
        let scratch = self
            .scratch
            .clone()
            .ok_or_else(|| w.device_error("staging used before reserve".into()))?;
        enc.copy_buffer_to_buffer(&src, 0, &scratch, 0, data.len() as u64);
        Ok(scratch)
    }

    /// Copies `data` into the next upload buffer, which is mapped again once
    /// the submission being encoded in `enc` completes.
    fn fill_upload(
        &mut self,
        enc: &wgpu::CommandEncoder,
        data: &[u8],
        w: &Waiter,
    ) -> Result<wgpu::Buffer> {
        let i = self.next_upload;
        let slot = self
            .uploads
            .get(i)
            .ok_or_else(|| w.device_error("staging used before reserve".into()))?;
        slot.mapped(w, "upload")?;
        {
            let mut view = slot
                .buf
                .get_mapped_range_mut(..data.len() as u64)
                .map_err(|e| w.device_error(format!("upload view: {e}")))?;
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
