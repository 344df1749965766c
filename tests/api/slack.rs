//! Slack app mode, black box: a real broker posts pending calls to a loopback stand-in for
//! Slack's Web API, which checks every request against Slack's documented shapes (method, bot
//! token, JSON body, required fields) and every message against Block Kit's documented limits;
//! clicks are POSTed to the broker's interactivity endpoint signed as Slack signs them (HMAC
//! computed here with the `hmac` crate, not the broker's code; `.ci/slack` signs them again with
//! `slack_sdk`). Each click is decided through the one gate: a quorum needs two people, the
//! requester cannot approve their own call, a person outside the groups is refused, a Slack
//! user the broker does not know is told so, ephemerally; forged, replayed and stale requests
//! decide nothing. The message is updated when the call is decided, in Slack or in the inbox.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, KeyInit as _, Mac as _};
use http_body_util::{BodyExt as _, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

use approval_broker::config::Config;
use approval_broker::domain::policy::Approvers;
use approval_broker::proto::v1 as pb;

use crate::helpers::{
    self, Backend, PATIENCE, TestApp, approve, call, states, submit_one, until_pruned,
};

const BOT_TOKEN: &str = "xoxb-test-token";
const SIGNING_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
const CHANNEL: &str = "C0APPROVALS";

// --- the stand-in for Slack ---------------------------------------------------------------------

/// One request the stand-in got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    body: Value,
}

/// Slack's Web API on loopback: answers `chat.postMessage`, `chat.update` and `users.info` as
/// Slack does, takes the ephemeral answers POSTed to `response_url`s, and records what was
/// wrong with any request (a test ends by asserting there was nothing).
struct FakeSlack {
    address: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    problems: Arc<Mutex<Vec<String>>>,
    faults: Arc<Mutex<Faults>>,
    _server: tokio::task::JoinHandle<()>,
}

/// Failures the stand-in is told to answer: the next `n` requests to a path get `503` (as Slack
/// answers when it is unavailable), and are counted rather than recorded as received.
#[derive(Default)]
struct Faults {
    remaining: std::collections::HashMap<String, u32>,
    refused: Vec<String>,
}

/// What is wrong with a message, by Block Kit's documented limits.
fn block_kit_problems(body: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    let text = body["text"].as_str().unwrap_or_default();
    check(text.chars().count() <= 40_000, "text over 40000".into());
    let Some(blocks) = body.get("blocks") else {
        check(!text.is_empty(), "neither text nor blocks".into());
        return problems;
    };
    let blocks = blocks.as_array().cloned().unwrap_or_default();
    check(
        (1..=50).contains(&blocks.len()),
        format!("{} blocks", blocks.len()),
    );
    for block in &blocks {
        match block["type"].as_str() {
            Some("section") => {
                let t = block["text"]["text"].as_str().unwrap_or_default();
                check(
                    block["text"]["type"] == "mrkdwn" || block["text"]["type"] == "plain_text",
                    "section text type".into(),
                );
                check(
                    (1..=3000).contains(&t.chars().count()),
                    format!("section text of {}", t.chars().count()),
                );
            }
            Some("context") => {
                let elements = block["elements"].as_array().cloned().unwrap_or_default();
                check(
                    (1..=10).contains(&elements.len()),
                    "context elements".into(),
                );
                for e in elements {
                    check(
                        e["text"].as_str().unwrap_or_default().chars().count() <= 3000,
                        "context text".into(),
                    );
                }
            }
            Some("actions") => {
                let elements = block["elements"].as_array().cloned().unwrap_or_default();
                check(
                    (1..=25).contains(&elements.len()),
                    "actions elements".into(),
                );
                check(
                    block["block_id"].as_str().is_none_or(|b| b.len() <= 255),
                    "block_id".into(),
                );
                for button in elements {
                    check(
                        button["type"] == "button",
                        "an action that is no button".into(),
                    );
                    let label = button["text"]["text"].as_str().unwrap_or_default();
                    check(
                        button["text"]["type"] == "plain_text"
                            && (1..=75).contains(&label.chars().count()),
                        "button text".into(),
                    );
                    let id = button["action_id"].as_str().unwrap_or_default();
                    check((1..=255).contains(&id.len()), "action_id".into());
                    check(
                        button["value"]
                            .as_str()
                            .is_none_or(|v| v.chars().count() <= 2000),
                        "button value".into(),
                    );
                    check(
                        button["url"]
                            .as_str()
                            .is_none_or(|u| u.chars().count() <= 3000),
                        "button url".into(),
                    );
                    check(
                        button["style"]
                            .as_str()
                            .is_none_or(|s| s == "primary" || s == "danger"),
                        "button style".into(),
                    );
                }
            }
            other => check(false, format!("block type {other:?}")),
        }
    }
    problems
}

