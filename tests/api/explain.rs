//! Explain: for a stored call or one described inline, which rule or grant would decide it, or
//! that a human would be asked, and why. It calls the very function a submit calls, which the
//! generated test below holds it to: on a few hundred random calls, against a mix of rules and
//! grants made and revoked along the way, Explain says exactly what then happens.

use std::collections::BTreeMap;

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

async fn explain_names_the_rule_the_grant_or_the_human_that_would_decide(app: TestApp) {
    let ls = r#"{"command":"ls"}"#;
    let nothing = explain_inline(&app, "s", "", "shell", ls).await;
    assert_eq!(nothing.verdict, CallStatus::Pending as i32);
    assert!(nothing.decided_by.is_empty() && nothing.rule.is_none() && nothing.grant.is_none());
    assert!(
        nothing.reason.contains("a human decides"),
        "{}",
        nothing.reason
    );

    submit(&app, batch("s", vec![call("c1", "shell", ls)])).await;
    let grant = grant_by_deciding(
        &app,
        "s",
        "c1",
        pb::Decision::Approve,
        pb::Scope::Session,
        None,
    )
    .await;
    let by_grant = explain_inline(&app, "s", "", "shell", ls).await;
    assert_eq!(by_grant.verdict, CallStatus::Approved as i32);
    assert_eq!(by_grant.decided_by, format!("grant:{}", grant.id));
    assert_eq!(by_grant.grant.map(|g| g.id), Some(grant.id));
    assert!(by_grant.reason.contains("grant"), "{}", by_grant.reason);
    let other_session = explain_inline(&app, "s2", "", "shell", ls).await;
    assert_eq!(other_session.verdict, CallStatus::Pending as i32);

    create_rule(&app, rule("ask-shell", "shell", pb::Effect::Ask, 0, None)).await;
    let ask = explain_inline(&app, "s", "", "shell", ls).await;
    assert_eq!(ask.verdict, CallStatus::Pending as i32);
    assert_eq!(ask.rule.map(|r| r.id), Some("ask-shell".to_owned()));
    assert!(
        ask.reason.contains("ask rule `ask-shell`"),
        "{}",
        ask.reason
    );

    create_rule(&app, rule("no-shell", "sh*", pb::Effect::Deny, 0, None)).await;
    let deny = explain_inline(&app, "s", "", "shell", ls).await;
    assert_eq!(deny.verdict, CallStatus::Denied as i32);
    assert_eq!(deny.decided_by, "policy:no-shell");
    assert!(
        deny.reason.contains("deny rule `no-shell`"),
        "{}",
        deny.reason
    );
}

async fn explain_of_a_stored_call_shows_the_call_and_refuses_what_does_not_exist(app: TestApp) {
    submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
    let explained = explain_stored(&app, "s", "c1").await;
    let stored = explained.call.expect("the call");
    assert_eq!(
        (stored.call_id.as_str(), stored.status),
        ("c1", CallStatus::Pending as i32)
    );
    let unknown = app
        .admin()
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Stored(pb::GetCallRequest {
                session_id: "s".into(),
                call_id: "nope".into(),
                agent: String::new(),
            })),
        })
        .await;
    assert_status(unknown, Code::NotFound, "nope");
    assert_status(
        app.admin().explain(pb::ExplainRequest { call: None }).await,
        Code::InvalidArgument,
        "call",
    );
    let bad_input = app
        .admin()
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Inline(pb::ExplainCall {
                session_id: "s".into(),
                tool: "t".into(),
                input_json: "[1]".into(),
                ..Default::default()
            })),
        })
        .await;
    assert_status(bad_input, Code::InvalidArgument, "inline.input_json");
}

/// A small seeded generator (xorshift64*), so a failure can be replayed with its seed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }
}

/// One generated call.
#[derive(Clone, Debug)]
struct Generated {
    session: String,
    workspace: String,
    tool: String,
    input: serde_json::Value,
}

