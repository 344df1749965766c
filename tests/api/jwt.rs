//! JWT bearer tokens from an identity provider, end to end: a provider's discovery document and
//! JWKS served on loopback by the test, tokens it would sign for agents (client credentials),
//! approvers and admins, and forged ones. Agents, approvers and admins are who their tokens'
//! claims say; two JWT people make a quorum and one person with two tokens counts once; nobody
//! approves a call `requested_by` them in another spelling; groups from claims decide who may
//! see and decide a call; forged tokens are refused saying why; static tokens keep working
//! beside JWTs; and a broker whose provider is down still starts and refuses JWTs, saying so.

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::sync::LazyLock;

use approval_broker::config::Config;
use approval_broker::domain::policy::Approvers;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use serde_json::{Value, json};
use tonic::Code;

use crate::helpers::*;
use crate::routing::{admin_as, approver_as, bearer};

#[path = "jwt_tokens.rs"]
pub(crate) mod tokens;
use tokens::{Signer, hs256, jwks, now, unsigned};

const AUDIENCE: &str = "approval-broker";
/// A static admin token, configured beside the JWT issuer.
const ROOT: &str = "token-of-root";

/// A provider on loopback: its discovery document and JWKS (an ES256 and an RS256 key),
/// served from a thread for the whole test binary.
struct Idp {
    issuer: String,
    ec: Signer,
    rsa: Signer,
}

static IDP: LazyLock<Idp> = LazyLock::new(|| {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let issuer = format!("http://{}", listener.local_addr().expect("address"));
    let (ec, rsa) = (Signer::es256("ec-1"), Signer::rs256("rsa-1", false));
    let discovery = json!({"issuer": issuer, "jwks_uri": format!("{issuer}/jwks")}).to_string();
    let keys = jwks(&[&ec, &rsa]);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let line = String::from_utf8_lossy(&request);
            let (status, body) = if line.starts_with("GET /.well-known/openid-configuration ") {
                ("200 OK", discovery.as_str())
            } else if line.starts_with("GET /jwks ") {
                ("200 OK", keys.as_str())
            } else {
                ("404 Not Found", "{}")
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                 connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    Idp { issuer, ec, rsa }
});

/// JWTs of the loopback provider, and a static admin token beside them.
fn with_idp(config: &mut Config) {
    config.auth.tokens = Some(format!("admin root {}", hash_token(ROOT)));
    config.auth.jwt_issuer = Some(IDP.issuer.clone());
    config.auth.jwt_audience = Some(AUDIENCE.into());
    config.auth.jwt_roles =
        Some("admin=broker-admin; approver=approver; agent=approval-agent".into());
    config.auth.jwt_role_claims = "roles,scope".into();
}

fn with_a_default_of_two(config: &mut Config) {
    with_idp(config);
    config.policy.default_approvers = Some(Approvers {
        quorum: 2,
        ..Approvers::default()
    });
}

fn for_ops_only(config: &mut Config) {
    with_idp(config);
    config.policy.default_approvers = Some(Approvers {
        groups: vec!["ops".into()],
        ..Approvers::default()
    });
}

/// What the provider would sign for a person.
fn person_claims(email: &str, roles: &[&str], groups: &[&str]) -> Value {
    json!({"iss": IDP.issuer, "aud": AUDIENCE, "sub": format!("sub-{email}"), "email": email,
           "email_verified": true, "iat": now(), "exp": now() + 600, "roles": roles,
           "groups": groups})
}

fn person(email: &str, roles: &[&str], groups: &[&str]) -> String {
    IDP.ec.sign(&person_claims(email, roles, groups))
}

fn approver(email: &str, groups: &[&str]) -> String {
    person(email, &["approver"], groups)
}

/// A client-credentials token of the service client `client_id`, signed with the RSA key.
fn agent(client_id: &str) -> String {
    IDP.rsa.sign(
        &json!({"iss": IDP.issuer, "aud": AUDIENCE, "client_id": client_id,
                         "sub": client_id, "scope": "approval-agent", "iat": now(),
                         "exp": now() + 600}),
    )
}

async fn submit_as(app: &TestApp, token: &str, spec: pb::CallSpec) -> pb::SubmitResponse {
    AgentServiceClient::with_interceptor(app.channel.clone(), bearer(token))
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", vec![spec])),
        })
        .await
        .expect("submit")
        .into_inner()
}

