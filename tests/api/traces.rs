//! One trace shows a whole approval: the broker exports over OTLP to a collector (here, one in
//! this process on port 0), continuing the agent's W3C `traceparent` through the submit, its
//! store write, the approver's decision and the outcome delivered back, with the GenAI and
//! `approvals.*` attributes. Runs the real binary: the tracer is global to a process.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use approval_broker::proto::v1 as pb;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use pb::agent_service_client::AgentServiceClient;
use pb::approver_service_client::ApproverServiceClient;
use tonic::metadata::MetadataValue;

use crate::helpers::*;

/// What the collector received: each span with its resource's `service.name`.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

struct Collector {
    received: Received,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = self.received.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| text(&r.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    received.push((service.clone(), span));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// An OTLP/gRPC collector on a free port: its endpoint and what it receives.
async fn start_collector() -> (String, Received) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    let received = Received::default();
    let collector = Collector {
        received: Arc::clone(&received),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (endpoint, received)
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.as_ref())
        .and_then(|v| match v {
            Value::StringValue(s) => Some(s.clone()),
            _ => None,
        })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The one span named `name`, waiting for the exporter's batches until it has come.
async fn span_named(received: &Received, name: &str) -> (String, Span) {
    let started = Instant::now();
    loop {
        let found: Vec<_> = received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, span)| span.name == name)
            .cloned()
            .collect();
        match found.len() {
            1 => return found.into_iter().next().expect("one"),
            0 if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            _ => panic!(
                "{} spans named {name}: {:#?}",
                found.len(),
                received.lock().unwrap()
            ),
        }
    }
}

fn with_traceparent<T>(message: T, traceparent: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "traceparent",
        MetadataValue::try_from(traceparent).expect("header"),
    );
    request
}

const AGENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const AGENT_SPAN: &str = "00f067aa0ba902b7";
const APPROVER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const APPROVER_SPAN: &str = "b7ad6b7169203331";

async fn one_trace_follows_a_call_from_the_agents_traceparent_to_its_outcome(mut app: TestApp) {
    app.shut_down().await;
    let (endpoint, received) = start_collector().await;
    let broker = start_broker(
        &app.database_url,
        &["--otlp-endpoint", &endpoint],
        &[
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
            ("OTEL_SERVICE_NAME", "broker-under-test"),
        ],
    )
    .await;
    let mut agent = AgentServiceClient::new(broker.channel());
    let secret_input = r#"{"command":"echo very-secret-input"}"#;
    agent
        .submit(with_traceparent(
            pb::SubmitRequest {
                batch: Some(batch(
                    "traced",
                    vec![call("call-1", "run_shell", secret_input)],
                )),
            },
            &format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01"),
        ))
        .await
        .expect("submit");
    let mut outcomes = agent
        .watch_outcomes(pb::WatchOutcomesRequest {
            session_id: "traced".into(),
            call_ids: vec!["call-1".into()],
        })
        .await
        .expect("watch")
        .into_inner();
    // Decided once the watch is live, so the outcome is delivered as it happens.
    let caught_up = outcomes.message().await.expect("healthy").expect("open");
    assert!(matches!(
        caught_up.event,
        Some(pb::watch_outcomes_response::Event::CaughtUp(_))
    ));
    ApproverServiceClient::new(broker.channel())
        .decide(with_traceparent(
            decide_request("traced", "call-1", pb::Decision::Approve, ""),
            &format!("00-{APPROVER_TRACE}-{APPROVER_SPAN}-01"),
        ))
        .await
        .expect("decide");
    let delivered = outcomes.message().await.expect("healthy").expect("open");
    assert!(
        matches!(
            delivered.event,
            Some(pb::watch_outcomes_response::Event::Outcome(_))
        ),
        "{delivered:?}"
    );

    // The agent's request: a server span continuing the agent's trace, under its span.
    let (service, rpc) = span_named(&received, "/approvals.v1.AgentService/Submit").await;
    assert_eq!(service, "broker-under-test");
    assert_eq!(hex(&rpc.trace_id), AGENT_TRACE);
    assert_eq!(hex(&rpc.parent_span_id), AGENT_SPAN);
    assert_eq!(rpc.kind, SpanKind::Server as i32);
    assert_eq!(text(&rpc.attributes, "rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        text(&rpc.attributes, "rpc.method").as_deref(),
        Some("Submit")
    );
    let child_of = |span: &Span, parent: &Span| {
        assert_eq!(hex(&span.trace_id), AGENT_TRACE, "{span:#?}");
        assert_eq!(
            span.parent_span_id, parent.span_id,
            "{span:#?} under {parent:#?}"
        );
    };
    let (_, submit) = span_named(&received, "submit").await;
    child_of(&submit, &rpc);
    let (_, stored) = span_named(&received, "store.submit").await;
    child_of(&stored, &submit);
    let (_, requested) = span_named(&received, "approval_requested run_shell").await;
    child_of(&requested, &submit);
    assert_eq!(
        text(&requested.attributes, "gen_ai.tool.name").as_deref(),
        Some("run_shell")
    );
    assert_eq!(
        text(&requested.attributes, "gen_ai.tool.call.id").as_deref(),
        Some("call-1")
    );

    // The approver's decision joins the call's trace, and links to the approver's own.
    let (_, decide) = span_named(&received, "decide").await;
    child_of(&decide, &requested);
    let (_, stored) = span_named(&received, "store.decide").await;
    child_of(&stored, &decide);
    assert_eq!(
        text(&decide.attributes, "approvals.outcome").as_deref(),
        Some("approved")
    );
    assert_eq!(
        text(&decide.attributes, "approvals.decided_by").as_deref(),
        Some("approver:alice@example.com")
    );
    assert_eq!(
        text(&decide.attributes, "gen_ai.tool.name").as_deref(),
        Some("run_shell")
    );
    let (_, decide_rpc) = span_named(&received, "/approvals.v1.ApproverService/Decide").await;
    assert_eq!(hex(&decide_rpc.trace_id), APPROVER_TRACE);
    assert_eq!(hex(&decide_rpc.parent_span_id), APPROVER_SPAN);
    assert!(
        decide
            .links
            .iter()
            .any(|l| l.trace_id == decide_rpc.trace_id && l.span_id == decide_rpc.span_id),
        "{decide:#?}"
    );
    let (_, decided) = span_named(&received, "store.decide").await;
    child_of(&decided, &decide);

    // The outcome delivered back ends the same trace.
    let (_, delivery) = span_named(&received, "deliver_outcome").await;
    child_of(&delivery, &requested);
    assert_eq!(
        text(&delivery.attributes, "approvals.outcome").as_deref(),
        Some("approved")
    );

    // No span carries the tool's input.
    let everything = format!("{:?}", received.lock().unwrap());
    assert!(!everything.contains("very-secret-input"), "{everything}");
}

backend_tests! {
    one_trace_follows_a_call_from_the_agents_traceparent_to_its_outcome,
}
