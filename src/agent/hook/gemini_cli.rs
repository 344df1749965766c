//! `approval-broker hook gemini-cli`: Gemini CLI's `BeforeTool` hook, answered by the broker
//! (shapes: docs/design/agent-hosts.md §2, Gemini CLI's hooks reference).
//!
//! Answers: `{"decision":"deny","reason":R}` (the model reads `Tool execution blocked: R`);
//! `{"decision":"allow","reason":R}`; an approver's edit as `hookSpecificOutput.tool_input`.
//! Gemini CLI merges that object over the model's arguments, so an edit can change and add keys
//! but not remove one: an edit that drops a key of the model's input is denied, saying why,
//! rather than run with the dropped key still in. Never `"ask"`: a headless run (`gemini -p`)
//! hangs on one, so `--on-timeout ask` and `--on-unreachable ask` deny here. Unreadable input
//! exits 2 with the reason on standard error, which Gemini CLI reads as a denial.
//!
//! The call: the hook's `session_id`; Gemini CLI gives a tool call no id of its own, so the call
//! id is derived from the session, the hook's `timestamp`, the tool and the input
//! ([`derived_call_id`]): the same hook input run again is the same call. An MCP tool's
//! `mcp_context` (server, tool, how the server is started) is shown to the approver.
//!
//! Gemini CLI's `allow` does not override its own policy: run it with `--approval-mode yolo`
//! (or policy rules that allow the tools) so that the broker is the only gate; in its default
//! headless mode Gemini CLI does not even offer mutating tools to the model. Its hook `timeout`
//! is in milliseconds (default 60000) and a hook that runs out of it lets the tool run: keep it
//! above the hook's `--timeout` plus 15 seconds. Configuration (`~/.gemini/settings.json`, or
//! `<project>/.gemini/settings.json`):
//!
//! ```json
//! {"hooks": {"BeforeTool": [{"matcher": ".*", "hooks": [
//!   {"name": "approval-broker", "type": "command",
//!    "command": "approval-broker hook gemini-cli --timeout 5m", "timeout": 330000}]}]}}
//! ```

use serde_json::{Map, Value, json};

use super::host_call::{
    Answer, HookHost, HostCall, HostHook, Rendered, approver_message, derived_call_id, json_object,
    optional_string, required_object, required_string, summary_title,
};

/// Gemini CLI's hook (`approval-broker hook gemini-cli`).
pub struct GeminiCli;

/// The one event this hook answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeforeTool;

impl HostHook for GeminiCli {
    const HOST: HookHost = HookHost::GeminiCli;
    type Event = BeforeTool;

    fn parse(text: &str) -> Result<(BeforeTool, HostCall), String> {
        parse(text).map(|call| (BeforeTool, call))
    }

    /// Gemini CLI merges the edit over the model's arguments: every key of those must be in it.
    fn hand_back(
        _: &BeforeTool,
        call: &HostCall,
        edited: &Map<String, Value>,
    ) -> Result<(), String> {
        let dropped: Vec<&str> = call
            .tool_input
            .keys()
            .filter(|key| !edited.contains_key(*key))
            .map(String::as_str)
            .collect();
        if dropped.is_empty() {
            return Ok(());
        }
        Err(format!(
            "Gemini CLI merges an edited input over the model's and cannot drop `{}`",
            dropped.join("`, `")
        ))
    }

    /// A prompt hangs a headless run.
    fn can_ask(_: &BeforeTool) -> bool {
        false
    }

    fn render(_: &BeforeTool, answer: &Answer) -> Rendered {
        Rendered::json(render(answer))
    }
}

/// Reads Gemini CLI's `BeforeTool` input; an error names the field at fault.
pub fn parse(text: &str) -> Result<HostCall, String> {
    let mut fields = json_object(text)?;
    let event = required_string(&fields, "hook_event_name")?;
    if event != "BeforeTool" {
        return Err(format!(
            "hook_event_name: `{event}` is not an event this hook answers (BeforeTool)"
        ));
    }
    let session_id = required_string(&fields, "session_id")?;
    let timestamp = required_string(&fields, "timestamp")?;
    let tool_name = required_string(&fields, "tool_name")?;
    let tool_input = required_object(&mut fields, "tool_input")?;
    let mut details = Vec::new();
    match fields.get("mcp_context") {
        None | Some(Value::Null) => {}
        Some(Value::Object(context)) => details.push(mcp_detail(context)?),
        Some(_) => return Err("mcp_context: must be a JSON object".into()),
    }
    if let Some(original) = optional_string(&fields, "original_request_name")?
        && original != tool_name
    {
        details.push(format!("The model asked for `{original}`."));
    }
    let message = approver_message(
        HookHost::GeminiCli,
        (&tool_name, &tool_input),
        &session_id,
        "BeforeTool",
        &[],
        &details,
    );
    Ok(HostCall {
        call_id: derived_call_id(
            "gemini",
            &[&session_id, &timestamp, &tool_name],
            &tool_input,
        ),
        title: summary_title(&tool_name, &tool_input),
        message,
        cwd: optional_string(&fields, "cwd")?,
        session_id,
        tool_name,
        tool_input,
    })
}

