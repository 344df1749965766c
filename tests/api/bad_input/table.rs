//! The table's machinery: a case is a request and what it must get back ([`Expect`]); each is
//! run against a seeded broker, after which the broker must still serve and its database be
//! unchanged. Also the seed, and the builders every area shares.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use approval_broker::proto::v1 as pb;
use tonic::transport::Channel;
use tonic::{Code, Response, Status};

use crate::helpers::*;

/// The gRPC message limit the broker of this test runs with.
pub(super) const MESSAGE_LIMIT: usize = 64 * 1024;

/// The tool-input limit the broker of this test runs with.
pub(super) const INPUT_LIMIT: usize = 1024;

/// What the broker answers a message over the limit with, and what its message says.
pub(super) const OVERSIZED: Expect =
    Expect::Status(Code::ResourceExhausted, "message length too large");

/// The workspace of the seeded call `tricky/w1`: quotes, wildcards and SQL.
pub(super) const TRICKY: &str = "it's \"%_' OR '1'='1";

/// The tool of the seeded call `pct/p1`.
pub(super) const PCT_TOOL: &str = "50%_off";

/// What a case's request got back, reduced to what the table checks.
pub(super) enum Got {
    /// The RPC (or the stream) ended with this status.
    Status(Status),
    /// The RPC succeeded but refused the one item it was about: the only call of a submitted
    /// batch, or the request on a `Connect` stream (which then still answers a valid request).
    Item(pb::ItemError),
    /// The RPC succeeded and listed these calls (`session/call_id`), outcomes or states.
    Listed(Vec<String>),
    /// Anything else, described.
    Other(String),
}

impl Debug for Got {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Got::Status(s) => write!(f, "status {:?}: {}", s.code(), short(s.message())),
            Got::Item(e) => write!(
                f,
                "item error {:?}: {}",
                Code::from_i32(e.code),
                short(&e.message)
            ),
            Got::Listed(ids) => write!(f, "listed {ids:?}"),
            Got::Other(what) => write!(f, "{}", short(what)),
        }
    }
}

