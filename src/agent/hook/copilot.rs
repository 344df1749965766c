//! `approval-broker hook copilot`: GitHub Copilot CLI's `preToolUse` and `permissionRequest`
//! hooks, answered by the broker (shapes: docs/design/agent-hosts.md §3, GitHub's "Copilot CLI
//! hooks reference", which documents `modifiedArgs` and the exit codes).
//!
//! Copilot speaks two dialects, picked by the event key of the hook file: camelCase `preToolUse`
//! (`{sessionId, timestamp (ms), cwd, toolName, toolArgs}`; answered
//! `{"permissionDecision": "allow"|"deny"|"ask", "permissionDecisionReason", "modifiedArgs"}`)
//! and PascalCase `PreToolUse` (Claude-style `{hook_event_name, session_id, timestamp, cwd,
//! tool_name, tool_input}` with Claude's tool names; answered with the same top-level fields and
//! the same decision again as Claude-style `hookSpecificOutput`, which that dialect also reads).
//! `permissionRequest` (`{hookName, sessionId, timestamp, cwd, toolName, toolInput}`) is
//! answered `{"behavior": "allow"|"deny", "message"}`; it takes no edited input, so an edited
//! approval is denied, saying why, and "ask" decides nothing (Copilot asks its user, or denies
//! in `-p` with "no one to approve").
//!
//! A tool's arguments may come as an object, as JSON text of an object (GitHub's reference shows
//! `toolArgs` so), or as raw text (`apply_patch` with models that use it: the patch itself).
//! Raw text is submitted as `{"patch": "<text>"}` for `apply_patch` / `Edit` and as
//! `{"text": "<text>"}` for any other tool; an edit of raw text cannot be handed back as text
//! Copilot would run, so it is denied, saying why. Edits of object arguments go back as
//! `modifiedArgs` (an object).
//!
//! The call: Copilot's `sessionId`; Copilot gives a tool call no id in these hooks (the
//! PascalCase dialect's `tool_use_id` is used when present), so the call id is derived from the
//! session, the event, the timestamp, the tool and the arguments ([`derived_call_id`]): the same
//! hook input run again is the same call. Input that cannot be read is answered with a denial in
//! the event's shape (exit 0), since a failed hook is skipped by Copilot.
//!
//! Copilot skips a hook that fails or runs out of `timeoutSec` (default 30) and runs the tool:
//! keep `timeoutSec` above the hook's `--timeout` plus 15 seconds. A `preToolUse` allow runs the
//! tool without Copilot's own prompt, so the `preToolUse` hook alone makes the broker the gate;
//! add `permissionRequest` only for what reaches Copilot's prompt without `preToolUse`.
//! Configuration (`<repo>/.github/hooks/approval-broker.json`; Copilot loads it for a trusted
//! folder):
//!
//! ```json
//! {"version": 1, "hooks": {"preToolUse": [
//!   {"type": "command", "bash": "approval-broker hook copilot --timeout 5m", "timeoutSec": 330}]}}
//! ```

use serde_json::{Map, Value, json};

use super::host_call::{
    Answer, HookHost, HostCall, HostHook, Rendered, approver_message, derived_call_id, json_object,
    optional_string, required_string, summary_title,
};

/// Copilot CLI's hook (`approval-broker hook copilot`).
pub struct Copilot;

/// How the host gave the tool's arguments, which decides how an edit can go back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgsForm {
    /// A JSON object.
    Object,
    /// JSON text of an object.
    JsonText,
    /// Any other text (a raw patch), submitted wrapped in an object.
    RawText,
}

/// The Copilot hook events (and dialects) this command answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopilotEvent {
    /// camelCase `preToolUse`.
    PreToolUse(ArgsForm),
    /// PascalCase `PreToolUse` (the VS Code / Claude-compatible dialect).
    PascalPreToolUse(ArgsForm),
    /// `permissionRequest`.
    PermissionRequest,
}

impl HostHook for Copilot {
    const HOST: HookHost = HookHost::Copilot;
    type Event = CopilotEvent;

    fn parse(text: &str) -> Result<(CopilotEvent, HostCall), String> {
        parse(text)
    }

    fn hand_back(event: &CopilotEvent, _: &HostCall, _: &Map<String, Value>) -> Result<(), String> {
        match event {
            CopilotEvent::PreToolUse(ArgsForm::RawText)
            | CopilotEvent::PascalPreToolUse(ArgsForm::RawText) => Err(
                "Copilot gave this tool's input as raw text, and an edited input cannot be \
                 handed back to it as such"
                    .into(),
            ),
            CopilotEvent::PreToolUse(_) | CopilotEvent::PascalPreToolUse(_) => Ok(()),
            CopilotEvent::PermissionRequest => Err(
                "Copilot's permissionRequest hook cannot run an edited input (only its \
                 preToolUse hook can)"
                    .into(),
            ),
        }
    }

