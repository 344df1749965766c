//! OpenTelemetry traces, exported over OTLP (gRPC) when an endpoint is configured, so one trace
//! shows a whole approval: the agent's request (continued from the W3C `traceparent` it sent),
//! the submit and its store write, the approver's decision and the outcome delivered back.
//!
//! Off by default, and then it costs nothing: no layer is installed, no header is read and no
//! context is kept ([`on`] is false). When on, the broker's own `tracing` spans become OTel
//! spans (only the broker's: the exporter's own tonic and hyper spans would trace themselves).
//!
//! A decision comes on another RPC, usually from another process (the approver's), so its span
//! cannot inherit the agent's trace. Each accepted call's span context is kept in memory
//! ([`CallTraces`]) until its outcome is delivered; the Decide's `decide` span and the outcome's
//! `deliver_outcome` spans are made children of it, and the `decide` span links to the
//! approver's RPC span. Kept in this process only: a decision taken on another replica, or after
//! a restart, starts its own trace (linked to nothing).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tonic::codegen::http;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::domain::{Call, CallKey};
use crate::error::{Error, Result};

/// Whether traces are exported (set once, by [`exporter`]).
static ON: AtomicBool = AtomicBool::new(false);

/// Whether traces are exported: everything here does nothing while this is false.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The OTLP endpoint to export to: `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`), else
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; none means traces are off. `OTEL_SDK_DISABLED=true`
/// turns them off whatever is set.
pub fn endpoint(configured: Option<&str>) -> Option<String> {
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    if disabled {
        return None;
    }
    configured
        .map(str::to_owned)
        .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").ok())
        .filter(|e| !e.trim().is_empty())
}

/// The exporting tracer provider for `endpoint`: spans are batched and sent over OTLP/gRPC.
/// The service is `approval-broker` unless `OTEL_SERVICE_NAME` (or `OTEL_RESOURCE_ATTRIBUTES`)
/// names it; the batch timings follow `OTEL_BSP_*`. Must be called inside the Tokio runtime.
pub fn exporter(endpoint: &str) -> Result<SdkTracerProvider> {
    let spans = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| Error::invalid("--otlp-endpoint", format!("{endpoint}: {e}")))?;
    let mut resource = Resource::builder();
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    if !named {
        resource = resource.with_service_name("approval-broker");
    }
    let resource = resource
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(spans)
        .with_resource(resource)
        .build();
    ON.store(true, Ordering::Relaxed);
    Ok(provider)
}

/// The layer that turns the broker's spans into OTel spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("approval-broker"))
        .with_level(false)
        .with_target(false)
}

/// `span()` while traces are on, else no span at all: for the spans only a trace shows (a store
/// write inside its request's span, which a log line already names). A span costs the logs'
/// layer a record, its fields formatted, and an entry and exit at every poll of what it
/// instruments, several times per call (docs/benchmarks-notes.md, "Spans the logs do not use").
pub fn when_on(span: impl FnOnce() -> Span) -> Span {
    if on() { span() } else { Span::none() }
}

/// The span of one RPC: its method (for the logs) and, for OTel, its name, kind and the
/// `rpc.*` attributes; its parent is the caller's `traceparent` when traces are on. Without
/// traces it is the method alone: the rest would be formatted for every request and never read.
pub fn rpc_span(request: &http::Request<()>) -> Span {
    let path = request.uri().path();
    if !on() {
        return tracing::info_span!("rpc", method = %path);
    }
    let (service, method) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path, ""));
    let span = tracing::info_span!(
        "rpc",
        method = %path,
        otel.name = %path,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = %service,
        rpc.method = %method,
    );
    if on() {
        let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
    span
}

