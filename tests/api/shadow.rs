//! Rules in shadow, and replaying a candidate rule against history: a shadow rule never decides,
//! what it would have done is recorded with each call and shown in the audit (GetCall), in
//! Explain and in a metric; a disabled rule is ignored; ReplayRule counts exactly, pages sum to
//! the whole, refuses what is out of bounds naming the field, and writes nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use approval_broker::proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

use crate::helpers::*;

fn mode(rule: pb::Rule, mode: pb::RuleMode) -> pb::Rule {
    pb::Rule {
        mode: mode as i32,
        ..rule
    }
}

/// A rule on `shell` calls whose `command` starts with `prefix`.
fn shell_rule(id: &str, effect: pb::Effect, command_prefix: &str) -> pb::Rule {
    rule(
        id,
        "shell",
        effect,
        0,
        Some(fields(vec![prefix("command", command_prefix)])),
    )
}

fn shell(call_id: &str, command: &str) -> pb::CallSpec {
    call(
        call_id,
        "shell",
        &serde_json::json!({ "command": command }).to_string(),
    )
}

/// (rule id, verdict) of each shadow verdict.
fn verdicts(list: &[pb::ShadowVerdict]) -> Vec<(String, CallStatus)> {
    list.iter()
        .map(|v| {
            (
                v.rule_id.clone(),
                CallStatus::try_from(v.verdict).expect("known"),
            )
        })
        .collect()
}

fn verdict(rule: &str, status: CallStatus) -> Vec<(String, CallStatus)> {
    vec![(rule.to_owned(), status)]
}

