use wgpu_collectives::*;
fn main() -> Result<()> {
    for n in [1usize, 2, 3, 4] {
        let world = World::new(WorldConfig::new(n))?;
        println!(
            "{:?}",
            world
                .adapters()
                .iter()
                .map(|a| a.name.clone())
                .collect::<Vec<_>>()
        );
        for len in [0usize, 1, 5, 1000, 1_000_003] {
            let t = std::time::Instant::now();
            let res = world.run(|c| {
                let x = c.tensor(&vec![(c.rank() + 1) as f32; len])?;
                let y = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
                y.to_vec::<f32>()
            })?;
            let want = (n * (n + 1) / 2) as f32;
            for r in res {
                let v = r?;
                assert!(
                    v.iter().all(|&x| x == want),
                    "n={n} len={len} got {:?}",
                    &v[..v.len().min(8)]
                );
            }
            println!("n={n} len={len} ok {:?}", t.elapsed());
        }
    }
    Ok(())
}
