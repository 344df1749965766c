//! A seeded, model-based run of the approval gate (issue 43): random submits (with
//! `requested_by` spelt in several cases and widths), decisions by every kind of approver with
//! every scope (single votes, quorum-completing votes, remembered grants), revocations, and on
//! Postgres two replicas taking turns; after every step, every outcome must be justified: an
//! APPROVED call by distinct people (or a rule, or a grant whose authors) who satisfy the
//! requirement the model says was fixed at its submit, none of them its requester or agent.
//! Some approvals edit the input. A call hidden from the person who decides it or reads its
//! receipt answers word for word what an unknown call answers; and every few steps each decided
//! call's signed receipt must say what the stored call says (outcome, who, what runs).
//!
//! The seed is printed; replay or lengthen a run with
//! `GOVERNANCE_SEED=<seed> GOVERNANCE_STEPS=2000 cargo test --test api governance -- --nocapture`.

use std::collections::{BTreeSet, HashMap};

use approval_broker::config::Config;
use approval_broker::domain::policy::Approvers;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use tonic::transport::Channel;

use crate::helpers::*;
use crate::receipts::{statement, with_key};
use crate::routing::{admin_as, approver_as, bearer};

const BOT: &str = "gov-bot";
const ROOT: &str = "gov-root";
/// The approvers: token, identity, groups. `bot` is the agent's own identity as an approver.
const PEOPLE: [(&str, &str, &[&str]); 5] = [
    ("gov-alice", "alice", &["ops"]),
    ("gov-bob", "bob", &["ops", "sec"]),
    ("gov-carol", "carol", &["sec"]),
    ("gov-dave", "dave", &[]),
    ("gov-bot-approving", "bot", &[]),
];
/// `requested_by` as agents send it, and the person the model says it names.
const REQUESTERS: [(&str, &str); 7] = [
    ("", ""),
    ("carol", "carol"),
    ("Carol", "carol"),
    ("ＣＡＲＯＬ", "carol"),
    ("alice", "alice"),
    (" BOB ", "bob"),
    ("Dave", "dave"),
];
const TOOLS: [&str; 4] = ["shell", "deploy", "ops-task", "ls"];

/// The requirement of calls no ask rule names approvers for: two people, anyone (`shell` in
/// one run), or one member of ops (in the other).
#[derive(Clone, Copy)]
enum Requires {
    TwoPeople,
    OneOfOps,
}

/// Every call no ask rule names approvers for needs two people.
fn governed(config: &mut Config) {
    tokens(config);
    with_key(config);
    config.policy.default_approvers = Some(Approvers {
        quorum: 2,
        ..Approvers::default()
    });
}

/// Every call no ask rule names approvers for needs one member of ops.
fn governed_by_ops(config: &mut Config) {
    tokens(config);
    with_key(config);
    config.policy.default_approvers = Some(Approvers {
        groups: vec!["ops".into()],
        ..Approvers::default()
    });
}

fn tokens(config: &mut Config) {
    let mut lines = vec![
        format!("agent bot {}", hash_token(BOT)),
        format!("admin root {}", hash_token(ROOT)),
    ];
    for (token, who, groups) in PEOPLE {
        let groups = if groups.is_empty() {
            String::new()
        } else {
            format!(" groups={}", groups.join(","))
        };
        lines.push(format!("approver {who} {}{groups}", hash_token(token)));
    }
    config.auth.tokens = Some(lines.join("\n"));
}

/// Whether the model says the approver `who` may see a call of `tool`: a call whose requirement
/// names groups only by their members; one a rule decided (no requirement) by anyone.
fn visible(tool: &str, default: Requires, who: &str) -> bool {
    let theirs = PEOPLE
        .iter()
        .find(|(_, person, _)| *person == who)
        .map_or(&[][..], |(_, _, groups)| *groups);
    required(tool, default)
        .is_none_or(|(groups, _)| groups.is_empty() || groups.iter().any(|g| theirs.contains(g)))
}

/// The answer to `answer` with the unknown call id `unknown` read as `id`: what a hidden call
/// must answer, word for word.
fn as_unknown<T>(
    answer: Result<T, &tonic::Status>,
    unknown: &str,
    id: &str,
) -> (tonic::Code, String) {
    match answer {
        Ok(_) => (tonic::Code::Ok, String::new()),
        Err(status) => (status.code(), status.message().replace(unknown, id)),
    }
}