impl FakeSlack {
    async fn start(emails: &[(&str, &str)]) -> FakeSlack {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let problems: Arc<Mutex<Vec<String>>> = Arc::default();
        let emails: Arc<Vec<(String, String)>> = Arc::new(
            emails
                .iter()
                .map(|(u, e)| (u.to_string(), e.to_string()))
                .collect(),
        );
        let faults: Arc<Mutex<Faults>> = Arc::default();
        let (r, p, f) = (
            Arc::clone(&received),
            Arc::clone(&problems),
            Arc::clone(&faults),
        );
        let server = tokio::spawn(async move {
            let counter = Arc::new(Mutex::new(0u32));
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (r, p, f, emails, counter) = (
                    Arc::clone(&r),
                    Arc::clone(&p),
                    Arc::clone(&f),
                    Arc::clone(&emails),
                    Arc::clone(&counter),
                );
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let (r, p, f, emails, counter) = (
                            Arc::clone(&r),
                            Arc::clone(&p),
                            Arc::clone(&f),
                            Arc::clone(&emails),
                            Arc::clone(&counter),
                        );
                        async move {
                            let (status, answer) = match refusal(&request, &f) {
                                Some(refused) => (503, refused),
                                None => (200, answer(request, &r, &p, &emails, &counter).await),
                            };
                            Ok::<_, std::convert::Infallible>(
                                Response::builder()
                                    .status(status)
                                    .header("content-type", "application/json; charset=utf-8")
                                    .body(Full::new(Bytes::from(answer.to_string())))
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
        FakeSlack {
            address,
            received,
            problems,
            faults,
            _server: server,
        }
    }

    /// The next `n` calls of `method` (`chat.postMessage`...) fail with `503`.
    fn fail_next(&self, method: &str, n: u32) {
        let mut faults = self.faults.lock().unwrap();
        faults.remaining.insert(format!("/api/{method}"), n);
    }

    /// How many calls of `method` were answered with a failure.
    fn refused(&self, method: &str) -> usize {
        let path = format!("/api/{method}");
        let faults = self.faults.lock().unwrap();
        faults.refused.iter().filter(|p| **p == path).count()
    }

    /// Closes the port and every connection: Slack is down.
    fn stop(&self) {
        self._server.abort();
    }

    fn api_url(&self) -> String {
        format!("http://{}/api", self.address)
    }

    fn response_url(&self) -> String {
        format!("http://{}/actions/T0TEAM/1/respond", self.address)
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// The first request to `path` that `accept` takes, waiting for it up to [`PATIENCE`].
    async fn wait_for(&self, path: &str, accept: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(found) = self
                .received()
                .into_iter()
                .find(|r| r.path == path && accept(&r.body))
            {
                return found.body;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "nothing to {path} that the test waits for; got {:#?}",
                self.received()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The ephemeral answer to the `n`th click (from 1), as its text.
    async fn ephemeral(&self, n: usize) -> String {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let answers: Vec<Value> = self
                .received()
                .into_iter()
                .filter(|r| r.path.starts_with("/actions/"))
                .map(|r| r.body)
                .collect();
            if let Some(answer) = answers.get(n - 1) {
                assert_eq!(answer["response_type"], "ephemeral", "{answer}");
                assert_eq!(answer["replace_original"], false, "{answer}");
                return answer["text"].as_str().unwrap_or_default().to_owned();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no answer to click {n}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn assert_no_problems(&self) {
        let problems = self.problems.lock().unwrap().clone();
        assert!(
            problems.is_empty(),
            "requests Slack would refuse: {problems:#?}"
        );
    }
}

/// The failure the stand-in was told to answer `request` with, if any (see [`Faults`]).
fn refusal(request: &Request<hyper::body::Incoming>, faults: &Mutex<Faults>) -> Option<Value> {
    let path = request.uri().path().to_owned();
    let mut faults = faults.lock().unwrap();
    let remaining = faults.remaining.get_mut(&path).filter(|n| **n > 0)?;
    *remaining -= 1;
    faults.refused.push(path);
    Some(json!({"ok": false, "error": "service_unavailable"}))
}

/// The stand-in's answer to one request, after checking it as Slack documents it.
async fn answer(
    request: Request<hyper::body::Incoming>,
    received: &Mutex<Vec<Received>>,
    problems: &Mutex<Vec<String>>,
    emails: &[(String, String)],
    counter: &Mutex<u32>,
) -> Value {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (authorization, content_type) = (header("authorization"), header("content-type"));
    let bytes = request.into_body().collect().await.unwrap().to_bytes();
    let mut wrong = Vec::new();
    if method != hyper::Method::POST {
        wrong.push(format!("{path}: method {method}"));
    }
    let body: Value = if path == "/api/users.info" {
        if content_type != "application/x-www-form-urlencoded" {
            wrong.push(format!("{path}: content-type {content_type}"));
        }
        let form = String::from_utf8_lossy(&bytes).into_owned();
        json!({"user": form.strip_prefix("user=").unwrap_or_default()})
    } else {
        if content_type != "application/json; charset=utf-8" {
            wrong.push(format!("{path}: content-type {content_type}"));
        }
        serde_json::from_slice(&bytes).unwrap_or(Value::Null)
    };
    let is_api = path.starts_with("/api/");
    if is_api && authorization != format!("Bearer {BOT_TOKEN}") {
        wrong.push(format!("{path}: authorization `{authorization}`"));
    }
    if !is_api && !authorization.is_empty() {
        wrong.push(format!("{path}: the bot token sent to a response_url"));
    }
    let reply = match path.as_str() {
        "/api/chat.postMessage" | "/api/chat.update" => {
            if !body["channel"].is_string() {
                wrong.push(format!("{path}: no channel"));
            }
            if path == "/api/chat.update" && !body["ts"].is_string() {
                wrong.push(format!("{path}: no ts"));
            }
            wrong.extend(
                block_kit_problems(&body)
                    .into_iter()
                    .map(|p| format!("{path}: {p}")),
            );
            let ts = match body["ts"].as_str() {
                Some(ts) => ts.to_owned(),
                None => {
                    let mut n = counter.lock().unwrap();
                    *n += 1;
                    format!("1765000000.{:06}", *n)
                }
            };
            json!({"ok": true, "channel": body["channel"], "ts": ts, "message": {"text": body["text"]}})
        }
        "/api/users.info" => {
            let user = body["user"].as_str().unwrap_or_default();
            match emails.iter().find(|(u, _)| u == user) {
                Some((_, email)) => {
                    json!({"ok": true, "user": {"id": user, "profile": {"email": email}}})
                }
                None => json!({"ok": false, "error": "user_not_found"}),
            }
        }
        p if p.starts_with("/actions/") => json!({"ok": true}),
        _ => {
            wrong.push(format!("unknown method {path}"));
            json!({"ok": false, "error": "unknown_method"})
        }
    };
    received.lock().unwrap().push(Received { path, body });
    problems.lock().unwrap().extend(wrong);
    reply
}

// --- clicks -------------------------------------------------------------------------------------

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// `v0=` + hex HMAC-SHA256 of `v0:<timestamp>:<body>`, as Slack signs.
fn slack_signature(secret: &str, timestamp: &str, body: &str) -> String {
    let mut mac = Hmac::<sha2_hmac::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("v0:{timestamp}:{body}").as_bytes());
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("v0={hex}")
}

fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                (b as char).to_string()
            }
            b' ' => "+".into(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

static CLICKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The form body Slack POSTs for a click on `action` of `message` by `user`.
fn click_body(slack: &FakeSlack, user: &str, action: &str, message: &Value) -> String {
    let button = message["blocks"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "actions"))
        .and_then(|b| b["elements"].as_array())
        .and_then(|e| e.iter().find(|b| b["action_id"] == action))
        .unwrap_or_else(|| panic!("no {action} button in {message}"));
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user, "username": user.to_lowercase(), "team_id": "T0TEAM"},
        "api_app_id": "A0APP",
        "team": {"id": "T0TEAM", "domain": "example"},
        "channel": {"id": CHANNEL, "name": "approvals"},
        "container": {"type": "message", "message_ts": "1765000000.000001", "channel_id": CHANNEL},
        "message": {"ts": "1765000000.000001", "text": message["text"], "blocks": message["blocks"]},
        "response_url": slack.response_url(),
        // Unique per click, as Slack's are: two clicks are two signed requests.
        "trigger_id": format!("1.2.{}", CLICKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
        "actions": [{
            "type": "button", "action_id": action, "block_id": "decide",
            "value": button["value"], "text": button["text"], "action_ts": "1765000001.000000",
        }],
    });
    format!("payload={}", form_encode(&payload.to_string()))
}

/// POSTs `body` to the broker's interactivity endpoint with the given headers; the status.
async fn post(app: &TestApp, path: &str, body: &str, headers: &[(&str, String)]) -> u16 {
    let stream = TcpStream::connect(app.address).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let mut request = Request::post(path)
        .header("host", app.address.to_string())
        .header("content-type", "application/x-www-form-urlencoded");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    sender
        .send_request(request)
        .await
        .expect("answer")
        .status()
        .as_u16()
}

/// GETs `path` from the broker; the status.
async fn get(app: &TestApp, path: &str) -> u16 {
    let stream = TcpStream::connect(app.address).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    let request = Request::get(path)
        .header("host", app.address.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    sender
        .send_request(request)
        .await
        .expect("answer")
        .status()
        .as_u16()
}

/// Clicks as Slack would: signed now with the app's secret. The status.
async fn click(app: &TestApp, slack: &FakeSlack, user: &str, action: &str, message: &Value) -> u16 {
    let body = click_body(slack, user, action, message);
    let timestamp = unix_now().to_string();
    let signature = slack_signature(SIGNING_SECRET, &timestamp, &body);
    post(
        app,
        "/slack/interactivity",
        &body,
        &[
            ("x-slack-request-timestamp", timestamp),
            ("x-slack-signature", signature),
        ],
    )
    .await
}

// --- the broker ---------------------------------------------------------------------------------

/// Slack app mode on against `slack`, with alice, bob and carol in `ops`, dave in `dev`, erin
/// mapped by email; every call routed to one channel and needing `quorum` of `ops`.
fn configure(slack: &FakeSlack, dir: &std::path::Path, quorum: u32) -> impl FnOnce(&mut Config) {
    configure_with_people(slack, dir, quorum, Vec::new())
}

/// As [`configure`], with `more` people in the Slack file.
fn configure_with_people(
    slack: &FakeSlack,
    dir: &std::path::Path,
    quorum: u32,
    more: Vec<Value>,
) -> impl FnOnce(&mut Config) {
    let file = dir.join("slack.json");
    let mut people = vec![
        json!({"slack_user": "U0ALICE", "identity": "alice", "groups": ["ops"]}),
        json!({"slack_user": "U0BOB", "identity": "Bob", "groups": ["ops"]}),
        json!({"slack_user": "U0CAROL", "identity": "carol", "groups": ["ops"]}),
        json!({"slack_user": "U0DAVE", "identity": "dave", "groups": ["dev"]}),
        json!({"email": "erin@example.com", "identity": "erin", "groups": ["ops"]}),
    ];
    people.extend(more);
    std::fs::write(
        &file,
        json!({"channels": [{"channel": CHANNEL}], "people": people}).to_string(),
    )
    .unwrap();
    let api_url = slack.api_url();
    move |config: &mut Config| {
        crate::webhooks::allow_loopback(config);
        config.webhooks.webhook_retry_min = Duration::from_millis(20);
        config.webhooks.webhook_retry_max = Duration::from_millis(200);
        config.webhooks.webhooks_inbox_url = Some("https://approvals.example.com".into());
        config.slack.slack_file = Some(file);
        config.slack.slack_bot_token = Some(BOT_TOKEN.into());
        config.slack.slack_signing_secret = Some(SIGNING_SECRET.into());
        config.slack.slack_api_url = api_url;
        config.policy.default_approvers = Some(Approvers {
            groups: vec!["ops".into()],
            quorum,
            ..Approvers::default()
        });
    }
}

/// Starts the stand-in and a broker on `backend` posting to it.
async fn start(backend: Backend, quorum: u32) -> (TestApp, FakeSlack, tempfile::TempDir) {
    start_with(backend, quorum, |_| {}).await
}

/// As [`start`], with `more` settings.
async fn start_with(
    backend: Backend,
    quorum: u32,
    more: impl FnOnce(&mut Config),
) -> (TestApp, FakeSlack, tempfile::TempDir) {
    let slack = FakeSlack::start(&[("U0ERIN", "Erin@Example.com")]).await;
    let dir = tempfile::tempdir().unwrap();
    let slack_settings = configure(&slack, dir.path(), quorum);
    let app = helpers::spawn_app_on(backend, |config| {
        slack_settings(config);
        more(config);
    })
    .await;
    (app, slack, dir)
}

/// Submits `call_id` (by `requested_by`, if any) and returns its message once it is posted.
async fn submit_and_see_posted(
    app: &TestApp,
    slack: &FakeSlack,
    call_id: &str,
    requested_by: &str,
) -> Value {
    let spec = pb::CallSpec {
        requested_by: requested_by.into(),
        ..call(call_id, "Bash", r#"{"command":"make deploy"}"#)
    };
    submit_one(app, "s1", spec).await;
    slack
        .wait_for("/api/chat.postMessage", |b| {
            b["thread_ts"].is_null() && b.to_string().contains(call_id)
        })
        .await
}

async fn is_pending(app: &TestApp, call_id: &str) -> bool {
    matches!(
        states(app, "s1", &[call_id]).await.remove(0).state,
        Some(pb::call_state::State::Pending(_))
    )
}

async fn wait_outcome(app: &TestApp, call_id: &str) -> pb::Outcome {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(pb::call_state::State::Outcome(outcome)) =
            states(app, "s1", &[call_id]).await.remove(0).state
        {
            return outcome;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{call_id} stays pending"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Defines `name::sqlite` and `name::postgres` for `async fn name(backend)`: each test starts
/// its own stand-in for Slack before the broker, which must know its address.
macro_rules! slack_tests {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name(crate::helpers::Backend::Sqlite).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(
                    not(approvals_test_postgres),
                    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
                )]
                async fn postgres() {
                    super::$name(crate::helpers::Backend::postgres()).await;
                }
            }
        )*
    };
}

slack_tests!(
    a_pending_call_is_posted_and_a_quorum_of_two_mapped_approvers_decides_it_from_slack,
    the_requester_cannot_approve_their_own_call_from_slack,
    a_person_outside_the_required_groups_is_refused_from_slack,
    a_slack_user_the_broker_does_not_know_is_refused_ephemerally,
    a_person_mapped_by_email_decides_as_that_identity,
    forged_replayed_and_stale_clicks_are_refused_and_decide_nothing,
    a_decision_made_in_the_inbox_updates_the_slack_message,
    a_message_posted_before_a_restart_is_updated_after_it,
    reminders_and_escalations_are_threaded_under_the_message,
    slack_down_never_stops_a_decision,
    a_call_pending_before_slack_app_mode_started_is_posted_once,
    a_post_that_failed_every_attempt_is_made_at_the_next_start,
    a_post_that_failed_every_attempt_is_made_later_without_a_restart,
    while_slack_fails_a_call_decided_meanwhile_is_never_posted_and_its_update_is_made_later,
    a_slack_person_without_groups_has_the_token_files_and_their_own_groups_win,
    a_call_that_needs_a_passkey_is_approved_only_in_the_inbox_and_may_be_denied_from_slack,
    mentions_and_links_in_an_input_reach_slack_escaped,
    retention_prunes_a_decided_calls_slack_message_with_the_call,
    a_call_decided_while_no_broker_ran_slack_app_mode_loses_its_buttons_when_one_starts,
);

// --- the tests ----------------------------------------------------------------------------------

async fn a_pending_call_is_posted_and_a_quorum_of_two_mapped_approvers_decides_it_from_slack(
    backend: Backend,
) {
    let (app, slack, _dir) = start(backend, 2).await;
    let message = submit_and_see_posted(&app, &slack, "c1", "").await;
    assert_eq!(message["channel"], CHANNEL);
    let shown = message.to_string();
    assert!(
        shown.contains("Bash") && shown.contains("make deploy"),
        "{shown}"
    );
    assert!(
        shown.contains("needs 2 approvals"),
        "the requirement is shown: {shown}"
    );
    assert!(
        shown.contains("https://approvals.example.com/#call/"),
        "Open links the inbox: {shown}"
    );

    assert_eq!(
        click(&app, &slack, "U0ALICE", "approve", &message).await,
        200
    );
    let first = slack.ephemeral(1).await;
    assert!(
        first.contains("recorded") && first.contains("alice"),
        "{first}"
    );
    assert!(
        is_pending(&app, "c1").await,
        "one approval of two decides nothing"
    );

    // The same person again is still one person.
    assert_eq!(
        click(&app, &slack, "U0ALICE", "approve", &message).await,
        200
    );
    slack.ephemeral(2).await;
    assert!(
        is_pending(&app, "c1").await,
        "alice twice is not two approvers"
    );

    assert_eq!(click(&app, &slack, "U0BOB", "approve", &message).await, 200);
    let outcome = wait_outcome(&app, "c1").await;
    assert_eq!(outcome.status(), pb::CallStatus::Approved);
    assert!(
        outcome.decided_by.contains("alice") && outcome.decided_by.contains("bob"),
        "{}",
        outcome.decided_by
    );

    let ts = message_ts(&slack, "c1");
    let updated = slack
        .wait_for("/api/chat.update", |b| {
            b["ts"] == ts.as_str() && b.to_string().contains("APPROVED")
        })
        .await;
    assert!(
        !updated.to_string().contains("\"action_id\":\"approve\""),
        "a decided call's message has no buttons left: {updated}"
    );
    slack.assert_no_problems();
}

/// The `ts` Slack gave the message of `call_id`.
fn message_ts(slack: &FakeSlack, call_id: &str) -> String {
    let posted = slack
        .received()
        .into_iter()
        .position(|r| {
            r.path == "/api/chat.postMessage"
                && r.body["thread_ts"].is_null()
                && r.body.to_string().contains(call_id)
        })
        .expect("posted");
    // The stand-in numbers the messages it is asked to post, in order.
    let n = slack.received()[..=posted]
        .iter()
        .filter(|r| r.path == "/api/chat.postMessage" && r.body["ts"].is_null())
        .count();
    format!("1765000000.{n:06}")
}

async fn the_requester_cannot_approve_their_own_call_from_slack(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    // `CAROL` is carol, however the agent spells her.
    let message = submit_and_see_posted(&app, &slack, "c1", "CAROL").await;
    assert_eq!(
        click(&app, &slack, "U0CAROL", "approve", &message).await,
        200
    );
    let answer = slack.ephemeral(1).await;
    assert!(answer.starts_with("Not decided"), "{answer}");
    assert!(is_pending(&app, "c1").await);
    // Another member of the group still can.
    click(&app, &slack, "U0ALICE", "approve", &message).await;
    assert_eq!(
        wait_outcome(&app, "c1").await.status(),
        pb::CallStatus::Approved
    );
    slack.assert_no_problems();
}

async fn a_person_outside_the_required_groups_is_refused_from_slack(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    let message = submit_and_see_posted(&app, &slack, "c1", "").await;
    for action in ["approve", "deny"] {
        click(&app, &slack, "U0DAVE", action, &message).await;
    }
    for n in [1, 2] {
        let answer = slack.ephemeral(n).await;
        assert!(answer.starts_with("Not decided"), "{answer}");
    }
    assert!(
        is_pending(&app, "c1").await,
        "dave is in dev, the call needs ops"
    );
    slack.assert_no_problems();
}

async fn a_slack_user_the_broker_does_not_know_is_refused_ephemerally(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    let message = submit_and_see_posted(&app, &slack, "c1", "").await;
    assert_eq!(
        click(&app, &slack, "U0NOBODY", "approve", &message).await,
        200
    );
    let answer = slack.ephemeral(1).await;
    assert!(
        answer.contains("not mapped to an approver") && answer.contains("U0NOBODY"),
        "{answer}"
    );
    assert!(is_pending(&app, "c1").await);
    slack.assert_no_problems();
}

async fn a_person_mapped_by_email_decides_as_that_identity(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    let message = submit_and_see_posted(&app, &slack, "c1", "").await;
    click(&app, &slack, "U0ERIN", "deny", &message).await;
    let outcome = wait_outcome(&app, "c1").await;
    assert_eq!(outcome.status(), pb::CallStatus::Denied);
    assert_eq!(outcome.decided_by, "approver:erin");
    slack.wait_for("/api/users.info", |_| true).await;
    slack.assert_no_problems();
}

async fn forged_replayed_and_stale_clicks_are_refused_and_decide_nothing(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    let message = submit_and_see_posted(&app, &slack, "c1", "").await;
    let body = click_body(&slack, "U0ALICE", "approve", &message);
    let now = unix_now().to_string();
    let headers = |timestamp: &str, signature: String| {
        vec![
            ("x-slack-request-timestamp", timestamp.to_owned()),
            ("x-slack-signature", signature),
        ]
    };
    let path = "/slack/interactivity";
    // Signed with another secret; the body changed after signing; no signature; stale.
    let forged = slack_signature("not-the-secret", &now, &body);
    assert_eq!(post(&app, path, &body, &headers(&now, forged)).await, 401);
    let signed = slack_signature(SIGNING_SECRET, &now, &body);
    let altered = body.replace("U0ALICE", "U0BOB00");
    assert_eq!(
        post(&app, path, &altered, &headers(&now, signed.clone())).await,
        401
    );
    assert_eq!(post(&app, path, &body, &[]).await, 401);
    let old = (unix_now() - 6 * 60).to_string();
    let stale = slack_signature(SIGNING_SECRET, &old, &body);
    assert_eq!(post(&app, path, &body, &headers(&old, stale)).await, 401);
    assert!(
        is_pending(&app, "c1").await,
        "no refused request decided anything"
    );

    // A deny, replayed: the first is taken, the copy refused.
    let deny = click_body(&slack, "U0ALICE", "deny", &message);
    let signed = slack_signature(SIGNING_SECRET, &now, &deny);
    assert_eq!(
        post(&app, path, &deny, &headers(&now, signed.clone())).await,
        200
    );
    assert_eq!(post(&app, path, &deny, &headers(&now, signed)).await, 401);
    assert_eq!(
        wait_outcome(&app, "c1").await.status(),
        pb::CallStatus::Denied
    );
    // Only POST.
    assert_eq!(get(&app, path).await, 405);
    slack.assert_no_problems();
}

async fn a_decision_made_in_the_inbox_updates_the_slack_message(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    submit_and_see_posted(&app, &slack, "c1", "").await;
    let ts = message_ts(&slack, "c1");
    // Auth is off in this broker: the approver names themself (alice@example.com).
    approve(&app, "s1", "c1").await;
    let updated = slack
        .wait_for("/api/chat.update", |b| b["ts"] == ts.as_str())
        .await;
    assert_eq!(updated["channel"], CHANNEL);
    assert!(updated.to_string().contains("APPROVED"), "{updated}");
    slack.assert_no_problems();
}

/// Which message a call was posted as is stored, not remembered: a broker started again on the
/// same database updates it.
async fn a_message_posted_before_a_restart_is_updated_after_it(backend: Backend) {
    let (app, slack, dir) = start(backend, 1).await;
    submit_and_see_posted(&app, &slack, "c1", "").await;
    let ts = message_ts(&slack, "c1");
    until_recorded(&app, 1).await;
    let app = app.restart_with(configure(&slack, dir.path(), 1)).await;
    approve(&app, "s1", "c1").await;
    let updated = slack
        .wait_for("/api/chat.update", |b| b["ts"] == ts.as_str())
        .await;
    assert!(updated.to_string().contains("APPROVED"), "{updated}");
    let posts = slack
        .received()
        .iter()
        .filter(|r| r.path == "/api/chat.postMessage" && r.body["thread_ts"].is_null())
        .count();
    assert_eq!(
        posts, 1,
        "the call was posted once, not again after the restart"
    );
    slack.assert_no_problems();
}

async fn reminders_and_escalations_are_threaded_under_the_message(backend: Backend) {
    let ladder = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        ladder.path(),
        r#"{"steps": [{"after": "300ms"}, {"after": "600ms", "kind": "escalation"}]}"#,
    )
    .unwrap();
    let path = ladder.path().to_owned();
    let (app, slack, _dir) = start_with(backend, 1, move |c| {
        c.escalation.escalation_file = Some(path)
    })
    .await;
    submit_and_see_posted(&app, &slack, "c1", "").await;
    let ts = message_ts(&slack, "c1");
    for lead in ["Reminder", "Escalated"] {
        let reply = slack
            .wait_for("/api/chat.postMessage", |b| {
                b["thread_ts"] == ts.as_str() && b["text"].as_str().unwrap_or("").starts_with(lead)
            })
            .await;
        assert_eq!(reply["channel"], CHANNEL, "{reply}");
    }
    slack.assert_no_problems();
}

/// Posting runs after the commit, from the log: with Slack unreachable, a call is still
/// submitted, decided in the inbox, and its outcome read by the agent.
async fn slack_down_never_stops_a_decision(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    slack.stop();
    for id in ["c1", "c2"] {
        submit_one(&app, "s1", call(id, "Bash", "{}")).await;
        approve(&app, "s1", id).await;
        assert_eq!(
            wait_outcome(&app, id).await.status(),
            pb::CallStatus::Approved
        );
    }
    assert!(slack.received().is_empty());
}

/// A call submitted while no broker ran Slack app mode is posted when one starts, and once only
/// (a restart does not post it again).
async fn a_call_pending_before_slack_app_mode_started_is_posted_once(backend: Backend) {
    let slack = FakeSlack::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let app = helpers::spawn_app_on(backend, |_| {}).await;
    submit_one(&app, "s1", call("c1", "Bash", "{}")).await;
    let app = app.restart_with(configure(&slack, dir.path(), 1)).await;
    let message = slack
        .wait_for("/api/chat.postMessage", |b| b.to_string().contains("c1"))
        .await;
    until_recorded(&app, 1).await;
    let app = app.restart_with(configure(&slack, dir.path(), 1)).await;
    click(&app, &slack, "U0ALICE", "approve", &message).await;
    assert_eq!(
        wait_outcome(&app, "c1").await.status(),
        pb::CallStatus::Approved
    );
    slack
        .wait_for("/api/chat.update", |b| b.to_string().contains("APPROVED"))
        .await;
    let posts = slack
        .received()
        .iter()
        .filter(|r| r.path == "/api/chat.postMessage" && r.body["thread_ts"].is_null())
        .count();
    assert_eq!(posts, 1, "posted once across two starts");
    slack.assert_no_problems();
}

/// A post Slack never answered leaves a claim that a later start takes over, once it is older
/// than every attempt could take: the call is posted then.
async fn a_post_that_failed_every_attempt_is_made_at_the_next_start(backend: Backend) {
    let fast = |c: &mut Config| {
        c.webhooks.webhook_timeout = Duration::from_millis(200);
        c.slack.slack_attempts = 2;
    };
    let (mut app, down, dir) = start_with(backend, 1, fast).await;
    down.stop();
    submit_one(&app, "s1", call("c1", "Bash", "{}")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Stopped (its rounds of retries, which renew its claim, stop with it), then longer than
    // two attempts can take (2 × (200ms timeout + 200ms longest wait)).
    app.shut_down().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let slack = FakeSlack::start(&[]).await;
    let settings = configure(&slack, dir.path(), 1);
    let app = app
        .restart_with(|c| {
            settings(c);
            fast(c);
        })
        .await;
    let message = slack
        .wait_for("/api/chat.postMessage", |b| b.to_string().contains("c1"))
        .await;
    click(&app, &slack, "U0ALICE", "approve", &message).await;
    assert_eq!(
        wait_outcome(&app, "c1").await.status(),
        pb::CallStatus::Approved
    );
    slack.assert_no_problems();
}

/// Waits until the broker stored where `n` messages were posted: Slack answering a post is
/// seen by the stand-in a moment before the broker records it, and a broker stopped in that
/// moment leaves a claim without a message (taken over only once stale).
async fn until_recorded(app: &TestApp, n: i64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while app
        .count("SELECT count(*) FROM slack_messages WHERE ts <> ''")
        .await
        < n
    {
        assert!(tokio::time::Instant::now() < deadline, "never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `done` holds, up to [`PATIENCE`].
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The top-level messages posted for `call_id` (thread replies left out).
fn posts_of(slack: &FakeSlack, call_id: &str) -> usize {
    slack
        .received()
        .iter()
        .filter(|r| {
            r.path == "/api/chat.postMessage"
                && r.body["thread_ts"].is_null()
                && r.body.to_string().contains(call_id)
        })
        .count()
}

/// A post that failed every attempt is made again while the broker runs, once Slack answers:
/// no restart. Its buttons then decide as any message's.
async fn a_post_that_failed_every_attempt_is_made_later_without_a_restart(backend: Backend) {
    let (app, slack, _dir) = start_with(backend, 1, |c| c.slack.slack_attempts = 2).await;
    // Both attempts fail, and so does the first round after them.
    slack.fail_next("chat.postMessage", 3);
    let message = submit_and_see_posted(&app, &slack, "c1", "").await;
    assert_eq!(slack.refused("chat.postMessage"), 3);
    assert_eq!(posts_of(&slack, "c1"), 1);
    click(&app, &slack, "U0ALICE", "approve", &message).await;
    assert_eq!(
        wait_outcome(&app, "c1").await.status(),
        pb::CallStatus::Approved
    );
    slack
        .wait_for("/api/chat.update", |b| b.to_string().contains("APPROVED"))
        .await;
    assert_eq!(posts_of(&slack, "c1"), 1, "posted once");
    slack.assert_no_problems();
}

/// While Slack fails, a call decided in the inbox is never posted (nobody could answer it in
/// Slack any more), and the update of a message posted before is made once Slack answers.
async fn while_slack_fails_a_call_decided_meanwhile_is_never_posted_and_its_update_is_made_later(
    backend: Backend,
) {
    let (app, slack, _dir) = start_with(backend, 1, |c| c.slack.slack_attempts = 2).await;
    submit_and_see_posted(&app, &slack, "c1", "").await;
    slack.fail_next("chat.postMessage", 1000);
    slack.fail_next("chat.update", 1000);
    submit_one(&app, "s1", call("c2", "Bash", "{}")).await;
    approve(&app, "s1", "c2").await;
    approve(&app, "s1", "c1").await;
    until(
        "c1's update and c2's post failed, and a round after them",
        || slack.refused("chat.update") >= 3 && slack.refused("chat.postMessage") >= 2,
    )
    .await;
    slack.fail_next("chat.postMessage", 0);
    slack.fail_next("chat.update", 0);
    let ts = message_ts(&slack, "c1");
    slack
        .wait_for("/api/chat.update", |b| {
            b["ts"] == ts.as_str() && b.to_string().contains("APPROVED")
        })
        .await;
    // A call submitted now is posted at once; c2 never is.
    submit_and_see_posted(&app, &slack, "c3", "").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(posts_of(&slack, "c2"), 0, "a decided call was posted");
    slack.assert_no_problems();
}

/// A Slack person whose entry names no groups has the groups the token file gives their
/// identity; an entry's own groups win over the token file's.
async fn a_slack_person_without_groups_has_the_token_files_and_their_own_groups_win(
    backend: Backend,
) {
    use approval_broker::door::auth::hash_token;
    let people = vec![
        json!({"slack_user": "U0FRANK", "identity": "Frank"}),
        json!({"slack_user": "U0GINA", "identity": "gina", "groups": ["dev"]}),
    ];
    let slack = FakeSlack::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = configure_with_people(&slack, dir.path(), 1, people);
    let app = helpers::spawn_app_on(backend, |config| {
        settings(config);
        config.auth.tokens = Some(format!(
            "agent bot {}\napprover frank {} groups=ops,dev\napprover gina {} groups=ops",
            hash_token("token-of-bot"),
            hash_token("token-of-frank"),
            hash_token("token-of-gina"),
        ));
    })
    .await;
    pb::agent_service_client::AgentServiceClient::with_interceptor(
        app.channel.clone(),
        crate::routing::bearer("token-of-bot"),
    )
    .submit(pb::SubmitRequest {
        batch: Some(helpers::batch(
            "s1",
            vec![call("c1", "Bash", r#"{"command":"make deploy"}"#)],
        )),
    })
    .await
    .expect("submit");
    let message = slack
        .wait_for("/api/chat.postMessage", |b| b.to_string().contains("c1"))
        .await;
    // gina's token is in ops, but her Slack entry says dev: dev it is, and the call needs ops.
    click(&app, &slack, "U0GINA", "approve", &message).await;
    let answer = slack.ephemeral(1).await;
    assert!(answer.starts_with("Not decided"), "{answer}");
    // frank's entry names no groups: his token's (ops, dev) are his.
    click(&app, &slack, "U0FRANK", "approve", &message).await;
    let answer = slack.ephemeral(2).await;
    assert_eq!(answer, "Decided: APPROVED as frank.");
    slack
        .wait_for("/api/chat.update", |b| {
            b.to_string().contains("APPROVED") && b.to_string().contains("frank")
        })
        .await;
    slack.assert_no_problems();
}

/// A call whose requirement asks for a passkey has no Approve button in Slack: its button opens
/// the call in the inbox, where the passkey signs the approval. An Approve click on it anyway is
/// refused ephemerally, pointing there; Deny needs no passkey and works from Slack.
async fn a_call_that_needs_a_passkey_is_approved_only_in_the_inbox_and_may_be_denied_from_slack(
    backend: Backend,
) {
    let (app, slack, _dir) = start_with(backend, 1, |c| {
        c.policy.default_approvers = Some(Approvers {
            groups: vec!["ops".into()],
            step_up: Some(approval_broker::domain::policy::StepUp::Passkey),
            ..Approvers::default()
        });
    })
    .await;
    let message = submit_and_see_posted(&app, &slack, "c1", "").await;
    let buttons = message["blocks"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "actions"))
        .and_then(|b| b["elements"].as_array())
        .cloned()
        .expect("buttons");
    let actions: Vec<&str> = buttons
        .iter()
        .map(|b| b["action_id"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(actions, ["open", "deny"], "no Approve button: {message}");
    assert_eq!(buttons[0]["text"]["text"], "Approve in the inbox");
    let url = buttons[0]["url"].as_str().expect("a link");
    assert!(
        url.starts_with("https://approvals.example.com/#call/") && url.ends_with("/s1/c1"),
        "{url}"
    );
    assert!(
        message.to_string().contains("signed with a passkey"),
        "{message}"
    );

    // An Approve click all the same (as a crafted payload or an older message would send).
    let mut crafted = message.clone();
    let deny = buttons[1].clone();
    let approve = json!({
        "type": "button", "action_id": "approve", "style": "primary",
        "text": {"type": "plain_text", "text": "Approve"}, "value": deny["value"],
    });
    for block in crafted["blocks"].as_array_mut().unwrap() {
        if block["type"] == "actions" {
            block["elements"]
                .as_array_mut()
                .unwrap()
                .push(approve.clone());
        }
    }
    assert_eq!(
        click(&app, &slack, "U0ALICE", "approve", &crafted).await,
        200
    );
    let answer = slack.ephemeral(1).await;
    assert!(
        answer.starts_with("Not decided: this call needs your passkey") && answer.contains(url),
        "{answer}"
    );
    assert!(is_pending(&app, "c1").await);

    click(&app, &slack, "U0ALICE", "deny", &message).await;
    assert_eq!(
        wait_outcome(&app, "c1").await.status(),
        pb::CallStatus::Denied
    );
    slack
        .wait_for("/api/chat.update", |b| b.to_string().contains("DENIED"))
        .await;
    slack.assert_no_problems();
}

/// Slack's API on an internal address is refused at start unless the egress allow-list names it,
/// as for webhooks: never found out by a delivery that tries.
#[tokio::test]
async fn a_slack_api_on_an_internal_address_is_refused_at_start_naming_the_setting() {
    let slack = FakeSlack::start(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::for_tests(format!(
        "sqlite://{}",
        dir.path().join("approvals.db").display()
    ));
    configure(&slack, dir.path(), 1)(&mut config);
    config.webhooks.webhook_allow_hosts.clear();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let refused = approval_broker::startup::run(listener, config, std::future::pending())
        .await
        .expect_err("the broker started");
    let message = refused.to_string();
    assert!(
        message.contains("--slack-api-url") && message.contains("--webhook-allow-hosts"),
        "{message}"
    );
}

async fn mentions_and_links_in_an_input_reach_slack_escaped(backend: Backend) {
    let (app, slack, _dir) = start(backend, 1).await;
    let input = json!({
        "command": "echo <!channel> <@U0ALICE> <https://evil.example|click me> ``` *bold* &amp;",
    });
    let spec = pb::CallSpec {
        title: "<!here> ping".into(),
        ..call("c1", "Bash", &input.to_string())
    };
    submit_one(&app, "s1", spec).await;
    let message = slack.wait_for("/api/chat.postMessage", |_| true).await;
    let texts: Vec<String> = message["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|b| {
            let mut t = vec![b["text"]["text"].as_str().unwrap_or_default().to_owned()];
            if let Some(elements) = b["elements"].as_array() {
                t.extend(
                    elements
                        .iter()
                        .filter_map(|e| e["text"].as_str().map(str::to_owned)),
                );
            }
            t
        })
        .chain([message["text"].as_str().unwrap().to_owned()])
        .collect();
    let all = texts.join("\n");
    for markup in [
        "<!channel>",
        "<@U0ALICE>",
        "<https://evil.example",
        "<!here>",
    ] {
        assert!(
            !all.contains(markup),
            "{markup} reached Slack as markup: {all}"
        );
    }
    assert!(
        all.contains("&lt;!channel&gt;") && all.contains("&lt;@U0ALICE&gt;"),
        "{all}"
    );
    assert!(
        all.contains("&amp;amp;"),
        "an entity typed is shown as typed: {all}"
    );
    let code = texts
        .iter()
        .find(|t| t.starts_with("```"))
        .expect("a code block");
    assert_eq!(
        code.matches("```").count(),
        2,
        "the input cannot close its code block: {code}"
    );
    slack.assert_no_problems();
}

/// What Slack app mode keeps of a call (its message) goes when retention prunes the call, so
/// the table does not grow for ever; a pending call's stays.
async fn retention_prunes_a_decided_calls_slack_message_with_the_call(backend: Backend) {
    let (app, slack, _dir) = start_with(backend, 1, |config| {
        config.lifecycle.retain_decided = Some(Duration::from_secs(1));
        config.lifecycle.prune_every = Duration::from_millis(100);
    })
    .await;
    submit_and_see_posted(&app, &slack, "decided", "").await;
    submit_and_see_posted(&app, &slack, "pending", "").await;
    let ts = message_ts(&slack, "decided");
    approve(&app, "s1", "decided").await;
    slack
        .wait_for("/api/chat.update", |b| b["ts"] == ts.as_str())
        .await;
    until_pruned(&app, "s1", "decided").await;
    let kept = |call: &str| {
        format!(
            "SELECT COUNT(*) FROM slack_messages WHERE session_id = 's1' AND call_id = '{call}'"
        )
    };
    assert_eq!(app.count(&kept("decided")).await, 0);
    assert_eq!(app.count(&kept("pending")).await, 1);
    slack.assert_no_problems();
}

/// The `chat.update`s the stand-in received for the message `ts`.
fn updates_of(slack: &FakeSlack, ts: &str) -> Vec<Value> {
    slack
        .received()
        .into_iter()
        .filter(|r| r.path == "/api/chat.update" && r.body["ts"] == ts)
        .map(|r| r.body)
        .collect()
}

/// Whether a message still offers Approve or Deny.
fn has_decision_buttons(message: &Value) -> bool {
    message["blocks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|block| block["type"] == "actions")
        .flat_map(|block| block["elements"].as_array().cloned().unwrap_or_default())
        .any(|button| button["action_id"] == "approve" || button["action_id"] == "deny")
}

/// The poster follows the event log from where it stopped: a call posted by one Slack-mode
/// broker and decided through a broker that runs without Slack app mode has its Approve and Deny
/// buttons removed when a Slack-mode broker starts again; a call decided while that one runs is
/// updated once.
async fn a_call_decided_while_no_broker_ran_slack_app_mode_loses_its_buttons_when_one_starts(
    backend: Backend,
) {
    let (app, slack, dir) = start(backend, 1).await;
    let posted = submit_and_see_posted(&app, &slack, "c1", "").await;
    assert!(has_decision_buttons(&posted), "{posted}");
    let ts = message_ts(&slack, "c1");
    until_recorded(&app, 1).await;
    // The same database, served by a broker without Slack app mode: it decides the call.
    let app = app.restart_with(|_| {}).await;
    approve(&app, "s1", "c1").await;
    assert_eq!(
        wait_outcome(&app, "c1").await.status(),
        pb::CallStatus::Approved
    );
    assert!(updates_of(&slack, &ts).is_empty(), "nobody could update it");
    // A Slack-mode broker again: it catches up.
    let app = app.restart_with(configure(&slack, dir.path(), 1)).await;
    let updated = slack
        .wait_for("/api/chat.update", |b| b["ts"] == ts.as_str())
        .await;
    assert_eq!(updated["channel"], CHANNEL);
    assert!(updated.to_string().contains("APPROVED"), "{updated}");
    assert!(!has_decision_buttons(&updated), "buttons left: {updated}");
    // Decided while it runs: updated once, from the live event.
    submit_and_see_posted(&app, &slack, "c2", "").await;
    let ts2 = message_ts(&slack, "c2");
    approve(&app, "s1", "c2").await;
    slack
        .wait_for("/api/chat.update", |b| {
            b["ts"] == ts2.as_str() && b.to_string().contains("APPROVED")
        })
        .await;
    // The poster handles the log in order: once c3 is posted, c2's events are behind it.
    submit_and_see_posted(&app, &slack, "c3", "").await;
    assert_eq!(
        updates_of(&slack, &ts2).len(),
        1,
        "c2's message updated once"
    );
    assert_eq!(posts_of(&slack, "c1"), 1, "c1 was not posted again");
    slack.assert_no_problems();
}

/// Two Slack-mode replicas starting after a call was decided elsewhere both catch up from the
/// fleet's stored position: every update its message gets is the outcome, alike whichever
/// replica made it (no buttons left), and a call left pending is posted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn replicas_catching_up_update_a_message_alike_and_post_a_pending_call_once() {
    let (app, slack, dir) = start(Backend::postgres(), 1).await;
    submit_and_see_posted(&app, &slack, "c1", "").await;
    let ts = message_ts(&slack, "c1");
    until_recorded(&app, 1).await;
    let app = app.restart_with(|_| {}).await;
    approve(&app, "s1", "c1").await;
    submit_one(&app, "s1", call("c2", "Bash", "{}")).await;
    let app = app.restart_with(configure(&slack, dir.path(), 1)).await;
    let replica = app.replica(configure(&slack, dir.path(), 1)).await;
    slack
        .wait_for("/api/chat.update", |b| b["ts"] == ts.as_str())
        .await;
    slack
        .wait_for("/api/chat.postMessage", |b| b.to_string().contains("c2"))
        .await;
    // A call submitted now, through either replica, is posted once too.
    submit_and_see_posted(&replica, &slack, "c3", "").await;
    let updates = updates_of(&slack, &ts);
    assert!(
        updates.iter().all(|u| u["blocks"] == updates[0]["blocks"]),
        "replicas updated c1 differently: {updates:#?}"
    );
    assert!(!has_decision_buttons(&updates[0]), "{:#}", updates[0]);
    for id in ["c1", "c2", "c3"] {
        assert_eq!(posts_of(&slack, id), 1, "{id} posted once");
    }
    slack.assert_no_problems();
}
