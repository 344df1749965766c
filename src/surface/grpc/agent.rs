//! AgentService: the agent's stream (`Connect`) and its unary equivalents.
//!
//! A `Connect` stream is one task that reads the agent's requests and the event feed in turn.
//! It follows every session it has submitted to, cancelled in or resumed, and pushes each outcome
//! of those sessions once, with a batch-complete message when a batch's last call is decided.
//! A bad request gets an error response for that request alone; the stream goes on.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use super::oversize::{self, Room};
use super::replay::{Replay, Replayed, SessionPages};
use super::{StreamOver, parse, render};
use crate::background::events::Feed;
use crate::broker::Broker;
use crate::domain::{
    AgentId, BatchId, Call, CallId, Event, EventKind, SessionId, SubmitReport, SubmitResult,
};
use crate::door::auth::Caller;
use crate::door::stream_slots::StreamSlot;
use crate::error::Result;
use crate::observe::traces;
use crate::proto::v1 as pb;
use crate::proto::v1::agent_response::Response as Reply;

/// Responses queued for one agent stream before the task waits for the client to read.
const OUTBOUND: usize = 256;

/// The most sessions one agent stream follows.
pub const MAX_FOLLOWED_SESSIONS: usize = 1024;

/// The longest `request_id` a `Connect` request may carry: each answer echoes it, so its length
/// counts against the reply limit; a request with a longer one is refused (its answer echoes
/// the id's first bytes).
pub const MAX_REQUEST_ID_BYTES: usize = 256;

pub struct AgentApi {
    broker: Arc<Broker>,
}

impl AgentApi {
    pub fn new(broker: Arc<Broker>) -> Self {
        Self { broker }
    }
}

type Outbound<T> = mpsc::Sender<Result<T, Status>>;

#[tonic::async_trait]
impl pb::agent_service_server::AgentService for AgentApi {
    type ConnectStream = ReceiverStream<Result<pb::AgentResponse, Status>>;
    type WatchOutcomesStream = ReceiverStream<Result<pb::WatchOutcomesResponse, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<pb::AgentRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let agent = Caller::of(&request).agent()?;
        let slot = self.broker.open_agent_stream()?;
        let (out, rx) = mpsc::channel(OUTBOUND);
        // Routed: only the events of the sessions it follows wake the stream's task.
        let feed = self.broker.bus().routed_feed(&agent);
        let connection = AgentConnection {
            broker: Arc::clone(&self.broker),
            agent,
            out,
            watched: HashMap::new(),
            _slot: slot,
        };
        tokio::spawn(connection.run(request.into_inner(), feed).in_current_span());
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn submit(
        &self,
        request: Request<pb::SubmitRequest>,
    ) -> Result<Response<pb::SubmitResponse>, Status> {
        let agent = Caller::of(&request).agent()?;
        let mut parsed = parse::batch(
            "batch",
            request.into_inner().batch,
            self.broker.limits().max_input_bytes,
        )?;
        parsed.batch.agent = agent;
        let session = parsed.batch.session.to_string();
        let mut report = self.broker.submit(parsed.batch).await?;
        self.broker.seal_outcomes(report.calls_mut()).await?;
        Ok(Response::new(render::submit_response(
            &report,
            &session,
            &parsed.refused,
            self.broker.limits().max_reply_bytes,
        )))
    }