/// What the model says a call of `tool` requires: groups (empty: anyone) and a quorum; `None`
/// for `ls`, which an allow rule decides.
fn required(tool: &str, default: Requires) -> Option<(Vec<&'static str>, usize)> {
    match (tool, default) {
        ("deploy", _) => Some((vec!["ops", "sec"], 2)),
        ("ops-task", _) => Some((vec!["ops"], 1)),
        ("ls", _) => None,
        (_, Requires::TwoPeople) => Some((Vec::new(), 2)),
        (_, Requires::OneOfOps) => Some((vec!["ops"], 1)),
    }
}

async fn install_rules(app: &TestApp) {
    let mut admin = admin_as(&app.channel, ROOT);
    let mut two = rule("two-person", "deploy", pb::Effect::Ask, 0, None);
    two.approvers = Some(pb::Approvers {
        groups: vec!["ops".into(), "sec".into()],
        quorum: 2,
        ..Default::default()
    });
    let mut ops = rule("ops-only", "ops-task", pb::Effect::Ask, 0, None);
    ops.approvers = Some(pb::Approvers {
        groups: vec!["ops".into()],
        quorum: 1,
        ..Default::default()
    });
    let ls = rule("ls-ok", "ls", pb::Effect::Allow, 0, None);
    for rule in [two, ops, ls] {
        admin
            .create_rule(pb::CreateRuleRequest { rule: Some(rule) })
            .await
            .expect("create rule");
    }
}

/// splitmix64: a seeded run replays exactly.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// What the model knows of a call: its tool and the person it names.
struct Modelled {
    tool: &'static str,
    requester: &'static str,
}

