//! `approval-broker hook codex`: Codex CLI's `PreToolUse` and `PermissionRequest` hooks,
//! answered by the broker (shapes: docs/design/agent-hosts.md §1, Codex's hook output parser).
//!
//! Codex reads a hook that fails, times out, prints `"allow"` without `updatedInput`, or prints
//! `"ask"` as "no opinion", and runs the tool (fail-open). So this file answers `PreToolUse`
//! only with a denial, with an allow that carries the approver's edit as `updatedInput`, or, for
//! an approval without an edit, with nothing (the tool runs, as approved); `PermissionRequest`
//! with `decision.behavior` allow or deny (it cannot take an edit, so an edited approval is
//! denied, saying why). `--on-timeout ask` / `--on-unreachable ask` deny in `PreToolUse`, and
//! in `PermissionRequest` decide nothing, which sends Codex to its own approval (its user, or a
//! rejection in `codex exec`). Unreadable input exits 2 with the reason on standard error: a
//! denial for both events.
//!
//! The call: the hook's `session_id`; `PreToolUse`'s own `tool_use_id` as the call id. A
//! `PermissionRequest` carries no call id, so its id is derived from the session, the turn, the
//! tool and the input ([`derived_call_id`]): the same request run again is the same call, and
//! the same command asked again within one turn gets the answer already given.
//!
//! Configuration (`~/.codex/config.toml`, or `~/.codex/hooks.json` in the same shape). With a
//! `PreToolUse` hook for every tool (`matcher = ".*"`) the broker sees every call Codex makes
//! and is the only gate on it; the `PermissionRequest` hook answers, from the broker too, what
//! Codex would otherwise ask its user (commands outside the sandbox). Codex's `timeout` (seconds,
//! default 600) must stay above the hook's `--timeout` plus 15 seconds, or Codex gives up on the
//! hook first and runs the tool. Codex skips hooks it has not been told to trust: run
//! `codex --dangerously-bypass-hook-trust` or trust them once (docs/design/agent-hosts.md §1).
//!
//! ```toml
//! [[hooks.PreToolUse]]
//! matcher = ".*"
//! [[hooks.PreToolUse.hooks]]
//! type = "command"
//! command = "approval-broker hook codex --timeout 5m"
//! timeout = 330
//!
//! [[hooks.PermissionRequest]]
//! matcher = ".*"
//! [[hooks.PermissionRequest.hooks]]
//! type = "command"
//! command = "approval-broker hook codex --timeout 5m"
//! timeout = 330
//! ```

use serde_json::{Map, Value, json};

use super::host_call::{
    Answer, HookHost, HostCall, HostHook, Rendered, approver_message, derived_call_id, json_object,
    optional_string, required_object, required_string, summary_title,
};

/// Codex's hook (`approval-broker hook codex`).
pub struct Codex;

/// The Codex hook events this command answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodexEvent {
    PreToolUse,
    PermissionRequest,
}

impl CodexEvent {
    fn name(self) -> &'static str {
        match self {
            CodexEvent::PreToolUse => "PreToolUse",
            CodexEvent::PermissionRequest => "PermissionRequest",
        }
    }
}

impl HostHook for Codex {
    const HOST: HookHost = HookHost::Codex;
    type Event = CodexEvent;

    fn parse(text: &str) -> Result<(CodexEvent, HostCall), String> {
        parse(text)
    }

    fn hand_back(event: &CodexEvent, _: &HostCall, _: &Map<String, Value>) -> Result<(), String> {
        match event {
            CodexEvent::PreToolUse => Ok(()),
            CodexEvent::PermissionRequest => Err(
                "Codex's PermissionRequest hook cannot run an edited input (only its PreToolUse \
                 hook can)"
                    .into(),
            ),
        }
    }

    /// `PreToolUse` has no "ask": Codex runs the tool on one.
    fn can_ask(event: &CodexEvent) -> bool {
        *event == CodexEvent::PermissionRequest
    }

    fn render(event: &CodexEvent, answer: &Answer) -> Rendered {
        render(*event, answer)
    }
}