async fn a_shadow_rule_never_decides_and_its_verdict_shows_in_the_audit_and_explain(app: TestApp) {
    create_rule(
        &app,
        mode(
            shell_rule("no-rm", pb::Effect::Deny, "rm"),
            pb::RuleMode::Shadow,
        ),
    )
    .await;
    create_rule(
        &app,
        mode(
            shell_rule("ls-ok", pb::Effect::Allow, "ls"),
            pb::RuleMode::Shadow,
        ),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", shell("c1", "rm -rf build"))
            .await
            .0,
        CallStatus::Pending,
        "a shadow deny rule decides nothing"
    );
    assert_eq!(
        submitted_one(&app, "s", shell("c2", "ls -la")).await.0,
        CallStatus::Pending,
        "a shadow allow rule decides nothing"
    );
    assert_eq!(
        submitted_one(&app, "s", shell("c3", "git status")).await.0,
        CallStatus::Pending
    );

    let c1 = get_call(&app, "s", "c1").await;
    assert_eq!(
        verdicts(&c1.shadow_verdicts),
        verdict("no-rm", CallStatus::Denied)
    );
    assert_eq!(
        verdicts(&get_call(&app, "s", "c2").await.shadow_verdicts),
        verdict("ls-ok", CallStatus::Approved)
    );
    assert!(
        get_call(&app, "s", "c3").await.shadow_verdicts.is_empty(),
        "no shadow rule matches"
    );

    let explained = explain_stored(&app, "s", "c1").await;
    assert_eq!(explained.verdict, CallStatus::Pending as i32);
    assert_eq!(explained.decided_by, "");
    assert_eq!(
        verdicts(&explained.shadow_verdicts),
        verdict("no-rm", CallStatus::Denied)
    );
    assert!(
        explained.shadow_verdicts[0].reason.contains("no-rm"),
        "{:?}",
        explained.shadow_verdicts
    );
    assert_eq!(
        verdicts(&explained.call.expect("the stored call").shadow_verdicts),
        verdict("no-rm", CallStatus::Denied),
        "what was recorded at submit"
    );
    let inline = explain_inline(&app, "s", "", "shell", r#"{"command":"ls"}"#).await;
    assert_eq!(inline.verdict, CallStatus::Pending as i32);
    assert_eq!(
        verdicts(&inline.shadow_verdicts),
        verdict("ls-ok", CallStatus::Approved)
    );

    // A person approves what the shadow rule would have denied: the audit shows both.
    approve(&app, "s", "c1").await;
    let c1 = get_call(&app, "s", "c1").await;
    let outcome = c1.outcome.expect("decided");
    assert_eq!(outcome.status, CallStatus::Approved as i32);
    assert_eq!(outcome.decided_by, "approver:alice@example.com");
    assert_eq!(
        verdicts(&c1.shadow_verdicts),
        verdict("no-rm", CallStatus::Denied)
    );

    let rules = app
        .admin()
        .list_rules(pb::ListRulesRequest::default())
        .await
        .expect("list rules")
        .into_inner()
        .rules;
    assert!(
        rules.iter().all(|r| r.mode == pb::RuleMode::Shadow as i32),
        "{rules:?}"
    );
}

async fn a_shadow_rule_is_recorded_only_where_enforcing_it_would_rule_the_call(app: TestApp) {
    let mut enforced = shell_rule("deny-rm", pb::Effect::Deny, "rm");
    enforced.priority = 5;
    create_rule(&app, enforced).await;
    create_rule(
        &app,
        mode(
            rule("allow-all-shell", "shell", pb::Effect::Allow, 0, None),
            pb::RuleMode::Shadow,
        ),
    )
    .await;
    // The enforced deny rule decides, and would still decide with the shadow allow rule on.
    assert_eq!(
        submitted_one(&app, "s", shell("c1", "rm x")).await.0,
        CallStatus::Denied
    );
    assert!(get_call(&app, "s", "c1").await.shadow_verdicts.is_empty());
    // Where nothing enforced rules, the shadow rule would have.
    assert_eq!(
        submitted_one(&app, "s", shell("c2", "ls")).await.0,
        CallStatus::Pending
    );
    assert_eq!(
        verdicts(&get_call(&app, "s", "c2").await.shadow_verdicts),
        verdict("allow-all-shell", CallStatus::Approved)
    );
}

async fn a_disabled_rule_is_ignored_by_submit_and_explain(app: TestApp) {
    create_rule(
        &app,
        mode(
            shell_rule("no-rm", pb::Effect::Deny, "rm"),
            pb::RuleMode::Disabled,
        ),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", shell("c1", "rm -rf /")).await.0,
        CallStatus::Pending
    );
    assert!(get_call(&app, "s", "c1").await.shadow_verdicts.is_empty());
    let explained = explain_stored(&app, "s", "c1").await;
    assert_eq!(explained.verdict, CallStatus::Pending as i32);
    assert!(explained.rule.is_none(), "{:?}", explained.rule);
    assert!(explained.shadow_verdicts.is_empty());
}

async fn set_rule_mode_moves_a_rule_between_shadow_enforce_and_disabled(app: TestApp) {
    create_rule(
        &app,
        mode(
            shell_rule("ls-ok", pb::Effect::Allow, "ls"),
            pb::RuleMode::Shadow,
        ),
    )
    .await;
    assert_eq!(
        submitted_one(&app, "s", shell("c1", "ls")).await.0,
        CallStatus::Pending
    );
    let set = |id: &str, mode: pb::RuleMode| pb::SetRuleModeRequest {
        id: id.into(),
        mode: mode as i32,
    };
    let enforced = app
        .admin()
        .set_rule_mode(set("ls-ok", pb::RuleMode::Enforce))
        .await
        .expect("set mode")
        .into_inner();
    assert_eq!(enforced.mode, pb::RuleMode::Enforce as i32);
    assert_eq!(
        submitted_one(&app, "s", shell("c2", "ls")).await.0,
        CallStatus::Approved
    );
    assert_eq!(outcome_of(&app, "s", "c2").await.decided_by, "policy:ls-ok");
    app.admin()
        .set_rule_mode(set("ls-ok", pb::RuleMode::Disabled))
        .await
        .expect("set mode");
    assert_eq!(
        submitted_one(&app, "s", shell("c3", "ls")).await.0,
        CallStatus::Pending
    );
    assert_status(
        app.admin()
            .set_rule_mode(set("nope", pb::RuleMode::Shadow))
            .await,
        Code::NotFound,
        "nope",
    );
    assert_status(
        app.admin()
            .set_rule_mode(pb::SetRuleModeRequest {
                id: "ls-ok".into(),
                mode: 9,
            })
            .await,
        Code::InvalidArgument,
        "mode",
    );
    assert_status(
        app.admin()
            .create_rule(pb::CreateRuleRequest {
                rule: Some(pb::Rule {
                    mode: 7,
                    ..shell_rule("x", pb::Effect::Allow, "x")
                }),
            })
            .await,
        Code::InvalidArgument,
        "rule.mode",
    );
}

async fn the_policy_file_sets_a_rules_mode(app: TestApp) {
    let path = app.dir.path().join("policy.json");
    std::fs::write(
        &path,
        r#"{"rules": [{"id": "tried", "tool": "shell", "effect": "deny", "mode": "shadow"}]}"#,
    )
    .expect("write the policy file");
    let app = app
        .restart_with(|c| c.policy.policy_file = Some(path))
        .await;
    assert_eq!(
        submitted_one(&app, "s", shell("c1", "rm")).await.0,
        CallStatus::Pending
    );
    assert_eq!(
        verdicts(&get_call(&app, "s", "c1").await.shadow_verdicts),
        verdict("tried", CallStatus::Denied)
    );
}

/// A range around now, as a replay request's `from` and `to`.
fn around_now() -> (prost_types::Timestamp, prost_types::Timestamp) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let at = |seconds| prost_types::Timestamp { seconds, nanos: 0 };
    (at(now - 3600), at(now + 3600))
}

