//! Requests whose bytes do not decode (a string field that is not UTF-8, a message cut short, a
//! field of the wrong wire type) are the client's mistake: INVALID_ARGUMENT naming the decode
//! problem, never INTERNAL, and on `Connect` the stream ends with that status after answering
//! the requests before it. The bytes go over a real HTTP/2 gRPC call, framed as any client
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

backend_tests! {
    an_undecodable_unary_request_is_invalid_argument_naming_the_problem,
    an_undecodable_request_on_connect_ends_the_stream_with_invalid_argument,
}
