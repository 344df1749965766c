//! The steady load the broker is killed under, and what each client was told: agents submitting
//! batches over `Connect` (with cancels and supersedes) that reconnect, resume and resubmit
//! after every kill; a subscriber that resumes with `after_seq`; an approver deciding; and the
//! sweeper that approves what is left at the end. Each records only what the broker
//! acknowledged to it, for `check` to hold against the broker's final state.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use approval_broker::proto::v1 as pb;
use pb::agent_request::Request;
use pb::agent_response::Response as Reply;
use pb::agent_service_client::AgentServiceClient;
use pb::approver_event::Event as E;
use pb::approver_service_client::ApproverServiceClient;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use crate::broker::{connect, lazy_channel};
use crate::rng::Rng;

/// How long a client waits for the reply to a request on a live stream before it treats the
/// stream as broken.
const REPLY_PATIENCE: Duration = Duration::from_secs(10);
/// How long an agent waits, once the load stops, for every outcome it is owed.
pub const DRAIN_PATIENCE: Duration = Duration::from_secs(30);
/// An agent with this many acknowledged calls still undecided waits before its next turn.
const MAX_UNDECIDED: usize = 12;
/// Who the approver is, and who approves what is left at the end.
pub const APPROVER: &str = "alice@example.com";
pub const SWEEPER: &str = "sweeper@example.com";

/// A decision (or cancel, supersede, skip) whose reply reached the client: the outcome that
/// the broker said stands.
#[derive(Debug, Clone)]
pub struct Acked {
    pub source: &'static str,
    pub outcome: pb::Outcome,
}

/// One acknowledgement of one call.
#[derive(Debug, Clone)]
pub struct AckRecord {
    pub call_id: String,
    pub batch_id: String,
    pub position: u32,
}

#[derive(Debug, Default)]
pub struct AgentReport {
    pub session: String,
    pub batches: usize,
    /// Call id → its first acknowledgement (accepted or duplicate).
    pub acked: BTreeMap<String, AckRecord>,
    /// Every acknowledgement received, resubmits included.
    pub acks: Vec<AckRecord>,
    /// Call id → the outcome pushed to the agent (an `outcome` message).
    pub pushed: BTreeMap<String, pb::Outcome>,
    /// Call id → the first outcome the agent saw in any message.
    pub seen: BTreeMap<String, pb::Outcome>,
    /// Two different outcomes seen for one call.
    pub conflicting: Vec<(pb::Outcome, pb::Outcome)>,
    /// Batch id → the outcomes of its first batch-complete message.
    pub batch_completes: BTreeMap<String, Vec<pb::Outcome>>,
    /// Cancels and supersedes acknowledged to this agent.
    pub decisions: Vec<Acked>,
    pub reconnects: u32,
    pub resubmits: u32,
    pub duplicate_acks: u32,
    pub cancels: u32,
    /// Requests refused as a whole with INTERNAL (the broker's own failure; nothing was
    /// acknowledged, the request is retried).
    pub internal: u32,
    pub errors: Vec<String>,
    /// Every acknowledged call had its outcome (and batch completion) before the drain ended.
    pub finished: bool,
}

/// The stream is gone (the broker was killed): reconnect.
struct Broken;

struct Conn {
    requests: mpsc::Sender<pb::AgentRequest>,
    responses: Streaming<pb::AgentResponse>,
}

struct Batch {
    spec: pb::BatchSpec,
    acked: bool,
}

/// One agent: one session, one `Connect` stream at a time.
pub struct Agent {
    address: String,
    rng: Rng,
    draining: watch::Receiver<bool>,
    batches: Vec<Batch>,
    requests: u64,
    report: AgentReport,
}

impl Agent {
    pub fn new(
        address: String,
        session: String,
        rng: Rng,
        draining: watch::Receiver<bool>,
    ) -> Agent {
        Agent {
            address,
            rng,
            draining,
            batches: Vec::new(),
            requests: 0,
            report: AgentReport {
                session,
                ..Default::default()
            },
        }
    }

