//! TLS (rustls) and mutual TLS: with a certificate the broker serves only TLS; with a client CA
//! it serves only clients presenting a certificate that CA signed. The certificates are made
//! here, for each test.

use std::path::Path;
use std::time::Duration;

use approval_broker::config::Config;
use approval_broker::proto::v1 as pb;
use approval_broker::startup;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use tokio::net::TcpListener;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::helpers::*;

/// A certificate authority that signs server and client certificates.
struct Authority(CertifiedIssuer<'static, KeyPair>);

impl Authority {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca"))
    }

    fn pem(&self) -> String {
        self.0.pem()
    }

    /// A certificate for `names` and its private key, both PEM.
    fn issue(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        let cert = params.signed_by(&key, &self.0).expect("sign");
        (cert.pem(), key.serialize_pem())
    }
}

/// Starts a broker serving TLS with a certificate from `ca` (and requiring client certificates
/// signed by `client_ca`, if given). Returns its address.
async fn serve_tls(
    dir: &Path,
    ca: &Authority,
    client_ca: Option<&Authority>,
) -> std::net::SocketAddr {
    serve_tls_with(dir, ca, client_ca, |_| {}).await
}

/// [`serve_tls`], with the configuration adjusted by `configure`.
async fn serve_tls_with(
    dir: &Path,
    ca: &Authority,
    client_ca: Option<&Authority>,
    configure: impl FnOnce(&mut Config),
) -> std::net::SocketAddr {
    let (cert, key) = ca.issue(&["localhost"]);
    std::fs::write(dir.join("server.pem"), cert).expect("write");
    std::fs::write(dir.join("server.key"), key).expect("write");
    let mut config = Config::for_tests(format!("sqlite://{}", dir.join("a.db").display()));
    config.serve.tls_cert = Some(dir.join("server.pem"));
    config.serve.tls_key = Some(dir.join("server.key"));
    if let Some(client_ca) = client_ca {
        std::fs::write(dir.join("clients.pem"), client_ca.pem()).expect("write");
        config.serve.tls_client_ca = Some(dir.join("clients.pem"));
    }
    configure(&mut config);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(startup::run(listener, config, std::future::pending()));
    address
}

