//! `approval-broker hook claude-code`: Claude Code's `PreToolUse` and `PermissionRequest` hooks,
//! answered by the broker. Claude Code runs the command with the hook input as JSON on standard
//! input; the command submits the tool call (the hook's `session_id`, and its `tool_use_id` as
//! the call id, so running the hook again for the same call is idempotent), waits for the
//! outcome, and prints the hook's decision JSON with exit code 0: allow (with `updatedInput` when
//! the approver edited the input), or deny with the outcome's tool-result text, which the model
//! reads. The shapes are Claude Code's documented ones (its hooks reference, and the CLI's own
//! output schema). This file must never answer "allow" for anything but an APPROVED outcome: a
//! timeout, an unreachable broker or a refusal answers "deny" or "ask" as configured, and input
//! it cannot read exits 2, which blocks the call.
//!
//! A `PermissionRequest` carries no tool-use id; each one gets a fresh call id, since Claude Code
//! shows a permission dialog once per question: the same command asked again later is a new
//! question for the approver, not the old answer.
//!
//! Configuration (`~/.claude/settings.json` or `<project>/.claude/settings.json`); Claude Code's
//! hook `timeout` (seconds, default 600) must stay above `--timeout` plus 15 seconds:
//!
//! ```json
//! {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [
//!   {"type": "command", "command": "approval-broker hook claude-code --timeout 5m", "timeout": 330}]}]}}
//! ```

use serde_json::{Map, Value, json};

use super::host_call::{
    Answer, HookHost, HostCall, HostHook, Rendered, approver_message, json_object, optional_string,
    required_object, required_string, summary_title,
};

/// Claude Code's hook (`approval-broker hook claude-code`).
pub struct ClaudeCode;

/// The hook events this command answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    PreToolUse,
    PermissionRequest,
}

impl HookEvent {
    fn name(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PermissionRequest => "PermissionRequest",
        }
    }
}

impl HostHook for ClaudeCode {
    const HOST: HookHost = HookHost::ClaudeCode;
    type Event = HookEvent;

    fn parse(text: &str) -> Result<(HookEvent, HostCall), String> {
        parse(text)
    }

    /// Claude Code runs `updatedInput` as given, for both events.
    fn hand_back(_: &HookEvent, _: &HostCall, _: &Map<String, Value>) -> Result<(), String> {
        Ok(())
    }

    fn render(event: &HookEvent, answer: &Answer) -> Rendered {
        Rendered::json(to_hook_output(answer, *event))
    }
}

/// Reads Claude Code's hook input; an error names the field at fault. A `PermissionRequest`
/// has no tool-use id, so it gets a fresh call id: each permission dialog is its own call (the
/// same command asked again later is a new question, not the old answer).
pub fn parse(text: &str) -> Result<(HookEvent, HostCall), String> {
    let mut fields = json_object(text)?;
    let event = match required_string(&fields, "hook_event_name")?.as_str() {
        "PreToolUse" => HookEvent::PreToolUse,
        "PermissionRequest" => HookEvent::PermissionRequest,
        other => {
            return Err(format!(
                "hook_event_name: `{other}` is not an event this hook answers \
                 (PreToolUse or PermissionRequest)"
            ));
        }
    };
    let tool_use_id = match event {
        HookEvent::PreToolUse => Some(required_string(&fields, "tool_use_id")?),
        HookEvent::PermissionRequest => optional_string(&fields, "tool_use_id")?,
    };
    let tool_input = required_object(&mut fields, "tool_input")?;
    let session_id = required_string(&fields, "session_id")?;
    let tool_name = required_string(&fields, "tool_name")?;
    let cwd = optional_string(&fields, "cwd")?;
    let facts: Vec<String> = optional_string(&fields, "permission_mode")?
        .map(|mode| format!("permission mode `{mode}`"))
        .into_iter()
        .collect();
    let call_id =
        tool_use_id.unwrap_or_else(|| format!("permission-request-{}", uuid::Uuid::now_v7()));
    let message = approver_message(
        HookHost::ClaudeCode,
        (&tool_name, &tool_input),
        &session_id,
        event.name(),
        &facts,
        &[],
    );
    let call = HostCall {
        title: summary_title(&tool_name, &tool_input),
        message,
        session_id,
        call_id,
        tool_name,
        tool_input,
        cwd,
    };
    Ok((event, call))
}

