//! `approval-broker acp-proxy`, run as an editor runs an ACP agent: the real binary between a
//! test playing the editor (ACP client) on its standard I/O and a stand-in agent
//! (`tests/fixtures/acp/agent.py`, scripted by each test's prompt) behind it, with a real broker
//! deciding. The promises: the agent's permission requests never reach the editor and are
//! answered from the broker's outcome, by option kind (only a verified approval selects an allow
//! option); a cancel from the editor cancels the broker call; everything else passes through
//! byte for byte; the agent's exit code is the proxy's.

use std::process::Stdio;
use std::time::Duration;

use approval_broker::proto::v1 as pb;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::task::JoinHandle;

use crate::helpers::*;

const SESSION: &str = "sess-1";
const CWD: &str = "/work/project";

fn agent_script() -> String {
    format!("{}/tests/fixtures/acp/agent.py", env!("CARGO_MANIFEST_DIR"))
}

/// The test in the editor's place: the proxy's standard I/O, and what passed through.
struct Editor {
    proxy: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
    stderr: JoinHandle<String>,
    /// Every byte the editor wrote, and every line it read.
    sent: Vec<u8>,
    received: Vec<Vec<u8>>,
    /// Where the agent logs what it read and wrote.
    dir: tempfile::TempDir,
    next_id: u64,
}

impl Editor {
    fn start(broker: &str, args: &[&str]) -> Editor {
        Editor::start_with(broker, args, &[])
    }

    fn start_with(broker: &str, args: &[&str], env: &[(&str, &str)]) -> Editor {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut command = tokio::process::Command::from(broker_binary());
        command
            .args(["acp-proxy", "--broker", broker])
            .args(args)
            .args(["--", "python3", &agent_script()])
            .env("ACP_AGENT_RECEIVED", dir.path().join("received"))
            .env("ACP_AGENT_SENT", dir.path().join("sent"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let mut proxy = command.spawn().expect("start the proxy");
        let mut stderr = proxy.stderr.take().expect("stderr");
        let stderr = tokio::spawn(async move {
            let mut text = String::new();
            let _ = stderr.read_to_string(&mut text).await;
            text
        });
        Editor {
            input: proxy.stdin.take(),
            output: BufReader::new(proxy.stdout.take().expect("stdout")),
            proxy,
            stderr,
            sent: Vec::new(),
            received: Vec::new(),
            dir,
            next_id: 0,
        }
    }

    async fn send_raw(&mut self, line: &[u8]) {
        let input = self.input.as_mut().expect("the editor's side is open");
        input.write_all(line).await.expect("write to the proxy");
        input.flush().await.expect("flush");
        self.sent.extend_from_slice(line);
    }

    async fn send(&mut self, message: &Value) {
        self.send_raw(format!("{message}\n").as_bytes()).await;
    }

    /// Sends a request; returns its id.
    async fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    async fn next(&mut self) -> Value {
        let mut line = Vec::new();
        let read = tokio::time::timeout(PATIENCE, self.output.read_until(b'\n', &mut line))
            .await
            .expect("the proxy wrote a line in time")
            .expect("read from the proxy");
        assert!(read > 0, "the proxy closed its output");
        let message = serde_json::from_slice(&line)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&line)));
        self.received.push(line);
        message
    }

    /// Reads until the response to `id`.
    async fn response(&mut self, id: u64) -> Value {
        loop {
            let message = self.next().await;
            if message.get("method").is_none() && message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// `initialize` and `session/new` in `cwd`; returns the session id.
    async fn open_session(&mut self, cwd: &str) -> String {
        let id = self
            .request(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {}}),
            )
            .await;
        self.response(id).await;
        let id = self
            .request("session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        let session = self.response(id).await["result"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        assert_eq!(session, SESSION);
        session
    }

    /// Starts a prompt turn running `script` (see the agent's header); returns the request id.
    async fn prompt(&mut self, script: Value) -> u64 {
        self.request(
            "session/prompt",
            json!({"sessionId": SESSION, "prompt": [{"type": "text", "text": script.to_string()}]}),
        )
        .await
    }

    /// The agent's report of the answer it got to its permission request.
    async fn answer_the_agent_got(&mut self) -> Value {
        loop {
            let message = self.next().await;
            let text = message["params"]["update"]["content"]["text"].as_str();
            if let Some(answer) = text.and_then(|t| t.strip_prefix("ANSWER ")) {
                return serde_json::from_str(answer).expect("the agent's report");
            }
        }
    }

    /// Closes the editor's side and waits for the proxy: its exit code and standard error.
    async fn finish(mut self) -> (i32, String, Editor) {
        drop(self.input.take());
        self.wait().await
    }

    async fn wait(mut self) -> (i32, String, Editor) {
        // What the agent still writes is read, so it never blocks on a full pipe.
        let mut rest = Vec::new();
        tokio::time::timeout(PATIENCE, self.output.read_to_end(&mut rest))
            .await
            .expect("the proxy closed its output in time")
            .expect("read");
        let status = tokio::time::timeout(PATIENCE, self.proxy.wait())
            .await
            .expect("the proxy exited in time")
            .expect("its status");
        let stderr = (&mut self.stderr).await.expect("stderr");
        (status.code().expect("an exit code"), stderr, self)
    }

    fn agent_log(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(name)).unwrap_or_default()
    }

    fn the_editor_never_saw_a_permission_request(&self) {
        for line in &self.received {
            let text = String::from_utf8_lossy(line);
            assert!(!text.contains("session/request_permission"), "{text}");
        }
    }
}

