//! What a host's tool call does, in terms common to every agent host. Claude Code calls its shell
//! tool `Bash`, Gemini CLI `run_shell_command`, an ACP agent `execute`; each spells its inputs its
//! own way. A call an adapter submits names its host (`CallSpec.host`), and the broker reads it
//! here as an [`Action`]: a [`Kind`] (shell, edit, write, read, fetch, mcp, other) and a few
//! fields in one spelling (`command` and `cwd`; `path`; `url`; `server`, `tool`, `arguments`).
//! Rules that name a kind, and grants remembered from a host's call, match the action, so "allow
//! `git status` in this workspace" said once holds on every host. The host's own tool name and
//! input stay what is stored, shown, signed and run; the action is derived from them each time
//! the call is read (a pure function), never trusted from the agent. The table is
//! docs/hosts.md's "One action, every host".

use std::fmt;

use serde_json::{Map, Value, json};

use super::{ToolInput, ToolName};
use crate::error::{Error, Result};

/// The agent hosts whose tool calls the broker knows how to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Host {
    ClaudeCode,
    Codex,
    GeminiCli,
    Copilot,
    Cursor,
    /// An agent behind `approval-broker acp-proxy` (the Agent Client Protocol).
    Acp,
}

impl Host {
    const ALL: [Host; 6] = [
        Host::ClaudeCode,
        Host::Codex,
        Host::GeminiCli,
        Host::Copilot,
        Host::Cursor,
        Host::Acp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Host::ClaudeCode => "claude-code",
            Host::Codex => "codex",
            Host::GeminiCli => "gemini-cli",
            Host::Copilot => "copilot",
            Host::Cursor => "cursor",
            Host::Acp => "acp",
        }
    }

    /// `CallSpec.host`: empty is none; anything but a known host is refused, so a typo never
    /// quietly leaves a call outside the rules written for its kind.
    pub fn parse(field: &str, text: &str) -> Result<Option<Host>> {
        if text.is_empty() {
            return Ok(None);
        }
        Host::ALL
            .into_iter()
            .find(|h| h.as_str() == text)
            .map(Some)
            .ok_or_else(|| {
                let known: Vec<&str> = Host::ALL.iter().map(|h| h.as_str()).collect();
                Error::invalid(
                    field,
                    format!(
                        "`{}` is not a host the broker knows (one of {}, or empty)",
                        text.escape_debug(),
                        known.join(", ")
                    ),
                )
            })
    }

    /// A stored host; an unknown one (written by a newer broker) reads as none.
    pub fn from_stored(text: &str) -> Option<Host> {
        Host::ALL.into_iter().find(|h| h.as_str() == text)
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of thing a call does, whichever host asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Runs a shell command: `command`, `cwd`.
    Shell,
    /// Changes an existing file: `path`, and the change (`old`/`new`, or `patch`).
    Edit,
    /// Writes a whole file: `path`, `content`.
    Write,
    /// Reads a file: `path`.
    Read,
    /// Fetches a URL: `url`.
    Fetch,
    /// Calls a tool of an MCP server: `server`, `tool`, `arguments`.
    Mcp,
    /// Anything else: no common fields. Rules and grants match it by the host's own tool name.
    Other,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Shell,
        Kind::Edit,
        Kind::Write,
        Kind::Read,
        Kind::Fetch,
        Kind::Mcp,
        Kind::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Shell => "shell",
            Kind::Edit => "edit",
            Kind::Write => "write",
            Kind::Read => "read",
            Kind::Fetch => "fetch",
            Kind::Mcp => "mcp",
            Kind::Other => "other",
        }
    }

    /// A rule's `kind`; an error names the kinds there are.
    pub fn parse(field: &str, text: &str) -> Result<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.as_str() == text)
            .ok_or_else(|| {
                let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
                Error::invalid(
                    field,
                    format!(
                        "`{}` is not an action kind (one of {})",
                        text.escape_debug(),
                        known.join(", ")
                    ),
                )
            })
    }

    pub fn from_stored(text: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == text)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A call read in common terms: its kind and fields (canonical JSON, so that matchers and exact
/// grants compare them as they compare tool inputs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Action {
    pub kind: Kind,
    pub fields: ToolInput,
}

