//! The load: agents submitting batches over `Connect`, subscribers watching `Subscribe`, and
//! approvers approving what their subscription shows. Every call is identified by a `u64` key
//! (agent index and sequence number) parsed back from its call id, so the shared maps stay cheap.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use approval_broker::proto::v1::{
    AgentRequest, AgentResponse, AnyInput, ApproverEvent, BatchSpec, CallSpec, CallStatus,
    DecideRequest, Decision, InputMatcher, Scope, SubscribeRequest, agent_request, agent_response,
    agent_service_client::AgentServiceClient, approver_event,
    approver_service_client::ApproverServiceClient, call_ack, input_matcher,
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::broker::connect;

pub struct LoadConfig {
    pub batch_size: u32,
    pub approver_concurrency: u32,
    pub rate: Option<f64>,
    pub input_bytes: usize,
    /// Unique to this run: the prefix of every session id, so a shared broker's other calls
    /// are ignored.
    pub run_id: String,
    /// When agents start measuring, and when they stop submitting.
    pub measure_start: Instant,
    pub measure_end: Instant,
    /// How long an agent waits for a batch's outcomes before giving up on it.
    pub patience: Duration,
    /// What approves the calls at submit, if not the approvers.
    pub auto: Option<AutoApprove>,
}

/// What approves every call at submit, with no approver in the loop (`--auto-approve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AutoApprove {
    /// A policy rule allowing the bench's tool, created before the agents start.
    Rule,
    /// A session grant: each agent's first call is approved by a person, remembered for the
    /// session for every input, before the agent starts measuring.
    Grant,
}

impl AutoApprove {
    pub fn name(self) -> &'static str {
        match self {
            AutoApprove::Rule => "a policy rule",
            AutoApprove::Grant => "a session grant",
        }
    }
}

/// One submitted call as its agent saw it.
#[derive(Debug, Clone, Copy)]
pub struct CallRecord {
    pub key: u64,
    pub submitted: Instant,
    pub acked: Option<Instant>,
    pub outcome: Option<Instant>,
    pub approved: bool,
}

/// What subscribers and approvers record, shared by every task.
#[derive(Default)]
pub struct Shared {
    /// The first time any subscriber saw each call (requested or snapshot).
    pub seen: Mutex<HashMap<u64, Instant>>,
    /// When an approver sent the decision for each call.
    pub decided: Mutex<HashMap<u64, Instant>>,
    /// Calls of this run each subscriber was shown, by subscriber.
    pub shown: Vec<AtomicU64>,
    pub decide_ok: AtomicU64,
    pub decide_errors: AtomicU64,
    pub first_error: Mutex<Option<String>>,
    pub resubscribes: AtomicU64,
    pub agent_errors: AtomicU64,
    next_slot: Mutex<Option<Instant>>,
}

impl Shared {
    pub fn new(subscribers: u32) -> Shared {
        Shared {
            shown: (0..subscribers).map(|_| AtomicU64::new(0)).collect(),
            ..Shared::default()
        }
    }

    fn error(&self, message: String) {
        let mut first = self.first_error.lock().unwrap();
        if first.is_none() {
            *first = Some(message);
        }
    }
}

/// Key of `call_id` `"{agent}-{n}"` in a session of this run.
fn key_of(run_id: &str, session: &str, call_id: &str) -> Option<u64> {
    session.strip_prefix(run_id)?;
    let (agent, n) = call_id.split_once('-')?;
    Some((agent.parse::<u64>().ok()? << 40) | n.parse::<u64>().ok()?)
}

