//! Measures webhook delivery latency: from a call's event committed to its webhook received by
//! a receiver on loopback. Starts the broker in-process on a fresh SQLite file (or the database
//! `DATABASE_URL` names), registers one CloudEvents endpoint, then submits N calls one at a
//! time, each after the previous one's webhook arrived, and prints the median and p99. Nothing
//! here is asserted: it is a measurement, run by hand.
//!
//! The commit happens between the moment Submit is sent and the moment its reply arrives, so
//! each sample is bracketed: `upper` counts from the send (latency plus the submit's way in),
//! `lower` from the reply (latency minus the reply's way back, 0 when the webhook wins).
//!
//! `cargo run --release --example webhook_latency [N]` (N defaults to 1,000).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use approval_broker::config::Config;
use approval_broker::proto::v1 as pb;
use approval_broker::startup;

#[tokio::main]
async fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("N is a number"))
        .unwrap_or(1000);

    // The receiver: reports each event's subject and the instant it arrived.
    let (arrived, mut arrivals) = mpsc::unbounded_channel::<(String, Instant)>();
    let receiver = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let receiver_address = receiver.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (stream, _) = receiver.accept().await.unwrap();
            let arrived = arrived.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let arrived = arrived.clone();
                    async move {
                        let body = request.into_body().collect().await?.to_bytes();
                        let at = Instant::now();
                        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        if event["type"] == "approvals.v1.call.requested" {
                            let _ = arrived.send((event["subject"].as_str().unwrap().into(), at));
                        }
                        Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::new())))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });

    let dir = tempfile::tempdir().unwrap();
    let database = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| format!("sqlite://{}", dir.path().join("approvals.db").display()));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut config = Config::for_tests(database.clone());
    config.telemetry.metrics_listen = approval_broker::config::MetricsListen::Off;
    // The receiver is on loopback, which webhooks may reach only when allowed.
    config.webhooks.webhook_allow_hosts = vec!["127.0.0.1".parse().unwrap()];
    tokio::spawn(startup::run(listener, config, std::future::pending()));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_lazy();
    let mut admin = pb::admin_service_client::AdminServiceClient::new(channel.clone());
    let mut agent = pb::agent_service_client::AgentServiceClient::new(channel);
    let hook = pb::CreateWebhookRequest {
        id: "latency".into(),
        url: format!("http://{receiver_address}/"),
        filter: Some(pb::WebhookFilter {
            event_kinds: vec![pb::WebhookEventKind::Requested as i32],
            ..Default::default()
        }),
        ..Default::default()
    };
    for attempt in 0.. {
        match admin.create_webhook(hook.clone()).await {
            Ok(_) => break,
            Err(_) if attempt < 200 => tokio::time::sleep(Duration::from_millis(25)).await,
            Err(e) => panic!("the broker did not start: {e}"),
        }
    }

    let session = format!("latency-{}", std::process::id());
    let (mut upper, mut lower, mut submits) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let call_id = format!("c{i}");
        let batch = pb::BatchSpec {
            session_id: session.clone(),
            calls: vec![pb::CallSpec {
                call_id: call_id.clone(),
                tool: "shell".into(),
                input_json: r#"{"cmd":"ls"}"#.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let sent = Instant::now();
        agent
            .submit(pb::SubmitRequest { batch: Some(batch) })
            .await
            .expect("submit");
        let acked = Instant::now();
        let subject = format!("default/{session}/{call_id}");
        let at = loop {
            let (got, at) = arrivals.recv().await.expect("the receiver runs");
            if got == subject {
                break at;
            }
        };
        upper.push(at - sent);
        lower.push(at.checked_duration_since(acked).unwrap_or_default());
        submits.push(acked - sent);
    }
    let backend = if database.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    println!("webhook delivery latency, {n} events, {backend}, receiver on loopback");
    print(
        "committed -> received (upper: from Submit sent)",
        &mut upper,
    );
    print(
        "committed -> received (lower: from Submit acked)",
        &mut lower,
    );
    print("Submit round trip", &mut submits);
}

fn print(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    println!(
        "{what}: median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3,
    );
}
