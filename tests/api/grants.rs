//! Remembered decisions: a decision with a scope other than ONCE becomes a grant that decides
//! later calls of its session, workspace or agent (as narrowly as its matcher says), decides the
//! pending calls it matches as it is created, and stops deciding anything once it expires or is
//! revoked.

use std::time::Duration;

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

const GIT_STATUS: &str = r#"{"command":"git status"}"#;

async fn a_session_grant_decides_later_calls_of_that_session_only(app: TestApp) {
    submit_one(&app, "s1", call("c1", "shell", GIT_STATUS)).await;
    let decided = decide_remembering(
        &app,
        "s1",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Session,
        None,
    )
    .await;
    assert_eq!(
        decided.outcome.as_ref().expect("outcome").decided_by,
        "approver:alice@example.com",
        "the call itself is decided by the person"
    );
    let grant = decided.grant.expect("a grant");
    assert_eq!(grant.scope, pb::Scope::Session as i32);
    assert_eq!(grant.session_id, "s1");
    assert_eq!(grant.tool, "shell");
    assert_eq!(grant.effect, pb::Effect::Allow as i32);
    assert_eq!(grant.created_by, "approver:alice@example.com");
    assert_eq!(
        (
            grant.source_session_id.as_str(),
            grant.source_call_id.as_str()
        ),
        ("s1", "c1")
    );
    assert_eq!(
        grant.matcher,
        Some(exact_input(GIT_STATUS)),
        "by default a grant matches exactly the decided input"
    );
    assert!(grant.active && grant.expires_at.is_none() && grant.revoked_at.is_none());
    let by_grant = format!("grant:{}", grant.id);

    let response = submit_one(
        &app,
        "s1",
        call("c2", "shell", r#"{ "command": "git status" }"#),
    )
    .await;
    assert_eq!(ack_status(&response, 0), CallStatus::Approved);
    let outcome = &response.outcomes[0];
    assert_eq!(outcome.decided_by, by_grant);
    assert_eq!(
        outcome.input_json, GIT_STATUS,
        "it runs the input as submitted"
    );
    assert_eq!(outcome_of(&app, "s1", "c2").await.decided_by, by_grant);

    for (session, spec) in [
        ("s2", call("c3", "shell", GIT_STATUS)),
        (
            "s1",
            call("c4", "shell", r#"{"command":"git status --short"}"#),
        ),
        ("s1", call("c5", "other_tool", GIT_STATUS)),
    ] {
        let call_id = spec.call_id.clone();
        assert_eq!(
            submitted_one(&app, session, spec).await,
            (CallStatus::Pending, String::new()),
            "{call_id}"
        );
    }
}

async fn a_workspace_grant_decides_later_calls_in_that_workspace_only(app: TestApp) {
    submit_one(
        &app,
        "s1",
        call_in("repo-a", "c1", "read_file", r#"{"path":"a"}"#),
    )
    .await;
    let grant = grant_by_deciding(
        &app,
        "s1",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Workspace,
        Some(any_input()),
    )
    .await;
    assert_eq!(
        (grant.scope, grant.workspace.as_str()),
        (pb::Scope::Workspace as i32, "repo-a")
    );
    let by_grant = format!("grant:{}", grant.id);
    let in_a = call_in("repo-a", "c2", "read_file", r#"{"path":"b"}"#);
    assert_eq!(
        submitted_one(&app, "s2", in_a).await,
        (CallStatus::Approved, by_grant),
        "another session, same workspace"
    );
    let in_b = call_in("repo-b", "c3", "read_file", r#"{"path":"b"}"#);
    assert_eq!(submitted_one(&app, "s2", in_b).await.0, CallStatus::Pending);
    let nowhere = call("c4", "read_file", r#"{"path":"b"}"#);
    assert_eq!(
        submitted_one(&app, "s1", nowhere).await.0,
        CallStatus::Pending
    );
}

async fn a_workspace_scope_needs_a_call_with_a_workspace(app: TestApp) {
    submit_one(&app, "s1", call("c1", "read_file", "{}")).await;
    let mut request = decide_request("s1", "c1", pb::Decision::Approve, "");
    request.scope = pb::Scope::Workspace as i32;
    assert_status(
        app.approver().decide(request).await,
        Code::InvalidArgument,
        "scope",
    );
    assert_eq!(
        submitted_one(&app, "s1", call("c1", "read_file", "{}"))
            .await
            .0,
        CallStatus::Pending,
        "the refused decision wrote nothing"
    );
    assert!(list_grants(&app, Default::default()).await.is_empty());
}

async fn an_always_grant_decides_every_later_call_of_the_agent(app: TestApp) {
    submit_one(&app, "s1", call("c1", "web_search", r#"{"q":"rust"}"#)).await;
    let grant = grant_by_deciding(
        &app,
        "s1",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Always,
        Some(any_input()),
    )
    .await;
    assert_eq!(grant.scope, pb::Scope::Always as i32);
    let by_grant = format!("grant:{}", grant.id);
    for (i, (session, workspace)) in [("s1", ""), ("s2", ""), ("s3", "repo")]
        .into_iter()
        .enumerate()
    {
        let spec = call_in(
            workspace,
            &format!("later{i}"),
            "web_search",
            r#"{"q":"go"}"#,
        );
        assert_eq!(
            submitted_one(&app, session, spec).await,
            (CallStatus::Approved, by_grant.clone())
        );
    }
    let other_tool = call("x", "web_fetch", r#"{"q":"go"}"#);
    assert_eq!(
        submitted_one(&app, "s1", other_tool).await.0,
        CallStatus::Pending
    );
}

async fn a_once_decision_remembers_nothing(app: TestApp) {
    submit_one(&app, "s1", call("c1", "shell", GIT_STATUS)).await;
    submit_one(&app, "s1", call("c2", "shell", GIT_STATUS)).await;
    let explicit = decide_remembering(
        &app,
        "s1",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Once,
        None,
    )
    .await;
    assert!(explicit.grant.is_none() && explicit.decided_by_grant.is_empty());
    let default = approve(&app, "s1", "c2").await;
    assert!(default.grant.is_none());
    assert_eq!(
        submitted_one(&app, "s1", call("c3", "shell", GIT_STATUS))
            .await
            .0,
        CallStatus::Pending
    );
    assert!(
        list_grants(
            &app,
            pb::ListGrantsRequest {
                include_inactive: true,
                ..Default::default()
            }
        )
        .await
        .is_empty()
    );
}

async fn a_remembered_denial_denies_later_calls_with_its_reason(app: TestApp) {
    let rm = r#"{"command":"rm -rf /"}"#;
    submit_one(&app, "s1", call("c1", "shell", rm)).await;
    let mut request = decide_request("s1", "c1", pb::Decision::Deny, "never on this machine");
    request.scope = pb::Scope::Session as i32;
    let grant = app
        .approver()
        .decide(request)
        .await
        .expect("deny")
        .into_inner()
        .grant
        .expect("a grant");
    assert_eq!(grant.effect, pb::Effect::Deny as i32);
    assert_eq!(grant.reason, "never on this machine");
    let response = submit_one(&app, "s1", call("c2", "shell", rm)).await;
    assert_eq!(ack_status(&response, 0), CallStatus::Denied);
    let outcome = &response.outcomes[0];
    assert_eq!(outcome.decided_by, format!("grant:{}", grant.id));
    assert_eq!(
        outcome.tool_result,
        "The user denied this tool call. Reason: never on this machine"
    );
}

/// A matcher's name, the matcher, and inputs with whether it must decide them.
type MatcherCase = (&'static str, pb::InputMatcher, Vec<(&'static str, bool)>);

/// For each matcher kind: a grant made with it, then inputs it must and must not decide.
async fn each_matcher_decides_exactly_the_inputs_it_describes(app: TestApp) {
    let cases: Vec<MatcherCase> = vec![
        (
            "any",
            any_input(),
            vec![
                (r#"{"x":1}"#, true),
                ("{}", true),
                (r#"{"command":"rm -rf /"}"#, true),
            ],
        ),
        (
            "exact",
            exact_input(r#"{"b": 2, "a": [1, "x"]}"#),
            vec![
                (r#"{"a":[1,"x"],"b":2}"#, true),
                (r#"{ "b":2, "a":[1, "x"] }"#, true),
                (r#"{"a":[1,"x"],"b":3}"#, false),
                (r#"{"a":[1,"x"],"b":2,"c":0}"#, false),
            ],
        ),
        (
            "equals",
            fields(vec![equals("mode", "ro"), equals_json("retries", "3")]),
            vec![
                (r#"{"mode":"ro","retries":3}"#, true),
                (r#"{"mode":"ro","retries":3,"other":1}"#, true),
                (r#"{"mode":"rw","retries":3}"#, false),
                (r#"{"mode":"ro","retries":"3"}"#, false),
                (r#"{"mode":"ro"}"#, false),
            ],
        ),
        (
            "prefix",
            fields(vec![prefix("command", "git status")]),
            vec![
                (r#"{"command":"git status"}"#, true),
                (r#"{"command":"git status --short"}"#, true),
                (r#"{"command":"git stash"}"#, false),
                (r#"{"command":" git status"}"#, false),
                (r#"{"command":["git status"]}"#, false),
                (r#"{"cmd":"git status"}"#, false),
            ],
        ),
        (
            "glob",
            fields(vec![glob("path", "src/**")]),
            vec![
                (r#"{"path":"src/main.rs"}"#, true),
                (r#"{"path":"src/a/b/c.rs"}"#, true),
                (r#"{"path":"docs/src/main.rs"}"#, false),
                (r#"{"path":"src"}"#, false),
                (r#"{"path":7}"#, false),
            ],
        ),
        (
            "nested",
            fields(vec![
                equals_json("options.force", "false"),
                glob("target", "*.txt"),
            ]),
            vec![
                (r#"{"options":{"force":false},"target":"a/b.txt"}"#, true),
                (r#"{"options":{"force":true},"target":"a/b.txt"}"#, false),
                (r#"{"options":{"force":false},"target":"a/b.md"}"#, false),
                (r#"{"options.force":false,"target":"b.txt"}"#, false),
            ],
        ),
    ];
    for (name, matcher, inputs) in cases {
        let session = format!("session-{name}");
        let tool = format!("tool_{name}");
        submit_one(&app, &session, call("first", &tool, r#"{"seed":true}"#)).await;
        let grant = grant_by_deciding(
            &app,
            &session,
            "first",
            pb::Decision::Approve,
            pb::Scope::Session,
            Some(matcher.clone()),
        )
        .await;
        assert_eq!(grant.matcher.as_ref(), Some(&canonical(&matcher)), "{name}");
        for (i, (input, decided)) in inputs.into_iter().enumerate() {
            let (status, by) =
                submitted_one(&app, &session, call(&format!("c{i}"), &tool, input)).await;
            let expected = if decided {
                (CallStatus::Approved, format!("grant:{}", grant.id))
            } else {
                (CallStatus::Pending, String::new())
            };
            assert_eq!((status, by), expected, "{name}: {input}");
        }
    }
}

/// How the broker shows a matcher back: exact inputs in canonical form.
fn canonical(matcher: &pb::InputMatcher) -> pb::InputMatcher {
    match &matcher.kind {
        Some(pb::input_matcher::Kind::ExactJson(text)) => {
            let value: serde_json::Value = serde_json::from_str(text).expect("json");
            exact_input(&value.to_string())
        }
        _ => matcher.clone(),
    }
}

async fn pending_calls_a_new_grant_matches_are_decided_at_once(app: TestApp) {
    let mut agent = AgentStream::open(&app).await;
    let mut subscriber = Subscription::open(&app, pb::CallFilter::default(), None).await;
    subscriber.snapshot().await;
    let first = pb::BatchSpec {
        on_deny: pb::OnDeny::Independent as i32,
        ..batch(
            "s1",
            vec![
                call("c1", "shell", GIT_STATUS),
                call("c2", "shell", r#"{"command":"git status --short"}"#),
            ],
        )
    };
    agent.submit("r1", first).await;
    agent.next_submitted().await;
    agent
        .submit(
            "r2",
            batch("s1", vec![call("c3", "shell", r#"{"command":"git log"}"#)]),
        )
        .await;
    agent.next_submitted().await;
    agent
        .submit("r3", batch("s2", vec![call("c4", "shell", GIT_STATUS)]))
        .await;
    agent.next_submitted().await;
    for _ in 0..4 {
        subscriber.next().await;
    }

    let decided = decide_remembering(
        &app,
        "s1",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Session,
        Some(fields(vec![prefix("command", "git status")])),
    )
    .await;
    let by_grant = format!("grant:{}", decided.grant.expect("a grant").id);
    let auto: Vec<_> = decided
        .decided_by_grant
        .iter()
        .map(|o| (o.call_id.as_str(), o.decided_by.as_str(), status_of(o)))
        .collect();
    assert_eq!(auto, [("c2", by_grant.as_str(), CallStatus::Approved)]);

    // The agent and the subscribers see it like any decision, and the batch completes.
    let mut outcomes = [agent.next_outcome().await, agent.next_outcome().await];
    outcomes.sort_by(|a, b| a.call_id.cmp(&b.call_id));
    assert_eq!(outcomes[0].decided_by, "approver:alice@example.com");
    assert_eq!(outcomes[1].decided_by, by_grant);
    let complete = agent.next_batch_complete().await;
    assert_eq!(complete.outcomes.len(), 2);
    let mut resolved = Vec::new();
    for _ in 0..2 {
        match subscriber.next().await.event {
            Some(pb::approver_event::Event::Resolved(o)) => resolved.push(o.call_id),
            other => panic!("expected a resolution, got {other:?}"),
        }
    }
    resolved.sort();
    assert_eq!(resolved, ["c1", "c2"]);

    // Outside the grant's matcher or session: still waiting for a human.
    for (session, call_id) in [("s1", "c3"), ("s2", "c4")] {
        assert!(matches!(
            states(&app, session, &[call_id]).await[0].state,
            Some(pb::call_state::State::Pending(_))
        ));
    }
}

async fn a_new_deny_grant_skips_the_rest_of_the_batches_it_denies_in(app: TestApp) {
    let rm = r#"{"command":"rm -rf /"}"#;
    let skip_rest = batch(
        "s",
        vec![call("a1", "shell", rm), call("a2", "read_file", "{}")],
    );
    submit(&app, skip_rest).await;
    let independent = pb::BatchSpec {
        on_deny: pb::OnDeny::Independent as i32,
        ..batch(
            "s",
            vec![call("i1", "shell", rm), call("i2", "read_file", "{}")],
        )
    };
    submit(&app, independent).await;
    submit(&app, batch("s", vec![call("b1", "shell", rm)])).await;

    let decided = decide_remembering(
        &app,
        "s",
        "b1",
        pb::Decision::Deny,
        pb::Scope::Session,
        None,
    )
    .await;
    let by_grant = format!("grant:{}", decided.grant.expect("a grant").id);
    let mut denied: Vec<_> = decided
        .decided_by_grant
        .iter()
        .map(|o| (o.call_id.clone(), o.decided_by.clone(), status_of(o)))
        .collect();
    denied.sort();
    assert_eq!(
        denied,
        [
            ("a1".to_owned(), by_grant.clone(), CallStatus::Denied),
            ("i1".to_owned(), by_grant.clone(), CallStatus::Denied),
        ]
    );
    let skipped: Vec<_> = decided.skipped.iter().map(|o| o.call_id.as_str()).collect();
    assert_eq!(skipped, ["a2"], "SKIP_REST applies to a grant's denial too");
    assert_eq!(
        status_of(&outcome_of(&app, "s", "a2").await),
        CallStatus::Skipped
    );
    assert!(matches!(
        states(&app, "s", &["i2"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn a_grant_expiry_must_be_in_the_future(app: TestApp) {
    submit_one(&app, "s", call("c1", "shell", GIT_STATUS)).await;
    for seconds in [0, -5] {
        let mut request = decide_request("s", "c1", pb::Decision::Approve, "");
        request.scope = pb::Scope::Session as i32;
        request.grant_expires_in = Some(prost_types::Duration { seconds, nanos: 0 });
        assert_status(
            app.approver().decide(request).await,
            Code::InvalidArgument,
            "grant_expires_in",
        );
    }
    assert!(matches!(
        states(&app, "s", &["c1"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
}

async fn a_grant_decides_until_it_expires_and_nothing_after(app: TestApp) {
    // A long expiry: the grant applies meanwhile.
    submit_one(&app, "s", call("long", "read_file", "{}")).await;
    let mut request = decide_request("s", "long", pb::Decision::Approve, "");
    request.scope = pb::Scope::Session as i32;
    request.grant_expires_in = Some(prost_types::Duration {
        seconds: 3600,
        nanos: 0,
    });
    let long = app
        .approver()
        .decide(request)
        .await
        .expect("decide")
        .into_inner();
    let long = long.grant.expect("a grant");
    assert!(long.expires_at.is_some() && long.active);
    assert_eq!(
        submitted_one(&app, "s", call("during", "read_file", "{}")).await,
        (CallStatus::Approved, format!("grant:{}", long.id))
    );

    // A one-second expiry, waited out: the grant then decides nothing.
    submit_one(&app, "s", call("short", "shell", GIT_STATUS)).await;
    let mut request = decide_request("s", "short", pb::Decision::Approve, "");
    request.scope = pb::Scope::Session as i32;
    request.grant_expires_in = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let short = app
        .approver()
        .decide(request)
        .await
        .expect("decide")
        .into_inner();
    let short = short.grant.expect("a grant");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while list_grants(&app, Default::default())
        .await
        .iter()
        .any(|g| g.id == short.id)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the grant never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        submitted_one(&app, "s", call("after", "shell", GIT_STATUS)).await,
        (CallStatus::Pending, String::new())
    );
    assert_eq!(
        explain_inline(&app, "s", "", "shell", GIT_STATUS)
            .await
            .verdict,
        CallStatus::Pending as i32
    );
    let all = list_grants(
        &app,
        pb::ListGrantsRequest {
            include_inactive: true,
            ..Default::default()
        },
    )
    .await;
    let expired = all.iter().find(|g| g.id == short.id).expect("still listed");
    assert!(!expired.active && expired.revoked_at.is_none());
}

async fn a_revoked_grant_decides_nothing_after(app: TestApp) {
    submit_one(&app, "s", call("c1", "shell", GIT_STATUS)).await;
    let grant = grant_by_deciding(
        &app,
        "s",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Session,
        None,
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", call("c2", "shell", GIT_STATUS))
            .await
            .0,
        CallStatus::Approved
    );
    let revoke = |target| pb::RevokeGrantRequest {
        target: Some(target),
        agent: String::new(),
    };
    let response = app
        .admin()
        .revoke_grant(revoke(pb::revoke_grant_request::Target::Id(grant.id)))
        .await
        .expect("revoke")
        .into_inner();
    assert_eq!(response.revoked, 1);
    let revoked = &response.grants[0];
    assert!(revoked.revoked_at.is_some() && !revoked.active);
    assert_eq!(revoked.revoked_by, "admin");

    assert_eq!(
        submitted_one(&app, "s", call("c3", "shell", GIT_STATUS)).await,
        (CallStatus::Pending, String::new())
    );
    assert!(list_grants(&app, Default::default()).await.is_empty());
    let again = app
        .admin()
        .revoke_grant(revoke(pb::revoke_grant_request::Target::Id(grant.id)))
        .await
        .expect("revoke again")
        .into_inner();
    assert_eq!(again.revoked, 0, "revoking twice changes nothing");
    assert_eq!(again.grants[0].revoked_at, revoked.revoked_at);
    assert_status(
        app.admin()
            .revoke_grant(revoke(pb::revoke_grant_request::Target::Id(grant.id + 100)))
            .await,
        Code::NotFound,
        "grant",
    );
    assert_status(
        app.admin()
            .revoke_grant(pb::RevokeGrantRequest::default())
            .await,
        Code::InvalidArgument,
        "target",
    );
}

/// Grants of s1 (two tools), of s2, of workspace w, and an always grant.
async fn grants_of_every_scope(app: &TestApp) -> Vec<pb::Grant> {
    let mut grants = Vec::new();
    for (session, workspace, call_id, tool, scope) in [
        ("s1", "", "a", "tool_a", pb::Scope::Session),
        ("s1", "", "b", "tool_b", pb::Scope::Session),
        ("s2", "", "c", "tool_a", pb::Scope::Session),
        ("s1", "w", "d", "tool_c", pb::Scope::Workspace),
        ("s1", "w", "e", "tool_d", pb::Scope::Always),
    ] {
        submit_one(app, session, call_in(workspace, call_id, tool, "{}")).await;
        let grant = grant_by_deciding(
            app,
            session,
            call_id,
            pb::Decision::Approve,
            scope,
            Some(any_input()),
        )
        .await;
        grants.push(grant);
    }
    grants
}

async fn resetting_a_session_revokes_its_session_grants_and_nothing_else(app: TestApp) {
    let grants = grants_of_every_scope(&app).await;
    let response = app
        .admin()
        .revoke_grant(pb::RevokeGrantRequest {
            target: Some(pb::revoke_grant_request::Target::SessionId("s1".into())),
            agent: String::new(),
        })
        .await
        .expect("reset")
        .into_inner();
    assert_eq!(response.revoked, 2);
    let mut ids: Vec<u64> = response.grants.iter().map(|g| g.id).collect();
    ids.sort();
    assert_eq!(ids, [grants[0].id, grants[1].id]);
    for (call_id, tool, expected) in [
        ("x1", "tool_a", CallStatus::Pending),
        ("x2", "tool_b", CallStatus::Pending),
        ("x3", "tool_d", CallStatus::Approved),
    ] {
        assert_eq!(
            submitted_one(&app, "s1", call_in("w", call_id, tool, "{}"))
                .await
                .0,
            expected,
            "{tool}"
        );
    }
    assert_eq!(
        submitted_one(&app, "s2", call("y", "tool_a", "{}")).await.0,
        CallStatus::Approved,
        "another session's grant stays"
    );
    assert_eq!(
        submitted_one(&app, "s3", call_in("w", "z", "tool_c", "{}"))
            .await
            .0,
        CallStatus::Approved,
        "a workspace grant stays"
    );
}

async fn resetting_a_workspace_revokes_its_workspace_grants_and_nothing_else(app: TestApp) {
    let grants = grants_of_every_scope(&app).await;
    let response = app
        .admin()
        .revoke_grant(pb::RevokeGrantRequest {
            target: Some(pb::revoke_grant_request::Target::Workspace("w".into())),
            agent: String::new(),
        })
        .await
        .expect("reset")
        .into_inner();
    assert_eq!(response.revoked, 1);
    assert_eq!(response.grants[0].id, grants[3].id);
    assert_eq!(
        submitted_one(&app, "s3", call_in("w", "z", "tool_c", "{}"))
            .await
            .0,
        CallStatus::Pending
    );
    assert_eq!(
        submitted_one(&app, "s1", call("x", "tool_a", "{}")).await.0,
        CallStatus::Approved
    );
    let active = list_grants(&app, Default::default()).await;
    assert_eq!(active.len(), 4);
}

async fn grants_are_listed_filtered_and_paged(app: TestApp) {
    let grants = grants_of_every_scope(&app).await;
    let ids = |list: Vec<pb::Grant>| list.iter().map(|g| g.id).collect::<Vec<_>>();
    let all: Vec<u64> = grants.iter().map(|g| g.id).collect();
    let paged = list_grants(
        &app,
        pb::ListGrantsRequest {
            page_size: 2,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids(paged), all, "every page, oldest first");
    let by_session = list_grants(
        &app,
        pb::ListGrantsRequest {
            session_id: "s1".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids(by_session), all[..2]);
    let by_scope = list_grants(
        &app,
        pb::ListGrantsRequest {
            scope: pb::Scope::Workspace as i32,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids(by_scope), [all[3]]);
    let by_workspace = list_grants(
        &app,
        pb::ListGrantsRequest {
            workspace: "w".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids(by_workspace), [all[3]]);
    let by_tool = list_grants(
        &app,
        pb::ListGrantsRequest {
            tool: "tool_a".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(ids(by_tool), [all[0], all[2]]);
    let by_agent = list_grants(
        &app,
        pb::ListGrantsRequest {
            agent: "someone-else".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(by_agent.is_empty());
    assert_status(
        app.admin()
            .list_grants(pb::ListGrantsRequest {
                scope: pb::Scope::Once as i32,
                ..Default::default()
            })
            .await,
        Code::InvalidArgument,
        "scope",
    );
}

async fn repeating_a_remembered_decision_returns_its_grant_and_makes_no_other(app: TestApp) {
    submit_one(&app, "s", call("c1", "shell", GIT_STATUS)).await;
    let first = decide_remembering(
        &app,
        "s",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Always,
        None,
    )
    .await;
    let again = decide_remembering(
        &app,
        "s",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Always,
        None,
    )
    .await;
    assert!(!first.replayed && again.replayed);
    assert_eq!(
        again.grant, first.grant,
        "the retry learns the grant it made"
    );
    assert_eq!(list_grants(&app, Default::default()).await.len(), 1);
}

async fn an_edited_approval_cannot_be_remembered(app: TestApp) {
    submit_one(
        &app,
        "s",
        call("c1", "shell", r#"{"command":"rm -rf build"}"#),
    )
    .await;
    let mut request = decide_request("s", "c1", pb::Decision::Approve, "");
    request.edited_input_json = r#"{"command":"rm -rf build/tmp"}"#.into();
    request.scope = pb::Scope::Session as i32;
    assert_status(
        app.approver().decide(request).await,
        Code::InvalidArgument,
        "scope",
    );
}

/// A hostile glob: an approver's grant matcher is judged against every pending call it may cover. A
/// glob that backtracking matched in quadratic time held the one SQLite writer for seconds; now
/// matching is linear and done before the decision reaches the writer, so an unrelated submit
/// sent meanwhile is answered at once (the one-second bound tells "not stalled" from seconds).
async fn an_adversarial_grant_matcher_does_not_stall_an_unrelated_submit(app: TestApp) {
    let text = "a".repeat(256 * 1024 - 16);
    let mut calls: Vec<pb::CallSpec> = (0..8)
        .map(|i| call(&format!("big{i}"), "t", &format!(r#"{{"x":"{text}"}}"#)))
        .collect();
    calls.push(call(
        "ends-in-b",
        "t",
        &format!(r#"{{"x":"{}b"}}"#, &text[1..]),
    ));
    calls.push(call("decided", "t", r#"{"x":"small"}"#));
    let mut pending = batch("s", calls);
    pending.on_deny = pb::OnDeny::Independent as i32;
    submit(&app, pending).await;
    let wild = format!("*{}?b*", "a".repeat(1019));
    let mut request = decide_request("s", "decided", pb::Decision::Approve, "remembered");
    request.scope = pb::Scope::Session as i32;
    request.matcher = Some(fields(vec![glob("x", &wild)]));
    let mut approver = app.approver();
    let deciding =
        tokio::spawn(async move { approver.decide(request).await.expect("decide").into_inner() });
    // Let the decision arrive and start being judged.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_an_unrelated_submit_is_not_stalled(&app, "grant").await;
    let decided = deciding.await.expect("the decision");
    let by_grant: Vec<&str> = decided
        .decided_by_grant
        .iter()
        .map(|o| o.call_id.as_str())
        .collect();
    assert_eq!(
        by_grant,
        ["ends-in-b"],
        "the grant really matched the large inputs"
    );
}

backend_tests! {
    an_adversarial_grant_matcher_does_not_stall_an_unrelated_submit,
    a_session_grant_decides_later_calls_of_that_session_only,
    a_workspace_grant_decides_later_calls_in_that_workspace_only,
    a_workspace_scope_needs_a_call_with_a_workspace,
    an_always_grant_decides_every_later_call_of_the_agent,
    a_once_decision_remembers_nothing,
    a_remembered_denial_denies_later_calls_with_its_reason,
    each_matcher_decides_exactly_the_inputs_it_describes,
    pending_calls_a_new_grant_matches_are_decided_at_once,
    a_new_deny_grant_skips_the_rest_of_the_batches_it_denies_in,
    a_grant_expiry_must_be_in_the_future,
    a_grant_decides_until_it_expires_and_nothing_after,
    a_revoked_grant_decides_nothing_after,
    resetting_a_session_revokes_its_session_grants_and_nothing_else,
    resetting_a_workspace_revokes_its_workspace_grants_and_nothing_else,
    grants_are_listed_filtered_and_paged,
    repeating_a_remembered_decision_returns_its_grant_and_makes_no_other,
    an_edited_approval_cannot_be_remembered,
}