/// Reads Codex's hook input; an error names the field at fault.
pub fn parse(text: &str) -> Result<(CodexEvent, HostCall), String> {
    let mut fields = json_object(text)?;
    let event = match required_string(&fields, "hook_event_name")?.as_str() {
        "PreToolUse" => CodexEvent::PreToolUse,
        "PermissionRequest" => CodexEvent::PermissionRequest,
        other => {
            return Err(format!(
                "hook_event_name: `{other}` is not an event this hook answers \
                 (PreToolUse or PermissionRequest)"
            ));
        }
    };
    let session_id = required_string(&fields, "session_id")?;
    let tool_name = required_string(&fields, "tool_name")?;
    let tool_input = required_object(&mut fields, "tool_input")?;
    let call_id = match event {
        CodexEvent::PreToolUse => required_string(&fields, "tool_use_id")?,
        CodexEvent::PermissionRequest => {
            let turn_id = required_string(&fields, "turn_id")?;
            derived_call_id(
                "codex-permission",
                &[&session_id, &turn_id, &tool_name],
                &tool_input,
            )
        }
    };
    let mut facts = Vec::new();
    if let Some(mode) = optional_string(&fields, "permission_mode")? {
        facts.push(format!("permission mode `{mode}`"));
    }
    if let Some(model) = optional_string(&fields, "model")? {
        facts.push(format!("model `{model}`"));
    }
    let message = approver_message(
        HookHost::Codex,
        (&tool_name, &tool_input),
        &session_id,
        event.name(),
        &facts,
        &[],
    );
    let call = HostCall {
        title: summary_title(&tool_name, &tool_input),
        message,
        cwd: optional_string(&fields, "cwd")?,
        session_id,
        call_id,
        tool_name,
        tool_input,
    };
    Ok((event, call))
}

