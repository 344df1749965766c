//! The webhook messages of AdminService at the edge: requests parsed into domain values (errors
//! name the field), endpoints rendered back. A secret is rendered in full only when asked for
//! (the replies that created or set it); everywhere else it is masked.

use crate::domain::webhook::{
    PayloadFormat, Webhook, WebhookChange, WebhookFilter, WebhookId, WebhookSecret, WebhookState,
    WebhookUrl, max_in_flight,
};
use crate::domain::{EventKind, Timestamp};
use crate::error::{Error, Result};
use crate::proto::v1 as pb;

use super::render;

pub fn webhook_id(field: &str, id: &str) -> Result<WebhookId> {
    WebhookId::parse(field, id)
}

pub fn new_webhook(req: pb::CreateWebhookRequest) -> Result<Webhook> {
    let id = if req.id.is_empty() {
        WebhookId::generate()
    } else {
        WebhookId::parse("id", &req.id)?
    };
    let secret = if req.secret.is_empty() {
        WebhookSecret::generate()
    } else {
        WebhookSecret::parse("secret", &req.secret)?
    };
    Ok(Webhook {
        id,
        url: WebhookUrl::parse("url", &req.url)?,
        secret,
        filter: filter("filter", req.filter)?,
        format: format("format", req.format)?.unwrap_or(PayloadFormat::CloudEvents),
        max_in_flight: max_in_flight("max_in_flight", req.max_in_flight)?,
        state: WebhookState::Active,
        last_error: String::new(),
        consecutive_failures: 0,
        cursor: 0,
        from_file: false,
        created_at: Timestamp::now(),
    })
}

/// The endpoint an UpdateWebhook names, and what it changes.
pub fn change(req: pb::UpdateWebhookRequest) -> Result<(WebhookId, WebhookChange)> {
    let id = WebhookId::parse("id", &req.id)?;
    if req.rotate_secret && req.secret.is_some() {
        return Err(Error::invalid(
            "rotate_secret",
            "cannot be set together with `secret`",
        ));
    }
    let secret = match (req.rotate_secret, req.secret) {
        (true, _) => Some(WebhookSecret::generate()),
        (false, Some(secret)) => Some(WebhookSecret::parse("secret", &secret)?),
        (false, None) => None,
    };
    let state = match req.paused {
        None if !req.pause_reason.is_empty() => {
            return Err(Error::invalid(
                "pause_reason",
                "is only read when `paused` is true",
            ));
        }
        None => None,
        Some(false) => Some(WebhookState::Active),
        Some(true) => Some(WebhookState::Paused {
            reason: if req.pause_reason.is_empty() {
                "paused by an operator".into()
            } else {
                req.pause_reason
            },
        }),
    };
    Ok((
        id,
        WebhookChange {
            url: req
                .url
                .map(|url| WebhookUrl::parse("url", &url))
                .transpose()?,
            secret,
            filter: req.filter.map(|f| filter("filter", Some(f))).transpose()?,
            format: format("format", req.format)?,
            max_in_flight: req
                .max_in_flight
                .map(|n| max_in_flight("max_in_flight", n))
                .transpose()?,
            state,
        },
    ))
}

fn filter(field: &str, filter: Option<pb::WebhookFilter>) -> Result<WebhookFilter> {
    let Some(filter) = filter else {
        return Ok(WebhookFilter::default());
    };
    let mut kinds = Vec::new();
    for (i, kind) in filter.event_kinds.iter().enumerate() {
        let kind = match pb::WebhookEventKind::try_from(*kind) {
            Ok(pb::WebhookEventKind::Requested) => EventKind::Requested,
            Ok(pb::WebhookEventKind::Resolved) => EventKind::Resolved,
            Ok(pb::WebhookEventKind::Reminded) => EventKind::Reminded,
            Ok(pb::WebhookEventKind::Escalated) => EventKind::Escalated,
            _ => {
                return Err(Error::invalid(
                    format!("{field}.event_kinds[{i}]"),
                    "must be REQUESTED, RESOLVED, REMINDED or ESCALATED",
                ));
            }
        };
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    let text = |value: String| (!value.is_empty()).then_some(value);
    Ok(WebhookFilter {
        kinds,
        tool: text(filter.tool),
        workspace: text(filter.workspace),
        agent: text(filter.agent),
    })
}

/// `None` for UNSPECIFIED.
fn format(field: &str, format: i32) -> Result<Option<PayloadFormat>> {
    match pb::WebhookFormat::try_from(format) {
        Ok(pb::WebhookFormat::Unspecified) => Ok(None),
        Ok(pb::WebhookFormat::Cloudevents) => Ok(Some(PayloadFormat::CloudEvents)),
        Ok(pb::WebhookFormat::Slack) => Ok(Some(PayloadFormat::Slack)),
        Err(_) => Err(Error::invalid(field, "is not a known format")),
    }
}

/// Whether a rendered endpoint shows its secret in full.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Secret {
    Reveal,
    Mask,
}

pub fn webhook(hook: &Webhook, secret: Secret) -> pb::Webhook {
    let (paused, paused_reason) = match &hook.state {
        WebhookState::Active => (false, String::new()),
        WebhookState::Paused { reason } => (true, reason.clone()),
    };
    pb::Webhook {
        id: hook.id.to_string(),
        url: hook.url.as_str().to_owned(),
        secret: match secret {
            Secret::Reveal => hook.secret.reveal().to_owned(),
            Secret::Mask => hook.secret.masked(),
        },
        filter: Some(pb::WebhookFilter {
            event_kinds: hook
                .filter
                .kinds
                .iter()
                .map(|kind| match kind {
                    EventKind::Requested => pb::WebhookEventKind::Requested as i32,
                    EventKind::Resolved => pb::WebhookEventKind::Resolved as i32,
                    EventKind::Reminded => pb::WebhookEventKind::Reminded as i32,
                    EventKind::Escalated => pb::WebhookEventKind::Escalated as i32,
                    // Never in a filter (votes are not delivered to webhooks).
                    EventKind::ApprovalRecorded => pb::WebhookEventKind::Unspecified as i32,
                })
                .collect(),
            tool: hook.filter.tool.clone().unwrap_or_default(),
            workspace: hook.filter.workspace.clone().unwrap_or_default(),
            agent: hook.filter.agent.clone().unwrap_or_default(),
        }),
        format: match hook.format {
            PayloadFormat::CloudEvents => pb::WebhookFormat::Cloudevents as i32,
            PayloadFormat::Slack => pb::WebhookFormat::Slack as i32,
        },
        max_in_flight: hook.max_in_flight,
        paused,
        paused_reason,
        last_error: hook.last_error.clone(),
        consecutive_failures: hook.consecutive_failures,
        cursor: hook.cursor,
        from_file: hook.from_file,
        created_at: Some(render::timestamp(hook.created_at)),
    }
}
