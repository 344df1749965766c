//! `approval-broker hook codex | gemini-cli | copilot | cursor`, run as their hosts run them: the
//! real binary, each host's hook input on standard input (fixtures in
//! `tests/fixtures/<host>/`, shaped as docs/design/agent-hosts.md records them; Cursor's from its
//! documentation only, since Cursor cannot be run offline), a real broker, decisions through
//! `ApproverService`. One table of every host's events; each promise is one test over the whole
//! table: only an approval allows, an approver's edit is what runs (in the host's edited-input
//! shape, or denied where the host cannot take one), the model reads the denial's text, a timeout
//! and an unreachable broker deny, unreadable input denies, and a retried hook is the same call.
//! The expected answers are `tests/fixtures/<host>/outputs.json`.

use std::process::Child;
use std::time::Duration;

use approval_broker::proto::v1 as pb;
use serde_json::{Value, json};

use crate::helpers::*;

/// One host event to run the hook with: `tests/fixtures/{dir}/{fixture}.json`.
struct Case {
    /// `approval-broker hook <command>`.
    command: &'static str,
    dir: &'static str,
    fixture: &'static str,
    /// The session id the input carries.
    session: &'static str,
}

const CASES: [Case; 12] = [
    case("codex", "codex", "pre_tool_use", "codex-s1"),
    case("codex", "codex", "permission_request", "codex-s2"),
    case("gemini-cli", "gemini_cli", "before_tool", "gemini-s1"),
    case("gemini-cli", "gemini_cli", "before_tool_mcp", "gemini-s2"),
    case("copilot", "copilot", "pre_tool_use", "copilot-s1"),
    case("copilot", "copilot", "pre_tool_use_pascal", "copilot-s2"),
    case("copilot", "copilot", "permission_request", "copilot-s3"),
    case("copilot", "copilot", "pre_tool_use_patch", "copilot-s4"),
    case("cursor", "cursor", "pre_tool_use", "cursor-c1"),
    case("cursor", "cursor", "before_shell_execution", "cursor-c2"),
    case("cursor", "cursor", "before_mcp_execution", "cursor-c3"),
    case("cursor", "cursor", "before_read_file", "cursor-c4"),
];

const fn case(
    command: &'static str,
    dir: &'static str,
    fixture: &'static str,
    session: &'static str,
) -> Case {
    Case {
        command,
        dir,
        fixture,
        session,
    }
}

impl Case {
    fn name(&self) -> String {
        format!("{}/{}", self.dir, self.fixture)
    }

    fn input(&self) -> Value {
        fixture_json(&format!("{}/{}.json", self.dir, self.fixture))
    }

    /// The answer expected when the call ends as `ending` (`null`: nothing printed).
    fn expected(&self, ending: &str) -> Value {
        let outputs = fixture_json(&format!("{}/outputs.json", self.dir));
        outputs["outputs"][self.fixture]
            .get(ending)
            .unwrap_or_else(|| panic!("{}: no expected `{ending}` output", self.name()))
            .clone()
    }

    /// The edited input the approver approves in the `approved_edited` ending.
    fn edit(&self) -> Value {
        fixture_json(&format!("{}/outputs.json", self.dir))["edits"][self.fixture].clone()
    }

    fn start(&self, broker: &str, args: &[&str]) -> Child {
        spawn_hook(self.command, broker, args, None, &self.input())
    }
}

impl HookResult {
    /// The one JSON line printed, or `null` for nothing; the run exited 0.
    fn answer(&self, name: &str) -> Value {
        assert_eq!(self.code, 0, "{name}: stderr: {}", self.stderr);
        if self.stdout.is_empty() {
            return Value::Null;
        }
        assert_eq!(self.stdout.lines().count(), 1, "{name}: {}", self.stdout);
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {}", self.stdout))
    }
}

async fn calls_of(app: &TestApp, session: &str) -> Vec<pb::Call> {
    all_calls(app)
        .await
        .into_iter()
        .filter(|call| call.session_id == session)
        .collect()
}

