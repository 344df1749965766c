//! Operators' policy rules: deny, allow or ask, by tool glob and input matcher, applied at
//! submit with the precedence deny rules, allow and ask rules by priority, grants, a human;
//! managed through AdminService and loaded from the policy file at start.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

fn pending() -> (CallStatus, String) {
    (CallStatus::Pending, String::new())
}

fn by(status: CallStatus, decided_by: &str) -> (CallStatus, String) {
    (status, decided_by.to_owned())
}

async fn a_deny_rule_denies_matching_calls_at_submit_naming_itself(app: TestApp) {
    let mut no_force = rule(
        "no-force-push",
        "shell",
        pb::Effect::Deny,
        0,
        Some(fields(vec![glob("command", "git push*--force*")])),
    );
    no_force.description = "force-pushing rewrites history".into();
    create_rule(&app, no_force).await;
    let response = submit(
        &app,
        batch(
            "s",
            vec![call(
                "c1",
                "shell",
                r#"{"command":"git push origin main --force"}"#,
            )],
        ),
    )
    .await;
    assert_eq!(ack_status(&response, 0), CallStatus::Denied);
    let outcome = &response.outcomes[0];
    assert_eq!(outcome.decided_by, "policy:no-force-push");
    assert_eq!(outcome.reason, "force-pushing rewrites history");
    assert_eq!(
        outcome.tool_result,
        "A policy rule denied this tool call. Reason: force-pushing rewrites history"
    );
    assert_eq!(
        submitted_one(&app, "s", call("c2", "shell", r#"{"command":"git push"}"#)).await,
        pending()
    );
}

async fn an_allow_rule_approves_matching_calls_at_submit(app: TestApp) {
    create_rule(&app, rule("reads", "read_*", pb::Effect::Allow, 0, None)).await;
    let response = submit(
        &app,
        batch("s", vec![call("c1", "read_file", r#"{"path":"a.txt"}"#)]),
    )
    .await;
    assert_eq!(ack_status(&response, 0), CallStatus::Approved);
    assert_eq!(response.outcomes[0].decided_by, "policy:reads");
    assert_eq!(response.outcomes[0].input_json, r#"{"path":"a.txt"}"#);
    assert_eq!(
        submitted_one(&app, "s", call("c2", "write_file", r#"{"path":"a.txt"}"#)).await,
        pending()
    );
}

async fn deny_rules_come_first_then_allow_rules_then_grants_then_a_human(app: TestApp) {
    // A grant for every shell call of the agent.
    submit(
        &app,
        batch("s", vec![call("g", "shell", r#"{"command":"ls"}"#)]),
    )
    .await;
    let grant = grant_by_deciding(
        &app,
        "s",
        "g",
        pb::Decision::Approve,
        pb::Scope::Always,
        Some(any_input()),
    )
    .await;
    let by_grant = format!("grant:{}", grant.id);
    let rm = r#"{"command":"rm -rf /"}"#;
    let ls = r#"{"command":"ls"}"#;
    assert_eq!(
        submitted_one(&app, "s", call("c1", "shell", rm)).await,
        by(CallStatus::Approved, &by_grant)
    );

    create_rule(
        &app,
        rule("allow-shell", "shell", pb::Effect::Allow, 50, None),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", call("c2", "shell", ls)).await,
        by(CallStatus::Approved, "policy:allow-shell"),
        "an allow rule before a grant"
    );
    create_rule(
        &app,
        rule(
            "deny-rm",
            "sh*",
            pb::Effect::Deny,
            -10,
            Some(fields(vec![prefix("command", "rm ")])),
        ),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", call("c3", "shell", rm)).await,
        by(CallStatus::Denied, "policy:deny-rm"),
        "a deny rule before allow rules of any priority, and grants"
    );
    assert_eq!(
        submitted_one(&app, "s", call("c4", "shell", ls)).await,
        by(CallStatus::Approved, "policy:allow-shell")
    );

    // Between grants: deny before allow (whichever is older).
    submit(
        &app,
        batch("s", vec![call("g3", "tool_x", r#"{"danger":true}"#)]),
    )
    .await;
    let deny = grant_by_deciding(
        &app,
        "s",
        "g3",
        pb::Decision::Deny,
        pb::Scope::Session,
        Some(fields(vec![equals_json("danger", "true")])),
    )
    .await;
    submit(&app, batch("s", vec![call("g2", "tool_x", "{}")])).await;
    let allow = grant_by_deciding(
        &app,
        "s",
        "g2",
        pb::Decision::Approve,
        pb::Scope::Always,
        Some(any_input()),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", call("c5", "tool_x", r#"{"danger":true}"#)).await,
        by(CallStatus::Denied, &format!("grant:{}", deny.id))
    );
    assert_eq!(
        submitted_one(&app, "s", call("c6", "tool_x", r#"{"danger":false}"#)).await,
        by(CallStatus::Approved, &format!("grant:{}", allow.id))
    );
    assert_eq!(
        submitted_one(&app, "s", call("c7", "tool_y", "{}")).await,
        pending(),
        "nothing matches: a human decides"
    );
}

async fn an_ask_rule_sends_calls_to_a_human_ahead_of_grants_and_lower_allow_rules(app: TestApp) {
    let prod = r#"{"env":"prod"}"#;
    submit(
        &app,
        batch("s", vec![call("g", "deploy", r#"{"env":"dev"}"#)]),
    )
    .await;
    decide_remembering(
        &app,
        "s",
        "g",
        pb::Decision::Approve,
        pb::Scope::Always,
        Some(any_input()),
    )
    .await;
    create_rule(
        &app,
        rule(
            "ask-prod",
            "deploy",
            pb::Effect::Ask,
            5,
            Some(fields(vec![equals("env", "prod")])),
        ),
    )
    .await;
    create_rule(
        &app,
        rule("allow-deploy", "deploy", pb::Effect::Allow, 5, None),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", call("p1", "deploy", prod)).await,
        pending(),
        "ask beats the grant, and an allow rule of equal priority"
    );
    assert_eq!(
        submitted_one(&app, "s", call("d1", "deploy", r#"{"env":"dev"}"#)).await,
        by(CallStatus::Approved, "policy:allow-deploy")
    );
    let explained = explain_stored(&app, "s", "p1").await;
    assert_eq!(explained.verdict, CallStatus::Pending as i32);
    assert_eq!(explained.rule.expect("the ask rule").id, "ask-prod");

    // A new grant covering the pending call leaves it to the human too.
    submit(&app, batch("s2", vec![call("p0", "deploy", prod)])).await;
    let decided = decide_remembering(
        &app,
        "s2",
        "p0",
        pb::Decision::Approve,
        pb::Scope::Always,
        Some(any_input()),
    )
    .await;
    assert!(decided.decided_by_grant.is_empty());
    assert!(matches!(
        states(&app, "s", &["p1"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));

    create_rule(
        &app,
        rule(
            "urgent",
            "deploy",
            pb::Effect::Allow,
            6,
            Some(fields(vec![equals("env", "prod")])),
        ),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", call("p2", "deploy", prod)).await,
        by(CallStatus::Approved, "policy:urgent"),
        "a higher-priority allow beats the ask"
    );
    create_rule(&app, rule("freeze", "*", pb::Effect::Deny, -100, None)).await;
    assert_eq!(
        submitted_one(&app, "s", call("p3", "deploy", prod)).await,
        by(CallStatus::Denied, "policy:freeze")
    );
}

async fn rules_are_created_listed_in_precedence_order_and_deleted(app: TestApp) {
    let created = create_rule(&app, rule("b-allow", "t", pb::Effect::Allow, 1, None)).await;
    assert_eq!(created.source, "admin");
    assert!(created.created_at.is_some());
    assert_eq!(
        created.matcher,
        Some(any_input()),
        "no matcher means any input"
    );
    let again = create_rule(&app, rule("b-allow", "t", pb::Effect::Allow, 1, None)).await;
    assert_eq!(again, created, "the same rule again is a repeat");
    assert_status(
        app.admin()
            .create_rule(pb::CreateRuleRequest {
                rule: Some(rule("b-allow", "t", pb::Effect::Deny, 1, None)),
            })
            .await,
        Code::AlreadyExists,
        "b-allow",
    );
    create_rule(&app, rule("a-ask", "t", pb::Effect::Ask, 1, None)).await;
    create_rule(&app, rule("c-allow", "t", pb::Effect::Allow, 9, None)).await;
    create_rule(&app, rule("z-deny", "t", pb::Effect::Deny, -9, None)).await;
    let listed = app
        .admin()
        .list_rules(pb::ListRulesRequest::default())
        .await
        .expect("list")
        .into_inner()
        .rules;
    let ids: Vec<&str> = listed.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["z-deny", "c-allow", "a-ask", "b-allow"]);

    let deleted = app
        .admin()
        .delete_rule(pb::DeleteRuleRequest {
            id: "z-deny".into(),
        })
        .await
        .expect("delete")
        .into_inner();
    assert_eq!(deleted.id, "z-deny");
    assert_eq!(
        submitted_one(&app, "s", call("c1", "t", "{}")).await,
        by(CallStatus::Approved, "policy:c-allow"),
        "a deleted rule decides nothing"
    );
    assert_status(
        app.admin()
            .delete_rule(pb::DeleteRuleRequest {
                id: "z-deny".into(),
            })
            .await,
        Code::NotFound,
        "z-deny",
    );
}

async fn invalid_rules_are_refused_naming_the_field(app: TestApp) {
    let cases = [
        (rule("", "t", pb::Effect::Deny, 0, None), "rule.id"),
        (rule("has space", "t", pb::Effect::Deny, 0, None), "rule.id"),
        (rule("r", "", pb::Effect::Deny, 0, None), "rule.tool"),
        (
            rule("r", "t", pb::Effect::Unspecified, 0, None),
            "rule.effect",
        ),
        (
            rule(
                "r",
                "t",
                pb::Effect::Deny,
                0,
                Some(fields(vec![glob("path", "")])),
            ),
            "rule.matcher.fields.conditions[0].glob",
        ),
        (
            rule("r", "t", pb::Effect::Deny, 0, Some(fields(vec![]))),
            "rule.matcher.fields.conditions",
        ),
        (
            rule("r", "t", pb::Effect::Deny, 0, Some(exact_input(""))),
            "rule.matcher.exact_json",
        ),
    ];
    for (bad, field) in cases {
        let result = app
            .admin()
            .create_rule(pb::CreateRuleRequest { rule: Some(bad) })
            .await;
        assert_status(result, Code::InvalidArgument, field);
    }
    let rules = app
        .admin()
        .list_rules(pb::ListRulesRequest::default())
        .await
        .expect("list")
        .into_inner()
        .rules;
    assert!(rules.is_empty());
}

async fn a_rule_applies_to_calls_submitted_after_it_exists(app: TestApp) {
    submit(&app, batch("s", vec![call("before", "t", "{}")])).await;
    create_rule(&app, rule("allow-t", "t", pb::Effect::Allow, 0, None)).await;
    assert!(matches!(
        states(&app, "s", &["before"]).await[0].state,
        Some(pb::call_state::State::Pending(_))
    ));
    let explained = explain_stored(&app, "s", "before").await;
    assert_eq!(
        (explained.verdict, explained.decided_by.as_str()),
        (CallStatus::Approved as i32, "policy:allow-t"),
        "Explain says what a submit now would get"
    );
    assert_eq!(
        explained.call.expect("the stored call").status,
        CallStatus::Pending as i32
    );
    assert_eq!(
        submitted_one(&app, "s", call("after", "t", "{}")).await,
        by(CallStatus::Approved, "policy:allow-t")
    );
}

async fn a_denial_at_submit_skips_the_rest_of_its_batch_like_a_person_would(app: TestApp) {
    create_rule(&app, rule("no-rm", "rm", pb::Effect::Deny, 0, None)).await;
    create_rule(&app, rule("reads", "read_file", pb::Effect::Allow, 0, None)).await;
    let mut agent = AgentStream::open(&app).await;
    agent
        .submit(
            "r1",
            batch(
                "s",
                vec![
                    call("a", "ask_me", "{}"),
                    call("b", "rm", "{}"),
                    call("c", "ask_me", "{}"),
                ],
            ),
        )
        .await;
    let response = agent.next_submitted().await;
    let statuses: Vec<_> = (0..3).map(|i| ack_status(&response, i)).collect();
    assert_eq!(
        statuses,
        [CallStatus::Skipped, CallStatus::Denied, CallStatus::Skipped]
    );
    assert_eq!(response.outcomes.len(), 3);
    let mut pushed = vec![
        agent.next_outcome().await.call_id,
        agent.next_outcome().await.call_id,
        agent.next_outcome().await.call_id,
    ];
    pushed.sort();
    assert_eq!(pushed, ["a", "b", "c"]);
    let complete = agent.next_batch_complete().await;
    let order: Vec<_> = complete
        .outcomes
        .iter()
        .map(|o| o.call_id.as_str())
        .collect();
    assert_eq!(order, ["a", "b", "c"]);

    let independent = pb::BatchSpec {
        on_deny: pb::OnDeny::Independent as i32,
        ..batch(
            "s",
            vec![
                call("d", "ask_me", "{}"),
                call("e", "rm", "{}"),
                call("f", "read_file", "{}"),
            ],
        )
    };
    agent.submit("r2", independent).await;
    let response = agent.next_submitted().await;
    let statuses: Vec<_> = (0..3).map(|i| ack_status(&response, i)).collect();
    assert_eq!(
        statuses,
        [
            CallStatus::Pending,
            CallStatus::Denied,
            CallStatus::Approved
        ]
    );
}

/// Calls a rule decides as they arrive are stored decided, but a denial that skips the rest of
/// the batch still outranks a rule that would approve a later call, as a person's denial would:
/// approved, denied, skipped. Submitted again, each is the stored call with its outcome
/// (idempotent), and the approved one runs its input as submitted.
async fn rule_outcomes_before_and_after_a_denial_at_submit_are_a_persons(app: TestApp) {
    create_rule(&app, rule("no-rm", "rm", pb::Effect::Deny, 0, None)).await;
    create_rule(&app, rule("reads", "read_file", pb::Effect::Allow, 0, None)).await;
    let spec = batch(
        "s",
        vec![
            call("g", "read_file", r#"{"path":"a"}"#),
            call("h", "rm", "{}"),
            call("i", "read_file", r#"{"path":"b"}"#),
        ],
    );
    for attempt in ["first", "again"] {
        let response = submit(&app, spec.clone()).await;
        let statuses: Vec<_> = (0..3).map(|i| ack_status(&response, i)).collect();
        assert_eq!(
            statuses,
            [
                CallStatus::Approved,
                CallStatus::Denied,
                CallStatus::Skipped
            ],
            "{attempt}"
        );
    }
    let g = outcome_of(&app, "s", "g").await;
    assert_eq!(
        (g.decided_by.as_str(), g.input_json.as_str()),
        ("policy:reads", r#"{"path":"a"}"#)
    );
    assert_eq!(outcome_of(&app, "s", "i").await.decided_by, "broker");
}

/// An approval stored without its input to run (as SQLite stores an approval of the input as
/// submitted, and as a Postgres replica may find one) runs the call's own input.
async fn an_approval_stored_without_its_input_to_run_runs_the_calls_own_input(app: TestApp) {
    create_rule(&app, rule("reads", "read_file", pb::Effect::Allow, 0, None)).await;
    let response = submit(
        &app,
        batch("s", vec![call("g", "read_file", r#"{"path":"a"}"#)]),
    )
    .await;
    assert_eq!(ack_status(&response, 0), CallStatus::Approved);
    app.run_sql("UPDATE calls SET run_input = NULL").await;
    let g = outcome_of(&app, "s", "g").await;
    assert_eq!(g.input_json, r#"{"path":"a"}"#);
    assert!(!g.input_edited);
}

/// Who the agent acts for is stored with every call, one a rule decides as it arrives too
/// (`Call.requested_by`, as the API documents it).
async fn a_call_a_rule_decides_keeps_who_the_agent_acts_for(app: TestApp) {
    create_rule(&app, rule("reads", "read_file", pb::Effect::Allow, 0, None)).await;
    let spec = pb::CallSpec {
        requested_by: "carol".into(),
        ..call("g", "read_file", r#"{"path":"a"}"#)
    };
    let response = submit(&app, batch("s", vec![spec])).await;
    assert_eq!(ack_status(&response, 0), CallStatus::Approved);
    let stored = get_call(&app, "s", "g").await;
    assert_eq!(stored.status, CallStatus::Approved as i32);
    assert_eq!(stored.requested_by, "carol");
}

/// Writes a policy file in the app's directory and returns its path.
fn policy_file(dir: &std::path::Path, name: &str, json: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, json).expect("write the policy file");
    path
}

async fn the_policy_file_is_loaded_at_start_and_replaces_the_rules_it_loaded_before(app: TestApp) {
    {
        let v1 = policy_file(
            app.dir.path(),
            "v1.json",
            r#"{"rules": [
                {"id": "no-rm", "tool": "shell", "effect": "deny", "priority": 10,
                 "match": {"fields": [{"field": "command", "prefix": "rm "}]},
                 "description": "no deleting"},
                {"id": "reads", "tool": "read_*", "effect": "allow"}
            ]}"#,
        );
        let app = app.restart_with(|c| c.policy.policy_file = Some(v1)).await;
        let rules = app
            .admin()
            .list_rules(pb::ListRulesRequest::default())
            .await
            .expect("list")
            .into_inner()
            .rules;
        let loaded: Vec<_> = rules
            .iter()
            .map(|r| (r.id.as_str(), r.source.as_str()))
            .collect();
        assert_eq!(loaded, [("no-rm", "file"), ("reads", "file")]);
        assert_eq!(
            submitted_one(&app, "s", call("c1", "shell", r#"{"command":"rm -rf x"}"#)).await,
            by(CallStatus::Denied, "policy:no-rm")
        );
        assert_eq!(
            submitted_one(&app, "s", call("c2", "read_file", "{}")).await,
            by(CallStatus::Approved, "policy:reads")
        );
        create_rule(&app, rule("by-hand", "t", pb::Effect::Allow, 0, None)).await;

        // A new file: its rules replace the old file's; rules made by hand stay.
        let v2 = policy_file(
            app.dir.path(),
            "v2.json",
            r#"{"rules": [{"id": "reads", "tool": "read_*", "effect": "deny"},
                          {"id": "writes", "tool": "write_*", "effect": "ask"}]}"#,
        );
        let app = app.restart_with(|c| c.policy.policy_file = Some(v2)).await;
        let ids = |rules: Vec<pb::Rule>| {
            let mut ids: Vec<(String, i32)> = rules.into_iter().map(|r| (r.id, r.effect)).collect();
            ids.sort();
            ids
        };
        let list = |app: &TestApp| {
            let mut admin = app.admin();
            async move {
                admin
                    .list_rules(pb::ListRulesRequest::default())
                    .await
                    .expect("list")
                    .into_inner()
                    .rules
            }
        };
        let expected = vec![
            ("by-hand".to_owned(), pb::Effect::Allow as i32),
            ("reads".to_owned(), pb::Effect::Deny as i32),
            ("writes".to_owned(), pb::Effect::Ask as i32),
        ];
        assert_eq!(ids(list(&app).await), expected);
        assert_eq!(
            submitted_one(&app, "s", call("c3", "shell", r#"{"command":"rm -rf x"}"#)).await,
            pending()
        );
        // Started without a file, the broker keeps the rules it has.
        let app = app.restart_with(|_| {}).await;
        assert_eq!(ids(list(&app).await), expected);
    }
}

/// A hostile glob: a 1,024-byte glob that backtracking matched in quadratic time (`*aaa…ab` against
/// 256 KiB of `a`: 0.46 s a call in a release build) held the one SQLite writer for seconds, and
/// every other submit waited. Matching is linear now, and done before the batch reaches the
/// writer: an unrelated submit sent while such a batch is being judged is answered at once. The
/// bound (one second, against many seconds of stall before) tells "not stalled" from "stalled".
async fn an_adversarial_glob_rule_does_not_stall_an_unrelated_submit(app: TestApp) {
    let run = "a".repeat(1022);
    // One rule takes the plain suffix path, the other (a `?` between stars) the shift-and scan.
    create_rule(
        &app,
        rule(
            "suffix",
            "*",
            pb::Effect::Deny,
            0,
            Some(fields(vec![glob("x", &format!("*{run}b"))])),
        ),
    )
    .await;
    let wild = format!("*{}?b*", &run[..1019]);
    create_rule(
        &app,
        rule(
            "wild",
            "*",
            pb::Effect::Deny,
            0,
            Some(fields(vec![glob("x", &wild)])),
        ),
    )
    .await;
    let text = "a".repeat(256 * 1024 - 16);
    let mut calls: Vec<pb::CallSpec> = (0..8)
        .map(|i| call(&format!("big{i}"), "t", &format!(r#"{{"x":"{text}"}}"#)))
        .collect();
    // The last one ends in `b`: the suffix rule denies it, so the rules really ran.
    calls.push(call(
        "ends-in-b",
        "t",
        &format!(r#"{{"x":"{}b"}}"#, &text[1..]),
    ));
    let mut big = batch("adversarial", calls);
    big.on_deny = pb::OnDeny::Independent as i32;
    let mut agent = app.agent();
    let adversarial = tokio::spawn(async move {
        agent
            .submit(pb::SubmitRequest { batch: Some(big) })
            .await
            .expect("submit")
            .into_inner()
    });
    // Let the large batch arrive and start being judged.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_an_unrelated_submit_is_not_stalled(&app, "batch").await;
    let response = adversarial.await.expect("the adversarial submit");
    for i in 0..8 {
        assert_eq!(ack_status(&response, i), CallStatus::Pending, "big{i}");
    }
    assert_eq!(ack_status(&response, 8), CallStatus::Denied);
    assert_eq!(
        response.outcomes.last().map(|o| o.decided_by.as_str()),
        Some("policy:suffix")
    );
}

backend_tests! {
    an_adversarial_glob_rule_does_not_stall_an_unrelated_submit,
    the_policy_file_is_loaded_at_start_and_replaces_the_rules_it_loaded_before,
    a_deny_rule_denies_matching_calls_at_submit_naming_itself,
    an_allow_rule_approves_matching_calls_at_submit,
    deny_rules_come_first_then_allow_rules_then_grants_then_a_human,
    an_ask_rule_sends_calls_to_a_human_ahead_of_grants_and_lower_allow_rules,
    rules_are_created_listed_in_precedence_order_and_deleted,
    invalid_rules_are_refused_naming_the_field,
    a_rule_applies_to_calls_submitted_after_it_exists,
    a_denial_at_submit_skips_the_rest_of_its_batch_like_a_person_would,
    rule_outcomes_before_and_after_a_denial_at_submit_are_a_persons,
    an_approval_stored_without_its_input_to_run_runs_the_calls_own_input,
    a_call_a_rule_decides_keeps_who_the_agent_acts_for,
}
