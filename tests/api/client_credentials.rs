//! Agents as service clients of an identity provider (client credentials), and an identity
//! provider behind a private CA. A token endpoint on loopback, played by the test, signs JWTs
//! with a key its JWKS publishes: the adapters' token source fetches a token once and keeps it,
//! renews it at four fifths of its lifetime, keeps it while the provider is down until it
//! expires and then has none, saying why; the Claude Code hook gets its token there, replaces
//! one the broker refuses, and denies, saying why, when there is none. Served over HTTPS with a certificate of a test CA, the
//! provider's keys and token are had only with that CA (`--jwt-ca-file`, `--oauth-ca-file`),
//! and refused without it. (The same with a real OpenID provider and the Python and TypeScript
//! clients: .ci/identity-agents.)

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use approval_broker::agent::token_source::{ClientCredentials, ClientCredentialsArgs};
use approval_broker::config::Config;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::Code;

use crate::helpers::*;
use crate::routing::{approver_as, bearer};

use crate::jwt::tokens::{Signer, jwks, now};

const AUDIENCE: &str = "approval-broker";
/// A static approver token, configured beside the issuer.
const APPROVER: &str = "token-of-alice";

/// What the provider answers at its token endpoint, and what it was sent.
#[derive(Default)]
struct Grants {
    /// The lifetime of the tokens it issues, in seconds.
    ttl: AtomicU64,
    refuse: AtomicBool,
    /// The next token is signed by a key the JWKS does not publish (the broker refuses it).
    forge_next: AtomicBool,
    /// Each token request: its form and its `authorization` header.
    requests: Mutex<Vec<(String, Option<String>)>>,
}

/// An identity provider on loopback: discovery, JWKS, and a token endpoint issuing ES256 JWTs
/// for the service client `ci-bot`; over HTTPS with a test CA's certificate when `tls`.
struct Idp {
    issuer: String,
    grants: Arc<Grants>,
    server: JoinHandle<()>,
}

impl Idp {
    async fn start(tls: Option<&Authority>) -> Idp {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let issuer = format!("{scheme}://{}", listener.local_addr().expect("address"));
        let grants = Arc::new(Grants {
            ttl: AtomicU64::new(60),
            ..Grants::default()
        });
        let acceptor = tls.map(|ca| ca.acceptor(&["127.0.0.1"]));
        let signer = Arc::new((Signer::es256("ec-1"), Signer::es256("unpublished")));
        let (served_issuer, served_grants) = (issuer.clone(), grants.clone());
        let server = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (issuer, grants, signer) =
                    (served_issuer.clone(), served_grants.clone(), signer.clone());
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    match acceptor {
                        None => serve(tcp, &issuer, &grants, &signer).await,
                        Some(acceptor) => {
                            // A client that does not trust the certificate hangs up here.
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                serve(tls, &issuer, &grants, &signer).await;
                            }
                        }
                    }
                });
            }
        });
        Idp {
            issuer,
            grants,
            server,
        }
    }

    fn token_url(&self) -> String {
        format!("{}/token", self.issuer)
    }

    fn requests(&self) -> usize {
        self.grants.requests.lock().unwrap().len()
    }

    /// Stops listening: from now on nothing answers at its address.
    fn stop(&self) {
        self.server.abort();
    }
}

/// Answers one HTTP/1.1 request, then closes the connection.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    issuer: &str,
    grants: &Grants,
    (signer, forger): &(Signer, Signer),
) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).to_string();
    let header = |name: &str| {
        head.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while request.len() < head_end + length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let form = String::from_utf8_lossy(&request[head_end..]).to_string();
    let (status, body) = if head.starts_with("GET /.well-known/openid-configuration ") {
        let document = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks"),
                              "token_endpoint": format!("{issuer}/token")});
        ("200 OK", document.to_string())
    } else if head.starts_with("GET /jwks ") {
        ("200 OK", jwks(&[signer]))
    } else if head.starts_with("POST /token ") {
        grants
            .requests
            .lock()
            .unwrap()
            .push((form, header("authorization")));
        if grants.refuse.load(Ordering::SeqCst) {
            let refusal = json!({"error": "invalid_client", "error_description": "unknown client"});
            ("401 Unauthorized", refusal.to_string())
        } else {
            let ttl = grants.ttl.load(Ordering::SeqCst);
            let signer = if grants.forge_next.swap(false, Ordering::SeqCst) {
                forger
            } else {
                signer
            };
            let token = signer.sign(&json!({"iss": issuer, "aud": AUDIENCE, "client_id": "ci-bot",
                "sub": "ci-bot", "scope": "approval-agent", "iat": now(), "exp": now() + ttl as i64}));
            let answer = json!({"access_token": token, "token_type": "Bearer", "expires_in": ttl});
            ("200 OK", answer.to_string())
        }
    } else {
        ("404 Not Found", "{}".to_owned())
    };
    let _ = stream
        .write_all(
            format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await;
    let _ = stream.shutdown().await;
}

