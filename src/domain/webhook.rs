//! Webhook endpoints: where the broker POSTs the events of its log, which events each one
//! wants, how the body is shaped, and whether delivery is paused. Plain values and the rules
//! that need no I/O (which events an endpoint admits, how a secret is written); delivery itself
//! lives in `crate::background::webhooks`. Nothing here may reveal a secret: `Debug` masks it.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{Event, EventKind, Timestamp};
use crate::error::{Error, Result};

/// The longest webhook id, in bytes.
const MAX_WEBHOOK_ID_BYTES: usize = 64;
/// The longest endpoint URL, in bytes.
const MAX_URL_BYTES: usize = 2048;
/// The most requests in flight to one endpoint.
pub const MAX_IN_FLIGHT: u32 = 64;
/// Secret bytes generated for an endpoint created without one (Standard Webhooks asks for
/// 24 to 64).
const GENERATED_SECRET_BYTES: usize = 32;

/// An endpoint's id, chosen by the operator (or generated): letters, digits, `-`, `_`, `.`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WebhookId(String);

impl WebhookId {
    pub fn parse(field: &str, value: &str) -> Result<Self> {
        if value.is_empty() || value.len() > MAX_WEBHOOK_ID_BYTES {
            return Err(Error::invalid(
                field,
                format!("must be 1 to {MAX_WEBHOOK_ID_BYTES} bytes"),
            ));
        }
        if !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(Error::invalid(
                field,
                "may hold only letters, digits, `-`, `_` and `.`",
            ));
        }
        Ok(Self(value.to_owned()))
    }

    /// A fresh id for an endpoint created without one.
    pub fn generate() -> Self {
        Self(format!("wh_{}", uuid::Uuid::now_v7().simple()))
    }

    pub fn from_stored(value: String) -> Self {
        Self(value)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WebhookId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An endpoint's URL: absolute `http://` or `https://`, with a host, and no user-info
/// (`user:password@`): it would be sent in the `Host` header and shown by `ListWebhooks`;
/// the signing secret is what authenticates the broker to a receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookUrl(String);

impl WebhookUrl {
    pub fn parse(field: &str, value: &str) -> Result<Self> {
        if value.len() > MAX_URL_BYTES {
            return Err(Error::invalid(
                field,
                format!("must be at most {MAX_URL_BYTES} bytes"),
            ));
        }
        let uri: hyper::Uri = value
            .parse()
            .map_err(|e| Error::invalid(field, format!("is not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(Error::invalid(field, "must start with http:// or https://")),
        }
        if uri.host().is_none_or(str::is_empty) {
            return Err(Error::invalid(field, "has no host"));
        }
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(Error::invalid(
                field,
                "must not hold a user name or password (`user:password@`): they would be sent \
                 in the clear and shown by ListWebhooks; the receiver authenticates the broker \
                 by the signing secret (`secret`), which is stored and shown masked",
            ));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn from_stored(value: String) -> Self {
        Self(value)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A signing secret as Standard Webhooks writes it: `whsec_` and the key in base64. The key
/// (the decoded bytes) is what signs; the text is what operators copy.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret {
    text: String,
    key: Vec<u8>,
}

impl WebhookSecret {
    pub const PREFIX: &str = "whsec_";

    pub fn parse(field: &str, value: &str) -> Result<Self> {
        let encoded = value.strip_prefix(Self::PREFIX).ok_or_else(|| {
            Error::invalid(field, "must start with `whsec_` (then the key in base64)")
        })?;
        let key = BASE64
            .decode(encoded)
            .map_err(|_| Error::invalid(field, "the key after `whsec_` is not valid base64"))?;
        if !(24..=64).contains(&key.len()) {
            return Err(Error::invalid(field, "the key must be 24 to 64 bytes"));
        }
        Ok(Self {
            text: value.to_owned(),
            key,
        })
    }

    /// A new random secret. uuid's v4 bits come from the operating system's random source.
    pub fn generate() -> Self {
        let mut key = Vec::with_capacity(GENERATED_SECRET_BYTES);
        while key.len() < GENERATED_SECRET_BYTES {
            key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
        }
        key.truncate(GENERATED_SECRET_BYTES);
        Self {
            text: format!("{}{}", Self::PREFIX, BASE64.encode(&key)),
            key,
        }
    }

    /// Read back from the store, where it was validated on the way in.
    pub fn from_stored(text: String) -> Result<Self> {
        Self::parse("secret", &text)
            .map_err(|_| Error::Internal("a stored webhook secret is invalid".into()))
    }

    /// The whole secret: shown once, when the endpoint is created.
    pub fn reveal(&self) -> &str {
        &self.text
    }

    /// Enough to tell secrets apart, not to use one: `whsec_abcd…`.
    pub fn masked(&self) -> String {
        let shown: String = self.text.chars().take(Self::PREFIX.len() + 4).collect();
        format!("{shown}…")
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.masked())
    }
}

/// Which events an endpoint wants. Empty parts admit everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookFilter {
    /// Empty: every kind.
    pub kinds: Vec<EventKind>,
    pub tool: Option<String>,
    pub workspace: Option<String>,
    pub agent: Option<String>,
}

impl WebhookFilter {
    /// Whether the filter admits `event`. A fired escalation step (Reminded, Escalated) goes
    /// only where it is sent: to the endpoints its step names (see [`Webhook::wants`]), and to
    /// endpoints whose filter names its kind; "every kind" does not include them, so a ladder
    /// never reaches people it does not name.
    pub fn admits(&self, event: &Event) -> bool {
        if event.step.is_some() && !self.kinds.contains(&event.kind) {
            return false;
        }
        let call = &event.call;
        // Votes on calls needing several approvals reach approvers' streams, not webhooks.
        event.kind != EventKind::ApprovalRecorded
            && (self.kinds.is_empty() || self.kinds.contains(&event.kind))
            && self.tool.as_deref().is_none_or(|t| t == call.tool.as_str())
            && self
                .workspace
                .as_deref()
                .is_none_or(|w| w == call.workspace)
            && self
                .agent
                .as_deref()
                .is_none_or(|a| a == call.key.agent.as_str())
    }

    /// The kinds as stored: a bit per kind (its code), 0 for every kind.
    pub fn kinds_code(&self) -> i64 {
        self.kinds.iter().fold(0, |bits, k| bits | (1 << k.code()))
    }

    pub fn kinds_from_code(code: i64) -> Vec<EventKind> {
        EventKind::ALL
            .into_iter()
            .filter(|k| code & (1 << k.code()) != 0)
            .collect()
    }
}

/// The body an endpoint receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadFormat {
    /// A CloudEvents 1.0 JSON event (structured mode).
    CloudEvents,
    /// A Slack incoming-webhook message: a short summary and a link to the call in the inbox.
    Slack,
}

impl PayloadFormat {
    /// The stored code; the same numbers as the protobuf `WebhookFormat`.
    pub fn code(self) -> i64 {
        match self {
            PayloadFormat::CloudEvents => 1,
            PayloadFormat::Slack => 2,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(PayloadFormat::CloudEvents),
            2 => Some(PayloadFormat::Slack),
            _ => None,
        }
    }
}

/// Whether the broker delivers to an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhookState {
    Active,
    /// Nothing is delivered until an operator resumes it; events keep accumulating after its
    /// cursor and are delivered then.
    Paused {
        reason: String,
    },
}

/// One endpoint, with its delivery state.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub id: WebhookId,
    pub url: WebhookUrl,
    pub secret: WebhookSecret,
    pub filter: WebhookFilter,
    pub format: PayloadFormat,
    /// How many requests may be in flight to it at once (each for a different call).
    pub max_in_flight: u32,
    pub state: WebhookState,
    /// The last delivery failure, until a later delivery succeeds (then empty): the status
    /// and a fixed reason, or the connection's error, never what the endpoint answered.
    pub last_error: String,
    /// Failures since the last success; at `--webhook-pause-after` the endpoint is paused.
    pub consecutive_failures: u32,
    /// The sequence number of the last event delivered (or skipped by the filter).
    pub cursor: u64,
    /// Loaded from `--webhooks-file`: a later file replaces it.
    pub from_file: bool,
    pub created_at: Timestamp,
}

