//! One RPC through the generated clients with its answer unwrapped (a test that expects a refusal
//! calls the client itself), and the listings read to their last page.

use std::time::Duration;

use approval_broker::proto::v1 as pb;
use tonic::Code;

use super::PATIENCE;
use super::requests::{batch, decide_request};
use super::spawn::TestApp;

pub use pb::CallStatus;
pub use pb::admin_service_client::AdminServiceClient;
pub use pb::agent_service_client::AgentServiceClient;
pub use pb::approver_service_client::ApproverServiceClient;

/// Submits through the unary RPC and returns the response.
pub async fn submit(app: &TestApp, batch: pb::BatchSpec) -> pb::SubmitResponse {
    app.agent()
        .submit(pb::SubmitRequest { batch: Some(batch) })
        .await
        .expect("submit")
        .into_inner()
}

pub async fn approve(app: &TestApp, session: &str, call_id: &str) -> pb::DecideResponse {
    app.approver()
        .decide(decide_request(session, call_id, pb::Decision::Approve, ""))
        .await
        .expect("approve")
        .into_inner()
}

pub async fn deny(app: &TestApp, session: &str, call_id: &str, reason: &str) -> pb::DecideResponse {
    app.approver()
        .decide(decide_request(session, call_id, pb::Decision::Deny, reason))
        .await
        .expect("deny")
        .into_inner()
}

/// Decides a call and remembers the decision with `scope` (and `matcher`, if given).
pub async fn decide_remembering(
    app: &TestApp,
    session: &str,
    call_id: &str,
    decision: pb::Decision,
    scope: pb::Scope,
    matcher: Option<pb::InputMatcher>,
) -> pb::DecideResponse {
    let mut request = decide_request(session, call_id, decision, "remembered");
    request.scope = scope as i32;
    request.matcher = matcher;
    app.approver()
        .decide(request)
        .await
        .expect("decide")
        .into_inner()
}

/// Decides a call remembering the decision (see [`decide_remembering`]); returns the grant
/// that made.
pub async fn grant_by_deciding(
    app: &TestApp,
    session: &str,
    call_id: &str,
    decision: pb::Decision,
    scope: pb::Scope,
    matcher: Option<pb::InputMatcher>,
) -> pb::Grant {
    decide_remembering(app, session, call_id, decision, scope, matcher)
        .await
        .grant
        .expect("a grant")
}

/// Call `call_id` of session `session` (agent `default`) as stored, through GetCall.
pub async fn get_call(app: &TestApp, session: &str, call_id: &str) -> pb::Call {
    app.admin()
        .get_call(pb::GetCallRequest {
            session_id: session.into(),
            call_id: call_id.into(),
            agent: String::new(),
        })
        .await
        .expect("get call")
        .into_inner()
}

/// The status of the one call a submit acknowledged (its `accepted` status).
pub fn ack_status(response: &pb::SubmitResponse, index: usize) -> CallStatus {
    match &response.acks[index].result {
        Some(pb::call_ack::Result::Accepted(a) | pb::call_ack::Result::Duplicate(a)) => {
            CallStatus::try_from(a.status).expect("known status")
        }
        other => panic!("call {index} was not accepted: {other:?}"),
    }
}

/// The state of each named call, through GetOutcomes.
pub async fn states(app: &TestApp, session: &str, call_ids: &[&str]) -> Vec<pb::CallState> {
    app.agent()
        .get_outcomes(pb::GetOutcomesRequest {
            session_id: session.into(),
            call_ids: call_ids.iter().map(|s| s.to_string()).collect(),
        })
        .await
        .expect("get outcomes")
        .into_inner()
        .calls
}

/// The outcome of a decided call (panics if it is pending or unknown).
pub async fn outcome_of(app: &TestApp, session: &str, call_id: &str) -> pb::Outcome {
    match states(app, session, &[call_id]).await.remove(0).state {
        Some(pb::call_state::State::Outcome(outcome)) => outcome,
        other => panic!("{call_id} has no outcome: {other:?}"),
    }
}

/// Submits one call alone in a batch of `session`.
pub async fn submit_one(app: &TestApp, session: &str, spec: pb::CallSpec) -> pb::SubmitResponse {
    submit(app, batch(session, vec![spec])).await
}

