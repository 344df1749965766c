//! Web Push: what a loopback "push service" receives from the broker. A subscription gets one
//! push per new pending call its owner may decide (none for calls their groups may not see), a
//! withdrawal when the call is decided; each request carries a VAPID token (checked here with
//! ring against the key GetPushKey gives) and an RFC 8188 body. A 410 drops the subscription; a
//! push service that never answers holds no decision. The bodies are decrypted by an
//! independent implementation (`http_ece` from PyPI) in `.ci/push`, from the captures this file
//! writes when `PUSH_CAPTURE_DIR` is set (`tests/push/decrypt.py`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use ring::rand::{SecureRandom as _, SystemRandom};
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _,
    UnparsedPublicKey,
};
use tokio::net::TcpListener;
use tonic::Code;

use approval_broker::config::Config;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use approval_broker::proto::v1::agent_service_client::AgentServiceClient;

use crate::helpers::*;
use crate::routing::{admin_as, approver_as, bearer};

const BOT: &str = "token-of-bot";
/// `alice` is in ops; `dave` in no group.
const ALICE: &str = "token-of-alice";
const DAVE: &str = "token-of-dave";
const ROOT: &str = "token-of-root";

// --- the push service --------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Pushed {
    path: String,
    authorization: String,
    content_encoding: String,
    ttl: String,
    urgency: String,
    topic: String,
    body: Bytes,
    /// Answered 201 (not failed on purpose).
    accepted: bool,
}

/// A loopback HTTP/1.1 server standing in for a browser vendor's push service: `/gone/...`
/// answers 410, `/hang/...` never answers, `/flaky/...` 503 while [`PushService::fail`] says
/// so, anything else 201. It records every request.
struct PushService {
    address: SocketAddr,
    received: Arc<Mutex<Vec<Pushed>>>,
    failing: Arc<std::sync::atomic::AtomicBool>,
}