    async fn watch_outcomes(
        &self,
        request: Request<pb::WatchOutcomesRequest>,
    ) -> Result<Response<Self::WatchOutcomesStream>, Status> {
        let agent = Caller::of(&request).agent()?;
        let slot = self.broker.open_agent_stream()?;
        let req = request.into_inner();
        let session = parse::session("session_id", req.session_id)?;
        let named = parse::call_ids("call_ids", req.call_ids, true)?;
        let wanted = (!named.is_empty()).then(|| named.into_iter().collect::<HashSet<_>>());
        // Outcomes logged by now are replayed; the later ones come from the feed.
        let seq = self.broker.latest_seq().await?;
        let (out, rx) = mpsc::channel(OUTBOUND);
        let watch = OutcomeWatch {
            broker: Arc::clone(&self.broker),
            agent,
            session,
            wanted,
            out,
            _slot: slot,
        };
        tokio::spawn(watch.run(seq).in_current_span());
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_outcomes(
        &self,
        request: Request<pb::GetOutcomesRequest>,
    ) -> Result<Response<pb::GetOutcomesResponse>, Status> {
        let caller = Caller::of(&request);
        let agent = caller.agent()?;
        let req = request.into_inner();
        let session = parse::session("session_id", req.session_id)?;
        let ids = parse::call_ids("call_ids", req.call_ids, false)?;
        let mut found = self
            .broker
            .visible_calls_by_id(&agent, &session, &ids, &caller.viewer())
            .await?;
        self.broker
            .seal_outcomes(found.iter_mut().flatten())
            .await?;
        let states = ids.iter().zip(found).map(|(id, call)| pb::CallState {
            call_id: id.to_string(),
            state: Some(match call {
                Some(c) if c.outcome.is_some() => {
                    pb::call_state::State::Outcome(render::outcome(&c).unwrap_or_default())
                }
                Some(c) => pb::call_state::State::Pending(render::call(&c)),
                None => pb::call_state::State::Unknown(pb::Unknown {}),
            }),
        });
        let (calls, all) = Room::new(self.broker.limits().max_reply_bytes).fill(states);
        Ok(Response::new(pb::GetOutcomesResponse {
            calls,
            truncated: !all,
        }))
    }

    async fn cancel(
        &self,
        request: Request<pb::CancelRequest>,
    ) -> Result<Response<pb::CancelResponse>, Status> {
        let agent = Caller::of(&request).agent()?;
        let mut target = parse::cancel(request.into_inner().target, "target")?;
        target.agent = agent;
        let mut report = self.broker.cancel(&target).await?;
        self.broker.seal_outcomes(report.calls_mut()).await?;
        Ok(Response::new(pb::CancelResponse {
            result: Some(render::cancel_result(
                &report,
                self.broker.limits().max_reply_bytes,
            )),
        }))
    }

    /// The receipt of one of the caller's own calls: the key is the caller's agent whatever the
    /// request says, so another agent's call answers NOT_FOUND exactly as an unknown one.
    async fn get_receipt(
        &self,
        request: Request<pb::GetReceiptRequest>,
    ) -> Result<Response<pb::GetReceiptResponse>, Status> {
        let caller = Caller::of(&request);
        let agent = caller.agent()?;
        let req = request.into_inner();
        let mut key = parse::call_key(String::new(), req.session_id, req.call_id)?;
        key.agent = agent;
        super::receipt(&self.broker, &key, &caller.viewer()).await
    }

    async fn list_receipt_keys(
        &self,
        _request: Request<pb::ListReceiptKeysRequest>,
    ) -> Result<Response<pb::ListReceiptKeysResponse>, Status> {
        Ok(super::receipt_keys(&self.broker))
    }
}

struct AgentConnection {
    broker: Arc<Broker>,
    agent: AgentId,
    out: Outbound<pb::AgentResponse>,
    /// The sessions this stream follows, each with the sequence number up to which its
    /// outcomes were sent (by a resume) or are not wanted (committed before it followed).
    watched: HashMap<SessionId, u64>,
    _slot: StreamSlot,
}

impl AgentConnection {
    async fn run(mut self, mut inbound: Streaming<pb::AgentRequest>, mut feed: Feed) {
        let out = self.out.clone();
        let broker = Arc::clone(&self.broker);
        let mut reading = true;
        loop {
            let step = tokio::select! {
                message = inbound.message(), if reading => match message {
                    Ok(Some(request)) => self.handle(request, &mut feed).await,
                    Ok(None) => {
                        // Half-closed: no more requests, but outcomes still flow.
                        reading = false;
                        Ok(())
                    }
                    Err(status) => {
                        // A message the stream could not take (too large, undecodable): say
                        // why, rather than end as if all were well. If the client is gone,
                        // the send fails and nothing is lost.
                        tracing::debug!(%status, "agent stream broken");
                        let _ = out.send(Err(oversize::map_status(status))).await;
                        return;
                    }
                },
                delivery = feed.next() => match delivery {
                    Ok(delivery) => self.route(&delivery.event).await,
                    Err(err) => {
                        let _ = out.send(Err(err.into())).await;
                        return;
                    }
                },
                _ = out.closed() => return,
                _ = broker.stopping() => {
                    let _ = out
                        .send(Err(Status::unavailable(
                            "the broker is shutting down; reconnect and resume",
                        )))
                        .await;
                    return;
                }
            };
            if step.is_err() {
                return;
            }
        }
    }

