//! ApproverService: what approver UIs watch (`Subscribe`), page through (`ListPending`) and
//! decide (`Decide`).
//!
//! Every call these return is one the caller may see ([`Call::visible_to`], asked of the
//! caller's [`Viewer`]): the others are left out of snapshots, live events, pages and replies,
//! and `GetReceipt` answers NOT_FOUND for them exactly as for an unknown call.
//!
//! [`Call::visible_to`]: crate::domain::Call::visible_to
//!
//! A subscriber's stream has a bounded queue. Catch-up (snapshot pages, events after a cursor)
//! waits for the client; a live event that finds the queue full ends the stream with
//! RESOURCE_EXHAUSTED naming the last sequence number queued, so the UI resumes from there:
//! never a silent drop, never unbounded memory. That status, and the one a shutdown ends the
//! stream with, travel beside the queue (see [`queue`]): however long the client leaves its
//! window closed, it gets every queued event and then the status, with the resume position in
//! the `approvals-last-seq` trailer.

use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use super::queue::{self, Full};
use super::{StreamOver, decide, paging, parse, passkey_messages, render};
use crate::background::events::Feed;
use crate::broker::Broker;
use crate::domain::{CallQuery, EventKind, Status as CallStatus, Viewer};
use crate::door::auth::Caller;
use crate::error::{Error, Result};
use crate::observe::meters;
use crate::proto::v1 as pb;
use crate::proto::v1::approver_event::Event as E;

/// The trailer naming the last sequence number delivered to a subscriber whose stream the broker
/// ended (it fell behind, or the broker is shutting down): resume with `after_seq` set to it.
pub const LAST_SEQ_TRAILER: &str = "approvals-last-seq";

/// The header every subscription opens with, at once, before any event: the log's last sequence
/// number when it began. Every matching event up to it comes first; a client that resumed at or
/// after it is caught up already, and knows so without waiting for an event that, on a quiet
/// broker, may not come for a long time.
pub const LATEST_SEQ_HEADER: &str = "approvals-latest-seq";

pub struct ApproverApi {
    broker: Arc<Broker>,
    /// Web Push subscriptions (`crate::background::push`); `None` when push is off.
    push: Option<Arc<crate::background::push::Registry>>,
}

impl ApproverApi {
    pub fn new(broker: Arc<Broker>) -> Self {
        Self { broker, push: None }
    }

    /// Serves the push RPCs with `push` (`None`: they answer FAILED_PRECONDITION).
    pub fn with_push(mut self, push: Option<Arc<crate::background::push::Registry>>) -> Self {
        self.push = push;
        self
    }

    fn push(&self) -> Result<&crate::background::push::Registry> {
        self.push.as_deref().ok_or_else(|| {
            Error::FailedPrecondition("Web Push is off on this broker (--push)".into())
        })
    }
}

/// Who owns a push subscription: the token's identity, `anonymous` while auth is off.
fn push_owner(caller: &Caller) -> String {
    match caller {
        Caller::Anonymous => "anonymous".to_owned(),
        Caller::Authenticated { identity, .. } => identity.to_string(),
    }
}

