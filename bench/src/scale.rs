//! `approval-bench --scale`: what a large store costs. The same four requests are timed on a
//! nearly empty store and again after the broker has stored `--scale-decided` decided and
//! `--scale-pending` pending calls (through its own API: 128-call batches, decided by cancelling
//! their sessions), and their ratio printed. Then the memory of idle streams: `--idle-streams`
//! agent `Connect` streams and `--idle-subscribers` subscribers, each of which has been answered,
//! and the broker's resident memory with all of them open.
//!
//! The four requests, each the median of many:
//! - the first page of `ListPending` (100 calls);
//! - the start of a `Subscribe` snapshot: until its first pending call arrives;
//! - `GetOutcomes` for 128 ids of one session;
//! - a `Decide` of a pending call.

use std::time::{Duration, Instant};

use approval_broker::proto::v1 as pb;
use pb::agent_service_client::AgentServiceClient;
use pb::approver_service_client::ApproverServiceClient;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use crate::broker::{self, connect};
use crate::stats::ms;

/// Calls per submitted batch while filling the store (the broker's maximum).
const FILL_BATCH: usize = approval_broker::domain::MAX_BATCH_CALLS;
/// Concurrent writers while filling.
const FILL_WRITERS: usize = 8;
/// Pending calls of the probe session, stored before the first measurement; each `Decide`
/// sample decides one of them.
pub const PROBE_CALLS: usize = 1024;
/// Samples per request kind and store size.
const SAMPLES: usize = 200;

pub struct ScaleConfig {
    pub decided: u64,
    pub pending: u64,
    pub idle_streams: u32,
    pub idle_subscribers: u32,
    pub input_bytes: usize,
}

/// Medians in microseconds of each request kind.
#[derive(Debug, Clone, Copy)]
struct Costs {
    list_pending: u64,
    subscribe_start: u64,
    get_outcomes: u64,
    decide: u64,
}

