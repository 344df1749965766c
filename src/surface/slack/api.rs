//! Slack's Web API as the broker calls it: `POST <base>/<method>` with a JSON body and the bot
//! token as `Authorization: Bearer`, the answer's `ok` read (Slack answers 200 with
//! `{"ok": false, "error": ...}` for most failures). Also the `response_url` of a click, for
//! the ephemeral replies. Through the broker's one way out (`crate::door::outbound`), under the
//! webhooks' egress policy (`--webhook-allow-hosts`): each connection resolves the host once,
//! checks the address, and connects to that one; the base
//! URL itself is checked at start. One connection per request, every request bounded by the
//! timeout; retrying is the caller's choice.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, USER_AGENT};
use hyper::{Request, Uri};
use serde_json::Value;

use crate::background::webhooks::egress::EgressPolicy;
use crate::door::outbound::{Target, Unreached};

/// The most of an answer read.
const MAX_ANSWER_BYTES: usize = 1024 * 1024;

const JSON: &str = "application/json; charset=utf-8";
const FORM: &str = "application/x-www-form-urlencoded";

/// An answer's `ok` read: the answer when Slack says `"ok": true`, else the error it names.
fn read_answer(method: &str, answer: &[u8]) -> Result<Value, String> {
    let answer: Value = serde_json::from_slice(answer)
        .map_err(|_| format!("Slack's answer to {method} is not JSON"))?;
    if answer.get("ok").and_then(Value::as_bool) == Some(true) {
        Ok(answer)
    } else {
        let error = answer
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no error named");
        Err(format!("Slack refused {method}: {error}"))
    }
}

/// `application/x-www-form-urlencoded` encoding of one name or value.
pub fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Decodes one `application/x-www-form-urlencoded` name or value; `None` when it is not UTF-8.
pub fn form_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The Web API, as one bot token reaches it.
pub struct WebApi {
    base: String,
    token: String,
    timeout: Duration,
    egress: Arc<EgressPolicy>,
}

impl std::fmt::Debug for WebApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebApi").field("base", &self.base).finish()
    }
}

impl WebApi {
    pub fn new(base: &str, token: String, timeout: Duration, egress: Arc<EgressPolicy>) -> Self {
        Self {
            base: base.trim_end_matches('/').to_owned(),
            token,
            timeout,
            egress,
        }
    }

    /// Whether `url` is where this API's own host answers (for `response_url`s, which must be
    /// Slack's `https://hooks.slack.com/`, or, in tests, the configured base's origin).
    pub fn may_answer_at(&self, url: &str) -> bool {
        let origin = |u: &str| -> Option<String> {
            let uri: Uri = u.parse().ok()?;
            Some(format!(
                "{}://{}",
                uri.scheme_str()?,
                uri.authority()?.as_str()
            ))
        };
        url.starts_with("https://hooks.slack.com/")
            || (origin(url).is_some() && origin(url) == origin(&self.base))
    }

    /// Calls `method` with `body`; the answer when Slack says `"ok": true`, else why not.
    pub async fn call(&self, method: &str, body: &Value) -> Result<Value, String> {
        let url = format!("{}/{method}", self.base);
        let answer = self
            .post(&url, Bytes::from(body.to_string()), JSON, true)
            .await?;
        read_answer(method, &answer)
    }

    /// Calls a read method (`users.info`) with form fields, as Slack documents them.
    pub async fn call_form(&self, method: &str, fields: &[(&str, &str)]) -> Result<Value, String> {
        let url = format!("{}/{method}", self.base);
        let form: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
            .collect();
        let answer = self
            .post(&url, Bytes::from(form.join("&")), FORM, true)
            .await?;
        read_answer(method, &answer)
    }

    /// POSTs `body` to a click's `response_url` (no token: the URL is its own credential).
    pub async fn respond(&self, response_url: &str, body: &Value) -> Result<(), String> {
        if !self.may_answer_at(response_url) {
            return Err("the response_url is not Slack's".into());
        }
        self.post(response_url, Bytes::from(body.to_string()), JSON, false)
            .await
            .map(|_| ())
    }

    async fn post(
        &self,
        url: &str,
        body: Bytes,
        content_type: &'static str,
        with_token: bool,
    ) -> Result<Bytes, String> {
        let sent = self.send(url, body, content_type, with_token);
        match tokio::time::timeout(self.timeout, sent).await {
            Ok(result) => result,
            Err(_) => Err(format!("Slack gave no answer within {:?}", self.timeout)),
        }
    }

    async fn send(
        &self,
        url: &str,
        body: Bytes,
        content_type: &'static str,
        with_token: bool,
    ) -> Result<Bytes, String> {
        let target = Target::parse(url)?;
        let mut request = Request::post(target.path())
            .header(HOST, target.authority())
            .header(CONTENT_TYPE, content_type)
            .header(
                USER_AGENT,
                concat!("approval-broker/", env!("CARGO_PKG_VERSION")),
            );
        if with_token {
            request = request.header(AUTHORIZATION, format!("Bearer {}", self.token));
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| format!("cannot build the request: {e}"))?;
        let sender = target
            .connect(|host, resolved| self.egress.pick(host, resolved))
            .await
            .map_err(Unreached::into_message)?;
        exchange(sender, request).await
    }
}

async fn exchange(
    mut sender: SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<Bytes, String> {
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|_| "Slack's answer was cut short or too long".to_owned())?
        .to_bytes();
    if !status.is_success() {
        return Err(match retry_after {
            Some(after) => format!("HTTP {status} (retry after {after}s)"),
            None => format!("HTTP {status}"),
        });
    }
    Ok(body)
}
