//! The engine inside an MPI program (feature `mpi`): the program
//! initialises MPI itself, as one that already uses it for its own work
//! does, makes its worlds on its communicator with
//! `World::from_mpi_comm`, and keeps using MPI between the engine's
//! collectives: its own `MPI_Send`/`MPI_Recv` on `MPI_COMM_WORLD`, with
//! the very tags the engine uses on its own duplicate (17 and 18), and an
//! `MPI_Allreduce`. Every process checks what it got and exits 1 on any
//! difference.
//!
//! ```text
//! cargo build --release --features mpi --example mpi_app
//! mpirun -n 2 target/release/examples/mpi_app
//! ```

use std::process::ExitCode;

use mpi::collective::SystemOperation;
use mpi::traits::*;
use wgpu_collectives::{ReduceOp, World, WorldConfig};

/// The engine's part: every rank's all_reduce of ones and all_gather of
/// rank numbers, checked.
fn collectives(world: &World) -> Result<(), String> {
    let ranks = world.size();
    let one_rank = |c: &wgpu_collectives::Communicator| -> Result<(), String> {
        let ones = c.tensor(&vec![1.0f32; 4099]).map_err(|e| e.to_string())?;
        let sums = c
            .all_reduce(&ones, ReduceOp::Sum)
            .and_then(|w| w.wait())
            .and_then(|t| t.to_vec::<f32>())
            .map_err(|e| e.to_string())?;
        let ids = c
            .tensor(&[c.rank() as u32])
            .and_then(|t| c.all_gather(&t))
            .and_then(|w| w.wait())
            .and_then(|t| t.to_vec::<u32>())
            .map_err(|e| e.to_string())?;
        let want: Vec<u32> = (0..ranks as u32).collect();
        if sums.iter().any(|&v| v != ranks as f32) || ids != want {
            return Err(format!(
                "rank {}: sums {:?}.., ranks {ids:?}",
                c.rank(),
                &sums[..2]
            ));
        }
        Ok(())
    };
    world
        .run(one_rank)
        .map_err(|e| e.to_string())?
        .into_iter()
        .collect()
}

fn main() -> ExitCode {
    // The engine's thread calls MPI beside the program's own threads.
    let Some((universe, mpi::Threading::Multiple)) =
        mpi::initialize_with_threading(mpi::Threading::Multiple)
    else {
        eprintln!("this MPI does not give MPI_THREAD_MULTIPLE");
        return ExitCode::FAILURE;
    };
    let comm = universe.world();
    let (me, n) = (comm.rank(), comm.size());
    let result = (|| -> Result<(), String> {
        // Two ranks per process, on the processes of `comm`.
        let world = World::from_mpi_comm(&comm, WorldConfig::new(2)).map_err(|e| e.to_string())?;
        collectives(&world)?;

        // The program's own messages around a ring of processes, on
        // MPI_COMM_WORLD with tags 17 and 18.
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        let head = [me as u8; 102];
        let body: Vec<u8> = (0..100_000).map(|i| (i + me) as u8).collect();
        let (got_head, got_body) = mpi::request::scope(|scope| {
            let to = comm.process_at_rank(next);
            let a = to.immediate_send_with_tag(scope, &head[..], 17);
            let b = to.immediate_send_with_tag(scope, &body[..], 18);
            let from = comm.process_at_rank(prev);
            let (h, _) = from.receive_vec_with_tag::<u8>(17);
            let (d, _) = from.receive_vec_with_tag::<u8>(18);
            a.wait();
            b.wait();
            (h, d)
        });
        let want: Vec<u8> = (0..100_000).map(|i| (i + prev) as u8).collect();
        if got_head != [prev as u8; 102] || got_body != want {
            return Err("the program's own messages came back changed".into());
        }
        // And its own MPI_Allreduce.
        let mut sum = 0i64;
        comm.all_reduce_into(&i64::from(me), &mut sum, SystemOperation::sum());
        if sum != i64::from(n) * i64::from(n - 1) / 2 {
            return Err(format!("MPI_Allreduce gave {sum}"));
        }

        collectives(&world)?;
        drop(world);
        // MPI is still the program's: a second world on it.
        comm.barrier();
        let again = World::from_mpi_comm(&comm, WorldConfig::new(2)).map_err(|e| e.to_string())?;
        collectives(&again)
    })();
    // The program finalises MPI when `universe` drops.
    match result {
        Ok(()) => {
            println!(
                "process {me} of {n}: the engine's collectives and the program's own MPI agree"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("process {me} of {n}: {e}");
            ExitCode::FAILURE
        }
    }
}
