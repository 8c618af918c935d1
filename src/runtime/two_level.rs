//! all_reduce in two levels across processes whose ranks share one device
//! each, as Horovod's hierarchical all_reduce and NCCL's trees between
//! nodes do: the ring between separate devices is the slow part of a
//! world spread over processes, while ranks on one device reduce with the
//! direct kernels at the device's own speed. So:
//!
//! 1. each process's ranks meet on their device, and one submission folds
//!    chunk c of every rank's input into rank c's shard (the direct
//!    kernels, in the order of `Steps::reduce_from`);
//! 2. the ranks holding shard c, one per process, all-reduce it over a
//!    ring between processes (the host ring where the host folds this
//!    adapter's bits, else the device ring), which applies Avg's division
//!    by the world's size at its last fold. Where the device imports host
//!    memory, step 1 writes the shard into the host image the host ring
//!    folds, and step 3 copies out of it: no copy down or up;
//! 3. the process's ranks meet again, and one submission copies every
//!    shard into every rank's output.
//!
//! Each element is folded over its process's ranks first, then over the
//! processes: an order that depends on the process layout, so for
//! floating-point dtypes the plan runs only under `FoldOrder::Fastest`
//! (`fold_order.rs`). Only the schedule lives here; the planner decides
//! when it runs (`planner.rs`).
#![allow(
    clippy::arithmetic_side_effects,
    reason = "layout math over a collective's tensors, whose byte sizes were checked when they were made, and ranks below n <= MAX_RANKS"
)]

use std::sync::Arc;

use crate::algo::direct::Steps;
use crate::algo::fold::HostFold;
use crate::algo::{PART_ALIGN_BYTES, ring};
use crate::device::hostmem::HostImage;
use crate::device::tensor::Tensor;
use crate::device::{RankDevice, Ticket};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::fingerprint::Fingerprint;
use crate::runtime::host_ring::HostSteps;
use crate::runtime::prims::Prims;
use crate::transport::shared::Meeting;

/// What a rank hands to its process's meeting: the buffer a phase reads
/// and the one it writes.
struct Hand {
    fp: Fingerprint,
    src: wgpu::Buffer,
    dst: wgpu::Buffer,
}

/// Where one process's ranks meet on their shared device, and how the
/// world's ranks lie over the processes.
pub(crate) struct Tier {
    meeting: Arc<Meeting<Hand, Result<Ticket>>>,
    /// This process's first rank.
    base: usize,
    /// Ranks per process.
    local: usize,
    /// For each local rank l, the ranks of the ring between processes
    /// that its shard takes: l, l + local, l + 2·local, ...
    rings: Vec<Arc<[usize]>>,
    /// Whether the exchange between processes folds on the host (the
    /// host ring), as the planner's rule for separate devices says.
    pub host_fold: bool,
}

impl std::fmt::Debug for Tier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tier({} processes x {} ranks, from rank {})",
            self.rings.first().map_or(0, |r| r.len()),
            self.local,
            self.base
        )
    }
}

impl Tier {
    /// The tier of a process whose `local` ranks, from `base`, share one
    /// device, in a world of `processes` such processes (only a world over
    /// MPI has one).
    #[cfg(any(feature = "mpi", test))]
    pub(crate) fn new(base: usize, local: usize, processes: usize, host_fold: bool) -> Tier {
        Tier {
            meeting: Arc::new(Meeting::new(local)),
            base,
            local,
            rings: (0..local)
                .map(|l| (0..processes).map(|q| q * local + l).collect())
                .collect(),
            host_fold,
        }
    }

    /// The same layout with a meeting of its own (a timing world's).
    pub(crate) fn fresh(&self) -> Tier {
        Tier {
            meeting: Arc::new(Meeting::new(self.local)),
            rings: self.rings.clone(),
            ..*self
        }
    }

    /// Forgets what a failed run left at the meeting.
    pub(crate) fn clear(&self) {
        self.meeting.clear();
    }

    /// The processes the tier spans, and the ranks each holds.
    pub(crate) fn shape(&self) -> (usize, usize) {
        (self.rings.first().map_or(0, |r| r.len()), self.local)
    }

    /// Whether the plan can run over a group of `n` ranks (whether the
    /// device can bind what the direct kernels need was agreed by every
    /// process when the tier was made).
    pub(crate) fn fits(&self, n: usize) -> bool {
        let (processes, local) = self.shape();
        local >= 2 && processes >= 2 && local.checked_mul(processes) == Some(n)
    }
}

/// Where a rank's shard lives between the meetings: in a host image its
/// device imports, where the exchange folds it in place (no copy down or
/// up), or in a pooled tensor on the device.
enum Shard {
    Image(HostImage),
    Tensor(Tensor),
}

impl Shard {
    fn buffer(&self) -> &wgpu::Buffer {
        match self {
            Shard::Image(img) => img.buffer(),
            Shard::Tensor(t) => t.buffer(),
        }
    }
}

