//! Data-parallel training of a small MLP on simulated ranks: each rank runs
//! forward and backward on its part of the batch, the gradients are
//! averaged with all_reduce (Avg), every rank applies the same SGD update.
//!
//! One training step is one traced graph. The `Eager` schedule runs it as
//! traced (each wait right after its all_reduce); `Overlap` runs the passes
//! (dce, sink_waits, reorder_for_overlap, bucket_by_cost), so that
//! earlier layers' backward runs while later layers' gradients are reduced.
//! Both give the same bits: only when things run changes.
#![allow(
    clippy::arithmetic_side_effects,
    reason = "model index math: `train` refuses models whose batch x hidden or hidden x hidden exceed u32, or with more than MAX_LAYERS layers, before any of it runs"
)]

use std::time::Instant;

use wgpu_collectives::Communicator;
use wgpu_collectives::ReduceOp;
use wgpu_collectives::World;
use wgpu_collectives::graph::calibrate::{self, Sample};
use wgpu_collectives::graph::exec::{Event, Lane, execute};
use wgpu_collectives::graph::passes::{
    GraphCost, bucket_by_cost, dce, reorder_for_overlap, sink_waits,
};
use wgpu_collectives::graph::{Graph, Tracer, verify};
use wgpu_collectives::{DType, Tensor};
use wgpu_collectives::{Error, Result};

/// Most layers `train` accepts.
pub const MAX_LAYERS: usize = 1024;

/// The model and its training.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mlp {
    /// Number of [hidden x hidden] layers (ReLU between them, none after the last).
    pub layers: usize,
    /// Width.
    pub hidden: usize,
    /// Global batch (split evenly over the ranks).
    pub batch: usize,
    /// SGD learning rate.
    pub lr: f32,
    /// Seed of the weights and the data.
    pub seed: u64,
    /// Gradient bucket cap for the overlap schedule (DDP's `bucket_cap_mb`;
    /// `graph::passes::DEFAULT_BUCKET_BYTES` is its 25 MiB).
    pub bucket_bytes: usize,
}

/// When waits run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Each wait right after its collective (as traced).
    Eager,
    /// Waits sunk to first use, compute ordered to cover communication,
    /// gradients bucketed.
    Overlap,
    /// FSDP: each rank keeps 1/n of every layer's weights; a layer's shards
    /// are all-gathered before its forward and its gradient reduce-scattered
    /// after its backward; the overlap schedule's passes (so the next
    /// layer's gather runs during this layer's compute). The same losses,
    /// bit for bit, as the other schedules.
    Fsdp,
}

impl Schedule {
    /// Whether the step keeps weights sharded over the ranks.
    pub fn sharded(self) -> bool {
        self == Schedule::Fsdp
    }
}

/// One step's figures on one rank, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// Wall time of the step.
    pub step_us: f64,
    /// Time in compute kernels.
    pub compute_us: f64,
    /// Time collectives were in flight (issue to end of wait).
    pub comm_us: f64,
    /// Time blocked in waits: communication compute did not hide.
    pub exposed_us: f64,
    /// The global loss (mean squared error over the whole batch) before the step.
    pub loss: f32,
}

/// What a training run produced, per rank.
#[derive(Debug, Clone)]
pub struct RankRun {
    /// Per step.
    pub steps: Vec<StepStats>,
    /// Each step's weights (this rank's shards, when sharded), as bits,
    /// when asked for (for checks).
    pub weight_bits: Vec<Vec<u32>>,
    /// The last step's timeline.
    pub timeline: Vec<Event>,
    /// The last step's estimates and measurements (for calibration).
    pub samples: Vec<Sample>,
    /// The same, estimated by the hop model measured on rank 0's adapter
    /// (what priced collectives before the world was tuned).
    pub hop_samples: Vec<Sample>,
    /// Whether every rank of the world (in every process) ended with the
    /// same weights, bit for bit (`None` when they are sharded).
    pub weights_agree: Option<bool>,
}

