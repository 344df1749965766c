//! AdminService: the operators' audit view of every call and outcome, and the grants and
//! policy rules that decide calls without a human. Its reads of calls ask the caller's
//! [`Viewer`](crate::domain::Viewer) as every read does; an admin (the only role admitted here)
//! sees every call, so they leave nothing out today, and would if the service ever admitted
//! another role.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::oversize::{self, Room};
use super::webhook_messages::{self as hooks, Secret};
use super::{paging, parse, passkey_messages, render, shadow_messages};
use crate::broker::{BackupName, Broker};
use crate::domain::Timestamp;
use crate::domain::policy::ExplainTarget;
use crate::door::auth::Caller;
use crate::proto::v1 as pb;

pub struct AdminApi {
    broker: Arc<Broker>,
}

impl AdminApi {
    pub fn new(broker: Arc<Broker>) -> Self {
        Self { broker }
    }
}

#[tonic::async_trait]
impl pb::admin_service_server::AdminService for AdminApi {
    async fn list_calls(
        &self,
        request: Request<pb::ListCallsRequest>,
    ) -> Result<Response<pb::ListCallsResponse>, Status> {
        let viewer = Caller::of(&request).viewer();
        let req = request.into_inner();
        let mut query = parse::filter(
            "",
            Some(pb::CallFilter {
                session_id: req.session_id,
                workspace: String::new(),
                tool: req.tool,
                agent: req.agent,
            }),
        )?;
        query.statuses = parse::statuses("statuses", req.statuses)?;
        query.created_after = parse::time_bound("created_after", req.created_after)?;
        query.created_before = parse::time_bound("created_before", req.created_before)?;
        query.decided_by = parse::decided_by("decided_by", req.decided_by)?;
        query.newest_first = req.newest_first;
        parse::page(&mut query, req.page_size, &req.page_token)?;
        let page = paging::calls(
            &self.broker,
            &query,
            self.broker.limits().max_reply_bytes,
            |c| c.visible_to(&viewer),
        )
        .await?;
        Ok(Response::new(pb::ListCallsResponse {
            calls: page.items,
            next_page_token: parse::page_token(page.next),
        }))
    }

    async fn get_call(
        &self,
        request: Request<pb::GetCallRequest>,
    ) -> Result<Response<pb::Call>, Status> {
        let viewer = Caller::of(&request).viewer();
        let req = request.into_inner();
        let key = parse::call_key(req.agent, req.session_id, req.call_id)?;
        let (call, shadow) = self.broker.audited_call(&key, &viewer).await?;
        Ok(Response::new(pb::Call {
            shadow_verdicts: shadow_messages::shadow_verdicts(&shadow),
            ..render::call(&call)
        }))
    }

    async fn list_grants(
        &self,
        request: Request<pb::ListGrantsRequest>,
    ) -> Result<Response<pb::ListGrantsResponse>, Status> {
        let mut query = parse::list_grants(request.into_inner())?;
        let now = Timestamp::now();
        query.now = Some(now);
        let page = paging::grants(
            &self.broker,
            &query,
            self.broker.limits().max_reply_bytes,
            now,
        )
        .await?;
        Ok(Response::new(pb::ListGrantsResponse {
            grants: page.items,
            next_page_token: parse::page_token(page.next),
        }))
    }

    async fn revoke_grant(
        &self,
        request: Request<pb::RevokeGrantRequest>,
    ) -> Result<Response<pb::RevokeGrantResponse>, Status> {
        let by = Caller::of(&request).admin_identity();
        let target = parse::revoke_target(request.into_inner())?;
        let report = self.broker.revoke_grants(&target, &by).await?;
        let now = Timestamp::now();
        let mut room = Room::new(self.broker.limits().max_reply_bytes);
        let (grants, all) = room.fill(report.grants.iter().map(|g| render::grant(g, now)));
        Ok(Response::new(pb::RevokeGrantResponse {
            revoked: report.revoked as u32,
            grants,
            truncated: !all,
        }))
    }

    async fn create_rule(
        &self,
        request: Request<pb::CreateRuleRequest>,
    ) -> Result<Response<pb::Rule>, Status> {
        let rule = parse::rule(
            "rule",
            request.into_inner().rule,
            self.broker.limits().max_input_bytes,
        )?;
        let stored = self.broker.create_rule(&rule).await?;
        Ok(Response::new(render::rule(&stored)))
    }

    async fn list_rules(
        &self,
        request: Request<pb::ListRulesRequest>,
    ) -> Result<Response<pb::ListRulesResponse>, Status> {
        let req = request.into_inner();
        let rules = self.broker.list_rules().await?;
        let (rules, next_page_token) = paging::rules(
            rules,
            req.page_size,
            &req.page_token,
            self.broker.limits().max_reply_bytes,
        )?;
        Ok(Response::new(pb::ListRulesResponse {
            rules,
            next_page_token,
        }))
    }

    async fn delete_rule(
        &self,
        request: Request<pb::DeleteRuleRequest>,
    ) -> Result<Response<pb::Rule>, Status> {
        let id = parse::rule_id("id", &request.into_inner().id)?;
        let deleted = self.broker.delete_rule(&id).await?;
        Ok(Response::new(render::rule(&deleted)))
    }

