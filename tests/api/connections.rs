//! Connections and floods: a connection that never completes its handshake is closed; past
//! `--max-connections` new connections are closed while the open ones are served; a client that
//! floods PING or SETTINGS frames is sent away; Health/Watch streams are capped. The hostile
//! clients here write HTTP/2 frames by hand on a plain TCP socket, as an attacker would.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::helpers::*;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// An HTTP/2 frame: header and payload.
pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    bytes.extend_from_slice(&[kind, flags]);
    bytes.extend_from_slice(&stream.to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// How a connection ended, as its client saw it.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The server closed it (end of stream or reset).
    Closed,
    /// Still open after [`PATIENCE`].
    StillOpen,
}

/// Reads until the server closes the connection or [`PATIENCE`] runs out.
pub async fn read_until_closed(socket: &mut (impl tokio::io::AsyncRead + Unpin)) -> Ended {
    let mut sink = vec![0; 64 * 1024];
    let closed = tokio::time::timeout(PATIENCE, async {
        loop {
            match socket.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    if closed.is_ok() {
        Ended::Closed
    } else {
        Ended::StillOpen
    }
}

/// Reads the server's frames until it closes the connection; returns the error code of the
/// GOAWAY it sent, if one arrived, or `None` if the connection outlived [`PATIENCE`].
async fn goaway_until_closed(
    socket: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Option<Option<u32>> {
    let read = async {
        let mut goaway = None;
        loop {
            let mut header = [0u8; 9];
            if socket.read_exact(&mut header).await.is_err() {
                return goaway;
            }
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let mut payload = vec![0; length];
            if socket.read_exact(&mut payload).await.is_err() {
                return goaway;
            }
            if header[3] == GOAWAY {
                goaway = Some(u32::from_be_bytes([
                    payload[4], payload[5], payload[6], payload[7],
                ]));
            }
        }
    };
    tokio::time::timeout(PATIENCE, read).await.ok()
}

async fn health_check(channel: tonic::transport::Channel) -> Result<(), tonic::Status> {
    HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await
        .map(|_| ())
}

/// A fresh channel (its own connection) to `address`.
fn new_channel(address: SocketAddr) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect_lazy()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_nothing_is_closed_after_the_handshake_timeout() {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.handshake_timeout = Duration::from_millis(300);
    })
    .await;
    let mut silent = TcpStream::connect(app.address).await.expect("connect");
    assert_eq!(read_until_closed(&mut silent).await, Ended::Closed);
    // A client that sent only part of the preface is no better.
    let mut halting = TcpStream::connect(app.address).await.expect("connect");
    halting.write_all(&PREFACE[..10]).await.expect("write");
    assert_eq!(read_until_closed(&mut halting).await, Ended::Closed);
    // Clients that speak are served as before.
    health_check(new_channel(app.address))
        .await
        .expect("a real client is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_new_connections_are_closed_and_open_ones_are_served() {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.max_connections = 3;
        // Long enough that only the cap can close a connection in this test.
        config.connections.handshake_timeout = Duration::from_secs(600);
    })
    .await;
    // The app's own channel holds one connection; two idle sockets take the other places.
    health_check(app.channel.clone()).await.expect("health");
    let first_idle = TcpStream::connect(app.address).await.expect("connect");
    let _second_idle = TcpStream::connect(app.address).await.expect("connect");

    // Each extra connection is closed at once, however many come.
    for _ in 0..5 {
        let mut extra = TcpStream::connect(app.address).await.expect("connect");
        assert_eq!(read_until_closed(&mut extra).await, Ended::Closed);
    }
    // The connection within the cap still answers health checks, again and again.
    for _ in 0..3 {
        health_check(app.channel.clone())
            .await
            .expect("health on an open connection");
    }

    // A closed connection gives its place back.
    drop(first_idle);
    let mut served = false;
    for _ in 0..100 {
        if health_check(new_channel(app.address)).await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "a new client is served once a place is free");
}

/// Connects, sends the preface and an empty SETTINGS frame, then `flood` as fast as the server
/// takes it; returns what the client saw: the GOAWAY code, if any, once the server closed.
async fn flood_with(address: SocketAddr, flood: Vec<u8>, times: usize) -> Option<Option<u32>> {
    let socket = TcpStream::connect(address).await.expect("connect");
    flood_on(socket, flood, times).await
}

/// [`flood_with`] on a connection already made (a TLS one, say).
pub async fn flood_on(
    socket: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
    flood: Vec<u8>,
    times: usize,
) -> Option<Option<u32>> {
    let (mut reader, mut writer) = tokio::io::split(socket);
    let writing = tokio::spawn(async move {
        writer.write_all(PREFACE).await?;
        writer.write_all(&frame(SETTINGS, 0, 0, &[])).await?;
        for _ in 0..times {
            writer.write_all(&flood).await?;
        }
        // Keep the socket open: only the server may end this connection.
        tokio::time::sleep(PATIENCE * 2).await;
        Ok::<_, std::io::Error>(writer)
    });
    let seen = goaway_until_closed(&mut reader).await;
    writing.abort();
    seen
}

/// Floods a broker that allows 20 control frames a second with `flood` (one frame, sent 5,000
/// times): the connection must end with GOAWAY ENHANCE_YOUR_CALM, and other clients be served.
async fn a_flood_of(flood: Vec<u8>) {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.max_control_frames_per_second = 20;
    })
    .await;
    let seen = flood_with(app.address, flood, 5_000).await;
    assert_eq!(
        seen,
        Some(Some(ENHANCE_YOUR_CALM)),
        "closed with GOAWAY ENHANCE_YOUR_CALM (None: still served)"
    );
    health_check(new_channel(app.address))
        .await
        .expect("other clients are served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_gets_goaway_enhance_your_calm_and_the_connection_closed() {
    a_flood_of(frame(PING, 0, 0, b"12345678")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settings_flood_gets_goaway_enhance_your_calm_and_the_connection_closed() {
    a_flood_of(frame(SETTINGS, 0, 0, &[])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_few_pings_within_the_limit_leave_the_connection_open() {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.max_control_frames_per_second = 20;
    })
    .await;
    let mut socket = TcpStream::connect(app.address).await.expect("connect");
    socket.write_all(PREFACE).await.expect("write");
    socket
        .write_all(&frame(SETTINGS, 0, 0, &[]))
        .await
        .expect("write");
    for _ in 0..10 {
        socket
            .write_all(&frame(PING, 0, 0, b"12345678"))
            .await
            .expect("write");
    }
    // Every ping is answered, and the connection is not closed.
    let mut acks = 0;
    while acks < 10 {
        let mut header = [0u8; 9];
        tokio::time::timeout(PATIENCE, socket.read_exact(&mut header))
            .await
            .expect("a frame in time")
            .expect("the connection stays open");
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0; length];
        socket.read_exact(&mut payload).await.expect("payload");
        assert_ne!(header[3], GOAWAY, "no GOAWAY for a few pings");
        if header[3] == PING && header[4] & 1 == 1 {
            acks += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_health_watch_cap_a_new_watch_is_refused_and_checks_still_answer() {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.streams.max_health_watches = 2;
    })
    .await;
    let mut health = HealthClient::new(app.channel.clone());
    let mut watches = Vec::new();
    for _ in 0..2 {
        let mut watch = health
            .watch(HealthCheckRequest::default())
            .await
            .expect("watch")
            .into_inner();
        tokio::time::timeout(PATIENCE, watch.message())
            .await
            .expect("a status in time")
            .expect("stream healthy")
            .expect("a status");
        watches.push(watch);
    }
    assert_status(
        health.watch(HealthCheckRequest::default()).await,
        Code::ResourceExhausted,
        "--max-health-watches",
    );
    health_check(app.channel.clone())
        .await
        .expect("Check is not capped");

    // A closed watch frees its place.
    drop(watches.pop());
    let mut reopened = false;
    for _ in 0..100 {
        if health.watch(HealthCheckRequest::default()).await.is_ok() {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(reopened, "a watch can open once a place is free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_reflection_stream_cap_a_new_reflection_stream_is_refused() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.streams.max_reflection_streams = 2;
    })
    .await;
    let list = || ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    // Each stream stays open (its request stream is not closed) after its first answer.
    let mut open = Vec::new();
    let mut reflection = ServerReflectionClient::new(app.channel.clone());
    for _ in 0..2 {
        let (requests, rx) = tokio::sync::mpsc::channel(1);
        requests.send(list()).await.expect("send");
        let mut responses = reflection
            .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .expect("reflection")
            .into_inner();
        let first: Option<ServerReflectionResponse> =
            tokio::time::timeout(PATIENCE, responses.message())
                .await
                .expect("an answer in time")
                .expect("stream healthy");
        assert!(first.is_some(), "the services are listed");
        open.push((requests, responses));
    }
    let refused = reflection
        .server_reflection_info(tokio_stream::once(list()))
        .await;
    assert_status(refused, Code::ResourceExhausted, "--max-reflection-streams");

    // A closed stream frees its place.
    drop(open.pop());
    let mut reopened = false;
    for _ in 0..100 {
        let mut attempt = ServerReflectionClient::new(app.channel.clone());
        if attempt
            .server_reflection_info(tokio_stream::once(list()))
            .await
            .is_ok()
        {
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        reopened,
        "a reflection stream can open once a place is free"
    );
}

/// A connection from `source` (an address of the loopback network, 127.0.0.0/8) that speaks
/// HTTP/2's opening and then idles, as a greedy peer's sockets do; `None` if the broker closed it
/// at once instead of answering with its SETTINGS.
async fn idle_connection_from(source: &str, address: SocketAddr) -> Option<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{source}:0").parse().expect("source address"))
        .expect("bind the source address");
    let mut stream = socket.connect(address).await.expect("connect");
    let mut opening = PREFACE.to_vec();
    opening.extend(frame(SETTINGS, 0, 0, &[]));
    if stream.write_all(&opening).await.is_err() {
        return None;
    }
    let mut first = [0u8; 9];
    match tokio::time::timeout(PATIENCE, stream.read(&mut first)).await {
        Ok(Ok(n)) if n > 0 => Some(stream),
        _ => None,
    }
}

/// Health checks on new connections from 127.0.0.1, each of which must be answered within a
/// second or two (a probe's connection the client just dropped may still hold its place for a
/// moment, so a check may take another new connection, as a kubelet's next probe would).
async fn health_checks_get_through(address: SocketAddr, times: usize) {
    for n in 0..times {
        let mut last = None;
        for _ in 0..20 {
            match health_check(new_channel(address)).await {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if let Some(e) = last {
            panic!("health check {n}: 20 new connections in 2 s refused, the last with {e:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_greedy_address_holds_at_most_three_quarters_of_the_places_and_others_get_in() {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.max_connections = 8;
        config.connections.handshake_timeout = Duration::from_secs(600);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..10 {
        if let Some(socket) = idle_connection_from("127.0.0.2", app.address).await {
            held.push(socket);
        }
    }
    assert_eq!(
        held.len(),
        6,
        "three quarters of 8 places, the rest closed at once"
    );
    health_checks_get_through(app.address, 5).await;
    // Closing one gives the greedy address a place back (more, if a probe took one of its places
    // meanwhile), but never more than its share open at once.
    drop(held.pop());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = 0;
    for _ in 0..3 {
        if let Some(socket) = idle_connection_from("127.0.0.2", app.address).await {
            held.push(socket);
            again += 1;
        }
    }
    assert!(again >= 1, "a place given back is taken again");
    let open = still_open(&mut held).await;
    assert!(
        open <= 6,
        "never more than three quarters of 8 open: {open}"
    );
}

/// How many of `sockets` the broker has not closed: each is read until it ends (closed) or
/// stays quiet for a moment (open).
async fn still_open(sockets: &mut [TcpStream]) -> usize {
    let mut open = 0;
    for socket in sockets {
        let mut sink = [0u8; 1024];
        loop {
            match tokio::time::timeout(Duration::from_millis(100), socket.read(&mut sink)).await {
                Err(_) => {
                    open += 1;
                    break;
                }
                Ok(Ok(0) | Err(_)) => break,
                Ok(Ok(_)) => {}
            }
        }
    }
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_greedy_addresses_filling_every_place_cannot_keep_a_health_check_out() {
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.max_connections = 8;
        config.connections.handshake_timeout = Duration::from_secs(600);
    })
    .await;
    let greedy = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    let mut held = Vec::new();
    for round in 0..4 {
        for source in greedy {
            if let Some(socket) = idle_connection_from(source, app.address).await {
                held.push((round, source, socket));
            }
        }
    }
    // However the greedy addresses share the places, a new address gets one, again and again.
    health_checks_get_through(app.address, 5).await;
    let mut sockets: Vec<TcpStream> = held.into_iter().map(|(_, _, socket)| socket).collect();
    let open = still_open(&mut sockets).await;
    assert!(
        open < 8,
        "the greedy addresses no longer hold every place ({open} open)"
    );
}

/// A raw HTTP/2 connection from `source`: every request on it goes over this one connection,
/// so a request that fails after it was closed shows it was closed (a gRPC channel would
/// quietly connect again).
struct OneConnection {
    client: h2::client::SendRequest<prost::bytes::Bytes>,
    address: SocketAddr,
}

impl OneConnection {
    /// `None` when the broker closes it before it is ready.
    async fn open(source: &str, address: SocketAddr) -> Option<OneConnection> {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(format!("{source}:0").parse().expect("source address"))
            .expect("bind the source address");
        let tcp = socket.connect(address).await.ok()?;
        let (client, connection) = h2::client::handshake(tcp).await.ok()?;
        tokio::spawn(connection);
        Some(OneConnection { client, address })
    }

    /// The `grpc-status` of a call of `path` with an empty request, with `token` if given;
    /// `None` when the connection is gone.
    async fn call(&mut self, path: &str, token: Option<&str>) -> Option<String> {
        use tonic::codegen::http;
        let mut client = self.client.clone().ready().await.ok()?;
        let mut request = http::Request::post(format!("http://{}{path}", self.address))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let (response, mut send) = client
            .send_request(request.body(()).expect("request"), false)
            .ok()?;
        // An empty request message: the 5-byte gRPC frame header alone.
        send.send_data(prost::bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)
            .ok()?;
        let response = tokio::time::timeout(PATIENCE, response).await.ok()?.ok()?;
        let (parts, mut body) = response.into_parts();
        if let Some(status) = parts.headers.get("grpc-status") {
            return Some(status.to_str().ok()?.to_owned());
        }
        while let Some(chunk) = body.data().await {
            chunk.ok()?;
        }
        let trailers = body.trailers().await.ok()??;
        Some(trailers.get("grpc-status")?.to_str().ok()?.to_owned())
    }
}

const LIST_PENDING: &str = "/approvals.v1.ApproverService/ListPending";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// With authentication on, connections that have not authenticated share three quarters of the
/// places, and only they make room for newcomers: idle sockets from many addresses (each holding
/// as few as an agent) take turns at the budget, while the connections that authenticated keep
/// their places, and a probe from an address of its own still gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_connections_that_never_authenticate_cannot_push_out_those_that_did() {
    const TOKEN: &str = "approver-token";
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.connections.max_connections = 8;
        config.connections.handshake_timeout = Duration::from_secs(600);
        config.auth.tokens = Some(format!(
            "approver alice {}",
            approval_broker::door::auth::hash_token(TOKEN)
        ));
    })
    .await;
    let mut agents = Vec::new();
    for source in ["127.0.1.1", "127.0.1.2"] {
        let mut agent = OneConnection::open(source, app.address)
            .await
            .expect(source);
        assert_eq!(
            agent.call(LIST_PENDING, Some(TOKEN)).await.as_deref(),
            Some("0")
        );
        agents.push(agent);
    }
    // Twelve idle sockets, one from each of twelve addresses: at most six open at a time.
    let mut idle = Vec::new();
    for n in 2..14 {
        if let Some(socket) = idle_connection_from(&format!("127.0.2.{n}"), app.address).await {
            idle.push(socket);
        }
    }
    for n in 1..4 {
        let source = format!("127.0.3.{n}");
        let mut probe = OneConnection::open(&source, app.address)
            .await
            .expect(&source);
        assert_eq!(
            probe.call(HEALTH_CHECK, None).await.as_deref(),
            Some("0"),
            "probe {n}"
        );
    }
    let open = still_open(&mut idle).await;
    assert!(
        open <= 6,
        "the unauthenticated hold at most 6 of 8 places: {open} open"
    );
    for (n, agent) in agents.iter_mut().enumerate() {
        assert_eq!(
            agent.call(LIST_PENDING, Some(TOKEN)).await.as_deref(),
            Some("0"),
            "agent {n}'s connection, authenticated, is still open"
        );
    }
}