fn unit(seed: u64, i: usize) -> f32 {
    let mut z = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
}

impl Mlp {
    /// Layer `l`'s initial weights, the same on every rank: He-uniform
    /// (bound sqrt(6 / fan-in)), so activations keep their scale through
    /// the ReLUs.
    pub fn weights(&self, l: usize) -> Vec<f32> {
        let s = (6.0 / self.hidden as f32).sqrt();
        (0..self.hidden * self.hidden)
            .map(|i| unit(self.seed ^ (l as u64 + 1) << 48, i) * s)
            .collect()
    }

    /// The global batch, the same every step (so that training is descent
    /// on one objective): inputs and targets, [batch, hidden] each.
    pub fn data(&self) -> (Vec<f32>, Vec<f32>) {
        let n = self.batch * self.hidden;
        let x: Vec<f32> = (0..n).map(|i| unit(self.seed, i)).collect();
        let y: Vec<f32> = (0..n)
            .map(|i| 0.5 * unit(self.seed ^ 0xdead_beef, i))
            .collect();
        (x, y)
    }

    /// One step on one of `ranks` ranks, as traced: forward, MSE loss,
    /// backward with each layer's gradient averaged by all_reduce, SGD.
    /// Inputs `x`, `y`, `w0`..; outputs the new weights, then the loss.
    /// `sharded`: FSDP's step instead, on inputs `w0`.. that are this
    /// rank's shards (hidden x hidden / ranks elements, rank-major), each
    /// all-gathered before its layer's forward, its gradient
    /// reduce-scattered (Avg) and the shard updated; outputs the new shards.
    pub fn step_graph(&self, ranks: usize, sharded: bool) -> Graph {
        let (b, h, layers) = (self.batch / ranks.max(1), self.hidden, self.layers.max(1));
        let shard = h * h / ranks.max(1);
        let mut t = Tracer::new();
        let x = t.input("x", DType::F32, &[b, h]);
        let y = t.input("y", DType::F32, &[b, h]);
        let ws: Vec<usize> = (0..layers)
            .map(|l| {
                let shape = if sharded { vec![shard] } else { vec![h, h] };
                t.input(&format!("w{l}"), DType::F32, &shape)
            })
            .collect();
        let (mut acts, mut zs, mut full) = (vec![x], Vec::new(), Vec::new());
        for (l, &w) in ws.iter().enumerate() {
            let w = if sharded {
                let gathered = t.all_gather(w, ranks);
                t.reshape(gathered, &[h, h])
            } else {
                w
            };
            full.push(w);
            let z = t.matmul(acts[l], w, false, false);
            zs.push(z);
            if l + 1 < layers {
                let a = t.relu(z);
                acts.push(a);
            }
        }
        let diff = t.sub(zs[layers - 1], y);
        let sq = t.mul(diff, diff);
        let flat = t.reshape(sq, &[b * h, 1]);
        let total = t.sum_rows(flat);
        let local = t.scale(total, 1.0 / (b * h) as f32);
        let loss = t.all_reduce(local, ReduceOp::Avg);
        let mut dz = t.scale(diff, 2.0 / (b * h) as f32);
        let mut grads = vec![0; layers];
        for l in (0..layers).rev() {
            let dw = t.matmul(acts[l], dz, true, false);
            grads[l] = if sharded {
                let flat = t.reshape(dw, &[h * h]);
                t.reduce_scatter(flat, ReduceOp::Avg, ranks)
            } else {
                t.all_reduce(dw, ReduceOp::Avg)
            };
            if l > 0 {
                let da = t.matmul(dz, full[l], false, true);
                dz = t.relu_grad(da, zs[l - 1]);
            }
        }
        let mut outs: Vec<usize> = (0..layers)
            .map(|l| {
                let step = t.scale(grads[l], self.lr);
                t.sub(ws[l], step)
            })
            .collect();
        outs.push(loss);
        t.finish(&outs)
    }
}