async fn decide_as(
    app: &TestApp,
    token: &str,
    agent: &str,
    call_id: &str,
) -> Result<pb::DecideResponse, tonic::Status> {
    let mut request = decide_request("s", call_id, pb::Decision::Approve, "");
    request.agent = agent.into();
    request.approver = String::new();
    approver_as(&app.channel, token)
        .decide(request)
        .await
        .map(tonic::Response::into_inner)
}

async fn calls_seen_by(app: &TestApp, token: &str) -> Result<Vec<pb::Call>, tonic::Status> {
    admin_as(&app.channel, token)
        .list_calls(pb::ListCallsRequest::default())
        .await
        .map(|r| r.into_inner().calls)
}

async fn agents_approvers_and_admins_are_who_their_jwts_say(app: TestApp) {
    // The agent's identity is its token's `client_id`, canonical; the request names none.
    let ack = submit_as(&app, &agent("CI-Bot"), call("c1", "shell", "{}")).await;
    assert_eq!(ack_status(&ack, 0), CallStatus::Pending);
    let admin = person("Root@Example.com", &["broker-admin"], &[]);
    let calls = calls_seen_by(&app, &admin).await.expect("an admin by JWT");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].agent, "ci-bot");
    // A person's identity is their `email`, canonical, never the request's `approver`.
    let decided = decide_as(&app, &approver("Alice@Example.COM", &[]), "ci-bot", "c1")
        .await
        .expect("an approver by JWT");
    assert_eq!(
        decided.outcome.unwrap().decided_by,
        "approver:alice@example.com"
    );
    // An approver's JWT is no admin's; the static admin token works beside JWTs.
    let refused = calls_seen_by(&app, &approver("alice@example.com", &[]))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );
    assert_eq!(calls_seen_by(&app, ROOT).await.expect("static").len(), 1);
}

async fn two_people_by_jwt_make_a_quorum_and_one_person_with_two_tokens_counts_once(app: TestApp) {
    submit_as(&app, &agent("ci-bot"), call("d1", "deploy", "{}")).await;
    let first = decide_as(&app, &approver("alice@example.com", &[]), "ci-bot", "d1")
        .await
        .unwrap();
    assert!(
        first.outcome.is_none(),
        "one approval of two decides nothing"
    );
    // Alice again, with another token spelling her address another way: still one person.
    let mut claims = person_claims("ALICE@example.com", &["approver"], &[]);
    claims["exp"] = json!(now() + 900);
    let again = decide_as(&app, &IDP.rsa.sign(&claims), "ci-bot", "d1")
        .await
        .unwrap();
    assert!(again.outcome.is_none(), "{again:?}");
    let second = decide_as(&app, &approver("bob@example.com", &[]), "ci-bot", "d1")
        .await
        .unwrap();
    let outcome = second.outcome.expect("the second person decides");
    assert_eq!(status_of(&outcome), CallStatus::Approved);
    assert_eq!(
        outcome.decided_by,
        "approver:alice@example.com,bob@example.com"
    );
}

async fn nobody_approves_a_call_requested_by_them_in_another_spelling(app: TestApp) {
    let spec = pb::CallSpec {
        requested_by: "Carol@EXAMPLE.com".into(),
        ..call("c1", "shell", "{}")
    };
    submit_as(&app, &agent("ci-bot"), spec).await;
    let refused = decide_as(&app, &approver("carol@example.com", &[]), "ci-bot", "c1")
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("self-approval"),
        "{}",
        refused.message()
    );
    let approved = decide_as(&app, &approver("dave@example.com", &[]), "ci-bot", "c1")
        .await
        .unwrap();
    assert_eq!(
        approved.outcome.unwrap().decided_by,
        "approver:dave@example.com"
    );
}

async fn groups_from_the_tokens_claims_decide_who_sees_and_decides_a_call(app: TestApp) {
    submit_as(&app, &agent("ci-bot"), call("d1", "deploy", "{}")).await;
    let carol = approver("carol@example.com", &["sec"]);
    let pending = approver_as(&app.channel, &carol)
        .list_pending(pb::ListPendingRequest::default())
        .await
        .expect("list pending")
        .into_inner()
        .calls;
    assert!(pending.is_empty(), "an approver outside ops sees nothing");
    let refused = decide_as(&app, &carol, "ci-bot", "d1").await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound, "{}", refused.message());
    let bob = approver("bob@example.com", &["sec", "ops"]);
    let decided = decide_as(&app, &bob, "ci-bot", "d1").await.unwrap();
    assert_eq!(
        decided.outcome.unwrap().decided_by,
        "approver:bob@example.com"
    );
    // The groups recorded with the vote are those of the token that decided.
    let calls = calls_seen_by(&app, ROOT).await.unwrap();
    let votes = &calls[0].approval.as_ref().expect("an approval").votes;
    assert_eq!(votes.len(), 1);
    assert_eq!(votes[0].groups, ["ops", "sec"]);
}