/// A realistic tool input of about `bytes` bytes: an edit of a source file.
pub fn tool_input(agent: u32, n: u64, bytes: usize) -> String {
    let mut input = serde_json::json!({
        "path": format!("src/services/agent_{agent}/handlers/request_{n}.rs"),
        "old_string": "fn handle(request: &Request) -> Result<Response> {\n    let user = request.user()?;\n",
        "new_string": "",
        "replace_all": false,
        "description": "Check the caller's permissions before handling the request.",
    });
    let base = input.to_string().len();
    let filler = "    if !user.can(Permission::Write) {\n        return Err(Error::Forbidden(user.id()));\n    }\n";
    // JSON escapes each `\n` as two bytes.
    let escaped = |text: &str| text.len() + text.matches('\n').count();
    let mut new_string = String::with_capacity(bytes);
    while base + escaped(&new_string) + escaped(filler) <= bytes {
        new_string.push_str(filler);
    }
    // Pad the rest with plain text.
    let rest = bytes.saturating_sub(base + escaped(&new_string));
    new_string.push_str(&"x".repeat(rest));
    input["new_string"] = serde_json::Value::String(new_string);
    input.to_string()
}

/// Runs one agent until `measure_end`, then waits for its last batch. Returns what it saw.
pub async fn agent(
    config: Arc<LoadConfig>,
    shared: Arc<Shared>,
    index: u32,
    channel: Channel,
) -> Vec<CallRecord> {
    let mut records = Vec::new();
    let session = format!("{}-agent-{index}", config.run_id);
    let (tx, rx) = mpsc::channel::<AgentRequest>(4);
    let mut client = AgentServiceClient::new(channel.clone()).max_decoding_message_size(64 << 20);
    let mut stream = match client.connect(ReceiverStream::new(rx)).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            shared.agent_errors.fetch_add(1, Ordering::Relaxed);
            shared.error(format!("agent {index}: Connect: {status}"));
            return records;
        }
    };
    if config.auto == Some(AutoApprove::Grant)
        && let Err(e) = grant_session(index, &session, &tx, &mut stream, channel).await
    {
        shared.agent_errors.fetch_add(1, Ordering::Relaxed);
        shared.error(format!("agent {index}: granting its session: {e}"));
        return records;
    }
    let interval = config
        .rate
        .map(|rate| Duration::from_secs_f64(f64::from(config.batch_size) / rate));
    let mut n: u64 = 0;
    let mut batch_no: u64 = 0;
    loop {
        if let Some(interval) = interval {
            let slot = {
                let mut next = shared.next_slot.lock().unwrap();
                let now = Instant::now();
                let slot = next.map_or(now, |next| next.max(now));
                *next = Some(slot + interval);
                slot
            };
            if slot >= config.measure_end {
                break;
            }
            tokio::time::sleep_until(slot.into()).await;
        }
        if Instant::now() >= config.measure_end {
            break;
        }
        let first = records.len();
        let mut calls = Vec::with_capacity(config.batch_size as usize);
        for _ in 0..config.batch_size {
            calls.push(CallSpec {
                call_id: format!("{index}-{n}"),
                tool: "edit_file".into(),
                input_json: tool_input(index, n, config.input_bytes),
                title: "Edit a file".into(),
                workspace: "bench".into(),
                ..CallSpec::default()
            });
            n += 1;
        }
        let request = AgentRequest {
            request_id: format!("b{batch_no}"),
            request: Some(agent_request::Request::Submit(BatchSpec {
                session_id: session.clone(),
                calls,
                ..BatchSpec::default()
            })),
        };
        batch_no += 1;
        let submitted = Instant::now();
        for i in 0..u64::from(config.batch_size) {
            records.push(CallRecord {
                key: (u64::from(index) << 40) | (n - u64::from(config.batch_size) + i),
                submitted,
                acked: None,
                outcome: None,
                approved: false,
            });
        }
        if tx.send(request).await.is_err() {
            shared.agent_errors.fetch_add(1, Ordering::Relaxed);
            shared.error(format!("agent {index}: the Connect stream closed"));
            break;
        }
        // Wait until every call of the batch is acknowledged and has its outcome.
        let mut open = 2 * config.batch_size as usize;
        let deadline = tokio::time::Instant::now() + config.patience;
        while open > 0 {
            let message = match tokio::time::timeout_at(deadline, stream.message()).await {
                Ok(Ok(Some(message))) => message,
                Ok(Ok(None)) => {
                    shared.error(format!("agent {index}: the broker ended the stream"));
                    shared.agent_errors.fetch_add(1, Ordering::Relaxed);
                    return records;
                }
                Ok(Err(status)) => {
                    shared.error(format!("agent {index}: {status}"));
                    shared.agent_errors.fetch_add(1, Ordering::Relaxed);
                    return records;
                }
                Err(_) => {
                    shared.error(format!(
                        "agent {index}: no outcome within {:?}",
                        config.patience
                    ));
                    shared.agent_errors.fetch_add(1, Ordering::Relaxed);
                    return records;
                }
            };
            let now = Instant::now();
            match message.response {
                Some(agent_response::Response::Submitted(submitted)) => {
                    for ack in submitted.acks {
                        let record = records[first..]
                            .iter_mut()
                            .find(|r| key_of("", "", &ack.call_id) == Some(r.key));
                        match (&ack.result, record) {
                            (Some(call_ack::Result::Accepted(_)), Some(r)) if r.acked.is_none() => {
                                r.acked = Some(now);
                                open -= 1;
                            }
                            (other, _) => {
                                shared.agent_errors.fetch_add(1, Ordering::Relaxed);
                                shared.error(format!("agent {index}: unexpected ack {other:?}"));
                            }
                        }
                    }
                }
                Some(agent_response::Response::Outcome(outcome)) => {
                    let key = key_of("", "", &outcome.call_id);
                    let record = records[first..]
                        .iter_mut()
                        .find(|r| Some(r.key) == key && r.outcome.is_none());
                    if let Some(r) = record {
                        r.outcome = Some(now);
                        r.approved = outcome.status == CallStatus::Approved as i32;
                        open -= 1;
                    } else {
                        shared.agent_errors.fetch_add(1, Ordering::Relaxed);
                        shared.error(format!(
                            "agent {index}: unexpected outcome for {}",
                            outcome.call_id
                        ));
                    }
                }
                Some(agent_response::Response::BatchComplete(_)) => {}
                other => {
                    shared.agent_errors.fetch_add(1, Ordering::Relaxed);
                    shared.error(format!("agent {index}: unexpected response {other:?}"));
                }
            }
        }
    }
    records
}