impl Action {
    /// Reads `host`'s call of `tool` with `input`, made in `workspace` (the host's working
    /// directory unless the adapter was told otherwise): the table in docs/hosts.md. A call the
    /// table does not know, or whose fields are not where the host puts them, is `other`.
    pub fn of(host: Host, tool: &ToolName, input: &ToolInput, workspace: &str) -> Action {
        let input: Value = serde_json::from_str(input.as_str()).unwrap_or(Value::Null);
        let empty = Map::new();
        let input = input.as_object().unwrap_or(&empty);
        let read = Reading { input, workspace };
        let fields = match host {
            Host::ClaudeCode => read.claude_style(tool.as_str()),
            Host::Codex => read.codex(tool.as_str()),
            Host::GeminiCli => read.gemini_cli(tool.as_str()),
            Host::Copilot => read.copilot(tool.as_str()),
            Host::Cursor => read.cursor(tool.as_str()),
            Host::Acp => read.acp(tool.as_str()),
        };
        match fields {
            Some((kind, fields)) => Action {
                kind,
                fields: ToolInput::from_stored(super::json::canonical(&Value::Object(fields))),
            },
            None => Action {
                kind: Kind::Other,
                fields: ToolInput::from_stored("{}".to_owned()),
            },
        }
    }

    /// The one field that says what the action is (the command, the path, the URL, the MCP
    /// tool), for titles and notifications.
    pub fn summary(&self) -> Option<String> {
        let fields: Value = serde_json::from_str(self.fields.as_str()).ok()?;
        let key = match self.kind {
            Kind::Shell => "command",
            Kind::Edit | Kind::Write | Kind::Read => "path",
            Kind::Fetch => "url",
            Kind::Mcp => {
                let server = fields.get("server")?.as_str()?;
                let tool = fields.get("tool")?.as_str()?;
                return Some(format!("{server}/{tool}"));
            }
            Kind::Other => return None,
        };
        fields.get(key)?.as_str().map(str::to_owned)
    }
}

type Fields = Option<(Kind, Map<String, Value>)>;

/// One host call's input, being read.
struct Reading<'a> {
    input: &'a Map<String, Value>,
    workspace: &'a str,
}

