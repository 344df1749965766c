//! A call a reader may not see is, to that reader, an unknown call: every read that returns a
//! call's content asks one question (`Call::visible_to`), and an approver outside the groups of
//! an ops-only call gets from each read exactly what an unknown id gets (the same status, the
//! same message with the ids it sent), while an approver inside the group, an auditor and an
//! admin read it. A receipt whose call was pruned is served only to readers who see every call. The reads: GetReceipt, ListPending, Subscribe (snapshot, live events and a
//! resume), Decide's reply about a batch's siblings, GetOutcomes, and the admin's ListCalls,
//! GetCall, Explain and ExportReceipts.

use approval_broker::config::Config;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use tonic::{Code, Status};

use crate::helpers::*;
use crate::routing::{admin_as, approver_as, bearer};

const BOT: &str = "token-of-bot";
/// Another agent, `mallory`.
const MALLORY: &str = "token-of-mallory";
/// `alice` is in ops; `dave` in no group.
const ALICE: &str = "token-of-alice";
const DAVE: &str = "token-of-dave";
/// An auditor, `eve`, and an admin, `root`.
const EVE: &str = "token-of-eve";
const ROOT: &str = "token-of-root";

/// The tokens, and a receipt key (Postgres signs receipts only with a key given).
fn with_groups(config: &mut Config) {
    let key = tempfile::NamedTempFile::new()
        .unwrap()
        .into_temp_path()
        .keep()
        .unwrap();
    std::fs::write(&key, [7u8; 32]).unwrap();
    config.receipts.receipt_key = Some(key);
    config.auth.tokens = Some(format!(
        "agent bot {}\nagent mallory {}\napprover alice {} groups=ops\napprover dave {}\n\
         auditor eve {}\nadmin root {}",
        hash_token(BOT),
        hash_token(MALLORY),
        hash_token(ALICE),
        hash_token(DAVE),
        hash_token(EVE),
        hash_token(ROOT),
    ));
}

/// The ask rule `ops-only`: only ops members may decide (and so see) `deploy` calls.
async fn ops_only_rule(app: &TestApp) {
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

/// Submits `calls` as one batch of session `s`, as the agent `bot`, skipping the rest of the
/// batch on a denial (the default).
async fn submit_as_bot(app: &TestApp, calls: Vec<pb::CallSpec>) {
    AgentServiceClient::with_interceptor(app.channel.clone(), bearer(BOT))
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", calls)),
        })
        .await
        .expect("submit");
}

async fn decide_as(
    app: &TestApp,
    token: &str,
    call_id: &str,
    verdict: pb::Decision,
) -> Result<pb::DecideResponse, Status> {
    let mut request = decide_request("s", call_id, verdict, "");
    request.agent = "bot".into();
    request.approver = String::new();
    approver_as(&app.channel, token)
        .decide(request)
        .await
        .map(tonic::Response::into_inner)
}

