//! The flight recorder as data: read it from a world or a communicator,
//! print it, parse its JSON, and find it on disk after a forced timeout.

mod common;

use std::time::Duration;

use wgpu_collectives::{Error, FlightState, Placement, Plan, ReduceOp, World, WorldConfig};

#[test]
fn the_record_keeps_the_last_collectives_of_every_rank() {
    let w = World::new(WorldConfig::new(3).with_flight_depth(3)).expect("a world");
    w.run(|c| -> Result<(), Error> {
        let x = c.tensor(&[1i32; 10])?;
        for _ in 0..4 {
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
        }
        c.barrier()?.wait().map(|_| ())
    })
    .expect("the run")
    .into_iter()
    .collect::<Result<Vec<()>, Error>>()
    .expect("every rank");
    let rec = w.flight_record();
    assert_eq!(rec.ranks.len(), 3);
    assert_eq!(rec.world_ranks, vec![0, 1, 2]);
    for (r, entries) in rec.ranks.iter().enumerate() {
        let seqs: Vec<u64> = entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![2, 3, 4], "rank {r}: the newest 3, oldest first");
        assert_eq!(entries[0].collective, "all_reduce");
        assert_eq!(entries[0].fingerprint, "#2 all_reduce(int32, len 10, sum)");
        assert_eq!(entries[0].bytes, Some(40));
        assert_eq!(entries[2].collective, "barrier");
        assert_eq!(entries[2].bytes, None);
        assert!(entries.iter().all(|e| e.state == FlightState::Completed));
        assert!(entries.iter().all(|e| e.changed_at >= e.issued_at));
        // Each names the plan it ran with.
        assert!(entries.iter().all(|e| e.plan.is_some()), "{rec}");
    }
    let text = rec.to_string();
    assert!(
        text.contains("rank 2: [2 all_reduce 40 bytes, completed"),
        "{text}"
    );
    // The communicator's view is its group's.
    let c1 = w.communicator(1).expect("rank 1");
    assert_eq!(c1.flight_record().ranks.len(), 3);
}

#[test]
fn the_default_depth_is_64_and_json_parses() {
    let w = common::world(2);
    w.run(|c| -> Result<(), Error> {
        for _ in 0..70 {
            let _ = c.barrier()?.wait()?;
        }
        Ok(())
    })
    .expect("the run");
    let rec = w.flight_record();
    assert!(rec.ranks.iter().all(|e| e.len() == 64), "{rec}");
    let v: serde_json::Value = serde_json::from_str(&rec.to_json()).expect("JSON");
    let ranks = v["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2);
    let first = &ranks[1]["collectives"][0];
    assert_eq!(first["seq"], 6);
    assert_eq!(first["collective"], "barrier");
    assert_eq!(first["state"], "completed");
    let plan = first["plan"].as_str().expect("the plan that ran");
    assert!(wgpu_collectives::Plan::parse(plan).is_some(), "{plan}");
    assert!(first["issued_at_us"].as_u64().expect("a time") > 1_700_000_000_000_000);
}

#[test]
fn a_timeout_writes_the_record_where_asked() {
    // Named, not left to the tuner: an `Auto` placement keeps whichever it
    // measured faster, and what a rank waits on differs between the two.
    for placement in [Placement::SharedDevice, Placement::DevicePerRank] {
        a_timeout_writes_the_record_on(placement);
    }
}

fn a_timeout_writes_the_record_on(placement: Placement) {
    let dir = std::env::temp_dir().join(format!(
        "wgpu-collectives-flight-{}-{}",
        std::process::id(),
        placement.name()
    ));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let path = dir.join("dump");
    let file = dir.join("dump.ranks-0-2.json");
    let _ = std::fs::remove_file(&file);
    let w = World::new(
        WorldConfig::new(3)
            .with_placement(placement)
            .with_plan(Some(Plan::OneShot))
            .with_timeout(Duration::from_secs(1))
            .with_flight_dump(&path),
    )
    .expect("a world");
    let r = w
        .run(|c| -> Result<(), Error> {
            let x = c.tensor(&[1.0f32; 8])?;
            let _ = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            if c.rank() == 2 {
                // Never issues #1, and stays (so peers time out rather than
                // see it leave).
                std::thread::sleep(Duration::from_millis(2500));
                return Ok(());
            }
            c.all_reduce(&x, ReduceOp::Sum)?.wait().map(|_| ())
        })
        .expect("the run");
    assert!(
        matches!(r[0], Err(Error::Timeout { .. })),
        "{placement:?}: {:?}",
        r[0]
    );
    let json = std::fs::read_to_string(&file).expect("the dump file");
    let v: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let states = |r: usize| -> Vec<(u64, String)> {
        v["ranks"][r]["collectives"]
            .as_array()
            .expect("collectives")
            .iter()
            .map(|e| {
                (
                    e["seq"].as_u64().expect("seq"),
                    e["state"].as_str().expect("state").to_string(),
                )
            })
            .collect()
    };
    // Ranks 0 and 1 were in #1; rank 2 never issued it.
    assert_eq!(states(0).last().map(|e| e.0), Some(1), "{json}");
    assert_eq!(states(2), vec![(0, "completed".to_string())], "{json}");
    // The dump says what failed, as the error did: rank 2, the one that
    // never came. On a shared device the meeting waits for it to join; on
    // devices of their own, one-shot's handshake or its data (whichever
    // rank's deadline passed first).
    let error = v["failure"]["error"].as_str().expect("the failure's error");
    assert!(error.starts_with("timeout on rank"), "{json}");
    let waited_for_2 = match placement {
        Placement::SharedDevice => error.contains("ranks 2 to join on the shared device"),
        _ => error.contains("rank 2 to join #1") || error.contains("rank 2 to send 32 bytes of #1"),
    };
    assert!(waited_for_2, "{placement:?}: {json}");
    let _ = std::fs::remove_dir_all(&dir);
}