impl Costs {
    fn rows(&self) -> [(&'static str, u64); 4] {
        [
            ("ListPending first page", self.list_pending),
            ("Subscribe snapshot start", self.subscribe_start),
            ("GetOutcomes 128 ids", self.get_outcomes),
            ("Decide", self.decide),
        ]
    }
}

pub async fn run(
    config: &ScaleConfig,
    address: &str,
    pid: Option<String>,
) -> Result<serde_json::Value, String> {
    let channel = connect(address).await?;
    println!("approval-bench --scale: {address}");

    // A probe session: its calls are looked up and decided in both measurements.
    fill_session(&channel, "probe-empty", PROBE_CALLS, config.input_bytes).await?;
    let empty = measure(&channel, "probe-empty").await?;

    let started = Instant::now();
    fill(&channel, config).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    println!(
        "stored {} decided and {} pending calls through the API in {fill_seconds:.1} s",
        config.decided, config.pending
    );
    fill_session(&channel, "probe-full", PROBE_CALLS, config.input_bytes).await?;
    let full = measure(&channel, "probe-full").await?;

    println!();
    println!(
        "{:<26} {:>12} {:>16} {:>7}",
        "median of 200", "empty store", "full store", "ratio"
    );
    let mut rows = serde_json::Map::new();
    for ((name, e), (_, f)) in empty.rows().into_iter().zip(full.rows()) {
        let ratio = f as f64 / e.max(1) as f64;
        println!("{name:<26} {:>12} {:>16} {ratio:>6.2}x", ms(e), ms(f));
        rows.insert(
            name.into(),
            serde_json::json!({"empty_us": e, "full_us": f, "ratio": ratio}),
        );
    }

    let memory = idle_streams(address, config, pid.as_deref()).await?;
    Ok(serde_json::json!({
        "decided": config.decided,
        "pending": config.pending,
        "fill_seconds": fill_seconds,
        "requests": rows,
        "idle": memory,
    }))
}

fn spec(session: &str, first: usize, count: usize, input_bytes: usize) -> pb::BatchSpec {
    pb::BatchSpec {
        session_id: session.into(),
        calls: (first..first + count)
            .map(|i| pb::CallSpec {
                call_id: format!("c{i}"),
                tool: "edit_file".into(),
                input_json: crate::load::tool_input(0, i as u64, input_bytes),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

async fn fill_session(
    channel: &Channel,
    session: &str,
    calls: usize,
    input_bytes: usize,
) -> Result<(), String> {
    let mut agent = AgentServiceClient::new(channel.clone());
    for first in (0..calls).step_by(FILL_BATCH) {
        let batch = spec(session, first, FILL_BATCH.min(calls - first), input_bytes);
        agent
            .submit(pb::SubmitRequest { batch: Some(batch) })
            .await
            .map_err(|e| format!("fill {session}: {e}"))?;
    }
    Ok(())
}

/// Stores `decided` calls (in sessions cancelled once full) and `pending` ones, from
/// [`FILL_WRITERS`] writers at once.
async fn fill(channel: &Channel, config: &ScaleConfig) -> Result<(), String> {
    let batches = |calls: u64| calls.div_ceil(FILL_BATCH as u64);
    let decided_batches = batches(config.decided);
    let pending_batches = batches(config.pending);
    let total = decided_batches + pending_batches;
    let mut writers = JoinSet::new();
    for w in 0..FILL_WRITERS as u64 {
        let channel = channel.clone();
        let input_bytes = config.input_bytes;
        let decided = config.decided;
        let pending = config.pending;
        writers.spawn(async move {
            let mut agent = AgentServiceClient::new(channel);
            for b in (w..total).step_by(FILL_WRITERS) {
                let (session, first, left) = if b < decided_batches {
                    ("decided", b * FILL_BATCH as u64, decided)
                } else {
                    let b = b - decided_batches;
                    ("pending", b * FILL_BATCH as u64, pending)
                };
                let count = (FILL_BATCH as u64).min(left - first) as usize;
                let session = format!("fill-{session}-{b}");
                agent
                    .submit(pb::SubmitRequest {
                        batch: Some(spec(&session, 0, count, input_bytes)),
                    })
                    .await
                    .map_err(|e| format!("fill: submit: {e}"))?;
                if b < decided_batches {
                    agent
                        .cancel(pb::CancelRequest {
                            target: Some(pb::CancelTarget {
                                session_id: session,
                                target: Some(pb::cancel_target::Target::WholeSession(true)),
                                reason: "scale fill".into(),
                            }),
                        })
                        .await
                        .map_err(|e| format!("fill: cancel: {e}"))?;
                }
            }
            Ok::<(), String>(())
        });
    }
    while let Some(joined) = writers.join_next().await {
        joined.map_err(|e| format!("fill: {e}"))??;
    }
    Ok(())
}

async fn measure(channel: &Channel, probe: &str) -> Result<Costs, String> {
    let mut approver = ApproverServiceClient::new(channel.clone());
    let agent = AgentServiceClient::new(channel.clone());

    let list_pending = median(SAMPLES, || {
        let mut approver = approver.clone();
        async move {
            let page = approver
                .list_pending(pb::ListPendingRequest {
                    filter: None,
                    page_size: 100,
                    page_token: String::new(),
                })
                .await
                .map_err(|e| format!("ListPending: {e}"))?;
            if page.into_inner().calls.len() != 100 {
                return Err("ListPending: a short first page".into());
            }
            Ok(())
        }
    })
    .await?;

    let subscribe_start = median(SAMPLES, || {
        let mut approver = approver.clone();
        async move {
            let mut stream = approver
                .subscribe(pb::SubscribeRequest {
                    filter: None,
                    after_seq: None,
                })
                .await
                .map_err(|e| format!("Subscribe: {e}"))?
                .into_inner();
            match stream.message().await {
                Ok(Some(pb::ApproverEvent {
                    event: Some(pb::approver_event::Event::Snapshot(_)),
                    ..
                })) => Ok(()),
                other => Err(format!(
                    "Subscribe: expected a snapshot call, got {other:?}"
                )),
            }
        }
    })
    .await?;

    let ids: Vec<String> = (0..128).map(|i| format!("c{}", i * 7)).collect();
    let get_outcomes = median(SAMPLES, || {
        let mut agent = agent.clone();
        let request = pb::GetOutcomesRequest {
            session_id: probe.into(),
            call_ids: ids.clone(),
        };
        async move {
            let calls = agent
                .get_outcomes(request)
                .await
                .map_err(|e| format!("GetOutcomes: {e}"))?;
            if calls.into_inner().calls.len() != 128 {
                return Err("GetOutcomes: not 128 answers".into());
            }
            Ok(())
        }
    })
    .await?;

    let mut next = 0..PROBE_CALLS;
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let i = next.next().ok_or("out of probe calls")?;
        let request = pb::DecideRequest {
            session_id: probe.into(),
            call_id: format!("c{i}"),
            decision: pb::Decision::Approve as i32,
            approver: "bench".into(),
            ..Default::default()
        };
        let started = Instant::now();
        approver
            .decide(request)
            .await
            .map_err(|e| format!("Decide: {e}"))?;
        samples.push(started.elapsed());
    }
    let decide = median_of(&mut samples);
    Ok(Costs {
        list_pending,
        subscribe_start,
        get_outcomes,
        decide,
    })
}

/// The median duration, in microseconds, of `n` sequential runs of `request`.
async fn median<F, Fut>(n: usize, mut request: F) -> Result<u64, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        request().await?;
        samples.push(started.elapsed());
    }
    Ok(median_of(&mut samples))
}

fn median_of(samples: &mut [Duration]) -> u64 {
    samples.sort();
    samples[samples.len() / 2].as_micros() as u64
}

/// Opens the idle streams, each answered once, and reads the broker's resident memory.
async fn idle_streams(
    address: &str,
    config: &ScaleConfig,
    pid: Option<&str>,
) -> Result<serde_json::Value, String> {
    // Well under the broker's per-connection stream limit (--max-concurrent-streams, 1,024).
    const STREAMS_PER_CONNECTION: u32 = 500;
    let connections = config.idle_streams.div_ceil(STREAMS_PER_CONNECTION).max(1);
    let channels = crate::load::channels(address, connections).await?;
    let rss_before = pid.and_then(broker::rss_kib);
    let started = Instant::now();
    let mut held = Vec::with_capacity(config.idle_streams as usize);
    let mut opening = JoinSet::new();
    for i in 0..config.idle_streams {
        let channel = channels[(i % connections) as usize].clone();
        opening.spawn(async move {
            let (requests, rx) = tokio::sync::mpsc::channel(1);
            let mut agent = AgentServiceClient::new(channel);
            let mut stream = agent
                .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(|e| format!("Connect: {e}"))?
                .into_inner();
            // A resume of an empty session: answered, so the stream is surely served.
            requests
                .send(pb::AgentRequest {
                    request_id: "resume".into(),
                    request: Some(pb::agent_request::Request::Resume(pb::ResumeRequest {
                        session_id: format!("idle-{i}"),
                        call_ids: Vec::new(),
                    })),
                })
                .await
                .map_err(|_| "Connect: the stream closed".to_string())?;
            loop {
                match stream.message().await {
                    Ok(Some(pb::AgentResponse {
                        response: Some(pb::agent_response::Response::Resumed(_)),
                        ..
                    })) => break,
                    Ok(Some(_)) => continue,
                    other => return Err(format!("Connect: no resume answer: {other:?}")),
                }
            }
            Ok::<_, String>((requests, stream))
        });
        // Bounded concurrency while opening, so the client does not flood one connection.
        if opening.len() >= 256 {
            held.push(
                opening
                    .join_next()
                    .await
                    .expect("a task")
                    .map_err(|e| e.to_string())??,
            );
        }
    }
    while let Some(joined) = opening.join_next().await {
        held.push(joined.map_err(|e| e.to_string())??);
    }
    let mut subscribers = Vec::new();
    for i in 0..config.idle_subscribers {
        let mut approver = ApproverServiceClient::new(channels[(i % connections) as usize].clone());
        // A live subscription (no snapshot): answered at once, then idle.
        let stream = approver
            .subscribe(pb::SubscribeRequest {
                filter: Some(pb::CallFilter {
                    session_id: "nobody".into(),
                    ..Default::default()
                }),
                after_seq: None,
            })
            .await
            .map_err(|e| format!("Subscribe: {e}"))?
            .into_inner();
        subscribers.push(stream);
    }
    // Let the broker settle, then read its memory with everything open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = pid.and_then(broker::rss_kib);
    let peak = pid.and_then(broker::peak_rss_kib);
    println!();
    println!(
        "{} idle agent streams and {} subscribers open in {:.1} s on {connections} connections",
        held.len(),
        subscribers.len(),
        started.elapsed().as_secs_f64()
    );
    match (rss_before, rss, peak) {
        (Some(before), Some(rss), Some(peak)) => println!(
            "broker resident memory: {} MiB before, {} MiB with them open (peak {} MiB)",
            before / 1024,
            rss / 1024,
            peak / 1024
        ),
        _ => println!("broker resident memory: unknown (not started here)"),
    }
    Ok(serde_json::json!({
        "agent_streams": held.len(),
        "subscribers": subscribers.len(),
        "rss_before_kib": rss_before,
        "rss_kib": rss,
        "peak_rss_kib": peak,
    }))
}