async fn receipt_as(
    app: &TestApp,
    token: &str,
    call_id: &str,
) -> Result<pb::GetReceiptResponse, Status> {
    approver_as(&app.channel, token)
        .get_receipt(pb::GetReceiptRequest {
            agent: "bot".into(),
            session_id: "s".into(),
            call_id: call_id.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The key of a call of `bot`'s session `s`, as GetCall and Explain take it.
fn key(call_id: &str) -> pb::GetCallRequest {
    pb::GetCallRequest {
        agent: "bot".into(),
        session_id: "s".into(),
        call_id: call_id.into(),
    }
}

/// Asserts that what `hidden` answered for call `id` is what `unknown` answered for the unknown
/// call `nope`: the same status, and the same message but for the id the caller sent.
fn as_if_unknown(hidden: &Status, unknown: &Status, id: &str) {
    assert_eq!(unknown.code(), Code::NotFound, "{}", unknown.message());
    assert_eq!(hidden.code(), unknown.code(), "{}", hidden.message());
    assert_eq!(
        hidden.message(),
        unknown.message().replace("`nope`", &format!("`{id}`")),
    );
}

async fn ids_pending_for(app: &TestApp, token: &str) -> Vec<String> {
    approver_as(&app.channel, token)
        .list_pending(pb::ListPendingRequest::default())
        .await
        .expect("list pending")
        .into_inner()
        .calls
        .into_iter()
        .map(|c| c.call_id)
        .collect()
}

async fn subscribe_as(app: &TestApp, token: &str, after_seq: Option<u64>) -> Subscription {
    let stream = approver_as(&app.channel, token)
        .subscribe(pb::SubscribeRequest {
            filter: None,
            after_seq,
        })
        .await
        .expect("subscribe")
        .into_inner();
    Subscription { stream }
}

/// The call an approver event is about.
fn event_call_id(event: &pb::ApproverEvent) -> String {
    use pb::approver_event::Event as E;
    match event.event.as_ref().expect("an event") {
        E::Requested(c) | E::Snapshot(c) | E::ApprovalRecorded(c) => c.call_id.clone(),
        E::Resolved(o) => o.call_id.clone(),
        other => panic!("unexpected event {other:?}"),
    }
}

async fn a_hidden_calls_receipt_is_not_found_as_an_unknown_calls_is(app: TestApp) {
    ops_only_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", r#"{"secret":"s3"}"#)]).await;
    submit_as_bot(&app, vec![call("d2", "deploy", "{}")]).await;
    decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .expect("alice decides");

    let unknown = receipt_as(&app, DAVE, "nope").await.unwrap_err();
    // Decided (a receipt exists) and pending (none yet, FAILED_PRECONDITION for those who may
    // see it): neither says so to dave.
    for id in ["d1", "d2"] {
        let hidden = receipt_as(&app, DAVE, id).await.unwrap_err();
        as_if_unknown(&hidden, &unknown, id);
    }
    // Those who may see it read it.
    for token in [ALICE, EVE] {
        let receipt = receipt_as(&app, token, "d1")
            .await
            .expect("a visible call's receipt")
            .receipt
            .expect("a receipt");
        assert!(receipt.verified);
    }
    let pending = receipt_as(&app, ALICE, "d2").await.unwrap_err();
    assert_eq!(pending.code(), Code::FailedPrecondition);
}

/// Keeps decided calls for a second, pruning often.
fn with_groups_retaining_a_second(config: &mut Config) {
    with_groups(config);
    config.lifecycle.retain_decided = Some(std::time::Duration::from_secs(1));
    config.lifecycle.prune_every = std::time::Duration::from_millis(100);
}

async fn a_pruned_calls_receipt_is_served_only_to_readers_who_see_every_call(app: TestApp) {
    ops_only_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", "{}")]).await;
    decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    assert!(receipt_as(&app, ALICE, "d1").await.is_ok());
    // The log's last event is never pruned: another call moves it past d1's.
    AgentServiceClient::with_interceptor(app.channel.clone(), bearer(BOT))
        .submit(pb::SubmitRequest {
            batch: Some(batch("other", vec![call("x", "shell", "{}")])),
        })
        .await
        .expect("submit");
    let mut root = admin_as(&app.channel, ROOT);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while root.get_call(key("d1")).await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "d1 was not pruned");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Its requirement went with it: nobody can tell any more whether an approver may see it,
    // so no approver is shown it, and each is told what an unknown id gets.
    for token in [ALICE, DAVE] {
        let unknown = receipt_as(&app, token, "nope").await.unwrap_err();
        let pruned = receipt_as(&app, token, "d1").await.unwrap_err();
        as_if_unknown(&pruned, &unknown, "d1");
    }
    let kept = receipt_as(&app, EVE, "d1")
        .await
        .expect("an auditor reads every receipt")
        .receipt
        .unwrap();
    assert!(kept.verified);
}

async fn lists_and_streams_leave_out_what_the_reader_may_not_see(app: TestApp) {
    ops_only_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", "{}")]).await;
    submit_as_bot(&app, vec![call("c1", "shell", "{}")]).await;
    assert_eq!(ids_pending_for(&app, DAVE).await, ["c1"]);
    assert_eq!(ids_pending_for(&app, ALICE).await, ["d1", "c1"]);
    assert_eq!(ids_pending_for(&app, EVE).await, ["d1", "c1"]);

    let mut dave = subscribe_as(&app, DAVE, None).await;
    let mut alice = subscribe_as(&app, ALICE, None).await;
    let ids = |calls: Vec<pb::Call>| calls.into_iter().map(|c| c.call_id).collect::<Vec<_>>();
    assert_eq!(ids(dave.snapshot().await.0), ["c1"]);
    assert_eq!(ids(alice.snapshot().await.0), ["d1", "c1"]);

    // Live: d2 requested and resolved, then c2 requested and resolved; dave is told of c2 only.
    submit_as_bot(&app, vec![call("d2", "deploy", "{}")]).await;
    decide_as(&app, ALICE, "d2", pb::Decision::Approve)
        .await
        .unwrap();
    submit_as_bot(&app, vec![call("c2", "shell", "{}")]).await;
    decide_as(&app, DAVE, "c2", pb::Decision::Approve)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(event_call_id(&dave.next().await));
    }
    assert_eq!(seen, ["c2", "c2"]);
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(event_call_id(&alice.next().await));
    }
    assert_eq!(seen, ["d2", "d2", "c2", "c2"]);

    // A resume from the start of the log replays the same choice.
    let mut resumed = subscribe_as(&app, DAVE, Some(0)).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(event_call_id(&resumed.next().await));
    }
    assert_eq!(seen, ["c1", "c2", "c2"]);
}