    fn render(event: &CopilotEvent, answer: &Answer) -> Rendered {
        render(*event, answer)
    }

    /// A denial in the shape of the event the input names, if any: Copilot skips a hook that
    /// exits with an error.
    fn unreadable(text: &str, problem: &str) -> Rendered {
        let reason = format!("The hook input could not be read ({problem}); the tool was not run.");
        let permission_request = json_object(text).is_ok_and(|fields| {
            fields.get("hookName").and_then(Value::as_str) == Some("permissionRequest")
        });
        if permission_request {
            return Rendered::json(json!({ "behavior": "deny", "message": reason }));
        }
        Rendered::json(json!({
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }))
    }
}

/// The keys one dialect names its fields with.
struct Keys {
    event: &'static str,
    session: &'static str,
    tool: &'static str,
    input: &'static str,
}

const CAMEL: Keys = Keys {
    event: "preToolUse",
    session: "sessionId",
    tool: "toolName",
    input: "toolArgs",
};
const PASCAL: Keys = Keys {
    event: "PreToolUse",
    session: "session_id",
    tool: "tool_name",
    input: "tool_input",
};
const PERMISSION: Keys = Keys {
    event: "permissionRequest",
    session: "sessionId",
    tool: "toolName",
    input: "toolInput",
};

/// Reads a Copilot hook input in either dialect; an error names the field at fault.
pub fn parse(text: &str) -> Result<(CopilotEvent, HostCall), String> {
    let fields = json_object(text)?;
    let keys = if let Some(event) = optional_string(&fields, "hook_event_name")? {
        if event != "PreToolUse" {
            return Err(format!(
                "hook_event_name: `{event}` is not an event this hook answers (PreToolUse)"
            ));
        }
        &PASCAL
    } else {
        match optional_string(&fields, "hookName")?.as_deref() {
            Some("permissionRequest") => &PERMISSION,
            Some("preToolUse") | None => &CAMEL,
            Some(other) => {
                return Err(format!(
                    "hookName: `{other}` is not an event this hook answers \
                     (preToolUse or permissionRequest)"
                ));
            }
        }
    };
    let session_id = required_string(&fields, keys.session)?;
    let timestamp = timestamp(&fields)?;
    let tool_name = required_string(&fields, keys.tool)?;
    let (form, tool_input) = arguments(&fields, keys.input, &tool_name)?;
    let event = match keys.event {
        "PreToolUse" => CopilotEvent::PascalPreToolUse(form),
        "permissionRequest" => CopilotEvent::PermissionRequest,
        _ => CopilotEvent::PreToolUse(form),
    };
    let call_id = match (event, optional_string(&fields, "tool_use_id")?) {
        (CopilotEvent::PascalPreToolUse(_), Some(id)) if !id.is_empty() => id,
        (CopilotEvent::PermissionRequest, _) => derived_call_id(
            "copilot-permission",
            &[&session_id, &timestamp, &tool_name],
            &tool_input,
        ),
        _ => derived_call_id(
            "copilot",
            &[&session_id, keys.event, &timestamp, &tool_name],
            &tool_input,
        ),
    };
    let details: Vec<String> = match form {
        ArgsForm::RawText => vec![format!(
            "Copilot gave the input as raw text, shown here as `{}`.",
            raw_text_key(&tool_name)
        )],
        _ => Vec::new(),
    };
    let message = approver_message(
        HookHost::Copilot,
        (&tool_name, &tool_input),
        &session_id,
        keys.event,
        &[],
        &details,
    );
    let call = HostCall {
        call_id,
        title: summary_title(&tool_name, &tool_input),
        message,
        cwd: optional_string(&fields, "cwd")?,
        session_id,
        tool_name,
        tool_input,
    };
    Ok((event, call))
}

/// The hook's `timestamp` (milliseconds, or ISO text in the PascalCase dialect), as text.
fn timestamp(fields: &Map<String, Value>) -> Result<String, String> {
    match fields.get("timestamp") {
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => {
            Err("timestamp: missing or empty".into())
        }
        Some(_) => Err("timestamp: must be a number or a string".into()),
    }
}

/// The key raw-text arguments are submitted under: `patch` for the patch tools.
fn raw_text_key(tool_name: &str) -> &'static str {
    match tool_name {
        "apply_patch" | "Edit" => "patch",
        _ => "text",
    }
}

