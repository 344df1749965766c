//! `approval-broker hook claude-code`, run as Claude Code runs it: the real binary, the hook input
//! on standard input (fixtures in `tests/fixtures/claude_code/`, shaped as Claude Code's hooks
//! reference and its CLI's input schema give them), a real broker, decisions through
//! `ApproverService`. Each answer is compared with the expected output in
//! `tests/fixtures/claude_code/outputs/` and checked against Claude Code's documented output
//! schema; `tests/claude_code_hook_schema.py` checks the same files against the types of the
//! `claude-agent-sdk` package. The promises: only an approval allows, edits are what runs,
//! the model reads the denial's text, and a timeout or an unreachable broker fails closed.

use std::process::Child;
use std::time::Duration;

use approval_broker::proto::v1 as pb;
use serde_json::{Value, json};

use crate::helpers::*;

fn fixture(name: &str) -> Value {
    fixture_json(&format!("claude_code/{name}.json"))
}

fn expected_output(name: &str) -> Value {
    fixture(&format!("outputs/{name}"))
}

/// Starts the hook against `broker` with `args`, writes `input` to its standard input.
fn start_hook(broker: &str, args: &[&str], input: &Value) -> Child {
    start_hook_with_token(broker, args, None, input)
}

/// [`start_hook`] with `APPROVALS_BROKER_TOKEN` set to `token`.
fn start_hook_with_token(broker: &str, args: &[&str], token: Option<&str>, input: &Value) -> Child {
    spawn_hook("claude-code", broker, args, token, input)
}