/// gRPC metadata read as W3C trace context (`traceparent`, `tracestate`).
struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span of one accepted call, a child of the submit: the GenAI attributes of the tool call
/// it asks to run. Its context is kept ([`CallTraces`]) so the decision and the outcome join
/// it. Nothing happens while traces are off.
pub fn call_accepted(call: &Call) {
    if !on() {
        return;
    }
    let span = tracing::info_span!(
        "approval_requested",
        otel.name = %format_args!("approval_requested {}", call.tool),
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.tool,
        gen_ai.tool.call.id = %call.key.call_id,
        approvals.session = %call.key.session,
        approvals.agent = %call.key.agent,
    );
    CallTraces::global().keep(
        call.key.clone(),
        span.context().span().span_context().clone(),
    );
}

/// Joins `span` (a decision's, not yet entered) to the trace of the call it decides, and links
/// it to the RPC it runs in (the approver's trace). Nothing happens while traces are off or
/// when this process did not see the call submitted.
pub fn join_call(span: &Span, key: &CallKey) {
    if !on() {
        return;
    }
    let Some(call) = CallTraces::global().get(key) else {
        return;
    };
    let rpc = Span::current().context().span().span_context().clone();
    let _ = span.set_parent(Context::new().with_remote_span_context(call));
    if rpc.is_valid() {
        span.add_link(rpc);
    }
}

/// Records a decided call's tool and outcome on `span` (its `gen_ai.tool.name` and
/// `approvals.*` attributes), while traces are on.
pub fn record_outcome(span: &Span, call: &Call) {
    if !on() {
        return;
    }
    span.record("gen_ai.tool.name", tracing::field::display(&call.tool));
    let Some(outcome) = &call.outcome else {
        return;
    };
    span.record(
        "approvals.outcome",
        crate::observe::meters::kind_label(outcome.kind),
    );
    span.record(
        "approvals.decided_by",
        // Who decided, word for word as the API says it (`policy:<rule>`, `grant:<id>`, ...).
        tracing::field::display(&outcome.decided_by),
    );
}

/// A span for sending `call`'s outcome to its agent, a child of the call's span: the end of
/// the approval's trace. Disabled (and free) while traces are off or the call is unknown here.
pub fn outcome_delivery(call: &Call) -> Span {
    if !on() {
        return Span::none();
    }
    let Some(parent) = CallTraces::global().get(&call.key) else {
        return Span::none();
    };
    let span = tracing::info_span!(
        "deliver_outcome",
        gen_ai.tool.name = %call.tool,
        gen_ai.tool.call.id = %call.key.call_id,
        approvals.outcome = tracing::field::Empty,
        approvals.decided_by = tracing::field::Empty,
    );
    let _ = span.set_parent(Context::new().with_remote_span_context(parent));
    record_outcome(&span, call);
    span
}

/// The span contexts of the calls submitted to this process, newest [`KEPT`]: an outcome may
/// be delivered to several streams (`Connect`, `WatchOutcomes`), at any time after its
/// decision, so a context is kept until newer calls push it out.
pub struct CallTraces {
    kept: Mutex<(HashMap<CallKey, SpanContext>, VecDeque<CallKey>)>,
}

/// How many calls' contexts are kept at most.
const KEPT: usize = 50_000;

impl CallTraces {
    fn global() -> &'static CallTraces {
        static TRACES: OnceLock<CallTraces> = OnceLock::new();
        TRACES.get_or_init(|| CallTraces {
            kept: Mutex::new((HashMap::new(), VecDeque::new())),
        })
    }

    fn keep(&self, key: CallKey, context: SpanContext) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let (by_key, order) = &mut *kept;
        if by_key.insert(key.clone(), context).is_none() {
            order.push_back(key);
        }
        while order.len() > KEPT {
            if let Some(oldest) = order.pop_front() {
                by_key.remove(&oldest);
            }
        }
    }

    fn get(&self, key: &CallKey) -> Option<SpanContext> {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.0.get(key).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_only_a_trace_shows_is_not_even_made_while_traces_are_off() {
        assert!(!on(), "no test of this process exports traces");
        let span = when_on(|| panic!("made while traces are off"));
        assert!(span.is_none());
    }
}