    async fn send(&self, request_id: &str, reply: Reply) -> Result<(), StreamOver> {
        // Every message of the stream passes here: the ones that list a whole batch or session
        // are cut to the reply limit (the others are built within it, or hold one item).
        let limit = self.broker.limits().max_reply_bytes;
        let reply = match reply {
            Reply::BatchComplete(c) => Reply::BatchComplete(render::fit_batch_complete(c, limit)),
            Reply::Resumed(done) => Reply::Resumed(render::fit_resume_done(done, limit)),
            other => other,
        };
        let response = pb::AgentResponse {
            request_id: request_id.to_owned(),
            response: Some(reply),
        };
        self.out.send(Ok(response)).await.map_err(|_| StreamOver)
    }

    async fn handle(
        &mut self,
        request: pb::AgentRequest,
        feed: &mut Feed,
    ) -> Result<(), StreamOver> {
        let id = request.request_id;
        // Every answer echoes the id: a huge one would make the answer outgrow the reply limit.
        if id.len() > MAX_REQUEST_ID_BYTES {
            let err = crate::Error::invalid(
                "request_id",
                format!(
                    "must be at most {MAX_REQUEST_ID_BYTES} bytes, got {}",
                    id.len()
                ),
            );
            let echoed = &id[..id.floor_char_boundary(MAX_REQUEST_ID_BYTES)];
            return self
                .send(echoed, Reply::Error(render::item_error(&err)))
                .await;
        }
        let result = match request.request {
            Some(pb::agent_request::Request::Submit(spec)) => self.submit(&id, spec, feed).await,
            Some(pb::agent_request::Request::Cancel(target)) => {
                self.cancel(&id, target, feed).await
            }
            Some(pb::agent_request::Request::Resume(resume)) => {
                self.resume(&id, resume, feed).await
            }
            None => Err(crate::Error::invalid(
                "request",
                "one of submit, cancel or resume is required",
            )),
        };
        match result {
            Ok(sent) => sent,
            Err(err) => self.send(&id, Reply::Error(render::item_error(&err))).await,
        }
    }

    /// `Err` refuses the request as a whole; `Ok(Err(StreamOver))` means the client went away.
    async fn submit(
        &mut self,
        id: &str,
        spec: pb::BatchSpec,
        feed: &mut Feed,
    ) -> Result<Result<(), StreamOver>> {
        let mut parsed = parse::batch("submit", Some(spec), self.broker.limits().max_input_bytes)?;
        parsed.batch.agent = self.agent.clone();
        let session = parsed.batch.session.clone();
        self.follow(&session, feed).await?;
        let mut report = self.broker.submit(parsed.batch).await?;
        self.broker.seal_outcomes(report.calls_mut()).await?;
        let response = render::submit_response(
            &report,
            session.as_str(),
            &parsed.refused,
            self.broker.limits().max_reply_bytes,
        );
        let mut sent = self.send(id, Reply::Submitted(response)).await;
        if sent.is_ok() {
            let followed_from = self.watched.get(&session).copied().unwrap_or(0);
            sent = self.send_decided_duplicates(&report, followed_from).await?;
        }
        Ok(sent)
    }