fn replay_request(
    candidate: pb::Rule,
    page_size: u32,
    page_token: String,
) -> pb::ReplayRuleRequest {
    let (from, to) = around_now();
    pb::ReplayRuleRequest {
        candidate: Some(candidate),
        from: Some(from),
        to: Some(to),
        page_size,
        page_token,
    }
}

/// Every page of a replay, following `next_page_token` to the end.
async fn replay_pages(
    app: &TestApp,
    candidate: &pb::Rule,
    page_size: u32,
) -> Vec<pb::ReplayRuleResponse> {
    testkit::every_page(|token| {
        let mut admin = app.admin();
        let request = replay_request(candidate.clone(), page_size, token);
        async move {
            let page = admin
                .replay_rule(request)
                .await
                .expect("replay")
                .into_inner();
            let next = page.next_page_token.clone();
            (page, next)
        }
    })
    .await
}

/// The counts of a replay page: calls, would approve, would deny, left to a human, agree,
/// disagree.
fn counts(page: &pb::ReplayRuleResponse) -> [u64; 6] {
    [
        page.calls,
        page.would_approve,
        page.would_deny,
        page.left_to_human,
        page.agree,
        page.disagree,
    ]
}

/// Known history, each call in a batch of its own: a person approved `ls`, denied `ls -la` and
/// `rm x`; the agent cancelled `ls tmp`; `ls again` is still pending.
async fn known_history(app: &TestApp) {
    for (id, command) in [
        ("a1", "ls"),
        ("a2", "ls -la"),
        ("a3", "rm x"),
        ("a4", "ls tmp"),
        ("a5", "ls again"),
    ] {
        assert_eq!(
            submitted_one(app, "h", shell(id, command)).await.0,
            CallStatus::Pending
        );
    }
    approve(app, "h", "a1").await;
    deny(app, "h", "a2", "too much").await;
    deny(app, "h", "a3", "no").await;
    app.agent()
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: "h".into(),
                target: Some(pb::cancel_target::Target::Calls(pb::CallIds {
                    call_ids: vec!["a4".into()],
                })),
                reason: String::new(),
            }),
        })
        .await
        .expect("cancel");
}

