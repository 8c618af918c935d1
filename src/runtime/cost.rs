//! The cost model: how long a collective should take, from two measured
//! numbers, and which all-reduce algorithm is cheaper for a size.
//!
//! Every hop between ranks is a device round trip through host memory, so
//! a hop of S bytes costs about alpha + S/beta: alpha the fence round trip
//! (submit, wait), beta the host-device-host bandwidth. Both are measured
//! on the adapter when the world is made, never tuned constants: the same
//! model then picks algorithms here and orders work in graph passes.

use std::time::{Duration, Instant};

use crate::device::RankDevice;
use crate::device::tensor::DType;
use crate::error::Result;
use crate::op::ReduceOp;
use crate::runtime::plan::Plan;
use crate::runtime::stats::median_duration as median;

/// Which all-reduce algorithm runs: the coarse choice, as `NCCL_ALGO`
/// names one. Each names a set of [`Plan`](crate::Plan)s (the finer
/// choice: which ring, which device), among which the planner chooses as
/// it would among all; where none of them can run (the direct kernels
/// between devices of their own), it chooses among all. A forced plan is
/// the set of one. More may come, so matches need a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// The planner's choice for each call ([`Plan`](crate::Plan)).
    Auto,
    /// Ring: reduce-scatter then all-gather, 2(n-1) hops of S/n each;
    /// the ring the planner would run ([`Plan::HostRing`](crate::Plan::HostRing) between ranks
    /// with devices of their own on a CPU adapter, else
    /// [`Plan::DeviceRing`](crate::Plan::DeviceRing)).
    Ring,
    /// One shot: every rank sends its whole input to every other and
    /// reduces all n contributions itself (2 round trips, n x the bytes).
    OneShot,
    /// Ranks that share one device: one kernel per part reads every rank's
    /// input and writes every rank's output, with no host copy (the
    /// default there). Where the ranks do not share a device, as `Auto`.
    Direct,
}

impl Algorithm {
    /// `ring`, `oneshot`, `direct` or `auto` (as `WGPU_COLLECTIVES_ALGO` takes them).
    pub fn parse(s: &str) -> Option<Algorithm> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Some(Algorithm::Auto),
            "ring" => Some(Algorithm::Ring),
            "oneshot" | "one-shot" | "one_shot" => Some(Algorithm::OneShot),
            "direct" => Some(Algorithm::Direct),
            _ => None,
        }
    }

    /// Whether `plan` is one of the all-reduce plans this algorithm names
    /// (`Auto` names them all).
    pub(crate) fn admits(self, plan: Plan) -> bool {
        match self {
            Algorithm::Auto => true,
            Algorithm::Ring => matches!(plan, Plan::DeviceRing | Plan::HostRing),
            Algorithm::OneShot => plan == Plan::OneShot,
            Algorithm::Direct => plan == Plan::Direct,
        }
    }

    /// The name `parse` takes.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Auto => "auto",
            Algorithm::Ring => "ring",
            Algorithm::OneShot => "oneshot",
            Algorithm::Direct => "direct",
        }
    }
}

/// Two bandwidths the cost model's hop figures do not cover: host memory
/// (what the host ring's steps move) and the device's own copies (what
/// the direct kernels move).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rates {
    /// Bytes per second one host thread copies.
    pub host: f64,
    /// Bytes per second the device copies within itself.
    pub device: f64,
}

