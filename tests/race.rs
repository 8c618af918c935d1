//! Races on what interleaves: ranks that share one device (their
//! submissions on one queue, buffers passing between their pools), pools
//! handing out buffers while collectives are in flight, in-place calls on
//! views, compute issued between a collective and its wait. A single run
//! misses these; each case here runs hundreds of times, on every
//! placement, against a CPU reference. CI runs this file again with a core
//! kept busy by another process. No assertion depends on timing.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use wgpu_collectives::graph::passes::{
    DEFAULT_BUCKET_BYTES, GraphCost, bucket_all_reduces, dce, raise_comms, reorder_for_overlap,
    sink_waits,
};
use wgpu_collectives::graph::{Graph, NodeId, Tracer, execute, verify};
use wgpu_collectives::{
    Communicator, DType, Error, Placement, ReduceOp, Tensor, World, WorldConfig, wgpu,
};

const PLACEMENTS: [Placement; 2] = [Placement::SharedDevice, Placement::DevicePerRank];

fn world_on(n: usize, placement: Placement) -> World {
    World::new(WorldConfig::new(n).with_placement(placement))
        .unwrap_or_else(|e| panic!("a {n}-rank world ({placement}): {e}"))
}

/// Small integers in [-2, 2]: every sum below is exact in f32.
fn ints(seed: usize, rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (bits(rank, i, seed as u64) % 5) as f32 - 2.0)
        .collect()
}

/// `a @ b` on the CPU, `a` `[m, k]` (or `[k, m]` transposed), `b` `[k, n]`
/// (or `[n, k]` transposed).
#[allow(clippy::too_many_arguments)]
fn mm(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, ta: bool, tb: bool) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        for c in 0..n {
            out[r * n + c] = (0..k)
                .map(|i| {
                    let x = if ta { a[i * m + r] } else { a[r * k + i] };
                    let y = if tb { b[c * k + i] } else { b[i * n + c] };
                    x * y
                })
                .sum();
        }
    }
    out
}

// ---------------------------------------------------------------------
// The program of issue 50: compute moved past bucketed collectives.
// ---------------------------------------------------------------------

fn issue_program(n: usize) -> Graph {
    let mut t = Tracer::new();
    let x = t.input("x", DType::F32, &[6, 4]);
    let w = t.input("w", DType::F32, &[4, 4]);
    let y = t.input("y", DType::F32, &[12]);
    let h = t.matmul(x, w, false, false);
    let r = t.relu(h);
    let gw = t.matmul(x, r, true, false);
    let a1 = t.all_reduce(gw, ReduceOp::Sum);
    let gb = t.sum_rows(r);
    let a2 = t.all_reduce(gb, ReduceOp::Sum);
    let ys = t.scale(y, 2.0);
    let a3 = t.all_reduce(ys, ReduceOp::Max);
    let ag = t.all_gather(gb, n);
    let dx = t.matmul(r, w, false, true);
    let sum = t.add(ag, a3);
    t.finish(&[a1, a2, sum, dx])
}

/// The issue's program on the CPU: each rank's four outputs.
fn issue_reference(n: usize) -> Vec<Vec<Vec<f32>>> {
    let w = ints(2, 0, 16);
    let per_rank: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..n)
        .map(|r| {
            let x = ints(1, r, 24);
            let h = mm(&x, &w, 6, 4, 4, false, false);
            let relu: Vec<f32> = h.iter().map(|v| v.max(0.0)).collect();
            let gw = mm(&x, &relu, 4, 6, 4, true, false);
            let gb: Vec<f32> = (0..4)
                .map(|c| (0..6).map(|row| relu[row * 4 + c]).sum())
                .collect();
            (relu, gw, gb)
        })
        .collect();
    let sum = |f: &dyn Fn(usize) -> Vec<f32>| -> Vec<f32> {
        (1..n).fold(f(0), |acc, r| {
            acc.iter().zip(f(r)).map(|(a, b)| a + b).collect()
        })
    };
    let a1 = sum(&|r| per_rank[r].1.clone());
    let a2 = sum(&|r| per_rank[r].2.clone());
    let a3: Vec<f32> = (0..12)
        .map(|i| {
            (0..n)
                .map(|r| 2.0 * ints(3, r, 12)[i])
                .fold(f32::MIN, f32::max)
        })
        .collect();
    let ag: Vec<f32> = (0..n).flat_map(|r| per_rank[r].2.clone()).collect();
    let added: Vec<f32> = ag.iter().zip(&a3).map(|(a, b)| a + b).collect();
    (0..n)
        .map(|r| {
            let dx = mm(&per_rank[r].0, &w, 6, 4, 4, false, true);
            vec![a1.clone(), a2.clone(), added.clone(), dx]
        })
        .collect()
}

