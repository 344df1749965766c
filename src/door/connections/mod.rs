//! Client connections, before gRPC sees them: the broker accepts TCP itself so that no client
//! can hold a file descriptor for nothing. A connection beyond `--max-connections` is closed at
//! once, no one peer address may hold all the places, nor (with authentication on) may the
//! connections that have not authenticated (`peers`); one that has not finished its TLS
//! handshake and sent its first bytes (the HTTP/2
//! client preface, or the start of an HTTP/1.1 request) within `--handshake-timeout` is closed;
//! and every admitted HTTP/2 connection goes to tonic inside the
//! [`FloodGuard`](flood::FloodGuard), which ends PING and SETTINGS floods. TLS is done here,
//! not by tonic, so the guard sees frames rather than ciphertext.
//!
//! HTTP/1.1 is how a browser reaches a plain `http://` broker: the inbox page and its gRPC-Web
//! calls (see `inbox`). Such a connection is told apart by its first bytes, which are not the
//! HTTP/2 preface; it has no PING or SETTINGS frames to flood with, and holds one request at a
//! time. With `--inbox false` it is not told apart: hyper refuses it as before.
//!
//! Nothing here may stall the accept loop: each handshake runs in a task of its own.

pub mod flood;
pub mod peers;

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::observe::meters;
use flood::FloodGuard;
use peers::{Held, Peers};

/// What every HTTP/2 client sends first (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How connections are admitted.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// The most client connections open at once, handshakes included.
    pub max_connections: usize,
    /// How long a new connection has to finish TLS and send the HTTP/2 preface.
    pub handshake_timeout: Duration,
    /// PING frames, and apart from them SETTINGS frames, a client may send in a second.
    pub max_control_frames_per_second: u32,
    /// Whether HTTP/1.1 connections (browsers on `http://`, for the inbox) are admitted.
    pub http1: bool,
    /// Whether the broker takes tokens: connections that have not authenticated then share a
    /// budget smaller than `max_connections` (see `peers`).
    pub authenticated: bool,
}

/// The connections tonic serves: admitted and past their handshake.
pub enum Connection {
    /// HTTP/2 (gRPC, and gRPC-Web over TLS), flood-guarded.
    Http2(FloodGuard<ClientIo>),
    /// HTTP/1.1 (a browser on `http://`): its first bytes are replayed to hyper.
    Http1(Rewound<ClientIo>),
}

/// Accepts connections on `listener` and yields each one once its handshake is done, until the
/// stream is dropped (tonic drops it when it stops accepting; the listener closes with it).
pub fn admit(
    listener: TcpListener,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
) -> ReceiverStream<io::Result<Connection>> {
    warn_if_above_file_limit(limits.max_connections);
    let (ready, incoming) = mpsc::channel(64);
    let admission = Arc::new(Admission {
        slots: Arc::new(Semaphore::new(limits.max_connections)),
        peers: Peers::new(limits.max_connections, limits.authenticated),
        limits,
        tls,
    });
    tokio::spawn(accept(listener, admission, ready));
    ReceiverStream::new(incoming)
}

struct Admission {
    limits: ConnectionLimits,
    slots: Arc<Semaphore>,
    /// Who holds the places: no one address takes them all (see `peers`).
    peers: Arc<Peers>,
    tls: Option<TlsAcceptor>,
}

