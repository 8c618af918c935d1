//! Data-parallel training of a small burn MLP, gradients averaged by the
//! engine.
//!
//! Each of N ranks holds 1/N of a fixed batch, runs forward and backward
//! with burn's autodiff, and averages its gradients with the others'
//! (`Rank::all_reduce` with `ReduceOperation::Mean`, on burn's own
//! gradient buffers); every rank then takes the same SGD step. Rank 0's
//! initial weights reach the others by broadcast, as DDP does.
//!
//! Then the same model is trained on one device on the whole batch, and
//! the example checks what data parallelism promises: the loss at every
//! step within 1e-4 of single-device training, and the final weights the
//! same bits on every rank. It exits with an error otherwise.
//!
//! `cargo run --release -p wgpu-collectives-burn --example ddp_mlp -- --ranks 4 --steps 100`

use burn_tensor::activation::relu;
use burn_tensor::{Device, Tensor, TensorData};
use clap::Parser;
use wgpu_collectives::WorldConfig;
use wgpu_collectives_burn::{BurnWorld, Error, Rank};

#[derive(Parser, Debug)]
struct Args {
    /// Ranks (burn devices).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// SGD steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Rows of the whole batch (split evenly over the ranks).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.1)]
    lr: f32,
}

const INPUTS: usize = 8;
const HIDDEN: usize = 32;

/// The model's parameters, as plain tensors (no autodiff between steps).
#[derive(Clone)]
struct Mlp {
    w1: Tensor<2>,
    b1: Tensor<2>,
    w2: Tensor<2>,
    b2: Tensor<2>,
}

impl Mlp {
    /// Fixed initial weights, so single-device and data-parallel training
    /// start from the same point.
    fn init(device: &Device) -> Mlp {
        let param = |rows: usize, cols: usize, seed: f32| -> Tensor<2> {
            let v: Vec<f32> = (0..rows * cols)
                .map(|i| 0.4 * ((i as f32 * 0.37 + seed).sin()) / (rows as f32).sqrt())
                .collect();
            Tensor::from_data(TensorData::new(v, [rows, cols]), device)
        };
        Mlp {
            w1: param(INPUTS, HIDDEN, 0.1),
            b1: param(1, HIDDEN, 0.2),
            w2: param(HIDDEN, 1, 0.3),
            b2: param(1, 1, 0.4),
        }
    }

    fn params(&self) -> [Tensor<2>; 4] {
        [
            self.w1.clone(),
            self.b1.clone(),
            self.w2.clone(),
            self.b2.clone(),
        ]
    }

    fn from_params([w1, b1, w2, b2]: [Tensor<2>; 4]) -> Mlp {
        Mlp { w1, b1, w2, b2 }
    }

    /// Mean squared error on (x, y), and each parameter's gradient.
    fn loss_and_grads(&self, x: Tensor<2>, y: Tensor<2>) -> (f32, [Tensor<2>; 4]) {
        let [w1, b1, w2, b2] = self.params().map(|p| p.autodiff().require_grad());
        let h = relu(x.matmul(w1.clone()) + b1.clone());
        let loss = (h.matmul(w2.clone()) + b2.clone() - y)
            .powi_scalar(2)
            .mean();
        let grads = loss.backward();
        let grad = |p: &Tensor<2>| {
            p.grad(&grads)
                .unwrap_or_else(|| p.clone().inner().zeros_like())
        };
        let g = [grad(&w1), grad(&b1), grad(&w2), grad(&b2)];
        (loss.inner().into_scalar::<f32>(), g)
    }

    fn step(self, grads: [Tensor<2>; 4], lr: f32) -> Mlp {
        let [w1, b1, w2, b2] = self.params();
        let [g1, g2, g3, g4] = grads;
        Mlp {
            w1: w1 - g1.mul_scalar(lr),
            b1: b1 - g2.mul_scalar(lr),
            w2: w2 - g3.mul_scalar(lr),
            b2: b2 - g4.mul_scalar(lr),
        }
    }
}

/// Rows `rows` of the fixed data set: inputs, and a smooth target.
fn batch(device: &Device, rows: std::ops::Range<usize>) -> (Tensor<2>, Tensor<2>) {
    let n = rows.len();
    let mut x = Vec::with_capacity(n * INPUTS);
    let mut y = Vec::with_capacity(n);
    for j in rows {
        let row: Vec<f32> = (0..INPUTS)
            .map(|k| (0.7 * j as f32 + 1.3 * k as f32).sin())
            .collect();
        let dot: f32 = row
            .iter()
            .enumerate()
            .map(|(k, v)| v * (k as f32 - 3.5) / 4.0)
            .sum();
        y.push(dot.tanh() + 0.1);
        x.extend(row);
    }
    (
        Tensor::from_data(TensorData::new(x, [n, INPUTS]), device),
        Tensor::from_data(TensorData::new(y, [n, 1]), device),
    )
}