/// All-reduces `x` into `out` on this rank (`p.w.rank`) of a world laid
/// out as `tier` says, on `dev`, folding as `fold` says (Avg divides by
/// its rank count, the world's). Where the exchange folds on the host
/// and the device imports host memory, the shard is folded in a host
/// image; otherwise `exchange` all-reduces it (a tensor of words) over
/// the ring `p` is set to, between processes.
pub(crate) fn all_reduce(
    p: &mut Prims<'_>,
    dev: &Arc<RankDevice>,
    tier: &Tier,
    (x, out): (&Tensor, &Tensor),
    fold: HostFold,
    exchange: impl FnOnce(&mut Prims<'_>, &Tensor) -> Result<()>,
) -> Result<()> {
    let rank = p.w.rank;
    let l = rank
        .checked_sub(tier.base)
        .filter(|&l| l < tier.local)
        .ok_or_else(|| {
            p.w.device_error(format!(
                "rank {rank} is not one of this process's ranks {}..{}",
                tier.base,
                tier.base + tier.local
            ))
        })?;
    let words = x.words();
    if words == 0 {
        return Ok(());
    }
    let align = p.align_words().max(PART_ALIGN_BYTES / 4);
    let q = words.div_ceil(tier.local).div_ceil(align) * align;
    let span = |c: usize| {
        let from = (c * q).min(words);
        (from, q.min(words - from))
    };
    let mine = span(l).1;
    let image = if tier.host_fold {
        p.stage.take_image((mine.max(1) * 4) as u64)?
    } else {
        None
    };
    let mut shard = match image {
        Some(img) => Shard::Image(img),
        None => Shard::Tensor(Tensor::output(dev, DType::U32, mine.max(1))?),
    };
    let round = p.w.fp.seq.wrapping_mul(2);

    // 1. Chunk c of every rank's input, folded into rank c's shard. Avg
    //    sums here; the exchange's last fold divides by the world's size.
    let (dtype, op) = (fold.dtype, fold.op);
    let fold_op = if op == ReduceOp::Avg {
        ReduceOp::Sum
    } else {
        op
    };
    let folded = meet(
        p,
        tier,
        l,
        round,
        (x.buffer(), shard.buffer()),
        |steps, hands| {
            let xs: Vec<&wgpu::Buffer> = hands.iter().map(|h| &h.src).collect();
            for (c, h) in hands.iter().enumerate() {
                let (from, len) = span(c);
                steps.reduce_from(
                    dtype,
                    fold_op,
                    &xs,
                    c,
                    from as u64 * 4,
                    &h.dst,
                    len as u64 * 4,
                )?;
            }
            Ok(())
        },
    )?;

    // 2. The shard over the ring of its holders in every process.
    if mine > 0 {
        let ring = tier.rings.get(l).cloned().unwrap_or_else(|| Arc::from([]));
        let place = tier.base / tier.local.max(1);
        let saved = (p.nranks, p.ring.replace((place, ring.clone())));
        p.nranks = ring.len();
        let exchanged = match &mut shard {
            Shard::Image(img) => {
                img.used_by(folded);
                on_image(p, img, folded, mine, fold)
            }
            Shard::Tensor(t) => {
                let buf = std::mem::replace(&mut p.buf, t.buffer().clone());
                let r = exchange(p, t);
                p.buf = buf;
                r
            }
        };
        (p.nranks, p.ring) = saved;
        exchanged?;
    }

    // 3. Every shard into every rank's output.
    let spread = meet(
        p,
        tier,
        l,
        round.wrapping_add(1),
        (shard.buffer(), out.buffer()),
        |steps, hands| {
            for (c, h) in hands.iter().enumerate() {
                let (from, len) = span(c);
                for to in hands {
                    steps.copy(&h.src, 0, &to.dst, from as u64 * 4, len as u64 * 4);
                }
            }
            Ok(())
        },
    )?;
    if let Shard::Image(mut img) = shard {
        img.used_by(spread);
        p.stage.put_image(img);
    }
    p.last = Some(spread);
    Ok(())
}

/// The ring's steps on `words` words of `img`, which the submission
/// `folded` wrote, folded where they lie in host memory.
fn on_image(
    p: &mut Prims<'_>,
    img: &mut HostImage,
    folded: Ticket,
    words: usize,
    fold: HostFold,
) -> Result<()> {
    p.wait_own(folded, "the process's shard to be folded on its device")?;
    let image = img
        .bytes_mut(p.w.dev, words * 4)
        .map_err(|why| p.w.device_error(why))?;
    ring::all_reduce(&mut HostSteps { p, image, fold }, words)
}

/// Meets the process's other ranks in `round` with this rank's `(src,
/// dst)`; the last to come records `steps` over every rank's hands (in
/// local rank order) into one encoder and submits it. Returns that
/// submission.
fn meet(
    p: &Prims<'_>,
    tier: &Tier,
    l: usize,
    round: u64,
    (src, dst): (&wgpu::Buffer, &wgpu::Buffer),
    steps: impl FnOnce(&mut Steps<'_>, &[Hand]) -> Result<()>,
) -> Result<Ticket> {
    let w = &p.w;
    let hand = Hand {
        fp: w.fp,
        src: src.clone(),
        dst: dst.clone(),
    };
    tier.meeting.meet(
        l,
        round,
        hand,
        &w.patience(),
        |i| w.left(tier.base + i),
        |hands| {
            let n = hands.len();
            let rank = |i: usize| tier.base + i;
            if let Some(odd) = hands.iter().position(|h| h.fp != w.fp) {
                let theirs = hands[odd].fp.to_string();
                return (0..n)
                    .map(|i| {
                        Err(Error::Mismatch {
                            rank: rank(i),
                            seq: hands[i].fp.seq,
                            ours: hands[i].fp.to_string(),
                            peer: rank(odd),
                            theirs: theirs.clone(),
                            flight: w.health.flight.report(),
                        })
                    })
                    .collect();
            }
            let dev = w.dev;
            let mut s = Steps {
                dev,
                enc: dev.encoder(),
                n,
                align: dev.binding_align(),
                stamps: None,
            };
            let done = steps(&mut s, &hands).and_then(|()| dev.submit(s.enc, Some(w.fp.seq)));
            (0..n)
                .map(|i| match &done {
                    Ok(t) => Ok(*t),
                    Err(e) if rank(i) == w.rank => Err(e.clone()),
                    Err(e) => Err(Error::device(
                        rank(i),
                        Some(w.fp.seq),
                        format!("the device this rank shares failed the collective: {e}"),
                    )),
                })
                .collect()
        },
    )?
}
