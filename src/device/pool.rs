//! Freed tensor buffers, and when one may be handed out again.
//!
//! A caching allocator, as PyTorch's: a tensor's buffer goes back to its
//! rank's pool when the last handle is dropped, so that collectives in
//! steady state create no wgpu resources. Reusing a buffer the device may
//! still be working on is safe only because every later use is submitted
//! to the same queue, after what came before. That holds for submissions
//! already made, not for commands still being recorded: a schedule's
//! scratch tensor dropped before its encoder is submitted (the shared
//! device's concatenation for a coalesced all-reduce was one) would be
//! handed to the next tensor, whose kernel could be submitted first and
//! then be overwritten by the scratch's commands. Ranks that share a device
//! make this likely, since one rank's progress thread records the whole
//! group's steps while every rank's own thread allocates and submits.
//!
//! So every engine encoder is registered in its device's [`Encoders`]
//! while it is open, and a buffer freed while an encoder that was open
//! before the free is still open is held back until that encoder is
//! submitted or dropped. No call site has to remember to keep its scratch
//! alive: the pool cannot hand out a buffer that commands still being
//! recorded may name. (An encoder opened after the free cannot name the
//! buffer: nothing holds a tensor of it any more.)

use std::sync::{Arc, Mutex};

use crate::device::lock;

/// Most bytes of freed buffers a device keeps for reuse.
const POOL_BYTES: u64 = 256 << 20;

/// The buffer size for `bytes`: at least 256, then four classes per
/// doubling, so a pooled buffer wastes at most a quarter of its size and
/// tensors of similar sizes share buffers.
pub(crate) fn size_class(bytes: u64) -> u64 {
    if bytes <= 256 {
        return 256;
    }
    // `bytes > 256`, so the step is at least 64; past 2^63 there is no
    // class above, and the exact size is used.
    bytes
        .checked_next_power_of_two()
        .map(|p| p / 8)
        .and_then(|step| bytes.div_ceil(step).checked_mul(step))
        .unwrap_or(bytes)
}

/// The engine's command encoders open on one device, by the order they
/// were opened in.
#[derive(Default)]
pub(crate) struct Encoders {
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    /// The id the next encoder gets.
    next: u64,
    /// Ids of the encoders open now (a handful; capacity is kept).
    open: Vec<u64>,
}

impl Encoders {
    /// A new encoder on `device`, registered until it is submitted or
    /// dropped.
    pub(crate) fn open(self: &Arc<Self>, device: &wgpu::Device) -> Encoder {
        let id = {
            let mut b = lock(&self.book);
            let id = b.next;
            b.next = b.next.saturating_add(1);
            b.open.push(id);
            id
        };
        Encoder {
            enc: device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None }),
            open: Open {
                book: self.clone(),
                id,
            },
        }
    }

    /// What a buffer freed now must wait for: `Some(mark)` while encoders
    /// opened before now (ids below `mark`) are open, `None` when none is.
    fn mark(&self) -> Option<u64> {
        let b = lock(&self.book);
        (!b.open.is_empty()).then_some(b.next)
    }

    fn oldest_open(&self) -> Option<u64> {
        lock(&self.book).open.iter().copied().min()
    }

    fn close(&self, id: u64) {
        let mut b = lock(&self.book);
        if let Some(i) = b.open.iter().position(|&o| o == id) {
            b.open.swap_remove(i);
        }
    }
}

/// An engine command encoder: a `wgpu::CommandEncoder` whose device's pool
/// holds back buffers freed while it is open (see the module docs). Submit
/// it with `RankDevice::submit`.
pub(crate) struct Encoder {
    enc: wgpu::CommandEncoder,
    open: Open,
}

/// Closes its encoder's registration when dropped: after the submission
/// (see `RankDevice::submit`), or when the encoder is dropped unsubmitted.
pub(crate) struct Open {
    book: Arc<Encoders>,
    id: u64,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.book.close(self.id);
    }
}

impl Encoder {
    /// The commands, and the registration to drop once they are submitted.
    pub(crate) fn finish(self) -> (wgpu::CommandBuffer, Open) {
        (self.enc.finish(), self.open)
    }
}

impl std::ops::Deref for Encoder {
    type Target = wgpu::CommandEncoder;

