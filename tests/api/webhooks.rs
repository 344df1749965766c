//! Webhooks: what a real HTTP receiver on loopback gets. Events arrive signed (checked here
//! with the `hmac` crate, not the broker's signing code; `.ci/webhooks` checks them again with
//! the `standardwebhooks` library from PyPI), as CloudEvents or Slack messages, at least once
//! and in order per call, also when the receiver was down, when the broker was killed
//! mid-delivery, and with two Postgres replicas (each event delivered by one of them). The
//! receiver serves the escalation tests too. It listens on loopback, which the egress policy
//! refuses by default: the tests name it in the allow-list (`--webhook-allow-hosts`), as an
//! operator names an internal receiver; one test checks the refusals without it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use hmac::{Hmac, KeyInit as _, Mac as _};
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tonic::Code;

use approval_broker::config::Config;
use approval_broker::proto::v1 as pb;

use crate::helpers::{
    self, PATIENCE, TestApp, approve, backend_tests, batch, call, deny, start_broker, submit,
};

// --- the receiver ------------------------------------------------------------------------------

/// One request the receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    id: String,
    timestamp: String,
    signature: String,
    content_type: String,
    body: Bytes,
}

impl Received {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// How the receiver answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    Ok,
    /// 500 with a short body.
    Fail,
}