/// Rank `rank`'s training: its share of the batch, gradients averaged.
fn train_rank(rank: &Rank, args: &Args) -> Result<(Vec<f32>, Vec<Vec<f32>>), Error> {
    let (r, n, device) = (rank.rank(), rank.size(), rank.device());
    let share = args.batch / n;
    let (x, y) = batch(device, r * share..(r + 1) * share);
    // Rank 0's weights everywhere (the others' are only shapes).
    let init = Mlp::init(device);
    let mut model = Mlp::from_params(if r == 0 {
        init.params()
    } else {
        init.params().map(|p| p.zeros_like())
    });
    let params = model.params().map(|p| rank.broadcast(p, 0));
    model = Mlp::from_params(collect(params)?);
    let mut losses = Vec::with_capacity(args.steps);
    for _ in 0..args.steps {
        let (loss, grads) = model.loss_and_grads(x.clone(), y.clone());
        losses.push(loss);
        let avg =
            grads.map(|g| rank.all_reduce(g, burn_tensor::distributed::ReduceOperation::Mean));
        model = model.step(collect(avg)?, args.lr);
    }
    let weights = model
        .params()
        .into_iter()
        .map(|p| p.into_data().try_to_vec::<f32>().unwrap_or_default())
        .collect();
    Ok((losses, weights))
}

fn collect(params: [Result<Tensor<2>, Error>; 4]) -> Result<[Tensor<2>; 4], Error> {
    let [a, b, c, d] = params;
    Ok([a?, b?, c?, d?])
}

/// The reference: one device, the whole batch.
fn train_single(device: &Device, args: &Args) -> Vec<f32> {
    let (x, y) = batch(device, 0..args.batch);
    let mut model = Mlp::init(device);
    let mut losses = Vec::with_capacity(args.steps);
    for _ in 0..args.steps {
        let (loss, grads) = model.loss_and_grads(x.clone(), y.clone());
        losses.push(loss);
        model = model.step(grads, args.lr);
    }
    losses
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.ranks == 0 || args.batch % args.ranks != 0 {
        return Err(format!(
            "--batch {} must split evenly over --ranks {}",
            args.batch, args.ranks
        )
        .into());
    }
    let world = BurnWorld::new(WorldConfig::new(args.ranks))?;
    let outcomes = world.run(|rank| train_rank(rank, &args))?;
    let mut per_rank = Vec::with_capacity(args.ranks);
    for outcome in outcomes {
        per_rank.push(outcome?);
    }
    // The whole batch's loss is the mean of the equal shares' losses.
    let ddp: Vec<f32> = (0..args.steps)
        .map(|s| per_rank.iter().map(|(l, _)| l[s]).sum::<f32>() / args.ranks as f32)
        .collect();
    let single = train_single(&world.devices()[0], &args);

    let mut worst = 0f32;
    println!(
        "{:>6} {:>14} {:>14} {:>10}",
        "step", "loss (ddp)", "loss (single)", "|diff|"
    );
    for (s, (d, o)) in ddp.iter().zip(&single).enumerate() {
        let diff = (d - o).abs();
        worst = worst.max(diff);
        if s % 10 == 0 || s + 1 == args.steps {
            println!("{s:>6} {d:>14.6} {o:>14.6} {diff:>10.2e}");
        }
    }
    let same_bits = per_rank.iter().all(|(_, w)| {
        w.iter().zip(&per_rank[0].1).all(|(a, b)| {
            a.iter()
                .map(|v| v.to_bits())
                .eq(b.iter().map(|v| v.to_bits()))
        })
    });
    println!(
        "# {} ranks, {} steps: loss {:.6} -> {:.6}; worst |ddp - single| {worst:.2e} (bound 1e-4); \
         final weights the same bits on every rank: {same_bits}",
        args.ranks,
        args.steps,
        ddp.first().copied().unwrap_or(f32::NAN),
        ddp.last().copied().unwrap_or(f32::NAN),
    );
    let learned = matches!((ddp.first(), ddp.last()), (Some(a), Some(b)) if b < a);
    if worst > 1e-4 || !same_bits || !learned {
        return Err("data-parallel training diverged from single-device training".into());
    }
    Ok(())
}
