//! Replaying a session to an agent that comes back (`Connect`'s `resume`, `WatchOutcomes`): the
//! broker reads the session in pages, so these sessions span several pages, with batches cut by
//! page boundaries. Every outcome arrives exactly once and in order, each complete batch once
//! right after its last call, and a watch naming calls the session does not hold says so rather
//! than waiting forever.

use approval_broker::proto::v1 as pb;
use approval_broker::surface::grpc::replay::PAGE;
use pb::agent_response::Response as Reply;
use pb::watch_outcomes_response::Event as Watched;
use tonic::Streaming;

use crate::helpers::*;

/// Calls per batch: not a divisor of [`PAGE`], so pages end inside batches.
const BATCH: usize = 50;

/// One replayed message, as a label: `outcome <call id> <status>` or `batch <n outcomes>`.
fn outcome_label(o: &pb::Outcome) -> String {
    format!("outcome {} {:?}", o.call_id, status_of(o))
}

fn batch_label(b: &pb::BatchComplete) -> String {
    let ids: Vec<&str> = b.outcomes.iter().map(|o| o.call_id.as_str()).collect();
    format!("batch {}", ids.join(","))
}

/// A session of more than three pages: full batches all cancelled (so complete), then a batch
/// with its first call approved and the rest pending. Returns the labels a replay must send, in
/// order, and the ids of the pending calls.
async fn a_session_of_several_pages(app: &TestApp, session: &str) -> (Vec<String>, Vec<String>) {
    let decided = 4 * PAGE as usize - 6;
    let ids: Vec<String> = (0..decided).map(|n| format!("c{n:04}")).collect();
    for chunk in ids.chunks(BATCH) {
        let calls = chunk.iter().map(|id| call(id, "t", "{}")).collect();
        submit(app, batch(session, calls)).await;
    }
    app.agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: session.into(),
                target: Some(pb::cancel_target::Target::WholeSession(true)),
                reason: "replay test".into(),
            }),
        })
        .await
        .expect("cancel the session");
    let last: Vec<String> = (0..5).map(|n| format!("p{n}")).collect();
    submit(
        app,
        batch(session, last.iter().map(|id| call(id, "t", "{}")).collect()),
    )
    .await;
    approve(app, session, "p0").await;

    let mut expected = Vec::new();
    for chunk in ids.chunks(BATCH) {
        for id in chunk {
            expected.push(format!("outcome {id} Cancelled"));
        }
        expected.push(format!("batch {}", chunk.join(",")));
    }
    expected.push("outcome p0 Approved".into());
    (expected, last[1..].to_vec())
}

async fn a_resume_replays_every_outcome_of_a_session_of_several_pages_once_in_order(app: TestApp) {
    let (expected, pending) = a_session_of_several_pages(&app, "big").await;

    let mut stream = AgentStream::open(&app).await;
    stream
        .send(
            "resume",
            pb::agent_request::Request::Resume(pb::ResumeRequest {
                session_id: "big".into(),
                call_ids: vec![],
            }),
        )
        .await;
    let mut replayed = Vec::new();
    let done = loop {
        match stream.next().await {
            Reply::Outcome(o) => replayed.push(outcome_label(&o)),
            Reply::BatchComplete(b) => replayed.push(batch_label(&b)),
            Reply::Resumed(done) => break done,
            other => panic!("expected the replay, got {other:?}"),
        }
    };
    assert_eq!(replayed.len(), expected.len());
    assert_eq!(replayed, expected);
    assert_eq!(done.pending_call_ids, pending);
    assert!(done.unknown_call_ids.is_empty());

    // The feed takes over: the next outcome comes once, live.
    approve(&app, "big", "p1").await;
    match stream.next().await {
        Reply::Outcome(o) => assert_eq!(outcome_label(&o), "outcome p1 Approved"),
        other => panic!("expected p1's outcome, got {other:?}"),
    }
}

async fn next_watched(stream: &mut Streaming<pb::WatchOutcomesResponse>) -> Option<Watched> {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a message (or the end) in time")
        .expect("stream healthy")
        .map(|m| m.event.expect("an event"))
}

async fn watch_outcomes_replays_every_outcome_of_a_session_of_several_pages_once_in_order(
    app: TestApp,
) {
    let (expected, _) = a_session_of_several_pages(&app, "big").await;

    let mut stream = watch(&app, "big", &[]).await;
    let mut replayed = Vec::new();
    let caught_up = loop {
        match next_watched(&mut stream).await.expect("open") {
            Watched::Outcome(o) => replayed.push(outcome_label(&o)),
            Watched::BatchComplete(b) => replayed.push(batch_label(&b)),
            Watched::CaughtUp(caught_up) => break caught_up,
        }
    };
    assert_eq!(replayed, expected);
    assert!(caught_up.unknown_call_ids.is_empty());

    approve(&app, "big", "p1").await;
    match next_watched(&mut stream).await {
        Some(Watched::Outcome(o)) => assert_eq!(outcome_label(&o), "outcome p1 Approved"),
        other => panic!("expected p1's outcome, got {other:?}"),
    }
}