/// The status and `decided_by` a single-call submit got (`decided_by` empty while pending).
pub async fn submitted_one(
    app: &TestApp,
    session: &str,
    spec: pb::CallSpec,
) -> (CallStatus, String) {
    let response = submit_one(app, session, spec).await;
    let decided_by = response
        .outcomes
        .first()
        .map(|o| o.decided_by.clone())
        .unwrap_or_default();
    (ack_status(&response, 0), decided_by)
}

/// An agent's view of an outcome as approvers are sent it: without its receipt, which only the
/// outcomes agents receive carry.
pub fn as_approvers_see(outcome: &pb::Outcome) -> pb::Outcome {
    pb::Outcome {
        receipt: String::new(),
        ..outcome.clone()
    }
}

pub fn status_of(outcome: &pb::Outcome) -> CallStatus {
    CallStatus::try_from(outcome.status).expect("known status")
}

/// Every page ListCalls answers for `request`, following `next_page_token` to the end.
pub async fn list_calls_pages(
    app: &TestApp,
    request: pb::ListCallsRequest,
) -> Vec<pb::ListCallsResponse> {
    testkit::every_page(|token| {
        let mut admin = app.admin();
        let request = pb::ListCallsRequest {
            page_size: 1000,
            page_token: token,
            ..request.clone()
        };
        async move {
            let page = admin.list_calls(request).await.expect("list calls");
            let page = page.into_inner();
            let next = page.next_page_token.clone();
            (page, next)
        }
    })
    .await
}

/// Every call in the store, through the admin audit view.
pub async fn all_calls(app: &TestApp) -> Vec<pb::Call> {
    list_calls_pages(app, pb::ListCallsRequest::default())
        .await
        .into_iter()
        .flat_map(|page| page.calls)
        .collect()
}

pub async fn create_rule(app: &TestApp, rule: pb::Rule) -> pb::Rule {
    app.admin()
        .create_rule(pb::CreateRuleRequest { rule: Some(rule) })
        .await
        .expect("create rule")
        .into_inner()
}

/// The grants ListGrants shows (active ones, or all with `include_inactive`), every page.
pub async fn list_grants(app: &TestApp, request: pb::ListGrantsRequest) -> Vec<pb::Grant> {
    let pages = testkit::every_page(|page_token| {
        let mut admin = app.admin();
        let request = pb::ListGrantsRequest {
            page_token,
            ..request.clone()
        };
        async move {
            let page = admin.list_grants(request).await.expect("list grants");
            let page = page.into_inner();
            (page.grants, page.next_page_token)
        }
    })
    .await;
    pages.into_iter().flatten().collect()
}

/// Explains a call described inline (agent `default`).
pub async fn explain_inline(
    app: &TestApp,
    session: &str,
    workspace: &str,
    tool: &str,
    input_json: &str,
) -> pb::ExplainResponse {
    let inline = pb::ExplainCall {
        agent: String::new(),
        session_id: session.into(),
        workspace: workspace.into(),
        tool: tool.into(),
        input_json: input_json.into(),
        host: String::new(),
    };
    app.admin()
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Inline(inline)),
        })
        .await
        .expect("explain")
        .into_inner()
}

/// Explains a stored call of agent `default`.
pub async fn explain_stored(app: &TestApp, session: &str, call_id: &str) -> pb::ExplainResponse {
    let stored = pb::GetCallRequest {
        session_id: session.into(),
        call_id: call_id.into(),
        agent: String::new(),
    };
    app.admin()
        .explain(pb::ExplainRequest {
            call: Some(pb::explain_request::Call::Stored(stored)),
        })
        .await
        .expect("explain")
        .into_inner()
}

/// Whether the call is stored (GetCall answers it) or not (NOT_FOUND).
pub async fn is_stored(app: &TestApp, session: &str, call_id: &str) -> bool {
    let found = app
        .admin()
        .get_call(pb::GetCallRequest {
            session_id: session.into(),
            call_id: call_id.into(),
            ..Default::default()
        })
        .await;
    match found {
        Ok(_) => true,
        Err(status) if status.code() == Code::NotFound => false,
        Err(status) => panic!("GetCall {session}/{call_id}: {status:?}"),
    }
}

/// Waits until retention pruned the call.
pub async fn until_pruned(app: &TestApp, session: &str, call_id: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while is_stored(app, session, call_id).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{session}/{call_id} was not pruned"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
