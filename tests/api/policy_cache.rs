//! The rules and grants a submit judges by are kept in memory between submits (issue 19), yet a
//! change applies to the very next submit: on the replica that made it and on every other, a
//! revoked grant stops applying at once, and an expired grant never applies although it was read
//! while it was live. Each test first has submits read the policy, so what follows is judged
//! against a kept copy that the change must invalidate.

use std::time::Duration;

use approval_broker::proto::v1 as pb;

use crate::helpers::*;

const INPUT: &str = r#"{"command":"git status"}"#;

/// Submits one call and returns its status at submit and what decided it ("" for nobody).
async fn submitted(
    app: &TestApp,
    session: &str,
    call_id: &str,
    tool: &str,
) -> (CallStatus, String) {
    submitted_one(app, session, call(call_id, tool, INPUT)).await
}

fn pending() -> (CallStatus, String) {
    (CallStatus::Pending, String::new())
}

async fn delete_rule(app: &TestApp, id: &str) {
    app.admin()
        .delete_rule(pb::DeleteRuleRequest { id: id.into() })
        .await
        .expect("delete rule");
}

async fn revoke(app: &TestApp, grant: &pb::Grant) {
    app.admin()
        .revoke_grant(pb::RevokeGrantRequest {
            target: Some(pb::revoke_grant_request::Target::Id(grant.id)),
            agent: String::new(),
        })
        .await
        .expect("revoke");
}

/// Rule changes through `admin` apply to the next submit through `agent` (the same broker, or
/// another replica), which read the rules before each change.
async fn rule_changes_apply_to_the_next_submit(admin: &TestApp, agent: &TestApp) {
    assert_eq!(submitted(agent, "s", "before", "t").await, pending());
    create_rule(admin, rule("allow-t", "t", pb::Effect::Allow, 0, None)).await;
    assert_eq!(
        submitted(agent, "s", "with-allow", "t").await,
        (CallStatus::Approved, "policy:allow-t".into())
    );
    create_rule(admin, rule("deny-t", "t", pb::Effect::Deny, 0, None)).await;
    assert_eq!(
        submitted(agent, "s", "with-deny", "t").await,
        (CallStatus::Denied, "policy:deny-t".into())
    );
    delete_rule(admin, "deny-t").await;
    delete_rule(admin, "allow-t").await;
    assert_eq!(submitted(agent, "s", "after", "t").await, pending());
}

/// A grant made through `admin` applies to the next submit of its session through `agent`, which
/// read that session's grants before; revoked, it stops applying at once.
async fn grant_changes_apply_to_the_next_submit(admin: &TestApp, agent: &TestApp) {
    assert_eq!(submitted(agent, "s", "seed", "shell").await, pending());
    assert_eq!(submitted(agent, "s", "before", "shell").await, pending());
    let grant = grant_by_deciding(
        admin,
        "s",
        "seed",
        pb::Decision::Approve,
        pb::Scope::Session,
        Some(any_input()),
    )
    .await;
    let by_grant = format!("grant:{}", grant.id);
    assert_eq!(
        submitted(agent, "s", "with-grant", "shell").await,
        (CallStatus::Approved, by_grant.clone())
    );
    // Kept for the session, but only for the tool it names.
    assert_eq!(submitted(agent, "s", "other-tool", "rm").await, pending());
    revoke(admin, &grant).await;
    assert_eq!(submitted(agent, "s", "revoked", "shell").await, pending());
}

async fn a_rule_created_or_deleted_applies_to_the_next_submit(app: TestApp) {
    rule_changes_apply_to_the_next_submit(&app, &app).await;
}

async fn a_grant_applies_to_the_next_submit_and_a_revoked_one_stops_at_once(app: TestApp) {
    grant_changes_apply_to_the_next_submit(&app, &app).await;
}

async fn a_grant_read_while_live_does_not_apply_once_expired(app: TestApp) {
    assert_eq!(submitted(&app, "s", "seed", "shell").await, pending());
    let mut request = decide_request("s", "seed", pb::Decision::Approve, "");
    request.scope = pb::Scope::Session as i32;
    // Long enough that the decide and the "live" submit land before it, on a loaded machine.
    request.grant_expires_in = Some(prost_types::Duration {
        seconds: 3,
        nanos: 0,
    });
    let grant = app
        .approver()
        .decide(request)
        .await
        .expect("decide")
        .into_inner()
        .grant
        .expect("a grant");
    // Read (and kept) while live.
    assert_eq!(
        submitted(&app, "s", "live", "shell").await,
        (CallStatus::Approved, format!("grant:{}", grant.id))
    );
    let expires_at = grant.expires_at.expect("an expiry");
    let expires_at =
        std::time::UNIX_EPOCH + Duration::new(expires_at.seconds as u64, expires_at.nanos as u32);
    if let Ok(left) = expires_at.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
    assert_eq!(submitted(&app, "s", "expired", "shell").await, pending());
}

backend_tests! {
    a_rule_created_or_deleted_applies_to_the_next_submit,
    a_grant_applies_to_the_next_submit_and_a_revoked_one_stops_at_once,
    a_grant_read_while_live_does_not_apply_once_expired,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_rule_changed_through_one_replica_applies_to_the_next_submit_on_another() {
    let a = spawn_app_on(Backend::postgres(), |_| {}).await;
    let b = a.replica(|_| {}).await;
    rule_changes_apply_to_the_next_submit(&a, &b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_grant_made_or_revoked_through_one_replica_applies_to_the_next_submit_on_another() {
    let a = spawn_app_on(Backend::postgres(), |_| {}).await;
    let b = a.replica(|_| {}).await;
    grant_changes_apply_to_the_next_submit(&a, &b).await;
}