fn broker_url(app: &TestApp) -> String {
    format!("http://{}", app.address)
}

/// Options whose ids and names say the opposite of their kinds: only the kind may count.
fn misleading_options() -> Value {
    json!([
        {"optionId": "reject", "name": "Reject", "kind": "allow_once"},
        {"optionId": "allow", "name": "Allow", "kind": "reject_once"},
        {"optionId": "reject-forever", "name": "Never", "kind": "allow_always"},
        {"optionId": "allow-forever", "name": "Always", "kind": "reject_always"},
    ])
}

/// claude-code-acp's way: the whole tool call announced first, the request carrying only its
/// id, raw input and title.
fn ask_to_run(tool_call_id: &str, command: &str) -> Value {
    json!([
        {"update": {
            "sessionUpdate": "tool_call", "toolCallId": tool_call_id, "status": "pending",
            "kind": "execute", "title": format!("`{command}`"),
            "rawInput": {"command": command},
            "_meta": {"claudeCode": {"toolName": "Bash"}},
        }},
        {"ask": {
            "toolCall": {"toolCallId": tool_call_id, "rawInput": {"command": command},
                         "title": format!("`{command}`")},
            "options": misleading_options(),
        }},
    ])
}

fn selected(option_id: &str) -> Value {
    json!({"outcome": "selected", "optionId": option_id})
}

/// Waits until the broker holds `call_id` of the session pending.
async fn pending_call(app: &TestApp, call_id: &str) -> pb::Call {
    for _ in 0..400 {
        if let Some(pb::call_state::State::Pending(call)) =
            states(app, SESSION, &[call_id]).await.remove(0).state
        {
            return call;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{call_id} never became pending");
}

fn lines(bytes: &[u8]) -> Vec<&[u8]> {
    bytes.split_inclusive(|b| *b == b'\n').collect()
}

fn is_permission_request(line: &[u8]) -> bool {
    serde_json::from_slice::<Value>(line)
        .is_ok_and(|m| m["method"] == json!("session/request_permission"))
}

#[tokio::test]
async fn an_approval_selects_the_allow_once_option_by_kind_and_the_editor_never_sees_the_request() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    let turn = editor.prompt(ask_to_run("toolu_1", "git status")).await;

    let call = pending_call(&app, "toolu_1").await;
    assert_eq!((call.tool.as_str(), call.host.as_str()), ("Bash", "acp"));
    let action = call.action.clone().expect("a host call's action");
    assert_eq!(action.kind, "shell");
    assert_eq!(
        serde_json::from_str::<Value>(&action.fields_json).unwrap()["command"],
        "git status"
    );
    assert_eq!(call.workspace, CWD);
    assert_eq!(call.title, "`git status`");
    assert_eq!(
        serde_json::from_str::<Value>(&call.input_json).unwrap(),
        json!({"command": "git status"})
    );
    assert!(call.message.contains("kind `execute`"), "{}", call.message);
    approve(&app, SESSION, "toolu_1").await;

    let answer = editor.answer_the_agent_got().await;
    assert_eq!(answer["result"]["outcome"], selected("reject"));
    assert_eq!(
        answer["result"]["_meta"]["approvalBroker"]["approved"],
        true
    );
    assert_eq!(
        editor.response(turn).await["result"]["stopReason"],
        "end_turn"
    );
    let (code, stderr, editor) = editor.finish().await;
    assert_eq!(code, 0, "{stderr}");
    editor.the_editor_never_saw_a_permission_request();
    // Everything else the agent wrote reached the editor, byte for byte.
    let sent = editor.agent_log("sent");
    let relayed: Vec<&[u8]> = lines(&sent)
        .into_iter()
        .filter(|l| !is_permission_request(l))
        .collect();
    let received: Vec<&[u8]> = editor.received.iter().map(Vec::as_slice).collect();
    assert_eq!(relayed, received);
}

#[tokio::test]
async fn a_denial_selects_the_reject_once_option_with_the_reason() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    editor.prompt(ask_to_run("toolu_2", "rm -rf build")).await;
    pending_call(&app, "toolu_2").await;
    deny(&app, SESSION, "toolu_2", "keep the build").await;

    let answer = editor.answer_the_agent_got().await;
    assert_eq!(answer["result"]["outcome"], selected("allow"));
    let note = &answer["result"]["_meta"]["approvalBroker"];
    assert_eq!(note["approved"], false);
    assert!(
        note["reason"].as_str().unwrap().contains("keep the build"),
        "{note}"
    );
    let (_, stderr, editor) = editor.finish().await;
    assert!(stderr.contains("keep the build"), "{stderr}");
    editor.the_editor_never_saw_a_permission_request();
}