impl Reading<'_> {
    fn text(&self, key: &str) -> Option<&str> {
        self.input.get(key).and_then(Value::as_str)
    }

    /// The first of `keys` the input holds as text.
    fn first(&self, keys: &[&str]) -> Option<&str> {
        keys.iter().find_map(|k| self.text(k))
    }

    fn shell(&self, command: Option<String>, dir: Option<&str>) -> Fields {
        let command = command?;
        Some((
            Kind::Shell,
            object([
                ("command", json!(command.trim())),
                ("cwd", json!(self.path_in_workspace(dir.unwrap_or("")))),
            ]),
        ))
    }

    /// A path as the host resolves it: a relative one against the workspace, when that is an
    /// absolute directory; `.` and `..` resolved by their text (nothing is read from disk).
    fn path_in_workspace(&self, path: &str) -> String {
        let joined = if path.is_empty() {
            self.workspace.to_owned()
        } else if path.starts_with('/') || !self.workspace.starts_with('/') {
            path.to_owned()
        } else {
            format!("{}/{path}", self.workspace.trim_end_matches('/'))
        };
        if !joined.starts_with('/') {
            return joined;
        }
        let mut parts: Vec<&str> = Vec::new();
        for part in joined.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    parts.pop();
                }
                part => parts.push(part),
            }
        }
        format!("/{}", parts.join("/"))
    }

    fn file(&self, kind: Kind, path_keys: &[&str], more: &[(&str, &[&str])]) -> Fields {
        let path = self.first(path_keys)?;
        let mut fields = object([("path", json!(self.path_in_workspace(path)))]);
        for (name, keys) in more {
            if let Some(value) = keys.iter().find_map(|k| self.input.get(*k)) {
                fields.insert((*name).to_owned(), value.clone());
            }
        }
        Some((kind, fields))
    }

    fn fetch(&self, url: Option<&str>) -> Fields {
        Some((Kind::Fetch, object([("url", json!(url?))])))
    }

    fn mcp(&self, server: &str, tool: &str) -> Fields {
        if server.is_empty() || tool.is_empty() {
            return None;
        }
        Some((
            Kind::Mcp,
            object([
                ("server", json!(server)),
                ("tool", json!(tool)),
                ("arguments", Value::Object(self.input.clone())),
            ]),
        ))
    }

    /// Claude Code's tool names (which Copilot's PascalCase hooks and Cursor's `preToolUse` use
    /// too).
    fn claude_style(&self, tool: &str) -> Fields {
        match tool {
            "Bash" => self.shell(self.text("command").map(str::to_owned), None),
            "Edit" | "MultiEdit" => self.file(
                Kind::Edit,
                &["file_path"],
                &[
                    ("old", &["old_string"]),
                    ("new", &["new_string"]),
                    ("edits", &["edits"]),
                ],
            ),
            "NotebookEdit" => {
                self.file(Kind::Edit, &["notebook_path"], &[("new", &["new_source"])])
            }
            "Write" => self.file(Kind::Write, &["file_path"], &[("content", &["content"])]),
            "Read" => self.file(Kind::Read, &["file_path"], &[]),
            "WebFetch" => self.fetch(self.text("url")),
            _ => {
                let (server, rest) = tool.strip_prefix("mcp__")?.split_once("__")?;
                self.mcp(server, rest)
            }
        }
    }

    fn codex(&self, tool: &str) -> Fields {
        match tool {
            "apply_patch" => {
                let patch = self.text("command")?;
                let path = patch_paths(patch).into_iter().next()?;
                Some((
                    Kind::Edit,
                    object([
                        ("path", json!(self.path_in_workspace(path))),
                        ("patch", json!(patch)),
                    ]),
                ))
            }
            // Shell (`Bash`, `{command}`) and MCP (`mcp__server__tool`) as Claude Code names them.
            "Bash" => self.claude_style(tool),
            _ if tool.starts_with("mcp__") => self.claude_style(tool),
            _ => None,
        }
    }

    fn gemini_cli(&self, tool: &str) -> Fields {
        match tool {
            "run_shell_command" => self.shell(
                self.text("command").map(str::to_owned),
                self.text("dir_path"),
            ),
            "replace" => self.file(
                Kind::Edit,
                &["file_path"],
                &[("old", &["old_string"]), ("new", &["new_string"])],
            ),
            "write_file" => self.file(Kind::Write, &["file_path"], &[("content", &["content"])]),
            "read_file" => self.file(Kind::Read, &["file_path"], &[]),
            // `web_fetch` takes a prompt with the URLs in it: the action is its first URL, and
            // a prompt naming several is `other` (one URL cannot stand for them).
            "web_fetch" => {
                let urls = urls_in(self.text("prompt")?);
                match urls[..] {
                    [url] => self.fetch(Some(url)),
                    _ => None,
                }
            }
            // `mcp_<server>_<tool>`: the server is the part up to the next underscore.
            _ => {
                let (server, rest) = tool.strip_prefix("mcp_")?.split_once('_')?;
                self.mcp(server, rest)
            }
        }
    }

    fn copilot(&self, tool: &str) -> Fields {
        match tool {
            "bash" | "shell" => self.shell(self.text("command").map(str::to_owned), None),
            "create" => self.file(Kind::Write, &["path"], &[("content", &["file_text"])]),
            "edit" => self.file(
                Kind::Edit,
                &["path"],
                &[("old", &["old_str"]), ("new", &["new_str"])],
            ),
            "view" => self.file(Kind::Read, &["path"], &[]),
            "web_fetch" => self.fetch(self.text("url")),
            // A patch as raw text (the hook submits it as `{"patch": ...}`), under its own name
            // or, in the PascalCase hooks, as `Edit`.
            "apply_patch" | "Edit" if tool == "apply_patch" || self.text("patch").is_some() => {
                let patch = self.text("patch").or_else(|| self.text("command"))?;
                let path = patch_paths(patch).into_iter().next()?;
                Some((
                    Kind::Edit,
                    object([
                        ("path", json!(self.path_in_workspace(path))),
                        ("patch", json!(patch)),
                    ]),
                ))
            }
            // The PascalCase (Claude-compatible) hooks name tools as Claude Code does.
            "Bash" | "Edit" | "Write" | "Read" | "WebFetch" => self.claude_style(tool),
            // MCP tools are `<server>-<tool>`; the built-in tools have no `-`.
            _ => {
                let (server, rest) = tool.split_once('-')?;
                self.mcp(server, rest)
            }
        }
    }

    fn cursor(&self, tool: &str) -> Fields {
        match tool {
            "Shell" | "beforeShellExecution" => {
                self.shell(self.text("command").map(str::to_owned), self.text("cwd"))
            }
            "Read" | "beforeReadFile" => self.file(Kind::Read, &["file_path", "path"], &[]),
            "Write" => self.file(
                Kind::Write,
                &["file_path", "path"],
                &[("content", &["content"])],
            ),
            "Edit" => self.file(Kind::Edit, &["file_path", "path"], &[]),
            _ => {
                let mut parts = tool.strip_prefix("MCP:")?.splitn(2, ':');
                let (server, rest) = (parts.next()?, parts.next()?);
                self.mcp(server, rest)
            }
        }
    }

    /// An ACP agent's call: the tool is the ACP tool kind (`execute`, `edit`, `read`, ...) or
    /// the agent's own tool name, the input its `rawInput` (see `src/agent/acp`).
    fn acp(&self, tool: &str) -> Fields {
        match tool {
            "execute" | "Bash" | "bash" | "shell" => {
                self.shell(command_text(self.input.get("command")?), self.text("cwd"))
            }
            "edit" | "Edit" | "MultiEdit" => self.file(
                Kind::Edit,
                &["file_path", "path", "filePath"],
                &[
                    ("old", &["old_string", "oldText"]),
                    ("new", &["new_string", "newText"]),
                ],
            ),
            "Write" | "write" => self.file(
                Kind::Write,
                &["file_path", "path", "filePath"],
                &[("content", &["content"])],
            ),
            "read" | "Read" => self.file(Kind::Read, &["file_path", "path", "filePath"], &[]),
            "fetch" | "WebFetch" => self.fetch(self.text("url")),
            _ => None,
        }
    }
}