    fn deref(&self) -> &wgpu::CommandEncoder {
        &self.enc
    }
}

impl std::ops::DerefMut for Encoder {
    fn deref_mut(&mut self) -> &mut wgpu::CommandEncoder {
        &mut self.enc
    }
}

/// One rank's freed buffers, kept by (size, usage).
#[derive(Default)]
pub(crate) struct BufferPool {
    /// Free to hand out.
    free: Vec<wgpu::Buffer>,
    /// Freed while encoders were open: each with its mark, free once every
    /// encoder opened before it has closed.
    held: Vec<(wgpu::Buffer, u64)>,
    /// Bytes of both lists.
    bytes: u64,
}

impl BufferPool {
    /// A free buffer of `size` bytes and `usage`, if one is free.
    pub(crate) fn take(
        &mut self,
        encoders: &Encoders,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Option<wgpu::Buffer> {
        if !self.held.is_empty() {
            let oldest = encoders.oldest_open();
            let free = &mut self.free;
            // Free once every encoder opened before the buffer's free has
            // closed.
            self.held.retain(|(b, mark)| {
                let ready = oldest.is_none_or(|o| o >= *mark);
                if ready {
                    free.push(b.clone());
                }
                !ready
            });
        }
        let i = self
            .free
            .iter()
            .rposition(|b| b.size() == size && b.usage() == usage)?;
        self.bytes = self.bytes.saturating_sub(size);
        Some(self.free.swap_remove(i))
    }

    /// Takes `buffer` back, held while encoders that may name it are open.
    pub(crate) fn put(&mut self, encoders: &Encoders, buffer: wgpu::Buffer) {
        let size = buffer.size();
        if size > POOL_BYTES {
            return;
        }
        // Oldest first out, until the new one fits.
        while self.bytes.saturating_add(size) > POOL_BYTES {
            let old = if !self.free.is_empty() {
                self.free.remove(0)
            } else if !self.held.is_empty() {
                self.held.remove(0).0
            } else {
                break;
            };
            self.bytes = self.bytes.saturating_sub(old.size());
        }
        self.bytes = self.bytes.saturating_add(size);
        match encoders.mark() {
            None => self.free.push(buffer),
            Some(mark) => self.held.push((buffer, mark)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::expect_used, reason = "a test fails on a missing adapter")]
mod tests {
    use super::*;

    /// A device, and its queue, without which it cannot make encoders.
    fn device() -> (wgpu::Device, wgpu::Queue) {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle().with_env());
        let adapter = pollster::block_on(instance.request_adapter(&Default::default()))
            .expect("an adapter (is one installed?)");
        pollster::block_on(adapter.request_device(&Default::default())).expect("a device")
    }

    fn buffer(d: &wgpu::Device) -> wgpu::Buffer {
        d.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 256,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        })
    }

    #[test]
    fn a_buffer_freed_while_an_older_encoder_is_open_waits_for_it() {
        let (d, _queue) = device();
        let encoders = Arc::new(Encoders::default());
        let mut pool = BufferPool::default();
        let usage = wgpu::BufferUsages::STORAGE;
        let enc = encoders.open(&d);
        let b = buffer(&d);
        pool.put(&encoders, b.clone());
        assert!(
            pool.take(&encoders, 256, usage).is_none(),
            "handed out under an open encoder"
        );
        // An encoder opened after the free does not hold it back.
        let later = encoders.open(&d);
        let (_commands, open) = enc.finish();
        drop(open);
        assert_eq!(pool.take(&encoders, 256, usage), Some(b.clone()));
        // Nothing open before it: free at once.
        drop(later);
        pool.put(&encoders, b.clone());
        assert_eq!(pool.take(&encoders, 256, usage), Some(b));
    }

    #[test]
    fn an_encoder_dropped_unsubmitted_releases_what_it_held() {
        let (d, _queue) = device();
        let encoders = Arc::new(Encoders::default());
        let mut pool = BufferPool::default();
        let enc = encoders.open(&d);
        let b = buffer(&d);
        pool.put(&encoders, b.clone());
        drop(enc);
        assert_eq!(
            pool.take(&encoders, 256, wgpu::BufferUsages::STORAGE),
            Some(b)
        );
    }
}
