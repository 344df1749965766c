//! Logging through `tracing`, filtered by `RUST_LOG` (default `info`): human-readable text, or
//! one JSON object per line for log collectors (`--log-format json`). Every request's span
//! names its RPC and the session and call ids it concerns, so each line can be traced to them.
//! When traces are exported (`traces`), the same spans also go to OTLP, through a layer of
//! their own that sees only the broker's spans, whatever `RUST_LOG` says.
//!
//! At the default level an operator sees what happened: one line per outcome written
//! ([`outcomes_written`]) and one per refused request (`grpc::observed`), never a tool input,
//! a reason's text or a token.

use std::io::IsTerminal as _;

use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::domain::Call;

/// Installs the global subscriber. Safe to call more than once (later calls do nothing), which
/// the tests rely on.
pub fn init(default_filter: &str, json: bool) {
    init_traced(default_filter, json, None);
}

/// As [`init`], and exports the broker's spans through `traces` when given.
pub fn init_traced(default_filter: &str, json: bool, traces: Option<&SdkTracerProvider>) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let lines = tracing_subscriber::fmt::layer()
        .with_target(false)
        // Colour codes only for people at a terminal, never into files or log collectors.
        .with_ansi(!json && std::io::stdout().is_terminal());
    let lines = if json {
        lines.json().flatten_event(true).boxed()
    } else {
        lines.boxed()
    };
    let spans = traces.map(|provider| {
        crate::observe::traces::layer(provider)
            .with_filter(Targets::new().with_target(env!("CARGO_CRATE_NAME"), tracing::Level::INFO))
    });
    let _ = tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(spans)
        .try_init();
}

/// One info line per outcome written: the call, its agent, the outcome and who decided. Never
/// its input or the reason's text.
pub fn outcomes_written<'a>(calls: impl IntoIterator<Item = &'a Call>) {
    for call in calls {
        let Some(outcome) = &call.outcome else {
            continue;
        };
        tracing::info!(
            call = %call.key.call_id,
            session = %call.key.session,
            agent = %call.key.agent,
            tool = %call.tool,
            outcome = crate::observe::meters::kind_label(outcome.kind),
            decided_by = %outcome.decided_by,
            "outcome"
        );
    }
}
