//! One rank's wgpu device, and the few device operations everything else uses.
//!
//! wgpu's default reaction to a validation error is to panic, and its default
//! reaction to running out of memory is a validation error on a buffer that
//! then poisons every later use. A collective library cannot do either to
//! its users, so every resource is created inside an error scope. On a
//! device the engine made, errors that escape scopes (they happen at submit
//! time) are caught by an uncaptured-error handler and a device-lost
//! callback; on a device a user handed in, those global callbacks belong to
//! whoever made it (cubecl installs its own), so submissions go inside error
//! scopes too. Either way they become [`Error::Device`] at the next point
//! where the rank checks.
//!
//! Submitting and polling belong to the device's owner (`owner.rs`).

pub(crate) mod direct;
pub(crate) mod hostmem;
pub(crate) mod kernels;
mod owner;
mod pool;
pub(crate) mod tensor;
pub(crate) mod timestamps;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::device::kernels::Kernels;
use crate::error::{Error, Result};

use owner::Owner;
pub(crate) use owner::{OnDone, Signal, Ticket};
use pool::{BufferPool, Encoders};
pub(crate) use pool::{Encoder, size_class};

/// What the engine asks of a device it makes, beyond what the user requires.
pub(crate) struct Wants {
    pub features: wgpu::Features,
    pub limits: Option<wgpu::Limits>,
    /// Whether the device imports host memory (see `hostmem.rs`).
    pub import: Import,
}

/// Whether a device is to import host memory, which hops between separate
/// devices then go through (see `hostmem.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Import {
    /// Where the adapter and device can.
    IfAble,
    /// Always: a device that cannot is an error saying why.
    Required,
    /// Never: hops are staged.
    Never,
}

/// One rank's handle to a device: the rank (for errors and for telling
/// whose tensor is whose) and the device it runs on, which ranks placed
/// on one device share (see [`RankDevice::share`]).
pub(crate) struct RankDevice {
    /// The rank in the world.
    pub rank: usize,
    core: Arc<Core>,
    /// Freed tensor buffers, reused for this rank's outputs. A pool per
    /// rank, not per device: each rank's outputs keep coming back to it,
    /// so the bind groups that name them recur and stay cached.
    pool: Mutex<BufferPool>,
    /// Resources this rank created (buffers, bind groups, pipelines): the
    /// steady-state allocation counter tests read.
    created: AtomicU64,
}