    /// Starts following `session` if the stream does not yet. Its outcomes committed so far are
    /// not pushed (a resume or a resubmit sends them explicitly); everything after is.
    async fn follow(&mut self, session: &SessionId, feed: &mut Feed) -> Result<()> {
        if !self.watched.contains_key(session) {
            self.check_room_to_follow()?;
            // The feed follows it before the watermark is read, so every event after the
            // watermark reaches the stream.
            feed.follow(session);
            let committed = self.broker.latest_seq().await?;
            self.watched.insert(session.clone(), committed);
        }
        Ok(())
    }

    /// Refuses to follow one more session past [`MAX_FOLLOWED_SESSIONS`]: one stream's memory
    /// stays bounded whatever its client sends.
    fn check_room_to_follow(&self) -> Result<()> {
        if self.watched.len() >= MAX_FOLLOWED_SESSIONS {
            return Err(crate::Error::ResourceExhausted(format!(
                "this stream already follows {MAX_FOLLOWED_SESSIONS} sessions; open another stream"
            )));
        }
        Ok(())
    }

    /// A resubmitted call that was decided before this stream followed its session creates no
    /// event the stream will see: send its outcome (and its batch's completion) here, as the
    /// agent would have received them live. Outcomes logged after `followed_from` reach the
    /// stream through the feed instead, so each is sent once.
    async fn send_decided_duplicates(
        &self,
        report: &SubmitReport,
        followed_from: u64,
    ) -> Result<Result<(), StreamOver>> {
        let logged = |c: &Call| {
            c.outcome
                .as_ref()
                .is_some_and(|o| o.is_logged_by(followed_from))
        };
        let mut batches: Vec<&BatchId> = Vec::new();
        for item in &report.items {
            if let SubmitResult::Duplicate(call) = &item.result
                && logged(call)
                && let Some(outcome) = render::outcome(call)
            {
                if self.send("", Reply::Outcome(outcome)).await.is_err() {
                    return Ok(Err(StreamOver));
                }
                if !batches.contains(&&call.batch_id) {
                    batches.push(&call.batch_id);
                }
            }
        }
        for batch in batches {
            let calls = self.broker.batch_calls(batch).await?;
            if calls.iter().all(logged)
                && let Some(complete) = render::batch_complete(&calls)
                && self.send("", Reply::BatchComplete(complete)).await.is_err()
            {
                return Ok(Err(StreamOver));
            }
        }
        Ok(Ok(()))
    }

    async fn cancel(
        &mut self,
        id: &str,
        target: pb::CancelTarget,
        feed: &mut Feed,
    ) -> Result<Result<(), StreamOver>> {
        let mut target = parse::cancel(Some(target), "cancel")?;
        target.agent = self.agent.clone();
        self.follow(&target.session, feed).await?;
        let mut report = self.broker.cancel(&target).await?;
        self.broker.seal_outcomes(report.calls_mut()).await?;
        Ok(self
            .send(
                id,
                Reply::Cancelled(render::cancel_result(
                    &report,
                    self.broker.limits().max_reply_bytes,
                )),
            )
            .await)
    }