    pub async fn run(mut self) -> AgentReport {
        let mut conn: Option<Conn> = None;
        let mut first = true;
        let mut drain_deadline: Option<Instant> = None;
        loop {
            let draining = *self.draining.borrow();
            if draining {
                let deadline =
                    *drain_deadline.get_or_insert_with(|| Instant::now() + DRAIN_PATIENCE);
                if self.done() {
                    self.report.finished = true;
                    break;
                }
                if Instant::now() > deadline {
                    break;
                }
            }
            let Some(c) = conn.as_mut() else {
                match self.reconnect(first).await {
                    Ok(c) => {
                        conn = Some(c);
                        first = false;
                    }
                    Err(Broken) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
                continue;
            };
            let step = if draining {
                self.read_for(c, Duration::from_millis(200)).await
            } else if self.undecided() >= MAX_UNDECIDED {
                self.read_for(c, Duration::from_millis(100)).await
            } else {
                self.turn(c).await
            };
            if step.is_err() {
                conn = None;
            }
        }
        self.report.batches = self.batches.len();
        self.report
    }

    /// Every batch acknowledged, every acknowledged call's outcome pushed, every batch complete.
    fn done(&self) -> bool {
        let r = &self.report;
        self.batches.iter().all(|b| b.acked)
            && r.acked.keys().all(|c| r.pushed.contains_key(c))
            && r.pushed
                .values()
                .all(|o| r.batch_completes.contains_key(&o.batch_id))
    }

    fn undecided(&self) -> usize {
        let r = &self.report;
        r.acked
            .keys()
            .filter(|c| !r.pushed.contains_key(*c))
            .count()
    }

    fn request_id(&mut self, what: &str) -> String {
        self.requests += 1;
        format!("{what}-{}", self.requests)
    }

    /// Opens a new stream; after a break, resumes the session (the outcomes decided meanwhile)
    /// and resubmits every batch whose acknowledgement never arrived.
    async fn reconnect(&mut self, first: bool) -> Result<Conn, Broken> {
        let channel = connect(&self.address).await.ok_or(Broken)?;
        let (requests, rx) = mpsc::channel(64);
        let mut client = AgentServiceClient::new(channel);
        let responses =
            match tokio::time::timeout(REPLY_PATIENCE, client.connect(ReceiverStream::new(rx)))
                .await
            {
                Ok(Ok(response)) => response.into_inner(),
                _ => return Err(Broken),
            };
        let mut conn = Conn {
            requests,
            responses,
        };
        if !first {
            self.report.reconnects += 1;
            let id = self.request_id("resume");
            let resume = Request::Resume(pb::ResumeRequest {
                session_id: self.report.session.clone(),
                call_ids: Vec::new(),
            });
            self.send(&conn, &id, resume).await?;
            self.wait_reply(&mut conn, &id).await?;
        }
        let unacked: Vec<usize> = (0..self.batches.len())
            .filter(|&i| !self.batches[i].acked)
            .collect();
        for index in unacked {
            self.report.resubmits += 1;
            self.submit(&mut conn, index).await?;
        }
        Ok(conn)
    }

    /// One model turn: a new batch, sometimes cancelled after its acknowledgement, then a
    /// pause during which outcomes arrive.
    async fn turn(&mut self, conn: &mut Conn) -> Result<(), Broken> {
        let spec = self.new_batch();
        self.batches.push(Batch { spec, acked: false });
        let submitted = self.submit(conn, self.batches.len() - 1).await?;
        if self.rng.chance(20) {
            let pause = self.rng.millis(0, 80);
            self.read_for(conn, pause).await?;
            let target = if !submitted.batch_id.is_empty() && self.rng.chance(50) {
                pb::cancel_target::Target::BatchId(submitted.batch_id.clone())
            } else {
                pb::cancel_target::Target::Calls(pb::CallIds {
                    call_ids: submitted.acks.iter().map(|a| a.call_id.clone()).collect(),
                })
            };
            let id = self.request_id("cancel");
            let cancel = Request::Cancel(pb::CancelTarget {
                session_id: self.report.session.clone(),
                target: Some(target),
                reason: "the user changed their mind".into(),
            });
            self.send(conn, &id, cancel).await?;
            self.wait_reply(conn, &id).await?;
            self.report.cancels += 1;
        }
        let think = self.rng.millis(0, 80);
        self.read_for(conn, think).await
    }

    fn new_batch(&mut self) -> pb::BatchSpec {
        let b = self.batches.len();
        let n = self.rng.between(1, 5);
        let calls = (0..n)
            .map(|i| {
                let tool = match self.rng.below(100) {
                    0..15 => "ask_user",
                    15..50 => "read_file",
                    50..80 => "write_file",
                    _ => "run_shell",
                };
                let supersede_key = if tool == "ask_user" {
                    "question".to_owned()
                } else if self.rng.chance(10) {
                    format!("k{}", self.rng.below(3))
                } else {
                    String::new()
                };
                pb::CallSpec {
                    call_id: format!("b{b}c{i}"),
                    tool: tool.into(),
                    input_json: format!(
                        r#"{{"batch": {b}, "call": {i}, "nonce": {}}}"#,
                        self.rng.below(1_000_000)
                    ),
                    title: format!("{tool} {b}.{i}"),
                    supersede_key,
                    ..Default::default()
                }
            })
            .collect();
        pb::BatchSpec {
            session_id: self.report.session.clone(),
            calls,
            on_deny: if self.rng.chance(30) {
                pb::OnDeny::Independent as i32
            } else {
                pb::OnDeny::Unspecified as i32
            },
            supersede_pending: self.rng.chance(4),
        }
    }

    /// Submits batch `index` until it is acknowledged (or the stream breaks).
    async fn submit(
        &mut self,
        conn: &mut Conn,
        index: usize,
    ) -> Result<pb::SubmitResponse, Broken> {
        loop {
            let id = self.request_id("submit");
            let spec = self.batches[index].spec.clone();
            self.send(conn, &id, Request::Submit(spec)).await?;
            match self.wait_reply(conn, &id).await? {
                Reply::Submitted(submitted) => {
                    self.record_acks(&submitted);
                    self.batches[index].acked = true;
                    return Ok(submitted);
                }
                Reply::Error(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                other => {
                    self.report
                        .errors
                        .push(format!("submit {id} answered with {other:?}"));
                    return Err(Broken);
                }
            }
        }
    }

    fn record_acks(&mut self, submitted: &pb::SubmitResponse) {
        for ack in &submitted.acks {
            let (accepted, duplicate) = match &ack.result {
                Some(pb::call_ack::Result::Accepted(a)) => (a, false),
                Some(pb::call_ack::Result::Duplicate(a)) => (a, true),
                other => {
                    self.report.errors.push(format!(
                        "{}/{}: refused: {other:?}",
                        self.report.session, ack.call_id
                    ));
                    continue;
                }
            };
            if duplicate {
                self.report.duplicate_acks += 1;
            }
            let record = AckRecord {
                call_id: ack.call_id.clone(),
                batch_id: accepted.batch_id.clone(),
                position: accepted.position,
            };
            self.report
                .acked
                .entry(ack.call_id.clone())
                .or_insert_with(|| record.clone());
            self.report.acks.push(record);
        }
    }

    async fn send(&self, conn: &Conn, id: &str, request: Request) -> Result<(), Broken> {
        let request = pb::AgentRequest {
            request_id: id.to_owned(),
            request: Some(request),
        };
        conn.requests.send(request).await.map_err(|_| Broken)
    }

    /// Reads (and records) responses until the one answering `id`.
    async fn wait_reply(&mut self, conn: &mut Conn, id: &str) -> Result<Reply, Broken> {
        loop {
            let message = match tokio::time::timeout(REPLY_PATIENCE, conn.responses.message()).await
            {
                Ok(Ok(Some(message))) => message,
                _ => return Err(Broken),
            };
            let answers = message.request_id == id;
            let reply = message.response.clone();
            self.record(message);
            if answers {
                return reply.ok_or(Broken);
            }
        }
    }

    /// Reads (and records) responses for `wait`.
    async fn read_for(&mut self, conn: &mut Conn, wait: Duration) -> Result<(), Broken> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, conn.responses.message()).await {
                Err(_) => return Ok(()),
                Ok(Ok(Some(message))) => self.record(message),
                Ok(_) => return Err(Broken),
            }
        }
    }

    fn record(&mut self, mut message: pb::AgentResponse) {
        // The receipts outcomes carry (tests/api/receipts.rs checks them) are set aside: the
        // outcomes are compared with the stored calls', which approvers' reads give without them.
        without_receipts(&mut message.response);
        match message.response {
            Some(Reply::Outcome(outcome)) => {
                self.saw(&outcome);
                self.report
                    .pushed
                    .entry(outcome.call_id.clone())
                    .or_insert(outcome);
            }
            Some(Reply::BatchComplete(complete)) => {
                for outcome in &complete.outcomes {
                    self.saw(outcome);
                }
                self.report
                    .batch_completes
                    .entry(complete.batch_id)
                    .or_insert(complete.outcomes);
            }
            Some(Reply::Submitted(submitted)) => {
                for outcome in &submitted.outcomes {
                    self.saw(outcome);
                }
                // A call superseded by a later call of its own batch is acknowledged with its
                // outcome among `outcomes`; the calls of earlier batches are in `superseded`.
                let own_superseded = submitted
                    .outcomes
                    .iter()
                    .filter(|o| o.status == pb::CallStatus::Superseded as i32)
                    .cloned();
                for outcome in own_superseded.chain(submitted.superseded) {
                    self.saw(&outcome);
                    self.report.decisions.push(Acked {
                        source: "superseded",
                        outcome,
                    });
                }
            }
            Some(Reply::Cancelled(result)) => {
                for outcome in result.cancelled {
                    self.saw(&outcome);
                    self.report.decisions.push(Acked {
                        source: "cancelled",
                        outcome,
                    });
                }
                for outcome in result.already_decided {
                    self.saw(&outcome);
                    self.report.decisions.push(Acked {
                        source: "already-decided",
                        outcome,
                    });
                }
                if !result.unknown_call_ids.is_empty() {
                    self.report.errors.push(format!(
                        "{}: cancel named unknown calls {:?}",
                        self.report.session, result.unknown_call_ids
                    ));
                }
            }
            Some(Reply::Resumed(done)) => {
                if !done.unknown_call_ids.is_empty() {
                    self.report.errors.push(format!(
                        "{}: resume names unknown calls {:?}",
                        self.report.session, done.unknown_call_ids
                    ));
                }
            }
            Some(Reply::Error(error)) if error.code == Code::Internal as i32 => {
                self.report.internal += 1;
            }
            Some(Reply::Error(error)) => self.report.errors.push(format!(
                "{}: request {} refused: {} {}",
                self.report.session, message.request_id, error.code, error.message
            )),
            None => self
                .report
                .errors
                .push(format!("{}: an empty response", self.report.session)),
        }
    }

    fn saw(&mut self, outcome: &pb::Outcome) {
        match self.report.seen.get(&outcome.call_id) {
            Some(first) if first != outcome => {
                let pair = (first.clone(), outcome.clone());
                self.report.conflicting.push(pair);
            }
            Some(_) => {}
            None => {
                self.report
                    .seen
                    .insert(outcome.call_id.clone(), outcome.clone());
            }
        }
    }
}

