//! `approval-broker hook cursor`: Cursor's `preToolUse`, `beforeShellExecution`,
//! `beforeMCPExecution` and `beforeReadFile` hooks, answered by the broker.
//!
//! Cursor cannot be run here: its agent is not published to a package registry and needs
//! Cursor's own backend, so there is no offline binary to drive. This file and its tests follow
//! the input and output Cursor documents (cursor.com/docs/agent/hooks; docs/design/agent-hosts.md
//! §3), not an observed run.
//!
//! Input: `{hook_event_name, conversation_id, generation_id, workspace_roots, ...}` plus, per
//! event, `{tool_name, tool_input, tool_use_id}` (`preToolUse`), `{command, cwd}`
//! (`beforeShellExecution`, submitted as tool `Shell` with input `{command, cwd}`),
//! `{tool_name, tool_input, url | command, mcp_server_name}` (`beforeMCPExecution`, submitted as
//! `MCP:<server>:<tool>`, the name `preToolUse` gives MCP tools), `{file_path, content}`
//! (`beforeReadFile`, submitted as tool `Read` with input `{file_path}`: the file's content is
//! not sent to the broker). Output: `{"permission": "allow"|"deny"|"ask", "user_message",
//! "agent_message"}` (the model reads `agent_message`), and `updated_input` for an approver's
//! edit, which only `preToolUse` takes: an edited approval for the other events is denied,
//! saying why. `beforeReadFile` answers `permission` only, never "ask". Unreadable input exits 2
//! (Cursor's "deny") with the reason on standard error.
//!
//! The call: Cursor's `conversation_id` is the session; `preToolUse`'s `tool_use_id` the call
//! id. The other events carry no call id, so it is derived from the conversation, the
//! generation, the event, the tool and the input ([`derived_call_id`]): the same hook input run
//! again is the same call, and the same command asked twice within one generation gets the
//! answer already given.
//!
//! Cursor treats a hook that fails, times out or prints invalid JSON as "allow" unless the hook
//! says `failClosed: true`; set it, and keep `timeout` above the hook's `--timeout` plus 15
//! seconds. Configuration (`<project>/.cursor/hooks.json` or `~/.cursor/hooks.json`):
//!
//! ```json
//! {"version": 1, "hooks": {
//!   "preToolUse": [{"command": "approval-broker hook cursor --timeout 5m", "timeout": 330, "failClosed": true}],
//!   "beforeShellExecution": [{"command": "approval-broker hook cursor --timeout 5m", "timeout": 330, "failClosed": true}],
//!   "beforeMCPExecution": [{"command": "approval-broker hook cursor --timeout 5m", "timeout": 330, "failClosed": true}],
//!   "beforeReadFile": [{"command": "approval-broker hook cursor --timeout 5m", "timeout": 330, "failClosed": true}]}}
//! ```

use serde_json::{Map, Value, json};

use super::host_call::{
    Answer, HookHost, HostCall, HostHook, Rendered, approver_message, derived_call_id, json_object,
    optional_string, required_object, required_string, summary_title,
};

/// Cursor's hook (`approval-broker hook cursor`).
pub struct Cursor;

/// The Cursor hook events this command answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorEvent {
    PreToolUse,
    BeforeShellExecution,
    BeforeMcpExecution,
    BeforeReadFile,
}

impl CursorEvent {
    fn name(self) -> &'static str {
        match self {
            CursorEvent::PreToolUse => "preToolUse",
            CursorEvent::BeforeShellExecution => "beforeShellExecution",
            CursorEvent::BeforeMcpExecution => "beforeMCPExecution",
            CursorEvent::BeforeReadFile => "beforeReadFile",
        }
    }
}

impl HostHook for Cursor {
    const HOST: HookHost = HookHost::Cursor;
    type Event = CursorEvent;

    fn parse(text: &str) -> Result<(CursorEvent, HostCall), String> {
        parse(text)
    }

    fn hand_back(event: &CursorEvent, _: &HostCall, _: &Map<String, Value>) -> Result<(), String> {
        match event {
            CursorEvent::PreToolUse => Ok(()),
            other => Err(format!(
                "Cursor's {} hook cannot run an edited input (only its preToolUse hook can)",
                other.name()
            )),
        }
    }

    /// `beforeReadFile` answers allow or deny only.
    fn can_ask(event: &CursorEvent) -> bool {
        *event != CursorEvent::BeforeReadFile
    }

    fn render(event: &CursorEvent, answer: &Answer) -> Rendered {
        Rendered::json(render(*event, answer))
    }
}