/// The step graph as `schedule` runs it.
pub fn scheduled(
    g: Graph,
    schedule: Schedule,
    cost: &GraphCost,
    bucket_bytes: usize,
) -> Result<Graph> {
    let g = match schedule {
        Schedule::Eager => g,
        Schedule::Overlap | Schedule::Fsdp => bucket_by_cost(
            reorder_for_overlap(sink_waits(dce(g)), cost),
            bucket_bytes,
            cost,
        ),
    };
    verify(&g).map_err(|what| Error::InvalidArgument { rank: None, what })?;
    Ok(g)
}

fn rank_steps(
    c: &Communicator,
    m: &Mlp,
    g: &Graph,
    steps: usize,
    keep_bits: bool,
    sharded: bool,
    (cost, hop): (&GraphCost, &GraphCost),
) -> Result<RankRun> {
    let (n, r) = (c.size(), c.rank());
    let b = m.batch / n;
    let h = m.hidden;
    // Sharded: this rank's slice of each layer's weights (rank-major).
    let mut weights: Vec<Tensor> = (0..m.layers)
        .map(|l| {
            let w = m.weights(l);
            if sharded {
                let k = w.len() / n;
                c.tensor(&w[r * k..(r + 1) * k])
            } else {
                c.tensor(&w)
            }
        })
        .collect::<Result<_>>()?;
    let names: Vec<String> = (0..m.layers).map(|l| format!("w{l}")).collect();
    let mut run = RankRun {
        steps: Vec::new(),
        weight_bits: Vec::new(),
        timeline: Vec::new(),
        samples: Vec::new(),
        hop_samples: Vec::new(),
        weights_agree: None,
    };
    let (x, y) = m.data();
    // Progress for a person watching (rank 0, on a terminal only).
    let progress = r == 0 && std::io::IsTerminal::is_terminal(&std::io::stderr());
    for step in 0..steps {
        let mine = |v: &[f32]| c.tensor(&v[r * b * h..(r + 1) * b * h]);
        let mut inputs: Vec<(&str, Tensor)> = vec![("x", mine(&x)?), ("y", mine(&y)?)];
        inputs.extend(
            names
                .iter()
                .map(String::as_str)
                .zip(weights.iter().cloned()),
        );
        let _ = c.barrier()?.wait()?;
        let t = Instant::now();
        let out = execute(g, c, &inputs, true)?;
        let loss = out.outputs[m.layers]
            .to_vec::<f32>()?
            .first()
            .copied()
            .unwrap_or(f32::NAN);
        let step_us = t.elapsed().as_secs_f64() * 1e6;
        if progress {
            eprint!(
                "\r\x1b[Kstep {}/{steps}: loss {loss:.6}, {:.1} ms",
                step + 1,
                step_us / 1e3
            );
            if step + 1 == steps {
                eprint!("\r\x1b[K");
            }
        }
        let sum = |lane| {
            out.timeline
                .iter()
                .filter(|e| e.lane == lane)
                .map(|e| e.end_us - e.start_us)
                .sum::<f64>()
        };
        run.steps.push(StepStats {
            step_us,
            compute_us: sum(Lane::Compute),
            comm_us: sum(Lane::Comm),
            exposed_us: out.exposed_us,
            loss,
        });
        weights = out.outputs[..m.layers].to_vec();
        if keep_bits {
            let mut bits = Vec::new();
            for w in &weights {
                bits.extend(w.to_vec::<f32>()?.iter().map(|v| v.to_bits()));
            }
            run.weight_bits.push(bits);
        }
        run.samples = calibrate::samples(g, &out, cost);
        run.hop_samples = calibrate::samples(g, &out, hop);
        run.timeline = out.timeline;
    }
    if !sharded {
        run.weights_agree = Some(same_everywhere(c, &weights)?);
    }
    Ok(run)
}

