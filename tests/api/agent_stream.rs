//! The agent's streams: `AgentService.Connect` (acknowledgements after commit, one outcome per
//! call as it is decided, batch-complete in the batch's order, per-item errors that never end
//! the stream, resume after a reconnect, idempotent resubmits, cancels) and `WatchOutcomes`
//! (decided outcomes, then `caught_up`, then live outcomes).

use std::collections::HashMap;

use approval_broker::proto::v1 as pb;
use pb::agent_response::Response as Reply;
use pb::watch_outcomes_response::Event as Watched;
use tonic::Streaming;

use crate::helpers::*;

const APPROVER: &str = "approver:alice@example.com";

/// `batch` with each call decided on its own (a denial skips nothing).
fn independent(mut batch: pb::BatchSpec) -> pb::BatchSpec {
    batch.on_deny = pb::OnDeny::Independent as i32;
    batch
}

/// Decides through `ApproverService.Decide` with a reason.
async fn decide(
    app: &TestApp,
    session: &str,
    call_id: &str,
    decision: pb::Decision,
    reason: &str,
) -> pb::DecideResponse {
    app.approver()
        .decide(decide_request(session, call_id, decision, reason))
        .await
        .expect("decide")
        .into_inner()
}

fn accepted(ack: &pb::CallAck) -> &pb::Accepted {
    match &ack.result {
        Some(pb::call_ack::Result::Accepted(a)) => a,
        other => panic!("expected {} to be accepted, got {other:?}", ack.call_id),
    }
}

fn duplicate(ack: &pb::CallAck) -> &pb::Accepted {
    match &ack.result {
        Some(pb::call_ack::Result::Duplicate(a)) => a,
        other => panic!("expected {} to be a duplicate, got {other:?}", ack.call_id),
    }
}

fn ack_error(ack: &pb::CallAck) -> &pb::ItemError {
    match &ack.result {
        Some(pb::call_ack::Result::Error(e)) => e,
        other => panic!("expected an error for {}, got {other:?}", ack.call_id),
    }
}

fn call_ids(outcomes: &[pb::Outcome]) -> Vec<&str> {
    outcomes.iter().map(|o| o.call_id.as_str()).collect()
}

fn statuses(outcomes: &[pb::Outcome]) -> Vec<CallStatus> {
    outcomes.iter().map(status_of).collect()
}

/// The next response, which must answer `request_id`.
async fn next_answer(stream: &mut AgentStream, request_id: &str) -> Reply {
    let (id, reply) = stream.next_with_id().await;
    assert_eq!(id, request_id, "a response to another request: {reply:?}");
    reply
}

/// The next response, which must be a pushed outcome (no request id).
async fn next_pushed_outcome(stream: &mut AgentStream) -> pb::Outcome {
    match stream.next_with_id().await {
        (id, Reply::Outcome(outcome)) => {
            assert_eq!(id, "", "pushed outcomes carry no request id");
            outcome
        }
        (_, other) => panic!("expected an outcome, got {other:?}"),
    }
}

/// The next `WatchOutcomes` message, or `None` when the stream ended.
async fn next_watched(stream: &mut Streaming<pb::WatchOutcomesResponse>) -> Option<Watched> {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a watched outcome in time")
        .expect("watch healthy")
        .map(|message| message.event.expect("an event"))
}

async fn next_watched_outcome(stream: &mut Streaming<pb::WatchOutcomesResponse>) -> pb::Outcome {
    match next_watched(stream).await {
        Some(Watched::Outcome(outcome)) => outcome,
        other => panic!("expected an outcome, got {other:?}"),
    }
}

async fn next_watched_batch_complete(
    stream: &mut Streaming<pb::WatchOutcomesResponse>,
) -> pb::BatchComplete {
    match next_watched(stream).await {
        Some(Watched::BatchComplete(complete)) => complete,
        other => panic!("expected batch-complete, got {other:?}"),
    }
}