/// A command given as text, or as an argument list: `["bash", "-lc", "git status"]` is the
/// script it runs, other lists are their words joined by spaces.
fn command_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Array(words) => {
            let words: Option<Vec<&str>> = words.iter().map(Value::as_str).collect();
            let words = words?;
            match words[..] {
                [shell, flag, script]
                    if matches!(shell.rsplit('/').next(), Some("bash" | "sh" | "zsh"))
                        && matches!(flag, "-c" | "-lc") =>
                {
                    Some(script.to_owned())
                }
                _ => Some(words.join(" ")),
            }
        }
        _ => None,
    }
}

/// The files a patch in Codex's `apply_patch` format touches, in order.
fn patch_paths(patch: &str) -> Vec<&str> {
    patch
        .lines()
        .filter_map(|line| {
            ["*** Add File: ", "*** Update File: ", "*** Delete File: "]
                .iter()
                .find_map(|p| line.strip_prefix(p))
        })
        .map(str::trim)
        .collect()
}

/// The `http://` and `https://` URLs in a text, each up to the next white space.
fn urls_in(text: &str) -> Vec<&str> {
    text.split_whitespace()
        .filter(|w| w.starts_with("http://") || w.starts_with("https://"))
        .map(|w| w.trim_end_matches(['.', ',', ')', ']', '"', '\'']))
        .collect()
}

