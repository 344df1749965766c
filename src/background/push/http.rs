//! POSTs one encrypted push message to a push service (RFC 8030 §5), through the broker's one
//! way out (`crate::door::outbound`), connecting only to an address the webhooks' egress policy
//! admits (resolved once, checked, then used). Nothing here retries: the sender decides that
//! from the [`Answer`].

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::Request;
use hyper::client::conn::http1::SendRequest;

use crate::background::webhooks::egress::EgressPolicy;
use crate::door::outbound::{Target, Unreached};

/// The most of an answer's body read (then dropped).
const MAX_RESPONSE_BYTES: usize = 16 * 1024;

/// What the push service said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: accepted for delivery.
    Accepted,
    /// 404 or 410: the subscription expired or was withdrawn; drop it.
    Gone,
    /// 429, 5xx, or no answer: try again later.
    Retry(String),
    /// Any other status: the request itself is wrong; retrying will not help.
    Refused(String),
}

/// One request to send.
pub struct PushRequest<'a> {
    pub endpoint: &'a str,
    pub authorization: &'a str,
    pub ttl_secs: u32,
    pub urgency: &'static str,
    /// Replaces a message still queued at the push service with the same topic.
    pub topic: Option<&'a str>,
    pub body: Bytes,
}

/// Sends `request`, ending within `timeout` whatever the push service does.
pub async fn post(request: &PushRequest<'_>, egress: &EgressPolicy, timeout: Duration) -> Answer {
    match tokio::time::timeout(timeout, exchange(request, egress)).await {
        Ok(answer) => answer,
        Err(_) => Answer::Retry(format!(
            "the push service did not answer within {}s",
            timeout.as_secs_f64()
        )),
    }
}

async fn exchange(request: &PushRequest<'_>, egress: &EgressPolicy) -> Answer {
    let target = match Target::parse(request.endpoint) {
        Ok(target) => target,
        Err(e) => return Answer::Refused(format!("the endpoint: {e}")),
    };
    let mut builder = Request::post(target.path())
        .header(hyper::header::HOST, target.authority())
        .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
        .header(hyper::header::CONTENT_ENCODING, "aes128gcm")
        .header(hyper::header::AUTHORIZATION, request.authorization)
        .header("TTL", request.ttl_secs.to_string())
        .header("Urgency", request.urgency)
        .header(
            hyper::header::USER_AGENT,
            concat!("approval-broker/", env!("CARGO_PKG_VERSION")),
        );
    if let Some(topic) = request.topic {
        builder = builder.header("Topic", topic);
    }
    let built = match builder.body(Full::new(request.body.clone())) {
        Ok(built) => built,
        Err(e) => return Answer::Refused(format!("cannot build the request: {e}")),
    };
    let sender = match target
        .connect(|host, resolved| egress.pick(host, resolved))
        .await
    {
        Ok(sender) => sender,
        Err(Unreached::Refused(why)) => return Answer::Refused(why),
        Err(Unreached::Failed(why)) => return Answer::Retry(why),
    };
    match send(sender, built).await {
        Ok(status) => classify(status),
        Err(e) => Answer::Retry(e),
    }
}

async fn send(
    mut sender: SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<u16, String> {
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status().as_u16();
    let _ = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
        .collect()
        .await;
    Ok(status)
}

/// What a status means for the subscription (RFC 8030 §5, §7.3; RFC 8292 §4.2 for 403).
pub fn classify(status: u16) -> Answer {
    match status {
        200..=299 => Answer::Accepted,
        404 | 410 => Answer::Gone,
        429 | 500..=599 => Answer::Retry(format!("the push service answered {status}")),
        _ => Answer::Refused(format!("the push service answered {status}")),
    }
}