async fn a_submitted_batch_is_acknowledged_then_each_outcome_arrives_then_batch_complete_in_batch_order(
    app: TestApp,
) {
    let mut stream = AgentStream::open(&app).await;
    stream
        .submit(
            "turn-1",
            batch(
                "s1",
                vec![
                    call("c1", "read_file", r#"{"path": "a.rs"}"#),
                    call("c2", "write_file", r#"{"path":"b.rs","text":"x"}"#),
                    call("c3", "run", r#"{"cmd":"ls"}"#),
                ],
            ),
        )
        .await;

    let submitted = match next_answer(&mut stream, "turn-1").await {
        Reply::Submitted(s) => s,
        other => panic!("expected acknowledgements, got {other:?}"),
    };
    assert_eq!(submitted.session_id, "s1");
    assert!(!submitted.batch_id.is_empty());
    assert_eq!(submitted.acks.len(), 3);
    for (i, (ack, id)) in submitted.acks.iter().zip(["c1", "c2", "c3"]).enumerate() {
        assert_eq!(ack.call_id, id);
        assert_eq!(ack.index, i as u32);
        let accepted = accepted(ack);
        assert_eq!(accepted.batch_id, submitted.batch_id);
        assert_eq!(accepted.position, i as u32);
        assert_eq!(accepted.status, CallStatus::Pending as i32);
    }
    assert!(submitted.outcomes.is_empty());
    // Acknowledged means committed: another client already sees the calls.
    for state in states(&app, "s1", &["c1", "c2", "c3"]).await {
        assert!(
            matches!(state.state, Some(pb::call_state::State::Pending(_))),
            "{state:?}"
        );
    }

    // Decided out of order, from another client: each outcome arrives as it is decided.
    approve(&app, "s1", "c3").await;
    let c3 = next_pushed_outcome(&mut stream).await;
    assert_eq!(c3.call_id, "c3");
    assert_eq!(c3.session_id, "s1");
    assert_eq!(status_of(&c3), CallStatus::Approved);
    assert_eq!(c3.decided_by, APPROVER);
    assert_eq!(c3.input_json, r#"{"cmd":"ls"}"#);
    assert_eq!(c3.batch_id, submitted.batch_id);
    assert_eq!(c3.position, 2);

    approve(&app, "s1", "c1").await;
    let c1 = next_pushed_outcome(&mut stream).await;
    assert_eq!(c1.call_id, "c1");
    assert_eq!(status_of(&c1), CallStatus::Approved);
    assert_eq!(c1.input_json, r#"{"path":"a.rs"}"#, "canonical JSON");

    deny(&app, "s1", "c2", "not that file").await;
    let c2 = next_pushed_outcome(&mut stream).await;
    assert_eq!(c2.call_id, "c2");
    assert_eq!(status_of(&c2), CallStatus::Denied);
    assert_eq!(c2.reason, "not that file");
    assert!(
        c2.tool_result.contains("not that file"),
        "{}",
        c2.tool_result
    );
    assert!(c2.input_json.is_empty());

    let (id, reply) = stream.next_with_id().await;
    assert_eq!(id, "");
    let complete = match reply {
        Reply::BatchComplete(complete) => complete,
        other => panic!("expected batch-complete, got {other:?}"),
    };
    assert_eq!(complete.session_id, "s1");
    assert_eq!(complete.batch_id, submitted.batch_id);
    assert_eq!(call_ids(&complete.outcomes), ["c1", "c2", "c3"]);
    assert_eq!(
        statuses(&complete.outcomes),
        [
            CallStatus::Approved,
            CallStatus::Denied,
            CallStatus::Approved
        ]
    );
    assert_eq!(complete.outcomes, vec![c1, c2, c3]);
}

async fn per_call_and_per_request_problems_are_reported_for_that_item_and_the_stream_goes_on(
    app: TestApp,
) {
    let mut stream = AgentStream::open(&app).await;

    // A request without a oneof.
    stream
        .send_raw(pb::AgentRequest {
            request_id: "nothing".into(),
            request: None,
        })
        .await;
    match next_answer(&mut stream, "nothing").await {
        Reply::Error(err) => assert_eq!(err.code, tonic::Code::InvalidArgument as i32, "{err:?}"),
        other => panic!("expected an error, got {other:?}"),
    }

    // One bad call in a batch: refused alone, the others are accepted.
    stream
        .submit(
            "mixed",
            batch(
                "s1",
                vec![
                    call("a", "read", r#"{"x":1}"#),
                    call("b", "read", "[1]"),
                    call("c", "read", "{}"),
                ],
            ),
        )
        .await;
    let mixed = match next_answer(&mut stream, "mixed").await {
        Reply::Submitted(s) => s,
        other => panic!("expected acknowledgements, got {other:?}"),
    };
    assert_eq!(mixed.acks.len(), 3);
    assert_eq!(mixed.acks[0].call_id, "a");
    accepted(&mixed.acks[0]);
    assert_eq!(mixed.acks[1].call_id, "b");
    assert_eq!(mixed.acks[1].index, 1);
    let bad = ack_error(&mixed.acks[1]);
    assert_eq!(bad.code, tonic::Code::InvalidArgument as i32);
    assert!(
        bad.message.contains("submit.calls[1].input_json"),
        "{}",
        bad.message
    );
    assert_eq!(mixed.acks[2].call_id, "c");
    accepted(&mixed.acks[2]);

    // A reused call id with a different input: ALREADY_EXISTS for that call alone.
    stream
        .submit(
            "reuse",
            batch(
                "s1",
                vec![call("a", "read", r#"{"x":2}"#), call("d", "read", "{}")],
            ),
        )
        .await;
    let reuse = match next_answer(&mut stream, "reuse").await {
        Reply::Submitted(s) => s,
        other => panic!("expected acknowledgements, got {other:?}"),
    };
    assert_eq!(reuse.acks.len(), 2);
    assert_eq!(reuse.acks[0].call_id, "a");
    assert_eq!(
        ack_error(&reuse.acks[0]).code,
        tonic::Code::AlreadyExists as i32
    );
    assert_eq!(reuse.acks[1].call_id, "d");
    accepted(&reuse.acks[1]);

    // A batch-level problem: the request is refused as a whole.
    stream.submit("empty", batch("s1", vec![])).await;
    match next_answer(&mut stream, "empty").await {
        Reply::Error(err) => {
            assert_eq!(err.code, tonic::Code::InvalidArgument as i32, "{err:?}");
            assert!(err.message.contains("submit.calls"), "{}", err.message);
        }
        other => panic!("expected an error, got {other:?}"),
    }

    // The stream still works.
    stream
        .submit("fine", batch("s1", vec![call("e", "read", "{}")]))
        .await;
    let fine = match next_answer(&mut stream, "fine").await {
        Reply::Submitted(s) => s,
        other => panic!("expected acknowledgements, got {other:?}"),
    };
    accepted(&fine.acks[0]);
    approve(&app, "s1", "e").await;
    let e = next_pushed_outcome(&mut stream).await;
    assert_eq!(e.call_id, "e");
    assert_eq!(status_of(&e), CallStatus::Approved);
    let complete = stream.next_batch_complete().await;
    assert_eq!(complete.batch_id, fine.batch_id);
    assert_eq!(call_ids(&complete.outcomes), ["e"]);
}

async fn a_reconnecting_agent_gets_every_outcome_decided_while_it_was_away_then_live_ones(
    app: TestApp,
) {
    let mut first = AgentStream::open(&app).await;
    first
        .submit(
            "turn-1",
            batch(
                "s1",
                vec![
                    call("c1", "read", r#"{"n":1}"#),
                    call("c2", "read", r#"{"n":2}"#),
                    call("c3", "read", r#"{"n":3}"#),
                ],
            ),
        )
        .await;
    let submitted = first.next_submitted().await;
    drop(first);

    // Decided while the agent is away. The denial comes last, when no sibling is pending, so
    // the default SKIP_REST skips nothing and every call keeps its approver's decision.
    decide(&app, "s1", "c1", pb::Decision::Approve, "looks fine").await;
    decide(&app, "s1", "c3", pb::Decision::Approve, "ok").await;
    let denial = decide(&app, "s1", "c2", pb::Decision::Deny, "too risky").await;
    assert!(denial.skipped.is_empty());

    let mut second = AgentStream::open(&app).await;
    second
        .send(
            "resume-1",
            pb::agent_request::Request::Resume(pb::ResumeRequest {
                session_id: "s1".into(),
                call_ids: vec![],
            }),
        )
        .await;
    let mut outcomes: HashMap<String, pb::Outcome> = HashMap::new();
    let complete = loop {
        match second.next_with_id().await {
            (_, Reply::Outcome(outcome)) => {
                let id = outcome.call_id.clone();
                assert!(outcomes.insert(id, outcome).is_none(), "an outcome twice");
            }
            (_, Reply::BatchComplete(complete)) => break complete,
            (_, other) => panic!("expected outcomes then batch-complete, got {other:?}"),
        }
    };
    assert_eq!(outcomes.len(), 3, "{outcomes:?}");
    let (c1, c2, c3) = (&outcomes["c1"], &outcomes["c2"], &outcomes["c3"]);
    assert_eq!(status_of(c1), CallStatus::Approved);
    assert_eq!(c1.reason, "looks fine");
    assert_eq!(c1.input_json, r#"{"n":1}"#);
    assert_eq!(status_of(c2), CallStatus::Denied);
    assert_eq!(c2.reason, "too risky");
    assert!(c2.tool_result.contains("too risky"), "{}", c2.tool_result);
    assert_eq!(c2.decided_by, APPROVER);
    assert_eq!(status_of(c3), CallStatus::Approved);
    assert_eq!(c3.reason, "ok");

    assert_eq!(complete.batch_id, submitted.batch_id);
    assert_eq!(call_ids(&complete.outcomes), ["c1", "c2", "c3"]);
    assert_eq!(complete.outcomes, vec![c1.clone(), c2.clone(), c3.clone()]);

    let done = match next_answer(&mut second, "resume-1").await {
        Reply::Resumed(done) => done,
        other => panic!("expected resume-done, got {other:?}"),
    };
    assert_eq!(done.session_id, "s1");
    assert!(done.pending_call_ids.is_empty(), "{done:?}");
    assert!(done.unknown_call_ids.is_empty(), "{done:?}");

    // The resumed stream follows the session: a call submitted elsewhere and decided arrives live.
    let later = submit(&app, batch("s1", vec![call("c4", "read", r#"{"n":4}"#)])).await;
    approve(&app, "s1", "c4").await;
    let c4 = next_pushed_outcome(&mut second).await;
    assert_eq!(c4.call_id, "c4");
    assert_eq!(status_of(&c4), CallStatus::Approved);
    let complete = second.next_batch_complete().await;
    assert_eq!(complete.batch_id, later.batch_id);
    assert_eq!(call_ids(&complete.outcomes), ["c4"]);

    // Exactly once: the next message is the next decision's, not a repeat of an earlier one.
    submit(&app, batch("s1", vec![call("c5", "read", r#"{"n":5}"#)])).await;
    deny(&app, "s1", "c5", "no").await;
    let c5 = next_pushed_outcome(&mut second).await;
    assert_eq!(c5.call_id, "c5");
    assert_eq!(status_of(&c5), CallStatus::Denied);
}

async fn resume_with_named_call_ids_returns_only_those_and_names_the_pending_and_unknown_ones(
    app: TestApp,
) {
    let submitted = submit(
        &app,
        independent(batch(
            "s1",
            vec![
                call("a", "read", r#"{"n":1}"#),
                call("b", "read", r#"{"n":2}"#),
                call("c", "read", r#"{"n":3}"#),
            ],
        )),
    )
    .await;
    approve(&app, "s1", "a").await;
    deny(&app, "s1", "b", "no").await;

    let mut stream = AgentStream::open(&app).await;
    stream
        .send(
            "resume-named",
            pb::agent_request::Request::Resume(pb::ResumeRequest {
                session_id: "s1".into(),
                call_ids: vec!["a".into(), "c".into(), "nope".into()],
            }),
        )
        .await;
    // Only `a`: `b` was not named, `c` is pending, and the batch is not complete.
    let a = next_pushed_outcome(&mut stream).await;
    assert_eq!(a.call_id, "a");
    assert_eq!(status_of(&a), CallStatus::Approved);
    let done = match next_answer(&mut stream, "resume-named").await {
        Reply::Resumed(done) => done,
        other => panic!("expected resume-done, got {other:?}"),
    };
    assert_eq!(done.session_id, "s1");
    assert_eq!(done.pending_call_ids, ["c"]);
    assert_eq!(done.unknown_call_ids, ["nope"]);

    // The pending one follows on this stream when it is decided.
    approve(&app, "s1", "c").await;
    let c = next_pushed_outcome(&mut stream).await;
    assert_eq!(c.call_id, "c");
    let complete = stream.next_batch_complete().await;
    assert_eq!(complete.batch_id, submitted.batch_id);
    assert_eq!(call_ids(&complete.outcomes), ["a", "b", "c"]);
}

async fn resubmitting_a_decided_batch_on_a_new_stream_gets_duplicates_then_the_stored_outcomes_at_once(
    app: TestApp,
) {
    let calls = || {
        vec![
            call("a", "read", r#"{"n":1}"#),
            call("b", "write", r#"{"n":2}"#),
        ]
    };
    let original = submit(&app, batch("s1", calls())).await;
    approve(&app, "s1", "a").await;
    deny(&app, "s1", "b", "no writes").await;
    let stored_a = outcome_of(&app, "s1", "a").await;
    let stored_b = outcome_of(&app, "s1", "b").await;

    // The agent retries the same turn on a new stream (it never saw the acknowledgements).
    let mut stream = AgentStream::open(&app).await;
    stream.submit("retry", batch("s1", calls())).await;
    let retry = match next_answer(&mut stream, "retry").await {
        Reply::Submitted(s) => s,
        other => panic!("expected acknowledgements, got {other:?}"),
    };
    assert_eq!(retry.acks.len(), 2);
    for (i, (ack, status)) in retry
        .acks
        .iter()
        .zip([CallStatus::Approved, CallStatus::Denied])
        .enumerate()
    {
        let dup = duplicate(ack);
        assert_eq!(dup.batch_id, original.batch_id);
        assert_eq!(dup.position, i as u32);
        assert_eq!(dup.status, status as i32);
    }
    assert_eq!(call_ids(&retry.outcomes), ["a", "b"]);

    // Then the stored outcomes and the batch's completion, as if delivered live.
    let a = next_pushed_outcome(&mut stream).await;
    let b = next_pushed_outcome(&mut stream).await;
    assert_eq!(a, stored_a);
    assert_eq!(b, stored_b);
    let complete = stream.next_batch_complete().await;
    assert_eq!(complete.batch_id, original.batch_id);
    assert_eq!(complete.outcomes, vec![stored_a, stored_b]);

    // Exactly once: the next message on the stream is a new call's, not a repeat.
    stream
        .submit("next", batch("s1", vec![call("c", "read", "{}")]))
        .await;
    let next = match next_answer(&mut stream, "next").await {
        Reply::Submitted(s) => s,
        other => panic!("expected acknowledgements, got {other:?}"),
    };
    accepted(&next.acks[0]);
    approve(&app, "s1", "c").await;
    let c = next_pushed_outcome(&mut stream).await;
    assert_eq!(c.call_id, "c");
}

async fn a_cancel_on_the_stream_reports_the_cancelled_calls_and_delivers_cancelled_outcomes(
    app: TestApp,
) {
    let mut stream = AgentStream::open(&app).await;
    stream
        .submit(
            "turn-1",
            batch(
                "s1",
                vec![
                    call("a", "read", "{}"),
                    call("b", "read", r#"{"n":2}"#),
                    call("c", "read", r#"{"n":3}"#),
                ],
            ),
        )
        .await;
    let submitted = stream.next_submitted().await;
    approve(&app, "s1", "a").await;
    let a = next_pushed_outcome(&mut stream).await;
    assert_eq!(a.call_id, "a");

    stream
        .send(
            "stop",
            pb::agent_request::Request::Cancel(pb::CancelTarget {
                session_id: "s1".into(),
                target: Some(pb::cancel_target::Target::Calls(pb::CallIds {
                    call_ids: vec!["b".into(), "c".into(), "a".into(), "nope".into()],
                })),
                reason: "the user stopped the turn".into(),
            }),
        )
        .await;

    // The cancel's result and the pushed outcomes may interleave; the batch completes last.
    let mut result = None;
    let mut pushed = Vec::new();
    let complete = loop {
        match stream.next_with_id().await {
            (id, Reply::Cancelled(r)) => {
                assert_eq!(id, "stop");
                assert!(result.replace(r).is_none(), "two cancel results");
            }
            (id, Reply::Outcome(o)) => {
                assert_eq!(id, "");
                pushed.push(o);
            }
            (_, Reply::BatchComplete(complete)) => break complete,
            (_, other) => panic!("unexpected {other:?}"),
        }
    };
    let result = match result {
        Some(result) => result,
        None => match next_answer(&mut stream, "stop").await {
            Reply::Cancelled(r) => r,
            other => panic!("expected the cancel result, got {other:?}"),
        },
    };
    assert_eq!(call_ids(&result.cancelled), ["b", "c"]);
    assert_eq!(call_ids(&result.already_decided), ["a"]);
    assert_eq!(result.already_decided[0], a);
    assert_eq!(result.unknown_call_ids, ["nope"]);

    pushed.sort_by(|x, y| x.call_id.cmp(&y.call_id));
    assert_eq!(call_ids(&pushed), ["b", "c"], "each cancelled call once");
    for outcome in &pushed {
        assert_eq!(status_of(outcome), CallStatus::Cancelled);
        assert_eq!(outcome.decided_by, "agent");
        assert_eq!(outcome.reason, "the user stopped the turn");
        assert!(!outcome.tool_result.is_empty());
        assert!(outcome.input_json.is_empty());
    }
    assert_eq!(result.cancelled, pushed);

    assert_eq!(complete.batch_id, submitted.batch_id);
    assert_eq!(call_ids(&complete.outcomes), ["a", "b", "c"]);
    assert_eq!(
        statuses(&complete.outcomes),
        [
            CallStatus::Approved,
            CallStatus::Cancelled,
            CallStatus::Cancelled
        ]
    );
}

async fn watch_outcomes_sends_the_decided_outcomes_then_caught_up_then_live_outcomes(app: TestApp) {
    let first = submit(
        &app,
        independent(batch(
            "s1",
            vec![call("a", "read", r#"{"n":1}"#), call("b", "read", "{}")],
        )),
    )
    .await;
    approve(&app, "s1", "a").await;

    let mut watch = watch(&app, "s1", &[]).await;
    let a = next_watched_outcome(&mut watch).await;
    assert_eq!(a.call_id, "a");
    assert_eq!(status_of(&a), CallStatus::Approved);
    assert!(matches!(
        next_watched(&mut watch).await,
        Some(Watched::CaughtUp(_))
    ));

    deny(&app, "s1", "b", "no").await;
    let b = next_watched_outcome(&mut watch).await;
    assert_eq!(b.call_id, "b");
    assert_eq!(status_of(&b), CallStatus::Denied);
    let complete = next_watched_batch_complete(&mut watch).await;
    assert_eq!(complete.batch_id, first.batch_id);
    assert_eq!(complete.outcomes, vec![a, b]);

    // The stream stays open for calls submitted later in the session.
    let second = submit(&app, batch("s1", vec![call("c", "read", "{}")])).await;
    approve(&app, "s1", "c").await;
    let c = next_watched_outcome(&mut watch).await;
    assert_eq!(c.call_id, "c");
    let complete = next_watched_batch_complete(&mut watch).await;
    assert_eq!(complete.batch_id, second.batch_id);
}

async fn watch_outcomes_with_named_call_ids_ends_once_every_named_call_is_decided(app: TestApp) {
    let submitted = submit(
        &app,
        independent(batch(
            "s1",
            vec![
                call("a", "read", r#"{"n":1}"#),
                call("b", "read", r#"{"n":2}"#),
                call("c", "read", r#"{"n":3}"#),
            ],
        )),
    )
    .await;
    approve(&app, "s1", "a").await;

    let mut watch = watch(&app, "s1", &["a", "b"]).await;
    let a = next_watched_outcome(&mut watch).await;
    assert_eq!(a.call_id, "a");
    assert!(matches!(
        next_watched(&mut watch).await,
        Some(Watched::CaughtUp(_))
    ));

    // `c` was not named: its outcome is not sent. `b` is, and it is the last named one.
    approve(&app, "s1", "c").await;
    deny(&app, "s1", "b", "no").await;
    let b = next_watched_outcome(&mut watch).await;
    assert_eq!(b.call_id, "b");
    assert_eq!(status_of(&b), CallStatus::Denied);
    // Its decision completed the batch.
    let complete = next_watched_batch_complete(&mut watch).await;
    assert_eq!(complete.batch_id, submitted.batch_id);
    assert_eq!(call_ids(&complete.outcomes), ["a", "b", "c"]);
    assert!(
        next_watched(&mut watch).await.is_none(),
        "the watch ends once every named call is decided"
    );
}

async fn watch_outcomes_with_named_calls_all_decided_ends_after_caught_up(app: TestApp) {
    submit(&app, batch("s1", vec![call("a", "read", "{}")])).await;
    approve(&app, "s1", "a").await;

    let mut watch = watch(&app, "s1", &["a"]).await;
    assert_eq!(next_watched_outcome(&mut watch).await.call_id, "a");
    assert!(matches!(
        next_watched(&mut watch).await,
        Some(Watched::BatchComplete(_))
    ));
    assert!(matches!(
        next_watched(&mut watch).await,
        Some(Watched::CaughtUp(_))
    ));
    assert!(next_watched(&mut watch).await.is_none());
}

async fn outcomes_of_a_session_the_stream_does_not_follow_are_not_delivered_to_it(app: TestApp) {
    let mut stream = AgentStream::open(&app).await;
    stream
        .submit("a", batch("session-a", vec![call("a1", "read", "{}")]))
        .await;
    stream.next_submitted().await;
    submit(&app, batch("session-b", vec![call("b1", "read", "{}")])).await;

    approve(&app, "session-b", "b1").await;
    approve(&app, "session-a", "a1").await;
    let outcome = next_pushed_outcome(&mut stream).await;
    assert_eq!(outcome.session_id, "session-a");
    assert_eq!(outcome.call_id, "a1");
    let complete = stream.next_batch_complete().await;
    assert_eq!(complete.session_id, "session-a");
}

/// Streams of one agent (with auth off every client is the same agent) each get the outcomes
/// of the sessions they follow, and only those: a stream following two sessions gets both, in
/// the order they were decided; one session's stream gets nothing of the other's. A one-call
/// batch completes with exactly the outcome pushed before it, on `Connect` and `WatchOutcomes`.
async fn streams_of_one_agent_each_get_the_outcomes_of_their_own_sessions_only(app: TestApp) {
    let mut both = AgentStream::open(&app).await;
    let mut other = AgentStream::open(&app).await;
    for session in ["s1", "s2"] {
        let call_id = format!("{session}-c");
        both.submit(session, batch(session, vec![call(&call_id, "read", "{}")]))
            .await;
        both.next_submitted().await;
    }
    other
        .submit("s3", batch("s3", vec![call("s3-c", "read", "{}")]))
        .await;
    other.next_submitted().await;
    let mut watch_s1 = watch(&app, "s1", &[]).await;
    assert!(matches!(
        next_watched(&mut watch_s1).await,
        Some(Watched::CaughtUp(_))
    ));

    for (session, call_id) in [("s3", "s3-c"), ("s2", "s2-c"), ("s1", "s1-c")] {
        approve(&app, session, call_id).await;
    }
    for expected in ["s2-c", "s1-c"] {
        let outcome = next_pushed_outcome(&mut both).await;
        assert_eq!(
            outcome.call_id, expected,
            "s3's outcome never reaches this stream"
        );
        let complete = both.next_batch_complete().await;
        assert_eq!(complete.outcomes, vec![outcome]);
    }
    let outcome = next_pushed_outcome(&mut other).await;
    assert_eq!(outcome.call_id, "s3-c");
    assert_eq!(other.next_batch_complete().await.outcomes, vec![outcome]);

    let watched = next_watched_outcome(&mut watch_s1).await;
    assert_eq!(
        watched.call_id, "s1-c",
        "the watch of s1 gets s1's outcome only"
    );
    let complete = next_watched_batch_complete(&mut watch_s1).await;
    assert_eq!(complete.outcomes, vec![watched]);

    // Nothing else was queued for either stream: the next messages are these new outcomes.
    submit(&app, batch("s1", vec![call("s1-d", "read", "{}")])).await;
    submit(&app, batch("s3", vec![call("s3-d", "read", "{}")])).await;
    approve(&app, "s1", "s1-d").await;
    approve(&app, "s3", "s3-d").await;
    assert_eq!(next_pushed_outcome(&mut both).await.call_id, "s1-d");
    assert_eq!(next_pushed_outcome(&mut other).await.call_id, "s3-d");
}

/// Every answer echoes the request id, so a huge one could make the answer outgrow the reply
/// limit: it is refused, naming the field, and the stream goes on.
async fn a_request_id_too_long_to_echo_is_refused_and_the_stream_goes_on(app: TestApp) {
    let mut stream = AgentStream::open(&app).await;
    let long_id = "r".repeat(5 * 1024 * 1024);
    stream
        .send_raw(pb::AgentRequest {
            request_id: long_id.clone(),
            request: Some(pb::agent_request::Request::Submit(batch(
                "s",
                vec![call("c1", "t", "{}")],
            ))),
        })
        .await;
    match next_answer(&mut stream, &long_id[..256]).await {
        Reply::Error(err) => {
            assert_eq!(err.code, tonic::Code::InvalidArgument as i32, "{err:?}");
            assert!(err.message.contains("request_id"), "{err:?}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert!(all_calls(&app).await.is_empty(), "nothing was stored");
    stream
        .submit("ok", batch("s", vec![call("c1", "t", "{}")]))
        .await;
    let submitted = stream.next_submitted().await;
    assert!(matches!(
        submitted.acks[0].result,
        Some(pb::call_ack::Result::Accepted(_))
    ));
}

backend_tests! {
    a_request_id_too_long_to_echo_is_refused_and_the_stream_goes_on,
    resubmitting_a_decided_batch_on_a_new_stream_gets_duplicates_then_the_stored_outcomes_at_once,
    a_submitted_batch_is_acknowledged_then_each_outcome_arrives_then_batch_complete_in_batch_order,
    per_call_and_per_request_problems_are_reported_for_that_item_and_the_stream_goes_on,
    a_reconnecting_agent_gets_every_outcome_decided_while_it_was_away_then_live_ones,
    resume_with_named_call_ids_returns_only_those_and_names_the_pending_and_unknown_ones,
    a_cancel_on_the_stream_reports_the_cancelled_calls_and_delivers_cancelled_outcomes,
    watch_outcomes_sends_the_decided_outcomes_then_caught_up_then_live_outcomes,
    watch_outcomes_with_named_call_ids_ends_once_every_named_call_is_decided,
    watch_outcomes_with_named_calls_all_decided_ends_after_caught_up,
    outcomes_of_a_session_the_stream_does_not_follow_are_not_delivered_to_it,
    streams_of_one_agent_each_get_the_outcomes_of_their_own_sessions_only,
}
