//! Oversized messages are a limit, and limits answer RESOURCE_EXHAUSTED (PRODUCT.md, guarantee 7).
//! tonic refuses a message over `--max-message-bytes` with OUT_OF_RANGE while decoding it: before
//! a unary or server-streaming handler runs (the status travels in the response headers, which
//! [`MessageLimitStatus`] rewrites), or inside a client stream (which the handler maps with
//! [`map_status`]).
//!
//! The same two places turn tonic's INTERNAL for a request that ends inside a message (its gRPC
//! frame promised more bytes than came), or a unary request without a message, into
//! INVALID_ARGUMENT: the client's mistake (guarantee 8). A message that arrives whole but does
//! not decode is the codec's to refuse (`codec.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::{Code, Status};

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
