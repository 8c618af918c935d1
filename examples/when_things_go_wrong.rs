//! Prints the errors a user sees when ranks disagree or one never arrives.
//! `cargo run --release --example when_things_go_wrong`

use std::time::Duration;

use wgpu_collectives::{Error, ReduceOp, World, WorldConfig};

fn main() -> Result<(), Error> {
    let world = World::new(WorldConfig::new(3).with_timeout(Duration::from_secs(2)))?;

    // Rank 1 reduces a different length from the others.
    let r = world.run(|c| {
        let len = if c.rank() == 1 { 500 } else { 1000 };
        let x = c.tensor(&vec![1.0f32; len])?;
        c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
    })?;
    println!(
        "mismatch, rank 0 sees:\n  {}\n",
        r[0].as_ref().expect_err("must fail")
    );

    // Rank 2 is busy elsewhere and never issues the second all_reduce in time.
    let r = world.run(|c| {
        let x = c.tensor(&[1.0f32; 1000])?;
        let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_secs(4));
            return Ok(());
        }
        c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
    })?;
    for (rank, res) in r.iter().enumerate().take(2) {
        println!(
            "timeout, rank {rank} sees:\n  {}\n",
            res.as_ref().expect_err("must fail")
        );
    }
    Ok(())
}
