//! Tuning by measurement: a tuned world chooses from what it timed on its
//! own devices, gives the reference's results with one plan on every
//! rank, caches its table, takes a cached table without measuring, and
//! measures again over a cache file that is corrupt or another world's.

use std::path::{Path, PathBuf};

use wgpu_collectives::{Error, Placement, Plan, ReduceOp, Tune, World, WorldConfig};

/// An empty cache folder of this test's own.
fn cache(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "wgpu-collectives-tune-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a cache folder");
    dir
}

/// These tests are of the cache, not of the load: a table timed while
/// other processes load the machine is refused (the library's own test),
/// and nothing here may depend on who else runs.
fn config(dir: &Path, tune: Tune) -> WorldConfig {
    WorldConfig::new(2)
        .with_placement(Placement::DevicePerRank)
        .with_tune(tune)
        .with_tune_cache(dir)
        .with_busy_limit(1.0)
}

/// The cache's files, by name.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the cache folder")
        .map(|e| e.expect("an entry").path())
        .collect();
    v.sort();
    v
}

/// The table at `path` as a quiet machine would have cached it: a table
/// whose spread was too high is marked for a second look (the next world
/// measures again), which a test must not leave to the machine's load.
fn trusted(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("the table");
    let quiet = text.replace("second-look\n", "");
    std::fs::write(path, &quiet).expect("the table, trusted");
    quiet
}

/// One all_reduce's sum and the plan it ran with, on one rank.
type Ran = (Vec<f32>, Option<Plan>);

/// Every rank's all_reduce of 1, 1000 and 300000 elements: the sums, and
/// the plan each rank ran.
fn sums(w: &World) -> Vec<Vec<Ran>> {
    w.run(|c| -> Result<Vec<Ran>, Error> {
        let mut out = Vec::new();
        for len in [1, 1000, 300_000] {
            let x = c.tensor(&vec![c.rank() as f32 + 1.0; len])?;
            let sum = c.all_reduce(&x, ReduceOp::Sum)?.wait()?.to_vec::<f32>()?;
            let plan = c.flight_record().ranks[c.rank()]
                .last()
                .and_then(|e| e.plan);
            out.push((sum, plan));
        }
        Ok(out)
    })
    .expect("run")
    .into_iter()
    .map(|r| r.expect("rank"))
    .collect()
}