fn seed() -> u64 {
    match std::env::var("GOVERNANCE_SEED") {
        Ok(seed) => seed.parse().expect("GOVERNANCE_SEED is a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_nanos() as u64,
    }
}

fn steps() -> usize {
    std::env::var("GOVERNANCE_STEPS")
        .ok()
        .map_or(300, |s| s.parse().expect("GOVERNANCE_STEPS is a number"))
}

/// Runs the seeded steps against `replicas` (one broker, or two on one Postgres database),
/// checking every outcome after each step.
async fn run(replicas: &[&TestApp], default: Requires) {
    let seed = seed();
    println!("governance: seed {seed} (replay with GOVERNANCE_SEED={seed})");
    let mut rng = Rng(seed);
    install_rules(replicas[0]).await;
    let mut calls: HashMap<String, Modelled> = HashMap::new();
    let mut next_id = 0;
    for step in 0..steps() {
        let app = *rng.pick(replicas);
        let roll = rng.below(100);
        let what = if roll < 35 || calls.is_empty() {
            let n = 1 + rng.below(2);
            let mut specs = Vec::new();
            for _ in 0..n {
                next_id += 1;
                let id = format!("c{next_id}");
                let tool = *rng.pick(&TOOLS);
                let (sent, requester) = *rng.pick(&REQUESTERS);
                let input = format!(r#"{{"n":{}}}"#, rng.below(3));
                specs.push(pb::CallSpec {
                    requested_by: sent.into(),
                    ..call(&id, tool, &input)
                });
                calls.insert(id, Modelled { tool, requester });
            }
            let ids: Vec<_> = specs.iter().map(|s| s.call_id.clone()).collect();
            AgentServiceClient::with_interceptor(app.channel.clone(), bearer(BOT))
                .submit(pb::SubmitRequest {
                    batch: Some(pb::BatchSpec {
                        on_deny: pb::OnDeny::Independent as i32,
                        ..batch("s", specs)
                    }),
                })
                .await
                .expect("submit");
            format!("submit {ids:?}")
        } else if roll < 90 {
            let mut ids: Vec<&String> = calls.keys().collect();
            ids.sort();
            let id = (*rng.pick(&ids)).clone();
            let (token, who, _) = *rng.pick(&PEOPLE);
            // Mostly approvals; a denial is rarely remembered (a deny grant for any input
            // would end every later call of its tool, and leave the approvals untested).
            let approve = rng.below(100) < 88;
            let scope = if approve || rng.below(4) == 0 {
                *rng.pick(&[
                    pb::Scope::Once,
                    pb::Scope::Session,
                    pb::Scope::Always,
                    pb::Scope::Always,
                ])
            } else {
                pb::Scope::Once
            };
            let mut request = decide_request(
                "s",
                &id,
                if approve {
                    pb::Decision::Approve
                } else {
                    pb::Decision::Deny
                },
                "",
            );
            request.agent = "bot".into();
            request.approver = String::new();
            request.scope = scope as i32;
            if rng.below(2) == 0 {
                request.matcher = Some(pb::InputMatcher {
                    kind: Some(pb::input_matcher::Kind::Any(pb::AnyInput {})),
                });
            }
            let edits = approve && rng.below(6) == 0;
            if edits {
                request.edited_input_json = format!(r#"{{"n":{},"edited":true}}"#, rng.below(3));
            }
            let unknown = format!("unknown-{id}");
            let unknown_request = pb::DecideRequest {
                call_id: unknown.clone(),
                ..request.clone()
            };
            let answer = approver_as(&app.channel, token).decide(request).await;
            if !visible(calls[&id].tool, default, who) {
                let told = as_unknown(answer.as_ref().map(|_| ()), &unknown, &id);
                let unknown_answer = approver_as(&app.channel, token)
                    .decide(unknown_request)
                    .await;
                let expected = as_unknown(unknown_answer.as_ref().map(|_| ()), &unknown, &id);
                assert_eq!(
                    told, expected,
                    "seed {seed}, step {step}: {who} deciding hidden call {id} is told more \
                     than an unknown call's answer"
                );
            }
            let answer = match answer {
                Ok(_) => "ok".to_owned(),
                Err(status) => format!("{:?}", status.code()),
            };
            format!(
                "{who} {}{} {id} {scope:?}: {answer}",
                if approve { "approves" } else { "denies" },
                if edits { " (edited)" } else { "" }
            )
        } else {
            let grants = grants_of(app).await;
            if grants.is_empty() {
                continue;
            }
            let id = rng.pick(&grants).id;
            admin_as(&app.channel, ROOT)
                .revoke_grant(pb::RevokeGrantRequest {
                    target: Some(pb::revoke_grant_request::Target::Id(id)),
                    ..Default::default()
                })
                .await
                .expect("revoke");
            format!("revoke grant {id}")
        };
        check(replicas[0], &calls, default)
            .await
            .unwrap_or_else(|broken| panic!("seed {seed}, step {step} ({what}): {broken}"));
        // A receipt read by someone the call is hidden from, beside an unknown call's.
        let mut ids: Vec<&String> = calls.keys().collect();
        ids.sort();
        let id = (*rng.pick(&ids)).clone();
        let (token, who, _) = *rng.pick(&PEOPLE);
        let read = |call_id: String| {
            let mut client = approver_as(&app.channel, token);
            async move {
                client
                    .get_receipt(pb::GetReceiptRequest {
                        session_id: "s".into(),
                        call_id,
                        agent: "bot".into(),
                    })
                    .await
            }
        };
        let unknown = format!("unknown-{id}");
        let told = as_unknown(read(id.clone()).await.as_ref().map(|_| ()), &unknown, &id);
        if visible(calls[&id].tool, default, who) {
            assert_ne!(
                told.0,
                tonic::Code::PermissionDenied,
                "seed {seed}, step {step}: {who} may read {id}'s receipt: {told:?}"
            );
        } else {
            let expected = as_unknown(
                read(unknown.clone()).await.as_ref().map(|_| ()),
                &unknown,
                &id,
            );
            assert_eq!(
                told, expected,
                "seed {seed}, step {step}: {who} reading hidden call {id}'s receipt"
            );
        }
        if step % 50 == 49 {
            receipts_match(replicas[0])
                .await
                .unwrap_or_else(|broken| panic!("seed {seed}, step {step}: {broken}"));
        }
    }
    receipts_match(replicas[0])
        .await
        .unwrap_or_else(|broken| panic!("seed {seed}, at the end: {broken}"));
    // What the run exercised, so a run that decided nothing through grants is seen as such.
    let mut tally: HashMap<String, usize> = HashMap::new();
    for call in all_calls(&replicas[0].channel).await {
        let kind = match &call.outcome {
            None => "pending".to_owned(),
            Some(o) => format!(
                "{:?} by {}",
                pb::CallStatus::try_from(o.status).expect("a status"),
                o.decided_by.split(':').next().unwrap_or("")
            ),
        };
        *tally.entry(kind).or_default() += 1;
    }
    let mut tally: Vec<_> = tally.into_iter().collect();
    tally.sort();
    println!("governance: seed {seed}: {tally:?}");
    if matches!(default, Requires::OneOfOps) {
        assert!(
            tally.iter().any(|(kind, _)| kind == "Approved by grant"),
            "seed {seed}: no call was approved by a grant, so grants went untested: {tally:?}"
        );
    }
}

/// Every decided call's signed receipt says what the stored call says: the outcome, who
/// decided, the input asked for and, when an approval edited it, the input that runs.
async fn receipts_match(app: &TestApp) -> Result<(), String> {
    let mut reader = approver_as(&app.channel, "gov-bob");
    for call in all_calls(&app.channel).await {
        let Some(outcome) = &call.outcome else {
            continue;
        };
        let id = &call.call_id;
        let reply = reader
            .get_receipt(pb::GetReceiptRequest {
                session_id: call.session_id.clone(),
                call_id: id.clone(),
                agent: call.agent.clone(),
            })
            .await
            .map_err(|status| format!("call {id}: no receipt: {status:?}"))?
            .into_inner();
        let receipt = reply.receipt.ok_or(format!("call {id}: no receipt"))?;
        if !receipt.verified {
            return Err(format!("call {id}: its receipt does not verify"));
        }
        let said = statement(&receipt.envelope);
        let predicate = &said["predicate"];
        let status = pb::CallStatus::try_from(outcome.status).expect("a status");
        let stored = format!("{status:?}").to_uppercase();
        let input: serde_json::Value =
            serde_json::from_str(&call.input_json).map_err(|e| format!("call {id}: {e}"))?;
        let mismatch = if predicate["outcome"] != stored.as_str() {
            Some(format!(
                "outcome {} where {stored} is stored",
                predicate["outcome"]
            ))
        } else if predicate["decidedBy"] != outcome.decided_by.as_str() {
            Some(format!(
                "decided by {} where {} is stored",
                predicate["decidedBy"], outcome.decided_by
            ))
        } else if predicate["input"] != input {
            Some(format!(
                "input {} where {input} is stored",
                predicate["input"]
            ))
        } else if status == pb::CallStatus::Approved {
            let runs = &predicate["runs"];
            let edited = runs["edited"].as_bool() == Some(true);
            if edited != outcome.input_edited {
                Some(format!(
                    "edited {edited} where {} is stored",
                    outcome.input_edited
                ))
            } else if edited {
                let approved: serde_json::Value = serde_json::from_str(&outcome.input_json)
                    .map_err(|e| format!("call {id}: {e}"))?;
                (runs["input"] != approved)
                    .then(|| format!("runs {} where {approved} was approved", runs["input"]))
            } else {
                None
            }
        } else {
            None
        };
        if let Some(mismatch) = mismatch {
            return Err(format!("call {id}'s receipt: {mismatch}"));
        }
    }
    Ok(())
}

async fn grants_of(app: &TestApp) -> Vec<pb::Grant> {
    admin_as(&app.channel, ROOT)
        .list_grants(pb::ListGrantsRequest {
            include_inactive: true,
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("list grants")
        .into_inner()
        .grants
}

async fn all_calls(channel: &Channel) -> Vec<pb::Call> {
    admin_as(channel, ROOT)
        .list_calls(pb::ListCallsRequest {
            page_size: 1000,
            ..Default::default()
        })
        .await
        .expect("list calls")
        .into_inner()
        .calls
}

/// Whether `people` could decide a call of `tool` requested by `requester` with `verdict`:
/// distinct, each admitted by the groups, and (approving) none of them the requester or agent.
fn justified(
    (tool, default): (&str, Requires),
    requester: &str,
    approve: bool,
    people: &[String],
) -> Result<(), String> {
    let Some((groups, quorum)) = required(tool, default) else {
        return Err(format!("no person decides a `{tool}` call: a rule does"));
    };
    let distinct: BTreeSet<&str> = people.iter().map(String::as_str).collect();
    for person in &distinct {
        let theirs = PEOPLE
            .iter()
            .find(|(_, who, _)| who == person)
            .map(|(_, _, g)| *g)
            .ok_or_else(|| format!("`{person}` is nobody the model knows"))?;
        if !groups.is_empty() && !groups.iter().any(|g| theirs.contains(g)) {
            return Err(format!("`{person}` is in none of {groups:?}"));
        }
        if approve && (*person == requester || *person == "bot") {
            return Err(format!("`{person}` approved a call they submitted"));
        }
    }
    let needed = if approve { quorum } else { 1 };
    if distinct.len() < needed {
        return Err(format!(
            "{} distinct people ({distinct:?}) where {needed} are needed",
            distinct.len()
        ));
    }
    Ok(())
}

/// Every decided call's outcome is justified by the requirement fixed at its submit.
async fn check(
    app: &TestApp,
    model: &HashMap<String, Modelled>,
    default: Requires,
) -> Result<(), String> {
    let grants: HashMap<u64, pb::Grant> = grants_of(app)
        .await
        .into_iter()
        .map(|g| (g.id, g))
        .collect();
    for call in all_calls(&app.channel).await {
        let Some(modelled) = model.get(&call.call_id) else {
            return Err(format!("call {} is not in the model", call.call_id));
        };
        let tool = modelled.tool;
        if call.requested_by != modelled.requester {
            return Err(format!(
                "call {} stored requested_by `{}`, not `{}`",
                call.call_id, call.requested_by, modelled.requester
            ));
        }
        let Some(outcome) = &call.outcome else {
            // Pending: the requirement fixed on it is the model's.
            if let (Some((groups, quorum)), Some(approval)) =
                (required(tool, default), &call.approval)
            {
                let approvers = approval.approvers.as_ref().expect("approvers");
                if approvers.quorum as usize != quorum || approvers.groups != groups {
                    return Err(format!("call {} requires {approvers:?}", call.call_id));
                }
            }
            continue;
        };
        let status = pb::CallStatus::try_from(outcome.status).expect("a status");
        let approve = match status {
            pb::CallStatus::Approved => true,
            pb::CallStatus::Denied => false,
            _ => continue,
        };
        let by = &outcome.decided_by;
        let verdict = if let Some(rule) = by.strip_prefix("policy:") {
            if rule != "ls-ok" || tool != "ls" || !approve {
                Err(format!("rule `{rule}` decided a `{tool}` call"))
            } else {
                Ok(())
            }
        } else if let Some(id) = by.strip_prefix("grant:") {
            let grant = id
                .parse()
                .ok()
                .and_then(|id: u64| grants.get(&id))
                .ok_or_else(|| format!("no grant {id}"))?;
            let allow = grant.effect == pb::Effect::Allow as i32;
            if allow != approve {
                Err(format!("grant {id}'s effect is not the outcome"))
            } else {
                justified((tool, default), modelled.requester, approve, &grant.authors)
                    .map_err(|why| format!("grant {id} (authors {:?}): {why}", grant.authors))
            }
        } else if by.starts_with("approver:") {
            justified(
                (tool, default),
                modelled.requester,
                approve,
                &outcome.decided_by_approvers,
            )
        } else {
            Err(format!("decided by `{by}`"))
        };
        verdict.map_err(|why| {
            format!(
                "call {} ({tool}, requested by `{}`) {status:?} by {by}: {why}",
                call.call_id, modelled.requester
            )
        })?;
    }
    Ok(())
}

async fn every_approval_is_justified_when_calls_need_two_people(app: TestApp) {
    run(&[&app], Requires::TwoPeople).await;
}

async fn every_approval_is_justified_when_calls_need_one_member_of_ops(app: TestApp) {
    run(&[&app], Requires::OneOfOps).await;
}

backend_tests!(
    every_approval_is_justified_when_calls_need_two_people => super::governed,
    every_approval_is_justified_when_calls_need_one_member_of_ops => super::governed_by_ops,
);

/// The same run with two brokers on one Postgres database taking turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn every_approval_is_justified_on_two_replicas() {
    let a = spawn_app_on(Backend::postgres(), governed_by_ops).await;
    let b = a.replica(governed_by_ops).await;
    run(&[&a, &b], Requires::OneOfOps).await;
}
