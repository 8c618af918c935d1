//! A world as the bench a plan is timed on (`tune/timing.rs`'s `Bench`;
//! `World::bench` makes one): the calls timing asks for, run through the public API on a
//! world with that plan forced.

use std::time::Instant;

use crate::api::tune::timing::Bench;
use crate::api::world::World;
use crate::device::tensor::DType;
use crate::error::{Error, Result};
use crate::op::ReduceOp;
use crate::runtime::estimate::Ask;
use crate::runtime::fingerprint::Kind;

impl Bench for World {
    /// The seconds of each of `ask.calls` calls of `ask.kind` of `ask.bytes`
    /// per rank on `w` (each call's slowest rank), when it runs with
    /// `ask.plan`; `None` when it runs another (the kind does not offer it)
    /// or cannot run this size with it.
    fn time(&self, ask: &Ask) -> Result<Option<Vec<f64>>> {
        let w = self;
        let n = w.size();
        let len = (ask.bytes / 4).max(1).next_multiple_of(n);
        let per_rank = w.run(|c| -> Result<Option<Vec<f64>>> {
            let x = c.zeros(DType::F32, len)?;
            let once = || -> Result<()> {
                let work = match ask.kind {
                    Kind::AllReduce => c.all_reduce_in_place(&x, ReduceOp::Sum)?,
                    Kind::ReduceScatter => c.reduce_scatter(&x, ReduceOp::Sum)?,
                    Kind::AllGather => c.all_gather(&x)?,
                    _ => c.broadcast_in_place(&x, 0)?,
                };
                work.wait().map(|_| ())
            };
            if ask.warm {
                once()?;
            }
            let _ = c.barrier()?.wait()?;
            let mut times = Vec::with_capacity(ask.calls);
            for _ in 0..ask.calls {
                let t = Instant::now();
                once()?;
                times.push(t.elapsed().as_secs_f64());
            }
            let ran = c
                .flight_record()
                .ranks
                .get(c.rank())
                .and_then(|r| r.iter().rev().find(|e| e.collective == ask.kind.name()))
                .and_then(|e| e.plan);
            Ok((ran == Some(ask.plan)).then_some(times))
        })?;
        let mut slowest = vec![0.0f64; ask.calls];
        for r in per_rank {
            match r {
                Ok(Some(times)) => {
                    for (s, t) in slowest.iter_mut().zip(times) {
                        *s = s.max(t);
                    }
                }
                Ok(None) | Err(Error::InvalidArgument { .. }) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(slowest))
    }
}
