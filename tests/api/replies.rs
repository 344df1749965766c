//! Replies never exceed the reply limit (`--max-reply-bytes`, at most `--max-message-bytes`):
//! listings of large calls are cut into pages by size as well as by count, lookups answer the
//! first ids that fit, and a write that committed is reported as committed however much it did,
//! listing what fits and counting all of it.

use approval_broker::proto::v1 as pb;
use prost::Message as _;

use crate::helpers::*;

/// The default reply limit: also the receive limit of the test's (and most) gRPC clients.
const DEFAULT_REPLY_LIMIT: usize = 4 * 1024 * 1024;

/// A small message limit, so that a write's reply outgrows it with a thousand calls rather than
/// sixty-four thousand.
const SMALL_MESSAGE_LIMIT: usize = 64 * 1024;

/// Calls enough to outgrow [`SMALL_MESSAGE_LIMIT`] several times over in outcomes.
const MANY: usize = 1000;

/// A tool input just under the default 256 KiB cap; `n` makes each one different.
fn big_input(n: usize) -> String {
    format!("{{\"n\":{n},\"text\":\"{}\"}}", "x".repeat(250 * 1024))
}

/// Submits `count` calls `c0`, `c1`... to `session`, `per_batch` a batch, each with `input(i)`.
async fn submit_calls(
    app: &TestApp,
    session: &str,
    count: usize,
    per_batch: usize,
    input: impl Fn(usize) -> String,
) {
    for start in (0..count).step_by(per_batch) {
        let calls = (start..count.min(start + per_batch))
            .map(|i| call(&format!("c{i}"), "write_file", &input(i)))
            .collect();
        submit(
            app,
            pb::BatchSpec {
                on_deny: pb::OnDeny::Independent as i32,
                ..batch(session, calls)
            },
        )
        .await;
    }
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("c{i}")).collect()
}

