//! The approval inbox on the broker's own port: a browser's HTTP/1.1 `GET /` gets the embedded
//! page, and its gRPC-Web calls reach the same services with the same tokens (a bad or missing
//! token is UNAUTHENTICATED). The requests are written by hand on a plain TCP socket, byte for
//! byte as a browser's `fetch` sends them, so nothing here depends on a gRPC-Web client library.

use std::net::SocketAddr;
use std::time::Duration;

use approval_broker::config::Config;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use prost::Message as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tonic::metadata::MetadataValue;

use crate::connections::{Ended, read_until_closed};
use crate::helpers::*;

const AGENT: &str = "token-of-the-agent";
const ALICE: &str = "token-of-alice";

fn with_tokens(config: &mut Config) {
    config.auth.tokens = Some(format!(
        "agent agent-a {}; approver alice {}",
        hash_token(AGENT),
        hash_token(ALICE)
    ));
}

/// An HTTP/1.1 response, its body de-chunked.
struct Http1Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Http1Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one HTTP/1.1 request (`Connection: close`) and reads the whole response.
async fn http1(address: SocketAddr, head: &str, body: &[u8]) -> Http1Response {
    let mut socket = TcpStream::connect(address).await.expect("connect");
    socket.write_all(head.as_bytes()).await.expect("write");
    socket.write_all(body).await.expect("write");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut raw))
        .await
        .expect("the response ends")
        .expect("read");
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head");
    let head = String::from_utf8(raw[..end].to_vec()).expect("ASCII head");
    let mut lines = head.split("\r\n");
    let status = lines.next().expect("status line")[9..12]
        .parse()
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .map(|line| {
            let (name, value) = line.split_once(':').expect("a header");
            (name.trim().to_owned(), value.trim().to_owned())
        })
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers.iter().any(|(n, v)| {
        n.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    Http1Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut chunked: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    loop {
        let line_end = chunked
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = std::str::from_utf8(&chunked[..line_end]).expect("hex");
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).expect("hex");
        chunked = &chunked[line_end + 2..];
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&chunked[..size]);
        chunked = &chunked[size + 2..];
    }
}

/// The messages and trailers of a gRPC-Web response body.
struct GrpcWebReply {
    messages: Vec<Vec<u8>>,
    trailers: String,
}

impl GrpcWebReply {
    fn parse(mut body: &[u8]) -> GrpcWebReply {
        let mut reply = GrpcWebReply {
            messages: Vec::new(),
            trailers: String::new(),
        };
        while body.len() >= 5 {
            let flags = body[0];
            let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
            let payload = &body[5..5 + length];
            if flags & 0x80 != 0 {
                reply.trailers = String::from_utf8(payload.to_vec()).expect("ASCII trailers");
            } else {
                reply.messages.push(payload.to_vec());
            }
            body = &body[5 + length..];
        }
        reply
    }

    fn status(&self) -> Option<&str> {
        self.trailers.lines().find_map(|line| {
            line.strip_prefix("grpc-status:")
                .map(str::trim)
                .map(|code| code.trim_end_matches('\r'))
        })
    }
}