#[tonic::async_trait]
impl pb::approver_service_server::ApproverService for ApproverApi {
    type SubscribeStream = queue::Receiver<pb::ApproverEvent>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let slot = self.broker.open_subscriber()?;
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let filter = parse::filter("filter.", req.filter)?;
        let latest = self.broker.latest_seq().await?;
        if let Some(after) = req.after_seq
            && after > latest
        {
            return Err(Error::invalid(
                "after_seq",
                format!("{after} is beyond the last event of this broker ({latest})"),
            )
            .into());
        }
        if let Some(after) = req.after_seq {
            self.broker.refuse_pruned(after).await?;
        }
        let (out, rx) = queue::channel(self.broker.limits().subscriber_buffer, slot);
        let subscriber = Subscriber {
            broker: Arc::clone(&self.broker),
            viewer: caller.viewer(),
            filter,
            out,
            last_queued: req.after_seq.unwrap_or(latest),
        };
        tokio::spawn(subscriber.run(req.after_seq.is_none()).in_current_span());
        let mut response = Response::new(rx);
        response
            .metadata_mut()
            .insert(LATEST_SEQ_HEADER, latest.into());
        Ok(response)
    }

    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let (key, decision) = decide::request(&self.broker, request)?;
        let report = self.broker.decide(&key, &decision).await?;
        Ok(decide::reply(&self.broker, report, &decision.viewer))
    }

    async fn preview_decision(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let (key, decision) = decide::request(&self.broker, request)?;
        if decision.remember.is_none() {
            return Err(crate::error::Error::invalid(
                "scope",
                "a preview is of a decision remembered with SCOPE_SESSION, SCOPE_WORKSPACE or \
                 SCOPE_ALWAYS",
            )
            .into());
        }
        let report = self.broker.preview_decide(&key, &decision).await?;
        Ok(decide::reply(&self.broker, report, &decision.viewer))
    }

    async fn create_call_link(
        &self,
        request: Request<pb::CreateCallLinkRequest>,
    ) -> Result<Response<pb::CreateCallLinkResponse>, Status> {
        let viewer = Caller::of(&request).viewer();
        let req = request.into_inner();
        let key = parse::call_key(req.agent, req.session_id, req.call_id)?;
        let made = self.broker.make_link(&key, &viewer).await?;
        Ok(Response::new(pb::CreateCallLinkResponse {
            link: made.link.token(),
            url: made.url.unwrap_or_default(),
            expires_at: Some(render::timestamp(crate::domain::Timestamp::from_micros(
                made.link.expires.saturating_mul(1_000_000),
            ))),
        }))
    }

    async fn open_call_link(
        &self,
        request: Request<pb::OpenCallLinkRequest>,
    ) -> Result<Response<pb::OpenCallLinkResponse>, Status> {
        let viewer = Caller::of(&request).viewer();
        let link = crate::door::links::CallLink::parse("link", &request.into_inner().link)?;
        let call = self.broker.open_link(&link, &viewer).await?;
        Ok(Response::new(pb::OpenCallLinkResponse {
            call: Some(render::call(&call)),
        }))
    }

    async fn list_pending(
        &self,
        request: Request<pb::ListPendingRequest>,
    ) -> Result<Response<pb::ListPendingResponse>, Status> {
        let viewer = Caller::of(&request).viewer();
        let req = request.into_inner();
        let mut query = parse::filter("filter.", req.filter)?;
        parse::page(&mut query, req.page_size, &req.page_token)?;
        query.statuses = vec![CallStatus::Pending];
        let limit = self.broker.limits().max_reply_bytes;
        let page = paging::calls(&self.broker, &query, limit, |c| c.visible_to(&viewer)).await?;
        Ok(Response::new(pb::ListPendingResponse {
            calls: page.items,
            next_page_token: parse::page_token(page.next),
        }))
    }

    async fn get_receipt(
        &self,
        request: Request<pb::GetReceiptRequest>,
    ) -> Result<Response<pb::GetReceiptResponse>, Status> {
        let viewer = Caller::of(&request).viewer();
        let req = request.into_inner();
        let key = parse::call_key(req.agent, req.session_id, req.call_id)?;
        let receipt = self.broker.receipt(&key, &viewer).await?;
        Ok(Response::new(render::receipt_response(
            &receipt,
            self.broker.receipt_key().as_ref(),
        )))
    }

    async fn list_receipt_keys(
        &self,
        _request: Request<pb::ListReceiptKeysRequest>,
    ) -> Result<Response<pb::ListReceiptKeysResponse>, Status> {
        Ok(Response::new(render::receipt_keys(
            self.broker.receipt_keys(),
            self.broker.receipt_key().as_ref(),
        )))
    }

    async fn get_push_key(
        &self,
        _request: Request<pb::GetPushKeyRequest>,
    ) -> Result<Response<pb::GetPushKeyResponse>, Status> {
        Ok(Response::new(pb::GetPushKeyResponse {
            vapid_public_key: self.push()?.public_key().to_owned(),
        }))
    }

    async fn add_push_subscription(
        &self,
        request: Request<pb::AddPushSubscriptionRequest>,
    ) -> Result<Response<pb::AddPushSubscriptionResponse>, Status> {
        let caller = Caller::of(&request);
        let r = request.into_inner();
        self.push()?
            .add(
                &push_owner(&caller),
                &caller.viewer(),
                &r.endpoint,
                &r.p256dh,
                &r.auth,
            )
            .await?;
        Ok(Response::new(pb::AddPushSubscriptionResponse {}))
    }

    async fn remove_push_subscription(
        &self,
        request: Request<pb::RemovePushSubscriptionRequest>,
    ) -> Result<Response<pb::RemovePushSubscriptionResponse>, Status> {
        let caller = Caller::of(&request);
        let endpoint = request.into_inner().endpoint;
        let removed = self.push()?.remove(&push_owner(&caller), &endpoint).await?;
        Ok(Response::new(pb::RemovePushSubscriptionResponse {
            removed,
        }))
    }

    async fn begin_passkey_registration(
        &self,
        request: Request<pb::BeginPasskeyRegistrationRequest>,
    ) -> Result<Response<pb::BeginPasskeyRegistrationResponse>, Status> {
        let owner = passkey_messages::owner(&Caller::of(&request))?;
        let (registration_id, options_json) =
            self.broker.begin_passkey_registration(&owner).await?;
        Ok(Response::new(pb::BeginPasskeyRegistrationResponse {
            registration_id,
            options_json,
        }))
    }

    async fn finish_passkey_registration(
        &self,
        request: Request<pb::FinishPasskeyRegistrationRequest>,
    ) -> Result<Response<pb::Passkey>, Status> {
        let owner = passkey_messages::owner(&Caller::of(&request))?;
        let req = request.into_inner();
        let name = passkey_messages::name("name", req.name)?;
        let passkey = self
            .broker
            .finish_passkey_registration(&owner, &req.registration_id, &req.credential_json, &name)
            .await?;
        Ok(Response::new(passkey_messages::passkey(&passkey)))
    }

    async fn list_my_passkeys(
        &self,
        request: Request<pb::ListMyPasskeysRequest>,
    ) -> Result<Response<pb::ListMyPasskeysResponse>, Status> {
        let owner = passkey_messages::owner(&Caller::of(&request))?;
        let passkeys = self.broker.passkeys(Some(&owner)).await?;
        Ok(Response::new(pb::ListMyPasskeysResponse {
            passkeys: passkeys.iter().map(passkey_messages::passkey).collect(),
        }))
    }

    async fn begin_step_up(
        &self,
        request: Request<pb::BeginStepUpRequest>,
    ) -> Result<Response<pb::BeginStepUpResponse>, Status> {
        let caller = Caller::of(&request);
        let req = request.into_inner();
        let key = parse::call_key(req.agent, req.session_id, req.call_id)?;
        let edited = match req.edited_input_json.as_str() {
            "" => None,
            text => Some(crate::domain::ToolInput::parse(
                "edited_input_json",
                text,
                self.broker.limits().max_input_bytes,
            )?),
        };
        let asker = crate::broker::StepUpAsker {
            approver: caller.approver(req.approver)?,
            groups: caller.groups(),
            viewer: caller.viewer(),
        };
        let offer = self.broker.begin_step_up(&key, &asker, edited).await?;
        Ok(Response::new(passkey_messages::step_up_offer(offer)))
    }
}