/// Every outcome of an agent's response, without the receipt it carries.
fn without_receipts(response: &mut Option<Reply>) {
    let outcomes: Vec<&mut pb::Outcome> = match response {
        Some(Reply::Outcome(outcome)) => vec![outcome],
        Some(Reply::BatchComplete(complete)) => complete.outcomes.iter_mut().collect(),
        Some(Reply::Submitted(submitted)) => submitted
            .outcomes
            .iter_mut()
            .chain(submitted.superseded.iter_mut())
            .collect(),
        Some(Reply::Cancelled(result)) => result
            .cancelled
            .iter_mut()
            .chain(result.already_decided.iter_mut())
            .collect(),
        _ => Vec::new(),
    };
    for outcome in outcomes {
        outcome.receipt.clear();
    }
}

/// One event of the log as a subscriber saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecord {
    pub seq: u64,
    pub kind: Kind,
    pub session: String,
    pub call_id: String,
    /// For `Resolved`: the outcome. (A `Requested` event shows the call as it stands when it is
    /// read, so only its identity is compared.)
    pub outcome: Option<pb::Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Requested,
    Resolved,
}

impl EventRecord {
    pub fn of(event: &pb::ApproverEvent) -> Option<EventRecord> {
        let (kind, session, call_id, outcome) = match &event.event {
            Some(E::Requested(call)) => (
                Kind::Requested,
                call.session_id.clone(),
                call.call_id.clone(),
                None,
            ),
            Some(E::Resolved(outcome)) => (
                Kind::Resolved,
                outcome.session_id.clone(),
                outcome.call_id.clone(),
                Some(outcome.clone()),
            ),
            _ => return None,
        };
        Some(EventRecord {
            seq: event.seq,
            kind,
            session,
            call_id,
            outcome,
        })
    }
}

