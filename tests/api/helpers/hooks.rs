//! The agent-host hooks (`approval-broker hook <host>`) run as their hosts run them, shared by
//! the Claude Code hook's tests and the other hosts' (`claude_code_hook.rs`, `host_hooks.rs`):
//! a hook fixture read, the real binary started with its input on standard input, its exit code
//! and output collected, and the one pending call a hook made found. What a hook's answer must
//! be stays with each host's tests.

use std::io::Write as _;
use std::process::{Child, Stdio};
use std::time::Duration;

use approval_broker::proto::v1 as pb;
use serde_json::Value;

use super::{PATIENCE, TestApp, broker_binary};

/// The JSON file `tests/fixtures/{path}`.
pub fn fixture_json(path: &str) -> Value {
    let path = format!("{}/tests/fixtures/{path}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The broker's address as a hook's `--broker` takes it.
pub fn broker_url(app: &TestApp) -> String {
    format!("http://{}", app.address)
}

/// Starts `approval-broker hook <command>` against `broker` with `args` (and
/// `APPROVALS_BROKER_TOKEN` set to `token`, if any), and writes `input` to its standard input.
pub fn spawn_hook(
    command: &str,
    broker: &str,
    args: &[&str],
    token: Option<&str>,
    input: &Value,
) -> Child {
    let mut hook = broker_binary();
    if let Some(token) = token {
        hook.env("APPROVALS_BROKER_TOKEN", token);
    }
    let mut child = hook
        .args(["hook", command, "--broker", broker])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the hook");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(input.to_string().as_bytes())
        .expect("write the hook input");
    child
}

/// What a hook run ended with.
pub struct HookResult {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// How long a hook may take to end: twice [`PATIENCE`], since a test may start a whole table of
/// hooks at once and a hook may itself wait for the broker.
const HOOK_PATIENCE: Duration = Duration::from_secs(PATIENCE.as_secs() * 2);

/// Waits for the hook to exit and collects what it printed.
pub async fn finish_hook(child: Child) -> HookResult {
    let output = tokio::time::timeout(
        HOOK_PATIENCE,
        tokio::task::spawn_blocking(move || child.wait_with_output()),
    )
    .await
    .expect("the hook finished in time")
    .expect("join")
    .expect("hook output");
    HookResult {
        code: output.status.code().expect("an exit code"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8"),
    }
}

/// The one pending call of `session`, once there is one (a hook's call id is often made by the
/// hook, so it is found by its session); fails if the session holds two.
pub async fn the_pending_call(app: &TestApp, session: &str) -> pb::Call {
    for _ in 0..400 {
        let pending = app
            .approver()
            .list_pending(pb::ListPendingRequest {
                filter: Some(pb::CallFilter {
                    session_id: session.into(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .expect("list pending")
            .into_inner()
            .calls;
        if let [call] = pending.as_slice() {
            return call.clone();
        }
        assert!(pending.len() < 2, "one pending call: {pending:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no pending call in {session}");
}