struct Subscriber {
    broker: Arc<Broker>,
    /// Who subscribed: calls they may not see (their groups may not decide them) are left out
    /// of the snapshot and the events alike.
    viewer: Viewer,
    filter: CallQuery,
    out: queue::Sender<pb::ApproverEvent>,
    /// The sequence number of the last event queued for the client.
    last_queued: u64,
}

impl Subscriber {
    async fn run(mut self, with_snapshot: bool) {
        let snapshot_seq = self.last_queued;
        if with_snapshot && self.send_snapshot(snapshot_seq).await.is_err() {
            return;
        }
        let mut feed = self.broker.bus().feed_after(snapshot_seq);
        let _ = self.follow(&mut feed).await;
    }

    /// Every pending call that matches, as of `seq`, then the marker.
    async fn send_snapshot(&mut self, seq: u64) -> Result<(), StreamOver> {
        let mut query = self.filter.clone();
        query.statuses = vec![CallStatus::Pending];
        query.requested_at_or_before = Some(seq);
        query.limit = 256;
        let mut pending = 0u64;
        loop {
            let page = match self.broker.list_calls(&query).await {
                Ok(page) => page,
                Err(err) => return self.fail(err.into()),
            };
            let viewer = self.viewer.clone();
            for call in page.calls.iter().filter(|c| c.visible_to(&viewer)) {
                pending += 1;
                self.queue(seq, E::Snapshot(render::call(call))).await?;
            }
            match page.next {
                Some(cursor) => query.after = Some(cursor),
                None => break,
            }
        }
        self.queue(seq, E::SnapshotComplete(pb::SnapshotComplete { pending }))
            .await
    }