impl std::ops::Deref for RankDevice {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

/// A device and queue, plus what we learned about its adapter: one per
/// wgpu device, however many ranks run on it.
pub(crate) struct Core {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// The adapter, when the engine made the device.
    pub adapter: Option<wgpu::Adapter>,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    /// How long any single wait on this device may take.
    pub timeout: Duration,
    /// Compiled kernels, made once per device.
    pub kernels: Kernels,
    /// The shared-device reduction's kernels, made on first use.
    pub direct: direct::DirectKernels,
    /// Whether storage buffers may also be mappable (CPU and integrated adapters).
    pub unified: bool,
    /// Whether passes can write GPU timestamps (`TIMESTAMP_QUERY`).
    pub timestamps: bool,
    /// The alignment of host memory this device imports, when hops to and
    /// from it go through host memory both ends map; else why they are
    /// staged.
    pub imports: std::result::Result<u64, String>,
    /// Submits, and learns when submissions complete.
    owner: Owner,
    /// The engine's encoders open on this device, which the ranks' pools
    /// consult before handing out a freed buffer (see `pool.rs`).
    encoders: Arc<Encoders>,
}

impl RankDevice {
    /// Makes rank `rank`'s device on `adapter`: every limit the adapter has,
    /// the features the engine likes where the adapter has them, and what
    /// the user requires (an adapter without it is an error that says so).
    pub(crate) fn new(
        rank: usize,
        adapter: &wgpu::Adapter,
        timeout: Duration,
        wants: &Wants,
    ) -> Result<Arc<RankDevice>> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let missing = wants.features.difference(adapter.features());
        if !missing.is_empty() {
            return Err(Error::device(
                rank,
                None,
                format!(
                    "the required features {missing:?} are missing on {} (it has {:?})",
                    info.name,
                    adapter.features()
                ),
            ));
        }
        if let Some(required) = &wants.limits {
            let mut over = Vec::new();
            required.check_limits_with_fail_fn(&limits, false, |name, want, have| {
                over.push(format!("{name}: required {want}, the adapter has {have}"));
            });
            if !over.is_empty() {
                return Err(Error::device(
                    rank,
                    None,
                    format!(
                        "the required limits exceed {}'s: {}",
                        info.name,
                        over.join("; ")
                    ),
                ));
            }
        }
        // Where device memory is host memory, kernels can read the buffers
        // that received bytes are written into, saving a copy per hop. On
        // discrete GPUs such buffers would live in slow host memory.
        let mut required_features = wants.features;
        if host_memory(&info) {
            required_features |= adapter.features() & wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        // For the profile's kernel times; never required.
        required_features |= adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
        let desc = wgpu::DeviceDescriptor {
            label: Some(&format!("rank {rank}")),
            required_features,
            required_limits: limits,
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let failed = |e: String| {
            Error::device(
                rank,
                None,
                format!("requesting a device on {}: {e}", info.name),
            )
        };
        // With host memory imports where the adapter has them; whether
        // a world may go without is the world's to say (ranks that share
        // one device need none).
        let (opened, refused) = match wants.import {
            Import::Never => (None, None),
            Import::IfAble | Import::Required => match hostmem::request_device(adapter, &desc) {
                Ok(d) => (Some(d), None),
                Err(why) => (None, Some(why)),
            },
        };
        let (device, queue) = match opened {
            Some(d) => d,
            None => pollster::block_on(adapter.request_device(&desc))
                .map_err(|e| failed(e.to_string()))?,
        };
        let import = match refused {
            Some(why) => Err(why),
            None => Ok(wants.import),
        };
        Self::build(
            rank,
            device,
            queue,
            Some(adapter.clone()),
            true,
            timeout,
            import,
        )
    }

    /// Adopts a device the user made: whatever features and limits it has
    /// (the engine falls back where one it likes is missing), and no global
    /// callbacks, which belong to whoever made it.
    pub(crate) fn adopt(
        rank: usize,
        device: wgpu::Device,
        queue: wgpu::Queue,
        timeout: Duration,
        import: Import,
    ) -> Result<Arc<RankDevice>> {
        Self::build(rank, device, queue, None, false, timeout, Ok(import))
    }

    fn build(
        rank: usize,
        device: wgpu::Device,
        queue: wgpu::Queue,
        adapter: Option<wgpu::Adapter>,
        owned: bool,
        timeout: Duration,
        import: std::result::Result<Import, String>,
    ) -> Result<Arc<RankDevice>> {
        let info = device.adapter_info();
        // `Err`: why the device was opened without imports.
        let imports = match import {
            Err(why) => Err(why),
            Ok(Import::Never) => Err("staging was asked for (WorldConfig::with_host_link or \
                                      WGPU_COLLECTIVES_HOST_LINK=staging)"
                .to_string()),
            Ok(_) => hostmem::device_alignment(&device),
        };
        let features = device.features();
        let unified =
            host_memory(&info) && features.contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS);
        let timestamps = features.contains(wgpu::Features::TIMESTAMP_QUERY);
        let owner = Owner::start(&device, &queue, format!("device-{rank}"), timeout)
            .map_err(|e| Error::device(rank, None, format!("starting the device owner: {e}")))?;
        if owned {
            let sink = owner.signal();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                sink.fault(format!("uncaptured: {e}"), false);
            }));
            let sink = owner.signal();
            device.set_device_lost_callback(move |reason, msg| {
                sink.fault(format!("device lost ({reason:?}): {msg}"), true);
            });
        }
        Ok(Arc::new(RankDevice {
            rank,
            pool: Mutex::new(BufferPool::default()),
            created: AtomicU64::new(0),
            core: Arc::new(Core {
                limits: device.limits(),
                device,
                queue,
                adapter,
                info,
                timeout,
                kernels: Kernels::default(),
                direct: direct::DirectKernels::default(),
                unified,
                timestamps,
                imports,
                owner,
                encoders: Arc::default(),
            }),
        }))
    }

    /// Rank `rank` on this same device (its queue, owner, pool and kernels).
    pub(crate) fn share(&self, rank: usize) -> Arc<RankDevice> {
        Arc::new(RankDevice {
            rank,
            core: self.core.clone(),
            pool: Mutex::new(BufferPool::default()),
            created: AtomicU64::new(0),
        })
    }

    /// Names this rank's wgpu device within the process: ranks with the
    /// same key share it.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.core).addr()
    }

    /// Whether `other` runs on the same wgpu device as this rank.
    /// Bytes a kernel's binding offset must be a multiple of (the
    /// adapter's storage-offset alignment, at least one 16-byte unit).
    pub(crate) fn binding_align(&self) -> u64 {
        u64::from(self.limits.min_storage_buffer_offset_alignment.max(16))
    }

    pub(crate) fn same_device(&self, other: &RankDevice) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }

    /// Fails if the device reported an error outside any scope, or was lost.
    pub(crate) fn check(&self, seq: Option<u64>) -> Result<()> {
        match self.owner.take_fault() {
            None => Ok(()),
            Some(msg) => Err(Error::device(self.rank, seq, msg)),
        }
    }

    /// Number of wgpu resources this device has created through us.
    pub(crate) fn resources_created(&self) -> u64 {
        self.created.load(Ordering::Relaxed)
    }

    pub(crate) fn count_resource(&self) {
        self.created.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `make` inside validation and out-of-memory error scopes, so that
    /// a bad request becomes an `Error` instead of a panic or a poisoned handle.
    pub(crate) fn scoped<T>(&self, what: &str, make: impl FnOnce(&wgpu::Device) -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let made = make(&self.device);
        let v = pollster::block_on(validation.pop());
        let o = pollster::block_on(oom.pop());
        match v.or(o) {
            Some(e) => Err(Error::device(self.rank, None, format!("{what}: {e}"))),
            None => Ok(made),
        }
    }

    pub(crate) fn create_buffer(
        &self,
        label: &str,
        size: u64,
        usage: wgpu::BufferUsages,
        mapped_at_creation: bool,
    ) -> Result<wgpu::Buffer> {
        self.check_buffer_size(label, size)?;
        self.count_resource();
        self.scoped(&format!("creating {label} buffer of {size} bytes"), |d| {
            d.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation,
            })
        })
    }

    /// Whether a `label` buffer of `size` bytes fits this adapter.
    pub(crate) fn check_buffer_size(&self, label: &str, size: u64) -> Result<()> {
        if size > self.limits.max_buffer_size {
            return Err(Error::device(
                self.rank,
                None,
                format!(
                    "creating {label} buffer of {size} bytes: larger than this adapter's \
                     max_buffer_size ({} bytes)",
                    self.limits.max_buffer_size
                ),
            ));
        }
        Ok(())
    }

    /// A buffer of `size` bytes with `usage`, from the pool when one is
    /// free. Its contents are whatever the last user left: only for outputs
    /// that are overwritten whole before they are read.
    pub(crate) fn reuse_buffer(
        &self,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        if let Some(b) = lock(&self.pool).take(&self.encoders, size, usage) {
            return Ok(b);
        }
        self.create_buffer("tensor", size, usage, false)
    }

    /// Gives a tensor's buffer back for reuse. Safe while the device may
    /// still be using it: every later use is submitted to the same queue,
    /// so runs after what came before; and while encoders that may have
    /// recorded it are still open, the pool holds it back (`pool.rs`).
    pub(crate) fn recycle_buffer(&self, buffer: wgpu::Buffer) {
        lock(&self.pool).put(&self.encoders, buffer);
    }

    /// Schedules `data` to be written at the start of `buffer` (padded to
    /// whole words), ahead of the next submission on this queue.
    pub(crate) fn write_buffer(&self, buffer: &wgpu::Buffer, data: &[u8]) -> Result<()> {
        let padded = (data.len() as u64).next_multiple_of(4);
        let Some(size) = wgpu::BufferSize::new(padded) else {
            return Ok(());
        };
        let written = self.scoped("writing a tensor", |_| {
            let Some(mut view) = self.queue.write_buffer_with(buffer, 0, size) else {
                return false;
            };
            view.slice(..data.len()).copy_from_slice(data);
            let tail = (padded as usize).saturating_sub(data.len());
            if tail > 0 {
                view.slice(data.len()..)
                    .copy_from_slice(&[0u8; 3][..tail.min(3)]);
            }
            true
        })?;
        if written {
            Ok(())
        } else {
            Err(Error::device(
                self.rank,
                None,
                format!("could not stage {} bytes for a tensor", data.len()),
            ))
        }
    }

    /// Zero-fills `buffer` (a pooled buffer holds its last owner's bytes).
    pub(crate) fn clear_buffer(&self, buffer: &wgpu::Buffer) -> Result<()> {
        let mut enc = self.encoder();
        enc.clear_buffer(buffer, 0, None);
        self.submit(enc, None).map(|_| ())
    }

    /// Waits for everything submitted through the engine so far (bounded
    /// by the timeout).
    pub(crate) fn finish_all(&self) -> Result<()> {
        let t = self.submit(self.encoder(), None)?;
        self.wait(t, None, "the submitted work")
    }

    /// An encoder for engine commands: buffers freed while it is open are
    /// not handed out again until it is submitted or dropped.
    pub(crate) fn encoder(&self) -> Encoder {
        self.encoders.open(&self.device)
    }

    /// Submits what `encoder` recorded, inside error scopes on every
    /// device (the engine's and the user's alike): a submission that fails
    /// validation (a destroyed or still-mapped buffer, say) is an error for
    /// the call that made it, naming this rank, and never reaches the
    /// owner's queue of submissions to wait for, so the device goes on.
    pub(crate) fn submit(&self, encoder: Encoder, seq: Option<u64>) -> Result<Ticket> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        // Buffers freed while it was open are handed out only once its
        // commands are on the queue (`open` is dropped after the submit).
        let (commands, open) = encoder.finish();
        let t = self
            .owner
            .submit(commands, || {
                let v = pollster::block_on(validation.pop());
                let o = pollster::block_on(oom.pop());
                v.or(o).map(|e| e.to_string())
            })
            .map_err(|e| {
                Error::device(
                    self.rank,
                    seq,
                    format!("a submission failed validation (nothing of it ran): {e}"),
                )
            });
        drop(open);
        let t = t?;
        // A device lost before or during the submit runs nothing.
        self.check(seq)?;
        Ok(t)
    }

    /// Waits for `t` at most `limit`; `Ok(false)` when it is still running.
    pub(crate) fn poll_for(&self, t: Ticket, limit: Duration, seq: Option<u64>) -> Result<bool> {
        let r = self.owner.wait(t, limit);
        self.check(seq)?;
        r.map_err(|e| Error::device(self.rank, seq, format!("waiting for a submission: {e}")))
    }

    /// Whether `t` has completed (never blocks).
    pub(crate) fn is_done(&self, t: Ticket) -> bool {
        self.owner.is_done(t)
    }

    /// Waits for `t` without taking this device's faults, which are its
    /// own rank's to report: for another rank, one that borrowed a buffer
    /// this device fills. `Ok(false)` when it is still running after
    /// `limit`, or anything happened after generation `seen`.
    pub(crate) fn wait_quietly(
        &self,
        t: Ticket,
        seen: u64,
        limit: Duration,
    ) -> std::result::Result<bool, String> {
        self.owner.wait_since(t, Some(seen), limit)
    }

    /// Waits for `t` until `limit` passes or anything happens after
    /// generation `seen` (a completion, a map, a fault, a ring of
    /// [`map_signal`](Self::map_signal)); this device's faults are errors.
    pub(crate) fn poll_since(
        &self,
        t: Ticket,
        seen: u64,
        limit: Duration,
        seq: Option<u64>,
    ) -> Result<bool> {
        let r = self.owner.wait_since(t, Some(seen), limit);
        self.check(seq)?;
        r.map_err(|e| Error::device(self.rank, seq, format!("waiting for a submission: {e}")))
    }

    /// Runs `f` once `t` completes (`true`) or the device fails (`false`).
    pub(crate) fn on_done(&self, t: Ticket, f: OnDone) {
        self.owner.on_done(t, f);
    }

    /// The generation of this device's events, for [`RankDevice::wait_change`].
    pub(crate) fn generation(&self) -> u64 {
        self.owner.generation()
    }

    /// Waits at most `limit` for an event after generation `seen`: a
    /// completion, a map callback (see [`RankDevice::map_signal`]), a fault.
    pub(crate) fn wait_change(&self, seen: u64, limit: Duration) {
        self.owner.wait_change(seen, limit);
    }

    /// For map callbacks: call `notify` on it when the map is done, so that
    /// waiters wake.
    pub(crate) fn map_signal(&self) -> Arc<Signal> {
        self.owner.signal()
    }

    /// Waits for `t` at most the device timeout.
    pub(crate) fn wait(&self, t: Ticket, seq: Option<u64>, what: &str) -> Result<()> {
        let start = Instant::now();
        if self.poll_for(t, self.timeout, seq)? {
            return Ok(());
        }
        Err(Error::Timeout {
            rank: self.rank,
            seq: seq.unwrap_or(0),
            what: format!("device did not finish {what}"),
            after: start.elapsed(),
            flight: String::new(),
        })
    }

    /// Submits `enc`, which maps `buffer` for reading when it completes,
    /// and waits (at most the timeout) until the map has happened.
    pub(crate) fn submit_and_map(
        &self,
        enc: Encoder,
        buffer: &wgpu::Buffer,
        bytes: u64,
        seq: Option<u64>,
        what: &str,
    ) -> Result<()> {
        let mapped = Arc::new(Mutex::new(None));
        let (m, signal) = (mapped.clone(), self.map_signal());
        enc.map_buffer_on_submit(buffer, wgpu::MapMode::Read, ..bytes, move |r| {
            *lock(&m) = Some(r.is_ok());
            signal.notify();
        });
        let t = self.submit(enc, seq)?;
        self.wait(t, seq, what)?;
        // The map callback runs in whichever thread's poll saw the
        // submission complete, maybe a moment after the owner published it.
        let deadline = crate::deadline::after(self.timeout);
        loop {
            let seen = self.generation();
            match *lock(&mapped) {
                Some(true) => return Ok(()),
                Some(false) => {
                    return Err(Error::device(
                        self.rank,
                        seq,
                        format!("mapping {what} failed"),
                    ));
                }
                None => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::device(
                    self.rank,
                    seq,
                    format!("the map callback of {what} never ran"),
                ));
            }
            self.wait_change(seen, deadline.saturating_duration_since(now));
        }
    }

    /// Copies `out.len()` bytes of `buffer` from byte `offset` (a multiple
    /// of 4, with the rounded-up length inside the buffer) to the host. Not
    /// a hot path: it makes a staging buffer per call.
    pub(crate) fn read_buffer(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let size = (out.len() as u64).next_multiple_of(4);
        let staging = self.create_buffer(
            "readback",
            size,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            false,
        )?;
        let mut enc = self.encoder();
        enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
        self.submit_and_map(enc, &staging, size, None, "a tensor read-back")?;
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| Error::device(self.rank, None, format!("read-back view: {e}")))?;
            out.copy_from_slice(&view[..out.len()]);
        }
        staging.unmap();
        Ok(())
    }
}

/// Whether an adapter's device memory is host memory.
fn host_memory(info: &wgpu::AdapterInfo) -> bool {
    matches!(
        info.device_type,
        wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu
    )
}

/// Locks a mutex, ignoring poisoning: our critical sections leave the data
/// consistent even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