#[derive(Debug, Default)]
pub struct SubscriberReport {
    pub events: Vec<EventRecord>,
    pub subscriptions: u32,
    pub snapshot_items: u64,
    pub fell_behind: u32,
    pub errors: Vec<String>,
    /// It reached the sequence number it was told to stop at.
    pub caught_up: bool,
}

/// Subscribes once without a cursor (an empty snapshot: it starts before the load), then after
/// every break resumes with `after_seq` = the last sequence number it saw. Stops once it has
/// seen `stop_at` (or 20 s after being told to stop).
pub async fn subscriber(
    address: String,
    ready: oneshot::Sender<()>,
    stop_at: watch::Receiver<Option<u64>>,
) -> SubscriberReport {
    let mut report = SubscriberReport::default();
    let mut ready = Some(ready);
    let mut cursor: Option<u64> = None;
    let mut give_up: Option<Instant> = None;
    let stop =
        |report: &mut SubscriberReport, cursor: Option<u64>, give_up: &mut Option<Instant>| {
            let target = (*stop_at.borrow())?;
            let deadline = *give_up.get_or_insert_with(|| Instant::now() + Duration::from_secs(20));
            if cursor.unwrap_or(0) >= target {
                report.caught_up = true;
                return Some(());
            }
            (Instant::now() > deadline).then_some(())
        };
    loop {
        if stop(&mut report, cursor, &mut give_up).is_some() {
            return report;
        }
        let Some(channel) = connect(&address).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let request = pb::SubscribeRequest {
            filter: Some(pb::CallFilter::default()),
            after_seq: cursor,
        };
        let subscribed = tokio::time::timeout(
            REPLY_PATIENCE,
            ApproverServiceClient::new(channel).subscribe(request),
        )
        .await;
        let mut stream = match subscribed {
            Ok(Ok(response)) => response.into_inner(),
            Ok(Err(status)) => {
                if !is_transport(&status) {
                    report.errors.push(format!(
                        "subscribe after {cursor:?}: {:?} {}",
                        status.code(),
                        status.message()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => continue,
        };
        report.subscriptions += 1;
        loop {
            match tokio::time::timeout(Duration::from_millis(200), stream.message()).await {
                Err(_) => {}
                Ok(Ok(Some(event))) => match &event.event {
                    Some(E::Snapshot(_)) => report.snapshot_items += 1,
                    Some(E::SnapshotComplete(_)) => {
                        cursor = Some(event.seq);
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(());
                        }
                    }
                    _ => {
                        if let Some(record) = EventRecord::of(&event) {
                            cursor = Some(record.seq);
                            report.events.push(record);
                        }
                    }
                },
                Ok(Ok(None)) => break,
                Ok(Err(status)) => {
                    if status.code() == Code::ResourceExhausted {
                        report.fell_behind += 1;
                        let trailer = status
                            .metadata()
                            .get("approvals-last-seq")
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.parse::<u64>().ok());
                        if trailer != cursor {
                            report.errors.push(format!(
                                "fell behind: the trailer names {trailer:?}, the last event \
                                 seen was {cursor:?}"
                            ));
                        }
                    } else if !is_transport(&status) {
                        report.errors.push(format!(
                            "subscription ended: {:?} {}",
                            status.code(),
                            status.message()
                        ));
                    }
                    break;
                }
            }
            if stop(&mut report, cursor, &mut give_up).is_some() {
                return report;
            }
        }
    }
}

/// What a client sees when the broker is killed under it, or is not back yet.
fn is_transport(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
    )
}

/// The broker itself answered INTERNAL (its generic text for a failure it logged).
fn is_internal(status: &tonic::Status) -> bool {
    status.code() == Code::Internal && status.message().contains("see the broker's log")
}

#[derive(Debug, Default)]
pub struct ApproverReport {
    pub decisions: Vec<Acked>,
    /// Decide calls answered (replays included).
    pub answered: u32,
    /// Repeated decisions answered as replays.
    pub replays: u32,
    /// Decisions refused with FAILED_PRECONDITION (the call was already decided otherwise).
    pub refused: u32,
    /// Decide calls retried because the broker was down.
    pub retries: u32,
    /// Decisions whose first answer, after a retry, was a replay: committed before a kill
    /// whose reply never arrived.
    pub committed_unanswered: u32,
    /// Decide calls the broker refused with INTERNAL (retried).
    pub internal: u32,
    pub subscriptions: u32,
    pub errors: Vec<String>,
}

impl ApproverReport {
    fn merge(&mut self, other: ApproverReport) {
        self.decisions.extend(other.decisions);
        self.answered += other.answered;
        self.replays += other.replays;
        self.refused += other.refused;
        self.retries += other.retries;
        self.committed_unanswered += other.committed_unanswered;
        self.internal += other.internal;
        self.subscriptions += other.subscriptions;
        self.errors.extend(other.errors);
    }
}

/// Watches the requested calls and decides each after a random delay: approves most, denies
/// some, and sometimes repeats a decision (a replay) or contradicts it (refused).
pub async fn approver(
    address: String,
    rng: Rng,
    mut draining: watch::Receiver<bool>,
) -> ApproverReport {
    let mut report = ApproverReport::default();
    let channel = lazy_channel(&address);
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, String)>();
    let watcher = tokio::spawn(watch_requested(address, tx));
    let mut tasks: JoinSet<ApproverReport> = JoinSet::new();
    let mut n = 0u64;
    let for_tasks = draining.clone();
    loop {
        tokio::select! {
            key = rx.recv() => match key {
                Some(key) => {
                    n += 1;
                    let rng = rng.fork(n);
                    tasks.spawn(decide(channel.clone(), key, rng, for_tasks.clone()));
                }
                None => break,
            },
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                report.merge(done.expect("decision task"));
            }
            _ = draining.wait_for(|d| *d) => break,
        }
    }
    watcher.abort();
    if let Ok(subscriptions) = watcher.await {
        report.subscriptions = subscriptions;
    }
    while let Some(done) = tasks.join_next().await {
        report.merge(done.expect("decision task"));
    }
    report
}

