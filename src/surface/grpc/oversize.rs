//! Oversized messages are a limit, and limits answer RESOURCE_EXHAUSTED (the precise-errors promise).
//! tonic refuses a message over `--max-message-bytes` with OUT_OF_RANGE while decoding it: before
//! a unary or server-streaming handler runs (the status travels in the response headers, which
//! [`MessageLimitStatus`] rewrites), or inside a client stream (which the handler maps with
//! [`map_status`]).
//!
//! Replies have a limit too, `--max-reply-bytes` (capped by `--max-message-bytes`), and a reply
//! must never exceed it: a write that committed must never be reported as a failure because its
//! reply grew too large, and a listing must never break because its items did. Every reply that
//! holds a list is built through a [`Room`]: a page ends where the next item would not fit (its
//! `next_page_token` continues there; see `paging`), and a write's reply lists what fits and
//! counts the rest (see `render`).
//!
//! The same two places turn tonic's INTERNAL for a request that ends inside a message (its gRPC
//! frame promised more bytes than came), or a unary request without a message, into
//! INVALID_ARGUMENT: the client's mistake (guarantee 8). A message that arrives whole but does
//! not decode is the codec's to refuse (`codec.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use prost::Message;
use prost::encoding::encoded_len_varint;
use tonic::codegen::http;
use tonic::{Code, Status};

use crate::error::{Error, Result};
use crate::proto::v1 as pb;

/// Room kept in every reply for its fields that are not lists (ids, page tokens, counts, flags)
/// and for the envelope of a stream message. Those fields are capped far below it.
const RESERVED: usize = 8 * 1024;

/// What one call may take beyond its tool inputs: ids, title, message, workspace, reason,
/// tool-result text (each capped, together well below this).
const CALL_TEXTS: usize = 32 * 1024;

/// The most one call can take in a reply with inputs of at most `max_input_bytes`: its input,
/// an approver's edited input, and its texts. Pages hold at least one call (or outcome, or
/// grant, which take less with default matchers), and a write's reply its own outcome.
fn largest_call(max_input_bytes: usize) -> usize {
    2 * max_input_bytes + CALL_TEXTS
}

/// The reply limit for `--max-reply-bytes` and `--max-message-bytes`: the smaller of the two.
/// Refused when a single call could not fit in one reply (a page must never be empty, and a
/// write's own outcome must always be sent), naming the setting to raise.
pub fn reply_limit(
    max_reply_bytes: usize,
    max_message_bytes: usize,
    max_input_bytes: usize,
) -> Result<usize> {
    let limit = max_reply_bytes.min(max_message_bytes);
    let needed = RESERVED + largest_call(max_input_bytes);
    if limit < needed {
        return Err(Error::invalid(
            "--max-reply-bytes / --max-message-bytes",
            format!(
                "a reply must hold at least one call with the largest input allowed \
                 (--max-input-bytes {max_input_bytes}): {needed} bytes, but the limit is {limit}"
            ),
        ));
    }
    Ok(limit)
}

/// An Explain reply within `reply_limit`: its parts that can be read elsewhere are left out
/// (the call, then the grant, then the rule) until it fits, and `truncated` says so. The answer
/// itself (verdict, decider, reason) is always kept.
pub fn fit_explanation(mut reply: pb::ExplainResponse, reply_limit: usize) -> pb::ExplainResponse {
    let fits = |reply: &pb::ExplainResponse| Room::new(reply_limit).take_len(reply.encoded_len());
    if fits(&reply) {
        return reply;
    }
    reply.truncated = true;
    reply.call = None;
    if !fits(&reply) {
        reply.grant = None;
    }
    if !fits(&reply) {
        reply.rule = None;
    }
    reply
}

/// What is left of one reply's size limit while the reply is built.
#[derive(Debug, Clone)]
pub struct Room {
    left: usize,
}

impl Room {
    /// The room of one reply under `reply_limit` (see [`reply_limit`]).
    pub fn new(reply_limit: usize) -> Self {
        Room {
            left: reply_limit.saturating_sub(RESERVED),
        }
    }