/// Every page of ListPending, each checked to be under `limit`.
async fn pending_pages(app: &TestApp, limit: usize) -> Vec<pb::ListPendingResponse> {
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .approver()
            .list_pending(pb::ListPendingRequest {
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list pending")
            .into_inner();
        assert!(page.encoded_len() <= limit, "{} bytes", page.encoded_len());
        assert!(!page.calls.is_empty(), "an empty page");
        token = page.next_page_token.clone();
        pages.push(page);
        if token.is_empty() {
            return pages;
        }
    }
}

/// Every call ListCalls returns for `request` (paged), each page checked to be under `limit`.
async fn list_all_calls(
    app: &TestApp,
    request: pb::ListCallsRequest,
    limit: usize,
) -> (Vec<pb::Call>, usize) {
    let pages = list_calls_pages(app, request).await;
    let count = pages.len();
    let mut calls = Vec::new();
    for page in pages {
        assert!(page.encoded_len() <= limit, "{} bytes", page.encoded_len());
        calls.extend(page.calls);
    }
    (calls, count)
}

/// The states of `call_ids` through GetOutcomes, asking again for the ids a reply left out;
/// every reply checked to be under `limit`. Returns them with the number of requests it took.
async fn all_states(
    app: &TestApp,
    session: &str,
    call_ids: &[String],
    limit: usize,
) -> (Vec<pb::CallState>, usize) {
    let mut states = Vec::new();
    let mut requests = 0;
    while states.len() < call_ids.len() {
        let asked = &call_ids[states.len()..];
        let reply = app
            .agent()
            .get_outcomes(pb::GetOutcomesRequest {
                session_id: session.into(),
                call_ids: asked.to_vec(),
            })
            .await
            .expect("get outcomes")
            .into_inner();
        requests += 1;
        assert!(
            reply.encoded_len() <= limit,
            "{} bytes",
            reply.encoded_len()
        );
        assert!(!reply.calls.is_empty(), "a reply answering no id");
        assert_eq!(reply.truncated, reply.calls.len() < asked.len());
        for (state, id) in reply.calls.iter().zip(asked) {
            assert_eq!(&state.call_id, id, "answers in the order asked");
        }
        states.extend(reply.calls);
    }
    (states, requests)
}

async fn listing_forty_pending_calls_of_256_kib_pages_through_all_of_them_under_the_limit(
    app: TestApp,
) {
    submit_calls(&app, "big", 40, 20, big_input).await;
    submit_calls(&app, "small", 2, 2, |_| "{}".into()).await;

    let pages = pending_pages(&app, DEFAULT_REPLY_LIMIT).await;
    assert!(pages.len() > 1, "40 calls of 256 KiB need several pages");
    let listed: Vec<(String, String)> = pages
        .iter()
        .flat_map(|p| &p.calls)
        .map(|c| (c.session_id.clone(), c.call_id.clone()))
        .collect();
    let mut expected: Vec<(String, String)> =
        ids(40).into_iter().map(|id| ("big".into(), id)).collect();
    expected.extend(ids(2).into_iter().map(|id| ("small".into(), id)));
    assert_eq!(listed, expected, "every pending call once, oldest first");

    let (calls, pages) =
        list_all_calls(&app, pb::ListCallsRequest::default(), DEFAULT_REPLY_LIMIT).await;
    assert!(pages > 1);
    assert_eq!(calls.len(), 42);
    assert!(
        calls
            .iter()
            .all(|c| c.input_json.len() > 250 * 1024 || c.session_id == "small")
    );

    let (states, requests) = all_states(&app, "big", &ids(40), DEFAULT_REPLY_LIMIT).await;
    assert!(requests > 1, "one reply cannot hold 40 calls of 256 KiB");
    assert!(
        states
            .iter()
            .all(|s| matches!(s.state, Some(pb::call_state::State::Pending(_))))
    );
}

async fn a_remembered_decision_that_approves_41_large_calls_answers_ok_and_counts_them_all(
    app: TestApp,
) {
    submit_calls(&app, "s", 42, 20, big_input).await;
    let mut request = decide_request("s", "c0", pb::Decision::Approve, "all of them");
    request.scope = pb::Scope::Session as i32;
    request.matcher = Some(any_input());
    let reply = app
        .approver()
        .decide(request)
        .await
        .expect("a committed decision is reported as committed")
        .into_inner();
    assert!(reply.encoded_len() <= DEFAULT_REPLY_LIMIT);
    assert_eq!(
        status_of(reply.outcome.as_ref().expect("outcome")),
        CallStatus::Approved
    );
    let grant = reply.grant.expect("a grant");
    assert_eq!(reply.decided_by_grant_count, 41);
    assert!(reply.truncated);
    assert!(!reply.decided_by_grant.is_empty() && reply.decided_by_grant.len() < 41);
    let by_grant = format!("grant:{}", grant.id);
    for outcome in &reply.decided_by_grant {
        assert_eq!(status_of(outcome), CallStatus::Approved);
        assert_eq!(outcome.decided_by, by_grant);
    }

    // Every one of them is approved, and the audit view lists them all, page by page.
    let (calls, pages) = list_all_calls(
        &app,
        pb::ListCallsRequest {
            decided_by: by_grant,
            ..Default::default()
        },
        DEFAULT_REPLY_LIMIT,
    )
    .await;
    assert!(pages > 1);
    let approved: Vec<String> = calls.iter().map(|c| c.call_id.clone()).collect();
    assert_eq!(approved, ids(42)[1..]);
    let (states, _) = all_states(&app, "s", &ids(42), DEFAULT_REPLY_LIMIT).await;
    for state in states {
        match state.state {
            Some(pb::call_state::State::Outcome(o)) => {
                assert_eq!(status_of(&o), CallStatus::Approved)
            }
            other => panic!("{} is not approved: {other:?}", state.call_id),
        }
    }
}

async fn cancelling_a_session_of_many_pending_calls_answers_ok_with_the_count_of_all(app: TestApp) {
    submit_calls(&app, "s", MANY, 125, |_| "{}".into()).await;
    let result = app
        .agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: "s".into(),
                target: Some(pb::cancel_target::Target::WholeSession(true)),
                reason: "user pressed stop".into(),
            }),
        })
        .await
        .expect("a committed cancel is reported as committed")
        .into_inner();
    assert!(result.encoded_len() <= SMALL_MESSAGE_LIMIT);
    let result = result.result.expect("result");
    assert_eq!(result.cancelled_count, MANY as u64);
    assert!(result.truncated);
    assert!(!result.cancelled.is_empty() && result.cancelled.len() < MANY);
    assert!(
        result
            .cancelled
            .iter()
            .all(|o| status_of(o) == CallStatus::Cancelled)
    );

    let (cancelled, pages) = list_all_calls(
        &app,
        pb::ListCallsRequest {
            statuses: vec![CallStatus::Cancelled as i32],
            ..Default::default()
        },
        SMALL_MESSAGE_LIMIT,
    )
    .await;
    assert!(pages > 1, "a thousand calls do not fit in one 64 KiB page");
    assert_eq!(cancelled.len(), MANY, "every call is really cancelled");
}