impl Rates {
    /// Measures both on `dev` (a few milliseconds).
    pub(crate) fn measure(dev: &RankDevice) -> Result<Rates> {
        let bytes = 1usize << 20;
        let (src, mut dst) = (vec![1u8; bytes], vec![0u8; bytes]);
        let mut host = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            host.push(t.elapsed());
        }
        let usage = wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST;
        let (a, b) = (
            dev.create_buffer("cost model", bytes as u64, usage, false)?,
            dev.create_buffer("cost model", bytes as u64, usage, false)?,
        );
        let time = |k: usize| -> Result<Duration> {
            let mut enc = dev.encoder();
            for _ in 0..k {
                enc.copy_buffer_to_buffer(&a, 0, &b, 0, bytes as u64);
            }
            let t = Instant::now();
            let idx = dev.submit(enc, None)?;
            dev.wait(idx, None, "timing device copies")?;
            Ok(t.elapsed())
        };
        time(1)?; // first touch of both buffers
        let (mut one, mut more) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            one.push(time(1)?);
            more.push(time(5)?);
        }
        let per_copy = median(more)
            .saturating_sub(median(one))
            .div_f64(4.0)
            .max(Duration::from_nanos(1));
        let rate = |d: Duration| bytes as f64 / d.max(Duration::from_nanos(1)).as_secs_f64();
        Ok(Rates {
            host: rate(median(host)),
            device: rate(per_copy),
        })
    }
}

/// An alpha-beta model of one hop between ranks, plus the fixed cost of
/// one reduction dispatch (which the one-shot pays n(n-1) times).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    /// Fixed cost of a hop: the fence round trip.
    pub alpha: Duration,
    /// Bytes per second through a hop (host-device-host).
    pub beta: f64,
    /// Fixed cost of one small reduction dispatch.
    pub dispatch: Duration,
}

impl CostModel {
    /// The figures as words, for processes to agree on (see `from_words`).
    #[cfg(feature = "mpi")]
    pub(crate) fn to_words(self) -> [u64; 3] {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        [nanos(self.alpha), self.beta.to_bits(), nanos(self.dispatch)]
    }

    /// The model whose `to_words` start `words`.
    #[cfg(feature = "mpi")]
    pub(crate) fn from_words(words: &[u64]) -> Option<CostModel> {
        match words {
            [alpha, beta, dispatch, ..] => Some(CostModel {
                alpha: Duration::from_nanos(*alpha),
                beta: f64::from_bits(*beta),
                dispatch: Duration::from_nanos(*dispatch),
            }),
            _ => None,
        }
    }

