//! ApproverService: what approver UIs watch (`Subscribe`, served in `subscribe.rs`), page
//! through (`ListPending`) and decide (`Decide`). The Decide edge is here whole: the request read
//! into a domain [`Decision`] (with auth on, the token says who decides, with which groups,
//! seeing what; the request cannot), `Broker::decide`, and the report filtered to what the
//! approver may see and rendered within the reply limit. The rest of the path is in
//! `docs/architecture.md` ("One decision").
//!
//! Every call these return is one the caller may see ([`Call::visible_to`], asked of the
//! caller's [`Viewer`]): the others are left out of snapshots, live events, pages and replies,
//! and `GetReceipt` answers NOT_FOUND for them exactly as for an unknown call.
//!
//! [`Call::visible_to`]: crate::domain::Call::visible_to

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use super::oversize::Room;
use super::parse::{MAX_REASON_BYTES, grant_lifetime, line, matcher, scope, text};
use super::render::{call, grant, outcome_unsealed};
use super::subscribe::Subscriber;
use super::{paging, parse, passkey_messages, queue, render};
use crate::broker::Broker;
use crate::domain::policy::{Remember, Scope};
use crate::domain::{
    AgentId, CallId, CallKey, DecideReport, Decision, SessionId, Status as CallStatus, Timestamp,
    ToolInput, Verdict, Viewer,
};
use crate::door::auth::Caller;
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

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
        let (key, decision) = decide_request(&self.broker, request)?;
        let report = self.broker.decide(&key, &decision).await?;
        Ok(decide_reply(&self.broker, report, &decision.viewer))
    }

    async fn preview_decision(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let (key, decision) = decide_request(&self.broker, request)?;
        if decision.remember.is_none() {
            return Err(crate::error::Error::invalid(
                "scope",
                "a preview is of a decision remembered with SCOPE_SESSION, SCOPE_WORKSPACE or \
                 SCOPE_ALWAYS",
            )
            .into());
        }
        let report = self.broker.preview_decide(&key, &decision).await?;
        Ok(decide_reply(&self.broker, report, &decision.viewer))
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
        super::receipt(&self.broker, &key, &viewer).await
    }

    async fn list_receipt_keys(
        &self,
        _request: Request<pb::ListReceiptKeysRequest>,
    ) -> Result<Response<pb::ListReceiptKeysResponse>, Status> {
        Ok(super::receipt_keys(&self.broker))
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

/// A Decide (or PreviewDecision) request as the broker takes it: with auth on, the token says
/// who decides, with which groups, seeing what; the request cannot.
fn decide_request(
    broker: &Broker,
    request: Request<pb::DecideRequest>,
) -> std::result::Result<(CallKey, Decision), Status> {
    let caller = Caller::of(&request);
    let mut req = request.into_inner();
    let passkey = req.passkey.take();
    let (key, mut decision) = decision(req, broker.limits().max_input_bytes)?;
    decision.approver = caller.approver(decision.approver)?;
    decision.approver_groups = caller.groups();
    decision.viewer = caller.viewer();
    if let Some(assertion) = passkey {
        let approves = decision.verdict == Verdict::Approve;
        decision.passkey = Some(passkey_messages::assertion(
            assertion,
            approves,
            broker.relying_party()?,
        )?);
    }
    Ok((key, decision))
}

/// The reply to a decision: the siblings a denial skipped, and the calls a new grant decided,
/// told only as far as the approver (`viewer`) may see them.
fn decide_reply(
    broker: &Broker,
    mut report: DecideReport,
    viewer: &Viewer,
) -> Response<pb::DecideResponse> {
    report.skipped.retain(|c| c.visible_to(viewer));
    report.decided_by_grant.retain(|c| c.visible_to(viewer));
    Response::new(response(
        &report,
        Timestamp::now(),
        broker.limits().max_reply_bytes,
    ))
}

/// A DecideRequest read into the call it names and a validated [`Decision`] (verdict, reason,
/// edited input, what to remember), refusing bad combinations. Who decides, with which groups,
/// is the request's here; [`request`] sets them from the token. Slack's clicks are read here too.
pub fn decision(req: pb::DecideRequest, max_input_bytes: usize) -> Result<(CallKey, Decision)> {
    let key = CallKey {
        agent: AgentId::parse_or_default("agent", req.agent)?,
        session: SessionId::parse("session_id", req.session_id)?,
        call_id: CallId::parse("call_id", req.call_id)?,
    };
    let (verdict, responds) = match pb::Decision::try_from(req.decision) {
        Ok(pb::Decision::Approve) => (Verdict::Approve, false),
        Ok(pb::Decision::Deny) => (Verdict::Deny, false),
        Ok(pb::Decision::Respond) => (Verdict::Deny, true),
        Ok(pb::Decision::Unspecified) => {
            return Err(Error::invalid(
                "decision",
                "must be DECISION_APPROVE, DECISION_DENY or DECISION_RESPOND",
            ));
        }
        Err(_) => {
            return Err(Error::invalid(
                "decision",
                format!("unknown value {}", req.decision),
            ));
        }
    };
    let response = respond_message(responds, req.response, &req.reason, req.scope)?;
    let edited_input = if req.edited_input_json.is_empty() {
        None
    } else if verdict == Verdict::Deny {
        return Err(Error::invalid(
            "edited_input_json",
            "is only allowed with DECISION_APPROVE",
        ));
    } else {
        Some(ToolInput::parse(
            "edited_input_json",
            &req.edited_input_json,
            max_input_bytes,
        )?)
    };
    // Required unless a token names the approver; see `auth::Caller::approver`.
    let approver = line("approver", req.approver, 256)?;
    // A response's message is the outcome's reason: what the receipt and the audit record.
    let reason = match response {
        Some(message) => message,
        None => text("reason", req.reason, MAX_REASON_BYTES)?,
    };
    let scope = scope("scope", req.scope)?;
    let remember = if scope == Scope::Once {
        if req.matcher.is_some() {
            return Err(Error::invalid(
                "matcher",
                "is only for a decision remembered with a scope other than SCOPE_ONCE",
            ));
        }
        if req.grant_expires_in.is_some() {
            return Err(Error::invalid(
                "grant_expires_in",
                "is only for a decision remembered with a scope other than SCOPE_ONCE",
            ));
        }
        None
    } else {
        if edited_input.is_some() {
            return Err(Error::invalid(
                "scope",
                "a decision with edited_input_json cannot be remembered (the grant would run \
                 later calls' own inputs, not the edit); decide it SCOPE_ONCE",
            ));
        }
        Some(Remember {
            scope,
            matcher: matcher("matcher", req.matcher, max_input_bytes, true)?,
            expires_in: req
                .grant_expires_in
                .map(|d| grant_lifetime("grant_expires_in", d))
                .transpose()?,
        })
    };
    Ok((
        key,
        Decision {
            verdict,
            reason,
            edited_input,
            approver,
            // The token's, set by the service (see `auth::Caller::groups`).
            approver_groups: None,
            viewer: crate::domain::Viewer::Operator,
            remember,
            responds,
            prejudged: Default::default(),
            // The assertion, with the relying party, set by the service (see
            // `passkey_messages::assertion`).
            passkey: None,
        },
    ))
}

/// The message of a DECISION_RESPOND (required, not blank, and not remembered: it answers this
/// call only), `None` for another decision, which may not carry one.
fn respond_message(
    responds: bool,
    response: String,
    reason: &str,
    scope: i32,
) -> Result<Option<String>> {
    if !responds {
        if !response.is_empty() {
            return Err(Error::invalid(
                "response",
                "is only for DECISION_RESPOND (a denial's reason goes in `reason`)",
            ));
        }
        return Ok(None);
    }
    let response = text("response", response, MAX_REASON_BYTES)?;
    if response.trim().is_empty() {
        return Err(Error::invalid(
            "response",
            "is required with DECISION_RESPOND: the message for the model, not empty",
        ));
    }
    if !reason.is_empty() {
        return Err(Error::invalid(
            "reason",
            "is not used with DECISION_RESPOND: the message goes in `response`",
        ));
    }
    if !matches!(
        pb::Scope::try_from(scope),
        Ok(pb::Scope::Unspecified | pb::Scope::Once)
    ) {
        return Err(Error::invalid(
            "scope",
            "a response answers this call only: DECISION_RESPOND is SCOPE_ONCE",
        ));
    }
    Ok(Some(response))
}

/// What a decision did: the outcome that stands and its grant, then the outcomes it skipped and
/// its grant decided that fit in `reply_limit`.
fn response(report: &DecideReport, now: Timestamp, reply_limit: usize) -> pb::DecideResponse {
    let decided = outcome_unsealed(&report.call);
    let grant = report.grant.as_ref().map(|g| grant(g, now));
    let mut room = Room::new(reply_limit);
    decided.iter().for_each(|o| room.charge(o));
    grant.iter().for_each(|g| room.charge(g));
    let (skipped, all_skipped) = room.fill(report.skipped.iter().filter_map(outcome_unsealed));
    let (decided_by_grant, all_by_grant) =
        room.fill(report.decided_by_grant.iter().filter_map(outcome_unsealed));
    pb::DecideResponse {
        outcome: decided,
        replayed: report.replayed,
        skipped,
        grant,
        decided_by_grant,
        skipped_count: report.skipped.len() as u64,
        decided_by_grant_count: report.decided_by_grant.len() as u64,
        truncated: !(all_skipped && all_by_grant),
        // A vote that left the call pending: the call, with its votes so far.
        pending: report.call.outcome.is_none().then(|| call(&report.call)),
        grant_note: report.grant_note.clone().unwrap_or_default(),
    }
}