/// Whether `weights` are the same bits on every rank: each rank's digest
/// (FNV-1a over the bits), all-gathered.
fn same_everywhere(c: &Communicator, weights: &[Tensor]) -> Result<bool> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in weights {
        for v in w.to_vec::<f32>()? {
            h ^= u64::from(v.to_bits());
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let mine = c.tensor(&[h as u32, (h >> 32) as u32])?;
    let all = c.all_gather(&mine)?.wait()?.to_vec::<u32>()?;
    Ok(all.chunks(2).all(|d| d == [h as u32, (h >> 32) as u32]))
}

/// The cost model the schedules start from: the world's hop model (rank
/// 0's measurement, which every rank has), and nominal compute rates.
pub fn default_cost(world: &World) -> GraphCost {
    GraphCost {
        comm: world.cost_model(),
        ranks: world.size(),
        flops: 1e10,
        bytes: 1e10,
    }
}

/// `cost` refit to what `runs` measured (collective: every rank fits its
/// own samples and the ranks agree on the average).
pub fn refit(world: &World, runs: &[RankRun], cost: &GraphCost) -> Result<GraphCost> {
    let base = world.local_ranks().start;
    let fits = world.run(|c| {
        let none = Vec::new();
        let samples = c
            .rank()
            .checked_sub(base)
            .and_then(|i| runs.get(i))
            .map_or(&none, |r| &r.samples);
        calibrate::refit(c, samples, cost)
    })?;
    fits.into_iter().next().unwrap_or(Ok(*cost))
}

/// Trains for `steps` steps on every rank of `world`; one result per rank.
/// With `keep_bits`, every step's weights are kept (for checks; costly).
#[allow(
    dead_code,
    reason = "the tests' entry point; the binary schedules with train_with"
)]
pub fn train(
    world: &World,
    m: &Mlp,
    steps: usize,
    schedule: Schedule,
    keep_bits: bool,
) -> Result<Vec<RankRun>> {
    train_with(world, m, steps, schedule, keep_bits, &default_cost(world))
}

/// [`train`], scheduling with `cost`.
pub fn train_with(
    world: &World,
    m: &Mlp,
    steps: usize,
    schedule: Schedule,
    keep_bits: bool,
    cost: &GraphCost,
) -> Result<Vec<RankRun>> {
    let n = world.size();
    let fits = |a: usize, b: usize| a.checked_mul(b).is_some_and(|v| u32::try_from(v).is_ok());
    if !fits(m.hidden, m.hidden) || !fits(m.batch, m.hidden) || m.layers > MAX_LAYERS {
        return Err(Error::InvalidArgument {
            rank: None,
            what: format!(
                "a model of {} layers of {} with a batch of {}: at most {MAX_LAYERS} layers, \
                 and hidden x hidden and batch x hidden must fit the kernels' 32-bit indices",
                m.layers, m.hidden, m.batch
            ),
        });
    }
    if schedule.sharded() && (m.hidden * m.hidden) % n != 0 {
        return Err(Error::InvalidArgument {
            rank: None,
            what: format!(
                "FSDP shards hidden x hidden = {} weights over {n} ranks: they must split evenly",
                m.hidden * m.hidden
            ),
        });
    }
    if m.batch % n != 0 || m.layers == 0 || m.hidden == 0 {
        return Err(Error::InvalidArgument {
            rank: None,
            what: format!(
                "a batch of {} over {n} ranks, {} layers of {}: the batch must split evenly",
                m.batch, m.layers, m.hidden
            ),
        });
    }
    let sharded = schedule.sharded();
    let g = scheduled(m.step_graph(n, sharded), schedule, cost, m.bucket_bytes)?;
    let hop = GraphCost {
        comm: world.hop_cost_model(),
        ..*cost
    };
    world
        .run(|c| rank_steps(c, m, &g, steps, keep_bits, sharded, (cost, &hop)))?
        .into_iter()
        .collect()
}
