//! Exactly one outcome per call, first decision wins; every outcome records who decided, when,
//! the reason, and a tool-result text (or, for APPROVED, the input to run).

use std::collections::HashSet;

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

async fn the_first_decision_wins_and_repeating_it_returns_the_stored_outcome(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    let first = approve(&app, "s", "c1").await;
    assert!(!first.replayed);
    let repeat = approve(&app, "s", "c1").await;
    assert!(repeat.replayed);
    assert_eq!(
        repeat.outcome, first.outcome,
        "the stored outcome, unchanged"
    );
}

async fn a_conflicting_decision_is_refused_naming_the_outcome_that_stands(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    approve(&app, "s", "c1").await;
    let result = app
        .approver()
        .decide(decide_request(
            "s",
            "c1",
            pb::Decision::Deny,
            "changed my mind",
        ))
        .await;
    assert_status(result, Code::FailedPrecondition, "APPROVED");
    assert_eq!(
        status_of(&outcome_of(&app, "s", "c1").await),
        CallStatus::Approved
    );
}

async fn deciding_an_unknown_call_is_not_found(app: TestApp) {
    let result = app
        .approver()
        .decide(decide_request("s", "nope", pb::Decision::Approve, ""))
        .await;
    assert_status(result, Code::NotFound, "nope");
}

async fn concurrent_decisions_have_exactly_one_winner(app: TestApp) {
    let calls: Vec<_> = (0..20).map(|i| call(&format!("c{i}"), "t", "{}")).collect();
    let spec = pb::BatchSpec {
        on_deny: pb::OnDeny::Independent as i32,
        ..batch("s", calls)
    };
    submit(&app, spec).await;
    for i in 0..20 {
        let call_id = format!("c{i}");
        let mut racers = Vec::new();
        for r in 0..6 {
            let mut approver = app.approver();
            let decision = if r % 2 == 0 {
                pb::Decision::Approve
            } else {
                pb::Decision::Deny
            };
            let mut request = decide_request("s", &call_id, decision, "race");
            request.approver = format!("ui-{r}");
            racers.push(tokio::spawn(async move { approver.decide(request).await }));
        }
        let mut winners = 0;
        let mut winner_status = None;
        let mut results = Vec::new();
        for racer in racers {
            results.push(racer.await.expect("join"));
        }
        for response in results.iter().flatten() {
            let response = response.get_ref();
            if !response.replayed {
                winners += 1;
                winner_status = response.outcome.as_ref().map(|o| o.status);
            }
        }
        assert_eq!(winners, 1, "exactly one decision is written for {call_id}");
        let stored = outcome_of(&app, "s", &call_id).await;
        assert_eq!(Some(stored.status), winner_status);
        for result in results {
            match result {
                Ok(response) => assert_eq!(
                    response.get_ref().outcome.as_ref(),
                    Some(&as_approvers_see(&stored))
                ),
                Err(status) => {
                    assert_eq!(status.code(), Code::FailedPrecondition);
                    let standing = if stored.status == CallStatus::Approved as i32 {
                        "APPROVED"
                    } else {
                        "DENIED"
                    };
                    assert!(status.message().contains(standing), "{}", status.message());
                }
            }
        }
    }
    let calls = all_calls(&app).await;
    let decided: HashSet<_> = calls
        .iter()
        .filter(|c| c.outcome.is_some())
        .map(|c| &c.call_id)
        .collect();
    assert_eq!(decided.len(), 20);
}