backend_tests! {
    agents_approvers_and_admins_are_who_their_jwts_say => super::with_idp,
    two_people_by_jwt_make_a_quorum_and_one_person_with_two_tokens_counts_once =>
        super::with_a_default_of_two,
    nobody_approves_a_call_requested_by_them_in_another_spelling => super::with_idp,
    groups_from_the_tokens_claims_decide_who_sees_and_decides_a_call => super::for_ops_only,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_and_misdirected_tokens_are_unauthenticated_saying_which() {
    let app = spawn_app_on(Backend::Sqlite, with_idp).await;
    let claims = person_claims("root@example.com", &["broker-admin"], &[]);
    let with = |key: &str, value: Value| {
        let mut claims = claims.clone();
        claims[key] = value;
        IDP.ec.sign(&claims)
    };
    let forged = [
        (unsigned("ec-1", &claims), "`alg: none`"),
        (hs256("ec-1", &IDP.ec.public_bytes(), &claims), "symmetric"),
        (
            Signer::es256("ec-1").sign(&claims),
            "signature does not verify",
        ),
        (
            Signer::rs256("rsa-1", true).sign(&claims),
            "signature does not verify",
        ),
        (with("aud", json!("another-app")), "audience"),
        (with("iss", json!("https://evil.test")), "another issuer"),
        (with("exp", json!(now() - 3600)), "expired"),
        (with("nbf", json!(now() + 3600)), "not valid yet"),
    ];
    for (token, why) in &forged {
        let refused = calls_seen_by(&app, token).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Code::Unauthenticated,
            "{why}: {}",
            refused.message()
        );
        assert!(
            refused.message().contains(why),
            "{why}: {}",
            refused.message()
        );
        assert!(!refused.message().contains(token.as_str()));
    }
    // A valid token whose roles this broker does not map: known, but allowed nothing.
    let refused = calls_seen_by(&app, &person("root@example.com", &["viewer"], &[]))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );
    // A static token that matches nothing is still just unknown.
    let refused = calls_seen_by(&app, "not-a-token").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    assert_eq!(refused.message(), "unknown token");
    // And the real thing passes.
    calls_seen_by(&app, &with("exp", json!(now() + 60)))
        .await
        .expect("valid");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_whose_provider_is_down_starts_refuses_jwts_saying_so_and_keeps_static_tokens() {
    // Nothing listens on a port just freed.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let app = spawn_app_on(Backend::Sqlite, |config| {
        with_idp(config);
        config.auth.jwt_issuer = Some(format!("http://{closed}"));
    })
    .await;
    let mut claims = person_claims("root@example.com", &["broker-admin"], &[]);
    claims["iss"] = json!(format!("http://{closed}"));
    let refused = calls_seen_by(&app, &IDP.ec.sign(&claims))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::Unauthenticated,
        "{}",
        refused.message()
    );
    assert!(
        refused.message().contains("could not be fetched"),
        "{}",
        refused.message()
    );
    calls_seen_by(&app, ROOT)
        .await
        .expect("static tokens keep working");
}

#[test]
fn an_issuer_without_a_role_mapping_or_with_keys_in_clear_stops_the_broker_naming_the_setting() {
    let mut config = Config::for_tests("sqlite::memory:");
    config.auth.jwt_issuer = Some("https://idp.example.com".into());
    config.auth.jwt_audience = Some(AUDIENCE.into());
    let err = config.jwt().map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("--jwt-roles"), "{err}");
    config.auth.jwt_roles = Some("approver=approver;root=x".into());
    let err = config.jwt().map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("--jwt-roles") && err.contains("`root`"),
        "{err}"
    );
    config.auth.jwt_roles = Some("approver=approver".into());
    assert!(config.jwt().unwrap().is_some());
    // Keys fetched over plain http from another host could be swapped on the way.
    config.auth.jwt_issuer = Some("http://idp.example.com".into());
    let err = config.jwt().map(|_| ()).unwrap_err().to_string();
    assert!(
        err.contains("--jwt-issuer") && err.contains("https://"),
        "{err}"
    );
    config.auth.jwt_issuer = Some("https://idp.example.com".into());
    config.auth.jwt_jwks_url = Some("http://keys.example.com/jwks".into());
    assert!(config.jwt().is_err());
}