/// The tool's arguments as an object, and the form they came in.
fn arguments(
    fields: &Map<String, Value>,
    key: &str,
    tool_name: &str,
) -> Result<(ArgsForm, Map<String, Value>), String> {
    match fields.get(key) {
        Some(Value::Object(object)) => Ok((ArgsForm::Object, object.clone())),
        Some(Value::String(text)) => match serde_json::from_str(text) {
            Ok(Value::Object(object)) => Ok((ArgsForm::JsonText, object)),
            _ => {
                let mut wrapped = Map::new();
                wrapped.insert(raw_text_key(tool_name).into(), Value::String(text.clone()));
                Ok((ArgsForm::RawText, wrapped))
            }
        },
        None | Some(Value::Null) => Err(format!("{key}: missing")),
        Some(_) => Err(format!("{key}: must be a JSON object or a string")),
    }
}

/// The answer in `event`'s shape.
pub fn render(event: CopilotEvent, answer: &Answer) -> Rendered {
    let (decision, reason, edit) = match answer {
        Answer::Allow {
            reason,
            updated_input,
        } => ("allow", reason, updated_input.as_ref()),
        Answer::Deny { reason, .. } => ("deny", reason, None),
        Answer::Ask { reason } => ("ask", reason, None),
    };
    match event {
        CopilotEvent::PreToolUse(_) => Rendered::json(pre_tool_use(decision, reason, edit)),
        CopilotEvent::PascalPreToolUse(_) => {
            let mut output = pre_tool_use(decision, reason, edit);
            let mut specific = json!({
                "hookEventName": "PreToolUse",
                "permissionDecision": decision,
                "permissionDecisionReason": reason,
            });
            if let Some(input) = edit {
                specific["updatedInput"] = Value::Object(input.clone());
            }
            output["hookSpecificOutput"] = specific;
            Rendered::json(output)
        }
        CopilotEvent::PermissionRequest => match (decision, edit) {
            ("allow", None) => Rendered::json(json!({ "behavior": "allow" })),
            // `hand_back` refuses edits here; should one arrive, it is not run.
            ("allow", Some(_)) => Rendered::json(json!({
                "behavior": "deny",
                "message": "The approver approved an edited input, which Copilot's \
                            permissionRequest hook cannot run; the tool was not run.",
            })),
            ("deny", _) => Rendered::json(json!({ "behavior": "deny", "message": reason })),
            // No decision: Copilot's own approval follows.
            _ => Rendered::nothing(),
        },
    }
}