/// A test certificate authority.
struct Authority(CertifiedIssuer<'static, KeyPair>);

impl Authority {
    fn new() -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test identity CA");
        Authority(
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("ca"),
        )
    }

    /// Its certificate in a PEM file in `dir`.
    fn pem_file(&self, dir: &Path) -> PathBuf {
        let path = dir.join("identity-ca.pem");
        std::fs::write(&path, self.0.pem()).expect("write the CA");
        path
    }

    /// A TLS acceptor with a certificate for `names` that this authority signed.
    fn acceptor(&self, names: &[&str]) -> TlsAcceptor {
        let key = KeyPair::generate().expect("key");
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("params");
        let cert = params.signed_by(&key, &self.0).expect("sign");
        let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).expect("cert")];
        let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("key");
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("server config");
        TlsAcceptor::from(Arc::new(config))
    }
}

/// A secret file in `dir` with `mode`.
fn secret_file(dir: &Path, mode: u32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(format!("secret-{mode:o}"));
    std::fs::write(&path, "s3cret:&=\n").expect("write the secret");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    path
}

fn settings(idp: &Idp, secret: &Path) -> ClientCredentialsArgs {
    ClientCredentialsArgs {
        oauth_token_url: Some(idp.token_url()),
        oauth_client_id: Some("ci bot".into()),
        oauth_client_secret_file: Some(secret.to_owned()),
        oauth_scope: Some("approval-agent".into()),
        oauth_resource: Some("urn:approval-broker".into()),
        ..ClientCredentialsArgs::default()
    }
}

#[tokio::test]
async fn a_token_is_fetched_once_kept_while_fresh_and_renewed_at_four_fifths_of_its_life() {
    let dir = tempfile::tempdir().unwrap();
    let idp = Idp::start(None).await;
    idp.grants.ttl.store(2, Ordering::SeqCst);
    let source = ClientCredentials::new(&settings(&idp, &secret_file(dir.path(), 0o600))).unwrap();
    let first = source.token().await.unwrap();
    assert_eq!(source.token().await.unwrap(), first);
    assert_eq!(source.token().await.unwrap(), first);
    assert_eq!((source.requests(), idp.requests()), (1, 1));
    {
        let requests = idp.grants.requests.lock().unwrap();
        let (form, authorization) = &requests[0];
        assert_eq!(
            form,
            "grant_type=client_credentials&scope=approval-agent&resource=urn%3Aapproval-broker"
        );
        // RFC 6749 2.3.1: each part form-encoded, then HTTP Basic; the secret is not in the form.
        let basic = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            "ci+bot:s3cret%3A%26%3D",
        );
        assert_eq!(
            authorization.as_deref(),
            Some(format!("Basic {basic}").as_str())
        );
    }
    tokio::time::sleep(Duration::from_millis(1700)).await; // past 1.6 s of 2 s
    let renewed = source.token().await.unwrap();
    assert_ne!(renewed, first);
    assert_eq!(source.requests(), 2);
}