/// Reads a Cursor hook input; an error names the field at fault.
pub fn parse(text: &str) -> Result<(CursorEvent, HostCall), String> {
    let mut fields = json_object(text)?;
    let event = match required_string(&fields, "hook_event_name")?.as_str() {
        "preToolUse" => CursorEvent::PreToolUse,
        "beforeShellExecution" => CursorEvent::BeforeShellExecution,
        "beforeMCPExecution" => CursorEvent::BeforeMcpExecution,
        "beforeReadFile" => CursorEvent::BeforeReadFile,
        other => {
            return Err(format!(
                "hook_event_name: `{other}` is not an event this hook answers (preToolUse, \
                 beforeShellExecution, beforeMCPExecution or beforeReadFile)"
            ));
        }
    };
    let session_id = required_string(&fields, "conversation_id")?;
    let generation_id = optional_string(&fields, "generation_id")?.unwrap_or_default();
    let workspace = first_workspace_root(&fields)?;
    let mut details = Vec::new();
    let (tool_name, tool_input) = match event {
        CursorEvent::PreToolUse => (
            required_string(&fields, "tool_name")?,
            required_object(&mut fields, "tool_input")?,
        ),
        CursorEvent::BeforeShellExecution => {
            let mut input = Map::new();
            input.insert(
                "command".into(),
                required_string(&fields, "command")?.into(),
            );
            if let Some(cwd) = optional_string(&fields, "cwd")? {
                input.insert("cwd".into(), cwd.into());
            }
            ("Shell".to_owned(), input)
        }
        CursorEvent::BeforeMcpExecution => {
            let tool = required_string(&fields, "tool_name")?;
            let server = optional_string(&fields, "mcp_server_name")?;
            if let Some(url) = optional_string(&fields, "url")? {
                details.push(format!("MCP server at {url}."));
            } else if let Some(command) = optional_string(&fields, "command")? {
                details.push(format!("MCP server started as `{command}`."));
            }
            let name = match server {
                Some(server) => format!("MCP:{server}:{tool}"),
                None => tool,
            };
            (name, mcp_arguments(&mut fields)?)
        }
        CursorEvent::BeforeReadFile => {
            let mut input = Map::new();
            let path = required_string(&fields, "file_path")?;
            input.insert("file_path".into(), path.into());
            ("Read".to_owned(), input)
        }
    };
    let call_id = match (event, optional_string(&fields, "tool_use_id")?) {
        (CursorEvent::PreToolUse, Some(id)) if !id.is_empty() => id,
        _ => derived_call_id(
            "cursor",
            &[&session_id, &generation_id, event.name(), &tool_name],
            &tool_input,
        ),
    };
    let facts: Vec<String> = optional_string(&fields, "model")?
        .map(|model| format!("model `{model}`"))
        .into_iter()
        .collect();
    let message = approver_message(
        HookHost::Cursor,
        (&tool_name, &tool_input),
        &session_id,
        event.name(),
        &facts,
        &details,
    );
    let cwd = match workspace {
        Some(root) => Some(root),
        None => optional_string(&fields, "cwd")?,
    };
    let call = HostCall {
        call_id,
        title: summary_title(&tool_name, &tool_input),
        message,
        cwd,
        session_id,
        tool_name,
        tool_input,
    };
    Ok((event, call))
}

/// `workspace_roots[0]`, the project the call acts on.
fn first_workspace_root(fields: &Map<String, Value>) -> Result<Option<String>, String> {
    match fields.get("workspace_roots") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(roots)) => match roots.first() {
            None => Ok(None),
            Some(Value::String(root)) => Ok(Some(root.clone())),
            Some(_) => Err("workspace_roots: must be a list of strings".into()),
        },
        Some(_) => Err("workspace_roots: must be a list of strings".into()),
    }
}

/// An MCP call's arguments: an object, or (as one source reports) JSON text of one.
fn mcp_arguments(fields: &mut Map<String, Value>) -> Result<Map<String, Value>, String> {
    match fields.get("tool_input") {
        Some(Value::String(text)) => match serde_json::from_str(text) {
            Ok(Value::Object(object)) => Ok(object),
            _ => Err("tool_input: must be a JSON object, or JSON text of one".into()),
        },
        _ => required_object(fields, "tool_input"),
    }
}

