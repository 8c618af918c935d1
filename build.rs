//! What the tuning cache's key needs to know of this build (see
//! `src/api/tune/cache.rs`): the profile and optimisation level, the wgpu
//! version it links, and a hash of this crate's sources and shaders, so
//! that a table timed with other code is never read as this code's.

use std::path::{Path, PathBuf};

fn main() {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    for watched in ["src", "shaders", "Cargo.toml", "build.rs"] {
        println!("cargo:rerun-if-changed={watched}");
    }
    let mut files = Vec::new();
    for sub in ["src", "shaders"] {
        walk(&dir.join(sub), &mut files);
    }
    files.push(dir.join("Cargo.toml"));
    files.sort();
    // FNV-1a over each file's path (relative) and bytes.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    for f in &files {
        let rel = f.strip_prefix(&dir).unwrap_or(f);
        eat(rel.to_string_lossy().as_bytes());
        eat(&std::fs::read(f).unwrap_or_default());
    }
    println!("cargo:rustc-env=WGPU_COLLECTIVES_SOURCE_HASH={h:016x}");
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into());
    let opt = std::env::var("OPT_LEVEL").unwrap_or_else(|_| "?".into());
    println!("cargo:rustc-env=WGPU_COLLECTIVES_PROFILE={profile}");
    println!("cargo:rustc-env=WGPU_COLLECTIVES_OPT_LEVEL={opt}");
    println!(
        "cargo:rustc-env=WGPU_COLLECTIVES_WGPU_VERSION={}",
        wgpu_version(&dir).unwrap_or_else(|| "30 (lock file not found)".into())
    );
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The wgpu version the lock file of the workspace being built pins: the
/// first `Cargo.lock` above this crate or above the build's output.
fn wgpu_version(manifest: &Path) -> Option<String> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR")?);
    let lock = manifest
        .ancestors()
        .chain(out.ancestors())
        .map(|d| d.join("Cargo.lock"))
        .find(|p| p.is_file())?;
    println!("cargo:rerun-if-changed={}", lock.display());
    let text = std::fs::read_to_string(lock).ok()?;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l.trim() == "name = \"wgpu\"" {
            let v = lines.next()?.trim().strip_prefix("version = \"")?;
            return Some(v.trim_end_matches('"').to_string());
        }
    }
    None
}