#[tokio::test]
async fn the_provider_down_the_held_token_works_until_it_expires_then_there_is_none() {
    let dir = tempfile::tempdir().unwrap();
    let idp = Idp::start(None).await;
    idp.grants.ttl.store(2, Ordering::SeqCst);
    let source = ClientCredentials::new(&settings(&idp, &secret_file(dir.path(), 0o600))).unwrap();
    let held = source.token().await.unwrap();
    let fetched = tokio::time::Instant::now();
    idp.stop();
    tokio::time::sleep_until(fetched + Duration::from_millis(1700)).await;
    assert_eq!(
        source.token().await.unwrap(),
        held,
        "the held token, while it lasts"
    );
    tokio::time::sleep_until(fetched + Duration::from_millis(2200)).await;
    let none = source.token().await.unwrap_err();
    assert!(
        none.contains("could not be reached") && none.contains("has expired"),
        "{none}"
    );
}

#[tokio::test]
async fn refused_credentials_say_what_the_provider_said_and_a_refused_token_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let idp = Idp::start(None).await;
    let mut args = settings(&idp, &secret_file(dir.path(), 0o600));
    args.oauth_token_url = None;
    args.oauth_issuer = Some(idp.issuer.clone()); // the token endpoint from discovery
    let source = ClientCredentials::new(&args).unwrap();
    let first = source.token().await.unwrap();
    source.invalidate(&first).await;
    let second = source.token().await.unwrap();
    assert_ne!(first, second);
    source.invalidate("another token").await; // not the one held: kept
    assert_eq!(source.token().await.unwrap(), second);
    idp.grants.refuse.store(true, Ordering::SeqCst);
    source.invalidate(&second).await;
    let refused = source.token().await.unwrap_err();
    assert!(
        refused.contains("refused: invalid_client (unknown client)"),
        "{refused}"
    );
}

#[tokio::test]
async fn the_secret_comes_from_a_private_file_and_goes_only_over_https_or_to_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let idp = Idp::start(None).await;
    let shared = ClientCredentials::new(&settings(&idp, &secret_file(dir.path(), 0o644)));
    let why = shared.err().expect("a secret others may read is refused");
    assert!(
        why.contains("may be read by others") && why.contains("chmod 600"),
        "{why}"
    );
    let mut remote = settings(&idp, &secret_file(dir.path(), 0o600));
    remote.oauth_token_url = Some("http://idp.example.com/token".into());
    let why = ClientCredentials::new(&remote)
        .err()
        .expect("plain http elsewhere is refused");
    assert!(why.contains("https://"), "{why}");
}

/// The broker trusting `idp` for JWTs, with `ca` as `--jwt-ca-file` if given.
fn trusting(idp: &Idp, ca: Option<PathBuf>) -> impl FnOnce(&mut Config) {
    let issuer = idp.issuer.clone();
    move |config: &mut Config| {
        config.auth.jwt_issuer = Some(issuer);
        config.auth.jwt_audience = Some(AUDIENCE.into());
        config.auth.jwt_roles = Some("agent=approval-agent".into());
        config.auth.jwt_role_claims = "scope".into();
        config.auth.jwt_ca_file = ca;
        config.auth.tokens = Some(format!("approver alice {}", hash_token(APPROVER)));
    }
}

async fn list_as_agent(app: &TestApp, token: &str) -> Result<(), tonic::Status> {
    let mut agent = pb::agent_service_client::AgentServiceClient::with_interceptor(
        app.channel.clone(),
        bearer(token),
    );
    agent
        .get_outcomes(pb::GetOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec!["c1".into()],
        })
        .await
        .map(|_| ())
}

#[tokio::test]
async fn a_provider_behind_a_private_ca_is_trusted_with_its_ca_file_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Authority::new();
    let ca_file = ca.pem_file(dir.path());
    let idp = Idp::start(Some(&ca)).await;
    let mut args = settings(&idp, &secret_file(dir.path(), 0o600));

    // The token endpoint: only with the CA.
    let untrusting = ClientCredentials::new(&args).unwrap();
    let why = untrusting.token().await.unwrap_err();
    assert!(
        why.contains("could not be reached") && why.contains("TLS"),
        "{why}"
    );
    args.oauth_ca_file = Some(ca_file.clone());
    let token = ClientCredentials::new(&args)
        .unwrap()
        .token()
        .await
        .unwrap();

    // The keys: a broker with the CA file verifies the provider's token...
    let app = spawn_app_on(Backend::Sqlite, trusting(&idp, Some(ca_file))).await;
    let mut answered = list_as_agent(&app, &token).await;
    for _ in 0..100 {
        // The keys are fetched in the background at start.
        if answered.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        answered = list_as_agent(&app, &token).await;
    }
    answered.expect("a token of the provider behind the private CA");

    // ...and one without it cannot fetch the keys, so refuses it, saying so.
    let without = spawn_app_on(Backend::Sqlite, trusting(&idp, None)).await;
    let refused = list_as_agent(&without, &token).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains("could not be fetched"),
        "{refused:?}"
    );
}

