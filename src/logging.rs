//! Logs, as `NCCL_DEBUG` gives them: the engine emits `tracing` events
//! (adapters, devices, transport and cost model at `info`; each
//! collective's issue, algorithm, completion or failure at `debug`; each
//! step at `trace`) and never installs a subscriber by itself, which is
//! the application's choice. [`init_logging`] is that choice made for
//! programs that want the engine's logs on stderr.

/// Installs a `tracing` subscriber that prints to stderr, filtered by
/// `WGPU_COLLECTIVES_DEBUG` (`info`, `debug`, `trace`: the engine's events
/// at that level; or any `tracing-subscriber` filter, such as
/// `wgpu_collectives=debug,wgpu_core=warn`), else `RUST_LOG`. With
/// neither set it installs nothing and logging costs nothing. Returns
/// whether it installed one (not when another global subscriber exists).
///
/// ```
/// // Prints nothing unless WGPU_COLLECTIVES_DEBUG or RUST_LOG is set.
/// wgpu_collectives::init_logging();
/// ```
pub fn init_logging() -> bool {
    let filter = match std::env::var("WGPU_COLLECTIVES_DEBUG") {
        // A bare level is for this crate's events only (wgpu logs plenty).
        Ok(v) if !v.is_empty() && !v.contains('=') && !v.contains(',') => {
            format!("wgpu_collectives={v}")
        }
        Ok(v) if !v.is_empty() => v,
        _ => match std::env::var("RUST_LOG") {
            Ok(v) if !v.is_empty() => v,
            _ => return false,
        },
    };
    let Ok(filter) = tracing_subscriber::EnvFilter::try_new(&filter) else {
        eprintln!("wgpu-collectives: ignoring the log filter {filter:?}: it does not parse");
        return false;
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_thread_names(true)
        .try_init()
        .is_ok()
}