impl HookResult {
    fn json(&self) -> Value {
        assert_eq!(self.code, 0, "stderr: {}", self.stderr);
        assert_eq!(
            self.stdout.lines().count(),
            1,
            "one JSON line: {}",
            self.stdout
        );
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// Waits until the broker holds `call_id` of `session` pending, and returns it.
async fn pending_call(app: &TestApp, session: &str, call_id: &str) -> pb::Call {
    for _ in 0..400 {
        if let Some(pb::call_state::State::Pending(call)) =
            states(app, session, &[call_id]).await.remove(0).state
        {
            return call;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{call_id} never became pending");
}

async fn approve_with_edit(app: &TestApp, call: &pb::Call, edited: &Value) {
    let mut request = decide_request(&call.session_id, &call.call_id, pb::Decision::Approve, "");
    request.edited_input_json = edited.to_string();
    app.approver().decide(request).await.expect("approve");
}

/// Checks `output` against Claude Code's documented hook output schema, strictly: only the
/// documented keys, each with a documented value. The schema: the hooks reference's "JSON
/// output" (common fields; `hookSpecificOutput` for PreToolUse with `permissionDecision`
/// allow/deny/ask/defer, `permissionDecisionReason`, `updatedInput`, `additionalContext`; for
/// PermissionRequest a `decision` with `behavior` allow (+ `updatedInput`,
/// `updatedPermissions`) or deny (+ `message`, `interrupt`)), as the CLI's own schema and
/// `claude_agent_sdk.types.SyncHookJSONOutput` give it.
fn assert_documented_output(event: &str, output: &Value) {
    let top = output.as_object().expect("an object");
    for (key, value) in top {
        match key.as_str() {
            "continue" | "suppressOutput" => assert!(value.is_boolean(), "{key}: {output}"),
            "stopReason" | "systemMessage" | "reason" => {
                assert!(value.is_string(), "{key}: {output}")
            }
            "decision" => assert!(
                matches!(value.as_str(), Some("approve" | "block")),
                "{output}"
            ),
            "hookSpecificOutput" => assert_documented_specific(event, value),
            other => panic!("`{other}` is not a documented hook output key: {output}"),
        }
    }
}

fn assert_documented_specific(event: &str, specific: &Value) {
    let fields = specific
        .as_object()
        .expect("hookSpecificOutput is an object");
    assert_eq!(
        fields.get("hookEventName"),
        Some(&json!(event)),
        "{specific}"
    );
    for (key, value) in fields {
        match (event, key.as_str()) {
            (_, "hookEventName") => {}
            ("PreToolUse", "permissionDecision") => assert!(
                matches!(value.as_str(), Some("allow" | "deny" | "ask" | "defer")),
                "{specific}"
            ),
            ("PreToolUse", "permissionDecisionReason" | "additionalContext") => {
                assert!(value.is_string(), "{specific}")
            }
            ("PreToolUse", "updatedInput") => assert!(value.is_object(), "{specific}"),
            ("PermissionRequest", "decision") => assert_documented_decision(value),
            (_, other) => panic!("`{other}` is not documented for {event}: {specific}"),
        }
    }
    if event == "PermissionRequest" {
        assert!(fields.contains_key("decision"), "decision is required");
    }
}

fn assert_documented_decision(decision: &Value) {
    let fields = decision.as_object().expect("decision is an object");
    let allowed: &[&str] = match fields.get("behavior").and_then(Value::as_str) {
        Some("allow") => &["behavior", "updatedInput", "updatedPermissions"],
        Some("deny") => &["behavior", "message", "interrupt"],
        _ => panic!("behavior must be allow or deny: {decision}"),
    };
    for (key, value) in fields {
        assert!(allowed.contains(&key.as_str()), "`{key}` in {decision}");
        match key.as_str() {
            "updatedInput" => assert!(value.is_object()),
            "message" => assert!(value.is_string()),
            "interrupt" => assert!(value.is_boolean()),
            _ => {}
        }
    }
}

/// The output, checked against the schema and equal to the expected file.
fn assert_answer(event: &str, result: &HookResult, expected: &str) {
    let output = result.json();
    assert_documented_output(event, &output);
    assert_eq!(
        output,
        expected_output(expected),
        "stderr: {}",
        result.stderr
    );
}

#[tokio::test]
async fn a_pre_tool_use_call_a_person_approves_is_allowed() {
    let app = spawn_app().await;
    let input = fixture("pre_tool_use");
    let hook = start_hook(&broker_url(&app), &[], &input);

    let call = pending_call(&app, "abc123", "toolu_01ABC123").await;
    assert_eq!(call.tool, "Bash");
    assert_eq!(call.title, "Bash: npm test");
    assert_eq!(call.workspace, "/home/user/my-project");
    assert_eq!(
        serde_json::from_str::<Value>(&call.input_json).unwrap(),
        input["tool_input"]
    );
    approve(&app, "abc123", "toolu_01ABC123").await;

    assert_answer(
        "PreToolUse",
        &finish_hook(hook).await,
        "pre_tool_use_approved",
    );
}

#[tokio::test]
async fn an_edited_approval_allows_with_the_edited_input_as_updated_input() {
    let app = spawn_app().await;
    let hook = start_hook(&broker_url(&app), &[], &fixture("pre_tool_use"));
    let call = pending_call(&app, "abc123", "toolu_01ABC123").await;
    let edited = json!({"command": "npm test -- --runInBand", "description": "Run the test suite"});
    approve_with_edit(&app, &call, &edited).await;

    let result = finish_hook(hook).await;
    assert_answer("PreToolUse", &result, "pre_tool_use_approved_edited");
    assert_eq!(result.json()["hookSpecificOutput"]["updatedInput"], edited);
}

#[tokio::test]
async fn a_denial_denies_with_the_text_the_model_reads() {
    let app = spawn_app().await;
    let hook = start_hook(&broker_url(&app), &[], &fixture("pre_tool_use"));
    pending_call(&app, "abc123", "toolu_01ABC123").await;
    let outcome = deny(&app, "abc123", "toolu_01ABC123", "run the linter first")
        .await
        .outcome
        .expect("an outcome");

    let result = finish_hook(hook).await;
    assert_answer("PreToolUse", &result, "pre_tool_use_denied");
    assert_eq!(
        result.json()["hookSpecificOutput"]["permissionDecisionReason"],
        json!(outcome.tool_result)
    );
}

#[tokio::test]
async fn no_decision_in_time_denies_by_default_and_cancels_the_call() {
    let app = spawn_app().await;
    let hook = start_hook(
        &broker_url(&app),
        &["--timeout", "1s"],
        &fixture("pre_tool_use"),
    );

    let result = finish_hook(hook).await;
    assert_answer("PreToolUse", &result, "pre_tool_use_timeout_deny");
    assert!(
        result.stderr.contains("No approver decided within 1s"),
        "{}",
        result.stderr
    );
    // Nobody is asked a question nobody waits for any more.
    let outcome = outcome_of(&app, "abc123", "toolu_01ABC123").await;
    assert_eq!(status_of(&outcome), CallStatus::Cancelled);
}

#[tokio::test]
async fn no_decision_in_time_asks_the_user_when_configured() {
    let app = spawn_app().await;
    let args = ["--timeout", "1s", "--on-timeout", "ask"];
    let result = finish_hook(start_hook(
        &broker_url(&app),
        &args,
        &fixture("pre_tool_use"),
    ))
    .await;
    assert_answer("PreToolUse", &result, "pre_tool_use_timeout_ask");

    let request = fixture("permission_request");
    let result = finish_hook(start_hook(&broker_url(&app), &args, &request)).await;
    // A PermissionRequest hook asks by deciding nothing: Claude Code shows its own dialog.
    assert_answer(
        "PermissionRequest",
        &result,
        "permission_request_timeout_ask",
    );
}

#[tokio::test]
async fn an_unreachable_broker_fails_closed_with_a_message_on_stderr() {
    let nowhere = format!("http://127.0.0.1:{}", free_port().expect("a free port"));
    for (event, input) in [
        ("PreToolUse", fixture("pre_tool_use")),
        ("PermissionRequest", fixture("permission_request")),
    ] {
        // The default: deny, and the model reads why.
        let result = finish_hook(start_hook(&nowhere, &[], &input)).await;
        let output = result.json();
        assert_documented_output(event, &output);
        let reason = match event {
            "PreToolUse" => {
                assert_eq!(output["hookSpecificOutput"]["permissionDecision"], "deny");
                output["hookSpecificOutput"]["permissionDecisionReason"].clone()
            }
            _ => {
                assert_eq!(output["hookSpecificOutput"]["decision"]["behavior"], "deny");
                output["hookSpecificOutput"]["decision"]["message"].clone()
            }
        };
        let reason = reason.as_str().expect("a reason");
        assert!(reason.contains(&nowhere), "{reason}");
        assert!(reason.contains("could not be reached"), "{reason}");
        assert!(reason.ends_with("The tool was not run."), "{reason}");
        assert!(
            result.stderr.contains(&nowhere) && result.stderr.contains("denied"),
            "stderr: {}",
            result.stderr
        );

        // `--on-unreachable ask`: Claude Code asks its user instead; never an allow.
        let result = finish_hook(start_hook(&nowhere, &["--on-unreachable", "ask"], &input)).await;
        let output = result.json();
        assert_documented_output(event, &output);
        if event == "PreToolUse" {
            assert_eq!(output["hookSpecificOutput"]["permissionDecision"], "ask");
        } else {
            assert!(output.get("hookSpecificOutput").is_none(), "{output}");
        }
        let message = output["systemMessage"].as_str().expect("a message");
        assert!(message.contains(&nowhere), "{message}");
        assert!(
            result.stderr.contains(&nowhere),
            "stderr: {}",
            result.stderr
        );
    }
}

#[tokio::test]
async fn a_permission_request_is_answered_with_a_decision_object() {
    let app = spawn_app().await;
    let input = fixture("permission_request");

    let hook = start_hook(&broker_url(&app), &[], &input);
    let call = the_pending_call(&app, "abc123").await;
    assert_eq!(call.title, "Bash: rm -rf node_modules");
    approve(&app, "abc123", &call.call_id).await;
    assert_answer(
        "PermissionRequest",
        &finish_hook(hook).await,
        "permission_request_approved",
    );

    // Each permission dialog is its own call: the next one waits for its own decision.
    let hook = start_hook(&broker_url(&app), &[], &input);
    let call = the_pending_call(&app, "abc123").await;
    let edited =
        json!({"command": "rm -rf ./node_modules", "description": "Remove node_modules directory"});
    approve_with_edit(&app, &call, &edited).await;
    assert_answer(
        "PermissionRequest",
        &finish_hook(hook).await,
        "permission_request_approved_edited",
    );

    let hook = start_hook(&broker_url(&app), &[], &input);
    let call = the_pending_call(&app, "abc123").await;
    deny(&app, "abc123", &call.call_id, "keep the cache").await;
    assert_answer(
        "PermissionRequest",
        &finish_hook(hook).await,
        "permission_request_denied",
    );
}

#[tokio::test]
async fn a_retried_hook_for_the_same_tool_use_id_is_the_same_call() {
    let app = spawn_app().await;
    let input = fixture("pre_tool_use");
    // Two runs at once for one tool use (a retry while the first still waits).
    let first = start_hook(&broker_url(&app), &[], &input);
    pending_call(&app, "abc123", "toolu_01ABC123").await;
    let second = start_hook(&broker_url(&app), &[], &input);
    tokio::time::sleep(Duration::from_millis(300)).await;
    approve(&app, "abc123", "toolu_01ABC123").await;
    assert_answer(
        "PreToolUse",
        &finish_hook(first).await,
        "pre_tool_use_approved",
    );
    assert_answer(
        "PreToolUse",
        &finish_hook(second).await,
        "pre_tool_use_approved",
    );

    // A run after the decision gets the stored outcome at once.
    let again = finish_hook(start_hook(&broker_url(&app), &["--timeout", "2s"], &input)).await;
    assert_answer("PreToolUse", &again, "pre_tool_use_approved");
    assert_eq!(all_calls(&app).await.len(), 1, "one call, stored once");
}

#[tokio::test]
async fn a_policy_rule_answers_without_a_person() {
    let app = spawn_app().await;
    create_rule(
        &app,
        rule(
            "tests",
            "Bash",
            pb::Effect::Allow,
            0,
            Some(fields(vec![prefix("command", "npm test")])),
        ),
    )
    .await;
    let result = finish_hook(start_hook(&broker_url(&app), &[], &fixture("pre_tool_use"))).await;
    let output = result.json();
    assert_documented_output("PreToolUse", &output);
    assert_eq!(output["hookSpecificOutput"]["permissionDecision"], "allow");
    assert_eq!(
        output["hookSpecificOutput"]["permissionDecisionReason"],
        "Approved through the approval broker (policy:tests)."
    );
}

#[tokio::test]
async fn unreadable_hook_input_blocks_the_call_with_exit_code_2() {
    let app = spawn_app().await;
    let mut without_id = fixture("pre_tool_use");
    without_id.as_object_mut().unwrap().remove("tool_use_id");
    let mut input_not_object = fixture("pre_tool_use");
    input_not_object["tool_input"] = json!("npm test");
    let mut other_event = fixture("pre_tool_use");
    other_event["hook_event_name"] = json!("PostToolUse");
    for (input, names) in [
        (without_id, "tool_use_id"),
        (input_not_object, "tool_input"),
        (other_event, "hook_event_name"),
        (json!("not an object"), "object"),
    ] {
        let result = finish_hook(start_hook(&broker_url(&app), &[], &input)).await;
        assert_eq!(result.code, 2, "{input}: {}", result.stdout);
        assert!(result.stdout.is_empty(), "{}", result.stdout);
        assert!(result.stderr.contains(names), "{names}: {}", result.stderr);
        assert!(result.stderr.contains("blocked"), "{}", result.stderr);
    }
    assert!(all_calls(&app).await.is_empty(), "nothing was submitted");
}

#[tokio::test]
async fn with_authentication_the_hook_submits_as_its_token_and_a_bad_token_fails_closed() {
    const AGENT: &str = "token-of-claude-code";
    const ALICE: &str = "token-of-alice";
    let app = spawn_app_on(Backend::Sqlite, |config| {
        config.auth.tokens = Some(format!(
            "agent claude-code {}; approver alice {}",
            approval_broker::door::auth::hash_token(AGENT),
            approval_broker::door::auth::hash_token(ALICE)
        ));
    })
    .await;
    let input = fixture("pre_tool_use");
    let hook = start_hook_with_token(&broker_url(&app), &[], Some(AGENT), &input);

    let mut approver = app.approver();
    let mut list = tonic::Request::new(pb::ListPendingRequest::default());
    let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {ALICE}").parse().unwrap();
    let call = loop {
        list.metadata_mut().insert("authorization", bearer.clone());
        let pending = approver
            .list_pending(list)
            .await
            .expect("list")
            .into_inner()
            .calls;
        if let Some(call) = pending.into_iter().next() {
            break call;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
        list = tonic::Request::new(pb::ListPendingRequest::default());
    };
    assert_eq!(
        call.agent, "claude-code",
        "the call belongs to the hook's token"
    );
    let mut decide = tonic::Request::new(pb::DecideRequest {
        agent: call.agent.clone(),
        ..decide_request("abc123", "toolu_01ABC123", pb::Decision::Approve, "")
    });
    decide.metadata_mut().insert("authorization", bearer);
    approver.decide(decide).await.expect("approve");
    let result = finish_hook(hook).await;
    let output = result.json();
    assert_documented_output("PreToolUse", &output);
    assert_eq!(output["hookSpecificOutput"]["permissionDecision"], "allow");

    // A wrong token is refused by the broker: the hook denies, saying so.
    let result = finish_hook(start_hook_with_token(
        &broker_url(&app),
        &[],
        Some("wrong"),
        &input,
    ))
    .await;
    let output = result.json();
    assert_eq!(output["hookSpecificOutput"]["permissionDecision"], "deny");
    let reason = output["hookSpecificOutput"]["permissionDecisionReason"]
        .as_str()
        .unwrap();
    assert!(reason.contains("Unauthenticated"), "{reason}");
    assert!(
        result.stderr.contains("Unauthenticated"),
        "{}",
        result.stderr
    );
}