/// `MCP server `srv`, tool `echo` (started as `node srv.js`).`: what the approver needs to know
/// of an MCP call beyond its arguments.
fn mcp_detail(context: &Map<String, Value>) -> Result<String, String> {
    let field = |key: &str| optional_string(context, key).map_err(|e| format!("mcp_context.{e}"));
    let mut detail = String::from("MCP");
    if let Some(server) = field("server_name")? {
        detail.push_str(&format!(" server `{server}`"));
    }
    if let Some(tool) = field("tool_name")? {
        detail.push_str(&format!(", tool `{tool}`"));
    }
    if let Some(command) = field("command")? {
        let args: Vec<&str> = match context.get("args") {
            Some(Value::Array(args)) => args.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let line = std::iter::once(command.as_str())
            .chain(args)
            .collect::<Vec<_>>()
            .join(" ");
        detail.push_str(&format!(" (started as `{line}`)"));
    } else if let Some(url) = field("url")? {
        detail.push_str(&format!(" (at {url})"));
    }
    detail.push('.');
    Ok(detail)
}

/// The `BeforeTool` output for `answer`; an ask (which `can_ask` keeps from coming) denies.
pub fn render(answer: &Answer) -> Value {
    match answer {
        Answer::Allow {
            reason,
            updated_input: None,
        } => json!({ "decision": "allow", "reason": reason }),
        Answer::Allow {
            reason,
            updated_input: Some(input),
        } => json!({
            "decision": "allow",
            "reason": reason,
            "hookSpecificOutput": { "tool_input": input },
        }),
        Answer::Deny {
            reason,
            system_message,
        } => {
            let mut output = json!({ "decision": "deny", "reason": reason });
            if let Some(message) = system_message {
                output["systemMessage"] = json!(message);
            }
            output
        }
        Answer::Ask { reason } => json!({
            "decision": "deny", "reason": reason, "systemMessage": reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> Value {
        json!({
            "session_id": "8f2c", "transcript_path": "/h/.gemini/tmp/chats/s.json",
            "cwd": "/work/repo", "hook_event_name": "BeforeTool",
            "timestamp": "2026-12-07T08:00:00.000Z", "tool_name": "run_shell_command",
            "tool_input": {"command": "ls -la", "description": "list files"},
        })
    }

    #[test]
    fn a_before_tool_input_is_one_call_with_a_derived_id() {
        let call = parse(&input().to_string()).expect("valid");
        assert_eq!(call.call_id, parse(&input().to_string()).unwrap().call_id);
        assert!(call.call_id.starts_with("gemini-"));
        assert_eq!(call.title, "run_shell_command: ls -la");
        let spec = call.spec(HookHost::GeminiCli, None);
        assert_eq!(
            (spec.host.as_str(), spec.workspace.as_str()),
            ("gemini-cli", "/work/repo")
        );
        let mut later = input();
        later["timestamp"] = json!("2026-12-07T08:00:05.000Z");
        assert_ne!(call.call_id, parse(&later.to_string()).unwrap().call_id);
    }

    #[test]
    fn an_mcp_call_shows_its_server_to_the_approver() {
        let mut mcp = input();
        mcp["tool_name"] = json!("mcp_echosrv_echo");
        mcp["tool_input"] = json!({"text": "hi", "wait_for_previous": false});
        mcp["mcp_context"] = json!({"server_name": "echosrv", "tool_name": "echo",
                                    "command": "node", "args": ["mcp-echo.mjs"]});
        let call = parse(&mcp.to_string()).expect("valid");
        assert!(
            call.message
                .ends_with("MCP server `echosrv`, tool `echo` (started as `node mcp-echo.mjs`)."),
            "{}",
            call.message
        );
        mcp["mcp_context"] = json!({"server_name": 3});
        assert!(
            parse(&mcp.to_string())
                .unwrap_err()
                .starts_with("mcp_context.server_name")
        );
    }

    #[test]
    fn malformed_inputs_are_refused_naming_the_field() {
        for (field, key, bad) in [
            ("hook_event_name", "hook_event_name", json!("AfterTool")),
            ("timestamp", "timestamp", Value::Null),
            ("tool_input", "tool_input", json!(["ls"])),
            ("session_id", "session_id", json!("")),
            ("mcp_context", "mcp_context", json!("srv")),
        ] {
            let mut value = input();
            value[key] = bad;
            let error = parse(&value.to_string()).expect_err("refused");
            assert!(error.starts_with(field), "{field}: {error}");
        }
    }

    #[test]
    fn answers_are_gemini_decisions_and_never_ask() {
        let reason = "Approved through the approval broker (approver:alice).";
        assert_eq!(
            render(&Answer::Allow {
                reason: reason.into(),
                updated_input: None
            }),
            json!({"decision": "allow", "reason": reason})
        );
        let edit = json!({"command": "ls", "description": "list files"});
        assert_eq!(
            render(&Answer::Allow {
                reason: reason.into(),
                updated_input: edit.as_object().cloned()
            }),
            json!({"decision": "allow", "reason": reason, "hookSpecificOutput": {"tool_input": edit}})
        );
        assert_eq!(
            render(&Answer::Deny {
                reason: "No.".into(),
                system_message: None
            }),
            json!({"decision": "deny", "reason": "No."})
        );
        assert_eq!(
            render(&Answer::Ask { reason: "R".into() })["decision"],
            "deny"
        );
        assert!(!GeminiCli::can_ask(&BeforeTool));
    }

    #[test]
    fn an_edit_that_drops_a_key_cannot_be_handed_back() {
        let call = parse(&input().to_string()).unwrap();
        let keeps = json!({"command": "ls", "description": "d", "dir_path": "/tmp"});
        assert!(GeminiCli::hand_back(&BeforeTool, &call, keeps.as_object().unwrap()).is_ok());
        let drops = json!({"command": "ls"});
        let why = GeminiCli::hand_back(&BeforeTool, &call, drops.as_object().unwrap()).unwrap_err();
        assert!(why.contains("`description`"), "{why}");
    }
}