/// A tiny HTTP/1.1 server on loopback that records every request. `stop` closes the port and
/// every connection (the broker then gets "connection refused"); `start_again` reopens the same
/// port.
pub(crate) struct Receiver {
    address: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    answer: Arc<Mutex<Answer>>,
    /// How long to wait before answering each request.
    delay: Arc<Mutex<Duration>>,
    /// Requests being answered now, and the most there were at once.
    in_flight: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    pub(crate) async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let mut receiver = Receiver {
            address: listener.local_addr().expect("address"),
            received: Arc::default(),
            answer: Arc::new(Mutex::new(Answer::Ok)),
            delay: Arc::default(),
            in_flight: Arc::default(),
            peak: Arc::default(),
            server: None,
        };
        receiver.serve(listener);
        receiver
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}/hooks/approvals?x=1", self.address)
    }

    fn serve(&mut self, listener: TcpListener) {
        let (received, answer, delay) = (
            Arc::clone(&self.received),
            Arc::clone(&self.answer),
            Arc::clone(&self.delay),
        );
        let (in_flight, peak) = (Arc::clone(&self.in_flight), Arc::clone(&self.peak));
        self.server = Some(tokio::spawn(async move {
            // Connections end with the server task: dropping the set aborts them.
            let mut connections = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (received, answer, delay) = (
                    Arc::clone(&received),
                    Arc::clone(&answer),
                    Arc::clone(&delay),
                );
                let (in_flight, peak) = (Arc::clone(&in_flight), Arc::clone(&peak));
                connections.spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let (received, answer, delay) = (
                            Arc::clone(&received),
                            Arc::clone(&answer),
                            Arc::clone(&delay),
                        );
                        let (in_flight, peak) = (Arc::clone(&in_flight), Arc::clone(&peak));
                        async move {
                            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                            peak.fetch_max(now, Ordering::SeqCst);
                            let header = |name: &str| {
                                request
                                    .headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or_default()
                                    .to_owned()
                            };
                            let mut got = Received {
                                id: header("webhook-id"),
                                timestamp: header("webhook-timestamp"),
                                signature: header("webhook-signature"),
                                content_type: header("content-type"),
                                body: Bytes::new(),
                            };
                            got.body = request.into_body().collect().await?.to_bytes();
                            let wait = *delay.lock().unwrap();
                            tokio::time::sleep(wait).await;
                            let answer = *answer.lock().unwrap();
                            let status = match answer {
                                Answer::Ok => {
                                    received.lock().unwrap().push(got);
                                    StatusCode::NO_CONTENT
                                }
                                Answer::Fail => StatusCode::INTERNAL_SERVER_ERROR,
                            };
                            in_flight.fetch_sub(1, Ordering::SeqCst);
                            let mut response =
                                Response::new(Full::new(Bytes::from_static(b"receiver says no")));
                            *response.status_mut() = status;
                            Ok::<_, hyper::Error>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }));
    }

    fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }

    async fn start_again(&mut self) {
        // The aborted task may take a moment to drop its listener.
        for _ in 0..100 {
            if let Ok(listener) = TcpListener::bind(self.address).await {
                self.serve(listener);
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("cannot listen on {} again", self.address);
    }

    fn set_answer(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until `done` holds for what was received; fails the test after `patience`.
    pub(crate) async fn wait_for(
        &self,
        patience: Duration,
        what: &str,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let received = self.received();
            if done(&received) {
                return received;
            }
            if tokio::time::Instant::now() > deadline {
                panic!("the receiver did not get {what}; it got {received:#?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the distinct message ids received number `n`.
    pub(crate) async fn wait_for_ids(&self, patience: Duration, n: usize) -> Vec<Received> {
        self.wait_for(patience, &format!("{n} distinct messages"), |got| {
            distinct_ids(got).len() >= n
        })
        .await
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop();
    }
}

fn distinct_ids(received: &[Received]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for r in received {
        if !ids.contains(&r.id) {
            ids.push(r.id.clone());
        }
    }
    ids
}

/// Verifies a message as Standard Webhooks says, with the `hmac` crate directly.
fn assert_signed(secret: &str, message: &Received) {
    let key = BASE64
        .decode(secret.strip_prefix("whsec_").expect("a whsec_ secret"))
        .expect("base64 key");
    let mut mac = <Hmac<sha2_hmac::Sha256>>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", message.id, message.timestamp).as_bytes());
    mac.update(&message.body);
    let expected = format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()));
    let signatures: Vec<&str> = message.signature.split(' ').collect();
    assert!(
        signatures.contains(&expected.as_str()),
        "signature {} is not {expected}",
        message.signature
    );
    let sent: i64 = message.timestamp.parse().expect("a Unix timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - sent).abs() < 300,
        "timestamp {sent} is not now ({now})"
    );
}

// --- helpers -----------------------------------------------------------------------------------

fn create_request(url: &str) -> pb::CreateWebhookRequest {
    pb::CreateWebhookRequest {
        id: "ops".into(),
        url: url.into(),
        ..Default::default()
    }
}

async fn create(app: &TestApp, request: pb::CreateWebhookRequest) -> pb::Webhook {
    app.admin()
        .create_webhook(request)
        .await
        .expect("CreateWebhook")
        .into_inner()
}

async fn listed(app: &TestApp, id: &str) -> pb::Webhook {
    app.admin()
        .list_webhooks(pb::ListWebhooksRequest {})
        .await
        .expect("ListWebhooks")
        .into_inner()
        .webhooks
        .into_iter()
        .find(|w| w.id == id)
        .unwrap_or_else(|| panic!("no webhook {id} listed"))
}

/// Waits until ListWebhooks shows `id` as `done` says.
async fn wait_until_listed(
    app: &TestApp,
    id: &str,
    what: &str,
    done: impl Fn(&pb::Webhook) -> bool,
) -> pb::Webhook {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    loop {
        let hook = listed(app, id).await;
        if done(&hook) {
            return hook;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("webhook {id} never {what}: {hook:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The position of each message id's first arrival, by (call subject, type).
fn first_arrivals(received: &[Received]) -> Vec<(String, String, String)> {
    let mut seen = Vec::new();
    let mut out = Vec::new();
    for r in received {
        if seen.contains(&r.id) {
            continue;
        }
        seen.push(r.id.clone());
        let json = r.json();
        out.push((
            json["subject"].as_str().unwrap_or_default().to_owned(),
            json["type"].as_str().unwrap_or_default().to_owned(),
            r.id.clone(),
        ));
    }
    out
}

/// Every call's requested event arrived before its resolved one.
fn assert_in_order_per_call(received: &[Received]) {
    let arrivals = first_arrivals(received);
    for (i, (subject, kind, _)) in arrivals.iter().enumerate() {
        if kind == "approvals.v1.call.resolved" {
            let requested = arrivals
                .iter()
                .position(|(s, k, _)| s == subject && k == "approvals.v1.call.requested");
            assert!(
                requested.is_some_and(|r| r < i),
                "{subject}: resolved arrived before requested: {arrivals:#?}"
            );
        }
    }
}

/// Every copy of a message id carries the same body.
fn assert_duplicates_are_identical(received: &[Received]) {
    let mut bodies: HashMap<&str, &Bytes> = HashMap::new();
    for r in received {
        let first = bodies.entry(&r.id).or_insert(&r.body);
        assert_eq!(*first, &r.body, "two bodies under webhook-id {}", r.id);
    }
}

/// The receivers of these tests, on loopback, named in the allow-list.
pub(crate) fn allow_loopback(config: &mut Config) {
    config.webhooks.webhook_allow_hosts = vec![
        "127.0.0.0/8".parse().expect("a network"),
        "::1".parse().expect("an address"),
    ];
}

fn fast_retries(config: &mut Config) {
    allow_loopback(config);
    config.webhooks.webhook_retry_min = Duration::from_millis(20);
    config.webhooks.webhook_retry_max = Duration::from_millis(200);
}

// --- the tests ---------------------------------------------------------------------------------

backend_tests!(
    events_arrive_as_signed_cloudevents_in_order_per_call => super::allow_loopback,
    a_receiver_down_for_a_while_gets_everything_once_it_is_back => super::fast_retries,
    an_endpoint_that_keeps_failing_is_paused_with_its_last_error_and_resumes => |c: &mut approval_broker::config::Config| {
        super::fast_retries(c);
        c.webhooks.webhook_pause_after = 3;
    },
    filters_admit_only_the_events_they_name => super::allow_loopback,
    slack_messages_have_the_documented_shape_and_link_to_the_call_in_the_inbox => |c: &mut approval_broker::config::Config| {
        super::allow_loopback(c);
        c.webhooks.webhooks_inbox_url = Some("https://approvals.example.com/inbox/".into());
    },
    webhook_administration_refuses_what_it_cannot_do_and_names_the_field => super::allow_loopback,
    a_test_event_is_signed_and_reports_whether_it_arrived => super::allow_loopback,
    no_more_requests_are_in_flight_to_an_endpoint_than_it_allows => super::allow_loopback,
    endpoints_from_the_webhooks_file_are_loaded_at_start_and_keep_their_cursor => super::allow_loopback,
    webhooks_aimed_inward_are_refused_for_each_address_class_unless_allowed,
    a_url_with_a_user_name_or_password_is_refused_naming_the_field => super::allow_loopback,
    a_refusing_receivers_answer_is_never_echoed_only_its_status => |c: &mut approval_broker::config::Config| {
        super::fast_retries(c);
        c.webhooks.webhook_pause_after = 3;
    },
    list_webhooks_clears_the_last_error_once_a_later_delivery_succeeds => super::fast_retries,
);

async fn events_arrive_as_signed_cloudevents_in_order_per_call(app: TestApp) {
    let receiver = Receiver::start().await;
    let created = create(&app, create_request(&receiver.url())).await;
    assert!(created.secret.starts_with("whsec_"), "{}", created.secret);
    let secret = created.secret.clone();

    submit(
        &app,
        batch(
            "s1",
            vec![
                call("c1", "shell", r#"{"cmd":"ls"}"#),
                call("c2", "shell", r#"{"cmd":"rm"}"#),
            ],
        ),
    )
    .await;
    approve(&app, "s1", "c1").await;
    deny(&app, "s1", "c2", "no").await;

    let received = receiver.wait_for_ids(PATIENCE, 4).await;
    for message in &received {
        assert_signed(&secret, message);
        assert_eq!(message.content_type, "application/json");
        let event = message.json();
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(
            event["id"],
            message.id.as_str(),
            "CloudEvents id = webhook-id"
        );
        assert_eq!(event["source"], "approval-broker");
        assert_eq!(event["datacontenttype"], "application/json");
        assert!(event["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    }
    assert_in_order_per_call(&received);
    let kinds: Vec<(String, String)> = first_arrivals(&received)
        .into_iter()
        .map(|(subject, kind, _)| (subject, kind))
        .collect();
    for c in ["c1", "c2"] {
        for kind in ["requested", "resolved"] {
            let wanted = (
                format!("default/s1/{c}"),
                format!("approvals.v1.call.{kind}"),
            );
            assert!(kinds.contains(&wanted), "{wanted:?} missing from {kinds:?}");
        }
    }
    let resolved: Vec<Value> = received
        .iter()
        .map(Received::json)
        .filter(|e| e["type"] == "approvals.v1.call.resolved")
        .collect();
    let c2 = resolved
        .iter()
        .find(|e| e["data"]["call_id"] == "c2")
        .expect("c2 resolved");
    assert_eq!(c2["data"]["outcome"]["status"], "DENIED");
    assert_eq!(c2["data"]["outcome"]["reason"], "no");
    assert_eq!(c2["data"]["input"]["cmd"], "rm");
    assert_eq!(c2["data"]["tool"], "shell");

    // The cursor is stored and listed; the secret is not.
    let hook = wait_until_listed(&app, "ops", "reached the last event", |h| h.cursor >= 4).await;
    assert_ne!(hook.secret, secret);
    assert!(hook.secret.starts_with("whsec_") && hook.secret.len() < 16);
    assert!(!hook.paused);
}

async fn a_receiver_down_for_a_while_gets_everything_once_it_is_back(app: TestApp) {
    let mut receiver = Receiver::start().await;
    let created = create(&app, create_request(&receiver.url())).await;
    receiver.stop();

    let calls: Vec<String> = (0..6).map(|i| format!("c{i}")).collect();
    // One batch per call: a denial would skip the rest of a shared batch.
    for c in &calls {
        submit(&app, batch("down", vec![call(c, "shell", "{}")])).await;
    }
    for c in &calls[..3] {
        approve(&app, "down", c).await;
    }
    // The broker has seen the receiver fail.
    let failing = wait_until_listed(&app, "ops", "failed", |h| h.consecutive_failures > 0).await;
    assert!(!failing.last_error.is_empty());
    assert!(!failing.paused, "the default run of failures is far longer");

    receiver.start_again().await;
    for c in &calls[3..] {
        deny(&app, "down", c, "later").await;
    }
    let received = receiver.wait_for_ids(PATIENCE * 2, 12).await;
    assert_eq!(
        distinct_ids(&received).len(),
        12,
        "6 requested and 6 resolved"
    );
    for message in &received {
        assert_signed(&created.secret, message);
    }
    assert_in_order_per_call(&received);
    assert_duplicates_are_identical(&received);
    wait_until_listed(&app, "ops", "recovered", |h| {
        h.consecutive_failures == 0 && h.last_error.is_empty()
    })
    .await;
}

async fn an_endpoint_that_keeps_failing_is_paused_with_its_last_error_and_resumes(app: TestApp) {
    let receiver = Receiver::start().await;
    receiver.set_answer(Answer::Fail);
    create(&app, create_request(&receiver.url())).await;
    submit(&app, batch("p", vec![call("c1", "shell", "{}")])).await;

    let paused = wait_until_listed(&app, "ops", "paused", |h| h.paused).await;
    assert_eq!(paused.consecutive_failures, 3);
    assert!(paused.last_error.contains("500"), "{}", paused.last_error);
    assert!(
        paused.paused_reason.contains("3 failed"),
        "{}",
        paused.paused_reason
    );
    assert!(receiver.received().is_empty());

    // Events keep coming while it is paused; resuming delivers them all.
    approve(&app, "p", "c1").await;
    receiver.set_answer(Answer::Ok);
    let resumed = app
        .admin()
        .update_webhook(pb::UpdateWebhookRequest {
            id: "ops".into(),
            paused: Some(false),
            ..Default::default()
        })
        .await
        .expect("resume")
        .into_inner();
    assert!(!resumed.paused);
    assert_eq!(resumed.consecutive_failures, 0);
    let received = receiver.wait_for_ids(PATIENCE, 2).await;
    assert_in_order_per_call(&received);

    // An operator's pause, with a reason.
    let paused = app
        .admin()
        .update_webhook(pb::UpdateWebhookRequest {
            id: "ops".into(),
            paused: Some(true),
            pause_reason: "maintenance".into(),
            ..Default::default()
        })
        .await
        .expect("pause")
        .into_inner();
    assert!(paused.paused);
    assert_eq!(paused.paused_reason, "maintenance");
}

async fn filters_admit_only_the_events_they_name(app: TestApp) {
    let all = Receiver::start().await;
    let filtered = Receiver::start().await;
    create(&app, create_request(&all.url())).await;
    create(
        &app,
        pb::CreateWebhookRequest {
            id: "shell-outcomes".into(),
            url: filtered.url(),
            filter: Some(pb::WebhookFilter {
                event_kinds: vec![pb::WebhookEventKind::Resolved as i32],
                tool: "shell".into(),
                ..Default::default()
            }),
            ..Default::default()
        },
    )
    .await;
    submit(
        &app,
        batch(
            "f",
            vec![call("a", "shell", "{}"), call("b", "read_file", "{}")],
        ),
    )
    .await;
    approve(&app, "f", "a").await;
    approve(&app, "f", "b").await;
    let every = all.wait_for_ids(PATIENCE, 4).await;
    // Once the filtered endpoint's cursor passed every event, it has all it will get. The last
    // event's seq comes from what was delivered: the other endpoint's stored cursor may lag it
    // (a cursor is stored at most every 250 ms), and waiting on it would wait on nothing.
    let last = every
        .iter()
        .map(|m| m.json()["data"]["seq"].as_u64().expect("a seq"))
        .max()
        .expect("four events");
    wait_until_listed(&app, "shell-outcomes", "passed every event", |h| {
        h.cursor >= last
    })
    .await;
    let got: Vec<Value> = filtered.received().iter().map(Received::json).collect();
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0]["type"], "approvals.v1.call.resolved");
    assert_eq!(got[0]["data"]["call_id"], "a");
}

async fn slack_messages_have_the_documented_shape_and_link_to_the_call_in_the_inbox(app: TestApp) {
    let receiver = Receiver::start().await;
    create(
        &app,
        pb::CreateWebhookRequest {
            format: pb::WebhookFormat::Slack as i32,
            ..create_request(&receiver.url())
        },
    )
    .await;
    let mut spec = call("c/1", "shell", r#"{"cmd":"secret-arg"}"#);
    spec.title = "Run <ls> & more".into();
    submit(&app, batch("s 1", vec![spec])).await;
    deny(&app, "s 1", "c/1", "no").await;

    let received = receiver.wait_for_ids(PATIENCE, 2).await;
    let link = "<https://approvals.example.com/inbox/#call/default/s%201/c%2F1|Open in the inbox>";
    for message in &received {
        let body = message.json();
        let object = body.as_object().expect("an object");
        // Slack's incoming webhooks: `text` (required, the notification), optional `blocks`.
        assert!(
            object.keys().all(|k| k == "text" || k == "blocks"),
            "{body}"
        );
        let text = body["text"].as_str().expect("text is a string");
        assert!(text.contains(link), "{text}");
        assert!(
            text.contains("Run &lt;ls&gt; &amp; more"),
            "escaped: {text}"
        );
        assert!(
            !text.contains("secret-arg"),
            "no tool input in chat: {text}"
        );
        let blocks = body["blocks"].as_array().expect("blocks is a list");
        assert_eq!(blocks[0]["type"], "section");
        assert_eq!(blocks[0]["text"]["type"], "mrkdwn");
        assert_eq!(blocks[0]["text"]["text"], text);
    }
    let texts: Vec<String> = received
        .iter()
        .map(|m| m.json()["text"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        texts.iter().any(|t| t.starts_with("Approval requested:")),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.starts_with("DENIED:")), "{texts:?}");
}

async fn webhook_administration_refuses_what_it_cannot_do_and_names_the_field(app: TestApp) {
    let mut admin = app.admin();
    for (request, field) in [
        (create_request("ftp://example.com/"), "url"),
        (create_request("not a url"), "url"),
        (
            pb::CreateWebhookRequest {
                secret: "not-whsec".into(),
                ..create_request("http://127.0.0.1:9/")
            },
            "secret",
        ),
        (
            pb::CreateWebhookRequest {
                id: "bad id!".into(),
                ..create_request("http://127.0.0.1:9/")
            },
            "id",
        ),
        (
            pb::CreateWebhookRequest {
                max_in_flight: 1000,
                ..create_request("http://127.0.0.1:9/")
            },
            "max_in_flight",
        ),
        (
            pb::CreateWebhookRequest {
                filter: Some(pb::WebhookFilter {
                    event_kinds: vec![0],
                    ..Default::default()
                }),
                ..create_request("http://127.0.0.1:9/")
            },
            "filter.event_kinds[0]",
        ),
    ] {
        helpers::assert_status(
            admin.create_webhook(request).await,
            Code::InvalidArgument,
            field,
        );
    }
    // A generated id and secret.
    let made = create(
        &app,
        pb::CreateWebhookRequest {
            id: String::new(),
            ..create_request("http://127.0.0.1:9/")
        },
    )
    .await;
    assert!(made.id.starts_with("wh_"), "{}", made.id);
    create(&app, create_request("http://127.0.0.1:9/")).await;
    let again = admin
        .create_webhook(create_request("http://127.0.0.1:9/"))
        .await;
    assert_eq!(again.unwrap_err().code(), Code::AlreadyExists);

    let missing = admin
        .update_webhook(pb::UpdateWebhookRequest {
            id: "nope".into(),
            paused: Some(true),
            ..Default::default()
        })
        .await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);
    let missing = admin
        .delete_webhook(pb::DeleteWebhookRequest { id: "nope".into() })
        .await;
    assert_eq!(missing.unwrap_err().code(), Code::NotFound);

    // A rotated secret is shown once, in the reply; ListWebhooks masks it.
    let rotated = admin
        .update_webhook(pb::UpdateWebhookRequest {
            id: "ops".into(),
            rotate_secret: true,
            ..Default::default()
        })
        .await
        .expect("rotate")
        .into_inner();
    assert!(rotated.secret.len() > 40, "{}", rotated.secret);
    assert_ne!(listed(&app, "ops").await.secret, rotated.secret);

    let deleted = admin
        .delete_webhook(pb::DeleteWebhookRequest { id: "ops".into() })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(deleted.id, "ops");
    let left: Vec<String> = admin
        .list_webhooks(pb::ListWebhooksRequest {})
        .await
        .unwrap()
        .into_inner()
        .webhooks
        .into_iter()
        .map(|w| w.id)
        .collect();
    assert_eq!(left, vec![made.id]);
}

async fn a_test_event_is_signed_and_reports_whether_it_arrived(app: TestApp) {
    let receiver = Receiver::start().await;
    let created = create(&app, create_request(&receiver.url())).await;
    let reply = app
        .admin()
        .send_test_event(pb::SendTestEventRequest { id: "ops".into() })
        .await
        .expect("SendTestEvent")
        .into_inner();
    assert!(reply.delivered, "{}", reply.error);
    let received = receiver.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].id, reply.message_id);
    assert_eq!(received[0].json()["type"], "approvals.v1.test");
    assert_signed(&created.secret, &received[0]);

    receiver.set_answer(Answer::Fail);
    let reply = app
        .admin()
        .send_test_event(pb::SendTestEventRequest { id: "ops".into() })
        .await
        .expect("SendTestEvent")
        .into_inner();
    assert!(!reply.delivered);
    assert!(reply.error.contains("500"), "{}", reply.error);
    // The refused message is named too (a new one), so the receiver's logs can be searched for it.
    assert!(reply.message_id.starts_with("test_"), "{reply:?}");
    assert_ne!(reply.message_id, received[0].id);
}

async fn endpoints_from_the_webhooks_file_are_loaded_at_start_and_keep_their_cursor(app: TestApp) {
    let receiver = Receiver::start().await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let file = app.dir.path().join("webhooks.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"webhooks": [{{"id": "from-file", "url": "{}", "secret": "{secret}",
                 "event_kinds": ["requested"]}}]}}"#,
            receiver.url()
        ),
    )
    .unwrap();
    let app = app
        .restart_with(|c| {
            allow_loopback(c);
            c.webhooks.webhooks_file = Some(file.clone());
        })
        .await;
    let hook = listed(&app, "from-file").await;
    assert!(hook.from_file);
    submit(&app, batch("file", vec![call("c1", "shell", "{}")])).await;
    let received = receiver.wait_for_ids(PATIENCE, 1).await;
    assert_signed(secret, &received[0]);
    let cursor = wait_until_listed(&app, "from-file", "delivered", |h| h.cursor > 0)
        .await
        .cursor;

    // Started again with the same file: the endpoint keeps its cursor, so nothing is sent twice.
    let app = app
        .restart_with(|c| {
            allow_loopback(c);
            c.webhooks.webhooks_file = Some(file.clone());
        })
        .await;
    assert_eq!(listed(&app, "from-file").await.cursor, cursor);
    submit(&app, batch("file", vec![call("c2", "shell", "{}")])).await;
    let received = receiver.wait_for_ids(PATIENCE, 2).await;
    assert_eq!(received.len(), 2, "nothing was sent twice: {received:#?}");
}

async fn no_more_requests_are_in_flight_to_an_endpoint_than_it_allows(app: TestApp) {
    let receiver = Receiver::start().await;
    *receiver.delay.lock().unwrap() = Duration::from_millis(50);
    create(
        &app,
        pb::CreateWebhookRequest {
            max_in_flight: 2,
            ..create_request(&receiver.url())
        },
    )
    .await;
    let calls: Vec<pb::CallSpec> = (0..8)
        .map(|i| call(&format!("c{i}"), "shell", "{}"))
        .collect();
    submit(&app, batch("lanes", calls)).await;
    let received = receiver.wait_for_ids(PATIENCE, 8).await;
    assert_eq!(distinct_ids(&received).len(), 8);
    let peak = receiver.peak.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&peak),
        "{peak} requests were in flight at once"
    );
}