impl Webhook {
    /// Whether `other` is this endpoint with the same settings (where and how to deliver, and
    /// whether to), whatever delivery recorded since (cursor, failures, last error).
    pub fn same_settings(&self, other: &Webhook) -> bool {
        self.id == other.id
            && self.url == other.url
            && self.secret == other.secret
            && self.filter == other.filter
            && self.format == other.format
            && self.max_in_flight == other.max_in_flight
            && self.state == other.state
    }

    /// Whether this endpoint receives `event`: its filter admits it, or it is a fired escalation
    /// step that names this endpoint (whatever the filter says: the ladder sent it here).
    pub fn wants(&self, event: &Event) -> bool {
        self.filter.admits(event) || event.step_endpoints().contains(&self.id)
    }
}

/// What an UpdateWebhook changes; `None` keeps the stored value.
#[derive(Debug, Clone, Default)]
pub struct WebhookChange {
    pub url: Option<WebhookUrl>,
    pub secret: Option<WebhookSecret>,
    pub filter: Option<WebhookFilter>,
    pub format: Option<PayloadFormat>,
    pub max_in_flight: Option<u32>,
    pub state: Option<WebhookState>,
}

impl WebhookChange {
    /// `hook` with this change applied.
    pub fn apply(self, mut hook: Webhook) -> Webhook {
        if let Some(url) = self.url {
            hook.url = url;
        }
        if let Some(secret) = self.secret {
            hook.secret = secret;
        }
        if let Some(filter) = self.filter {
            hook.filter = filter;
        }
        if let Some(format) = self.format {
            hook.format = format;
        }
        if let Some(n) = self.max_in_flight {
            hook.max_in_flight = n;
        }
        if let Some(state) = self.state {
            if state == WebhookState::Active && hook.state != WebhookState::Active {
                // A resumed endpoint starts a new run of attempts.
                hook.consecutive_failures = 0;
            }
            hook.state = state;
        }
        hook
    }
}

