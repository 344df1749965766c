//! The broker's Prometheus metrics: every name and help text, and one function per thing
//! measured, so call sites say what happened and never spell a metric name.
//!
//! Recording goes through the `metrics` facade, a no-op until [`serve`] installs the Prometheus
//! recorder (the binary does; the in-process tests, which run many brokers in one process, do
//! not). Counters and histograms count what *this* broker process did, so a fleet's total is the
//! sum over its replicas; `approvals_pending_calls` is read from the store and is the same on
//! every replica.

use std::net::SocketAddr;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::PrometheusBuilder;

use crate::domain::policy::ShadowVerdict;
use crate::domain::{Call, DecidedBy, OutcomeKind};
use crate::error::{Error, Result};

const CALLS_SUBMITTED: &str = "approvals_calls_submitted_total";
const OUTCOMES: &str = "approvals_outcomes_total";
const DECISION_SECONDS: &str = "approvals_decision_seconds";
const PENDING: &str = "approvals_pending_calls";
const AGENT_STREAMS: &str = "approvals_agent_streams";
const SUBSCRIBERS: &str = "approvals_subscribers";
const SUBSCRIBER_LAG: &str = "approvals_subscriber_lag_events";
const COMMIT_SECONDS: &str = "approvals_store_commit_seconds";
const COMMIT_WRITES: &str = "approvals_store_commit_writes";
const CONNECTIONS_OPEN: &str = "approvals_connections_open";
const CONNECTIONS_REFUSED: &str = "approvals_connections_refused_total";
const CONNECTIONS_CLOSED: &str = "approvals_connections_closed_total";
const HEALTH_WATCHES: &str = "approvals_health_watches";
const REFLECTION_STREAMS: &str = "approvals_reflection_streams";
const SHADOW_VERDICTS: &str = "approvals_shadow_verdicts_total";
const PRUNED_CALLS: &str = "approvals_pruned_calls_total";
const PRUNED_EVENTS: &str = "approvals_pruned_events_total";
const RPC_REQUESTS: &str = "approvals_rpc_requests_total";
const RPC_SECONDS: &str = "approvals_rpc_seconds";
const BUILD_INFO: &str = "approvals_build_info";
const STORE_POOL: &str = "approvals_store_pool_connections";
const STORE_ERRORS: &str = "approvals_store_errors_total";

/// Installs the Prometheus recorder and serves its scrape endpoint (any path) on `address`.
/// Must run inside the Tokio runtime; fails if the address cannot be bound.
pub fn serve(address: SocketAddr) -> Result<()> {
    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(address)
        .set_buckets(&[
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0, 300.0, 900.0, 3600.0,
        ])
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(COMMIT_WRITES.into()),
                &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Full(SUBSCRIBER_LAG.into()),
                &[0.0, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0],
            )
        })
        .and_then(|b| b.build())
        .map_err(|e| {
            Error::invalid(
                "--metrics-listen",
                format!("cannot serve metrics on {address}: {e}"),
            )
        })?;
    metrics::set_global_recorder(recorder)
        .map_err(|e| Error::Internal(format!("metrics recorder: {e}")))?;
    tokio::spawn(async move {
        if let Err(e) = exporter.await {
            tracing::error!(error = ?e, "the metrics endpoint stopped");
        }
    });
    describe();
    build_info();
    tokio::spawn(sample_process());
    tracing::info!(%address, "serving Prometheus metrics");
    Ok(())
}

fn describe() {
    describe_counter!(CALLS_SUBMITTED, "Calls stored by submits to this broker.");
    describe_counter!(
        OUTCOMES,
        "Outcomes this broker wrote, by kind and by who decided (approver, grant, policy, agent, deadline, broker)."
    );
    describe_histogram!(
        DECISION_SECONDS,
        metrics::Unit::Seconds,
        "Time from a call's submit to its outcome, by who decided."
    );
    describe_gauge!(PENDING, "Calls waiting for a decision, in the whole store.");
    describe_gauge!(
        AGENT_STREAMS,
        "Open agent streams (Connect, WatchOutcomes)."
    );
    describe_gauge!(SUBSCRIBERS, "Open Subscribe streams.");
    describe_histogram!(
        SUBSCRIBER_LAG,
        "Events published but not yet sent to a subscriber, seen at each event it is sent."
    );
    describe_histogram!(
        COMMIT_SECONDS,
        metrics::Unit::Seconds,
        "Duration of a write transaction, from begin to the end of its commit."
    );
    describe_histogram!(
        COMMIT_WRITES,
        "Writes (submits, decisions, cancels) sharing one committed transaction."
    );
    describe_counter!(
        SHADOW_VERDICTS,
        "What rules in shadow would have done with the calls submitted to this broker, by rule and verdict (approve, deny, ask)."
    );
    describe_connections();
    describe_counter!(
        PRUNED_CALLS,
        "Decided calls this broker pruned past --retain-decided."
    );
    describe_counter!(
        PRUNED_EVENTS,
        "Events this broker pruned with the calls past --retain-decided."
    );
    describe_requests();
}

/// Retention deleted `calls` decided calls and `events` events.
pub fn pruned(calls: u64, events: u64) {
    counter!(PRUNED_CALLS).increment(calls);
    counter!(PRUNED_EVENTS).increment(events);
}

/// Shadow rules would have done this with calls just stored (see `policy::shadow_verdicts`).
pub fn shadow_verdicts(verdicts: &[ShadowVerdict]) {
    for v in verdicts {
        counter!(SHADOW_VERDICTS, "rule" => v.rule.to_string(), "verdict" => v.verdict.to_string())
            .increment(1);
    }
}