/// The real binary, killed (SIGKILL) while a delivery is in flight, started again on the same
/// database: every event reaches the receiver, in order per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_resumes_after_the_broker_is_killed_mid_delivery() {
    let receiver = Receiver::start().await;
    // Slow answers, so the kill lands while requests are in flight.
    *receiver.delay.lock().unwrap() = Duration::from_millis(300);
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("approvals.db").display());
    let file = dir.path().join("webhooks.json");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    std::fs::write(
        &file,
        format!(
            r#"{{"webhooks": [{{"id": "ops", "url": "{}", "secret": "{secret}", "max_in_flight": 1}}]}}"#,
            receiver.url()
        ),
    )
    .unwrap();
    let args = [
        "--webhooks-file",
        file.to_str().unwrap(),
        "--webhook-allow-hosts",
        "127.0.0.1",
        "--webhook-retry-min",
        "50ms",
        "--webhook-retry-max",
        "200ms",
    ];
    let mut broker = start_broker(&database, &args, &[]).await;
    let mut agent = pb::agent_service_client::AgentServiceClient::new(broker.channel());
    let calls: Vec<String> = (0..8).map(|i| format!("c{i}")).collect();
    agent
        .submit(pb::SubmitRequest {
            batch: Some(batch(
                "kill",
                calls.iter().map(|c| call(c, "shell", "{}")).collect(),
            )),
        })
        .await
        .expect("submit");
    // At least one delivered, the rest queued behind slow answers.
    receiver.wait_for_ids(PATIENCE, 1).await;
    broker.kill();
    let delivered_before = distinct_ids(&receiver.received()).len();
    assert!(
        delivered_before < 8,
        "the kill came too late to prove anything"
    );

    *receiver.delay.lock().unwrap() = Duration::ZERO;
    let _broker = start_broker(&database, &args, &[]).await;
    let received = receiver.wait_for_ids(PATIENCE * 2, 8).await;
    for message in &received {
        assert_signed(secret, message);
    }
    assert_duplicates_are_identical(&received);
    let subjects: Vec<String> = first_arrivals(&received)
        .into_iter()
        .map(|(subject, _, _)| subject)
        .collect();
    for c in &calls {
        assert!(
            subjects.contains(&format!("default/kill/{c}")),
            "{c} missing"
        );
    }
}