    async fn resume(
        &mut self,
        id: &str,
        resume: pb::ResumeRequest,
        feed: &mut Feed,
    ) -> Result<Result<(), StreamOver>> {
        let session = parse::session("resume.session_id", resume.session_id)?;
        let named = parse::call_ids("resume.call_ids", resume.call_ids, true)?;
        let wanted = (!named.is_empty()).then(|| named.into_iter().collect::<HashSet<_>>());
        let followed = self.watched.get(&session).copied();
        if followed.is_none() {
            self.check_room_to_follow()?;
        }
        // Followed by the feed before `seq` is read: every event after `seq` reaches it.
        feed.follow(&session);
        let seq = self.broker.latest_seq().await?;
        // A whole-session resume sends every outcome up to `seq`, so the feed takes over after
        // it. A resume of named calls sends only those: a session the stream already follows
        // keeps its watermark, so the feed still pushes the other calls' outcomes.
        let from = match (&wanted, followed) {
            (None, Some(old)) => old.max(seq),
            (Some(_), Some(old)) => old,
            (_, None) => seq,
        };
        self.watched.insert(session.clone(), from);
        let mut replay = Replay::new(wanted.as_ref(), seq, true);
        let mut pages = SessionPages::new(&self.broker, &self.agent, &session);
        while let Some(calls) = pages.next().await? {
            for message in replay.page(calls) {
                let reply = match message {
                    Replayed::Outcome(outcome) => Reply::Outcome(outcome),
                    Replayed::BatchComplete(complete) => Reply::BatchComplete(complete),
                };
                if self.send("", reply).await.is_err() {
                    return Ok(Err(StreamOver));
                }
            }
        }
        let (pending, unknown) = replay.finish();
        let done = pb::ResumeDone {
            session_id: session.to_string(),
            pending_call_ids: pending.iter().map(ToString::to_string).collect(),
            unknown_call_ids: unknown.iter().map(ToString::to_string).collect(),
            truncated: false,
        };
        Ok(self.send(id, Reply::Resumed(done)).await)
    }

    /// Pushes an outcome of a followed session, and its batch's completion.
    async fn route(&mut self, event: &Event) -> Result<(), StreamOver> {
        if event.kind != EventKind::Resolved || event.call.key.agent != self.agent {
            return Ok(());
        }
        match self.watched.get(&event.call.key.session) {
            Some(&sent_up_to) if event.seq > sent_up_to => {}
            _ => return Ok(()),
        }
        if let Some(outcome) = render::outcome(&event.call) {
            self.send("", Reply::Outcome(outcome))
                .instrument(traces::outcome_delivery(&event.call))
                .await?;
        }
        if event.batch_completed {
            match completed_batch(&self.broker, event).await {
                Ok(calls) => {
                    if let Some(complete) = render::batch_complete(&calls) {
                        self.send("", Reply::BatchComplete(complete)).await?;
                    }
                }
                Err(err) => {
                    let _ = self.out.send(Err(err.into())).await;
                    return Err(StreamOver);
                }
            }
        }
        Ok(())
    }
}

/// The calls of the batch whose last outcome `event` is: the event's own call when the batch
/// has no other (most batches: one per tool call), without reading the store; else the
/// batch as the store holds it.
async fn completed_batch<'a>(broker: &Broker, event: &'a Event) -> Result<Cow<'a, [Call]>> {
    if event.call.batch_size == 1 {
        return Ok(Cow::Borrowed(std::slice::from_ref(&event.call)));
    }
    Ok(Cow::Owned(broker.batch_calls(&event.call.batch_id).await?))
}

/// How long a `WatchOutcomes` of named calls waits for those the session does not hold yet to
/// be submitted (documented on `CaughtUp.unknown_call_ids`).
pub const UNSUBMITTED_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// One `WatchOutcomes` stream.
struct OutcomeWatch {
    broker: Arc<Broker>,
    agent: AgentId,
    session: SessionId,
    wanted: Option<HashSet<CallId>>,
    out: Outbound<pb::WatchOutcomesResponse>,
    _slot: StreamSlot,
}

impl OutcomeWatch {
    async fn send(&self, event: pb::watch_outcomes_response::Event) -> Result<(), StreamOver> {
        use pb::watch_outcomes_response::Event as E;
        let event = match event {
            E::BatchComplete(c) => E::BatchComplete(render::fit_batch_complete(
                c,
                self.broker.limits().max_reply_bytes,
            )),
            other => other,
        };
        let message = pb::WatchOutcomesResponse { event: Some(event) };
        self.out.send(Ok(message)).await.map_err(|_| StreamOver)
    }