fn issue_inputs(c: &Communicator) -> Result<Vec<(&'static str, Tensor)>, Error> {
    Ok(vec![
        ("x", c.tensor(&ints(1, c.rank(), 24))?),
        ("w", c.tensor(&ints(2, 0, 16))?),
        ("y", c.tensor(&ints(3, c.rank(), 12))?),
    ])
}

fn outputs_of(w: &World, g: &Graph) -> Vec<Vec<Vec<f32>>> {
    w.run(|c| -> Result<Vec<Vec<f32>>, Error> {
        let r = execute(g, c, &issue_inputs(c)?, false)?;
        r.outputs.iter().map(|t| t.to_vec::<f32>()).collect()
    })
    .expect("run")
    .into_iter()
    .enumerate()
    .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
    .collect()
}

/// Issue 50: on ranks sharing a device, this schedule gave a rank a wrong
/// `dx` (the coalesced call's concatenation buffer was handed back to the
/// rank's pool before the group's encoder that writes it was submitted,
/// and `dx` took it). 100 times in one process, on every placement.
#[test]
fn issue_50s_schedule_gives_the_cpu_reference_100_times() {
    let n = 3;
    let want = issue_reference(n);
    for placement in PLACEMENTS {
        let w = world_on(n, placement);
        let cost = GraphCost {
            comm: w.cost_model(),
            ranks: n,
            flops: 1e9,
            bytes: 1e9,
        };
        let traced = issue_program(n);
        let scheduled = bucket_all_reduces(
            reorder_for_overlap(sink_waits(dce(traced.clone())), &cost),
            80,
        );
        verify(&scheduled).unwrap_or_else(|e| panic!("{e}\n{}", scheduled.print()));
        // The schedule that raced: dx after the bucketed collective.
        let text = scheduled.print();
        let at = |pat: &str| text.find(pat).unwrap_or_else(|| panic!("{pat}:\n{text}"));
        assert!(
            at("all_reduce_coalesced") < at("transpose_b=true"),
            "{text}"
        );
        assert_eq!(
            outputs_of(&w, &traced),
            want,
            "{placement}: the traced graph"
        );
        let reps = if placement == Placement::SharedDevice {
            100
        } else {
            40
        };
        for rep in 0..reps {
            let got = outputs_of(&w, &scheduled);
            for (rank, (g, r)) in got.iter().zip(&want).enumerate() {
                for (o, (g, r)) in g.iter().zip(r).enumerate() {
                    assert_eq!(
                        g, r,
                        "{placement}, repetition {rep}, rank {rank}, output {o}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------
// Generated graphs: compute and collectives in any order, every schedule.
// ---------------------------------------------------------------------

/// One op of a generated program; each makes a new [4, 4] value from
/// earlier ones (indices taken modulo the values so far).
#[derive(Debug, Clone)]
enum Step {
    Matmul(usize, usize, bool, bool),
    Add(usize, usize),
    Mul(usize, usize),
    Relu(usize),
    Scale(usize, bool),
    AllReduce(usize, u8),
    /// all_gather then g^T g: the sum over ranks of x_r^T x_r.
    GatherGram(usize),
    Broadcast(usize, usize),
}

fn step() -> impl Strategy<Value = Step> {
    let i = 0..64usize;
    prop_oneof![
        (i.clone(), i.clone(), any::<bool>(), any::<bool>())
            .prop_map(|(a, b, x, y)| Step::Matmul(a, b, x, y)),
        (i.clone(), i.clone()).prop_map(|(a, b)| Step::Add(a, b)),
        (i.clone(), i.clone()).prop_map(|(a, b)| Step::Mul(a, b)),
        i.clone().prop_map(Step::Relu),
        (i.clone(), any::<bool>()).prop_map(|(a, neg)| Step::Scale(a, neg)),
        (i.clone(), 0..3u8).prop_map(|(a, op)| Step::AllReduce(a, op)),
        (i.clone(), i.clone()).prop_map(|(a, _)| Step::GatherGram(a)),
        (i.clone(), 0..8usize).prop_map(|(a, root)| Step::Broadcast(a, root)),
        (i.clone(), 0..3u8).prop_map(|(a, op)| Step::AllReduce(a, op)),
    ]
}

const OPS: [ReduceOp; 3] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min];
const INPUTS: [&str; 3] = ["a", "b", "w"];
/// The largest magnitude a value may reach, a bound on every partial sum,
/// so that f32 arithmetic is exact whatever order a kernel sums in.
const EXACT: f64 = (1u64 << 23) as f64;

/// A program: its graph, its outputs' values on each rank (the CPU's), or
/// `None` when a value could grow past what f32 holds exactly.
fn build(steps: &[Step], outs: &[usize], n: usize) -> Option<(Graph, Vec<Vec<Vec<f32>>>)> {
    let mut t = Tracer::new();
    let mut ids: Vec<NodeId> = INPUTS
        .iter()
        .map(|name| t.input(name, DType::F32, &[4, 4]))
        .collect();
    // Per value: each rank's elements, and a bound on their magnitudes
    // and on every partial sum made of them.
    let mut vals: Vec<Vec<Vec<f32>>> = (0..INPUTS.len())
        .map(|k| {
            (0..n)
                .map(|r| ints(10 + k, if k == 2 { 0 } else { r }, 16))
                .collect()
        })
        .collect();
    let mut bound: Vec<f64> = vec![2.0; INPUTS.len()];
    for s in steps {
        let m = vals.len();
        let (id, v, b) = match *s {
            Step::Matmul(a, b, ta, tb) => {
                let (a, b) = (a % m, b % m);
                let v = (0..n)
                    .map(|r| mm(&vals[a][r], &vals[b][r], 4, 4, 4, ta, tb))
                    .collect();
                (
                    t.matmul(ids[a], ids[b], ta, tb),
                    v,
                    4.0 * bound[a] * bound[b],
                )
            }
            Step::Add(a, b) | Step::Mul(a, b) => {
                let (a, b) = (a % m, b % m);
                let add = matches!(s, Step::Add(..));
                let v = (0..n)
                    .map(|r| {
                        vals[a][r]
                            .iter()
                            .zip(&vals[b][r])
                            .map(|(x, y)| if add { x + y } else { x * y })
                            .collect()
                    })
                    .collect();
                let (id, bd) = if add {
                    (t.add(ids[a], ids[b]), bound[a] + bound[b])
                } else {
                    (t.mul(ids[a], ids[b]), bound[a] * bound[b])
                };
                (id, v, bd)
            }
            Step::Relu(a) => {
                let a = a % m;
                let v = (0..n)
                    .map(|r| vals[a][r].iter().map(|x| x.max(0.0)).collect())
                    .collect();
                (t.relu(ids[a]), v, bound[a])
            }
            Step::Scale(a, neg) => {
                let a = a % m;
                let f = if neg { -1.0 } else { 2.0 };
                let v = (0..n)
                    .map(|r| vals[a][r].iter().map(|x| x * f).collect())
                    .collect();
                (t.scale(ids[a], f), v, bound[a] * 2.0)
            }
            Step::AllReduce(a, op) => {
                let (a, op) = (a % m, OPS[op as usize]);
                let folded: Vec<f32> = (0..16)
                    .map(|i| {
                        let xs = (0..n).map(|r| vals[a][r][i]);
                        match op {
                            ReduceOp::Sum => xs.sum(),
                            ReduceOp::Max => xs.fold(f32::MIN, f32::max),
                            _ => xs.fold(f32::MAX, f32::min),
                        }
                    })
                    .collect();
                let bd = if op == ReduceOp::Sum {
                    bound[a] * n as f64
                } else {
                    bound[a]
                };
                (t.all_reduce(ids[a], op), vec![folded; n], bd)
            }
            Step::GatherGram(a) => {
                let a = a % m;
                let g: Vec<f32> = (0..n).flat_map(|r| vals[a][r].clone()).collect();
                let gram = mm(&g, &g, 4, 4 * n, 4, true, false);
                let gathered = t.all_gather(ids[a], n);
                let id = t.matmul(gathered, gathered, true, false);
                (id, vec![gram; n], 4.0 * n as f64 * bound[a] * bound[a])
            }
            Step::Broadcast(a, root) => {
                let (a, root) = (a % m, root % n);
                let v = vec![vals[a][root].clone(); n];
                (t.broadcast(ids[a], root), v, bound[a])
            }
        };
        if b > EXACT {
            return None;
        }
        ids.push(id);
        vals.push(v);
        bound.push(b);
    }
    // The last value, and some earlier ones.
    let last = ids.len() - 1;
    let mut picked: Vec<usize> = outs.iter().map(|o| o % ids.len()).collect();
    picked.push(last);
    picked.dedup();
    let graph = t.finish(&picked.iter().map(|&k| ids[k]).collect::<Vec<_>>());
    let want = (0..n)
        .map(|r| picked.iter().map(|&k| vals[k][r].clone()).collect())
        .collect();
    Some((graph, want))
}

/// Every schedule the passes make of `g`.
fn schedules(g: &Graph, cost: &GraphCost) -> Vec<(&'static str, Graph)> {
    let base = || sink_waits(dce(g.clone()));
    vec![
        ("traced", g.clone()),
        ("sink_waits", base()),
        ("raise_comms", raise_comms(base())),
        ("reorder_for_overlap", reorder_for_overlap(base(), cost)),
        (
            "bucketed (80 bytes)",
            bucket_all_reduces(reorder_for_overlap(base(), cost), 80),
        ),
        (
            "bucketed (default)",
            bucket_all_reduces(raise_comms(base()), DEFAULT_BUCKET_BYTES),
        ),
    ]
}

fn generated_schedules_on(placement: Placement, cases: u32, reps: usize) {
    let n = 3;
    let w = world_on(n, placement);
    let cost = GraphCost {
        comm: w.cost_model(),
        ranks: n,
        flops: 1e9,
        bytes: 1e9,
    };
    let inputs = |c: &Communicator| -> Result<Vec<(&'static str, Tensor)>, Error> {
        INPUTS
            .iter()
            .enumerate()
            .map(|(k, name)| {
                let r = if k == 2 { 0 } else { c.rank() };
                Ok((*name, c.tensor(&ints(10 + k, r, 16))?))
            })
            .collect()
    };
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let program = (
        prop::collection::vec(step(), 3..12),
        prop::collection::vec(0..64usize, 0..4),
    );
    let result = runner.run(&program, |(steps, outs)| {
        let Some((traced, want)) = build(&steps, &outs, n) else {
            return Err(TestCaseError::reject("a value past f32's exact range"));
        };
        for (name, g) in schedules(&traced, &cost) {
            verify(&g).map_err(|e| TestCaseError::fail(format!("{name}: {e}\n{}", g.print())))?;
            for rep in 0..reps {
                let got = w
                    .run(|c| -> Result<Vec<Vec<f32>>, Error> {
                        let r = execute(&g, c, &inputs(c)?, false)?;
                        r.outputs.iter().map(|t| t.to_vec::<f32>()).collect()
                    })
                    .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
                for (rank, (got, want)) in got.into_iter().zip(&want).enumerate() {
                    let got = got.map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
                    prop_assert_eq!(
                        &got,
                        want,
                        "{}, {}, repetition {}, rank {}:\n{}",
                        placement,
                        name,
                        rep,
                        rank,
                        g.print()
                    );
                }
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Generated programs of compute and collectives, in every schedule the
/// passes make (compute moved past collectives, waits sunk, calls
/// bucketed), each run several times on ranks sharing a device.
#[test]
fn generated_schedules_give_the_cpu_reference_on_a_shared_device() {
    generated_schedules_on(Placement::SharedDevice, 40, 3);
}

/// The same on a device per rank.
#[test]
fn generated_schedules_give_the_cpu_reference_on_a_device_per_rank() {
    generated_schedules_on(Placement::DevicePerRank, 16, 2);
}

// ---------------------------------------------------------------------
// The user's own work on the rank's queue between a call and its wait.
// ---------------------------------------------------------------------

/// The user's kernel (`tests/common/user_kernel.wgsl`), for one device.
struct UserKernel {
    pipeline: wgpu::ComputePipeline,
}

impl UserKernel {
    fn new(c: &Communicator, k: f32) -> UserKernel {
        let dev = c.device();
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("user_kernel.wgsl"),
            source: wgpu::ShaderSource::Wgsl(include_str!("common/user_kernel.wgsl").into()),
        });
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("user kernel"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[("K", f64::from(k))],
                ..Default::default()
            },
            cache: None,
        });
        UserKernel { pipeline }
    }

    /// `out = 2 x + K` on the rank's queue, submitted and not waited for.
    fn run(&self, c: &Communicator, x: &Tensor, out: &Tensor) {
        let dev = c.device();
        fn binding(b: u32, t: &Tensor) -> wgpu::BindGroupEntry<'_> {
            wgpu::BindGroupEntry {
                binding: b,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: t.buffer(),
                    offset: t.offset(),
                    size: wgpu::BufferSize::new(t.len() as u64 * 4),
                }),
            }
        }
        let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.pipeline.get_bind_group_layout(0),
            entries: &[binding(0, x), binding(1, out)],
        });
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups((out.len() as u32).div_ceil(64), 1, 1);
        }
        c.queue().submit([enc.finish()]);
    }
}