/// The answer in Cursor's shape for `event`.
pub fn render(event: CursorEvent, answer: &Answer) -> Value {
    if event == CursorEvent::BeforeReadFile {
        let permission = match answer {
            Answer::Allow {
                updated_input: None,
                ..
            } => "allow",
            _ => "deny",
        };
        return json!({ "permission": permission });
    }
    match answer {
        Answer::Allow {
            updated_input: None,
            ..
        } => json!({ "permission": "allow" }),
        Answer::Allow {
            updated_input: Some(input),
            ..
        } if event == CursorEvent::PreToolUse => {
            json!({ "permission": "allow", "updated_input": input })
        }
        // `hand_back` refuses edits here; should one arrive, it is not run.
        Answer::Allow { .. } => {
            let reason = format!(
                "The approver approved an edited input, which Cursor's {} hook cannot run; the \
                 tool was not run.",
                event.name()
            );
            json!({ "permission": "deny", "user_message": reason, "agent_message": reason })
        }
        Answer::Deny {
            reason,
            system_message,
        } => json!({
            "permission": "deny",
            "user_message": system_message.as_deref().unwrap_or(reason),
            "agent_message": reason,
        }),
        Answer::Ask { reason } => json!({
            "permission": "ask", "user_message": reason, "agent_message": reason,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn common(event: &str) -> Value {
        json!({"hook_event_name": event, "conversation_id": "conv-1", "generation_id": "gen-1",
               "workspace_roots": ["/work/repo"], "model": "claude-4", "cursor_version": "2.1"})
    }

    fn with(mut base: Value, extra: Value) -> Value {
        for (key, value) in extra.as_object().unwrap() {
            base[key] = value.clone();
        }
        base
    }

    fn shell() -> Value {
        with(
            common("beforeShellExecution"),
            json!({"command": "git status", "cwd": "/work/repo/sub"}),
        )
    }

    #[test]
    fn each_documented_event_is_one_call() {
        let pre = with(
            common("preToolUse"),
            json!({"tool_name": "Edit", "tool_input": {"file_path": "a.rs"}, "tool_use_id": "tu-1"}),
        );
        let (event, call) = parse(&pre.to_string()).unwrap();
        assert_eq!(
            (event, call.call_id.as_str()),
            (CursorEvent::PreToolUse, "tu-1")
        );
        let spec = call.spec(HookHost::Cursor, None);
        assert_eq!(
            (spec.host.as_str(), spec.workspace.as_str()),
            ("cursor", "/work/repo")
        );

        let (event, call) = parse(&shell().to_string()).unwrap();
        assert_eq!(event, CursorEvent::BeforeShellExecution);
        assert_eq!(call.tool_name, "Shell");
        assert_eq!(
            Value::Object(call.tool_input.clone()),
            json!({"command": "git status", "cwd": "/work/repo/sub"})
        );
        assert_eq!(call.call_id, parse(&shell().to_string()).unwrap().1.call_id);
        assert!(call.call_id.starts_with("cursor-"));

        let mcp = with(
            common("beforeMCPExecution"),
            json!({"tool_name": "echo", "tool_input": "{\"text\":\"hi\"}",
                   "command": "node echo.mjs", "mcp_server_name": "echosrv"}),
        );
        let (event, call) = parse(&mcp.to_string()).unwrap();
        assert_eq!(event, CursorEvent::BeforeMcpExecution);
        assert_eq!(call.tool_name, "MCP:echosrv:echo");
        assert_eq!(call.tool_input["text"], "hi");
        assert!(
            call.message
                .ends_with("MCP server started as `node echo.mjs`."),
            "{}",
            call.message
        );

        let read = with(
            common("beforeReadFile"),
            json!({"file_path": "/work/repo/.env", "content": "SECRET=1", "attachments": []}),
        );
        let (event, call) = parse(&read.to_string()).unwrap();
        assert_eq!(event, CursorEvent::BeforeReadFile);
        assert_eq!(
            Value::Object(call.tool_input),
            json!({"file_path": "/work/repo/.env"})
        );
    }

    #[test]
    fn malformed_inputs_are_refused_naming_the_field() {
        for (input, field) in [
            (common("afterFileEdit"), "hook_event_name"),
            (
                with(shell(), json!({"conversation_id": ""})),
                "conversation_id",
            ),
            (with(common("beforeShellExecution"), json!({})), "command"),
            (
                with(shell(), json!({"workspace_roots": "/work"})),
                "workspace_roots",
            ),
            (
                with(
                    common("preToolUse"),
                    json!({"tool_name": "Shell", "tool_input": 1}),
                ),
                "tool_input",
            ),
            (
                with(
                    common("beforeMCPExecution"),
                    json!({"tool_name": "e", "tool_input": "x"}),
                ),
                "tool_input",
            ),
            (common("beforeReadFile"), "file_path"),
        ] {
            let error = parse(&input.to_string()).expect_err("refused");
            assert!(error.starts_with(field), "{field}: {error}");
        }
    }

    #[test]
    fn answers_are_cursor_permissions() {
        let pre = CursorEvent::PreToolUse;
        let edit = json!({"command": "git status -s"});
        let allowed = Answer::Allow {
            reason: "ok".into(),
            updated_input: None,
        };
        let edited = Answer::Allow {
            reason: "ok".into(),
            updated_input: edit.as_object().cloned(),
        };
        let denied = Answer::Deny {
            reason: "No.".into(),
            system_message: None,
        };
        assert_eq!(render(pre, &allowed), json!({"permission": "allow"}));
        assert_eq!(
            render(pre, &edited),
            json!({"permission": "allow", "updated_input": edit})
        );
        assert_eq!(
            render(pre, &denied),
            json!({"permission": "deny", "user_message": "No.", "agent_message": "No."})
        );
        assert_eq!(
            render(pre, &Answer::Ask { reason: "R".into() }),
            json!({"permission": "ask", "user_message": "R", "agent_message": "R"})
        );
        let shell = CursorEvent::BeforeShellExecution;
        assert_eq!(render(shell, &edited)["permission"], "deny");
        let read = CursorEvent::BeforeReadFile;
        assert_eq!(render(read, &allowed), json!({"permission": "allow"}));
        assert_eq!(render(read, &denied), json!({"permission": "deny"}));
        assert_eq!(
            render(read, &Answer::Ask { reason: "R".into() }),
            json!({"permission": "deny"})
        );
        assert!(!Cursor::can_ask(&read) && Cursor::can_ask(&shell));
    }
}