    async fn run(self, seq: u64) {
        use pb::watch_outcomes_response::Event as E;
        // Named calls pending as of `seq` are waited for; a whole-session watch lists none.
        let named = self.wanted.is_some();
        let mut replay = Replay::new(self.wanted.as_ref(), seq, named);
        let mut pages = SessionPages::new(&self.broker, &self.agent, &self.session);
        loop {
            let calls = match pages.next().await {
                Ok(Some(calls)) => calls,
                Ok(None) => break,
                Err(err) => {
                    let _ = self.out.send(Err(err.into())).await;
                    return;
                }
            };
            for message in replay.page(calls) {
                let event = match message {
                    Replayed::Outcome(outcome) => E::Outcome(outcome),
                    Replayed::BatchComplete(complete) => E::BatchComplete(complete),
                };
                if self.send(event).await.is_err() {
                    return;
                }
            }
        }
        let (pending, unknown) = replay.finish();
        // Named calls the session does not hold yet are said so, and waited for a bounded time:
        // an agent may well open its watch before it submits (the feed starts at `seq`, so a
        // submit after it is never missed). The watch ends once every named call it holds is
        // decided and the others were not submitted within the grace.
        let caught_up = pb::CaughtUp {
            unknown_call_ids: unknown.iter().map(ToString::to_string).collect(),
        };
        if self.send(E::CaughtUp(caught_up)).await.is_err() {
            return;
        }
        let mut waiting_for: HashSet<CallId> = pending.into_iter().collect();
        let mut unsubmitted: HashSet<CallId> = unknown.into_iter().collect();
        let grace = tokio::time::sleep(UNSUBMITTED_GRACE);
        tokio::pin!(grace);
        if named && waiting_for.is_empty() && unsubmitted.is_empty() {
            return;
        }
        let mut feed = self
            .broker
            .bus()
            .session_feed_after(&self.agent, &self.session, seq);
        loop {
            let delivery = tokio::select! {
                delivery = feed.next() => delivery,
                () = &mut grace, if !unsubmitted.is_empty() => {
                    unsubmitted.clear();
                    if waiting_for.is_empty() {
                        return;
                    }
                    continue;
                }
                _ = self.out.closed() => return,
                _ = self.broker.stopping() => {
                    let _ = self.out.send(Err(Status::unavailable(
                        "the broker is shutting down; reconnect and watch again",
                    ))).await;
                    return;
                }
            };
            let event = match delivery {
                Ok(delivery) => delivery.event,
                Err(err) => {
                    let _ = self.out.send(Err(err.into())).await;
                    return;
                }
            };
            let call = &event.call;
            if call.key.agent != self.agent
                || call.key.session != self.session
                || self
                    .wanted
                    .as_ref()
                    .is_some_and(|w| !w.contains(&call.key.call_id))
            {
                continue;
            }
            // A named call submitted after the watch began: waited for like the others now.
            if unsubmitted.remove(&call.key.call_id) {
                waiting_for.insert(call.key.call_id.clone());
            }
            if event.kind != EventKind::Resolved {
                continue;
            }
            if let Some(outcome) = render::outcome(call)
                && self
                    .send(E::Outcome(outcome))
                    .instrument(traces::outcome_delivery(call))
                    .await
                    .is_err()
            {
                return;
            }
            if event.batch_completed {
                match completed_batch(&self.broker, &event).await {
                    Ok(calls) => {
                        if let Some(complete) = render::batch_complete(&calls)
                            && self.send(E::BatchComplete(complete)).await.is_err()
                        {
                            return;
                        }
                    }
                    Err(err) => {
                        let _ = self.out.send(Err(err.into())).await;
                        return;
                    }
                }
            }
            waiting_for.remove(&call.key.call_id);
            if named && waiting_for.is_empty() && unsubmitted.is_empty() {
                return;
            }
        }
    }
}
