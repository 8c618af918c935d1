//! Where tuning tables are kept between worlds, and what they are kept
//! under.
//!
//! A table is only as good as the conditions it was timed in, so its key
//! names everything that changes speed (as PyTorch inductor keys its
//! autotuning cache): the build profile (a debug build's table read by a
//! release build once chose from figures 10x off), the wgpu version, a
//! hash of this crate's own source, the CPU and its core count, every
//! adapter in use with its driver, the backend, the ranks and how they
//! are laid out. The file is named by a hash of the key and holds the key,
//! so that a collision or a file copied from elsewhere is refused by
//! name. Files are written whole (a temporary file, renamed), so that two
//! processes writing at once leave one of their tables, never a mix.

use std::path::{Path, PathBuf};

use crate::api::config::WorldConfig;
use crate::device::RankDevice;
use crate::runtime::tune::Table;

/// The build this is: its profile and optimisation level, the wgpu it is
/// built on, and a hash of this crate's sources and shaders (`build.rs`).
pub(crate) fn build() -> String {
    format!(
        "{} opt-level {} | wgpu {} | source {} {}",
        env!("WGPU_COLLECTIVES_PROFILE"),
        env!("WGPU_COLLECTIVES_OPT_LEVEL"),
        env!("WGPU_COLLECTIVES_WGPU_VERSION"),
        env!("CARGO_PKG_VERSION"),
        env!("WGPU_COLLECTIVES_SOURCE_HASH"),
    )
}

/// This machine's CPU: its model name and the logical cores there are.
pub(crate) fn cpu() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    format!("{model} x{cores}")
}

/// What a table of `n` ranks on `devices` (meeting on one device when
/// `meets`, else with the host links they have) is measured under, on one
/// line; `layout` names how the ranks spread over processes.
pub(crate) fn key(
    devices: &[std::sync::Arc<RankDevice>],
    n: usize,
    meets: bool,
    layout: &str,
) -> String {
    let mut adapters: Vec<String> = devices
        .iter()
        .map(|d| {
            let i = &d.info;
            format!(
                "{} [{:04x}:{:04x}] {} {} {:?}",
                i.name, i.vendor, i.device, i.driver, i.driver_info, i.backend
            )
        })
        .collect();
    adapters.dedup();
    format!(
        "{} | {n} ranks, {layout} | {} | {} | {}",
        adapters.join(" + "),
        match (meets, devices.iter().all(|d| d.imports.is_ok())) {
            (true, _) => "shared",
            (false, true) => "per-rank, mapped host links",
            (false, false) => "per-rank, staged host links",
        },
        cpu(),
        build(),
    )
    .replace(['\n', '\r'], " ")
}

/// The cache file's name for `key`.
pub(crate) fn file_name(key: &str) -> String {
    format!(
        "{:016x}.tune",
        crate::hash::fnv1a(key.bytes().map(u64::from))
    )
}

/// The cached table measured under `key`, with its text and path, when
/// there is a good one; a bad one is warned of (and measured again by the
/// caller), and so is one marked for a second look.
pub(crate) fn read(config: &WorldConfig, key: &str) -> Option<(Table, String, PathBuf)> {
    let path = config.tune_cache()?.join(file_name(key));
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), error = %e, "world: reading the tuning cache");
            }
            return None;
        }
    };
    match Table::from_text(&text, Some(key)) {
        Ok(table) if table.second_look => {
            tracing::info!(
                path = %path.display(),
                "world: the cached tuning table was timed on a busy machine; measuring again"
            );
            None
        }
        Ok(table) => {
            tracing::info!(path = %path.display(), "world: tuning table from the cache");
            Some((table, text, path))
        }
        Err(why) => {
            tracing::warn!(
                path = %path.display(),
                why,
                "world: ignoring the cached tuning table; measuring again"
            );
            None
        }
    }
}

/// Writes `text` to `path` whole: into a temporary file beside it, then
/// renamed over it.
fn store(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".{}.{}.{nanos}.tmp",
        path.file_name().and_then(|f| f.to_str()).unwrap_or("tune"),
        std::process::id()
    ));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Stores `text` at `path` ([`store`]); a failure is warned of, naming
/// `what`, and leaves the world uncached. Whether it was stored.
pub(crate) fn write(path: &Path, text: &str, what: &str) -> bool {
    match store(path, text) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "world: could not cache {what}");
            false
        }
    }
}

/// Seconds since 1970, now.
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_build_names_its_profile_and_what_it_is_built_from() {
        let b = build();
        let profile = if cfg!(debug_assertions) {
            "debug "
        } else {
            "release "
        };
        assert!(b.starts_with(profile), "{b}");
        assert!(b.contains("| wgpu 30."), "{b}");
        assert!(
            b.contains(&format!("source {}", env!("CARGO_PKG_VERSION"))),
            "{b}"
        );
        // The source hash is 16 hex digits.
        let hash = b.rsplit(' ').next().unwrap_or_default();
        assert_eq!(hash.len(), 16, "{b}");
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{b}");
    }

    #[test]
    fn the_cpu_is_named_with_its_cores() {
        let c = cpu();
        let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
        assert!(c.ends_with(&format!(" x{cores}")), "{c}");
    }
}
