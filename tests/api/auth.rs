//! Authentication and authorisation: no token is UNAUTHENTICATED, the wrong role is
//! PERMISSION_DENIED, health stays open, agents own their sessions (same ids never collide or
//! leak between agents), and the approver recorded in an outcome comes from the token.

use approval_broker::config::Config;
use approval_broker::door::auth::hash_token;
use approval_broker::proto::v1 as pb;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::helpers::*;

const AGENT_A: &str = "token-of-agent-a";
const AGENT_B: &str = "token-of-agent-b";
const ALICE: &str = "token-of-alice";
const ROOT: &str = "token-of-root";

fn with_tokens(config: &mut Config) {
    config.auth.tokens = Some(format!(
        "agent agent-a {}; agent agent-b {}\napprover alice {}; admin root {}",
        hash_token(AGENT_A),
        hash_token(AGENT_B),
        hash_token(ALICE),
        hash_token(ROOT)
    ));
}

type Bearer = Box<dyn FnMut(Request<()>) -> Result<Request<()>, Status> + Send + Sync>;

fn bearer(token: &str) -> Bearer {
    let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("header");
    Box::new(move |mut request: Request<()>| {
        request
            .metadata_mut()
            .insert("authorization", value.clone());
        Ok(request)
    })
}

fn agent_as(app: &TestApp, token: &str) -> AgentServiceClient<InterceptedService<Channel, Bearer>> {
    AgentServiceClient::with_interceptor(app.channel.clone(), bearer(token))
}

fn approver_as(
    app: &TestApp,
    token: &str,
) -> ApproverServiceClient<InterceptedService<Channel, Bearer>> {
    ApproverServiceClient::with_interceptor(app.channel.clone(), bearer(token))
}

fn admin_as(app: &TestApp, token: &str) -> AdminServiceClient<InterceptedService<Channel, Bearer>> {
    AdminServiceClient::with_interceptor(app.channel.clone(), bearer(token))
}

fn submit_request(session: &str, call_id: &str, input: &str) -> pb::SubmitRequest {
    pb::SubmitRequest {
        batch: Some(batch(session, vec![call(call_id, "t", input)])),
    }
}

