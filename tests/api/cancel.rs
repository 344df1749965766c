//! Cancel turns pending calls into CANCELLED (distinct from a denial); calls already decided keep
//! their outcome, and the reply says so.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

async fn cancel(
    app: &TestApp,
    session: &str,
    target: pb::cancel_target::Target,
) -> Result<pb::CancelResult, tonic::Status> {
    app.agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: session.into(),
                target: Some(target),
                reason: "user pressed stop".into(),
            }),
        })
        .await
        .map(|r| r.into_inner().result.expect("result"))
}

fn ids(outcomes: &[pb::Outcome]) -> Vec<&str> {
    outcomes.iter().map(|o| o.call_id.as_str()).collect()
}

async fn cancelling_named_calls_cancels_the_pending_ones_and_reports_the_decided_ones(
    app: TestApp,
) {
    submit(
        &app,
        pb::BatchSpec {
            on_deny: pb::OnDeny::Independent as i32,
            ..batch(
                "s",
                vec![
                    call("a", "t", "{}"),
                    call("b", "t", "{}"),
                    call("c", "t", "{}"),
                ],
            )
        },
    )
    .await;
    approve(&app, "s", "a").await;
    let result = cancel(
        &app,
        "s",
        pb::cancel_target::Target::Calls(pb::CallIds {
            call_ids: vec!["a".into(), "b".into(), "ghost".into()],
        }),
    )
    .await
    .expect("cancel");
    assert_eq!(ids(&result.cancelled), ["b"]);
    assert_eq!(ids(&result.already_decided), ["a"]);
    assert_eq!(status_of(&result.already_decided[0]), CallStatus::Approved);
    assert_eq!(result.unknown_call_ids, ["ghost"]);
    let cancelled = &result.cancelled[0];
    assert_eq!(status_of(cancelled), CallStatus::Cancelled);
    assert_eq!(cancelled.decided_by, "agent");
    assert_eq!(
        cancelled.tool_result,
        "The request was cancelled before a decision; the tool was not run. Reason: user pressed stop"
    );
    assert!(
        matches!(
            states(&app, "s", &["c"]).await[0].state,
            Some(pb::call_state::State::Pending(_))
        ),
        "a cancel is not a denial: nothing else is skipped"
    );
}

async fn cancelling_a_batch_cancels_its_pending_calls_only(app: TestApp) {
    let first = submit(
        &app,
        batch("s", vec![call("a", "t", "{}"), call("b", "t", "{}")]),
    )
    .await;
    submit(&app, batch("s", vec![call("other", "t", "{}")])).await;
    approve(&app, "s", "a").await;
    let result = cancel(
        &app,
        "s",
        pb::cancel_target::Target::BatchId(first.batch_id.clone()),
    )
    .await
    .expect("cancel");
    assert_eq!(ids(&result.cancelled), ["b"]);
    assert_eq!(ids(&result.already_decided), ["a"]);
    assert!(matches!(
        states(&app, "s", &["other"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
    let unknown = cancel(
        &app,
        "s",
        pb::cancel_target::Target::BatchId("no-such-batch".into()),
    )
    .await;
    assert_status(unknown, Code::NotFound, "no-such-batch");
}

async fn cancelling_a_session_cancels_every_pending_call_of_that_session_only(app: TestApp) {
    submit(&app, batch("s", vec![call("a", "t", "{}")])).await;
    submit(&app, batch("s", vec![call("b", "t", "{}")])).await;
    submit(&app, batch("other", vec![call("a", "t", "{}")])).await;
    let result = cancel(&app, "s", pb::cancel_target::Target::WholeSession(true))
        .await
        .expect("cancel");
    assert_eq!(ids(&result.cancelled), ["a", "b"]);
    assert!(matches!(
        states(&app, "other", &["a"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
    let again = cancel(&app, "s", pb::cancel_target::Target::WholeSession(true))
        .await
        .expect("cancel again");
    assert!(
        again.cancelled.is_empty(),
        "a second cancel changes nothing"
    );
}

async fn a_call_named_twice_is_cancelled_once(app: TestApp) {
    submit(&app, batch("s", vec![call("x", "t", "{}")])).await;
    let result = cancel(
        &app,
        "s",
        pb::cancel_target::Target::Calls(pb::CallIds {
            call_ids: vec!["x".into(), "x".into()],
        }),
    )
    .await
    .expect("cancel");
    assert_eq!(ids(&result.cancelled), ["x"]);
    assert!(result.already_decided.is_empty(), "{result:?}");
}

backend_tests! {
    a_call_named_twice_is_cancelled_once,
    cancelling_named_calls_cancels_the_pending_ones_and_reports_the_decided_ones,
    cancelling_a_batch_cancels_its_pending_calls_only,
    cancelling_a_session_cancels_every_pending_call_of_that_session_only,
}