/// The text a denial gives the model, in whichever host's shape `output` is; `None` when the
/// output is not a denial. Cursor's `beforeReadFile` denies with no text: `Some("")`.
fn denial(output: &Value) -> Option<String> {
    let text = |value: &Value| Some(value.as_str().unwrap_or_default().to_owned());
    let specific = &output["hookSpecificOutput"];
    if specific["permissionDecision"] == "deny" {
        return text(&specific["permissionDecisionReason"]);
    }
    if specific["decision"]["behavior"] == "deny" {
        return text(&specific["decision"]["message"]);
    }
    if output["permissionDecision"] == "deny" {
        return text(&output["permissionDecisionReason"]);
    }
    if output["decision"] == "deny" {
        return text(&output["reason"]);
    }
    if output["behavior"] == "deny" {
        return text(&output["message"]);
    }
    if output["permission"] == "deny" {
        return text(&output["agent_message"]);
    }
    None
}

/// Whether `value` is `part` or holds it at any depth.
fn holds(value: &Value, part: &Value) -> bool {
    value == part
        || match value {
            Value::Object(fields) => fields.values().any(|v| holds(v, part)),
            Value::Array(items) => items.iter().any(|v| holds(v, part)),
            _ => false,
        }
}

#[tokio::test]
async fn every_host_s_call_a_person_approves_is_allowed_in_the_host_s_shape() {
    let app = spawn_app().await;
    let hooks: Vec<Child> = CASES
        .iter()
        .map(|case| case.start(&broker_url(&app), &[]))
        .collect();
    for (case, hook) in CASES.iter().zip(hooks) {
        let call = the_pending_call(&app, case.session).await;
        let input = case.input();
        assert_eq!(call.workspace, "/work/repo", "{}", case.name());
        assert_eq!(call.host, case.command, "CallSpec.host: {}", case.name());
        let submitted: Value = serde_json::from_str(&call.input_json).unwrap();
        match case.fixture {
            // Cursor's events other than preToolUse carry no tool input: the hook builds one.
            "before_shell_execution" => {
                assert_eq!(
                    submitted,
                    json!({"command": "git status", "cwd": "/work/repo"})
                )
            }
            "before_read_file" => {
                assert_eq!(submitted, json!({"file_path": "/work/repo/.env"}))
            }
            "pre_tool_use_patch" => {
                assert_eq!(submitted, json!({"patch": input["toolArgs"]}))
            }
            _ => {
                let raw = ["tool_input", "toolArgs", "toolInput"]
                    .iter()
                    .map(|key| &input[*key])
                    .find(|value| !value.is_null())
                    .unwrap();
                assert_eq!(&submitted, raw, "{}", case.name());
            }
        }
        approve(&app, case.session, &call.call_id).await;
        let result = finish_hook(hook).await;
        assert_eq!(
            result.answer(&case.name()),
            case.expected("approved"),
            "{}: {}",
            case.name(),
            result.stderr
        );
    }
}

#[tokio::test]
async fn an_edited_approval_runs_the_edit_or_is_denied_where_the_host_cannot_take_one() {
    let app = spawn_app().await;
    let hooks: Vec<Child> = CASES
        .iter()
        .map(|case| case.start(&broker_url(&app), &[]))
        .collect();
    for (case, hook) in CASES.iter().zip(hooks) {
        let call = the_pending_call(&app, case.session).await;
        let mut request = decide_request(case.session, &call.call_id, pb::Decision::Approve, "");
        request.edited_input_json = case.edit().to_string();
        app.approver().decide(request).await.expect("approve");
        let result = finish_hook(hook).await;
        let answer = result.answer(&case.name());
        assert_eq!(answer, case.expected("approved_edited"), "{}", case.name());
        // Whatever the shape: an edit the host cannot run is never an allow of the original.
        if denial(&answer).is_none() {
            assert!(holds(&answer, &case.edit()), "{}: {answer}", case.name());
        }
    }
}

#[tokio::test]
async fn a_denial_denies_with_the_text_the_model_reads() {
    let app = spawn_app().await;
    let hooks: Vec<Child> = CASES
        .iter()
        .map(|case| case.start(&broker_url(&app), &[]))
        .collect();
    for (case, hook) in CASES.iter().zip(hooks) {
        let call = the_pending_call(&app, case.session).await;
        let outcome = deny(&app, case.session, &call.call_id, "not now")
            .await
            .outcome
            .expect("an outcome");
        let answer = finish_hook(hook).await.answer(&case.name());
        assert_eq!(answer, case.expected("denied"), "{}", case.name());
        let text = denial(&answer).expect("a denial");
        if case.fixture != "before_read_file" {
            assert_eq!(text, outcome.tool_result, "{}", case.name());
        }
    }
}

