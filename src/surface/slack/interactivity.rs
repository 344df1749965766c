//! Slack's interactivity endpoint: `POST /slack/interactivity` on the gRPC port, where Slack
//! sends a click on Approve or Deny. Exactly that path and method, a bounded body, and nothing
//! taken before its signature verifies (see `signature`). The click is acknowledged at once
//! (Slack wants an answer within three seconds) and decided afterwards, through
//! `Broker::decide` like every other decision: the gate holds groups, quorum and no
//! self-approval. The approver is the Slack user mapped by `--slack-file`, never anything the
//! payload says about itself; a person Slack knows but the broker does not is refused with an
//! ephemeral message, seen only by them.
//!
//! A call whose requirement asks for a passkey cannot be approved from Slack (a click carries no
//! passkey): its message has no Approve button, and an Approve click on it anyway (a message
//! posted before, a crafted payload) is refused with an ephemeral message pointing to the inbox
//! before anything is decided. The gate would refuse the vote too; this says why in words.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use serde_json::{Value, json};
use tonic::body::Body;
use tonic::codegen::http::{HeaderValue, Method, Request, Response, StatusCode, header};

use super::api::form_decode;
use super::blocks::{self, APPROVE, DENY};
use super::{Slack, SlackPerson};
use crate::background::webhooks::payload::inbox_link;
use crate::broker::Broker;
use crate::domain::{Call, CallKey, Verdict, Viewer};
use crate::proto::v1 as pb;

/// The one path Slack's clicks are POSTed to (the app's "Request URL").
pub const PATH: &str = "/slack/interactivity";

/// The largest body taken: a click's payload carries the message it was on (at most ~50 blocks
/// of at most 3000 characters), escaped as a form.
pub const MAX_BODY: usize = 512 * 1024;

/// A click, as the signed payload says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Click {
    pub user: String,
    pub action: String,
    pub value: String,
    pub response_url: Option<String>,
}