/// Sends the key of every requested (or pending, in a snapshot) call once.
async fn watch_requested(address: String, tx: mpsc::UnboundedSender<(String, String)>) -> u32 {
    let mut queued: HashSet<(String, String)> = HashSet::new();
    let mut subscriptions = 0;
    loop {
        let Some(channel) = connect(&address).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let request = pb::SubscribeRequest {
            filter: Some(pb::CallFilter::default()),
            after_seq: None,
        };
        let mut stream = match tokio::time::timeout(
            REPLY_PATIENCE,
            ApproverServiceClient::new(channel).subscribe(request),
        )
        .await
        {
            Ok(Ok(response)) => response.into_inner(),
            _ => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        subscriptions += 1;
        while let Ok(Some(event)) = stream.message().await {
            if let Some(E::Snapshot(call) | E::Requested(call)) = event.event {
                let key = (call.session_id, call.call_id);
                if queued.insert(key.clone()) && tx.send(key).is_err() {
                    return subscriptions;
                }
            }
        }
    }
}

fn decide_request(
    key: &(String, String),
    decision: pb::Decision,
    approver: &str,
) -> pb::DecideRequest {
    pb::DecideRequest {
        session_id: key.0.clone(),
        call_id: key.1.clone(),
        decision: decision as i32,
        reason: match decision {
            pb::Decision::Deny => "not now".into(),
            _ => String::new(),
        },
        approver: approver.into(),
        ..Default::default()
    }
}

/// Decides one call, retrying while the broker is down (a decision committed just before a
/// kill is then answered as a replay).
async fn decide(
    channel: Channel,
    key: (String, String),
    mut rng: Rng,
    draining: watch::Receiver<bool>,
) -> ApproverReport {
    let mut report = ApproverReport::default();
    tokio::time::sleep(rng.millis(0, 300)).await;
    let (decision, opposite) = if rng.chance(15) {
        (pb::Decision::Deny, pb::Decision::Approve)
    } else {
        (pb::Decision::Approve, pb::Decision::Deny)
    };
    let repeat = rng.chance(10);
    let contradict = rng.chance(5);
    let request = decide_request(&key, decision, APPROVER);
    let first = loop {
        if *draining.borrow() {
            return report;
        }
        let mut client = ApproverServiceClient::new(channel.clone());
        match tokio::time::timeout(REPLY_PATIENCE, client.decide(request.clone())).await {
            Ok(Ok(response)) => break response.into_inner(),
            Ok(Err(status)) if status.code() == Code::FailedPrecondition => {
                report.refused += 1;
                return report;
            }
            Ok(Err(status)) if is_internal(&status) => {
                report.internal += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(Err(status)) if !is_transport(&status) => {
                report.errors.push(format!(
                    "decide {key:?}: {:?} {}",
                    status.code(),
                    status.message()
                ));
                return report;
            }
            _ => {
                report.retries += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    if first.replayed && report.retries > 0 {
        report.committed_unanswered += 1;
    }
    report.record(&key, first);
    let mut client = ApproverServiceClient::new(channel);
    if repeat {
        // The same decision again: the stored outcome, as a replay.
        if let Ok(Ok(response)) =
            tokio::time::timeout(REPLY_PATIENCE, client.decide(request.clone())).await
        {
            let response = response.into_inner();
            if response.replayed {
                report.replays += 1;
            } else {
                report.errors.push(format!(
                    "repeating the decision of {key:?} was not a replay"
                ));
            }
            report.record(&key, response);
        }
    }
    if contradict {
        // The opposite decision: refused, the first one stands.
        let request = decide_request(&key, opposite, APPROVER);
        match tokio::time::timeout(REPLY_PATIENCE, client.decide(request)).await {
            Ok(Ok(response)) => report.errors.push(format!(
                "contradicting the decision of {key:?} was accepted: {:?}",
                response.into_inner()
            )),
            Ok(Err(status)) if status.code() == Code::FailedPrecondition => report.refused += 1,
            _ => {}
        }
    }
    report
}

impl ApproverReport {
    fn record(&mut self, key: &(String, String), response: pb::DecideResponse) {
        self.answered += 1;
        match response.outcome {
            Some(outcome) => self.decisions.push(Acked {
                source: "approver",
                outcome,
            }),
            None => self
                .errors
                .push(format!("decide {key:?}: a reply without an outcome")),
        }
        for outcome in response.skipped {
            self.decisions.push(Acked {
                source: "skipped",
                outcome,
            });
        }
    }
}

/// Approves every pending call (the end of the run: every call must end). Returns how many
/// pending calls it found.
pub async fn sweep(address: &str, decisions: &mut Vec<Acked>, errors: &mut Vec<String>) -> usize {
    let channel = lazy_channel(address);
    let mut pending = Vec::new();
    let mut token = String::new();
    loop {
        let request = pb::ListPendingRequest {
            filter: Some(pb::CallFilter::default()),
            page_size: 1000,
            page_token: token,
        };
        let page = match ApproverServiceClient::new(channel.clone())
            .list_pending(request)
            .await
        {
            Ok(page) => page.into_inner(),
            Err(status) => {
                errors.push(format!("list pending: {status}"));
                return 0;
            }
        };
        pending.extend(page.calls);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    for call in &pending {
        let key = (call.session_id.clone(), call.call_id.clone());
        let request = decide_request(&key, pb::Decision::Approve, SWEEPER);
        match ApproverServiceClient::new(channel.clone())
            .decide(request)
            .await
        {
            Ok(response) => {
                let response = response.into_inner();
                if let Some(outcome) = response.outcome {
                    decisions.push(Acked {
                        source: "sweeper",
                        outcome,
                    });
                }
            }
            Err(status) if status.code() == Code::FailedPrecondition => {}
            Err(status) => errors.push(format!("sweep {key:?}: {status}")),
        }
    }
    pending.len()
}