    /// Takes the room `item` needs as one element of a repeated field (or as a message field),
    /// if it fits; otherwise takes nothing and says so.
    pub fn take<M: Message>(&mut self, item: &M) -> bool {
        self.take_len(item.encoded_len())
    }

    /// As [`Room::take`], for a string element.
    pub fn take_text(&mut self, text: &str) -> bool {
        self.take_len(text.len())
    }

    /// Takes the room of a part the reply cannot do without (the outcome of the decided call,
    /// an acknowledgement per submitted call), fitting or not: [`reply_limit`] makes sure such
    /// parts fit, and the lists after them get what is left.
    pub fn charge<M: Message>(&mut self, item: &M) {
        self.left = self
            .left
            .saturating_sub(Self::element_len(item.encoded_len()));
    }

    /// As [`Room::charge`], for a string element.
    pub fn charge_text(&mut self, text: &str) {
        self.left = self.left.saturating_sub(Self::element_len(text.len()));
    }

    /// The longest prefix of `items` that fits (taken lazily: nothing after the first item that
    /// does not fit is even rendered), and whether every item did.
    pub fn fill<M: Message>(&mut self, items: impl IntoIterator<Item = M>) -> (Vec<M>, bool) {
        let mut kept = Vec::new();
        for item in items {
            if !self.take(&item) {
                return (kept, false);
            }
            kept.push(item);
        }
        (kept, true)
    }

    fn take_len(&mut self, len: usize) -> bool {
        let needed = Self::element_len(len);
        if needed > self.left {
            return false;
        }
        self.left -= needed;
        true
    }

    /// An element's encoded size: its field key (at most 2 bytes for field numbers below 2048),
    /// its length, its bytes.
    fn element_len(len: usize) -> usize {
        2 + encoded_len_varint(len as u64) + len
    }
}

/// Whether `message` is tonic's "message too large" text, percent-encoded or not.
fn is_too_large(message: &str) -> bool {
    message.contains("message length too large")
        || message.contains("message%20length%20too%20large")
}

/// tonic's texts for a request that ended inside a message, or without one, percent-encoded or
/// not.
const CUT_SHORT: [(&str, &str); 2] = [
    (
        "Unexpected EOF decoding stream.",
        "Unexpected%20EOF%20decoding%20stream.",
    ),
    ("Missing request message.", "Missing%20request%20message."),
];

/// Whether `message` is one of tonic's [`CUT_SHORT`] texts.
fn is_cut_short(message: &str) -> bool {
    CUT_SHORT
        .iter()
        .any(|(plain, encoded)| message == *plain || message == *encoded)
}

/// What the client is told about a request cut short.
const CUT_SHORT_MESSAGE: &str =
    "the message could not be decoded: the request ended before a whole message arrived";

/// The status to send for a client-stream error: RESOURCE_EXHAUSTED for an oversized message,
/// INVALID_ARGUMENT for one cut short, anything else unchanged.
pub fn map_status(status: Status) -> Status {
    if status.code() == Code::OutOfRange && is_too_large(status.message()) {
        Status::resource_exhausted(format!(
            "{} (raise --max-message-bytes to accept larger messages)",
            status.message()
        ))
    } else if status.code() == Code::Internal && is_cut_short(status.message()) {
        Status::invalid_argument(CUT_SHORT_MESSAGE)
    } else {
        status
    }
}

/// A server layer turning tonic's OUT_OF_RANGE for oversized requests into RESOURCE_EXHAUSTED,
/// and its INTERNAL for requests cut short into INVALID_ARGUMENT.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageLimitStatus;