impl PushService {
    async fn start() -> PushService {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().unwrap();
        let received: Arc<Mutex<Vec<Pushed>>> = Arc::default();
        let failing: Arc<std::sync::atomic::AtomicBool> = Arc::default();
        let log = Arc::clone(&received);
        let fails = Arc::clone(&failing);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let log = Arc::clone(&log);
                let fails = Arc::clone(&fails);
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let log = Arc::clone(&log);
                        let fails = Arc::clone(&fails);
                        async move {
                            let header = |name: &str| {
                                request
                                    .headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or_default()
                                    .to_owned()
                            };
                            let mut pushed = Pushed {
                                path: request.uri().path().to_owned(),
                                authorization: header("authorization"),
                                content_encoding: header("content-encoding"),
                                ttl: header("ttl"),
                                urgency: header("urgency"),
                                topic: header("topic"),
                                body: Bytes::new(),
                                accepted: false,
                            };
                            pushed.body = request.into_body().collect().await.unwrap().to_bytes();
                            let path = pushed.path.clone();
                            let status = if path.starts_with("/gone/") {
                                410
                            } else if path.starts_with("/flaky/")
                                && fails.load(std::sync::atomic::Ordering::SeqCst)
                            {
                                503
                            } else {
                                201
                            };
                            pushed.accepted = status == 201;
                            log.lock().unwrap().push(pushed);
                            if path.starts_with("/hang/") {
                                std::future::pending::<()>().await;
                            }
                            Ok::<_, std::convert::Infallible>(
                                Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        PushService {
            address,
            received,
            failing,
        }
    }

    /// Whether `/flaky/...` fails every request (503) from now on.
    fn fail(&self, failing: bool) {
        self.failing
            .store(failing, std::sync::atomic::Ordering::SeqCst);
    }

    /// The pushes `path` accepted, waiting until there are `n`, up to [`PATIENCE`].
    async fn wait_for_accepted(&self, path: &str, n: usize) -> Vec<Pushed> {
        self.wait_until(path, n, |p| p.accepted).await
    }

    fn endpoint(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    fn at(&self, path: &str) -> Vec<Pushed> {
        self.received
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.path == path)
            .cloned()
            .collect()
    }

    async fn wait_for(&self, path: &str, n: usize) -> Vec<Pushed> {
        self.wait_until(path, n, |_| true).await
    }

    /// The pushes to `path` that `counts` takes, waiting until there are `n`, up to
    /// [`PATIENCE`].
    async fn wait_until(&self, path: &str, n: usize, counts: fn(&Pushed) -> bool) -> Vec<Pushed> {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let got: Vec<Pushed> = self.at(path).into_iter().filter(counts).collect();
            if got.len() >= n {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path} got {} such pushes, not {n}",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

// --- a browser's subscription ------------------------------------------------------------------

/// A subscription's keys as a browser holds them: a P-256 key pair (its PKCS#8, for the
/// independent decryption) and the auth secret.
struct Browser {
    pkcs8: Vec<u8>,
    p256dh: Vec<u8>,
    auth: [u8; 16],
}

impl Browser {
    fn new() -> Browser {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        let mut auth = [0u8; 16];
        rng.fill(&mut auth).unwrap();
        Browser {
            pkcs8: pkcs8.as_ref().to_vec(),
            p256dh: pair.public_key().as_ref().to_vec(),
            auth,
        }
    }

    fn request(&self, endpoint: &str) -> pb::AddPushSubscriptionRequest {
        pb::AddPushSubscriptionRequest {
            endpoint: endpoint.into(),
            p256dh: B64.encode(&self.p256dh),
            auth: B64.encode(self.auth),
        }
    }

    /// Writes a push this browser received where `.ci/push` decrypts it with `http_ece`.
    fn capture(&self, pushed: &Pushed, expect: serde_json::Value) {
        let Ok(dir) = std::env::var("PUSH_CAPTURE_DIR") else {
            return;
        };
        std::fs::create_dir_all(&dir).unwrap();
        let line = serde_json::json!({
            "pkcs8": B64.encode(&self.pkcs8),
            "auth": B64.encode(self.auth),
            "body": B64.encode(&pushed.body),
            "expect": expect,
        });
        let name = format!("{dir}/{}.json", B64.encode(&pushed.body[..12]));
        std::fs::write(name, line.to_string()).unwrap();
    }
}

/// The topic the broker gives a call's messages (RFC 8030 §5.4: a later one replaces it).
fn topic_of(call_id: &str) -> String {
    let tag = format!("call:bot/s/{call_id}");
    let digest = ring::digest::digest(&ring::digest::SHA256, tag.as_bytes());
    B64.encode(&digest.as_ref()[..24])
}

fn with_push(config: &mut Config) {
    // Postgres needs the replicas' shared key; SQLite would make one beside the database.
    let dir = tempfile::tempdir().unwrap().keep();
    let key = dir.join("vapid.pem");
    approval_broker::background::push::Vapid::load_or_create(&key).unwrap();
    with_push_key(config, key);
}

fn with_push_key(config: &mut Config, key: std::path::PathBuf) {
    config.webhooks.webhook_allow_hosts = vec!["127.0.0.0/8".parse().expect("a network")];
    config.webhooks.webhook_retry_min = Duration::from_millis(20);
    config.push.push_vapid_key = Some(key);
    config.auth.tokens = Some(format!(
        "agent bot {}\napprover alice {} groups=ops\napprover dave {}\nadmin root {}",
        hash_token(BOT),
        hash_token(ALICE),
        hash_token(DAVE),
        hash_token(ROOT),
    ));
}

async fn ops_only_deploys(app: &TestApp) {
    let mut rule = rule("ops-only", "deploy", pb::Effect::Ask, 0, None);
    rule.approvers = Some(pb::Approvers {
        groups: vec!["ops".into()],
        quorum: 1,
        ..Default::default()
    });
    admin_as(&app.channel, ROOT)
        .create_rule(pb::CreateRuleRequest { rule: Some(rule) })
        .await
        .expect("create rule");
}

async fn submit_as_bot(app: &TestApp, spec: pb::CallSpec) {
    AgentServiceClient::with_interceptor(app.channel.clone(), bearer(BOT))
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", vec![spec])),
        })
        .await
        .expect("submit");
}

async fn decide_as(app: &TestApp, token: &str, call_id: &str) -> pb::DecideResponse {
    let mut request = decide_request("s", call_id, pb::Decision::Approve, "");
    request.agent = "bot".into();
    request.approver = String::new();
    approver_as(&app.channel, token)
        .decide(request)
        .await
        .expect("decide")
        .into_inner()
}

async fn subscribe(app: &TestApp, token: &str, browser: &Browser, endpoint: &str) {
    approver_as(&app.channel, token)
        .add_push_subscription(browser.request(endpoint))
        .await
        .expect("add push subscription");
}

/// The checks every push passes: a VAPID token for the endpoint's origin, signed by the key
/// GetPushKey gives, and an aes128gcm body whose header is RFC 8188's.
fn assert_well_formed(pushed: &Pushed, service: &PushService, vapid_key: &str) {
    assert_eq!(pushed.content_encoding, "aes128gcm");
    assert_eq!(pushed.ttl, "3600");
    let rest = pushed
        .authorization
        .strip_prefix("vapid t=")
        .expect("vapid scheme");
    let (token, k) = rest.split_once(", k=").expect("t and k");
    assert_eq!(k, vapid_key);
    let (signing_input, signature) = token.rsplit_once('.').unwrap();
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, B64.decode(k).unwrap())
        .verify(signing_input.as_bytes(), &B64.decode(signature).unwrap())
        .expect("the VAPID token verifies with the broker's key");
    let claims = signing_input.split('.').nth(1).unwrap();
    let claims: serde_json::Value = serde_json::from_slice(&B64.decode(claims).unwrap()).unwrap();
    assert_eq!(claims["aud"], format!("http://{}", service.address));
    assert!(claims["sub"].as_str().unwrap().starts_with("mailto:"));
    let body = &pushed.body;
    assert_eq!(&body[16..20], &4096u32.to_be_bytes(), "record size");
    assert_eq!(body[20], 65, "key id: the sender's P-256 key");
    assert_eq!(body[21], 0x04);
    assert!(body.len() > 86 + 16);
}

// --- the tests ---------------------------------------------------------------------------------

backend_tests!(
    each_subscription_gets_the_calls_its_owner_may_decide_and_a_withdrawal_when_decided => super::with_push,
    a_subscription_the_push_service_says_is_gone_is_dropped => super::with_push,
    a_push_service_that_never_answers_holds_no_decision => super::with_push,
    subscriptions_are_validated_and_removed_only_by_their_owner => super::with_push,
    a_reminder_and_an_escalation_are_pushed_again_for_the_same_call => super::with_push,
    a_first_subscriber_after_a_time_with_none_gets_the_next_call_at_once => super::with_push,
    calls_committed_while_no_broker_pushed_are_pushed_when_one_starts_unless_decided => super::with_push,
    a_call_that_needs_a_passkey_is_pushed_saying_so => super::with_push,
    a_push_that_failed_every_attempt_arrives_in_a_later_round_and_so_does_a_withdrawal => super::with_push_retried,
);

/// As [`with_push`], with two attempts a push and rounds of retries a moment apart.
fn with_push_retried(config: &mut Config) {
    with_push(config);
    config.push.push_attempts = 2;
    config.webhooks.webhook_retry_max = Duration::from_millis(100);
}

/// A push service that fails every attempt at a push, then recovers, gets it in a later round
/// of the same broker, no restart; each round reads the call as it is then: decided meanwhile,
/// the call is withdrawn in a later round, since its pending push was shown.
async fn a_push_that_failed_every_attempt_arrives_in_a_later_round_and_so_does_a_withdrawal(
    app: TestApp,
) {
    let service = PushService::start().await;
    let browser = Browser::new();
    subscribe(&app, DAVE, &browser, &service.endpoint("/flaky/1")).await;
    service.fail(true);
    submit_as_bot(&app, call("r", "Bash", r#"{"command":"true"}"#)).await;
    // Both attempts failed, and both of the first round.
    service.wait_for("/flaky/1", 4).await;
    service.fail(false);
    let pushed = service.wait_for_accepted("/flaky/1", 1).await.remove(0);
    assert_eq!(pushed.topic, topic_of("r"));
    assert_eq!(pushed.urgency, "high", "the pending push, not a withdrawal");
    // Its withdrawal fails every attempt too, then arrives.
    service.fail(true);
    let before = service.at("/flaky/1").len();
    decide_as(&app, DAVE, "r").await;
    service.wait_for("/flaky/1", before + 4).await;
    service.fail(false);
    let withdrawn = service.wait_for_accepted("/flaky/1", 2).await.remove(1);
    assert_eq!(withdrawn.topic, topic_of("r"));
    assert_eq!(withdrawn.urgency, "normal", "a withdrawal");
}

/// A call whose requirement asks for a passkey is pushed like any (its notification opens the
/// call), and says it needs one: `.ci/push` decrypts the capture and checks its line.
async fn a_call_that_needs_a_passkey_is_pushed_saying_so(app: TestApp) {
    let mut signed = rule("signed", "deploy", pb::Effect::Ask, 0, None);
    signed.approvers = Some(pb::Approvers {
        quorum: 1,
        step_up: pb::StepUp::Passkey as i32,
        ..Default::default()
    });
    admin_as(&app.channel, ROOT)
        .create_rule(pb::CreateRuleRequest { rule: Some(signed) })
        .await
        .expect("create rule");
    let service = PushService::start().await;
    let browser = Browser::new();
    subscribe(&app, DAVE, &browser, &service.endpoint("/dave")).await;
    submit_as_bot(&app, call("p1", "deploy", r#"{"command":"make deploy"}"#)).await;
    let pushed = service.wait_for("/dave", 1).await;
    assert_eq!(pushed[0].topic, topic_of("p1"));
    assert_eq!(pushed[0].urgency, "high");
    browser.capture(
        &pushed[0],
        serde_json::json!({"kind": "pending", "tool": "deploy", "step_up": true,
            "line": "Needs your passkey · make deploy",
            "url": "/#agent=bot&session=s&call=p1"}),
    );
}

/// A VAPID key of the test's own (phases after a restart use it: `with_push`'s is not kept).
fn new_key(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let key = dir.path().join("vapid.pem");
    approval_broker::background::push::Vapid::load_or_create(&key).unwrap();
    key
}

/// The sender resumes where it stopped in the event log: a call submitted while no broker
/// pushed is pushed when one starts; one decided meanwhile is pushed neither as pending nor as
/// withdrawn; nothing pushed before is pushed again; and live pushes follow.
async fn calls_committed_while_no_broker_pushed_are_pushed_when_one_starts_unless_decided(
    app: TestApp,
) {
    let service = PushService::start().await;
    let browser = Browser::new();
    subscribe(&app, DAVE, &browser, &service.endpoint("/dave")).await;
    submit_as_bot(&app, call("before", "Bash", r#"{"command":"true"}"#)).await;
    service.wait_for("/dave", 1).await;
    // The position is stored within a second of an event (sender::CURSOR_EVERY).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir);
    let off = key.clone();
    let app = app
        .restart_with(move |c| {
            with_push_key(c, off);
            c.push.mode = approval_broker::receipts::ReceiptsMode::Off;
        })
        .await;
    submit_as_bot(
        &app,
        call("waiting", "Bash", r#"{"command":"make deploy"}"#),
    )
    .await;
    submit_as_bot(&app, call("answered", "Bash", r#"{"command":"true"}"#)).await;
    decide_as(&app, DAVE, "answered").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(service.at("/dave").len(), 1, "pushed while push was off");

    let app = app.restart_with(|c| with_push_key(c, key)).await;
    let pushed = service.wait_for("/dave", 2).await;
    assert_eq!(pushed[1].topic, topic_of("waiting"), "the call that waits");
    assert_eq!(pushed[1].urgency, "high");
    let vapid_key = approver_as(&app.channel, DAVE)
        .get_push_key(pb::GetPushKeyRequest {})
        .await
        .expect("push key")
        .into_inner()
        .vapid_public_key;
    assert_well_formed(&pushed[1], &service, &vapid_key);
    browser.capture(
        &pushed[1],
        serde_json::json!({"kind": "pending", "tool": "Bash", "line": "make deploy"}),
    );
    submit_as_bot(&app, call("after", "Bash", r#"{"command":"true"}"#)).await;
    let pushed = service.wait_for("/dave", 3).await;
    assert_eq!(pushed[2].topic, topic_of("after"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let topics: Vec<String> = service.at("/dave").into_iter().map(|p| p.topic).collect();
    assert_eq!(
        topics,
        [topic_of("before"), topic_of("waiting"), topic_of("after")],
        "nothing twice, nothing for the call decided meanwhile"
    );
}

/// With nobody subscribed the sender stops reading the subscriptions for every event (a second
/// at a time); a subscription added then is still pushed the very next call.
async fn a_first_subscriber_after_a_time_with_none_gets_the_next_call_at_once(app: TestApp) {
    let service = PushService::start().await;
    submit_as_bot(&app, call("nobody", "Bash", r#"{"command":"true"}"#)).await;
    // Let the sender see that event, and nobody to push it to.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let browser = Browser::new();
    subscribe(&app, DAVE, &browser, &service.endpoint("/first")).await;
    submit_as_bot(&app, call("somebody", "Bash", r#"{"command":"true"}"#)).await;
    service.wait_for("/first", 1).await;
    assert_eq!(service.at("/first").len(), 1, "only the call after it");
}

async fn a_reminder_and_an_escalation_are_pushed_again_for_the_same_call(app: TestApp) {
    let step = |millis: u64, kind: pb::EscalationStepKind| pb::EscalationStep {
        after: Some(prost_types::Duration {
            seconds: 0,
            nanos: i32::try_from(millis * 1_000_000).unwrap(),
        }),
        kind: kind as i32,
        endpoints: Vec::new(),
    };
    let nag = pb::Rule {
        escalation: vec![
            step(200, pb::EscalationStepKind::Reminder),
            step(400, pb::EscalationStepKind::Escalation),
        ],
        ..rule("nag", "remind", pb::Effect::Ask, 0, None)
    };
    admin_as(&app.channel, ROOT)
        .create_rule(pb::CreateRuleRequest { rule: Some(nag) })
        .await
        .expect("create rule");
    let service = PushService::start().await;
    let browser = Browser::new();
    subscribe(&app, DAVE, &browser, &service.endpoint("/dave")).await;
    submit_as_bot(&app, call("n1", "remind", r#"{"command":"make release"}"#)).await;
    let pushed = service.wait_for("/dave", 3).await;
    for p in &pushed {
        assert_eq!(p.topic, topic_of("n1"), "each replaces the last");
        assert_eq!(p.urgency, "high");
    }
    browser.capture(
        &pushed[2],
        serde_json::json!({"kind": "reminder", "tool": "remind", "line": "make release"}),
    );
    decide_as(&app, DAVE, "n1").await;
    let pushed = service.wait_for("/dave", 4).await;
    assert_eq!(pushed[3].urgency, "normal", "the withdrawal");
}

async fn each_subscription_gets_the_calls_its_owner_may_decide_and_a_withdrawal_when_decided(
    app: TestApp,
) {
    ops_only_deploys(&app).await;
    let service = PushService::start().await;
    let key = approver_as(&app.channel, ALICE)
        .get_push_key(pb::GetPushKeyRequest {})
        .await
        .expect("push key")
        .into_inner()
        .vapid_public_key;
    assert_eq!(B64.decode(&key).unwrap().len(), 65);
    let (alice, dave) = (Browser::new(), Browser::new());
    subscribe(&app, ALICE, &alice, &service.endpoint("/alice")).await;
    subscribe(&app, DAVE, &dave, &service.endpoint("/dave")).await;

    submit_as_bot(&app, call("d1", "deploy", r#"{"target":"prod"}"#)).await;
    submit_as_bot(&app, call("r1", "Bash", r#"{"command":"ls -la\nrm x"}"#)).await;
    let to_alice = service.wait_for("/alice", 2).await;
    let mut topics: Vec<&str> = to_alice.iter().map(|p| p.topic.as_str()).collect();
    topics.sort_unstable();
    let mut wanted = vec![topic_of("d1"), topic_of("r1")];
    wanted.sort();
    assert_eq!(topics, wanted, "alice (ops) gets both calls, once each");
    for pushed in &to_alice {
        assert_well_formed(pushed, &service, &key);
        assert_eq!(pushed.urgency, "high");
    }
    let r1 = to_alice.iter().find(|p| p.topic == topic_of("r1")).unwrap();
    alice.capture(
        r1,
        serde_json::json!({"kind": "pending", "tool": "Bash", "line": "ls -la",
            "tag": "call:bot/s/r1", "url": "/#agent=bot&session=s&call=r1"}),
    );

    decide_as(&app, ALICE, "d1").await;
    let to_alice = service.wait_for("/alice", 3).await;
    let withdrawal = &to_alice[2];
    assert_eq!(
        withdrawal.topic,
        topic_of("d1"),
        "the decided call's message replaced"
    );
    assert_eq!(withdrawal.urgency, "normal");
    assert_well_formed(withdrawal, &service, &key);
    alice.capture(
        withdrawal,
        serde_json::json!({"kind": "withdrawn", "tag": "call:bot/s/d1"}),
    );

    // dave is in no group: the ops-only deploy is not his to see, pending or decided. A later
    // call he may decide arrives after everything sent before it was started.
    submit_as_bot(&app, call("r2", "Bash", r#"{"command":"pwd"}"#)).await;
    service.wait_for("/alice", 4).await;
    let to_dave = service.wait_for("/dave", 2).await;
    let topics: Vec<&str> = to_dave.iter().map(|p| p.topic.as_str()).collect();
    assert!(topics.contains(&topic_of("r1").as_str()), "{topics:?}");
    assert!(topics.contains(&topic_of("r2").as_str()), "{topics:?}");
    assert!(
        !topics.contains(&topic_of("d1").as_str()),
        "dave got a push for a call hidden from him"
    );
    dave.capture(
        &to_dave[0],
        serde_json::json!({"kind": "pending", "tool": "Bash"}),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(service.at("/dave").len(), 2, "nothing more for dave");
}

async fn a_subscription_the_push_service_says_is_gone_is_dropped(app: TestApp) {
    let service = PushService::start().await;
    let (gone, live) = (Browser::new(), Browser::new());
    subscribe(&app, DAVE, &gone, &service.endpoint("/gone/1")).await;
    subscribe(&app, DAVE, &live, &service.endpoint("/live")).await;
    submit_as_bot(&app, call("a", "Bash", r#"{"command":"true"}"#)).await;
    service.wait_for("/gone/1", 1).await;
    service.wait_for("/live", 1).await;
    // Dropped: its owner's removal finds nothing, and the next call goes only to the other.
    // The sender drops it when it reads the 410, just after the push arrived here: a removal
    // that came first finds it, so it is added again and pushed once more, until the sender's
    // drop comes first.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut pushed = 1;
    loop {
        tokio::time::sleep(Duration::from_millis(50 * pushed as u64)).await;
        let removed = approver_as(&app.channel, DAVE)
            .remove_push_subscription(pb::RemovePushSubscriptionRequest {
                endpoint: service.endpoint("/gone/1"),
            })
            .await
            .expect("remove")
            .into_inner()
            .removed;
        if !removed {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never dropped");
        subscribe(&app, DAVE, &gone, &service.endpoint("/gone/1")).await;
        submit_as_bot(
            &app,
            call(&format!("a{pushed}"), "Bash", r#"{"command":"true"}"#),
        )
        .await;
        pushed += 1;
        service.wait_for("/gone/1", pushed).await;
    }
    service.wait_for("/live", pushed).await;
    let before = service.at("/gone/1").len();
    submit_as_bot(&app, call("b", "Bash", r#"{"command":"true"}"#)).await;
    service.wait_for("/live", pushed + 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        service.at("/gone/1").len(),
        before,
        "a dropped subscription got a push"
    );
}

async fn a_push_service_that_never_answers_holds_no_decision(app: TestApp) {
    let service = PushService::start().await;
    let hanging = Browser::new();
    subscribe(&app, DAVE, &hanging, &service.endpoint("/hang/1")).await;
    submit_as_bot(&app, call("h", "Bash", r#"{"command":"true"}"#)).await;
    service.wait_for("/hang/1", 1).await;
    // The push is still unanswered (it waits --webhook-timeout, 10 s, per attempt); the decision
    // does not wait on it.
    let decided = decide_as(&app, DAVE, "h").await;
    assert_eq!(
        decided.outcome.expect("an outcome").status,
        pb::CallStatus::Approved as i32
    );
    // The first push is still unanswered: the hanging service answers none before its 10 s.
    // (The decision's withdrawal may already be on its way too: that is a push of its own.)
    assert!(
        !service.at("/hang/1").is_empty(),
        "the decision came back while the first push was still unanswered"
    );
}

async fn subscriptions_are_validated_and_removed_only_by_their_owner(app: TestApp) {
    let browser = Browser::new();
    let mut approver = approver_as(&app.channel, DAVE);
    let channel = app.channel.clone();
    let refused = |request: pb::AddPushSubscriptionRequest| {
        let channel = channel.clone();
        async move {
            approver_as(&channel, DAVE)
                .add_push_subscription(request)
                .await
                .expect_err("refused")
        }
    };
    let mut plain_http = browser.request("http://push.example.net/x");
    let status = refused(plain_http.clone()).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("https://"),
        "{}",
        status.message()
    );
    plain_http.endpoint = "https://push.example.net/x".into();
    plain_http.p256dh = B64.encode([4u8; 33]);
    let status = refused(plain_http.clone()).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().starts_with("p256dh"),
        "{}",
        status.message()
    );
    let mut short_auth = browser.request("https://push.example.net/x");
    short_auth.auth = B64.encode([1u8; 8]);
    let status = refused(short_auth).await;
    assert!(status.message().starts_with("auth"), "{}", status.message());
    let inward = browser.request("https://10.1.2.3/x");
    assert_eq!(refused(inward).await.code(), Code::InvalidArgument);

    approver
        .add_push_subscription(browser.request("https://push.example.net/mine"))
        .await
        .expect("added");
    let by_alice = approver_as(&app.channel, ALICE)
        .remove_push_subscription(pb::RemovePushSubscriptionRequest {
            endpoint: "https://push.example.net/mine".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!by_alice.removed, "only its owner removes a subscription");
    let by_dave = approver
        .remove_push_subscription(pb::RemovePushSubscriptionRequest {
            endpoint: "https://push.example.net/mine".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(by_dave.removed);
    let agent = approval_broker::proto::v1::approver_service_client::ApproverServiceClient::with_interceptor(
        app.channel.clone(),
        bearer(BOT),
    )
    .add_push_subscription(browser.request("https://push.example.net/bot"))
    .await
    .expect_err("an agent cannot subscribe");
    assert_eq!(agent.code(), Code::PermissionDenied);
}

/// A replica that was stopped while another (not pushing) took a call pushes it when it starts
/// again: it resumes where the fleet's sender stopped in the shared log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_call_taken_by_another_replica_while_the_pusher_was_stopped_is_pushed_when_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let key = new_key(&dir);
    let mut pusher = spawn_app_on(Backend::postgres(), |c| with_push_key(c, key.clone())).await;
    let quiet = pusher
        .replica(|c| {
            with_push_key(c, key.clone());
            c.push.mode = approval_broker::receipts::ReceiptsMode::Off;
        })
        .await;
    let service = PushService::start().await;
    let browser = Browser::new();
    subscribe(&pusher, DAVE, &browser, &service.endpoint("/dave")).await;
    submit_as_bot(&quiet, call("c1", "Bash", r#"{"command":"true"}"#)).await;
    service.wait_for("/dave", 1).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    pusher.shut_down().await;
    submit_as_bot(&quiet, call("c2", "Bash", r#"{"command":"make deploy"}"#)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        service.at("/dave").len(),
        1,
        "nobody pushes while the pusher is down"
    );
    let _pusher = pusher.restart_with(|c| with_push_key(c, key.clone())).await;
    let pushed = service.wait_for("/dave", 2).await;
    assert_eq!(pushed[1].topic, topic_of("c2"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(service.at("/dave").len(), 2, "c1 was not pushed again");
}

/// Two replicas on one Postgres database, both pushing from the shared log: each call is pushed
/// once, whichever replica committed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn two_postgres_replicas_push_each_call_once() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("vapid.pem");
    approval_broker::background::push::Vapid::load_or_create(&key).unwrap();
    let first = spawn_app_on(Backend::postgres(), |c| with_push_key(c, key.clone())).await;
    let second = first.replica(|c| with_push_key(c, key.clone())).await;
    let service = PushService::start().await;
    let browser = Browser::new();
    subscribe(&first, DAVE, &browser, &service.endpoint("/dave")).await;
    for i in 0..6 {
        let app = if i % 2 == 0 { &first } else { &second };
        submit_as_bot(app, call(&format!("c{i}"), "Bash", r#"{"command":"true"}"#)).await;
    }
    service.wait_for("/dave", 6).await;
    // Both replicas follow the log; give a second pusher every chance to show.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut topics: Vec<String> = service.at("/dave").into_iter().map(|p| p.topic).collect();
    topics.sort();
    let mut wanted: Vec<String> = (0..6).map(|i| topic_of(&format!("c{i}"))).collect();
    wanted.sort();
    assert_eq!(topics, wanted, "each call pushed exactly once");
}