/// Between each collective and its wait the rank runs its own kernel on
/// its queue into tensors fresh from the pool (while the collective's
/// outputs and scratch come from the same pool), drops some outputs at
/// once, and reads everything after: every value against the CPU's.
#[test]
fn user_kernels_between_collectives_and_their_waits() {
    let n = 3;
    for placement in PLACEMENTS {
        let w = world_on(n, placement);
        let reps = if placement == Placement::SharedDevice {
            150
        } else {
            50
        };
        let got = w
            .run(|c| -> Result<(), String> {
                let r = c.rank();
                let kernel = UserKernel::new(c, r as f32);
                for rep in 0..reps {
                    let len = [7, 64, 300, 1000][rep % 4];
                    let xs: Vec<Vec<f32>> = (0..n).map(|q| ints(rep, q, len)).collect();
                    let x = c.tensor(&xs[r]).map_err(|e| e.to_string())?;
                    // Out of place, then the user's kernel while it runs.
                    let summed = c.all_reduce(&x, ReduceOp::Sum).map_err(|e| e.to_string())?;
                    let mine = x.new_empty(DType::F32, len).map_err(|e| e.to_string())?;
                    kernel.run(c, &x, &mine);
                    // A coalesced call of two, one output dropped unread.
                    let y = c.tensor(&xs[(r + 1) % n]).map_err(|e| e.to_string())?;
                    let both = c
                        .all_reduce_coalesced(&[x.clone(), y.clone()], ReduceOp::Max)
                        .map_err(|e| e.to_string())?;
                    let again = x.new_empty(DType::F32, len).map_err(|e| e.to_string())?;
                    kernel.run(c, &mine, &again);
                    let gathered = c.all_gather(&mine).map_err(|e| e.to_string())?;
                    let summed = summed.wait().map_err(|e| e.to_string())?;
                    let both = both.wait_all().map_err(|e| e.to_string())?;
                    let gathered = gathered.wait().map_err(|e| e.to_string())?;
                    let want_sum: Vec<f32> =
                        (0..len).map(|i| xs.iter().map(|v| v[i]).sum()).collect();
                    let want_max: Vec<f32> = (0..len)
                        .map(|i| xs.iter().map(|v| v[i]).fold(f32::MIN, f32::max))
                        .collect();
                    let user = |q: usize, v: f32| 2.0 * v + q as f32;
                    let want_mine: Vec<f32> = xs[r].iter().map(|&v| user(r, v)).collect();
                    let want_again: Vec<f32> = want_mine.iter().map(|&v| user(r, v)).collect();
                    let want_gathered: Vec<f32> = (0..n)
                        .flat_map(|q| xs[q].iter().map(move |&v| user(q, v)))
                        .collect();
                    let read = |t: &Tensor| t.to_vec::<f32>().map_err(|e| e.to_string());
                    let at = format!("{placement}, rank {r}, repetition {rep}");
                    let check = |what: &str, got: Vec<f32>, want: &[f32]| {
                        if got == want {
                            Ok(())
                        } else {
                            Err(format!("{at}: {what}: {got:?} against {want:?}"))
                        }
                    };
                    check("all_reduce", read(&summed)?, &want_sum)?;
                    check("coalesced max", read(&both[0])?, &want_max)?;
                    check("the user's kernel", read(&mine)?, &want_mine)?;
                    check("the user's second kernel", read(&again)?, &want_again)?;
                    check(
                        "all_gather of the user's output",
                        read(&gathered)?,
                        &want_gathered,
                    )?;
                    check("the input", read(&x)?, &xs[r])?;
                }
                Ok(())
            })
            .expect("run");
        for r in got {
            r.unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// In-place all-reduces on views of one user buffer per rank (at offsets
/// and of lengths that leave neighbours in the same 16-byte unit), with
/// the user's kernels writing the neighbouring bytes between the call and
/// its wait: each view holds the sum, each neighbour what the user wrote.
#[test]
fn in_place_calls_on_views_with_neighbours_written_meanwhile() {
    let n = 3;
    for placement in PLACEMENTS {
        let w = world_on(n, placement);
        let reps = if placement == Placement::SharedDevice {
            150
        } else {
            50
        };
        let got = w
            .run(|c| -> Result<(), String> {
                let r = c.rank();
                let kernel = UserKernel::new(c, 100.0 + r as f32);
                let words = 64u64;
                let buffer = c.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some("user's"),
                    size: words * 4,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                let source = c.tensor(&[1.0f32; 64]).map_err(|e| e.to_string())?;
                for rep in 0..reps {
                    // A view of 5..=20 elements from word 1..=8; its
                    // neighbour is the rest of the buffer after it.
                    let (off, len) = (1 + rep % 8, 5 + rep % 16);
                    let xs: Vec<Vec<f32>> = (0..n).map(|q| ints(rep, q, len)).collect();
                    c.queue()
                        .write_buffer(&buffer, off as u64 * 4, bytemuck::cast_slice(&xs[r]));
                    let view = c
                        .wrap_buffer(&buffer, off as u64 * 4, DType::F32, len)
                        .map_err(|e| e.to_string())?;
                    let tail_at = (off + len) as u64;
                    let tail = c
                        .wrap_buffer(&buffer, tail_at * 4, DType::F32, (words - tail_at) as usize)
                        .map_err(|e| e.to_string())?;
                    let work = c
                        .all_reduce_in_place(&view, ReduceOp::Sum)
                        .map_err(|e| e.to_string())?;
                    let src = source
                        .new_empty(DType::F32, tail.len())
                        .map_err(|e| e.to_string())?;
                    let ones = c
                        .tensor(&vec![1.0f32; tail.len()])
                        .map_err(|e| e.to_string())?;
                    kernel.run(c, &ones, &src);
                    // Storage bindings start on the adapter's alignment:
                    // the user's result lands in the neighbour by a copy.
                    let mid = ones
                        .new_empty(DType::F32, tail.len())
                        .map_err(|e| e.to_string())?;
                    kernel.run(c, &src, &mid);
                    let mut enc = c.device().create_command_encoder(&Default::default());
                    enc.copy_buffer_to_buffer(
                        mid.buffer(),
                        0,
                        &buffer,
                        tail_at * 4,
                        tail.len() as u64 * 4,
                    );
                    c.queue().submit([enc.finish()]);
                    let _ = work.wait().map_err(|e| e.to_string())?;
                    let got = view.to_vec::<f32>().map_err(|e| e.to_string())?;
                    let want: Vec<f32> = (0..len).map(|i| xs.iter().map(|v| v[i]).sum()).collect();
                    let k = 100.0 + r as f32;
                    let want_tail = vec![2.0 * (2.0 + k) + k; tail.len()];
                    let got_tail = tail.to_vec::<f32>().map_err(|e| e.to_string())?;
                    let at = format!("{placement}, rank {r}, repetition {rep} (view {off}+{len})");
                    if got != want {
                        return Err(format!("{at}: the view {got:?}, not {want:?}"));
                    }
                    if got_tail != want_tail {
                        return Err(format!("{at}: the neighbour {got_tail:?}"));
                    }
                }
                Ok(())
            })
            .expect("run");
        for r in got {
            r.unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