/// A unary gRPC-Web call over HTTP/1.1, as `@connectrpc/connect-web` sends it.
async fn grpc_web_call(
    address: SocketAddr,
    method: &str,
    token: Option<&str>,
    request: &impl prost::Message,
) -> (Http1Response, GrpcWebReply) {
    let message = request.encode_to_vec();
    let mut body = vec![0];
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(&message);
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "POST {method} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/grpc-web+proto\r\nX-Grpc-Web: 1\r\n{authorization}\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    let response = http1(address, &head, &body).await;
    let reply = GrpcWebReply::parse(&response.body);
    (response, reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_root_over_http1_returns_the_embedded_inbox_page_with_its_files() {
    let app = spawn_app_on(Backend::Sqlite, with_tokens).await;
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let page = http1(app.address, &get("/"), b"").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(page.body, include_bytes!("../../web/dist/index.html"));
    // No other site may frame the page, nor may it load anything but its own files.
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    let policy = page.header("content-security-policy").expect("a policy");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(policy.contains("connect-src 'self'"), "{policy}");

    let script = http1(app.address, &get("/inbox.js"), b"").await;
    assert_eq!(script.status, 200);
    assert_eq!(
        script.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(script.body, include_bytes!("../../web/dist/inbox.js"));
    let style = http1(app.address, &get("/inbox.css"), b"").await;
    assert_eq!(
        style.header("content-type"),
        Some("text/css; charset=utf-8")
    );
    assert_eq!(style.body, include_bytes!("../../web/dist/inbox.css"));

    // A request shorter than the HTTP/2 preface is told apart as soon as its first byte.
    let short = http1(app.address, "GET / HTTP/1.0\r\n\r\n", b"").await;
    assert_eq!(short.status, 200);
    assert_eq!(short.body, include_bytes!("../../web/dist/index.html"));

    // Nothing else is served from the page's side: no file system, no other path.
    let other = http1(app.address, &get("/Cargo.toml"), b"").await;
    assert_ne!(other.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_web_call_with_a_good_token_is_answered_and_a_bad_or_missing_token_is_unauthenticated()
 {
    let app = spawn_app_on(Backend::Sqlite, with_tokens).await;
    let mut agent = pb::agent_service_client::AgentServiceClient::with_interceptor(
        app.channel.clone(),
        |mut request: tonic::Request<()>| {
            let value: MetadataValue<_> = format!("Bearer {AGENT}").parse().expect("header");
            request.metadata_mut().insert("authorization", value);
            Ok(request)
        },
    );
    agent
        .submit(pb::SubmitRequest {
            batch: Some(batch(
                "s1",
                vec![call("c1", "shell", r#"{"command":"ls"}"#)],
            )),
        })
        .await
        .expect("submitted");

    let list = "/approvals.v1.ApproverService/ListPending";
    let request = pb::ListPendingRequest::default();
    let (response, reply) = grpc_web_call(app.address, list, Some(ALICE), &request).await;
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("content-type"),
        Some("application/grpc-web+proto")
    );
    assert_eq!(reply.status(), Some("0"), "trailers: {}", reply.trailers);
    let pending = pb::ListPendingResponse::decode(&reply.messages[0][..]).expect("a reply");
    let ids: Vec<_> = pending.calls.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["c1"]);

    for token in [Some("not-a-token"), None] {
        let (response, reply) = grpc_web_call(app.address, list, token, &request).await;
        // gRPC-Web carries the status in the headers when there is no message.
        let status = response
            .header("grpc-status")
            .or(reply.status())
            .map(str::to_owned);
        assert_eq!(status.as_deref(), Some("16"), "token {token:?}");
        assert!(reply.messages.is_empty(), "token {token:?}: no data");
    }

    // An agent's token is not an approver's, over gRPC-Web as over gRPC.
    let (response, reply) = grpc_web_call(app.address, list, Some(AGENT), &request).await;
    let status = response.header("grpc-status").or(reply.status());
    assert_eq!(status, Some("7"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connection_that_stops_inside_its_request_head_is_closed_after_the_handshake_timeout()
 {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.handshake_timeout = Duration::from_millis(300);
    })
    .await;
    let mut halting = TcpStream::connect(app.address).await.expect("connect");
    halting
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    assert_eq!(read_until_closed(&mut halting).await, Ended::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_inbox_off_no_page_is_served_and_http1_is_refused() {
    let app = spawn_app_on(Backend::Sqlite, |config| config.serve.inbox = false).await;
    let mut socket = TcpStream::connect(app.address).await.expect("connect");
    socket
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), socket.read_to_end(&mut raw)).await;
    assert!(
        !raw.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    // gRPC is served as before.
    approve_nothing_pending(&app).await;
}

async fn approve_nothing_pending(app: &TestApp) {
    let pending = app
        .approver()
        .list_pending(pb::ListPendingRequest::default())
        .await
        .expect("gRPC is served");
    assert!(pending.into_inner().calls.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_browsers_are_answered_only_at_localhost_or_an_address() {
    // Authentication off: a page under another site's name (DNS rebinding) must not reach it.
    let app = spawn_app().await;
    let get = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let port = app.address.port();
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        assert_eq!(
            http1(app.address, &get(&host), b"").await.status,
            200,
            "{host}"
        );
    }
    let rebound = http1(app.address, &get(&format!("evil.example:{port}")), b"").await;
    assert_eq!(rebound.status, 403);
    let (response, reply) = grpc_web_call(
        app.address,
        "/approvals.v1.ApproverService/ListPending",
        None,
        &pb::ListPendingRequest::default(),
    )
    .await;
    // `grpc_web_call` names the address itself (an IP): answered.
    assert_eq!(response.status, 200);
    assert_eq!(reply.status(), Some("0"), "trailers: {}", reply.trailers);
    // gRPC clients (HTTP/2) are not affected, whatever name they use.
    approve_nothing_pending(&app).await;

    // With tokens, a caller needs one whatever the name: the page is served under any name
    // (`get_root_over_http1_...` asks for it as `Host: x`).
}
