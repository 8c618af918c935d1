//! Logs like `NCCL_DEBUG`: the benchmark binary calls `init_logging`, so
//! `WGPU_COLLECTIVES_DEBUG` decides what the engine prints on stderr.

use std::process::Command;

/// The binary's stderr for a tiny all_reduce run, with `env` set (and the
/// two log variables otherwise unset).
fn stderr_with(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgpu-collectives"));
    cmd.args([
        "--ranks", "2", "-b", "4096", "-e", "4096", "-n", "1", "-w", "0",
    ])
    .env_remove("WGPU_COLLECTIVES_DEBUG")
    .env_remove("RUST_LOG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the benchmark binary runs");
    assert!(out.status.success(), "exit {:?}", out.status);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn debug_logs_the_world_and_each_collective_with_rank_and_sequence() {
    let err = stderr_with(&[("WGPU_COLLECTIVES_DEBUG", "debug")]);
    for rank in 0..2 {
        assert!(
            err.lines()
                .any(|l| l.contains("world: rank device") && l.contains(&format!("rank={rank}"))),
            "no device line for rank {rank} in:\n{err}"
        );
    }
    assert!(err.contains("cost model measured"), "{err}");
    assert!(
        err.contains("placement=\"shared\"") || err.contains("placement=\"per-rank\""),
        "{err}"
    );
    assert!(err.contains("transport="), "{err}");
    for what in ["issued", "started", "host steps done"] {
        assert!(
            err.lines()
                .any(|l| l.contains(what) && l.contains("rank=1") && l.contains("seq=")),
            "no {what:?} line for rank 1 in:\n{err}"
        );
    }
    assert!(err.contains("all_reduce(float, len 1024, sum)"), "{err}");
    // Each collective's plan, by the name `Plan::parse` takes.
    let planned = err
        .lines()
        .find(|l| l.contains("planned") && l.contains("rank=1"))
        .unwrap_or_else(|| panic!("no plan logged for rank 1:\n{err}"));
    let plan = planned
        .split("plan=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or_else(|| panic!("{planned}"));
    assert!(wgpu_collectives::Plan::parse(plan).is_some(), "{planned}");
    // debug is not trace: no per-step lines.
    assert!(!err.contains("recv_reduce_send"), "{err}");
}

#[test]
fn info_logs_the_world_only_and_nothing_is_logged_by_default() {
    let info = stderr_with(&[("WGPU_COLLECTIVES_DEBUG", "info")]);
    assert!(info.contains("world: rank device"), "{info}");
    assert!(!info.contains("issued"), "{info}");
    let quiet = stderr_with(&[]);
    assert!(
        !quiet.contains("world:") && !quiet.contains("issued"),
        "{quiet}"
    );
}

#[test]
fn trace_logs_every_ring_step() {
    // The ring, forced: where ranks model separate GPUs, a timed table
    // may as well choose the one-shot.
    let err = stderr_with(&[
        ("WGPU_COLLECTIVES_DEBUG", "trace"),
        ("WGPU_COLLECTIVES_PLACEMENT", "per-rank"),
        ("WGPU_COLLECTIVES_PLAN", "device-ring"),
    ]);
    assert!(
        err.lines()
            .any(|l| l.contains("step=\"recv_reduce_copy_send\"") && l.contains("rank=0")),
        "{err}"
    );
}