    async fn follow(&mut self, feed: &mut Feed) -> Result<(), StreamOver> {
        let broker = Arc::clone(&self.broker);
        loop {
            let delivery = tokio::select! {
                delivery = feed.next() => delivery,
                _ = self.out.closed() => return Err(StreamOver),
                _ = broker.stopping() => {
                    let status = self.resume_status(tonic::Code::Unavailable, format!(
                        "the broker is shutting down; resume with after_seq={}",
                        self.last_queued
                    ));
                    return self.fail(status);
                }
            };
            let delivery = match delivery {
                Ok(delivery) => delivery,
                Err(err) => return self.fail(err.into()),
            };
            let event = &delivery.event;
            if !self.filter.matches(&event.call) || !event.call.visible_to(&self.viewer) {
                continue;
            }
            let item = match event.kind {
                EventKind::Requested => E::Requested(render::call(&event.call)),
                EventKind::Resolved => match render::outcome_unsealed(&event.call) {
                    Some(outcome) => E::Resolved(outcome),
                    None => continue,
                },
                EventKind::Reminded | EventKind::Escalated => {
                    match super::escalation_messages::fired(event) {
                        Some(fired) => E::Escalation(fired),
                        None => continue,
                    }
                }
                EventKind::ApprovalRecorded => E::ApprovalRecorded(render::call(&event.call)),
            };
            if delivery.live {
                self.offer(event.seq, item).await?;
            } else {
                self.queue(event.seq, item).await?;
            }
        }
    }

    fn message(seq: u64, event: E) -> pb::ApproverEvent {
        pb::ApproverEvent {
            seq,
            event: Some(event),
        }
    }

    /// Queues an item, waiting for room (catch-up reads pace themselves to the client).
    async fn queue(&mut self, seq: u64, event: E) -> Result<(), StreamOver> {
        meters::subscriber_lag(self.broker.bus().published().saturating_sub(seq));
        self.out
            .send(Self::message(seq, event))
            .await
            .map_err(|_| StreamOver)?;
        self.last_queued = seq;
        Ok(())
    }

    /// Queues a live item if there is room; otherwise the subscriber has fallen too far behind.
    async fn offer(&mut self, seq: u64, event: E) -> Result<(), StreamOver> {
        meters::subscriber_lag(self.broker.bus().published().saturating_sub(seq));
        match self.out.try_send(Self::message(seq, event)) {
            Ok(()) => {
                self.last_queued = seq;
                Ok(())
            }
            Err(Full::Closed) => Err(StreamOver),
            Err(Full::Full) => {
                let status = self.resume_status(
                    tonic::Code::ResourceExhausted,
                    format!(
                        "subscriber fell behind: {} events were waiting to be read; \
                         resume with after_seq={}",
                        self.out.capacity(),
                        self.last_queued
                    ),
                );
                tracing::info!(
                    last_seq = self.last_queued,
                    "ending a subscriber that fell behind"
                );
                self.fail(status)
            }
        }
    }

    /// A status ending the stream, with the position to resume from in the
    /// [`LAST_SEQ_TRAILER`] (the message says it too, for people reading it).
    fn resume_status(&self, code: tonic::Code, message: String) -> Status {
        let mut status = Status::new(code, message);
        if let Ok(value) = MetadataValue::try_from(self.last_queued.to_string()) {
            status.metadata_mut().insert(LAST_SEQ_TRAILER, value);
        }
        status
    }

    /// Ends the stream with `status`, after the events already queued. It does not wait for
    /// the client: the status is kept beside the queue until the client reads it, however long
    /// that takes.
    fn fail(&mut self, status: Status) -> Result<(), StreamOver> {
        self.out.end(status);
        Err(StreamOver)
    }
}