/// Two replicas on one Postgres database: the endpoint is delivered by one of them at a time,
/// so with a receiver that never fails each event arrives exactly once, whichever replica
/// committed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn two_postgres_replicas_deliver_each_event_once() {
    let receiver = Receiver::start().await;
    let first = helpers::spawn_app_on(helpers::Backend::postgres(), allow_loopback).await;
    let second = first.replica(allow_loopback).await;
    create(&first, create_request(&receiver.url())).await;
    for i in 0..10 {
        let app = if i % 2 == 0 { &first } else { &second };
        submit(app, batch("r", vec![call(&format!("c{i}"), "shell", "{}")])).await;
    }
    for i in 0..10 {
        let app = if i % 2 == 0 { &second } else { &first };
        approve(app, "r", &format!("c{i}")).await;
    }
    let received = receiver.wait_for_ids(PATIENCE * 2, 20).await;
    // Both replicas keep running and scanning; give a second deliverer every chance to show.
    // The last event's seq is what was delivered (a stored cursor may lag it by 250 ms).
    let last = received
        .iter()
        .map(|m| m.json()["data"]["seq"].as_u64().expect("a seq"))
        .max()
        .expect("twenty events");
    wait_until_listed(&second, "ops", "passed every event", |h| h.cursor >= last).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let received_after = receiver.received();
    assert_eq!(
        received_after.len(),
        20,
        "each event exactly once: {:#?}",
        first_arrivals(&received_after)
    );
    assert_in_order_per_call(&received);
}