#[test]
fn a_tuned_world_gives_the_reference_with_one_plan_on_every_rank() {
    let dir = cache("reference");
    let w = World::new(config(&dir, Tune::Measure)).expect("a tuned world");
    let got = sums(&w);
    for (i, len) in [1usize, 1000, 300_000].into_iter().enumerate() {
        for rank in &got {
            assert_eq!(rank[i].0, vec![3.0; len], "len {len}");
            assert!(rank[i].1.is_some(), "len {len}: no plan recorded");
            assert_eq!(
                rank[i].1, got[0][i].1,
                "len {len}: ranks ran different plans"
            );
        }
    }
    let f = files(&dir);
    assert_eq!(f.len(), 1, "{f:?}");
    let text = std::fs::read_to_string(&f[0]).expect("the table");
    assert!(
        text.starts_with("wgpu-collectives tuning 3\nkey "),
        "{text}"
    );
    assert!(text.contains("all_reduce host-ring"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cached_table_is_taken_and_a_corrupt_or_foreign_one_measured_again() {
    let dir = cache("cached");
    drop(World::new(config(&dir, Tune::Cached)).expect("the first world measures"));
    let f = files(&dir);
    assert_eq!(f.len(), 1, "{f:?}");
    let path = &f[0];
    let good = trusted(path);
    let modified = || {
        std::fs::metadata(path)
            .and_then(|m| m.modified())
            .expect("mtime")
    };
    // A world made again measures nothing: the file stays as it was.
    let before = modified();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let w = World::new(config(&dir, Tune::Cached)).expect("the second world");
    assert_eq!(modified(), before, "the cached table was measured again");
    assert_eq!(sums(&w)[1][2].0, vec![3.0; 300_000]);
    drop(w);
    // Corrupt, truncated, another world's, or marked for a second look:
    // ignored, measured, rewritten.
    let foreign = good.replacen("2 ranks", "3 ranks", 1);
    assert_ne!(foreign, good);
    let doubted = good.replace("end\n", "second-look\nend\n");
    for junk in [
        "not a table".to_string(),
        good[..good.len() / 2].to_string(),
        foreign,
        doubted,
    ] {
        let was = junk.clone();
        std::fs::write(path, &junk).expect("spoil the cache");
        let w = World::new(config(&dir, Tune::Cached)).expect("a world over a spoiled cache");
        assert_eq!(sums(&w)[0][1].0, vec![3.0; 1000]);
        drop(w);
        let now = std::fs::read_to_string(path).expect("the table");
        assert!(
            now.starts_with("wgpu-collectives tuning 3\n") && now != was,
            "not rewritten: {now:?}"
        );
        assert!(now.contains("2 ranks"), "{now}");
        assert_eq!(files(&dir).len(), 1, "a temporary file was left behind");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_worlds_tuning_at_once_on_one_cache_folder_both_start() {
    let dir = cache("together");
    std::thread::scope(|s| {
        let a = s.spawn(|| World::new(config(&dir, Tune::Cached)).map(|w| sums(&w)));
        let b = s.spawn(|| World::new(config(&dir, Tune::Cached)).map(|w| sums(&w)));
        for h in [a, b] {
            let got = h.join().expect("no panic").expect("a world");
            assert_eq!(got[0][2].0, vec![3.0; 300_000]);
        }
    });
    let f = files(&dir);
    assert_eq!(f.len(), 1, "{f:?}");
    let text = std::fs::read_to_string(&f[0]).expect("the table");
    assert!(text.starts_with("wgpu-collectives tuning 3\n"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_forced_plan_wins_and_tunes_nothing() {
    let dir = cache("forced");
    let w = World::new(config(&dir, Tune::Measure).with_plan(Some(Plan::OneShot))).expect("world");
    for rank in sums(&w) {
        for (sum, plan) in rank {
            assert_eq!(plan, Some(Plan::OneShot));
            assert!(sum.iter().all(|&v| v == 3.0));
        }
    }
    assert!(
        files(&dir).is_empty(),
        "a forced plan measured: {:?}",
        files(&dir)
    );
    let z = World::new(config(&dir, Tune::Off)).expect("world");
    drop(z);
    assert!(files(&dir).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The placement a cached choice names: the test's own reading of the
/// file.
fn chosen(text: &str) -> Placement {
    match text.lines().find_map(|l| l.strip_prefix("chosen ")) {
        Some("shared") => Placement::SharedDevice,
        Some("per-rank") => Placement::DevicePerRank,
        _ => panic!("no chosen line: {text}"),
    }
}

/// Ranks that share an adapter, left to the engine: all-reduce is timed
/// under both placements, the world runs on the one the cached choice
/// names (which one is timing's to say: the rule is `keep_shared`'s unit
/// tests'), its table is the one cached for that placement, and a world
/// made again takes both from the cache without measuring.
#[test]
fn an_auto_placement_is_chosen_by_timing_both() {
    for (lo, hi) in [(1usize << 20, 64usize << 20), (4 << 10, 4 << 10)] {
        let dir = cache(&format!("placement-{lo}"));
        let make = || {
            World::new(
                WorldConfig::new(2)
                    .with_placement(Placement::Auto)
                    .with_tune(Tune::Cached)
                    .with_tune_cache(&dir)
                    .with_busy_limit(1.0)
                    .with_expected_bytes(lo, hi),
            )
            .expect("a world")
        };
        let w = make();
        let got = sums(&w);
        assert_eq!(got[1][2].0, vec![3.0; 300_000]);
        let texts: Vec<String> = files(&dir)
            .iter()
            .map(|f| std::fs::read_to_string(f).expect("a cache file"))
            .collect();
        assert_eq!(texts.len(), 2, "the choice and one table: {texts:?}");
        let choice = texts
            .iter()
            .find(|t| t.starts_with("wgpu-collectives placement 2\n"))
            .unwrap_or_else(|| panic!("no placement choice: {texts:?}"));
        let table = texts
            .iter()
            .find(|t| t.starts_with("wgpu-collectives tuning 3\n"))
            .unwrap_or_else(|| panic!("no table: {texts:?}"));
        let table_file = files(&dir)
            .into_iter()
            .find(|f| std::fs::read_to_string(f).is_ok_and(|t| &t == table))
            .expect("the table's file");
        let want = chosen(choice);
        // A device per rank names its host link after the placement
        // ("| per-rank, mapped host links |").
        let key = if want == Placement::SharedDevice {
            "| shared |"
        } else {
            "| per-rank"
        };
        assert_eq!(w.placement(), want, "{choice}");
        assert!(
            table.lines().nth(1).is_some_and(|k| k.contains(key)),
            "{table}"
        );
        assert_eq!(w.tuning_table(), Some(table.as_str()));
        drop(w);
        let table = trusted(&table_file);
        // Made again: the same placement and table, nothing measured.
        let stamps = || -> Vec<_> {
            files(&dir)
                .iter()
                .map(|f| {
                    std::fs::metadata(f)
                        .and_then(|m| m.modified())
                        .expect("mtime")
                })
                .collect()
        };
        let before = stamps();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let again = make();
        assert_eq!(again.placement(), want);
        assert_eq!(again.tuning_table(), Some(table.as_str()));
        assert_eq!(stamps(), before, "measured again over a warm cache");
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The host ring is timed (and so can be chosen) only where the host's
/// fold gave the adapter's bits, as the table records: on lavapipe it
/// does; on a GPU that flushes subnormals or divides approximately it
/// must not be offered, or another placement would give other bits.
#[test]
fn the_host_ring_is_offered_only_where_the_host_folds_the_adapters_bits() {
    let dir = cache("same-bits");
    let w = World::new(config(&dir, Tune::Measure)).expect("a tuned world");
    let table = w.tuning_table().expect("a table").to_string();
    let said: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("host-fold "))
        .collect();
    assert_eq!(said.len(), 1, "{table}");
    let timed = table
        .lines()
        .any(|l| l.starts_with("all_reduce host-ring "));
    match said[0] {
        "host-fold same-bits" => assert!(timed, "the host ring was not timed: {table}"),
        "host-fold other-bits" => assert!(!timed, "the host ring was timed: {table}"),
        other => panic!("{other}"),
    }
    // Whatever was chosen, the ranks agree with the reference.
    assert_eq!(sums(&w)[1][2].0, vec![3.0; 300_000]);
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The planner takes what the table says is fastest at each size, but
/// not the one-shot past 4x the largest size it was timed at: it holds
/// every rank's contribution at once (on an H200 the line through its
/// 16 MiB time chose it at 1 GiB, and its room was refused). The table
/// is given (as `wgpu-collectives tune` prints it, comments and another
/// machine's key included): nothing here depends on timing.
#[test]
fn a_given_table_decides_but_not_the_one_shot_far_past_its_timed_sizes() {
    let dir = cache("one-shot");
    let ours = "# timed on another machine\n\
         wgpu-collectives tuning 3\n\
         key some GPU | 2 ranks, one process | per-rank | another CPU x64 | debug\n\
         \n\
         all_reduce one-shot 1024:1e-6~0.01 4096:2e-6~0.02\n\
         all_reduce device-ring 1024:1 4096:2 1048576:3\n\
         host-fold other-bits\nkernel-units 1\nend\n";
    let w = World::new(config(&dir, Tune::Measure).with_tune_table(ours)).expect("a world");
    assert_eq!(w.tuning_table(), Some(ours));
    let got = sums(&w);
    for rank in &got {
        // 1 and 1000 elements (4 and 4000 bytes): the one-shot, as timed.
        assert_eq!(rank[0].1, Some(Plan::OneShot), "{got:?}");
        assert_eq!(rank[1].1, Some(Plan::OneShot), "{got:?}");
        // 1.2 MB: past 4x 4 KiB, so the device ring, dear as it is.
        assert_eq!(rank[2].1, Some(Plan::DeviceRing), "{got:?}");
        assert_eq!(rank[2].0, vec![3.0; 300_000]);
    }
    drop(w);
    assert!(
        files(&dir).is_empty(),
        "a given table was cached: {:?}",
        files(&dir)
    );
    // Text that is not a table names the line.
    let bad = ours.replace("4096:2e-6", "4096:soon");
    match World::new(config(&dir, Tune::Measure).with_tune_table(bad)) {
        Err(Error::InvalidArgument { what, .. }) => {
            assert!(what.contains("line 5"), "{what}")
        }
        other => panic!("a bad table was taken: {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A given table's placement line decides where ranks that share an
/// adapter run (`Auto`), without timing either.
#[test]
fn a_given_tables_placement_is_kept() {
    let dir = cache("given-placement");
    for (line, want) in [
        ("placement shared", Placement::SharedDevice),
        ("placement per-rank", Placement::DevicePerRank),
    ] {
        let table = format!(
            "wgpu-collectives tuning 3\nkey elsewhere\n{line}\n\
             all_reduce device-ring 4096:1e-4 1048576:2e-3\n\
             host-fold other-bits\nkernel-units 1\nend\n"
        );
        let w = World::new(
            WorldConfig::new(2)
                .with_placement(Placement::Auto)
                .with_tune(Tune::Cached)
                .with_tune_cache(&dir)
                .with_tune_table(table),
        )
        .expect("a world");
        assert_eq!(w.placement(), want, "{line}");
        assert_eq!(sums(&w)[1][2].0, vec![3.0; 300_000]);
    }
    assert!(files(&dir).is_empty(), "{:?}", files(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A table is read only by the build that could have measured it: one
/// whose key names the other build profile (a debug build's table for a
/// release build, or the reverse), put where this build looks, is
/// refused and measured again.
#[test]
fn a_table_of_the_other_build_profile_is_not_read() {
    let dir = cache("profile");
    drop(World::new(config(&dir, Tune::Measure)).expect("a tuned world"));
    let f = files(&dir);
    assert_eq!(f.len(), 1, "{f:?}");
    let good = std::fs::read_to_string(&f[0]).expect("the table");
    let key = good.lines().nth(1).expect("a key line").to_string();
    let (this, other) = if cfg!(debug_assertions) {
        ("| debug ", "| release ")
    } else {
        ("| release ", "| debug ")
    };
    assert!(
        key.contains(this),
        "the key does not name the profile: {key}"
    );
    let foreign = good.replacen(this, other, 1);
    assert_ne!(foreign, good);
    std::fs::write(&f[0], &foreign).expect("the other profile's table");
    drop(World::new(config(&dir, Tune::Cached)).expect("a world"));
    let now = std::fs::read_to_string(&f[0]).expect("the table");
    assert_eq!(
        now.lines().nth(1),
        Some(key.as_str()),
        "the other profile's table was read"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Junk given as a table is refused by every constructor, whether or not
/// the world then tunes: `World::new` and `World::from_devices` alike,
/// with a plan or an algorithm forced, and with one rank.
#[test]
fn every_constructor_refuses_a_junk_table() {
    use wgpu_collectives::{Algorithm, wgpu};
    let adapter = {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle().with_env());
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        if let Ok(name) = std::env::var("WGPU_ADAPTER_NAME") {
            let name = name.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&name));
        }
        adapters
            .into_iter()
            .next()
            .expect("an adapter (is one installed?)")
    };
    let device = pollster::block_on(adapter.request_device(&Default::default())).expect("a device");
    let junk = "not a tuning table\nat all\n";
    let configs: Vec<(&str, usize, WorldConfig)> = vec![
        ("two ranks", 2, WorldConfig::new(2)),
        ("one rank", 1, WorldConfig::new(1)),
        (
            "a plan forced",
            2,
            WorldConfig::new(2).with_plan(Some(Plan::DeviceRing)),
        ),
        (
            "an algorithm forced",
            2,
            WorldConfig::new(2).with_algorithm(Algorithm::Ring),
        ),
    ];
    for (what, n, config) in configs {
        let config = config.with_tune_table(junk).with_tune(Tune::Off);
        let refused = |r: Result<World, Error>, by: &str| match r {
            Err(Error::InvalidArgument { what: why, .. }) => {
                assert!(why.contains("with_tune_table"), "{by}, {what}: {why}")
            }
            Err(e) => panic!("{by}, {what}: not InvalidArgument: {e}"),
            Ok(_) => panic!("{by}, {what}: a junk table was taken"),
        };
        refused(World::new(config.clone()), "World::new");
        refused(
            World::from_devices(vec![device.clone(); n], config),
            "World::from_devices",
        );
    }
}