fn generate(random: &mut Random) -> Generated {
    use serde_json::json;
    let tool = *random.pick(&["shell", "read_file", "write_file", "deploy", "web_fetch"]);
    let input = match tool {
        "shell" => json!({ "command": random.pick(&[
            "git status", "git status --short", "git push --force", "git push origin main",
            "rm -rf build", "ls src", "cargo test",
        ]) }),
        "read_file" | "write_file" => {
            let path = *random.pick(&[
                "src/main.rs",
                "src/a/secret.txt",
                "docs/readme.md",
                "../etc/passwd",
            ]);
            if random.one_in(2) {
                json!({ "path": path, "mode": random.pick(&["ro", "rw"]) })
            } else {
                json!({ "path": path })
            }
        }
        "deploy" => json!({
            "env": random.pick(&["prod", "dev", "staging"]),
            "options": { "force": random.one_in(3) },
        }),
        _ => match random.below(3) {
            0 => json!({ "url": random.pick(&["https://a.example", "https://b.example/x"]) }),
            n => json!({ "url": "https://a.example", "offline": n == 1 }),
        },
    };
    Generated {
        session: format!("s{}", random.below(4)),
        workspace: random.pick(&["", "w1", "w2"]).to_string(),
        tool: tool.to_owned(),
        input,
    }
}

/// A matcher for a grant made from a call with `input`: its own input, any, or a condition on
/// one of its string fields.
fn grant_matcher(random: &mut Random, input: &serde_json::Value) -> Option<pb::InputMatcher> {
    let strings: Vec<(&String, &str)> = input
        .as_object()
        .map(|o| {
            o.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k, s)))
                .collect()
        })
        .unwrap_or_default();
    match random.below(4) {
        0 => None,
        1 => Some(any_input()),
        _ if strings.is_empty() => None,
        2 => {
            let (field, value) = *random.pick(&strings);
            let cut = value.len().min(1 + random.below(6));
            Some(fields(vec![prefix(field, &value[..cut])]))
        }
        _ => {
            let (field, value) = *random.pick(&strings);
            Some(fields(vec![glob(field, &format!("{}*", &value[..1]))]))
        }
    }
}

/// The rules the generated calls meet: deny, allow and ask, at several priorities.
async fn create_generated_rules(app: &TestApp) {
    for r in [
        rule(
            "no-force",
            "shell",
            pb::Effect::Deny,
            -5,
            Some(fields(vec![glob("command", "*--force*")])),
        ),
        rule(
            "git-status",
            "shell",
            pb::Effect::Allow,
            0,
            Some(fields(vec![prefix("command", "git status")])),
        ),
        rule(
            "ask-secrets",
            "*_file",
            pb::Effect::Ask,
            5,
            Some(fields(vec![glob("path", "*secret*")])),
        ),
        rule(
            "read-src",
            "read_file",
            pb::Effect::Allow,
            5,
            Some(fields(vec![glob("path", "src/**")])),
        ),
        rule(
            "no-escape",
            "*_file",
            pb::Effect::Deny,
            0,
            Some(fields(vec![glob("path", "*..*")])),
        ),
        rule(
            "ask-prod",
            "deploy",
            pb::Effect::Ask,
            10,
            Some(fields(vec![equals("env", "prod")])),
        ),
        rule(
            "deploy-dev",
            "deploy",
            pb::Effect::Allow,
            3,
            Some(fields(vec![
                equals("env", "dev"),
                equals_json("options.force", "false"),
            ])),
        ),
        rule(
            "offline",
            "web_*",
            pb::Effect::Deny,
            0,
            Some(fields(vec![equals_json("offline", "true")])),
        ),
    ] {
        create_rule(app, r).await;
    }
}

/// What Explain predicted: the status and `decided_by` of the outcome (PENDING and empty when a
/// human decides).
fn prediction(explained: &pb::ExplainResponse) -> (i32, String) {
    (explained.verdict, explained.decided_by.clone())
}