async fn watch_outcomes_naming_calls_the_session_does_not_hold_says_so_and_waits_a_bounded_time(
    app: TestApp,
) {
    submit(
        &app,
        batch("s", vec![call("a", "t", "{}"), call("b", "t", "{}")]),
    )
    .await;
    approve(&app, "s", "a").await;

    // Only unknown ids, never submitted: the marker names them, and the watch ends once the
    // grace for submitting them is over, not before.
    let opened = std::time::Instant::now();
    let mut stream = watch(&app, "s", &["ghost", "phantom"]).await;
    match next_watched(&mut stream).await {
        Some(Watched::CaughtUp(caught_up)) => {
            assert_eq!(caught_up.unknown_call_ids, ["ghost", "phantom"])
        }
        other => panic!("expected caught-up naming the unknown ids, got {other:?}"),
    }
    assert!(
        next_watched(&mut stream).await.is_none(),
        "nothing more to wait for"
    );
    assert!(
        opened.elapsed() >= approval_broker::surface::grpc::agent::UNSUBMITTED_GRACE,
        "it waited for them to be submitted"
    );

    // A decided call, a pending one and an unknown one: the watch ends once `b` is decided and
    // the grace for `ghost` is over.
    let mut stream = watch(&app, "s", &["a", "b", "ghost"]).await;
    match next_watched(&mut stream).await {
        Some(Watched::Outcome(o)) => assert_eq!(o.call_id, "a"),
        other => panic!("expected a's outcome, got {other:?}"),
    }
    match next_watched(&mut stream).await {
        Some(Watched::CaughtUp(caught_up)) => assert_eq!(caught_up.unknown_call_ids, ["ghost"]),
        other => panic!("expected caught-up naming ghost, got {other:?}"),
    }
    approve(&app, "s", "b").await;
    match next_watched(&mut stream).await {
        Some(Watched::Outcome(o)) => assert_eq!(o.call_id, "b"),
        other => panic!("expected b's outcome, got {other:?}"),
    }
    assert!(matches!(
        next_watched(&mut stream).await,
        Some(Watched::BatchComplete(_))
    ));
    assert!(
        next_watched(&mut stream).await.is_none(),
        "every named call the session holds is decided"
    );
}

/// The natural order for an agent: open the watch, then submit. The calls named before they
/// existed are waited for, their outcomes delivered (decided at submit by a rule, or later by a
/// person), and the watch ends once each is decided.
async fn a_watch_opened_before_its_calls_are_submitted_gets_their_outcomes(app: TestApp) {
    create_rule(&app, rule("reads", "read", pb::Effect::Allow, 0, None)).await;
    let mut stream = watch(&app, "later", &["x", "y"]).await;
    match next_watched(&mut stream).await {
        Some(Watched::CaughtUp(caught_up)) => assert_eq!(caught_up.unknown_call_ids, ["x", "y"]),
        other => panic!("expected caught-up naming x and y, got {other:?}"),
    }
    submit(
        &app,
        batch(
            "later",
            vec![call("x", "read", "{}"), call("y", "shell", "{}")],
        ),
    )
    .await;
    match next_watched(&mut stream).await {
        Some(Watched::Outcome(o)) => {
            assert_eq!(
                (o.call_id.as_str(), o.decided_by.as_str()),
                ("x", "policy:reads")
            )
        }
        other => panic!("expected x's outcome, got {other:?}"),
    }
    // Decided after the grace for unsubmitted calls is over: y was submitted, so it is waited for.
    tokio::time::sleep(approval_broker::surface::grpc::agent::UNSUBMITTED_GRACE).await;
    approve(&app, "later", "y").await;
    match next_watched(&mut stream).await {
        Some(Watched::Outcome(o)) => assert_eq!(o.call_id, "y"),
        other => panic!("expected y's outcome, got {other:?}"),
    }
    assert!(matches!(
        next_watched(&mut stream).await,
        Some(Watched::BatchComplete(_))
    ));
    assert!(
        next_watched(&mut stream).await.is_none(),
        "both named calls are decided"
    );
}

backend_tests! {
    a_resume_replays_every_outcome_of_a_session_of_several_pages_once_in_order,
    watch_outcomes_replays_every_outcome_of_a_session_of_several_pages_once_in_order,
    watch_outcomes_naming_calls_the_session_does_not_hold_says_so_and_waits_a_bounded_time,
    a_watch_opened_before_its_calls_are_submitted_gets_their_outcomes,
}