/// Under `--auto-approve grant`: submits one call and approves it as a person would, remembered
/// for the session for every input, so the session grant approves each later call at submit.
/// Returns once the seed call's outcome reached the agent.
async fn grant_session(
    index: u32,
    session: &str,
    tx: &mpsc::Sender<AgentRequest>,
    stream: &mut tonic::Streaming<AgentResponse>,
    channel: Channel,
) -> Result<(), String> {
    let seed = format!("seed-{index}");
    let request = AgentRequest {
        request_id: "seed".into(),
        request: Some(agent_request::Request::Submit(BatchSpec {
            session_id: session.into(),
            calls: vec![CallSpec {
                call_id: seed.clone(),
                tool: "edit_file".into(),
                input_json: "{}".into(),
                workspace: "bench".into(),
                ..CallSpec::default()
            }],
            ..BatchSpec::default()
        })),
    };
    tx.send(request)
        .await
        .map_err(|_| "the Connect stream closed")?;
    let mut next = async || match stream.message().await {
        Ok(Some(message)) => Ok(message.response),
        Ok(None) => Err("the broker ended the stream".to_string()),
        Err(status) => Err(status.to_string()),
    };
    while !matches!(next().await?, Some(agent_response::Response::Submitted(_))) {}
    ApproverServiceClient::new(channel)
        .decide(DecideRequest {
            session_id: session.into(),
            call_id: seed.clone(),
            decision: Decision::Approve as i32,
            approver: "bench".into(),
            scope: Scope::Session as i32,
            matcher: Some(InputMatcher {
                kind: Some(input_matcher::Kind::Any(AnyInput {})),
            }),
            ..DecideRequest::default()
        })
        .await
        .map_err(|status| format!("Decide: {status}"))?;
    loop {
        if let Some(agent_response::Response::Outcome(outcome)) = next().await?
            && outcome.call_id == seed
        {
            return Ok(());
        }
    }
}