/// The hook output JSON for `event`, in the shape Claude Code documents for it.
pub fn to_hook_output(answer: &Answer, event: HookEvent) -> Value {
    match (event, answer) {
        (
            HookEvent::PreToolUse,
            Answer::Allow {
                reason,
                updated_input,
            },
        ) => {
            let mut specific = json!({
                "hookEventName": "PreToolUse",
                "permissionDecision": "allow",
                "permissionDecisionReason": reason,
            });
            if let Some(input) = updated_input {
                specific["updatedInput"] = Value::Object(input.clone());
            }
            json!({ "hookSpecificOutput": specific })
        }
        (
            HookEvent::PreToolUse,
            Answer::Deny {
                reason,
                system_message,
            },
        ) => {
            let mut output = json!({ "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }});
            if let Some(message) = system_message {
                output["systemMessage"] = json!(message);
            }
            output
        }
        (HookEvent::PreToolUse, Answer::Ask { reason }) => json!({
            "systemMessage": reason,
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "ask",
                "permissionDecisionReason": reason,
            },
        }),
        (HookEvent::PermissionRequest, Answer::Allow { updated_input, .. }) => {
            let mut decision = json!({ "behavior": "allow" });
            if let Some(input) = updated_input {
                decision["updatedInput"] = Value::Object(input.clone());
            }
            json!({ "hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": decision,
            }})
        }
        (
            HookEvent::PermissionRequest,
            Answer::Deny {
                reason,
                system_message,
            },
        ) => {
            let mut output = json!({ "hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": { "behavior": "deny", "message": reason },
            }});
            if let Some(message) = system_message {
                output["systemMessage"] = json!(message);
            }
            output
        }
        // A PermissionRequest hook asks by deciding nothing: Claude Code then shows its own
        // permission dialog. The message tells the user why.
        (HookEvent::PermissionRequest, Answer::Ask { reason }) => json!({
            "systemMessage": reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre_tool_use(tool_input: Value) -> (HookEvent, HostCall) {
        parse(
            &json!({
                "session_id": "s", "transcript_path": "/t.jsonl", "cwd": "/repo",
                "hook_event_name": "PreToolUse", "tool_name": "Bash",
                "tool_input": tool_input, "tool_use_id": "toolu_1",
            })
            .to_string(),
        )
        .expect("a valid input")
    }

    #[test]
    fn a_pre_tool_use_is_the_call_its_tool_use_id_names() {
        let (event, call) = pre_tool_use(json!({"command": "cat <<EOF\nrm -rf /\nEOF"}));
        assert_eq!(event, HookEvent::PreToolUse);
        assert_eq!(call.title, "Bash: cat <<EOF rm -rf / EOF");
        let spec = call.spec(HookHost::ClaudeCode, None);
        assert_eq!(
            (
                spec.call_id.as_str(),
                spec.workspace.as_str(),
                spec.host.as_str()
            ),
            ("toolu_1", "/repo", "claude-code")
        );
    }

    #[test]
    fn a_permission_request_needs_no_tool_use_id_and_gets_a_fresh_call_id() {
        let text = json!({
            "session_id": "s", "transcript_path": "/t.jsonl", "cwd": "/repo",
            "hook_event_name": "PermissionRequest", "tool_name": "Write",
            "tool_input": {"file_path": "/repo/a.txt", "content": "hi"},
        })
        .to_string();
        let (_, a) = parse(&text).expect("valid");
        let (_, b) = parse(&text).expect("valid");
        assert!(a.call_id.starts_with("permission-request-"));
        assert_ne!(a.call_id, b.call_id);
        assert_eq!(a.title, "Write: /repo/a.txt");
    }

    #[test]
    fn malformed_inputs_are_refused_naming_the_field() {
        let (_, call) = pre_tool_use(json!({"command": "ls"}));
        assert!(call.message.starts_with("Claude Code asks to run `Bash`"));
        for (input, field) in [
            (json!({"hook_event_name": "PostToolUse"}), "hook_event_name"),
            (
                json!({"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash",
                       "tool_input": {}}),
                "tool_use_id",
            ),
            (
                json!({"hook_event_name": "PreToolUse", "session_id": "s", "tool_name": "Bash",
                       "tool_use_id": "t", "tool_input": "ls"}),
                "tool_input",
            ),
        ] {
            let error = parse(&input.to_string()).expect_err("refused");
            assert!(error.starts_with(field), "{field}: {error}");
        }
    }
}