fn pre_tool_use(decision: &str, reason: &str, edit: Option<&Map<String, Value>>) -> Value {
    let mut output = json!({
        "permissionDecision": decision,
        "permissionDecisionReason": reason,
    });
    if let Some(input) = edit {
        output["modifiedArgs"] = Value::Object(input.clone());
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    fn camel() -> Value {
        json!({"sessionId": "c0p1", "timestamp": 1_765_094_400_000_u64, "cwd": "/work/repo",
               "toolName": "bash", "toolArgs": {"command": "npm test", "description": "tests"}})
    }

    fn pascal() -> Value {
        json!({"hook_event_name": "PreToolUse", "session_id": "c0p1",
               "timestamp": "2026-12-07T08:00:00.000Z", "cwd": "/work/repo",
               "tool_name": "Bash", "tool_input": {"command": "npm test"}})
    }

    fn permission() -> Value {
        json!({"hookName": "permissionRequest", "sessionId": "c0p1", "timestamp": 1_765_094_400_000_u64,
               "cwd": "/work/repo", "toolName": "bash", "toolInput": {"command": "rm -rf dist"},
               "permissionSuggestions": []})
    }

    fn allow(edit: Option<Value>) -> Answer {
        Answer::Allow {
            reason: "Approved.".into(),
            updated_input: edit.and_then(|e| e.as_object().cloned()),
        }
    }

    #[test]
    fn both_dialects_and_permission_requests_are_read() {
        let (event, call) = parse(&camel().to_string()).expect("camel");
        assert_eq!(event, CopilotEvent::PreToolUse(ArgsForm::Object));
        assert!(call.call_id.starts_with("copilot-"));
        assert_eq!(call.call_id, parse(&camel().to_string()).unwrap().1.call_id);
        assert_eq!(call.spec(HookHost::Copilot, None).host, "copilot");
        assert_eq!(call.title, "bash: npm test");

        let (event, call) = parse(&pascal().to_string()).expect("pascal");
        assert_eq!(event, CopilotEvent::PascalPreToolUse(ArgsForm::Object));
        assert_eq!(call.tool_name, "Bash");
        let mut with_id = pascal();
        with_id["tool_use_id"] = json!("toolu_9");
        assert_eq!(parse(&with_id.to_string()).unwrap().1.call_id, "toolu_9");

        let (event, call) = parse(&permission().to_string()).expect("permission");
        assert_eq!(event, CopilotEvent::PermissionRequest);
        assert!(call.call_id.starts_with("copilot-permission-"));
        assert_eq!(
            call.tool_input,
            *json!({"command": "rm -rf dist"}).as_object().unwrap()
        );
    }

    #[test]
    fn text_arguments_become_an_object() {
        let mut json_text = camel();
        json_text["toolArgs"] = json!("{\"command\":\"rm -rf dist\"}");
        let (event, call) = parse(&json_text.to_string()).unwrap();
        assert_eq!(event, CopilotEvent::PreToolUse(ArgsForm::JsonText));
        assert_eq!(call.tool_input["command"], "rm -rf dist");

        let patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n";
        let mut raw = camel();
        raw["toolName"] = json!("apply_patch");
        raw["toolArgs"] = json!(patch);
        let (event, call) = parse(&raw.to_string()).unwrap();
        assert_eq!(event, CopilotEvent::PreToolUse(ArgsForm::RawText));
        assert_eq!(
            Value::Object(call.tool_input.clone()),
            json!({"patch": patch})
        );
        let edit = Map::new();
        assert!(Copilot::hand_back(&event, &call, &edit).is_err());
        assert!(
            Copilot::hand_back(&CopilotEvent::PreToolUse(ArgsForm::JsonText), &call, &edit).is_ok()
        );
        assert!(Copilot::hand_back(&CopilotEvent::PermissionRequest, &call, &edit).is_err());
    }

    #[test]
    fn malformed_inputs_are_refused_naming_the_field() {
        for (base, key, bad, field) in [
            (camel(), "sessionId", Value::Null, "sessionId"),
            (camel(), "toolArgs", json!(3), "toolArgs"),
            (camel(), "timestamp", json!(true), "timestamp"),
            (camel(), "hookName", json!("postToolUse"), "hookName"),
            (
                pascal(),
                "hook_event_name",
                json!("PostToolUse"),
                "hook_event_name",
            ),
            (pascal(), "tool_input", Value::Null, "tool_input"),
            (permission(), "toolInput", json!([1]), "toolInput"),
            (permission(), "toolName", json!(""), "toolName"),
        ] {
            let mut value = base;
            value[key] = bad;
            let error = parse(&value.to_string()).expect_err("refused");
            assert!(error.starts_with(field), "{field}: {error}");
        }
    }

    #[test]
    fn answers_are_in_each_dialect_s_shape() {
        let camel_event = CopilotEvent::PreToolUse(ArgsForm::Object);
        let edit = json!({"command": "npm test -- -q"});
        assert_eq!(
            render(camel_event, &allow(Some(edit.clone()))).stdout,
            Some(
                json!({"permissionDecision": "allow", "permissionDecisionReason": "Approved.",
                        "modifiedArgs": edit})
            )
        );
        let denied = Answer::Deny {
            reason: "No.".into(),
            system_message: Some("x".into()),
        };
        assert_eq!(
            render(camel_event, &denied).stdout,
            Some(json!({"permissionDecision": "deny", "permissionDecisionReason": "No."}))
        );
        let pascal_out = render(
            CopilotEvent::PascalPreToolUse(ArgsForm::Object),
            &allow(Some(edit.clone())),
        )
        .stdout
        .unwrap();
        assert_eq!(pascal_out["modifiedArgs"], edit);
        assert_eq!(
            pascal_out["hookSpecificOutput"],
            json!({"hookEventName": "PreToolUse", "permissionDecision": "allow",
                   "permissionDecisionReason": "Approved.", "updatedInput": edit})
        );
        let request = CopilotEvent::PermissionRequest;
        assert_eq!(
            render(request, &allow(None)).stdout,
            Some(json!({"behavior": "allow"}))
        );
        assert_eq!(
            render(request, &denied).stdout,
            Some(json!({"behavior": "deny", "message": "No."}))
        );
        assert_eq!(
            render(request, &allow(Some(edit))).stdout.unwrap()["behavior"],
            "deny"
        );
        assert_eq!(
            render(request, &Answer::Ask { reason: "R".into() }),
            Rendered::nothing()
        );
    }

    #[test]
    fn unreadable_input_is_denied_in_the_event_s_shape() {
        let pre = Copilot::unreadable("{", "the hook input is not JSON");
        assert_eq!(
            (pre.exit, pre.stdout.unwrap()["permissionDecision"].clone()),
            (0, json!("deny"))
        );
        let mut broken = permission();
        broken["toolInput"] = json!(1);
        let request = Copilot::unreadable(&broken.to_string(), "toolInput: must be a JSON object");
        let output = request.stdout.unwrap();
        assert_eq!(output["behavior"], "deny");
        assert!(output["message"].as_str().unwrap().contains("toolInput"));
    }
}