async fn accept(
    listener: TcpListener,
    admission: Arc<Admission>,
    ready: mpsc::Sender<io::Result<Connection>>,
) {
    let mut refusals = Refusals::default();
    let mut peer_refusals = Refusals::default();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = ready.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => (tcp, peer.ip()),
                Err(e) => {
                    // Out of file descriptors, usually: wait for some to close rather than spin.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(held) = admission.peers.join(peer) else {
            drop(tcp);
            meters::connection_refused();
            peer_refusals.note_peer(peer, peers::per_peer_cap(admission.limits.max_connections));
            continue;
        };
        // Every place taken, or (with authentication on) the connections that have not
        // authenticated over their budget: a newcomer from a less busy address takes the place of
        // one of the busiest's (only an unvouched one, with authentication on), which comes free
        // once its closed connection ends; anyone else is refused.
        let permit = match admission.take_slot() {
            Some(permit) if !admission.peers.over_unvouched_budget() => Some(permit),
            slot if admission.peers.make_room_for(peer) => {
                meters::connection_closed("room_for_another_peer");
                slot
            }
            slot => {
                let unvouched = slot.is_some();
                drop((slot, tcp, held));
                meters::connection_refused();
                refusals.note(admission.limits.max_connections, unvouched);
                continue;
            }
        };
        // Nagle off: a reply is a small write that must leave at once, not wait up to 40 ms for
        // the peer's delayed ACK.
        let _ = tcp.set_nodelay(true);
        let admission = Arc::clone(&admission);
        let ready = ready.clone();
        tokio::spawn(async move {
            let timeout = admission.limits.handshake_timeout;
            let admitted = async {
                let slot = match permit {
                    Some(slot) => slot,
                    None => admission.slot_coming_free().await,
                };
                admission.handshake(tcp, slot, held).await
            };
            match tokio::time::timeout(timeout, admitted).await {
                Ok(Ok(connection)) => {
                    let _ = ready.send(Ok(connection)).await;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "a connection failed its handshake"),
                Err(_) => {
                    tracing::debug!(
                        ?timeout,
                        "closing a connection that did not complete its handshake in time \
                         (--handshake-timeout)"
                    );
                    meters::connection_closed("handshake_timeout");
                }
            }
        });
    }
}

impl Admission {
    fn take_slot(&self) -> Option<Slot> {
        let permit = Arc::clone(&self.slots).try_acquire_owned().ok()?;
        Some(self.slot(permit))
    }

    /// The next place given back (the one a closed connection frees, or any other).
    async fn slot_coming_free(&self) -> Slot {
        let permit = Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        self.slot(permit)
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        let slot = Slot {
            permit: Some(permit),
            slots: Arc::clone(&self.slots),
            max: self.limits.max_connections,
        };
        slot.count();
        slot
    }

    /// TLS, if configured, then the HTTP/2 client preface (or, with HTTP/1.1 admitted, the first
    /// bytes that show a connection is not HTTP/2).
    async fn handshake(&self, tcp: TcpStream, slot: Slot, held: Held) -> io::Result<Connection> {
        let info = TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: tcp.peer_addr().ok(),
        };
        let transport = match &self.tls {
            None => Transport::Plain(tcp),
            Some(tls) => Transport::Tls(Box::new(tls.accept(tcp).await?)),
        };
        let mut io = ClientIo {
            transport,
            info,
            held,
            _slot: slot,
        };
        let first = read_first_bytes(&mut io, self.limits.http1).await?;
        if first.as_slice() == PREFACE {
            Ok(Connection::Http2(FloodGuard::new(
                io,
                first,
                self.limits.max_control_frames_per_second,
            )))
        } else if self.limits.http1 {
            Ok(Connection::Http1(Rewound::new(io, first)))
        } else {
            // Not checked further: anything but HTTP/2 is hyper's to refuse, as before.
            Ok(Connection::Http2(FloodGuard::new(
                io,
                first,
                self.limits.max_control_frames_per_second,
            )))
        }
    }
}

/// The most an HTTP/1.1 connection's first request head may take (request line and headers).
const MAX_HTTP1_HEAD: usize = 16 * 1024;