fn describe_requests() {
    describe_counter!(
        RPC_REQUESTS,
        "RPCs finished, by method and gRPC status code (a stream counts when it ends)."
    );
    describe_histogram!(
        RPC_SECONDS,
        metrics::Unit::Seconds,
        "RPC duration, from the request to its status (a stream's whole life), by method and code."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; its labels name the running build (version, git commit)."
    );
    describe_gauge!(
        STORE_POOL,
        "The store's read pool (Postgres: its only pool), by state: open, idle."
    );
    describe_counter!(
        STORE_ERRORS,
        "Store operations that failed in the storage itself, by fault: full, unavailable, corrupt, other."
    );
}

/// An RPC finished with `code` after `took` (see `grpc::observed` for when a stream finishes).
pub fn rpc_finished(method: &'static str, code: &'static str, took: Duration) {
    counter!(RPC_REQUESTS, "method" => method, "code" => code).increment(1);
    histogram!(RPC_SECONDS, "method" => method, "code" => code).record(took.as_secs_f64());
}

/// The build running: its version and, when it was built from a git checkout (or
/// `APPROVALS_GIT_COMMIT` was set at build time), its commit.
fn build_info() {
    let commit = option_env!("APPROVALS_GIT_COMMIT").unwrap_or("unknown");
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION"), "git_commit" => commit).set(1.0);
}

/// Keeps the process metrics current (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, `process_threads`, `process_start_time_seconds`...).
async fn sample_process() {
    const EVERY: Duration = Duration::from_secs(2);
    let collector = metrics_process::Collector::default();
    collector.describe();
    loop {
        collector.collect();
        tokio::time::sleep(EVERY).await;
    }
}

/// The store's pool has `open` connections, `idle` of them idle.
pub fn store_pool(open: u32, idle: usize) {
    gauge!(STORE_POOL, "state" => "open").set(f64::from(open));
    gauge!(STORE_POOL, "state" => "idle").set(idle as f64);
}

/// A store operation failed in the storage itself.
pub fn store_error(fault: &'static str) {
    counter!(STORE_ERRORS, "fault" => fault).increment(1);
}

/// `n` new calls were stored.
pub fn calls_submitted(n: usize) {
    counter!(CALLS_SUBMITTED).increment(n as u64);
}

/// These calls were decided by this broker (each must carry its outcome).
pub fn outcomes<'a>(calls: impl IntoIterator<Item = &'a Call>) {
    for call in calls {
        let Some(outcome) = &call.outcome else {
            continue;
        };
        let by = decider_class(&outcome.decided_by);
        let kind = kind_label(outcome.kind);
        counter!(OUTCOMES, "kind" => kind, "decided_by" => by).increment(1);
        let waited = outcome.decided_at.as_micros() - call.created_at.as_micros();
        histogram!(DECISION_SECONDS, "decided_by" => by).record(waited.max(0) as f64 / 1e6);
    }
}

pub(crate) fn kind_label(kind: OutcomeKind) -> &'static str {
    match kind {
        OutcomeKind::Approved => "approved",
        OutcomeKind::Denied => "denied",
        OutcomeKind::Superseded => "superseded",
        OutcomeKind::Skipped => "skipped",
        OutcomeKind::Expired => "expired",
        OutcomeKind::Cancelled => "cancelled",
    }
}

/// The label for who decided: a class, never an identity (labels must stay few).
fn decider_class(by: &DecidedBy) -> &'static str {
    match by {
        DecidedBy::Approver(_) => "approver",
        DecidedBy::Agent => "agent",
        DecidedBy::Deadline => "deadline",
        DecidedBy::Broker => "broker",
        DecidedBy::Grant(_) => "grant",
        DecidedBy::Policy(_) => "policy",
    }
}

pub fn pending_calls(n: u64) {
    gauge!(PENDING).set(n as f64);
}

/// Which open-stream gauge a stream counts in.
#[derive(Debug, Clone, Copy)]
pub enum StreamKind {
    Agent,
    Subscriber,
    HealthWatch,
    Reflection,
}

pub fn streams_open(kind: StreamKind, open: usize) {
    let name = match kind {
        StreamKind::Agent => AGENT_STREAMS,
        StreamKind::Subscriber => SUBSCRIBERS,
        StreamKind::HealthWatch => HEALTH_WATCHES,
        StreamKind::Reflection => REFLECTION_STREAMS,
    };
    gauge!(name).set(open as f64);
}

/// A subscriber was sent an event `behind` events after the newest published one.
pub fn subscriber_lag(behind: u64) {
    histogram!(SUBSCRIBER_LAG).record(behind as f64);
}

/// A write transaction of `writes` writes committed after `took`.
pub fn committed(writes: usize, took: Duration) {
    histogram!(COMMIT_SECONDS).record(took.as_secs_f64());
    histogram!(COMMIT_WRITES).record(writes as f64);
}

fn describe_connections() {
    describe_gauge!(
        CONNECTIONS_OPEN,
        "Open client connections, handshakes included (at most --max-connections)."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Client connections closed at once because --max-connections were open."
    );
    describe_counter!(
        CONNECTIONS_CLOSED,
        "Client connections the broker closed, by reason: handshake_timeout, ping_flood, settings_flood."
    );
    describe_gauge!(HEALTH_WATCHES, "Open Health/Watch streams.");
    describe_gauge!(REFLECTION_STREAMS, "Open server reflection streams.");
}

pub fn connections_open(open: usize) {
    gauge!(CONNECTIONS_OPEN).set(open as f64);
}

/// A connection was closed at once: --max-connections were open.
pub fn connection_refused() {
    counter!(CONNECTIONS_REFUSED).increment(1);
}

/// The broker closed a client connection, for `reason`.
pub fn connection_closed(reason: &'static str) {
    counter!(CONNECTIONS_CLOSED, "reason" => reason).increment(1);
}