#[tokio::test]
async fn an_edited_approval_is_rejected_saying_why() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    editor.prompt(ask_to_run("toolu_3", "rm -rf /")).await;
    pending_call(&app, "toolu_3").await;
    let mut request = decide_request(SESSION, "toolu_3", pb::Decision::Approve, "");
    request.edited_input_json = json!({"command": "rm -rf ./tmp"}).to_string();
    app.approver().decide(request).await.expect("approve");

    let answer = editor.answer_the_agent_got().await;
    assert_eq!(answer["result"]["outcome"], selected("allow"));
    let reason = answer["result"]["_meta"]["approvalBroker"]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("edited input"), "{reason}");
    assert!(reason.contains("rm -rf ./tmp"), "{reason}");
    let (_, stderr, _) = editor.finish().await;
    assert!(stderr.contains("edited input"), "{stderr}");
}

#[tokio::test]
async fn an_unreachable_broker_rejects() {
    let nowhere = format!("http://127.0.0.1:{}", free_port().expect("a free port"));
    let mut editor = Editor::start(&nowhere, &[]);
    editor.open_session(CWD).await;
    editor.prompt(ask_to_run("toolu_4", "git push")).await;

    let answer = editor.answer_the_agent_got().await;
    assert_eq!(answer["result"]["outcome"], selected("allow"));
    let reason = answer["result"]["_meta"]["approvalBroker"]["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains(&nowhere), "{reason}");
    assert!(reason.contains("could not be reached"), "{reason}");
    let (_, stderr, _) = editor.finish().await;
    assert!(stderr.contains(&nowhere), "{stderr}");
}

#[tokio::test]
async fn no_decision_in_time_rejects_and_cancels_the_call() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &["--timeout", "1s"]);
    editor.open_session(CWD).await;
    editor.prompt(ask_to_run("toolu_5", "make deploy")).await;

    let answer = editor.answer_the_agent_got().await;
    assert_eq!(answer["result"]["outcome"], selected("allow"));
    let outcome = outcome_of(&app, SESSION, "toolu_5").await;
    assert_eq!(status_of(&outcome), CallStatus::Cancelled);
    editor.finish().await;
}