async fn superseding_many_pending_calls_answers_ok_with_the_count_of_all(app: TestApp) {
    submit_calls(&app, "s", MANY, 125, |_| "{}".into()).await;
    let reply = app
        .agent()
        .submit(pb::SubmitRequest {
            batch: Some(pb::BatchSpec {
                supersede_pending: true,
                ..batch("s", vec![call("new", "write_file", "{}")])
            }),
        })
        .await
        .expect("a committed submit is reported as committed")
        .into_inner();
    assert!(reply.encoded_len() <= SMALL_MESSAGE_LIMIT);
    assert_eq!(reply.acks.len(), 1);
    assert!(matches!(
        reply.acks[0].result,
        Some(pb::call_ack::Result::Accepted(_))
    ));
    assert_eq!(reply.superseded_count, MANY as u64);
    assert!(reply.truncated);
    assert!(!reply.superseded.is_empty() && reply.superseded.len() < MANY);

    let (superseded, _) = list_all_calls(
        &app,
        pb::ListCallsRequest {
            statuses: vec![CallStatus::Superseded as i32],
            ..Default::default()
        },
        SMALL_MESSAGE_LIMIT,
    )
    .await;
    assert_eq!(superseded.len(), MANY, "every call is really superseded");
    let pending = pending_pages(&app, SMALL_MESSAGE_LIMIT).await;
    let pending: Vec<&str> = pending
        .iter()
        .flat_map(|p| &p.calls)
        .map(|c| c.call_id.as_str())
        .collect();
    assert_eq!(pending, ["new"]);
}