impl<S> tower_layer::Layer<S> for MessageLimitStatus {
    type Service = MessageLimitStatusService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MessageLimitStatusService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct MessageLimitStatusService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> tower_service::Service<http::Request<ReqBody>>
    for MessageLimitStatusService<S>
where
    S: tower_service::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let response = self.inner.call(request);
        Box::pin(async move {
            let mut response = response.await?;
            let headers = response.headers_mut();
            let out_of_range = headers
                .get("grpc-status")
                .is_some_and(|code| code.as_bytes() == b"11");
            let too_large = headers
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .is_some_and(is_too_large);
            if out_of_range && too_large {
                headers.insert("grpc-status", http::HeaderValue::from_static("8"));
            }
            let internal = headers
                .get("grpc-status")
                .is_some_and(|code| code.as_bytes() == b"13");
            let cut_short = headers
                .get("grpc-message")
                .and_then(|m| m.to_str().ok())
                .is_some_and(is_cut_short);
            if internal && cut_short {
                headers.insert("grpc-status", http::HeaderValue::from_static("3"));
                headers.insert(
                    "grpc-message",
                    http::HeaderValue::from_static(CUT_SHORT_MESSAGE),
                );
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_explanation_too_large_leaves_out_the_call_then_the_grant_then_the_rule() {
        let big = |n: usize| "x".repeat(n);
        let reply = pb::ExplainResponse {
            verdict: pb::CallStatus::Approved as i32,
            decided_by: "policy:r1".into(),
            reason: "rule r1 allows it".into(),
            rule: Some(pb::Rule {
                id: "r1".into(),
                description: big(100_000),
                ..Default::default()
            }),
            grant: Some(pb::Grant {
                id: 1,
                tool: big(100_000),
                ..Default::default()
            }),
            call: Some(pb::Call {
                input_json: big(100_000),
                ..Default::default()
            }),
            truncated: false,
            shadow_verdicts: Vec::new(),
            approval: None,
        };
        let cut = |limit: usize| fit_explanation(reply.clone(), limit);
        // Room for all of it: unchanged.
        assert_eq!(cut(RESERVED + 400_000), reply);
        // Then the call goes first, the grant next, the rule last; the answer always stays.
        for (limit, call, grant, rule) in [
            (RESERVED + 250_000, false, true, true),
            (RESERVED + 150_000, false, false, true),
            (RESERVED + 50_000, false, false, false),
        ] {
            let fitted = cut(limit);
            assert!(fitted.truncated, "{limit}");
            assert!(fitted.encoded_len() <= limit, "{limit}");
            assert_eq!(
                (
                    fitted.call.is_some(),
                    fitted.grant.is_some(),
                    fitted.rule.is_some()
                ),
                (call, grant, rule),
                "{limit}"
            );
            assert_eq!(
                (
                    fitted.verdict,
                    fitted.decided_by.as_str(),
                    fitted.reason.as_str()
                ),
                (reply.verdict, "policy:r1", "rule r1 allows it")
            );
        }
    }

    fn outcome(reason_bytes: usize) -> pb::Outcome {
        pb::Outcome {
            reason: "r".repeat(reason_bytes),
            ..Default::default()
        }
    }

    #[test]
    fn a_room_keeps_the_longest_prefix_that_fits_and_the_list_under_the_limit() {
        let limit = RESERVED + 10_000;
        let items: Vec<pb::Outcome> = (0..10).map(|_| outcome(3_000)).collect();
        let (kept, all) = Room::new(limit).fill(items.clone());
        assert!(!all);
        assert_eq!(kept.len(), 3);
        let reply = pb::DecideResponse {
            skipped: kept,
            truncated: true,
            skipped_count: 10,
            ..Default::default()
        };
        assert!(reply.encoded_len() <= limit);

        let (kept, all) = Room::new(limit).fill(items[..3].to_vec());
        assert!(all);
        assert_eq!(kept.len(), 3);
    }

    #[test]
    fn a_room_stops_at_the_first_item_that_does_not_fit() {
        let limit = RESERVED + 10_000;
        let items = vec![outcome(2_000), outcome(9_000), outcome(10)];
        let (kept, all) = Room::new(limit).fill(items);
        assert!(!all);
        assert_eq!(kept.len(), 1, "order is kept: nothing after a gap");
    }

    #[test]
    fn a_reply_limit_that_cannot_hold_one_call_is_refused_naming_the_settings() {
        assert_eq!(reply_limit(4 << 20, 8 << 20, 256 << 10).unwrap(), 4 << 20);
        assert_eq!(reply_limit(4 << 20, 1 << 20, 256 << 10).unwrap(), 1 << 20);
        let err = reply_limit(300 << 10, 8 << 20, 256 << 10).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.to_string().contains("--max-reply-bytes"), "{err}");
    }
}