async fn replay_counts_and_samples_are_exact_on_known_decisions(app: TestApp) {
    known_history(&app).await;
    let allow_ls = shell_rule("allow-ls", pb::Effect::Allow, "ls");
    let pages = replay_pages(&app, &allow_ls, 100).await;
    assert_eq!(pages.len(), 1);
    let page = &pages[0];
    // a1, a2, a4 would be approved; a3 left to a human; the pending a5 is not a decided call.
    // a1 agrees (approved by a person); a2 disagrees (denied by a person); a4 was cancelled.
    assert_eq!(counts(page), [4, 3, 0, 1, 1, 1]);
    assert_eq!(
        page.samples,
        [pb::ReplayDisagreement {
            agent: "default".into(),
            session_id: "h".into(),
            call_id: "a2".into(),
            actual: CallStatus::Denied as i32,
            decided_by: "approver:alice@example.com".into(),
            would: CallStatus::Approved as i32,
        }]
    );

    let deny_ls = shell_rule("", pb::Effect::Deny, "ls");
    let page = &replay_pages(&app, &deny_ls, 100).await[0];
    assert_eq!(counts(page), [4, 0, 3, 1, 1, 1]);
    assert_eq!(page.samples[0].call_id, "a1");
    assert_eq!(page.samples[0].actual, CallStatus::Approved as i32);
    assert_eq!(page.samples[0].would, CallStatus::Denied as i32);

    let ask_ls = shell_rule("ask-ls", pb::Effect::Ask, "ls");
    let page = &replay_pages(&app, &ask_ls, 100).await[0];
    assert_eq!(counts(page), [4, 0, 0, 4, 0, 0]);
    assert!(page.samples.is_empty());
}

async fn replay_pages_sum_to_the_whole_range(app: TestApp) {
    known_history(&app).await;
    let allow_ls = shell_rule("allow-ls", pb::Effect::Allow, "ls");
    let whole = replay_pages(&app, &allow_ls, 100).await;
    let paged = replay_pages(&app, &allow_ls, 1).await;
    assert!(paged.len() >= 4, "{} pages", paged.len());
    let mut sum = [0u64; 6];
    for page in &paged {
        assert!(page.calls <= 1);
        for (total, n) in sum.iter_mut().zip(counts(page)) {
            *total += n;
        }
    }
    assert_eq!(sum, counts(&whole[0]));
    let samples: Vec<pb::ReplayDisagreement> = paged.into_iter().flat_map(|p| p.samples).collect();
    assert_eq!(samples, whole[0].samples);
}

async fn replay_refuses_what_is_out_of_bounds_naming_the_field(app: TestApp) {
    let candidate = shell_rule("c", pb::Effect::Allow, "ls");
    let good = replay_request(candidate.clone(), 10, String::new());
    let day = 86_400;
    let cases: Vec<(pb::ReplayRuleRequest, &str)> = vec![
        (
            pb::ReplayRuleRequest {
                candidate: None,
                ..good.clone()
            },
            "candidate",
        ),
        (
            pb::ReplayRuleRequest {
                candidate: Some(pb::Rule {
                    tool: String::new(),
                    ..candidate.clone()
                }),
                ..good.clone()
            },
            "candidate.tool",
        ),
        (
            pb::ReplayRuleRequest {
                from: None,
                ..good.clone()
            },
            "from",
        ),
        (
            pb::ReplayRuleRequest {
                to: good.from,
                ..good.clone()
            },
            "to",
        ),
        (
            pb::ReplayRuleRequest {
                to: good.from.map(|t| prost_types::Timestamp {
                    seconds: t.seconds + 32 * day,
                    nanos: 0,
                }),
                ..good.clone()
            },
            "to",
        ),
        (
            pb::ReplayRuleRequest {
                page_size: 1001,
                ..good.clone()
            },
            "page_size",
        ),
        (
            pb::ReplayRuleRequest {
                page_token: "garbage".into(),
                ..good.clone()
            },
            "page_token",
        ),
    ];
    for (request, field) in cases {
        assert_status(
            app.admin().replay_rule(request).await,
            Code::InvalidArgument,
            field,
        );
    }
    app.admin().replay_rule(good).await.expect("in bounds");
}