/// Runs `approval-broker hook claude-code` with the client-credentials settings against `app`
/// on a PreToolUse input; its answer (`hookSpecificOutput`).
async fn hook(app: &TestApp, idp: &Idp, secret: &Path, call_id: &str) -> Value {
    let mut child = broker_binary()
        .env_remove("APPROVALS_BROKER_TOKEN")
        .args([
            "hook",
            "claude-code",
            "--broker",
            &format!("http://{}", app.address),
        ])
        .args(["--timeout", "20s", "--oauth-token-url", &idp.token_url()])
        .args([
            "--oauth-client-id",
            "ci-bot",
            "--oauth-scope",
            "approval-agent",
        ])
        .arg("--oauth-client-secret-file")
        .arg(secret)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the hook");
    let input = json!({"session_id": "hook-session", "transcript_path": "/tmp/t.jsonl",
        "cwd": "/tmp", "permission_mode": "default", "hook_event_name": "PreToolUse",
        "tool_name": "Bash", "tool_input": {"command": format!("echo {call_id}")},
        "tool_use_id": call_id});
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("write the hook input");
    let output = tokio::time::timeout(
        Duration::from_secs(40),
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .expect("the hook finished in time")
    .expect("join")
    .expect("hook output");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let answer: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    answer["hookSpecificOutput"].clone()
}

/// Approves `call_id` of `session` as the static approver, once the broker holds it pending.
async fn approve_when_pending(app: &TestApp, session: &str, call_id: &str) {
    let mut approver = approver_as(&app.channel, APPROVER);
    for _ in 0..400 {
        let pending = approver
            .list_pending(pb::ListPendingRequest::default())
            .await
            .expect("list pending")
            .into_inner();
        if let Some(call) =
            (pending.calls.iter()).find(|c| c.session_id == session && c.call_id == call_id)
        {
            let mut decision = decide_request(session, call_id, pb::Decision::Approve, "");
            decision.agent = call.agent.clone();
            approver.decide(decision).await.expect("decide");
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{call_id} never became pending");
}

#[tokio::test]
async fn the_hook_authenticates_with_the_providers_token_replaces_a_refused_one_and_denies_without_one()
 {
    let dir = tempfile::tempdir().unwrap();
    let idp = Idp::start(None).await;
    let secret = secret_file(dir.path(), 0o600);
    let app = spawn_app_on(Backend::Sqlite, trusting(&idp, None)).await;
    let (answer, ()) = tokio::join!(
        hook(&app, &idp, &secret, "toolu_1"),
        approve_when_pending(&app, "hook-session", "toolu_1")
    );
    assert_eq!(answer["permissionDecision"], "allow", "{answer}");
    assert_eq!(idp.requests(), 1, "one token for one hook run");

    // A token the broker refuses is replaced once, and the hook goes on with the new one.
    idp.grants.forge_next.store(true, Ordering::SeqCst);
    let (answer, ()) = tokio::join!(
        hook(&app, &idp, &secret, "toolu_3"),
        approve_when_pending(&app, "hook-session", "toolu_3")
    );
    assert_eq!(answer["permissionDecision"], "allow", "{answer}");
    assert_eq!(idp.requests(), 3, "the refused token and its replacement");

    idp.stop();
    let answer = hook(&app, &idp, &secret, "toolu_2").await;
    assert_eq!(answer["permissionDecision"], "deny", "{answer}");
    let reason = answer["permissionDecisionReason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("No access token") && reason.contains("could not be reached"),
        "{reason}"
    );
}