/// A subscriber (`approver` is `None`) or an approver (`Some((index, of))`: it approves the
/// calls whose key falls in its share). Runs until aborted; resumes with `after_seq` when the
/// broker ends a lagging stream.
pub async fn watcher(
    config: Arc<LoadConfig>,
    shared: Arc<Shared>,
    subscriber: Option<usize>,
    approver: Option<(u32, u32)>,
    channel: Channel,
) {
    let client = ApproverServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let limit = Arc::new(Semaphore::new(config.approver_concurrency as usize));
    let mut after_seq: Option<u64> = None;
    loop {
        let request = SubscribeRequest {
            filter: None,
            after_seq,
        };
        let mut stream = match client.clone().subscribe(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                shared.error(format!("Subscribe: {status}"));
                shared.resubscribes.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            let event: ApproverEvent = match stream.message().await {
                Ok(Some(event)) => event,
                Ok(None) | Err(_) => {
                    shared.resubscribes.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            };
            after_seq = Some(event.seq);
            let call = match event.event {
                Some(approver_event::Event::Requested(call))
                | Some(approver_event::Event::Snapshot(call)) => call,
                _ => continue,
            };
            let Some(key) = key_of(&config.run_id, &call.session_id, &call.call_id) else {
                continue;
            };
            let now = Instant::now();
            if let Some(i) = subscriber {
                shared.shown[i].fetch_add(1, Ordering::Relaxed);
                shared.seen.lock().unwrap().entry(key).or_insert(now);
            }
            let Some((index, of)) = approver else {
                continue;
            };
            if ((key >> 40) + (key & 0xff_ffff_ffff)) % u64::from(of) != u64::from(index) {
                continue;
            }
            let permit = limit.clone().acquire_owned().await.expect("semaphore");
            let mut client = client.clone();
            let shared = shared.clone();
            tokio::spawn(async move {
                let request = DecideRequest {
                    session_id: call.session_id,
                    call_id: call.call_id,
                    decision: Decision::Approve as i32,
                    approver: format!("bench-{index}"),
                    ..DecideRequest::default()
                };
                shared.decided.lock().unwrap().insert(key, Instant::now());
                match client.decide(request).await {
                    Ok(_) => shared.decide_ok.fetch_add(1, Ordering::Relaxed),
                    Err(status) => {
                        shared.error(format!("Decide: {status}"));
                        shared.decide_errors.fetch_add(1, Ordering::Relaxed)
                    }
                };
                drop(permit);
            });
        }
    }
}

/// Connects `count` channels to `address`, one connection each.
/// `count` channels over `addresses` in turn (the first to the first replica, and so on).
pub async fn channels_across(addresses: &[String], count: u32) -> Result<Vec<Channel>, String> {
    let mut out = Vec::with_capacity(count as usize);
    for address in addresses.iter().cycle().take(count as usize) {
        out.push(connect(address).await?);
    }
    Ok(out)
}

pub async fn channels(address: &str, count: u32) -> Result<Vec<Channel>, String> {
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        out.push(connect(address).await?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_json_objects_of_the_asked_size() {
        for bytes in [1024, 2048] {
            let input = tool_input(3, 17, bytes);
            let value: serde_json::Value = serde_json::from_str(&input).unwrap();
            assert!(value.is_object());
            assert_eq!(input.len(), bytes);
        }
    }

    #[test]
    fn keys_round_trip() {
        assert_eq!(key_of("run", "run-agent-3", "3-17"), Some((3 << 40) | 17));
        assert_eq!(key_of("run", "other", "3-17"), None);
    }
}