async fn webhooks_aimed_inward_are_refused_for_each_address_class_unless_allowed(app: TestApp) {
    let mut admin = app.admin();
    for (url, class) in [
        ("http://127.0.0.1:8080/h", "loopback"),
        ("http://127.1.2.3/h", "loopback"),
        ("http://[::1]:8080/h", "loopback"),
        ("http://localhost:8080/h", "loopback"),
        ("http://0.0.0.0:8080/h", "unspecified"),
        ("http://[::]/h", "unspecified"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://[fe80::1]/h", "link-local"),
        ("http://10.0.0.1/h", "private"),
        ("http://172.16.0.1/h", "private"),
        ("http://172.31.255.254/h", "private"),
        ("http://192.168.1.1/h", "private"),
        ("http://[fc00::1]/h", "unique-local"),
        ("http://[fd12:3456::1]/h", "unique-local"),
        ("http://100.64.0.1/h", "shared"),
        ("http://[::ffff:127.0.0.1]/h", "loopback"),
        ("http://[::ffff:a9fe:a9fe]/h", "link-local"),
        ("http://[::ffff:10.0.0.1]/h", "private"),
    ] {
        let refused = admin.create_webhook(create_request(url)).await;
        let message = refused
            .as_ref()
            .err()
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        helpers::assert_status(refused, Code::InvalidArgument, "url");
        assert!(
            message.contains(class) && message.contains("--webhook-allow-hosts"),
            "{url}: {message}"
        );
    }
    // A name is judged on what it resolves to, when delivering; nothing is sent here, as no
    // event is committed, and `.invalid` never resolves (RFC 2606), so nothing could be. An
    // update is held to the same rule as a creation.
    create(&app, create_request("https://hooks.invalid/approvals")).await;
    let moved = admin
        .update_webhook(pb::UpdateWebhookRequest {
            id: "ops".into(),
            url: Some("http://169.254.169.254/latest/meta-data/".into()),
            ..Default::default()
        })
        .await;
    helpers::assert_status(moved, Code::InvalidArgument, "url");
    assert_eq!(
        listed(&app, "ops").await.url,
        "https://hooks.invalid/approvals"
    );
    admin
        .delete_webhook(pb::DeleteWebhookRequest { id: "ops".into() })
        .await
        .expect("delete");

    // The receivers an operator names are allowed, and only those.
    let app = app
        .restart_with(|c| {
            c.webhooks.webhook_allow_hosts = vec![
                "127.0.0.1".parse().unwrap(),
                "::1/128".parse().unwrap(),
                "localhost".parse().unwrap(),
            ]
        })
        .await;
    let mut admin = app.admin();
    for (id, url) in [
        ("loop", "http://127.0.0.1:9/h"),
        ("loop6", "http://[::1]:9/h"),
        ("named", "http://localhost:9/h"),
    ] {
        create(
            &app,
            pb::CreateWebhookRequest {
                id: id.into(),
                ..create_request(url)
            },
        )
        .await;
    }
    for url in [
        "http://127.0.0.2/h",
        "http://10.0.0.1/h",
        "http://[fc00::1]/h",
        "http://[::2]/h",
    ] {
        helpers::assert_status(
            admin.create_webhook(create_request(url)).await,
            Code::InvalidArgument,
            "url",
        );
    }
}

async fn a_url_with_a_user_name_or_password_is_refused_naming_the_field(app: TestApp) {
    let mut admin = app.admin();
    for url in [
        "http://user:pw@127.0.0.1:9/h",
        "https://user@hooks.invalid/h",
        "https://:pw@hooks.invalid/h",
    ] {
        let refused = admin.create_webhook(create_request(url)).await;
        let message = refused
            .as_ref()
            .err()
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        helpers::assert_status(refused, Code::InvalidArgument, "url");
        assert!(
            message.contains("user name or password") && message.contains("secret"),
            "{message}"
        );
        assert!(
            !message.contains("pw"),
            "the credential is not repeated: {message}"
        );
    }
    create(&app, create_request("http://127.0.0.1:9/h")).await;
    let changed = admin
        .update_webhook(pb::UpdateWebhookRequest {
            id: "ops".into(),
            url: Some("http://user:pw@127.0.0.1:9/h".into()),
            ..Default::default()
        })
        .await;
    helpers::assert_status(changed, Code::InvalidArgument, "url");
    assert_eq!(listed(&app, "ops").await.url, "http://127.0.0.1:9/h");
}

/// What a receiver answers is its own: a test event's error, the last error and the pause
/// reason say the status and a fixed reason, never the body (which would put whatever the
/// receiver chose on an operator's screen).
async fn a_refusing_receivers_answer_is_never_echoed_only_its_status(app: TestApp) {
    let receiver = Receiver::start().await;
    receiver.set_answer(Answer::Fail);
    create(&app, create_request(&receiver.url())).await;
    let reply = app
        .admin()
        .send_test_event(pb::SendTestEventRequest { id: "ops".into() })
        .await
        .expect("SendTestEvent")
        .into_inner();
    assert!(!reply.delivered);
    assert!(
        reply.error.starts_with("HTTP 500 Internal Server Error: "),
        "{}",
        reply.error
    );
    assert!(!reply.error.contains("receiver says no"), "{}", reply.error);

    submit(&app, batch("echo", vec![call("c1", "shell", "{}")])).await;
    let paused = wait_until_listed(&app, "ops", "paused", |h| h.paused).await;
    for shown in [&paused.last_error, &paused.paused_reason] {
        assert!(shown.contains("HTTP 500"), "{shown}");
        assert!(!shown.contains("receiver says no"), "{shown}");
    }
}

async fn list_webhooks_clears_the_last_error_once_a_later_delivery_succeeds(app: TestApp) {
    let receiver = Receiver::start().await;
    receiver.set_answer(Answer::Fail);
    create(&app, create_request(&receiver.url())).await;
    submit(&app, batch("later", vec![call("c1", "shell", "{}")])).await;
    let failing = wait_until_listed(&app, "ops", "failed", |h| !h.last_error.is_empty()).await;
    assert!(
        failing.last_error.contains("HTTP 500"),
        "{}",
        failing.last_error
    );

    receiver.set_answer(Answer::Ok);
    receiver.wait_for_ids(PATIENCE, 1).await;
    let recovered = wait_until_listed(&app, "ops", "cleared its last error", |h| {
        h.last_error.is_empty()
    })
    .await;
    assert_eq!(recovered.consecutive_failures, 0);
    assert!(!recovered.paused);
}