    async fn explain(
        &self,
        request: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::ExplainResponse>, Status> {
        let viewer = Caller::of(&request).viewer();
        let target = parse::explain(request.into_inner(), self.broker.limits().max_input_bytes)?;
        if let ExplainTarget::Stored(key) = &target {
            self.broker.require_visible(key, &viewer).await?;
        }
        let explanation = self.broker.explain(&target).await?;
        let reply = render::explanation(&explanation, Timestamp::now());
        Ok(Response::new(oversize::fit_explanation(
            reply,
            self.broker.limits().max_reply_bytes,
        )))
    }

    async fn set_rule_mode(
        &self,
        request: Request<pb::SetRuleModeRequest>,
    ) -> Result<Response<pb::Rule>, Status> {
        let (id, mode) = shadow_messages::set_rule_mode(request.into_inner())?;
        let rule = self.broker.set_rule_mode(&id, mode).await?;
        Ok(Response::new(render::rule(&rule)))
    }

    async fn replay_rule(
        &self,
        request: Request<pb::ReplayRuleRequest>,
    ) -> Result<Response<pb::ReplayRuleResponse>, Status> {
        let req = shadow_messages::replay_request(
            request.into_inner(),
            self.broker.limits().max_input_bytes,
        )?;
        let page = self
            .broker
            .replay_rule(&req.candidate, req.range, req.limit, req.after)
            .await?;
        Ok(Response::new(shadow_messages::replay_response(&page)))
    }

    async fn create_webhook(
        &self,
        request: Request<pb::CreateWebhookRequest>,
    ) -> Result<Response<pb::Webhook>, Status> {
        let hook = hooks::new_webhook(request.into_inner())?;
        let stored = self.broker.create_webhook(hook).await?;
        Ok(Response::new(hooks::webhook(&stored, Secret::Reveal)))
    }

    async fn list_webhooks(
        &self,
        _request: Request<pb::ListWebhooksRequest>,
    ) -> Result<Response<pb::ListWebhooksResponse>, Status> {
        let webhooks = self.broker.webhooks().await?;
        Ok(Response::new(pb::ListWebhooksResponse {
            webhooks: webhooks
                .iter()
                .map(|h| hooks::webhook(h, Secret::Mask))
                .collect(),
        }))
    }

    async fn update_webhook(
        &self,
        request: Request<pb::UpdateWebhookRequest>,
    ) -> Result<Response<pb::Webhook>, Status> {
        let (id, change) = hooks::change(request.into_inner())?;
        let secret = if change.secret.is_some() {
            Secret::Reveal
        } else {
            Secret::Mask
        };
        let stored = self.broker.update_webhook(&id, change).await?;
        Ok(Response::new(hooks::webhook(&stored, secret)))
    }

    async fn delete_webhook(
        &self,
        request: Request<pb::DeleteWebhookRequest>,
    ) -> Result<Response<pb::Webhook>, Status> {
        let id = hooks::webhook_id("id", &request.into_inner().id)?;
        let deleted = self.broker.delete_webhook(&id).await?;
        Ok(Response::new(hooks::webhook(&deleted, Secret::Mask)))
    }

    async fn send_test_event(
        &self,
        request: Request<pb::SendTestEventRequest>,
    ) -> Result<Response<pb::SendTestEventResponse>, Status> {
        let id = hooks::webhook_id("id", &request.into_inner().id)?;
        let sent = self.broker.send_test_event(&id).await?;
        let reply = pb::SendTestEventResponse {
            delivered: sent.delivered.is_ok(),
            message_id: sent.message_id,
            error: sent.delivered.err().unwrap_or_default(),
        };
        Ok(Response::new(reply))
    }

    async fn backup(
        &self,
        request: Request<pb::BackupRequest>,
    ) -> Result<Response<pb::BackupResponse>, Status> {
        let name = BackupName::parse("name", request.into_inner().name)?;
        let report = self.broker.backup(&name).await?;
        Ok(Response::new(pb::BackupResponse {
            path: report.path.display().to_string(),
            bytes: report.bytes,
        }))
    }

    async fn export_receipts(
        &self,
        request: Request<pb::ExportReceiptsRequest>,
    ) -> Result<Response<pb::ExportReceiptsResponse>, Status> {
        let viewer = Caller::of(&request).viewer();
        let req = request.into_inner();
        let page_size = parse::receipts_page_size(req.page_size)?;
        let key = self.broker.receipt_key().as_ref().map(render::receipt_key);
        let mut room = Room::new(self.broker.limits().max_reply_bytes);
        if let Some(key) = &key {
            room.charge(key);
        }
        let receipts = self
            .broker
            .receipts_after(req.after_sequence, page_size, &viewer)
            .await?;
        let (receipts, complete) = room.fill(receipts.iter().map(render::receipt));
        if receipts.is_empty() && !complete {
            // An empty page means the end of the chain: never send one for a receipt that does
            // not fit.
            return Err(crate::error::Error::ResourceExhausted(format!(
                "the receipt after sequence {} does not fit the reply limit \
                 (--max-reply-bytes)",
                req.after_sequence
            ))
            .into());
        }
        Ok(Response::new(pb::ExportReceiptsResponse { receipts, key }))
    }

    async fn list_passkeys(
        &self,
        request: Request<pb::ListPasskeysRequest>,
    ) -> Result<Response<pb::ListPasskeysResponse>, Status> {
        let req = request.into_inner();
        let approver = passkey_messages::approver_filter("approver", &req.approver)?;
        let passkeys = self.broker.passkeys(approver.as_deref()).await?;
        Ok(Response::new(pb::ListPasskeysResponse {
            passkeys: passkeys.iter().map(passkey_messages::passkey).collect(),
        }))
    }

    async fn revoke_passkey(
        &self,
        request: Request<pb::RevokePasskeyRequest>,
    ) -> Result<Response<pb::Passkey>, Status> {
        let by = Caller::of(&request).admin_identity();
        let credential_id = request.into_inner().credential_id;
        if credential_id.is_empty() {
            return Err(
                crate::error::Error::invalid("credential_id", "must name a passkey").into(),
            );
        }
        let passkey = self.broker.revoke_passkey(&credential_id, &by).await?;
        Ok(Response::new(passkey_messages::passkey(&passkey)))
    }
}