    /// Measures alpha and beta on `dev` (a few milliseconds).
    pub(crate) fn measure(dev: &RankDevice) -> Result<CostModel> {
        let mut fences = Vec::new();
        for _ in 0..9 {
            let mut enc = dev.encoder();
            drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default()));
            let t = Instant::now();
            let idx = dev.submit(enc, None)?;
            dev.wait(idx, None, "a fence round trip")?;
            fences.push(t.elapsed());
        }
        let bytes = 1usize << 20;
        let buffer = dev.create_buffer(
            "cost model",
            bytes as u64,
            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            false,
        )?;
        let (data, mut back) = (vec![1u8; bytes], vec![0u8; bytes]);
        let mut trips = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            dev.write_buffer(&buffer, &data)?;
            dev.read_buffer(&buffer, 0, &mut back)?;
            trips.push(t.elapsed());
        }
        let alpha = median(fences);
        let trip = median(trips)
            .saturating_sub(alpha)
            .max(Duration::from_nanos(1));
        Ok(CostModel {
            alpha,
            beta: bytes as f64 / trip.as_secs_f64(),
            dispatch: Self::measure_dispatch(dev)?,
        })
    }

    /// The cost of one more 16-byte f32 sum dispatch in a submission (the
    /// pipeline is the one the first f32 sum all-reduce uses anyway).
    fn measure_dispatch(dev: &RankDevice) -> Result<Duration> {
        let r = dev.kernels.reducer(dev, DType::F32, ReduceOp::Sum, 0)?;
        let usage = wgpu::BufferUsages::STORAGE;
        let (a, b) = (
            dev.create_buffer("cost model", 16, usage, false)?,
            dev.create_buffer("cost model", 16, usage, false)?,
        );
        let time = |k: usize| -> Result<Duration> {
            let mut enc = dev.encoder();
            for _ in 0..k {
                r.encode(dev, &mut enc, &a, 0, &b, 0, 16, None)?;
            }
            let t = Instant::now();
            let idx = dev.submit(enc, None)?;
            dev.wait(idx, None, "timing dispatches")?;
            Ok(t.elapsed())
        };
        time(16)?; // compile and warm
        let (mut one, mut many) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            one.push(time(1)?);
            many.push(time(17)?);
        }
        Ok(median(many).saturating_sub(median(one)).div_f64(16.0))
    }

    fn hop(&self, bytes: f64) -> f64 {
        self.alpha.as_secs_f64() + bytes / self.beta
    }

    /// Estimated ring all-reduce time: 2(n-1) hops of S/n, n-1 reductions.
    pub fn ring_all_reduce(&self, n: usize, bytes: usize) -> Duration {
        if n < 2 {
            return Duration::ZERO;
        }
        let steps = n.saturating_sub(1) as f64;
        let hops = 2.0 * steps * self.hop(bytes as f64 / n as f64);
        seconds(hops + steps * self.dispatch.as_secs_f64())
    }

    /// Estimated one-shot all-reduce time: S out to the host, n
    /// contributions back in, and n(n-1) reductions (each chunk reduced in
    /// the ring's order, so that both give the same bits).
    pub fn one_shot_all_reduce(&self, n: usize, bytes: usize) -> Duration {
        if n < 2 {
            return Duration::ZERO;
        }
        let hops = self.hop(bytes as f64) + self.hop(n as f64 * bytes as f64);
        let reductions = n as f64 * n.saturating_sub(1) as f64;
        seconds(hops + reductions * self.dispatch.as_secs_f64())
    }

    /// The cheaper all-reduce for `bytes` on `n` ranks (the ring on ties).
    pub fn all_reduce_algorithm(&self, n: usize, bytes: usize) -> Algorithm {
        if self.one_shot_all_reduce(n, bytes) < self.ring_all_reduce(n, bytes) {
            Algorithm::OneShot
        } else {
            Algorithm::Ring
        }
    }

    /// The largest size for which one shot is the cheaper (0: never).
    pub fn one_shot_threshold(&self, n: usize) -> usize {
        // Both costs are linear in S; find where they cross.
        let (mut lo, mut hi) = (0usize, 1usize << 34);
        if self.all_reduce_algorithm(n, 1) != Algorithm::OneShot {
            return 0;
        }
        while hi.abs_diff(lo) > 1 {
            let mid = lo.midpoint(hi);
            if self.all_reduce_algorithm(n, mid) == Algorithm::OneShot {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

impl CostModel {
    /// The estimated time of an all-reduce of `bytes` on `n` ranks under
    /// `plan`, with `rates` for what the hop figures do not cover; `None`
    /// for a plan all-reduce does not offer. Every plan's price is here.
    pub(crate) fn price(
        &self,
        rates: &Rates,
        plan: Plan,
        n: usize,
        bytes: usize,
    ) -> Option<Duration> {
        match plan {
            Plan::DeviceRing => Some(self.ring_all_reduce(n, bytes)),
            Plan::OneShot => Some(self.one_shot_all_reduce(n, bytes)),
            Plan::HostRing => {
                if n < 2 {
                    return Some(Duration::ZERO);
                }
                // Down and up once, then the ring's 2(n-1) steps of S/n
                // and n-1 folds of S/n, all in host memory.
                let s = bytes as f64;
                let steps = 3.0 * n.saturating_sub(1) as f64 * s / n as f64;
                Some(seconds(
                    self.alpha.as_secs_f64() + s / self.beta + steps / rates.host,
                ))
            }
            Plan::Direct => {
                // One submission: a kernel per part reads n inputs and
                // writes n outputs on the device.
                let moved = 2.0 * n as f64 * bytes as f64;
                Some(seconds(
                    self.alpha.as_secs_f64()
                        + n as f64 * self.dispatch.as_secs_f64()
                        + moved / (2.0 * rates.device),
                ))
            }
            _ => None,
        }
    }
}

/// An estimate in seconds as a `Duration`: negative or NaN is zero, too
/// large is `Duration::MAX` (a model with a zero bandwidth, say).
pub(crate) fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}
