//! Requests whose bytes do not decode (a string field that is not UTF-8, a message cut short, a
//! field of the wrong wire type) are the client's mistake: INVALID_ARGUMENT naming the decode
//! problem, never INTERNAL, and on `Connect` the stream ends with that status after answering
//! the requests before it. So is a request that ends inside a message. The bytes go over a real HTTP/2 gRPC call, framed as any client
//! frames them, with bodies no generated client would write.

use std::marker::PhantomData;

use approval_broker::proto::v1 as pb;
use prost::Message as _;
use prost::bytes::BufMut as _;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

use crate::helpers::*;

/// Sends raw message bodies, decodes replies as `U`.
struct RawCodec<U>(PhantomData<U>);

impl<U> Default for RawCodec<U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<U: prost::Message + Default + Send + 'static> Codec for RawCodec<U> {
    type Encode = Vec<u8>;
    type Decode = U;
    type Encoder = RawEncoder;
    type Decoder = ReplyDecoder<U>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> ReplyDecoder<U> {
        ReplyDecoder(PhantomData)
    }
}

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

struct ReplyDecoder<U>(PhantomData<U>);

impl<U: prost::Message + Default> Decoder for ReplyDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(format!("the broker's reply did not decode: {e}")))
    }
}

/// Bodies that do not decode as the request message, each with what the error must name.
/// Field 1 is a string (`session_id` of `GetOutcomesRequest`, `request_id` of `AgentRequest`).
const UNDECODABLE: [(&str, &[u8], &str); 3] = [
    (
        "a string that is not UTF-8",
        &[0x0a, 0x02, 0xff, 0xfe],
        "UTF-8",
    ),
    ("a field cut short", &[0x0a, 0x05, b'a'], "buffer underflow"),
    (
        "a varint where a string belongs",
        &[0x08, 0x01],
        "wire type",
    ),
];

fn assert_decode_refusal(status: &Status, case: &str, names: &str) {
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "{case}: {}",
        status.message()
    );
    assert!(
        status.message().contains("could not be decoded") && status.message().contains(names),
        "{case}: `{}` should name the decode problem ({names})",
        status.message()
    );
}

async fn an_undecodable_unary_request_is_invalid_argument_naming_the_problem(app: TestApp) {
    for (case, body, names) in UNDECODABLE {
        let mut grpc = tonic::client::Grpc::new(app.channel.clone());
        grpc.ready().await.expect("ready");
        let path = PathAndQuery::from_static("/approvals.v1.AgentService/GetOutcomes");
        let result = grpc
            .unary(
                tonic::Request::new(body.to_vec()),
                path,
                RawCodec::<pb::GetOutcomesResponse>::default(),
            )
            .await;
        let status = result.expect_err(case);
        assert_decode_refusal(&status, case, names);
    }
    // The broker serves on, as before.
    let response = submit(&app, batch("s", vec![call("a", "t", "{}")])).await;
    assert_eq!(response.acks.len(), 1);
}

async fn an_undecodable_request_on_connect_ends_the_stream_with_invalid_argument(app: TestApp) {
    for (case, body, names) in UNDECODABLE {
        let valid = pb::AgentRequest {
            request_id: "first".into(),
            request: Some(pb::agent_request::Request::Submit(batch(
                "s",
                vec![call(&format!("before {case}"), "t", "{}")],
            ))),
        }
        .encode_to_vec();
        let mut grpc = tonic::client::Grpc::new(app.channel.clone());
        grpc.ready().await.expect("ready");
        let path = PathAndQuery::from_static("/approvals.v1.AgentService/Connect");
        let requests = tokio_stream::iter(vec![valid, body.to_vec()]);
        let mut stream = grpc
            .streaming(
                tonic::Request::new(requests),
                path,
                RawCodec::<pb::AgentResponse>::default(),
            )
            .await
            .expect("connect")
            .into_inner();
        let first = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("in time")
            .expect("the request before is answered")
            .expect("a response");
        assert_eq!(first.request_id, "first", "{case}");
        assert!(
            matches!(
                first.response,
                Some(pb::agent_response::Response::Submitted(_))
            ),
            "{case}: {first:?}"
        );
        let ended = tokio::time::timeout(PATIENCE, stream.message())
            .await
            .expect("in time")
            .expect_err(case);
        assert_decode_refusal(&ended, case, names);
    }
}