async fn a_denial_is_data_with_who_when_why_and_a_text_for_the_model(app: TestApp) {
    let submitted = submit(&app, batch("s", vec![call("c1", "rm", r#"{"path":"/"}"#)])).await;
    let denied = deny(&app, "s", "c1", "never delete the root").await;
    let outcome = denied.outcome.expect("outcome");
    assert_eq!(status_of(&outcome), CallStatus::Denied);
    assert_eq!(outcome.decided_by, "approver:alice@example.com");
    assert_eq!(outcome.reason, "never delete the root");
    assert_eq!(
        outcome.tool_result,
        "The user denied this tool call. Reason: never delete the root"
    );
    assert_eq!(outcome.input_json, "", "a denied call has no input to run");
    assert_eq!(outcome.batch_id, submitted.batch_id);
    assert!(outcome.decided_at.is_some());
}

async fn an_approval_with_edited_input_runs_the_edit_and_keeps_the_original(app: TestApp) {
    submit(
        &app,
        batch(
            "s",
            vec![call("c1", "shell", r#"{"command":"rm -rf build"}"#)],
        ),
    )
    .await;
    let mut request = decide_request("s", "c1", pb::Decision::Approve, "narrowed");
    request.edited_input_json = r#"{ "command": "rm -rf build/tmp" }"#.into();
    let outcome = app
        .approver()
        .decide(request)
        .await
        .expect("approve")
        .into_inner()
        .outcome
        .expect("outcome");
    assert_eq!(status_of(&outcome), CallStatus::Approved);
    assert!(outcome.input_edited);
    assert_eq!(outcome.input_json, r#"{"command":"rm -rf build/tmp"}"#);
    assert_eq!(outcome.tool_result, "");
    let stored = get_call(&app, "s", "c1").await;
    assert_eq!(
        stored.input_json, r#"{"command":"rm -rf build"}"#,
        "the original stays"
    );
    assert_eq!(
        stored.outcome.expect("outcome").input_json,
        r#"{"command":"rm -rf build/tmp"}"#
    );

    submit(
        &app,
        batch("s", vec![call("c2", "shell", r#"{"command":"ls"}"#)]),
    )
    .await;
    let plain = approve(&app, "s", "c2").await.outcome.expect("outcome");
    assert!(!plain.input_edited);
    assert_eq!(
        plain.input_json, r#"{"command":"ls"}"#,
        "the submitted input is the one to run"
    );
    assert_eq!(
        get_call(&app, "s", "c2")
            .await
            .outcome
            .expect("outcome")
            .input_json,
        r#"{"command":"ls"}"#,
        "read back, too"
    );

    // How they are stored: the edit always; the input as submitted again only on Postgres,
    // whose replicas of an older version (which reads a NULL as nothing to run) may share the
    // database during a rolling update. A SQLite row is then under half a page.
    let stored_again = app
        .count("SELECT count(*) FROM calls WHERE call_id = 'c2' AND run_input IS NOT NULL")
        .await;
    let edit_stored = app
        .count(
            "SELECT count(*) FROM calls \
             WHERE call_id = 'c1' AND run_input = '{\"command\":\"rm -rf build/tmp\"}'",
        )
        .await;
    assert_eq!(edit_stored, 1);
    let postgres = matches!(app.backend, Backend::Postgres(_));
    assert_eq!(stored_again, i64::from(postgres));
}

async fn tool_result_texts_are_configurable(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("c1", "t", "{}"), call("c2", "t", "{}")]),
    )
    .await;
    let denied = deny(&app, "s", "c1", "policy").await;
    assert_eq!(
        denied.outcome.expect("outcome").tool_result,
        "Refused by the operator. Reason: policy"
    );
    assert_eq!(denied.skipped[0].tool_result, "Skipped.");
}

async fn outcomes_never_change_once_written(app: TestApp) {
    submit(
        &app,
        batch("s", vec![call("c1", "t", "{}"), call("c2", "t", "{}")]),
    )
    .await;
    let denied = deny(&app, "s", "c1", "no").await.outcome.expect("outcome");
    let before = outcome_of(&app, "s", "c1").await;
    assert_eq!(as_approvers_see(&before), denied);
    // Nothing that happens later rewrites it: cancels, resubmits, supersedes, other decisions.
    app.agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: "s".into(),
                target: Some(pb::cancel_target::Target::WholeSession(true)),
                reason: String::new(),
            }),
        })
        .await
        .expect("cancel");
    submit(
        &app,
        pb::BatchSpec {
            supersede_pending: true,
            ..batch("s", vec![call("c1", "t", "{}")])
        },
    )
    .await;
    let _ = app
        .approver()
        .decide(decide_request("s", "c1", pb::Decision::Approve, ""))
        .await;
    assert_eq!(outcome_of(&app, "s", "c1").await, before);
}

/// Submits `s/c1` (`shell`, `{"cmd":"ls"}`) and approves it, with `edit` as the edited input
/// when given.
async fn approved_c1(app: &TestApp, edit: Option<&str>) -> pb::Outcome {
    submit(
        app,
        batch("s", vec![call("c1", "shell", r#"{"cmd":"ls"}"#)]),
    )
    .await;
    let mut first = decide_request("s", "c1", pb::Decision::Approve, "");
    first.edited_input_json = edit.unwrap_or_default().into();
    let response = app.approver().decide(first).await.expect("approve");
    response.into_inner().outcome.expect("outcome")
}

fn approve_c1(edit: Option<&str>, approver: &str) -> pb::DecideRequest {
    let mut request = decide_request("s", "c1", pb::Decision::Approve, "again");
    request.edited_input_json = edit.unwrap_or_default().into();
    request.approver = approver.into();
    request
}

async fn repeating_an_edited_approval_with_the_same_edit_is_replayed(app: TestApp) {
    let first = approved_c1(&app, Some(r#"{"cmd":"ls -l"}"#)).await;
    // The same edit as other JSON text (white space, key order) is the same input.
    let repeat = app
        .approver()
        .decide(approve_c1(
            Some(r#"{ "cmd" : "ls -l" }"#),
            "bob@example.com",
        ))
        .await
        .expect("a repeat")
        .into_inner();
    assert!(repeat.replayed);
    assert_eq!(repeat.outcome, Some(first), "the stored outcome, unchanged");
}

async fn an_approval_with_another_edit_is_refused_naming_the_edited_approval_that_stands(
    app: TestApp,
) {
    approved_c1(&app, Some(r#"{"cmd":"ls -l"}"#)).await;
    assert_status(
        app.approver()
            .decide(approve_c1(Some(r#"{"cmd":"rm -rf /"}"#), "bob@example.com"))
            .await,
        Code::FailedPrecondition,
        "already APPROVED with an edited input (decided by approver:alice@example.com)",
    );
    assert_eq!(
        outcome_of(&app, "s", "c1").await.input_json,
        r#"{"cmd":"ls -l"}"#
    );
}

async fn a_plain_approval_after_an_edited_one_is_refused(app: TestApp) {
    approved_c1(&app, Some(r#"{"cmd":"ls -l"}"#)).await;
    // The second approver approved the input as submitted, which is not what runs.
    assert_status(
        app.approver()
            .decide(approve_c1(None, "bob@example.com"))
            .await,
        Code::FailedPrecondition,
        "already APPROVED with an edited input",
    );
    assert_eq!(
        outcome_of(&app, "s", "c1").await.input_json,
        r#"{"cmd":"ls -l"}"#
    );
}

async fn an_edited_approval_after_a_plain_one_is_refused(app: TestApp) {
    approved_c1(&app, None).await;
    assert_status(
        app.approver()
            .decide(approve_c1(Some(r#"{"cmd":"ls -l"}"#), "bob@example.com"))
            .await,
        Code::FailedPrecondition,
        "already APPROVED with its input as submitted",
    );
    // An "edit" that is the submitted input itself runs the same thing: a repeat.
    let same = app
        .approver()
        .decide(approve_c1(Some(r#"{"cmd":"ls"}"#), "bob@example.com"))
        .await
        .expect("a repeat")
        .into_inner();
    assert!(same.replayed);
    let stored = outcome_of(&app, "s", "c1").await;
    assert!(!stored.input_edited);
    assert_eq!(stored.input_json, r#"{"cmd":"ls"}"#);
}

async fn a_repeated_denial_with_another_reason_is_replayed_and_the_first_reason_stands(
    app: TestApp,
) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    let first = deny(&app, "s", "c1", "too risky").await;
    let mut again = decide_request("s", "c1", pb::Decision::Deny, "not today");
    again.approver = "bob@example.com".into();
    let repeat = app
        .approver()
        .decide(again)
        .await
        .expect("a repeat")
        .into_inner();
    assert!(repeat.replayed);
    assert_eq!(repeat.outcome, first.outcome);
    let stored = outcome_of(&app, "s", "c1").await;
    assert_eq!(stored.reason, "too risky");
    assert_eq!(stored.decided_by, "approver:alice@example.com");
}

backend_tests! {
    repeating_an_edited_approval_with_the_same_edit_is_replayed,
    an_approval_with_another_edit_is_refused_naming_the_edited_approval_that_stands,
    a_plain_approval_after_an_edited_one_is_refused,
    an_edited_approval_after_a_plain_one_is_refused,
    a_repeated_denial_with_another_reason_is_replayed_and_the_first_reason_stands,
    tool_result_texts_are_configurable => |c| {
        c.texts.text_denied = Some("Refused by the operator.".into());
        c.texts.text_skipped = Some("Skipped.".into());
    },
    the_first_decision_wins_and_repeating_it_returns_the_stored_outcome,
    a_conflicting_decision_is_refused_naming_the_outcome_that_stands,
    deciding_an_unknown_call_is_not_found,
    concurrent_decisions_have_exactly_one_winner,
    a_denial_is_data_with_who_when_why_and_a_text_for_the_model,
    an_approval_with_edited_input_runs_the_edit_and_keeps_the_original,
    outcomes_never_change_once_written,
}