async fn channel(
    address: std::net::SocketAddr,
    tls: Option<ClientTlsConfig>,
) -> Result<Channel, tonic::transport::Error> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://localhost:{}", address.port()))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls)?;
    }
    // The broker may still be starting: retry the connection for a while.
    let mut last = None;
    for _ in 0..100 {
        match endpoint.connect().await {
            Ok(channel) => return Ok(channel),
            Err(err) => last = Some(err),
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    Err(last.expect("an error"))
}

/// Whether a ListPending through `channel` succeeds.
async fn serves(channel: Result<Channel, tonic::transport::Error>) -> bool {
    let Ok(channel) = channel else {
        return false;
    };
    ApproverServiceClient::new(channel)
        .list_pending(pb::ListPendingRequest::default())
        .await
        .is_ok()
}

fn trusting(ca: &Authority) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_certificate_the_broker_serves_tls_and_refuses_plaintext() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = Authority::new("server CA");
    let address = serve_tls(dir.path(), &ca, None).await;
    assert!(
        serves(channel(address, Some(trusting(&ca))).await).await,
        "a TLS client is served"
    );
    assert!(
        !serves(channel(address, None).await).await,
        "a plaintext client is not"
    );
    let stranger = Authority::new("someone else");
    assert!(
        !serves(channel(address, Some(trusting(&stranger))).await).await,
        "a client that does not trust the server's CA does not connect"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_clients_with_a_certificate_it_signed_are_served() {
    let dir = tempfile::tempdir().expect("dir");
    let server_ca = Authority::new("server CA");
    let client_ca = Authority::new("client CA");
    let address = serve_tls(dir.path(), &server_ca, Some(&client_ca)).await;

    let (cert, key) = client_ca.issue(&["agent-1"]);
    let with_cert = trusting(&server_ca).identity(Identity::from_pem(cert, key));
    assert!(
        serves(channel(address, Some(with_cert)).await).await,
        "a client with a signed certificate is served"
    );

    assert!(
        !serves(channel(address, Some(trusting(&server_ca))).await).await,
        "a client without a certificate is not"
    );
    let rogue = Authority::new("rogue CA");
    let (cert, key) = rogue.issue(&["agent-1"]);
    let with_rogue_cert = trusting(&server_ca).identity(Identity::from_pem(cert, key));
    assert!(
        !serves(channel(address, Some(with_rogue_cert)).await).await,
        "a client whose certificate another CA signed is not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_starts_its_tls_handshake_is_closed_after_the_timeout() {
    use crate::connections::{Ended, read_until_closed};
    let dir = tempfile::tempdir().expect("dir");
    let ca = Authority::new("server CA");
    let address = serve_tls_with(dir.path(), &ca, None, |config| {
        config.connections.handshake_timeout = Duration::from_millis(300);
    })
    .await;
    // Wait until the broker serves, so the silent socket below meets the real thing.
    assert!(serves(channel(address, Some(trusting(&ca))).await).await);
    let mut silent = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    assert_eq!(read_until_closed(&mut silent).await, Ended::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_flood_inside_tls_gets_goaway_enhance_your_calm() {
    use crate::connections::{ENHANCE_YOUR_CALM, PING, flood_on, frame};
    use tokio_rustls::rustls;
    let dir = tempfile::tempdir().expect("dir");
    let ca = Authority::new("server CA");
    let address = serve_tls_with(dir.path(), &ca, None, |config| {
        config.connections.max_control_frames_per_second = 20;
    })
    .await;
    assert!(serves(channel(address, Some(trusting(&ca))).await).await);

    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    let ca_der = rustls::pki_types::CertificateDer::from(ca.0.der().to_vec());
    roots.add(ca_der).expect("root");
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client))
        .connect("localhost".try_into().expect("name"), tcp)
        .await
        .expect("TLS handshake");
    let seen = flood_on(tls, frame(PING, 0, 0, b"12345678"), 5_000).await;
    assert_eq!(
        seen,
        Some(Some(ENHANCE_YOUR_CALM)),
        "closed with GOAWAY ENHANCE_YOUR_CALM (None: still served)"
    );
}

/// The Claude Code hook reaches a broker serving TLS (`https://`), checking its certificate
/// against `--ca-cert`; with a CA that did not sign it, the hook fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claude_code_hook_reaches_a_tls_broker_and_fails_closed_on_a_wrong_ca() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().expect("dir");
    let ca = Authority::new("broker ca");
    let address = serve_tls(dir.path(), &ca, None).await;
    let approver = ApproverServiceClient::new(
        channel(
            address,
            Some(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.pem()))),
        )
        .await
        .expect("a TLS channel"),
    );
    let other = Authority::new("another ca");
    for (name, pem, approved) in [
        ("right.pem", ca.pem(), true),
        ("wrong.pem", other.pem(), false),
    ] {
        std::fs::write(dir.path().join(name), pem).expect("write");
        let tool_use_id = format!("toolu_{name}");
        let input = serde_json::json!({
            "session_id": "tls-session",
            "transcript_path": "/tmp/transcript.jsonl",
            "cwd": "/work/project",
            "permission_mode": "default",
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": "ls"},
            "tool_use_id": tool_use_id,
        });
        let mut hook = broker_binary()
            .args(["hook", "claude-code", "--timeout", "30s", "--broker"])
            .arg(format!("https://localhost:{}", address.port()))
            .arg("--ca-cert")
            .arg(dir.path().join(name))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the hook");
        hook.stdin
            .take()
            .expect("stdin")
            .write_all(input.to_string().as_bytes())
            .expect("write");
        if approved {
            let mut decided = false;
            for _ in 0..400 {
                let mut client = approver.clone();
                let decision = client
                    .decide(decide_request(
                        "tls-session",
                        &tool_use_id,
                        pb::Decision::Approve,
                        "",
                    ))
                    .await;
                if decision.is_ok() {
                    decided = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            assert!(decided, "the hook's call reached the broker over TLS");
        }
        let output = tokio::task::spawn_blocking(move || hook.wait_with_output())
            .await
            .expect("join")
            .expect("hook output");
        assert!(output.status.success(), "{output:?}");
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
        let decision = &answer["hookSpecificOutput"]["permissionDecision"];
        if approved {
            assert_eq!(decision, "allow", "{answer}");
        } else {
            assert_eq!(decision, "deny", "{answer}");
            let reason = answer["hookSpecificOutput"]["permissionDecisionReason"].to_string();
            assert!(reason.contains("could not be reached"), "{reason}");
        }
    }
}