#[tokio::test]
async fn no_decision_in_time_denies_and_cancels_the_call() {
    let app = spawn_app().await;
    // `ask` too, on a broker of its own (the same input is the same call): where the host
    // cannot ask (Codex's PreToolUse, Gemini CLI, Cursor's beforeReadFile) it denies; elsewhere
    // it must at least never allow.
    let ask_app = spawn_app().await;
    let hooks: Vec<(Child, Child)> = CASES
        .iter()
        .map(|case| {
            let deny = case.start(&broker_url(&app), &["--timeout", "1s"]);
            let ask = ["--timeout", "1s", "--on-timeout", "ask"];
            (deny, case.start(&broker_url(&ask_app), &ask))
        })
        .collect();
    for (case, (deny_hook, ask_hook)) in CASES.iter().zip(hooks) {
        let result = finish_hook(deny_hook).await;
        assert_eq!(
            result.answer(&case.name()),
            case.expected("timeout"),
            "{}",
            case.name()
        );
        assert!(
            result.stderr.contains("No approver decided within 1s"),
            "{}: {}",
            case.name(),
            result.stderr
        );
        let asked = finish_hook(ask_hook).await.answer(&case.name());
        let cannot_ask = matches!(
            (case.dir, case.fixture),
            ("codex", "pre_tool_use") | ("gemini_cli", _) | ("cursor", "before_read_file")
        );
        if cannot_ask {
            assert!(denial(&asked).is_some(), "{}: {asked}", case.name());
        }
        let text = asked.to_string();
        assert!(
            !text.contains("\"allow\"") && !text.contains("\"approve\""),
            "{}: {text}",
            case.name()
        );
        // Nobody is asked a question nobody waits for any more.
        for call in calls_of(&app, case.session).await {
            let outcome = outcome_of(&app, case.session, &call.call_id).await;
            assert_eq!(
                status_of(&outcome),
                CallStatus::Cancelled,
                "{}",
                case.name()
            );
        }
    }
}

#[tokio::test]
async fn an_unreachable_broker_denies_saying_so() {
    let nowhere = format!("http://127.0.0.1:{}", free_port().expect("a free port"));
    let hooks: Vec<Child> = CASES.iter().map(|case| case.start(&nowhere, &[])).collect();
    for (case, hook) in CASES.iter().zip(hooks) {
        let result = finish_hook(hook).await;
        let answer = result.answer(&case.name());
        let text = denial(&answer).unwrap_or_else(|| panic!("{}: {answer}", case.name()));
        if case.fixture != "before_read_file" {
            assert!(text.contains(&nowhere), "{}: {text}", case.name());
            assert!(
                text.contains("could not be reached"),
                "{}: {text}",
                case.name()
            );
        }
        assert!(
            result.stderr.contains(&nowhere) && result.stderr.contains("denied"),
            "{}: {}",
            case.name(),
            result.stderr
        );
    }
}

#[tokio::test]
async fn a_retried_hook_is_the_same_call() {
    let app = spawn_app().await;
    // Two runs at once for each call (a retry while the first still waits).
    let firsts: Vec<Child> = CASES
        .iter()
        .map(|case| case.start(&broker_url(&app), &[]))
        .collect();
    let mut pending = Vec::new();
    for case in &CASES {
        pending.push(the_pending_call(&app, case.session).await);
    }
    let seconds: Vec<Child> = CASES
        .iter()
        .map(|case| case.start(&broker_url(&app), &[]))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for ((case, call), (first, second)) in CASES
        .iter()
        .zip(&pending)
        .zip(firsts.into_iter().zip(seconds))
    {
        approve(&app, case.session, &call.call_id).await;
        let expected = case.expected("approved");
        assert_eq!(
            finish_hook(first).await.answer(&case.name()),
            expected,
            "{}",
            case.name()
        );
        assert_eq!(
            finish_hook(second).await.answer(&case.name()),
            expected,
            "{}",
            case.name()
        );
        // A run after the decision gets the stored outcome at once.
        let again = finish_hook(case.start(&broker_url(&app), &["--timeout", "2s"])).await;
        assert_eq!(again.answer(&case.name()), expected, "{}", case.name());
        assert_eq!(
            calls_of(&app, case.session).await.len(),
            1,
            "{}: one call, stored once",
            case.name()
        );
    }
}