#[tokio::test]
async fn a_cancel_from_the_editor_cancels_the_broker_call_and_answers_cancelled() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    let turn = editor.prompt(ask_to_run("toolu_6", "npm publish")).await;
    pending_call(&app, "toolu_6").await;
    let cancel =
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": SESSION}});
    editor.send(&cancel).await;

    let answer = editor.answer_the_agent_got().await;
    assert_eq!(answer["result"]["outcome"], json!({"outcome": "cancelled"}));
    assert_eq!(
        editor.response(turn).await["result"]["stopReason"],
        "cancelled"
    );
    let mut status = CallStatus::Pending;
    for _ in 0..400 {
        if let Some(pb::call_state::State::Outcome(outcome)) =
            states(&app, SESSION, &["toolu_6"]).await.remove(0).state
        {
            status = status_of(&outcome);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(status, CallStatus::Cancelled);
    let (_, _, editor) = editor.finish().await;
    // The cancel itself reached the agent, unchanged.
    let received = editor.agent_log("received");
    assert!(lines(&received).contains(&format!("{cancel}\n").as_bytes()));
}

#[tokio::test]
async fn every_other_message_passes_through_unchanged_both_ways() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    // Spacing, key order and escapes a re-serialiser would change, and a line that is not JSON.
    editor
        .send_raw(b"{ \"jsonrpc\" : \"2.0\", \"method\":\"x/note\",\"params\":{\"b\":1,\"a\":\"caf\\u00e9\",\"n\":1.50}}  \n")
        .await;
    editor.send_raw(b"not json at all\n").await;
    editor.open_session(CWD).await;
    let odd = [
        "{\"params\":{\"update\":{\"content\":{\"text\":\"\\u0041 \u{e9}\",\"type\":\"text\"},\"sessionUpdate\":\"agent_message_chunk\"},\"sessionId\":\"sess-1\"},\"method\":\"session/update\",\"jsonrpc\":\"2.0\"}",
        "  {\"jsonrpc\":\"2.0\",\"method\":\"x/custom\",\"params\":{\"z\":1e3}}   ",
    ];
    let turn = editor
        .prompt(json!(
            odd.iter()
                .map(|raw| json!({"raw": raw}))
                .collect::<Vec<_>>()
        ))
        .await;
    editor.response(turn).await;
    let (code, stderr, editor) = editor.finish().await;
    assert_eq!(code, 0, "{stderr}");

    assert_eq!(editor.agent_log("received"), editor.sent);
    let sent = editor.agent_log("sent");
    let received: Vec<&[u8]> = editor.received.iter().map(Vec::as_slice).collect();
    assert_eq!(lines(&sent), received);
    for raw in odd {
        assert!(received.contains(&format!("{raw}\n").as_bytes()), "{raw}");
    }
}

#[tokio::test]
async fn a_v2_shaped_request_is_refused_and_nothing_is_submitted() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    let script = json!([{"ask": {
        "title": "Run `git status`",
        "subject": {"type": "command", "command": "git status"},
        "options": [{"optionId": "ok", "name": "Allow", "kind": "allow_once"}],
    }}]);
    editor.prompt(script).await;

    let answer = editor.answer_the_agent_got().await;
    assert!(answer.get("result").is_none(), "{answer}");
    let message = answer["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("v2 draft"), "{message}");
    assert!(message.contains("not approved"), "{message}");
    let (_, stderr, editor) = editor.finish().await;
    assert!(stderr.contains("v2 draft"), "{stderr}");
    editor.the_editor_never_saw_a_permission_request();
    assert!(all_calls(&app).await.is_empty());
}

#[tokio::test]
async fn a_remembered_decision_selects_an_always_option_only_where_it_is_safe() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    // A denial remembered for the session: the next identical call is denied by the grant.
    editor
        .prompt(ask_to_run("toolu_7", "curl evil.example"))
        .await;
    pending_call(&app, "toolu_7").await;
    grant_by_deciding(
        &app,
        SESSION,
        "toolu_7",
        pb::Decision::Deny,
        pb::Scope::Session,
        None,
    )
    .await;
    assert_eq!(
        editor.answer_the_agent_got().await["result"]["outcome"],
        selected("allow")
    );
    editor
        .prompt(ask_to_run("toolu_8", "curl evil.example"))
        .await;
    assert_eq!(
        editor.answer_the_agent_got().await["result"]["outcome"],
        selected("allow-forever"),
        "a remembered denial selects reject_always"
    );

    // An approval remembered for the session: allow_once still, unless asked otherwise, since
    // an agent told "always" would stop asking the broker.
    editor.prompt(ask_to_run("toolu_9", "ls")).await;
    pending_call(&app, "toolu_9").await;
    grant_by_deciding(
        &app,
        SESSION,
        "toolu_9",
        pb::Decision::Approve,
        pb::Scope::Session,
        None,
    )
    .await;
    assert_eq!(
        editor.answer_the_agent_got().await["result"]["outcome"],
        selected("reject")
    );
    editor.prompt(ask_to_run("toolu_10", "ls")).await;
    assert_eq!(
        editor.answer_the_agent_got().await["result"]["outcome"],
        selected("reject")
    );
    editor.finish().await;

    let mut editor = Editor::start(&broker_url(&app), &["--select-allow-always"]);
    editor.open_session(CWD).await;
    editor.prompt(ask_to_run("toolu_11", "ls")).await;
    assert_eq!(
        editor.answer_the_agent_got().await["result"]["outcome"],
        selected("reject-forever")
    );
    editor.finish().await;
}