/// Reads the client's first bytes: the HTTP/2 preface; or, when `http1` is admitted and they
/// stop matching the preface, the whole head of the first HTTP/1.1 request, so that a browser's
/// connection too has `--handshake-timeout` to say what it wants, not hyper's 30 seconds.
async fn read_first_bytes(io: &mut ClientIo, http1: bool) -> io::Result<Vec<u8>> {
    let mut first = Vec::with_capacity(PREFACE.len());
    let mut chunk = [0; 1024];
    loop {
        let want = if http1 && !PREFACE.starts_with(&first) {
            if first.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(first);
            }
            if first.len() >= MAX_HTTP1_HEAD {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "an HTTP/1.1 request head too large",
                ));
            }
            chunk.len().min(MAX_HTTP1_HEAD - first.len())
        } else if first.len() == PREFACE.len() {
            return Ok(first);
        } else {
            // Never past the preface: what follows it is the flood guard's to read.
            PREFACE.len() - first.len()
        };
        let n = io.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        first.extend_from_slice(&chunk[..n]);
    }
}

/// File descriptors the broker needs besides client connections: the database (a pool on
/// Postgres; the file, its WAL and index on SQLite), listeners, logs.
const OTHER_FILES: u64 = 64;

/// Warns at start when `--max-connections` could use up the open-file limit before the cap is
/// reached: then the database, not the cap, would be what fails ("unable to open database file").
fn warn_if_above_file_limit(max_connections: usize) {
    let Some(limit) = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| soft_open_files(&limits))
    else {
        return;
    };
    if max_connections as u64 + OTHER_FILES > limit {
        tracing::warn!(
            max_connections,
            open_file_limit = limit,
            "--max-connections is too close to the open-file limit (ulimit -n): raise the limit or \
             lower the cap, or the database may fail to open files before the cap is reached"
        );
    }
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text (Linux).
fn soft_open_files(limits: &str) -> Option<u64> {
    limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

/// One place among `--max-connections`, given back when the connection is dropped.
struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    slots: Arc<Semaphore>,
    max: usize,
}

impl Slot {
    fn count(&self) {
        meters::connections_open(self.max - self.slots.available_permits());
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        drop(self.permit.take());
        self.count();
    }
}

/// Says that connections are being refused, at most every ten seconds (a flood of refusals
/// must not become a flood of log lines); the metric counts each one.
#[derive(Default)]
struct Refusals {
    since_last_log: u64,
    last_log: Option<Instant>,
}

impl Refusals {
    /// Says (at most every ten seconds) that `peer` was refused for holding its share.
    fn note_peer(&mut self, peer: std::net::IpAddr, per_peer: usize) {
        if self.due() {
            tracing::warn!(
                %peer,
                refused = self.since_last_log,
                per_peer,
                "refusing connections from one address: it holds three quarters of \
                 --max-connections"
            );
            self.logged();
        }
    }

    fn due(&mut self) -> bool {
        const EVERY: Duration = Duration::from_secs(10);
        self.since_last_log += 1;
        self.last_log.is_none_or(|at| at.elapsed() >= EVERY)
    }

    fn logged(&mut self) {
        self.since_last_log = 0;
        self.last_log = Some(Instant::now());
    }

    /// `unvouched`: refused for the budget of connections that have not authenticated, not
    /// because every place is taken.
    fn note(&mut self, max: usize, unvouched: bool) {
        if self.due() {
            if unvouched {
                tracing::warn!(
                    refused = self.since_last_log,
                    budget = peers::per_peer_cap(max),
                    "refusing client connections: connections that have not authenticated hold                      three quarters of --max-connections, and none of them can make room"
                );
            } else {
                tracing::warn!(
                    refused = self.since_last_log,
                    max_connections = max,
                    "refusing client connections: --max-connections are open"
                );
            }
            self.logged();
        }
    }
}

/// An admitted client connection, plain or TLS, holding its place among `--max-connections`.
pub struct ClientIo {
    transport: Transport,
    info: TcpConnectInfo,
    /// Its peer's hold on the place; closed from outside to make room for another peer.
    held: Held,
    _slot: Slot,
}