/// A gRPC frame: no compression, the length, the message.
fn frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

/// `grpc-message` text as sent (percent-encoded, as the gRPC spec allows) made plain.
fn percent_decoded(text: &str) -> String {
    let mut bytes = Vec::new();
    let mut rest = text.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        match (first, tail) {
            (b'%', [high, low, tail @ ..]) => {
                let hex = std::str::from_utf8(&[*high, *low])
                    .expect("ASCII")
                    .to_owned();
                bytes.push(u8::from_str_radix(&hex, 16).expect("percent-encoded"));
                rest = tail;
            }
            _ => {
                bytes.push(first);
                rest = tail;
            }
        }
    }
    String::from_utf8(bytes).expect("UTF-8")
}

/// Sends `body` as a request's whole body over a raw HTTP/2 connection (so it may end inside a
/// frame, which no gRPC client sends) and returns the `grpc-status` and `grpc-message` the
/// broker ends the response with.
async fn raw_call(app: &TestApp, path: &str, body: Vec<u8>) -> (String, String) {
    use tonic::codegen::http;
    let tcp = tokio::net::TcpStream::connect(app.address)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = http::Request::post(format!("http://{}{path}", app.address))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(request, false).expect("send");
    send.send_data(prost::bytes::Bytes::from(body), true)
        .expect("send body");
    let response = tokio::time::timeout(PATIENCE, response)
        .await
        .expect("in time")
        .expect("response");
    let status = |headers: &http::HeaderMap| {
        let text = |name: &str| {
            headers
                .get(name)
                .map(|v| percent_decoded(v.to_str().expect("ASCII")))
                .unwrap_or_default()
        };
        headers
            .get("grpc-status")
            .map(|_| (text("grpc-status"), text("grpc-message")))
    };
    let (parts, mut body) = response.into_parts();
    if let Some(found) = status(&parts.headers) {
        return found;
    }
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("data");
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await.expect("trailers").expect("trailers");
    status(&trailers).expect("a grpc-status trailer")
}

async fn a_request_that_ends_inside_a_message_is_invalid_argument_never_internal(app: TestApp) {
    // A frame that promises ten bytes and brings two, then the request ends.
    let cut = frame(&[0x0a, 0x01, b'a', 0, 0, 0, 0, 0, 0, 0])[..7].to_vec();
    let (code, message) =
        raw_call(&app, "/approvals.v1.AgentService/GetOutcomes", cut.clone()).await;
    assert_eq!(code, "3", "INVALID_ARGUMENT: {message}");
    assert!(message.contains("could not be decoded"), "{message}");

    // A unary request without any message.
    let (code, message) = raw_call(&app, "/approvals.v1.AgentService/GetOutcomes", vec![]).await;
    assert_eq!(code, "3", "INVALID_ARGUMENT: {message}");

    // On Connect: the request before is answered, then the stream ends so.
    let valid = pb::AgentRequest {
        request_id: "first".into(),
        request: Some(pb::agent_request::Request::Submit(batch(
            "s",
            vec![call("a", "t", "{}")],
        ))),
    }
    .encode_to_vec();
    let mut body = frame(&valid);
    body.extend(cut);
    let (code, message) = raw_call(&app, "/approvals.v1.AgentService/Connect", body).await;
    assert_eq!(code, "3", "INVALID_ARGUMENT: {message}");
    assert!(message.contains("could not be decoded"), "{message}");
    assert!(
        matches!(
            states(&app, "s", &["a"]).await[0].state,
            Some(pb::call_state::State::Pending(_))
        ),
        "the request before the cut was served"
    );
}

backend_tests! {
    an_undecodable_unary_request_is_invalid_argument_naming_the_problem,
    an_undecodable_request_on_connect_ends_the_stream_with_invalid_argument,
    a_request_that_ends_inside_a_message_is_invalid_argument_never_internal,
}