async fn replay_writes_nothing(app: TestApp) {
    known_history(&app).await;
    let rules_before = app
        .admin()
        .list_rules(pb::ListRulesRequest::default())
        .await
        .expect("list rules")
        .into_inner();
    let calls_before = all_calls(&app).await;
    let head_before = explain_inline(&app, "h", "", "shell", r#"{"command":"ls"}"#).await;
    let candidate = shell_rule("allow-ls", pb::Effect::Allow, "ls");
    replay_pages(&app, &candidate, 2).await;
    assert_eq!(
        app.admin()
            .list_rules(pb::ListRulesRequest::default())
            .await
            .expect("list rules")
            .into_inner(),
        rules_before,
        "the candidate is not stored"
    );
    assert_eq!(all_calls(&app).await, calls_before, "no call changed");
    let head_after = explain_inline(&app, "h", "", "shell", r#"{"command":"ls"}"#).await;
    assert_eq!(
        head_after.verdict, head_before.verdict,
        "nothing decides now"
    );
    assert_eq!(
        submitted_one(&app, "h", shell("after", "ls")).await.0,
        CallStatus::Pending,
        "the candidate does not apply"
    );
}

/// Scrapes `/metrics` and returns the shadow verdict counters by (rule, verdict).
async fn shadow_counters(port: u16) -> BTreeMap<(String, String), f64> {
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect to the metrics port");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    conn.read_to_string(&mut response).await.expect("response");
    let mut counters = BTreeMap::new();
    for line in response
        .lines()
        .filter(|l| l.starts_with("approvals_shadow_verdicts_total{"))
    {
        let (series, value) = line.rsplit_once(' ').expect("name and value");
        let labels = series
            .trim_start_matches("approvals_shadow_verdicts_total{")
            .trim_end_matches('}');
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .expect("label")
                .trim_matches('"')
                .to_owned()
        };
        counters.insert(
            (label("rule"), label("verdict")),
            value.parse().expect("a number"),
        );
    }
    counters
}

async fn shadow_verdicts_are_counted_in_a_metric_by_rule_and_verdict(mut app: TestApp) {
    create_rule(
        &app,
        mode(
            shell_rule("no-rm", pb::Effect::Deny, "rm"),
            pb::RuleMode::Shadow,
        ),
    )
    .await;
    app.shut_down().await;
    let port = free_port().expect("a free port");
    let metrics_listen = format!("127.0.0.1:{port}");
    let broker = start_broker(
        &app.database_url,
        &["--metrics-listen", &metrics_listen],
        &[],
    )
    .await;
    let mut agent = AgentServiceClient::new(broker.channel());
    for (id, command) in [("c1", "rm a"), ("c2", "rm b"), ("c3", "ls")] {
        agent
            .submit(pb::SubmitRequest {
                batch: Some(batch("m", vec![shell(id, command)])),
            })
            .await
            .expect("submit");
    }
    // The same call again stores nothing new, and records nothing twice.
    agent
        .submit(pb::SubmitRequest {
            batch: Some(batch("m", vec![shell("c1", "rm a")])),
        })
        .await
        .expect("resubmit");
    let mut counters = shadow_counters(port).await;
    for _ in 0..50 {
        if !counters.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        counters = shadow_counters(port).await;
    }
    assert_eq!(
        counters,
        BTreeMap::from([(("no-rm".to_owned(), "deny".to_owned()), 2.0)])
    );
}

backend_tests! {
    a_shadow_rule_never_decides_and_its_verdict_shows_in_the_audit_and_explain,
    a_shadow_rule_is_recorded_only_where_enforcing_it_would_rule_the_call,
    a_disabled_rule_is_ignored_by_submit_and_explain,
    set_rule_mode_moves_a_rule_between_shadow_enforce_and_disabled,
    the_policy_file_sets_a_rules_mode,
    replay_counts_and_samples_are_exact_on_known_decisions,
    replay_pages_sum_to_the_whole_range,
    replay_refuses_what_is_out_of_bounds_naming_the_field,
    replay_writes_nothing,
    shadow_verdicts_are_counted_in_a_metric_by_rule_and_verdict,
}