/// Checks a requested in-flight limit (0 means the default, 4).
pub fn max_in_flight(field: &str, n: u32) -> Result<u32> {
    match n {
        0 => Ok(4),
        1..=MAX_IN_FLIGHT => Ok(n),
        _ => Err(Error::invalid(
            field,
            format!("must be 1 to {MAX_IN_FLIGHT} (0 means 4)"),
        )),
    }
}

/// Reads a webhooks file: `{"webhooks": [{"id", "url", "secret", "event_kinds", "tool",
/// "workspace", "agent", "format", "max_in_flight"}]}`. `id`, `url` and `secret` are required
/// (a receiver must know the secret, so the file names it); the rest default to everything,
/// CloudEvents and 4. Unknown keys are refused, so a misspelt filter cannot widen one.
pub fn parse_webhooks_file(text: &str) -> Result<Vec<Webhook>> {
    use serde_json::Value;
    let value: Value = crate::domain::json::parse("webhooks file", text)?;
    let list = value
        .as_object()
        .filter(|o| o.len() == 1)
        .and_then(|o| o.get("webhooks"))
        .and_then(Value::as_array)
        .ok_or_else(|| {
            Error::invalid(
                "webhooks file",
                "must be a JSON object with one key, `webhooks`, holding a list",
            )
        })?;
    let now = Timestamp::now();
    let mut hooks: Vec<Webhook> = Vec::with_capacity(list.len());
    for (i, value) in list.iter().enumerate() {
        let at = |key: &str| format!("webhooks[{i}].{key}");
        let object = value
            .as_object()
            .ok_or_else(|| Error::invalid(format!("webhooks[{i}]"), "must be an object"))?;
        const KEYS: [&str; 9] = [
            "id",
            "url",
            "secret",
            "event_kinds",
            "tool",
            "workspace",
            "agent",
            "format",
            "max_in_flight",
        ];
        if let Some(unknown) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(Error::invalid(at(unknown), "is not a webhook setting"));
        }
        let text = |key: &str| -> Result<Option<&str>> {
            match object.get(key) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s)),
                Some(_) => Err(Error::invalid(at(key), "must be a string")),
            }
        };
        let required = |key: &str| -> Result<&str> {
            text(key)?.ok_or_else(|| Error::invalid(at(key), "is required"))
        };
        let filter_text = |key: &str| -> Result<Option<String>> {
            Ok(text(key)?.filter(|s| !s.is_empty()).map(str::to_owned))
        };
        let mut kinds = Vec::new();
        if let Some(list) = object.get("event_kinds") {
            let list = list
                .as_array()
                .ok_or_else(|| Error::invalid(at("event_kinds"), "must be a list"))?;
            for kind in list {
                kinds.push(match kind.as_str() {
                    Some("requested") => EventKind::Requested,
                    Some("resolved") => EventKind::Resolved,
                    Some("reminded") => EventKind::Reminded,
                    Some("escalated") => EventKind::Escalated,
                    _ => {
                        return Err(Error::invalid(
                            at("event_kinds"),
                            "holds `requested`, `resolved`, `reminded` and `escalated` only",
                        ));
                    }
                });
            }
        }
        let format = match text("format")? {
            None | Some("cloudevents") => PayloadFormat::CloudEvents,
            Some("slack") => PayloadFormat::Slack,
            Some(_) => return Err(Error::invalid(at("format"), "is `cloudevents` or `slack`")),
        };
        let in_flight = match object.get("max_in_flight") {
            None => 0,
            Some(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| Error::invalid(at("max_in_flight"), "must be a number"))?,
        };
        let hook = Webhook {
            id: WebhookId::parse(&at("id"), required("id")?)?,
            url: WebhookUrl::parse(&at("url"), required("url")?)?,
            secret: WebhookSecret::parse(&at("secret"), required("secret")?)?,
            filter: WebhookFilter {
                kinds,
                tool: filter_text("tool")?,
                workspace: filter_text("workspace")?,
                agent: filter_text("agent")?,
            },
            format,
            max_in_flight: max_in_flight(&at("max_in_flight"), in_flight)?,
            state: WebhookState::Active,
            last_error: String::new(),
            consecutive_failures: 0,
            cursor: 0,
            from_file: true,
            created_at: now,
        };
        if hooks.iter().any(|h| h.id == hook.id) {
            return Err(Error::invalid(at("id"), "another webhook has the same id"));
        }
        hooks.push(hook);
    }
    Ok(hooks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhooks_file_parses_with_defaults_and_refuses_unknown_keys() {
        let secret = WebhookSecret::generate();
        let text = format!(
            r#"{{"webhooks": [{{"id": "ops", "url": "http://127.0.0.1:9/h", "secret": "{}",
                 "event_kinds": ["requested"], "tool": "shell", "format": "slack"}}]}}"#,
            secret.reveal()
        );
        let hooks = parse_webhooks_file(&text).unwrap();
        assert_eq!(hooks.len(), 1);
        assert_eq!(hooks[0].filter.kinds, vec![EventKind::Requested]);
        assert_eq!(hooks[0].filter.tool.as_deref(), Some("shell"));
        assert_eq!(hooks[0].format, PayloadFormat::Slack);
        assert_eq!(hooks[0].max_in_flight, 4);

        let typo = text.replace("\"tool\"", "\"tools\"");
        let err = parse_webhooks_file(&typo).unwrap_err().to_string();
        assert!(err.contains("webhooks[0].tools"), "{err}");
    }

    #[test]
    fn a_generated_secret_reads_back_as_itself_and_is_masked_in_debug() {
        let secret = WebhookSecret::generate();
        let again = WebhookSecret::parse("secret", secret.reveal()).unwrap();
        assert_eq!(again.key(), secret.key());
        assert_eq!(secret.key().len(), GENERATED_SECRET_BYTES);
        assert!(!format!("{secret:?}").contains(&secret.reveal()[10..]));
    }

    #[test]
    fn secrets_without_the_prefix_or_too_short_are_refused() {
        for bad in ["abc", "whsec_!!", "whsec_AAAA"] {
            assert!(WebhookSecret::parse("secret", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_must_be_absolute_http() {
        for bad in ["", "ftp://x/", "/relative", "http://"] {
            assert!(WebhookUrl::parse("url", bad).is_err(), "{bad}");
        }
        assert!(WebhookUrl::parse("url", "https://hooks.example.com/a?b=c").is_ok());
    }

    #[test]
    fn urls_holding_a_user_name_or_password_are_refused_naming_the_field() {
        for bad in [
            "http://user:pw@hooks.example.com/",
            "https://user@hooks.example.com/a",
            "https://:pw@hooks.example.com:8443/",
        ] {
            let err = WebhookUrl::parse("url", bad).unwrap_err().to_string();
            assert!(
                err.contains("url") && err.contains("password"),
                "{bad}: {err}"
            );
            assert!(
                !err.contains("pw"),
                "the refusal repeats no credential: {err}"
            );
        }
        // `@` in the path or query is not user-info.
        assert!(WebhookUrl::parse("url", "https://hooks.example.com/a@b?c=d@e").is_ok());
    }

    #[test]
    fn event_kinds_round_trip_through_their_stored_code() {
        let filter = WebhookFilter {
            kinds: vec![EventKind::Resolved],
            ..WebhookFilter::default()
        };
        assert_eq!(
            WebhookFilter::kinds_from_code(filter.kinds_code()),
            vec![EventKind::Resolved]
        );
        assert!(WebhookFilter::kinds_from_code(0).is_empty());
    }
}

/// A failed delivery attempt, as the task holding an endpoint's lease records it.
#[derive(Debug, Clone)]
pub struct DeliveryFailure {
    pub webhook: WebhookId,
    /// Who holds the lease: the failure counts only while it still does.
    pub owner: String,
    /// What went wrong; the pause reason when this failure pauses the endpoint.
    pub error: String,
    /// Pause the endpoint when this many attempts in a row have failed.
    pub pause_after: u32,
}
