//! Junk on the wire: a process that sends what no engine sends is refused
//! (`transport/mpi/hub.rs`). The forging lives in the test build alone
//! (`transport/mpi/hub/forge.rs`), so this test is a library test, run
//! under mpirun by `.ci/run`:
//!
//! ```text
//! WGPU_COLLECTIVES_MPI_JUNK=<case> mpirun -n 2 <lib test binary> \
//!     --ignored --exact api::world_mpi::junk::a_process_that_forges_is_refused
//! ```
#![allow(
    clippy::expect_used,
    clippy::panic,
    reason = "a test: a failed expectation is a failed test"
)]

use std::time::{Duration, Instant};

use crate::api::config::WorldConfig;
use crate::api::world::World;
use crate::error::{Error, Result};
use crate::op::ReduceOp;

impl World {
    /// Sends process `process` what no engine sends, named by `what`
    /// (`short-head`, `stray-tag`, `kind`, `long-body`, `short-body`,
    /// `route`, `flood`), on this world's communicator.
    fn forge_wire(&self, process: usize, what: &str) -> Result<()> {
        let invalid = |what: String| Error::InvalidArgument { rank: None, what };
        let hub = self
            .hub
            .as_ref()
            .ok_or_else(|| invalid("forge_wire: not a world over MPI".into()))?;
        if process >= hub.processes || process == hub.process {
            return Err(invalid(format!(
                "forge_wire: no other process {process} among {}",
                hub.processes
            )));
        }
        if hub.forge(process, self.group, self.local_ranks().len(), what) {
            Ok(())
        } else {
            Err(invalid(format!("forge_wire: no forgery named {what:?}")))
        }
    }
}

/// Process 1 sends process 0 the forgery `WGPU_COLLECTIVES_MPI_JUNK`
/// names, then every rank runs an all_reduce (process 0 once it has
/// refused process 1). Process 0 must refuse
/// process 1: both its ranks fail with `Error::Transport` naming process 1
/// and what was wrong, and every other rank fails too (none waits out its
/// deadline without an error, none succeeds), and no process aborts.
#[test]
#[ignore = "needs mpirun -n 2 and WGPU_COLLECTIVES_MPI_JUNK (.ci/run runs it)"]
fn a_process_that_forges_is_refused() {
    let case = std::env::var("WGPU_COLLECTIVES_MPI_JUNK").expect("WGPU_COLLECTIVES_MPI_JUNK");
    let said = match case.as_str() {
        "short-head" => "a message of 7 bytes with tag 17 where a frame's head",
        "stray-tag" => "a message of 16 bytes with tag 57",
        "kind" => "a head of an unknown kind (238)",
        "long-body" => "that announces a body of",
        "short-body" => "a body of 8 bytes after a head that announced 64",
        "route" => "for rank 2 (in process 1) from rank 2 (in process 1)",
        "flood" => "for routes not open here",
        other => panic!("no junk case {other:?}"),
    };
    let world = World::from_mpi(WorldConfig::new(2).with_timeout(Duration::from_secs(20)))
        .expect("World::from_mpi");
    let process = world.local_ranks().start / 2;
    if process == 1 {
        world.forge_wire(0, &case).expect("forge_wire");
    }
    // Process 0 runs once it has refused process 1 and its world holds
    // that as a lasting failure: with three processes its ranks need no
    // frame of process 1's (the ring reaches them through process 2), so
    // a run that started earlier could end before the junk is read.
    if process == 0 {
        let due = Instant::now() + Duration::from_secs(20);
        while !world.health.failed_for_good() {
            assert!(
                Instant::now() < due,
                "junk ({case}): process 1 not refused in 20 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let started = Instant::now();
    let results = world
        .run(|c| {
            c.tensor(&vec![1.0f32; 1000])
                .and_then(|x| c.all_reduce(&x, ReduceOp::Sum))
                .and_then(|w| w.wait())
                .and_then(|t| t.to_vec::<f32>())
        })
        .expect("the run");
    let took = started.elapsed();
    for (rank, r) in world.local_ranks().zip(results) {
        let fine = match (&r, process) {
            (Err(Error::Transport { what, .. }), 0) => {
                what.contains("process 1 (ranks 2 to 3) sent what no engine sends")
                    && what.contains(said)
            }
            (Err(_), 0) | (Ok(_), _) => false,
            (Err(_), _) => true,
        };
        assert!(
            fine,
            "junk ({case}): rank {rank} of process {process}: {r:?}"
        );
    }
    println!("junk ({case}) refused on process {process}: every rank failed, in {took:.1?}");
}