async fn explain_agrees_with_what_happens_on_generated_calls(app: TestApp) {
    const CALLS: usize = 300;
    let seed = std::env::var("EXPLAIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
                | 1
        });
    println!("explain agreement: seed {seed} (replay with EXPLAIN_SEED={seed})");
    let mut random = Random(seed);
    create_generated_rules(&app).await;
    let mut pending: BTreeMap<String, Generated> = BTreeMap::new();
    let mut grants: Vec<u64> = Vec::new();
    let (mut decided_at_submit, mut decided_by_grants) = (0, 0);

    for i in 0..CALLS {
        if i % 30 == 29 && !pending.is_empty() {
            // An approver remembers a decision on a pending call.
            let index = random.below(pending.len());
            let (call_id, chosen) = pending
                .iter()
                .nth(index)
                .map(|(k, v)| (k.clone(), v.clone()))
                .expect("a pending call");
            pending.remove(&call_id);
            let scope = match random.below(3) {
                0 => pb::Scope::Session,
                1 if !chosen.workspace.is_empty() => pb::Scope::Workspace,
                _ => pb::Scope::Always,
            };
            let verdict = if random.one_in(4) {
                pb::Decision::Deny
            } else {
                pb::Decision::Approve
            };
            let matcher = grant_matcher(&mut random, &chosen.input);
            let decided =
                decide_remembering(&app, &chosen.session, &call_id, verdict, scope, matcher).await;
            grants.push(decided.grant.expect("a grant").id);
            decided_by_grants += decided.decided_by_grant.len();
            check_pending_against_explain(&app, &mut pending, seed).await;
            continue;
        }
        if i % 40 == 39 && !grants.is_empty() {
            let id = grants.remove(random.below(grants.len()));
            app.admin()
                .revoke_grant(pb::RevokeGrantRequest {
                    target: Some(pb::revoke_grant_request::Target::Id(id)),
                    agent: String::new(),
                })
                .await
                .expect("revoke");
        }
        let generated = generate(&mut random);
        let input = generated.input.to_string();
        let explained = explain_inline(
            &app,
            &generated.session,
            &generated.workspace,
            &generated.tool,
            &input,
        )
        .await;
        let call_id = format!("g{i}");
        let response = submit(
            &app,
            batch(
                &generated.session,
                vec![call_in(
                    &generated.workspace,
                    &call_id,
                    &generated.tool,
                    &input,
                )],
            ),
        )
        .await;
        let actual = (
            ack_status(&response, 0) as i32,
            response
                .outcomes
                .first()
                .map(|o| o.decided_by.clone())
                .unwrap_or_default(),
        );
        assert_eq!(
            actual,
            prediction(&explained),
            "seed {seed}, call {call_id} {generated:?}: Explain said {}",
            explained.reason
        );
        if actual.0 == CallStatus::Pending as i32 {
            pending.insert(call_id, generated);
        } else {
            decided_at_submit += 1;
        }
    }
    println!(
        "explain agreement: {decided_at_submit} decided at submit, {decided_by_grants} by new \
         grants, {} left to a human",
        pending.len()
    );
    // The mix exercised every path.
    assert!(decided_at_submit > 0 && !pending.is_empty(), "seed {seed}");
}

/// After a grant is created: every call still tracked as pending is decided exactly as Explain
/// now says (a new grant decides the pending calls it covers), or still pending if Explain says
/// a human decides.
async fn check_pending_against_explain(
    app: &TestApp,
    pending: &mut BTreeMap<String, Generated>,
    seed: u64,
) {
    let mut decided = Vec::new();
    for (call_id, generated) in pending.iter() {
        let explained = explain_stored(app, &generated.session, call_id).await;
        let stored = explained.call.as_ref().expect("the stored call");
        let actual = (
            stored.status,
            stored
                .outcome
                .as_ref()
                .map(|o| o.decided_by.clone())
                .unwrap_or_default(),
        );
        assert_eq!(
            actual,
            prediction(&explained),
            "seed {seed}, pending call {call_id} {generated:?} after a new grant: Explain said {}",
            explained.reason
        );
        if stored.status != CallStatus::Pending as i32 {
            decided.push(call_id.clone());
        }
    }
    for call_id in decided {
        pending.remove(&call_id);
    }
}

backend_tests! {
    explain_names_the_rule_the_grant_or_the_human_that_would_decide,
    explain_of_a_stored_call_shows_the_call_and_refuses_what_does_not_exist,
    explain_agrees_with_what_happens_on_generated_calls,
}
