//! Logging through `tracing`, filtered by `RUST_LOG` (default `info`): human-readable text, or
//! one JSON object per line for log collectors (`--log-format json`). Every request's span
//! names its RPC and the session and call ids it concerns, so each line can be traced to them.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Safe to call more than once (later calls do nothing), which
/// the tests rely on.
pub fn init(default_filter: &str, json: bool) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        // Colour codes only for people at a terminal, never into files or log collectors.
        .with_ansi(!json && std::io::stdout().is_terminal());
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