#[tokio::test]
async fn unreadable_input_is_denied_naming_the_field_and_submits_nothing() {
    let app = spawn_app().await;
    let url = broker_url(&app);
    let mut codex = fixture_json("codex/pre_tool_use.json");
    codex.as_object_mut().unwrap().remove("tool_use_id");
    let mut gemini = fixture_json("gemini_cli/before_tool.json");
    gemini["tool_input"] = json!("ls");
    let mut cursor = fixture_json("cursor/before_shell_execution.json");
    cursor.as_object_mut().unwrap().remove("command");
    // Codex, Gemini CLI and Cursor block on exit code 2 with the reason on standard error.
    for (command, input, field) in [
        ("codex", codex, "tool_use_id"),
        ("gemini-cli", gemini, "tool_input"),
        ("cursor", cursor, "command"),
        ("codex", json!("not an object"), "object"),
    ] {
        let result = finish_hook(spawn_hook(command, &url, &[], None, &input)).await;
        assert_eq!(result.code, 2, "{command}: {}", result.stdout);
        assert!(result.stdout.is_empty(), "{command}: {}", result.stdout);
        assert!(
            result.stderr.contains(field),
            "{command} {field}: {}",
            result.stderr
        );
        assert!(
            result.stderr.contains("blocked"),
            "{command}: {}",
            result.stderr
        );
    }
    // Copilot skips a failed hook: it gets a denial in the event's shape instead.
    let mut pre = fixture_json("copilot/pre_tool_use.json");
    pre["toolArgs"] = json!(7);
    let mut request = fixture_json("copilot/permission_request.json");
    request.as_object_mut().unwrap().remove("sessionId");
    for (input, field) in [(pre, "toolArgs"), (request, "sessionId")] {
        let answer = finish_hook(spawn_hook("copilot", &url, &[], None, &input))
            .await
            .answer("copilot");
        let text = denial(&answer).unwrap_or_else(|| panic!("{answer}"));
        assert!(text.contains(field), "{field}: {text}");
    }
    assert!(all_calls(&app).await.is_empty(), "nothing was submitted");
}

#[tokio::test]
async fn a_policy_rule_answers_without_a_person() {
    let app = spawn_app().await;
    create_rule(
        &app,
        rule(
            "shell-tests",
            "bash",
            pb::Effect::Allow,
            0,
            Some(fields(vec![prefix("command", "npm test")])),
        ),
    )
    .await;
    let case = &CASES[4];
    assert_eq!(case.name(), "copilot/pre_tool_use");
    let answer = finish_hook(case.start(&broker_url(&app), &[]))
        .await
        .answer(&case.name());
    assert_eq!(
        answer,
        json!({"permissionDecision": "allow",
               "permissionDecisionReason": "Approved through the approval broker (policy:shell-tests)."})
    );
}

#[tokio::test]
async fn a_gemini_edit_that_drops_a_key_is_denied_not_merged_over_the_model_s_input() {
    let app = spawn_app().await;
    let case = &CASES[2];
    assert_eq!(case.name(), "gemini_cli/before_tool");
    let hook = case.start(&broker_url(&app), &[]);
    let call = the_pending_call(&app, case.session).await;
    let mut request = decide_request(case.session, &call.call_id, pb::Decision::Approve, "");
    // Gemini CLI would merge this over `{command, description}` and keep the description.
    request.edited_input_json = json!({"command": "ls -l"}).to_string();
    app.approver().decide(request).await.expect("approve");
    let answer = finish_hook(hook).await.answer(&case.name());
    assert_eq!(
        answer,
        json!({"decision": "deny", "reason": "The approver approved an edited input, but Gemini \
               CLI merges an edited input over the model's and cannot drop `description`; the \
               tool was not run."})
    );
}