async fn rules_and_grants_with_large_matchers_page_through_all_of_them_under_the_limit(
    app: TestApp,
) {
    // Forty ASK rules, each matching one 250 KiB input exactly: 10 MiB of rules.
    for i in 0..40 {
        let exact = exact_input(&big_input(i));
        create_rule(
            &app,
            rule(
                &format!("r{i:02}"),
                "other_tool",
                pb::Effect::Ask,
                0,
                Some(exact),
            ),
        )
        .await;
    }
    let mut rules = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = app
            .admin()
            .list_rules(pb::ListRulesRequest {
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list rules")
            .into_inner();
        assert!(page.encoded_len() <= DEFAULT_REPLY_LIMIT);
        assert!(!page.rules.is_empty());
        pages += 1;
        rules.extend(page.rules.into_iter().map(|r| r.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert!(pages > 1);
    let expected: Vec<String> = (0..40).map(|i| format!("r{i:02}")).collect();
    assert_eq!(rules, expected, "every rule once, in precedence order");

    // Forty grants, each remembering one 250 KiB input exactly.
    submit_calls(&app, "s", 40, 20, big_input).await;
    for id in ids(40) {
        let mut request = decide_request("s", &id, pb::Decision::Approve, "this one");
        request.scope = pb::Scope::Session as i32;
        let reply = app
            .approver()
            .decide(request)
            .await
            .expect("decide")
            .into_inner();
        assert!(
            reply.decided_by_grant.is_empty(),
            "each grant matches its own input"
        );
    }
    let mut grants = 0;
    let mut request = pb::ListGrantsRequest::default();
    loop {
        let page = app
            .admin()
            .list_grants(request.clone())
            .await
            .expect("list grants")
            .into_inner();
        assert!(page.encoded_len() <= DEFAULT_REPLY_LIMIT);
        assert!(!page.grants.is_empty());
        grants += page.grants.len();
        if page.next_page_token.is_empty() {
            break;
        }
        request.page_token = page.next_page_token;
    }
    assert_eq!(grants, 40);

    let revoked = app
        .admin()
        .revoke_grant(pb::RevokeGrantRequest {
            target: Some(pb::revoke_grant_request::Target::SessionId("s".into())),
            agent: String::new(),
        })
        .await
        .expect("a committed revocation is reported as committed")
        .into_inner();
    assert!(revoked.encoded_len() <= DEFAULT_REPLY_LIMIT);
    assert_eq!(revoked.revoked, 40);
    assert!(revoked.truncated && revoked.grants.len() < 40);
    let active = list_grants(&app, pb::ListGrantsRequest::default()).await;
    assert!(active.is_empty(), "every grant is really revoked");
}

async fn a_batch_of_large_approved_calls_completes_on_the_agent_stream_under_the_limit(
    app: TestApp,
) {
    let mut stream = AgentStream::open(&app).await;
    let calls = (0..20)
        .map(|i| call(&format!("c{i}"), "write_file", &big_input(i)))
        .collect();
    stream.submit("r1", batch("s", calls)).await;
    assert_eq!(stream.next_submitted().await.acks.len(), 20);
    for id in ids(20) {
        approve(&app, "s", &id).await;
    }
    for id in ids(20) {
        let outcome = stream.next_outcome().await;
        assert_eq!(outcome.call_id, id);
        assert_eq!(status_of(&outcome), CallStatus::Approved);
    }
    let complete = stream.next_batch_complete().await;
    assert!(complete.encoded_len() <= DEFAULT_REPLY_LIMIT);
    assert!(
        complete.truncated,
        "20 approved inputs of 250 KiB outgrow one message"
    );
    let listed: Vec<String> = complete
        .outcomes
        .iter()
        .map(|o| o.call_id.clone())
        .collect();
    assert!(!listed.is_empty());
    assert_eq!(
        listed,
        ids(20)[..listed.len()],
        "the first outcomes, in order"
    );
}

async fn resuming_and_cancelling_a_session_of_many_calls_on_the_agent_stream_stays_under_the_limit(
    app: TestApp,
) {
    // Call ids of 250 bytes: a thousand of them outgrow a 64 KiB message.
    let long_id = |i: usize| format!("{i:0>250}");
    for start in (0..MANY).step_by(125) {
        let calls = (start..start + 125)
            .map(|i| call(&long_id(i), "write_file", "{}"))
            .collect();
        submit(&app, batch("s", calls)).await;
    }
    let mut stream = AgentStream::open(&app).await;
    let resume = pb::ResumeRequest {
        session_id: "s".into(),
        call_ids: vec![],
    };
    stream
        .send("r1", pb::agent_request::Request::Resume(resume))
        .await;
    let done = match stream.next_with_id().await {
        (id, pb::agent_response::Response::Resumed(done)) if id == "r1" => done,
        other => panic!("expected the resume's answer, got {other:?}"),
    };
    assert!(done.encoded_len() <= SMALL_MESSAGE_LIMIT);
    assert!(done.truncated);
    let listed = done.pending_call_ids.len();
    assert!(listed > 0 && listed < MANY);
    assert_eq!(
        done.pending_call_ids,
        (0..listed).map(long_id).collect::<Vec<_>>()
    );

    let cancel = pb::CancelTarget {
        session_id: "s".into(),
        target: Some(pb::cancel_target::Target::WholeSession(true)),
        reason: String::new(),
    };
    stream
        .send("r2", pb::agent_request::Request::Cancel(cancel))
        .await;
    let mut outcomes = std::collections::HashSet::new();
    let mut answered = false;
    while !answered || outcomes.len() < MANY {
        match stream.next_with_id().await {
            (id, pb::agent_response::Response::Cancelled(result)) if id == "r2" => {
                assert!(result.encoded_len() <= SMALL_MESSAGE_LIMIT);
                assert_eq!(result.cancelled_count, MANY as u64);
                assert!(result.truncated);
                answered = true;
            }
            (_, pb::agent_response::Response::Outcome(o)) => {
                assert_eq!(status_of(&o), CallStatus::Cancelled);
                assert!(outcomes.insert(o.call_id), "each outcome once");
            }
            (_, pb::agent_response::Response::BatchComplete(b)) => {
                assert!(b.encoded_len() <= SMALL_MESSAGE_LIMIT);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_message_limit_too_small_for_one_call_stops_the_broker_naming_the_settings() {
    let dir = tempfile::tempdir().expect("dir");
    // 300 KB cannot hold a call with a 256 KiB input and a 256 KiB edited input.
    let mut broker = broker_binary()
        .env("APPROVALS_METRICS_LISTEN", "off")
        .args(["--listen", "127.0.0.1:0", "--max-message-bytes", "300000"])
        .arg("--database-url")
        .arg(format!("sqlite://{}", dir.path().join("r.db").display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let started = std::time::Instant::now();
    while broker.try_wait().expect("wait").is_none() {
        if started.elapsed() > PATIENCE {
            let _ = broker.kill();
            panic!("the broker started with replies that cannot hold one call");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let output = broker.wait_with_output().expect("output");
    assert!(!output.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    for setting in [
        "--max-message-bytes",
        "--max-reply-bytes",
        "--max-input-bytes",
    ] {
        assert!(said.contains(setting), "{setting}: {said}");
    }
}

/// A small message limit (and inputs small enough that one call fits it).
fn small_messages(config: &mut approval_broker::config::Config) {
    config.requests.max_message_bytes = SMALL_MESSAGE_LIMIT;
    config.requests.max_input_bytes = 1024;
}

backend_tests! {
    listing_forty_pending_calls_of_256_kib_pages_through_all_of_them_under_the_limit,
    a_remembered_decision_that_approves_41_large_calls_answers_ok_and_counts_them_all,
    cancelling_a_session_of_many_pending_calls_answers_ok_with_the_count_of_all => super::small_messages,
    superseding_many_pending_calls_answers_ok_with_the_count_of_all => super::small_messages,
    rules_and_grants_with_large_matchers_page_through_all_of_them_under_the_limit,
    resuming_and_cancelling_a_session_of_many_calls_on_the_agent_stream_stays_under_the_limit => super::small_messages,
    a_batch_of_large_approved_calls_completes_on_the_agent_stream_under_the_limit,
}
