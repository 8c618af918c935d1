//! Failed collectives give their memory back: 2,000 runs that each end in
//! a failure keep resident memory flat.
//!
//! Measured in a child process (this test re-runs itself with
//! `MEMORY_CHILD` set), so that other tests' allocations in this process
//! do not move the figure. On a CPU adapter device memory is host memory,
//! so resident memory counts the device's buffers too.

mod common;

use std::process::Command;

use common::*;
use wgpu_collectives::{Error, ReduceOp};

const CHILD: &str = "MEMORY_CHILD";
const RUNS: usize = 2000;
/// Runs before the baseline is taken: pools, caches and pipelines warm up.
const WARMUP: usize = 100;

/// Resident memory of this process in KiB (Linux).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// One run: a 1 MiB all_reduce that succeeds, then a length mismatch.
fn failing_run(w: &wgpu_collectives::World) {
    let out = w
        .run(|c| {
            let x = c.tensor(&vec![1.0f32; 1 << 18])?;
            let y = c.all_reduce(&x, ReduceOp::Sum)?.wait()?;
            let bad = c.tensor(&vec![1.0f32; 10 + c.rank()])?;
            let e = c.all_reduce(&bad, ReduceOp::Sum)?.wait();
            Ok::<_, Error>((y.len(), e.is_err()))
        })
        .expect("run");
    for r in out {
        let (len, failed) = r.expect("rank");
        assert_eq!(len, 1 << 18);
        assert!(failed, "the mismatched all_reduce must fail");
    }
}

fn child() {
    let w = world(2);
    let mut samples = Vec::new();
    for i in 1..=RUNS {
        failing_run(&w);
        if i == WARMUP || i % 250 == 0 {
            samples.push((i, rss_kib()));
        }
    }
    for (i, kib) in samples {
        println!("rss after {i} runs: {kib} KiB");
    }
}

#[test]
fn two_thousand_failing_runs_keep_resident_memory_flat() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let exe = std::env::current_exe().expect("test binary");
    let out = Command::new(exe)
        .args([
            "--exact",
            "two_thousand_failing_runs_keep_resident_memory_flat",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("running the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(usize, u64)> = stdout
        .lines()
        .filter_map(|l| {
            // The harness may print "test <name> ... " on the same line first.
            let rest = &l[l.find("rss after ")? + "rss after ".len()..];
            let (runs, kib) = rest.split_once(" runs: ")?;
            Some((
                runs.parse().ok()?,
                kib.trim_end_matches(" KiB").parse().ok()?,
            ))
        })
        .collect();
    assert_eq!(samples.len(), 1 + RUNS / 250, "child output: {stdout}");
    let (_, base) = samples[0];
    let (_, last) = samples[samples.len() - 1];
    let peak = samples.iter().map(|&(_, k)| k).max().unwrap_or(0);
    println!("{stdout}");
    // Flat: what 1,900 more failures add stays under 32 MiB (a leak of the
    // staging buffers of each failure, 2 MiB a run, adds hundreds).
    assert!(
        peak.saturating_sub(base) < 32 * 1024,
        "resident memory grew from {base} KiB after {WARMUP} runs to a peak of {peak} KiB \
         (last {last} KiB)\n{stdout}"
    );
}