#[tokio::test]
async fn the_proxy_exits_with_the_agents_code() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    editor.prompt(json!([{"exit": 3}])).await;
    let (code, stderr, _) = editor.wait().await;
    assert_eq!(code, 3, "{stderr}");

    // The editor closing its side closes the agent's; the agent's code is the proxy's.
    let mut editor = Editor::start_with(&broker_url(&app), &[], &[("ACP_AGENT_EOF_EXIT", "7")]);
    editor.open_session(CWD).await;
    let (code, stderr, _) = editor.finish().await;
    assert_eq!(code, 7, "{stderr}");
}

#[tokio::test]
async fn a_request_without_raw_input_is_submitted_from_what_it_shows() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    // Gemini CLI's way: no raw input and no tool name; the file and the diff are shown.
    let shown = json!({
        "toolCallId": "replace-1", "status": "pending", "kind": "edit",
        "title": "Writing to a.txt",
        "locations": [{"path": "/work/project/a.txt"}],
        "content": [{"type": "diff", "path": "/work/project/a.txt", "oldText": "a", "newText": "b"}],
    });
    let mut announced = shown.clone();
    announced["sessionUpdate"] = json!("tool_call");
    let script = json!([
        {"update": announced},
        {"ask": {"toolCall": shown, "options": [
            {"optionId": "proceed_always", "name": "Allow All Edits", "kind": "allow_always"},
            {"optionId": "proceed_once", "name": "Allow", "kind": "allow_once"},
            {"optionId": "cancel", "name": "Reject", "kind": "reject_once"},
        ]}},
    ]);
    editor.prompt(script).await;

    let call = pending_call(&app, "replace-1").await;
    assert_eq!(call.tool, "edit");
    assert_eq!(
        serde_json::from_str::<Value>(&call.input_json).unwrap(),
        json!({
            "kind": "edit", "title": "Writing to a.txt", "path": "/work/project/a.txt",
            "locations": [{"path": "/work/project/a.txt"}], "oldText": "a", "newText": "b",
        })
    );
    let action = call.action.clone().expect("an action");
    assert_eq!(action.kind, "edit");
    assert_eq!(
        serde_json::from_str::<Value>(&action.fields_json).unwrap()["path"],
        "/work/project/a.txt"
    );
    approve(&app, SESSION, "replace-1").await;
    assert_eq!(
        editor.answer_the_agent_got().await["result"]["outcome"],
        selected("proceed_once")
    );
    editor.finish().await;
}

#[tokio::test]
async fn a_line_from_the_agent_that_cannot_be_read_never_reaches_the_editor() {
    let app = spawn_app().await;
    let mut editor = Editor::start(&broker_url(&app), &[]);
    editor.open_session(CWD).await;
    // A lone surrogate: JavaScript's JSON.parse reads this request; a strict reader does not.
    let unreadable = r#"{"jsonrpc":"2.0","id":9,"method":"session/request_permission","params":{"sessionId":"sess-1","toolCall":{"toolCallId":"t\ud800"},"options":[]}}"#;
    let turn = editor
        .prompt(json!([{"raw": unreadable}, {"raw": "plain text"}]))
        .await;
    editor.response(turn).await;
    let (_, stderr, editor) = editor.finish().await;
    for line in &editor.received {
        let text = String::from_utf8_lossy(line);
        assert!(
            !text.contains("ud800") && !text.contains("plain text"),
            "{text}"
        );
    }
    assert!(stderr.contains("not JSON"), "{stderr}");
    assert!(all_calls(&app).await.is_empty());
}