fn code<T>(result: Result<T, Status>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

async fn without_a_valid_token_every_service_is_unauthenticated_and_health_stays_open(
    app: TestApp,
) {
    assert_eq!(
        code(app.agent().submit(submit_request("s", "c", "{}")).await),
        Code::Unauthenticated
    );
    assert_eq!(
        code(
            app.approver()
                .list_pending(pb::ListPendingRequest::default())
                .await
        ),
        Code::Unauthenticated
    );
    assert_eq!(
        code(
            app.admin()
                .list_calls(pb::ListCallsRequest::default())
                .await
        ),
        Code::Unauthenticated
    );
    assert_eq!(
        code(
            agent_as(&app, "forged")
                .submit(submit_request("s", "c", "{}"))
                .await
        ),
        Code::Unauthenticated
    );
    let mut health = tonic_health::pb::health_client::HealthClient::new(app.channel.clone());
    let status = health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health needs no token")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
}

async fn a_token_of_the_wrong_role_is_permission_denied_and_admin_may_call_everything(
    app: TestApp,
) {
    assert_eq!(
        code(
            approver_as(&app, AGENT_A)
                .list_pending(pb::ListPendingRequest::default())
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            admin_as(&app, AGENT_A)
                .list_calls(pb::ListCallsRequest::default())
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            agent_as(&app, ALICE)
                .submit(submit_request("s", "c", "{}"))
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            admin_as(&app, ALICE)
                .list_calls(pb::ListCallsRequest::default())
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            agent_as(&app, AGENT_A)
                .submit(submit_request("s", "c", "{}"))
                .await
        ),
        Code::Ok
    );
    assert_eq!(
        code(
            approver_as(&app, ALICE)
                .list_pending(pb::ListPendingRequest::default())
                .await
        ),
        Code::Ok
    );
    assert_eq!(
        code(
            agent_as(&app, ROOT)
                .submit(submit_request("s", "r", "{}"))
                .await
        ),
        Code::Ok
    );
    assert_eq!(
        code(
            approver_as(&app, ROOT)
                .list_pending(pb::ListPendingRequest::default())
                .await
        ),
        Code::Ok
    );
    assert_eq!(
        code(
            admin_as(&app, ROOT)
                .list_calls(pb::ListCallsRequest::default())
                .await
        ),
        Code::Ok
    );
}

async fn agents_with_the_same_session_and_call_ids_never_see_or_touch_each_others_calls(
    app: TestApp,
) {
    let mut a = agent_as(&app, AGENT_A);
    let mut b = agent_as(&app, AGENT_B);
    // The same identity, different inputs: no collision, two calls.
    a.submit(submit_request("s", "c1", r#"{"who":"a"}"#))
        .await
        .expect("a submits");
    let b_ack = b
        .submit(submit_request("s", "c1", r#"{"who":"b"}"#))
        .await
        .expect("b submits")
        .into_inner();
    assert!(
        matches!(
            b_ack.acks[0].result,
            Some(pb::call_ack::Result::Accepted(_))
        ),
        "{b_ack:?}"
    );
    a.submit(submit_request("s", "only-a", "{}"))
        .await
        .expect("a submits");

    // b cannot see a's call.
    let states = b
        .get_outcomes(pb::GetOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec!["only-a".into()],
        })
        .await
        .expect("lookup")
        .into_inner();
    assert!(matches!(
        states.calls[0].state,
        Some(pb::call_state::State::Unknown(_))
    ));

    // b cancelling the whole session cancels b's calls only.
    let cancelled = b
        .cancel(pb::CancelRequest {
            target: Some(pb::CancelTarget {
                session_id: "s".into(),
                target: Some(pb::cancel_target::Target::WholeSession(true)),
                reason: String::new(),
            }),
        })
        .await
        .expect("cancel")
        .into_inner()
        .result
        .expect("result");
    assert_eq!(cancelled.cancelled.len(), 1);
    assert_eq!(cancelled.cancelled[0].agent, "agent-b");
    let a_states = a
        .get_outcomes(pb::GetOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec!["c1".into(), "only-a".into()],
        })
        .await
        .expect("lookup")
        .into_inner();
    for state in &a_states.calls {
        match &state.state {
            Some(pb::call_state::State::Pending(call)) => assert_eq!(call.agent, "agent-a"),
            other => panic!("a's calls stay pending: {other:?}"),
        }
    }

    // An approver sees both agents' calls and decides a's by naming its agent.
    let mut alice = approver_as(&app, ALICE);
    let mut request = decide_request("s", "c1", pb::Decision::Approve, "");
    request.agent = "agent-a".into();
    let outcome = alice
        .decide(request)
        .await
        .expect("decide")
        .into_inner()
        .outcome
        .expect("outcome");
    assert_eq!(
        (outcome.agent.as_str(), outcome.input_json.as_str()),
        ("agent-a", r#"{"who":"a"}"#)
    );
}

async fn the_recorded_approver_comes_from_the_token_never_from_the_request(app: TestApp) {
    agent_as(&app, AGENT_A)
        .submit(submit_request("s", "c1", "{}"))
        .await
        .expect("submit");
    let mut request = decide_request("s", "c1", pb::Decision::Deny, "no");
    request.agent = "agent-a".into();
    request.approver = "mallory".into();
    let outcome = approver_as(&app, ALICE)
        .decide(request)
        .await
        .expect("decide")
        .into_inner()
        .outcome
        .expect("outcome");
    assert_eq!(outcome.decided_by, "approver:alice");
}

/// An approver may remember decisions; only an admin may inspect or revoke what was remembered
/// or manage rules; and a grant decides only the calls of the agent whose call was decided.
async fn grants_belong_to_one_agent_and_only_admins_manage_them(app: TestApp) {
    agent_as(&app, AGENT_A)
        .submit(submit_request("s", "c1", r#"{"x":1}"#))
        .await
        .expect("submit");
    let mut request = decide_request("s", "c1", pb::Decision::Approve, "");
    request.agent = "agent-a".into();
    request.scope = pb::Scope::Always as i32;
    request.matcher = Some(any_input());
    let grant = approver_as(&app, ALICE)
        .decide(request)
        .await
        .expect("an approver may remember a decision")
        .into_inner()
        .grant
        .expect("a grant");
    assert_eq!(
        (grant.agent.as_str(), grant.created_by.as_str()),
        ("agent-a", "approver:alice")
    );
    let status = |response: pb::SubmitResponse| match &response.acks[0].result {
        Some(pb::call_ack::Result::Accepted(a)) => a.status,
        other => panic!("{other:?}"),
    };
    let mine = agent_as(&app, AGENT_A)
        .submit(submit_request("s2", "c2", r#"{"x":2}"#))
        .await
        .expect("submit")
        .into_inner();
    assert_eq!(status(mine), CallStatus::Approved as i32);
    let theirs = agent_as(&app, AGENT_B)
        .submit(submit_request("s2", "c2", r#"{"x":2}"#))
        .await
        .expect("submit")
        .into_inner();
    assert_eq!(
        status(theirs),
        CallStatus::Pending as i32,
        "agent-a's grant does not decide agent-b's calls"
    );

    assert_eq!(
        code(
            admin_as(&app, ALICE)
                .list_grants(pb::ListGrantsRequest::default())
                .await
        ),
        Code::PermissionDenied
    );
    assert_eq!(
        code(
            admin_as(&app, ALICE)
                .create_rule(pb::CreateRuleRequest {
                    rule: Some(rule("r", "t", pb::Effect::Allow, 0, None)),
                })
                .await
        ),
        Code::PermissionDenied
    );
    let revoked = admin_as(&app, ROOT)
        .revoke_grant(pb::RevokeGrantRequest {
            target: Some(pb::revoke_grant_request::Target::Id(grant.id)),
            agent: String::new(),
        })
        .await
        .expect("an admin may revoke")
        .into_inner();
    assert_eq!(revoked.grants[0].revoked_by, "root");
}

backend_tests! {
    grants_belong_to_one_agent_and_only_admins_manage_them => super::with_tokens,
    without_a_valid_token_every_service_is_unauthenticated_and_health_stays_open => super::with_tokens,
    a_token_of_the_wrong_role_is_permission_denied_and_admin_may_call_everything => super::with_tokens,
    agents_with_the_same_session_and_call_ids_never_see_or_touch_each_others_calls => super::with_tokens,
    the_recorded_approver_comes_from_the_token_never_from_the_request => super::with_tokens,
}