#[derive(Clone, Copy)]
pub(super) enum Expect {
    /// The RPC fails with this code; the message contains this text (the field it names).
    Status(Code, &'static str),
    /// The item is refused with this code; the message contains this text.
    Item(Code, &'static str),
    /// The request is valid and lists exactly these, in this order.
    Lists(&'static [&'static str]),
}

type Rpc = Box<dyn Fn(Channel) -> Pin<Box<dyn Future<Output = Got> + Send>>>;

pub(super) struct Case {
    name: &'static str,
    rpc: Rpc,
    expect: Expect,
}

pub(super) fn case<F, Fut>(name: &'static str, expect: Expect, rpc: F) -> Case
where
    F: Fn(Channel) -> Fut + 'static,
    Fut: Future<Output = Got> + Send + 'static,
{
    Case {
        name,
        expect,
        rpc: Box::new(move |channel| Box::pin(rpc(channel))),
    }
}

fn short(text: &str) -> String {
    if text.len() <= 300 {
        return text.to_owned();
    }
    let mut end = 300;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

fn check(expect: Expect, got: &Got) -> Result<(), String> {
    let ok = match (expect, got) {
        (Expect::Status(code, text), Got::Status(status)) => {
            status.code() == code && status.message().contains(text)
        }
        (Expect::Item(code, text), Got::Item(error)) => {
            error.code == code as i32 && error.message.contains(text)
        }
        (Expect::Lists(expected), Got::Listed(listed)) => listed == expected,
        _ => false,
    };
    if ok {
        return Ok(());
    }
    let wanted = match expect {
        Expect::Status(code, text) => format!("status {code:?} naming `{text}`"),
        Expect::Item(code, text) => format!("item error {code:?} naming `{text}`"),
        Expect::Lists(ids) => format!("a listing of {ids:?}"),
    };
    Err(format!("expected {wanted}, got {got:?}"))
}

pub(super) fn unary<T: Debug>(result: Result<Response<T>, Status>) -> Got {
    match result {
        Ok(response) => Got::Other(format!("OK {:?}", response.into_inner())),
        Err(status) => Got::Status(status),
    }
}

pub(super) fn listed(calls: &[pb::Call]) -> Vec<String> {
    calls
        .iter()
        .map(|c| format!("{}/{}", c.session_id, c.call_id))
        .collect()
}

pub(super) fn ts(seconds: i64, nanos: i32) -> Option<prost_types::Timestamp> {
    Some(prost_types::Timestamp { seconds, nanos })
}

pub(super) fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("id{i}")).collect()
}

pub(super) fn filter(edit: impl FnOnce(&mut pb::CallFilter)) -> pb::CallFilter {
    let mut f = pb::CallFilter::default();
    edit(&mut f);
    f
}

pub(super) const INVALID: Code = Code::InvalidArgument;

pub(super) fn invalid(field: &'static str) -> Expect {
    Expect::Status(INVALID, field)
}

pub(super) fn item(field: &'static str) -> Expect {
    Expect::Item(INVALID, field)
}

/// Events the seed writes: four calls requested, one resolved.
pub(super) const SEED_EVENTS: u64 = 5;

/// `seed/c1` pending and `seed/c2` denied (one INDEPENDENT batch), `tricky/w1` pending in the
/// workspace [`TRICKY`], `pct/p1` pending with the tool [`PCT_TOOL`].
async fn seed(app: &TestApp) {
    submit_ok(
        app,
        pb::BatchSpec {
            on_deny: pb::OnDeny::Independent as i32,
            ..batch(
                "seed",
                vec![call("c1", "t", r#"{"path":"a"}"#), call("c2", "t", "{}")],
            )
        },
    )
    .await;
    submit_ok(
        app,
        batch(
            "tricky",
            vec![pb::CallSpec {
                workspace: TRICKY.into(),
                ..call("w1", "t", "{}")
            }],
        ),
    )
    .await;
    submit_ok(app, batch("pct", vec![call("p1", PCT_TOOL, "{}")])).await;
    deny(app, "seed", "c2", "no").await;
}

async fn submit_ok(app: &TestApp, spec: pb::BatchSpec) {
    let response = crate::helpers::submit(app, spec).await;
    assert!(
        response
            .acks
            .iter()
            .all(|a| matches!(a.result, Some(pb::call_ack::Result::Accepted(_)))),
        "seed accepted: {response:?}"
    );
}

/// Everything a rejected request must not change: every call (with its status and outcome)
/// and the last event's sequence number.
#[derive(Debug, PartialEq)]
struct State {
    calls: Vec<pb::Call>,
    last_seq: u64,
}

async fn state(app: &TestApp) -> State {
    let mut subscription = Subscription::open(app, pb::CallFilter::default(), None).await;
    let (_, last_seq) = subscription.snapshot().await;
    State {
        calls: all_calls(app).await,
        last_seq,
    }
}

/// Health says SERVING and a valid ListPending lists the three seeded pending calls.
async fn still_serves(app: &TestApp) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let health = tonic_health::pb::health_client::HealthClient::new(app.channel.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .map_err(|e| format!("health check failed: {e:?}"))?
        .into_inner();
    if health.status != ServingStatus::Serving as i32 {
        return Err(format!("health says {health:?}"));
    }
    let pending = app
        .approver()
        .list_pending(pb::ListPendingRequest::default())
        .await
        .map_err(|e| format!("a valid ListPending failed: {e:?}"))?
        .into_inner();
    let ids = listed(&pending.calls);
    if ids != ["seed/c1", "tricky/w1", "pct/p1"] {
        return Err(format!("a valid ListPending listed {ids:?}"));
    }
    Ok(())
}

/// Runs every case; collects every failure, each naming its case.
async fn run_table(app: &TestApp, table: Vec<Case>, before: &State) -> Vec<String> {
    let mut failures = Vec::new();
    for case in table {
        let got = match tokio::time::timeout(PATIENCE, (case.rpc)(app.channel.clone())).await {
            Ok(got) => got,
            Err(_) => Got::Other(format!("no answer within {PATIENCE:?}")),
        };
        if let Err(why) = check(case.expect, &got) {
            failures.push(format!("{}: {why}", case.name));
        }
        if let Err(why) = still_serves(app).await {
            failures.push(format!("{}: the broker no longer serves: {why}", case.name));
            break;
        }
        let after = state(app).await;
        if &after != before {
            failures.push(format!(
                "{}: changed the database (last seq {} -> {}, {} -> {} calls)",
                case.name,
                before.last_seq,
                after.last_seq,
                before.calls.len(),
                after.calls.len()
            ));
        }
    }
    failures
}

async fn seeded_state(app: &TestApp) -> State {
    seed(app).await;
    let before = state(app).await;
    assert_eq!(before.last_seq, SEED_EVENTS, "the seed's events");
    assert_eq!(before.calls.len(), 4, "the seed's calls");
    before
}

/// Seeds the broker, then runs every case `cases` builds (given the last event's sequence number
/// after seeding), and fails naming every case that was not refused precisely, stopped the broker
/// serving, or changed the database.
pub(super) async fn refuses_every_case(app: &TestApp, cases: impl FnOnce(u64) -> Vec<Case>) {
    let before = seeded_state(app).await;
    let table = cases(before.last_seq);
    assert!(!table.is_empty(), "no case");
    let total = table.len();
    let failures = run_table(app, table, &before).await;
    assert!(
        failures.is_empty(),
        "{} of {total} bad-input cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The limits every bad-input broker runs with: a small gRPC message limit (so oversized
/// messages can be sent) and a small input limit.
pub(super) fn small_limits(config: &mut approval_broker::config::Config) {
    config.requests.max_message_bytes = MESSAGE_LIMIT;
    config.requests.max_input_bytes = INPUT_LIMIT;
}