enum Transport {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// What every request learns of its connection (in its extensions): the addresses, and the
/// connection's place, which the gate vouches for once a request authenticates ([`vouch`]).
#[derive(Clone)]
pub struct ClientInfo {
    pub tcp: TcpConnectInfo,
    place: Arc<peers::Closer>,
}

impl Connected for Connection {
    type ConnectInfo = ClientInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        let io = match self {
            Connection::Http2(io) => io.get_ref(),
            Connection::Http1(io) => &io.io,
        };
        ClientInfo {
            tcp: io.info.clone(),
            place: Arc::clone(io.held.closer_arc()),
        }
    }
}

/// A request with these extensions authenticated: its connection is vouched for, and leaves
/// the budget of connections that have not authenticated (see `peers`). Nothing for a request
/// that did not come through [`admit`] (an in-process test server).
pub fn vouch(extensions: &tonic::Extensions) {
    if let Some(info) = extensions.get::<ClientInfo>() {
        info.place.vouch();
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Http2(io) => Pin::new(io).poll_read(cx, buf),
            Connection::Http1(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Http2(io) => Pin::new(io).poll_write(cx, buf),
            Connection::Http1(io) => Pin::new(&mut io.io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Connection::Http2(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Connection::Http1(io) => Pin::new(&mut io.io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Connection::Http2(io) => io.is_write_vectored(),
            Connection::Http1(io) => io.io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Http2(io) => Pin::new(io).poll_flush(cx),
            Connection::Http1(io) => Pin::new(&mut io.io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Connection::Http2(io) => Pin::new(io).poll_shutdown(cx),
            Connection::Http1(io) => Pin::new(&mut io.io).poll_shutdown(cx),
        }
    }
}

/// A connection whose first bytes were read to tell its protocol: they are read again first.
pub struct Rewound<IO> {
    io: IO,
    first: Vec<u8>,
    replayed: usize,
}

impl<IO> Rewound<IO> {
    fn new(io: IO, first: Vec<u8>) -> Self {
        Self {
            io,
            first,
            replayed: 0,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewound<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < this.first.len() {
            let rest = &this.first[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Poll::Ready(closed) = this.held.closer().poll_closed(cx) {
            return Poll::Ready(Err(closed));
        }
        match &mut this.transport {
            Transport::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Transport::Tls(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().transport {
            Transport::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Transport::Tls(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().transport {
            Transport::Plain(io) => Pin::new(io).poll_write_vectored(cx, bufs),
            Transport::Tls(io) => Pin::new(io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.transport {
            Transport::Plain(io) => io.is_write_vectored(),
            Transport::Tls(io) => io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().transport {
            Transport::Plain(io) => Pin::new(io).poll_flush(cx),
            Transport::Tls(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().transport {
            Transport::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Transport::Tls(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

/// The TLS acceptor for `--tls-cert`/`--tls-key` (PEM), requiring client certificates signed by
/// `client_ca` (PEM) when given; it offers HTTP/2 only (ALPN `h2`), as tonic's own did.
pub fn tls_acceptor(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> crate::Result<TlsAcceptor> {
    use tokio_rustls::rustls::pki_types::pem::PemObject as _;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls::server::WebPkiClientVerifier;
    use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};

    let invalid = |setting: &str, e: &dyn std::fmt::Display| {
        crate::Error::invalid(setting, format!("cannot serve TLS: {e}"))
    };
    // One provider named here, whatever other crates enable: rustls refuses to guess.
    let provider = Arc::new(crypto::ring::default_provider());
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid("--tls-cert", &e))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| invalid("--tls-key", &e))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("--tls-cert", &e))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca) {
                let cert = cert.map_err(|e| invalid("--tls-client-ca", &e))?;
                roots
                    .add(cert)
                    .map_err(|e| invalid("--tls-client-ca", &e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .map_err(|e| invalid("--tls-client-ca", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| invalid("--tls-cert", &e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_open_file_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 1048576              files     \n";
        assert_eq!(soft_open_files(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(soft_open_files(unlimited), None);
        assert_eq!(soft_open_files(""), None);
    }
}
