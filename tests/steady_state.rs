//! In steady state a collective creates no wgpu resources: outputs and
//! scratch come from the device's pool, staging buffers are made once per
//! communicator, pipelines and bind groups are cached.

mod common;

use common::*;
use wgpu_collectives::{Communicator, Error, ReduceOp};

fn repeat(c: &Communicator, times: usize, bytes: usize) -> Result<(), Error> {
    let x = c.tensor(&inputs::<f32>(ReduceOp::Sum, c.rank(), bytes / 4))?;
    for _ in 0..times {
        c.all_reduce_in_place(&x, ReduceOp::Sum)?.wait()?;
        let y = c.all_reduce(&x, ReduceOp::Max)?.wait()?;
        drop(y);
    }
    Ok(())
}

#[test]
fn a_hundred_repeated_collectives_create_no_wgpu_resources() {
    let w = world(4);
    for bytes in [4 << 10, 3 << 20] {
        let counts = w
            .run(|c| -> Result<(u64, u64), Error> {
                repeat(c, 1, bytes)?;
                let before = c.resources_created();
                repeat(c, 100, bytes)?;
                Ok((before, c.resources_created()))
            })
            .expect("run");
        for (rank, r) in counts.into_iter().enumerate() {
            let (before, after) = r.expect("collectives");
            assert!(
                before > 0,
                "rank {rank}: the first collective creates its resources"
            );
            assert_eq!(
                after,
                before,
                "rank {rank}, {bytes} bytes: 100 more collectives created {} wgpu resources",
                after - before
            );
        }
    }
}