/// The clicks of a `block_actions` payload (the form field `payload`); none for anything else.
pub fn clicks(form: &[u8]) -> Vec<Click> {
    let Ok(form) = std::str::from_utf8(form) else {
        return Vec::new();
    };
    let Some(payload) = form
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, _)| *name == "payload")
        .and_then(|(_, value)| form_decode(value))
    else {
        return Vec::new();
    };
    let Ok(payload) = serde_json::from_str::<Value>(&payload) else {
        return Vec::new();
    };
    if payload["type"] != "block_actions" {
        return Vec::new();
    }
    let Some(user) = payload["user"]["id"].as_str() else {
        return Vec::new();
    };
    let response_url = payload["response_url"].as_str().map(str::to_owned);
    payload["actions"]
        .as_array()
        .map(|actions| {
            actions
                .iter()
                .filter_map(|a| {
                    Some(Click {
                        user: user.to_owned(),
                        action: a["action_id"].as_str()?.to_owned(),
                        value: a["value"].as_str().unwrap_or_default().to_owned(),
                        response_url: response_url.clone(),
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

impl Slack {
    /// The approver a Slack user is: by user id in the table, else (when the table maps
    /// emails) by the email `users.info` gives.
    async fn person(&self, user: &str) -> Option<SlackPerson> {
        let people = &self.settings.people;
        if let Some(person) = people
            .iter()
            .find(|p| p.slack_user.as_deref() == Some(user))
        {
            return Some(person.clone());
        }
        if !people.iter().any(|p| p.email.is_some()) {
            return None;
        }
        let info = match self.api.call_form("users.info", &[("user", user)]).await {
            Ok(info) => info,
            Err(error) => {
                tracing::warn!(%error, "cannot read a Slack user's email");
                return None;
            }
        };
        let email = info["user"]["profile"]["email"].as_str()?.to_lowercase();
        people
            .iter()
            .find(|p| p.email.as_deref() == Some(email.as_str()))
            .cloned()
    }

    /// Tells the person who clicked (only them) what came of it.
    async fn reply(&self, click: &Click, text: &str) {
        let Some(url) = &click.response_url else {
            return;
        };
        let body = json!({
            "response_type": "ephemeral",
            "replace_original": false,
            "text": blocks::escape(text),
        });
        if let Err(error) = self.api.respond(url, &body).await {
            tracing::warn!(%error, "cannot answer a Slack click");
        }
    }

    /// The call `key` names if `viewer` may see it and its approval needs a passkey.
    async fn needing_passkey(&self, key: &CallKey, viewer: &Viewer) -> Option<Call> {
        let found = self
            .store
            .calls_by_id(&key.agent, &key.session, std::slice::from_ref(&key.call_id))
            .await
            // The gate refuses such a vote anyway.
            .ok()?;
        found
            .into_iter()
            .flatten()
            .find(|call| call.visible_to(viewer) && blocks::needs_passkey(call))
    }

    /// Decides what a click asks, through the broker's gate, and tells the person.
    pub async fn act(&self, broker: &Broker, click: Click) {
        let verdict = match click.action.as_str() {
            APPROVE => Verdict::Approve,
            DENY => Verdict::Deny,
            // Open is a link; Slack reports its click too. Nothing to decide.
            _ => return,
        };
        let Some(key) = blocks::parse_button_value(&click.value) else {
            self.reply(&click, "This button does not name a call of this broker.")
                .await;
            return;
        };
        let Some(person) = self.person(&click.user).await else {
            tracing::info!(slack_user = %click.user, "a Slack user who is no approver clicked");
            self.reply(
                &click,
                &format!(
                    "Not decided: your Slack account ({}) is not mapped to an approver of this \
                     broker. Ask its operator to add you to the Slack people (--slack-file), or \
                     decide in the inbox.",
                    click.user
                ),
            )
            .await;
            return;
        };
        let viewer = Viewer::Approver {
            groups: person.groups.clone(),
        };
        if verdict == Verdict::Approve
            && let Some(call) = self.needing_passkey(&key, &viewer).await
        {
            let url = self
                .settings
                .inbox_url
                .as_deref()
                .map(|inbox| format!(": {}", inbox_link(inbox, &call)))
                .unwrap_or_default();
            self.reply(
                &click,
                &format!(
                    "Not decided: this call needs your passkey, which Slack cannot carry. \
                     Approve it in the inbox{url}."
                ),
            )
            .await;
            return;
        }
        // The same request the inbox sends, parsed by the same code; only who decides is set
        // here, from the mapping, as the gRPC edge sets it from the token.
        let request = pb::DecideRequest {
            agent: key.agent.as_str().to_owned(),
            session_id: key.session.as_str().to_owned(),
            call_id: key.call_id.as_str().to_owned(),
            decision: match verdict {
                Verdict::Approve => pb::Decision::Approve,
                Verdict::Deny => pb::Decision::Deny,
            } as i32,
            reason: "decided in Slack".into(),
            approver: person.identity.clone(),
            ..Default::default()
        };
        let (key, mut decision) = match crate::surface::grpc::approver::decision(
            request,
            broker.limits().max_input_bytes,
        ) {
            Ok(parsed) => parsed,
            Err(err) => {
                self.reply(&click, &format!("Not decided: {}", err.client_message()))
                    .await;
                return;
            }
        };
        decision.approver = person.identity.clone();
        decision.approver_groups = Some(person.groups.clone());
        decision.viewer = viewer;
        let text = match broker.decide(&key, &decision).await {
            Ok(report) => match &report.call.outcome {
                None => format!(
                    "Your {} is recorded as {}; the call still waits: {}.",
                    if verdict == Verdict::Approve {
                        "approval"
                    } else {
                        "denial"
                    },
                    person.identity,
                    blocks::requirement(&report.call)
                ),
                Some(outcome) if report.replayed => {
                    format!(
                        "Already decided: {} by {}.",
                        outcome.kind, outcome.decided_by
                    )
                }
                Some(outcome) => format!("Decided: {} as {}.", outcome.kind, person.identity),
            },
            Err(err) => format!("Not decided: {}", err.client_message()),
        };
        self.reply(&click, &text).await;
    }
}

/// Serves [`PATH`] in front of everything else on the port (see the module docs); with Slack
/// app mode off, the path is no different from any other (it goes on to gRPC, which refuses it).
#[derive(Clone)]
pub struct SlackInteractivity {
    slack: Option<(Arc<Slack>, Arc<Broker>)>,
}

impl SlackInteractivity {
    pub fn new(slack: Option<Arc<Slack>>, broker: Arc<Broker>) -> Self {
        Self {
            slack: slack.map(|s| (s, broker)),
        }
    }
}

impl<S> tower_layer::Layer<S> for SlackInteractivity {
    type Service = SlackInteractivityService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SlackInteractivityService {
            inner,
            slack: self.slack.clone(),
        }
    }
}

#[derive(Clone)]
pub struct SlackInteractivityService<S> {
    inner: S,
    slack: Option<(Arc<Slack>, Arc<Broker>)>,
}

fn plain(status: StatusCode, text: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(Bytes::from_static(text.as_bytes()))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// One request to [`PATH`]: verified, acknowledged, and its clicks decided in the background.
async fn receive<B>(slack: Arc<Slack>, broker: Arc<Broker>, request: Request<B>) -> Response<Body>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (parts, body) = request.into_parts();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (timestamp, signature) = (
        header("x-slack-request-timestamp"),
        header("x-slack-signature"),
    );
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is larger than a Slack interaction can be\n",
            );
        }
    };
    if let Err(refusal) = slack.verifier.verify(
        timestamp.as_deref(),
        signature.as_deref(),
        &body,
        unix_now(),
    ) {
        tracing::warn!(%refusal, "a request to the Slack endpoint was refused");
        return plain(
            StatusCode::UNAUTHORIZED,
            "refused: not a request signed by this broker's Slack app\n",
        );
    }
    let clicks = clicks(&body);
    if !clicks.is_empty() {
        tokio::spawn(async move {
            for click in clicks {
                slack.act(&broker, click).await;
            }
        });
    }
    let mut ack = Response::new(Body::empty());
    *ack.status_mut() = StatusCode::OK;
    ack
}

impl<S, ReqBody> tower_service::Service<Request<ReqBody>> for SlackInteractivityService<S>
where
    S: tower_service::Service<Request<ReqBody>, Response = Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: http_body::Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let Some((slack, broker)) = self.slack.clone() else {
            return Box::pin(self.inner.call(request));
        };
        if request.uri().path() != PATH {
            return Box::pin(self.inner.call(request));
        }
        if request.method() != Method::POST {
            let mut refusal = plain(StatusCode::METHOD_NOT_ALLOWED, "POST only\n");
            refusal
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return Box::pin(std::future::ready(Ok(refusal)));
        }
        Box::pin(async move { Ok(receive(slack, broker, request).await) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_actions_payload_gives_its_clicks_and_nothing_else_does() {
        let payload = json!({
            "type": "block_actions",
            "user": {"id": "U1", "username": "alice"},
            "response_url": "https://hooks.slack.com/actions/T1/1/x",
            "actions": [{"action_id": "approve", "value": "{\"agent\":\"a\"}", "type": "button"}],
        });
        let form = format!(
            "payload={}",
            super::super::api::form_encode(&payload.to_string())
        );
        let clicks = clicks(form.as_bytes());
        assert_eq!(
            clicks,
            vec![Click {
                user: "U1".into(),
                action: "approve".into(),
                value: "{\"agent\":\"a\"}".into(),
                response_url: Some("https://hooks.slack.com/actions/T1/1/x".into()),
            }]
        );
        assert!(super::clicks(b"payload=%7B%22type%22%3A%22view_submission%22%7D").is_empty());
        assert!(super::clicks(b"token=x").is_empty());
    }
}