fn object<const N: usize>(entries: [(&str, Value); N]) -> Map<String, Value> {
    entries
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(host: Host, tool: &str, input: Value, workspace: &str) -> (Kind, Value) {
        let tool = ToolName::parse("tool", tool.to_owned()).unwrap();
        let input = ToolInput::parse("input", &input.to_string(), 1 << 20).unwrap();
        let action = Action::of(host, &tool, &input, workspace);
        (
            action.kind,
            serde_json::from_str(action.fields.as_str()).unwrap(),
        )
    }

    #[test]
    fn one_shell_command_reads_the_same_on_every_host() {
        let expected = (
            Kind::Shell,
            json!({"command": "git status", "cwd": "/repo"}),
        );
        let calls = [
            (
                Host::ClaudeCode,
                "Bash",
                json!({"command": "git status", "description": "Show status"}),
            ),
            (Host::Codex, "Bash", json!({"command": "git status"})),
            (
                Host::GeminiCli,
                "run_shell_command",
                json!({"command": "git status", "description": "x"}),
            ),
            (
                Host::GeminiCli,
                "run_shell_command",
                json!({"command": "git status", "dir_path": "."}),
            ),
            (
                Host::Copilot,
                "bash",
                json!({"command": "git status", "mode": "sync"}),
            ),
            (Host::Copilot, "Bash", json!({"command": "git status"})),
            (Host::Cursor, "Shell", json!({"command": " git status "})),
            (
                Host::Acp,
                "execute",
                json!({"command": ["bash", "-lc", "git status"]}),
            ),
            (
                Host::Acp,
                "execute",
                json!({"command": "git status", "cwd": "/repo"}),
            ),
        ];
        for (host, tool, input) in calls {
            assert_eq!(
                action(host, tool, input.clone(), "/repo"),
                expected,
                "{host} {tool} {input}"
            );
        }
        // Another directory is another action.
        let elsewhere = action(
            Host::GeminiCli,
            "run_shell_command",
            json!({"command": "git status", "dir_path": "sub/../../etc"}),
            "/repo",
        );
        assert_eq!(elsewhere.1["cwd"], "/etc");
    }

    #[test]
    fn files_urls_and_mcp_tools_are_read_per_host() {
        assert_eq!(
            action(
                Host::ClaudeCode,
                "Write",
                json!({"file_path": "/repo/a.txt", "content": "hi"}),
                "/repo"
            ),
            (Kind::Write, json!({"path": "/repo/a.txt", "content": "hi"}))
        );
        assert_eq!(
            action(
                Host::Copilot,
                "create",
                json!({"path": "/repo/a.txt", "file_text": "hi"}),
                "/repo"
            ),
            (Kind::Write, json!({"path": "/repo/a.txt", "content": "hi"}))
        );
        assert_eq!(
            action(
                Host::GeminiCli,
                "write_file",
                json!({"file_path": "a.txt", "content": "hi"}),
                "/repo"
            ),
            (Kind::Write, json!({"path": "/repo/a.txt", "content": "hi"}))
        );
        let patch = "*** Begin Patch\n*** Update File: src/x.rs\n@@\n-a\n+b\n*** End Patch\n";
        assert_eq!(
            action(
                Host::Codex,
                "apply_patch",
                json!({"command": patch}),
                "/repo"
            ),
            (
                Kind::Edit,
                json!({"path": "/repo/src/x.rs", "patch": patch})
            )
        );
        let copilot_patch = "*** Begin Patch\n*** Add File: b.txt\n+hi\n*** End Patch\n";
        for tool in ["apply_patch", "Edit"] {
            assert_eq!(
                action(
                    Host::Copilot,
                    tool,
                    json!({"patch": copilot_patch}),
                    "/repo"
                ),
                (
                    Kind::Edit,
                    json!({"path": "/repo/b.txt", "patch": copilot_patch})
                ),
                "{tool}"
            );
        }
        assert_eq!(
            action(
                Host::ClaudeCode,
                "Read",
                json!({"file_path": "/repo/a"}),
                "/repo"
            )
            .0,
            Kind::Read
        );
        assert_eq!(
            action(
                Host::GeminiCli,
                "web_fetch",
                json!({"prompt": "Summarise https://example.com/a."}),
                "/"
            ),
            (Kind::Fetch, json!({"url": "https://example.com/a"}))
        );
        // Two URLs cannot be one fetch.
        assert_eq!(
            action(
                Host::GeminiCli,
                "web_fetch",
                json!({"prompt": "https://a.test https://b.test"}),
                "/"
            )
            .0,
            Kind::Other
        );
        let mcp = (
            Kind::Mcp,
            json!({"server": "github", "tool": "create_issue", "arguments": {"title": "t"}}),
        );
        assert_eq!(
            action(
                Host::ClaudeCode,
                "mcp__github__create_issue",
                json!({"title": "t"}),
                "/"
            ),
            mcp
        );
        assert_eq!(
            action(
                Host::Codex,
                "mcp__github__create_issue",
                json!({"title": "t"}),
                "/"
            ),
            mcp
        );
        assert_eq!(
            action(
                Host::GeminiCli,
                "mcp_github_create_issue",
                json!({"title": "t"}),
                "/"
            ),
            mcp
        );
        assert_eq!(
            action(
                Host::Copilot,
                "github-create_issue",
                json!({"title": "t"}),
                "/"
            ),
            mcp
        );
        assert_eq!(
            action(
                Host::Cursor,
                "MCP:github:create_issue",
                json!({"title": "t"}),
                "/"
            ),
            mcp
        );
    }

    #[test]
    fn what_the_table_does_not_know_is_other_with_no_fields() {
        for (host, tool, input) in [
            (Host::ClaudeCode, "Task", json!({"prompt": "x"})),
            // A shell tool without its command is not a shell action.
            (Host::ClaudeCode, "Bash", json!({"cmd": "rm -rf /"})),
            (Host::Codex, "apply_patch", json!({"command": "no headers"})),
            (Host::Acp, "execute", json!({"command": 7})),
            (Host::Copilot, "glob", json!({"pattern": "*"})),
        ] {
            assert_eq!(action(host, tool, input, "/repo"), (Kind::Other, json!({})));
        }
    }

    #[test]
    fn hosts_and_kinds_parse_only_their_names() {
        assert_eq!(Host::parse("host", "").unwrap(), None);
        assert_eq!(Host::parse("host", "codex").unwrap(), Some(Host::Codex));
        let error = Host::parse("batch.calls[0].host", "Codex")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("batch.calls[0].host") && error.contains("claude-code"),
            "{error}"
        );
        assert_eq!(Kind::parse("kind", "shell").unwrap(), Kind::Shell);
        assert!(Kind::parse("kind", "Shell").is_err());
    }
}