/// The answer in the shape Codex's output parser accepts for `event`; never an "allow" without
/// `updatedInput` nor an "ask" in `PreToolUse`.
pub fn render(event: CodexEvent, answer: &Answer) -> Rendered {
    match (event, answer) {
        // Approved as the model asked: no opinion, and Codex runs the tool.
        (
            CodexEvent::PreToolUse,
            Answer::Allow {
                updated_input: None,
                ..
            },
        ) => Rendered::nothing(),
        (
            CodexEvent::PreToolUse,
            Answer::Allow {
                reason,
                updated_input: Some(input),
            },
        ) => Rendered::json(json!({ "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "allow",
            "permissionDecisionReason": reason,
            "updatedInput": input,
        }})),
        (
            CodexEvent::PreToolUse,
            Answer::Deny {
                reason,
                system_message,
            },
        ) => Rendered::json(with_system_message(
            json!({ "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }}),
            system_message.as_deref(),
        )),
        (CodexEvent::PreToolUse, Answer::Ask { reason }) => Rendered::json(json!({
            "systemMessage": reason,
            "hookSpecificOutput": {
                "hookEventName": "PreToolUse",
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            },
        })),
        (
            CodexEvent::PermissionRequest,
            Answer::Allow {
                updated_input: None,
                ..
            },
        ) => Rendered::json(json!({ "hookSpecificOutput": {
            "hookEventName": "PermissionRequest",
            "decision": { "behavior": "allow" },
        }})),
        // `hand_back` refuses edits here; should one arrive, it is not run.
        (
            CodexEvent::PermissionRequest,
            Answer::Allow {
                updated_input: Some(_),
                ..
            },
        ) => permission_denied(
            "The approver approved an edited input, which Codex's PermissionRequest hook cannot \
             run; the tool was not run.",
            None,
        ),
        (
            CodexEvent::PermissionRequest,
            Answer::Deny {
                reason,
                system_message,
            },
        ) => permission_denied(reason, system_message.as_deref()),
        // No verdict: Codex goes on to its own approval (its user; `codex exec` rejects).
        (CodexEvent::PermissionRequest, Answer::Ask { reason }) => {
            Rendered::json(json!({ "systemMessage": reason }))
        }
    }
}

fn permission_denied(reason: &str, system_message: Option<&str>) -> Rendered {
    Rendered::json(with_system_message(
        json!({ "hookSpecificOutput": {
            "hookEventName": "PermissionRequest",
            "decision": { "behavior": "deny", "message": reason },
        }}),
        system_message,
    ))
}

fn with_system_message(mut output: Value, system_message: Option<&str>) -> Value {
    if let Some(message) = system_message {
        output["systemMessage"] = json!(message);
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(event: &str) -> Value {
        json!({
            "session_id": "019a-thread", "turn_id": "turn-1", "transcript_path": null,
            "cwd": "/work/repo", "hook_event_name": event, "model": "gpt-5.5",
            "permission_mode": "default", "tool_name": "Bash",
            "tool_input": {"command": "cargo test", "description": "run the tests"},
            "tool_use_id": "call_abc",
        })
    }

    fn allow(edit: Option<Value>) -> Answer {
        Answer::Allow {
            reason: "Approved through the approval broker (approver:alice).".into(),
            updated_input: edit.map(|e| e.as_object().unwrap().clone()),
        }
    }

    fn deny() -> Answer {
        Answer::Deny {
            reason: "The user denied this tool call.".into(),
            system_message: None,
        }
    }

    #[test]
    fn a_pre_tool_use_is_the_call_its_tool_use_id_names() {
        let (event, call) = parse(&input("PreToolUse").to_string()).expect("valid");
        assert_eq!(event, CodexEvent::PreToolUse);
        let spec = call.spec(HookHost::Codex, None);
        assert_eq!(spec.call_id, "call_abc");
        assert_eq!(
            (
                spec.tool.as_str(),
                spec.workspace.as_str(),
                spec.host.as_str()
            ),
            ("Bash", "/work/repo", "codex")
        );
        assert_eq!(call.title, "Bash: cargo test");
        assert!(call.message.contains("model `gpt-5.5`"), "{}", call.message);
    }

    #[test]
    fn a_permission_request_gets_the_same_derived_id_each_time() {
        let mut request = input("PermissionRequest");
        request.as_object_mut().unwrap().remove("tool_use_id");
        let (_, a) = parse(&request.to_string()).expect("valid");
        let (_, b) = parse(&request.to_string()).expect("valid");
        assert!(a.call_id.starts_with("codex-permission-"), "{}", a.call_id);
        assert_eq!(a.call_id, b.call_id);
        request["turn_id"] = json!("turn-2");
        let (_, next_turn) = parse(&request.to_string()).expect("valid");
        assert_ne!(a.call_id, next_turn.call_id);
    }

    #[test]
    fn malformed_inputs_are_refused_naming_the_field() {
        // The field, and what it is set to (`None`: removed).
        for (field, bad) in [
            ("hook_event_name", Some(json!("Stop"))),
            ("tool_use_id", None),
            ("tool_input", Some(json!("ls"))),
            ("session_id", Some(json!(""))),
            ("tool_name", Some(json!(7))),
        ] {
            let mut value = input("PreToolUse");
            match bad {
                Some(bad) => value[field] = bad,
                None => {
                    value.as_object_mut().unwrap().remove(field);
                }
            }
            let error = parse(&value.to_string()).expect_err("refused");
            assert!(error.starts_with(field), "{field}: {error}");
        }
        let mut request = input("PermissionRequest");
        request.as_object_mut().unwrap().remove("turn_id");
        assert!(
            parse(&request.to_string())
                .unwrap_err()
                .starts_with("turn_id")
        );
        assert!(parse("[]").unwrap_err().contains("not a JSON object"));
    }

    #[test]
    fn pre_tool_use_never_prints_a_plain_allow_nor_an_ask() {
        let pre = CodexEvent::PreToolUse;
        assert_eq!(render(pre, &allow(None)), Rendered::nothing());
        let edited = json!({"command": "cargo test -q"});
        assert_eq!(
            render(pre, &allow(Some(edited.clone()))).stdout,
            Some(json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse", "permissionDecision": "allow",
                "permissionDecisionReason": "Approved through the approval broker (approver:alice).",
                "updatedInput": edited,
            }}))
        );
        assert_eq!(
            render(pre, &deny()).stdout,
            Some(json!({"hookSpecificOutput": {
                "hookEventName": "PreToolUse", "permissionDecision": "deny",
                "permissionDecisionReason": "The user denied this tool call.",
            }}))
        );
        let asked = render(pre, &Answer::Ask { reason: "R".into() });
        assert_eq!(
            asked.stdout.unwrap()["hookSpecificOutput"]["permissionDecision"],
            "deny"
        );
        assert!(!Codex::can_ask(&pre));
    }

    #[test]
    fn permission_request_answers_with_a_decision_and_never_with_an_edit() {
        let request = CodexEvent::PermissionRequest;
        assert_eq!(
            render(request, &allow(None)).stdout,
            Some(json!({"hookSpecificOutput": {
                "hookEventName": "PermissionRequest", "decision": {"behavior": "allow"},
            }}))
        );
        assert_eq!(
            render(request, &deny()).stdout,
            Some(json!({"hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": {"behavior": "deny", "message": "The user denied this tool call."},
            }}))
        );
        let edited = render(request, &allow(Some(json!({"command": "ls"}))))
            .stdout
            .unwrap();
        assert_eq!(edited["hookSpecificOutput"]["decision"]["behavior"], "deny");
        let (_, call) = parse(&input("PermissionRequest").to_string()).unwrap();
        assert!(Codex::hand_back(&request, &call, &Map::new()).is_err());
        assert!(Codex::hand_back(&CodexEvent::PreToolUse, &call, &Map::new()).is_ok());
        // Asking is deciding nothing: Codex's own approval follows.
        let asked = render(request, &Answer::Ask { reason: "R".into() })
            .stdout
            .unwrap();
        assert_eq!(asked, json!({"systemMessage": "R"}));
    }
}
