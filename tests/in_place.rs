//! In-place forms, as torch's and NCCL's calls are: `all_reduce_in_place`,
//! `broadcast_in_place`, `reduce_in_place`, also inside a group, under
//! both placements, against CPU references.

mod common;

use common::*;
use wgpu_collectives::{Communicator, Error, Placement, ReduceOp, World, WorldConfig};

const PLACEMENTS: [Placement; 2] = [Placement::SharedDevice, Placement::DevicePerRank];
const LENS: [usize; 4] = [0, 1, 7, 1000];

fn worlds(n: usize) -> Vec<World> {
    PLACEMENTS
        .iter()
        .map(|p| World::new(WorldConfig::new(n).with_placement(*p)).expect("a world"))
        .collect()
}

/// Runs `call` on every rank's `[input(rank)]` and returns each rank's
/// tensor afterwards.
fn after<T: Num>(
    w: &World,
    op: ReduceOp,
    len: usize,
    call: impl Fn(&Communicator, &wgpu_collectives::Tensor) -> Result<(), Error> + Sync,
) -> Vec<Vec<T>> {
    w.run(|c| -> Result<Vec<T>, Error> {
        let x = c.tensor(&inputs::<T>(op, c.rank(), len))?;
        call(c, &x)?;
        x.to_vec::<T>()
    })
    .expect("run")
    .into_iter()
    .enumerate()
    .map(|(rank, r)| r.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
    .collect()
}

fn each_case<T: Num>() {
    for n in [1, 2, 3, 4] {
        for w in worlds(n) {
            let p = w.placement();
            for len in LENS {
                let op = ReduceOp::Sum;
                let sum = reference::<T>(op, n, len);
                for root in 0..n {
                    let what = format!("{p:?} n {n} len {len} root {root} {}", T::DTYPE);
                    let got = after::<T>(&w, op, len, |c, x| {
                        let _ = c.broadcast_in_place(x, root)?.wait()?;
                        Ok(())
                    });
                    for (rank, v) in got.iter().enumerate() {
                        check(
                            &format!("{what}: broadcast on {rank}"),
                            op,
                            v,
                            &inputs(op, root, len),
                        );
                    }
                    let got = after::<T>(&w, op, len, |c, x| {
                        let _ = c.reduce_in_place(x, op, root)?.wait()?;
                        Ok(())
                    });
                    for (rank, v) in got.iter().enumerate() {
                        let want = if rank == root {
                            sum.clone()
                        } else {
                            inputs(op, rank, len)
                        };
                        check(&format!("{what}: reduce on {rank}"), op, v, &want);
                    }
                    // The three in one group, each on its own tensor.
                    let got = w
                        .run(|c| -> Result<Vec<Vec<T>>, Error> {
                            let r = c.rank();
                            let xs = [
                                c.tensor(&inputs::<T>(op, r, len))?,
                                c.tensor(&inputs::<T>(op, r, len))?,
                                c.tensor(&inputs::<T>(op, r, len))?,
                            ];
                            let _ = c
                                .group(|g| {
                                    g.all_reduce_in_place(&xs[0], op)?;
                                    g.broadcast_in_place(&xs[1], root)?;
                                    g.reduce_in_place(&xs[2], op, root)
                                })?
                                .wait_all()?;
                            xs.iter().map(|x| x.to_vec::<T>()).collect()
                        })
                        .expect("run");
                    for (rank, v) in got.into_iter().enumerate() {
                        let v = v.unwrap_or_else(|e| panic!("{what}: group on {rank}: {e}"));
                        check(
                            &format!("{what}: group all_reduce on {rank}"),
                            op,
                            &v[0],
                            &sum,
                        );
                        check(
                            &format!("{what}: group broadcast on {rank}"),
                            op,
                            &v[1],
                            &inputs(op, root, len),
                        );
                        let want = if rank == root {
                            sum.clone()
                        } else {
                            inputs(op, rank, len)
                        };
                        check(&format!("{what}: group reduce on {rank}"), op, &v[2], &want);
                    }
                }
            }
        }
    }
}

#[test]
fn in_place_forms_f32() {
    each_case::<f32>();
}

#[test]
fn in_place_forms_f16() {
    each_case::<half::f16>();
}

#[test]
fn in_place_forms_i32() {
    each_case::<i32>();
}

#[test]
fn reduce_in_place_leaves_wrapped_views_off_the_root_as_they_were() {
    use wgpu_collectives::{DType, wgpu};
    for w in worlds(3) {
        let p = w.placement();
        let got = w
            .run(|c| -> Result<Vec<i32>, Error> {
                let b = c.device().create_buffer(&wgpu::BufferDescriptor {
                    label: Some("the user's"),
                    size: 64,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                let vals: Vec<i32> = (0..16).map(|i| i + 100 * c.rank() as i32).collect();
                c.queue().write_buffer(&b, 0, bytemuck::cast_slice(&vals));
                let x = c.wrap_buffer(&b, 4, DType::I32, 5)?;
                let _ = c.reduce_in_place(&x, ReduceOp::Sum, 1)?.wait()?;
                x.to_vec::<i32>()
            })
            .expect("run");
        for (rank, v) in got.into_iter().enumerate() {
            let v = v.unwrap_or_else(|e| panic!("{p:?} {rank}: {e}"));
            let want: Vec<i32> = (1..6)
                .map(|i| {
                    if rank == 1 {
                        3 * i + 300
                    } else {
                        i + 100 * rank as i32
                    }
                })
                .collect();
            assert_eq!(v, want, "{p:?} rank {rank}");
        }
    }
}