async fn a_denials_reply_names_only_the_skipped_siblings_the_approver_may_see(app: TestApp) {
    ops_only_rule(&app).await;
    submit_as_bot(
        &app,
        vec![
            call("c1", "shell", "{}"),
            call("d1", "deploy", "{}"),
            call("c2", "shell", "{}"),
        ],
    )
    .await;
    let reply = decide_as(&app, DAVE, "c1", pb::Decision::Deny)
        .await
        .expect("dave denies c1");
    let skipped: Vec<&str> = reply.skipped.iter().map(|o| o.call_id.as_str()).collect();
    assert_eq!(
        skipped,
        ["c2"],
        "d1 is skipped too, but dave may not see it"
    );
    assert_eq!(reply.skipped_count, 1);
    // The admin's audit shows all three.
    let calls = admin_as(&app.channel, ROOT)
        .list_calls(pb::ListCallsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .calls;
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c.status != CallStatus::Pending as i32));
}

async fn an_agent_reads_only_its_own_calls_outcomes(app: TestApp) {
    submit_as_bot(&app, vec![call("c1", "shell", "{}")]).await;
    let outcomes_as = |token: &'static str| {
        let channel = app.channel.clone();
        async move {
            AgentServiceClient::with_interceptor(channel, bearer(token))
                .get_outcomes(pb::GetOutcomesRequest {
                    session_id: "s".into(),
                    call_ids: vec!["c1".into(), "nope".into()],
                })
                .await
                .expect("get outcomes")
                .into_inner()
                .calls
        }
    };
    let unknown = Some(pb::call_state::State::Unknown(pb::Unknown {}));
    let mallorys = outcomes_as(MALLORY).await;
    assert_eq!(
        mallorys[0].state, unknown,
        "bot's call is unknown to mallory"
    );
    assert_eq!(mallorys[1].state, unknown);
    let bots = outcomes_as(BOT).await;
    assert!(matches!(
        bots[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn operators_read_every_call_and_approvers_are_refused_the_admin_reads_by_role_alone(
    app: TestApp,
) {
    ops_only_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", "{}")]).await;
    decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    let mut root = admin_as(&app.channel, ROOT);
    assert_eq!(
        root.get_call(key("d1")).await.unwrap().into_inner().call_id,
        "d1"
    );
    let unknown = root.get_call(key("nope")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let explained = root
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Stored(key("d1"))),
        })
        .await
        .expect("the admin explains a call of any group")
        .into_inner();
    assert_eq!(explained.approval.unwrap().rule_id, "ops-only");
    let exported = root
        .export_receipts(pb::ExportReceiptsRequest {
            after_sequence: 0,
            page_size: 10,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exported.receipts.len(), 1);

    // An approver outside the group asking the admin's reads about the hidden call is refused
    // for its role, word for word as when it asks about an unknown one.
    let mut dave = admin_as(&app.channel, DAVE);
    let hidden = dave.get_call(key("d1")).await.unwrap_err();
    let unknown = dave.get_call(key("nope")).await.unwrap_err();
    assert_eq!(hidden.code(), Code::PermissionDenied);
    assert_eq!(
        (hidden.code(), hidden.message()),
        (unknown.code(), unknown.message())
    );
    let explain = |id: &str| pb::ExplainRequest {
        call: Some(pb::explain_request::Call::Stored(key(id))),
    };
    let hidden = dave.explain(explain("d1")).await.unwrap_err();
    let unknown = dave.explain(explain("nope")).await.unwrap_err();
    assert_eq!(
        (hidden.code(), hidden.message()),
        (unknown.code(), unknown.message())
    );
}

backend_tests!(
    a_hidden_calls_receipt_is_not_found_as_an_unknown_calls_is => super::with_groups,
    lists_and_streams_leave_out_what_the_reader_may_not_see => super::with_groups,
    a_denials_reply_names_only_the_skipped_siblings_the_approver_may_see => super::with_groups,
    an_agent_reads_only_its_own_calls_outcomes => super::with_groups,
    a_pruned_calls_receipt_is_served_only_to_readers_who_see_every_call
        => super::with_groups_retaining_a_second,
    operators_read_every_call_and_approvers_are_refused_the_admin_reads_by_role_alone => super::with_groups,
);
