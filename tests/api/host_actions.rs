//! One action, every host (issue 48): a call an agent host's adapter submits names its host, the
//! broker reads it as a common action (shell, edit, write, read, fetch, mcp, other), rules may
//! name the kind, and a decision remembered on one host's call holds for the same action asked
//! by another host's tool, through the same gate as every grant. What must never happen: a
//! grant or a kind rule deciding a call it does not describe (another command, another
//! directory, a call with no host), or a remembered decision approving its author's own call.

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

/// A call from `host` of its tool `tool`, in workspace `/repo`.
fn host_call(host: &str, call_id: &str, tool: &str, input_json: &str) -> pb::CallSpec {
    pb::CallSpec {
        host: host.into(),
        ..call_in("/repo", call_id, tool, input_json)
    }
}

/// The same `git status`, as each host asks for it.
fn git_status_on(host: &str, call_id: &str) -> pb::CallSpec {
    match host {
        "claude-code" => host_call(
            host,
            call_id,
            "Bash",
            r#"{"command":"git status","description":"Show working tree status"}"#,
        ),
        "codex" => host_call(host, call_id, "Bash", r#"{"command":"git status"}"#),
        "gemini-cli" => host_call(
            host,
            call_id,
            "run_shell_command",
            r#"{"command":"git status","dir_path":"."}"#,
        ),
        "acp" => host_call(
            host,
            call_id,
            "execute",
            r#"{"command":["bash","-lc","git status"]}"#,
        ),
        other => panic!("no git status for {other}"),
    }
}

async fn a_host_call_is_stored_with_its_host_and_read_as_a_common_action(app: TestApp) {
    submit_one(&app, "s", git_status_on("gemini-cli", "c1")).await;
    let stored = get_call(&app, "s", "c1").await;
    assert_eq!(stored.host, "gemini-cli");
    assert_eq!(
        stored.tool, "run_shell_command",
        "the host's own tool stays"
    );
    assert_eq!(
        stored.input_json,
        r#"{"command":"git status","dir_path":"."}"#
    );
    let action = stored.action.expect("an action");
    assert_eq!(action.kind, "shell");
    assert_eq!(
        action.fields_json,
        r#"{"command":"git status","cwd":"/repo"}"#
    );

    // A call with no host has none, and looks as before.
    submit_one(
        &app,
        "s",
        call_in("/repo", "c2", "Bash", r#"{"command":"git status"}"#),
    )
    .await;
    let plain = get_call(&app, "s", "c2").await;
    assert_eq!((plain.host.as_str(), plain.action), ("", None));

    // A host the broker does not know, or spelt otherwise, is refused naming the field: a
    // call must not slip past the rules written for its kind by a typo.
    for host in ["Codex", "claude_code", "vim", "codex "] {
        let response = submit_one(&app, "s", host_call(host, "c3", "Bash", "{}")).await;
        match &response.acks[0].result {
            Some(pb::call_ack::Result::Error(error)) => {
                assert_eq!(error.code, Code::InvalidArgument as i32, "{host}");
                assert!(
                    error.message.starts_with("batch.calls[0].host: ")
                        && error.message.contains("claude-code, codex, gemini-cli"),
                    "{host}: {}",
                    error.message
                );
            }
            other => panic!("{host}: {other:?}"),
        }
        assert!(!is_stored(&app, "s", "c3").await, "{host}");
    }
}

async fn a_rule_naming_a_kind_decides_that_action_on_every_host_and_nothing_else(app: TestApp) {
    let created = create_rule(
        &app,
        pb::Rule {
            id: "git-read-only".into(),
            kind: "shell".into(),
            effect: pb::Effect::Allow as i32,
            matcher: Some(fields(vec![equals("command", "git status")])),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        (created.tool.as_str(), created.kind.as_str()),
        ("*", "shell")
    );
    let by_rule = "policy:git-read-only".to_owned();
    for (i, host) in ["claude-code", "codex", "gemini-cli", "acp"]
        .iter()
        .enumerate()
    {
        let call_id = format!("c{i}");
        assert_eq!(
            submitted_one(&app, host, git_status_on(host, &call_id)).await,
            (CallStatus::Approved, by_rule.clone()),
            "{host}"
        );
    }
    // Another command, a call with no host (no action), and a host's call of another kind stay
    // with people, whatever their tool is called.
    for (call_id, spec) in [
        (
            "x1",
            host_call("codex", "x1", "Bash", r#"{"command":"git push --force"}"#),
        ),
        (
            "x2",
            call_in("/repo", "x2", "Bash", r#"{"command":"git status"}"#),
        ),
        (
            "x3",
            host_call("claude-code", "x3", "Read", r#"{"file_path":"git status"}"#),
        ),
    ] {
        assert_eq!(
            submitted_one(&app, "s", spec).await,
            (CallStatus::Pending, String::new()),
            "{call_id}"
        );
    }

    let explained = explain_stored(&app, "codex", "c1").await;
    assert_eq!(explained.decided_by, by_rule);
    assert!(
        explained
            .reason
            .contains("for the shell action of any host's tool")
            && explained.reason.contains("codex's `Bash`")
            && explained
                .reason
                .contains(r#"{"command":"git status","cwd":"/repo"}"#),
        "Explain says which host's call matched the rule, as what: {}",
        explained.reason
    );

    // Explain on a call described inline, with its host, tries the kind rules too.
    let inline = |host: &str| pb::ExplainCall {
        session_id: "s".into(),
        workspace: "/repo".into(),
        tool: "run_shell_command".into(),
        input_json: r#"{"command":"git status"}"#.into(),
        host: host.into(),
        ..Default::default()
    };
    let explain = |call| {
        let mut admin = app.admin();
        async move {
            admin
                .explain(pb::ExplainRequest {
                    call: Some(pb::explain_request::Call::Inline(call)),
                })
                .await
                .expect("explain")
                .into_inner()
        }
    };
    let as_gemini = explain(inline("gemini-cli")).await;
    assert_eq!(as_gemini.decided_by, by_rule);
    assert!(
        as_gemini
            .reason
            .contains("gemini-cli's `run_shell_command`"),
        "{}",
        as_gemini.reason
    );
    let without_host = explain(inline("")).await;
    assert_eq!(without_host.verdict, pb::CallStatus::Pending as i32);

    // A kind the broker does not know is refused naming the field.
    let refused = app
        .admin()
        .create_rule(pb::CreateRuleRequest {
            rule: Some(pb::Rule {
                id: "typo".into(),
                kind: "Shell".into(),
                effect: pb::Effect::Deny as i32,
                ..Default::default()
            }),
        })
        .await;
    assert_status(refused, Code::InvalidArgument, "rule.kind");
}

async fn a_decision_remembered_on_one_host_decides_the_same_action_on_the_others(app: TestApp) {
    // Codex asks first and waits; Claude Code asks the same and a person approves it for the
    // workspace.
    submit_one(&app, "codex-session", git_status_on("codex", "codex-1")).await;
    submit_one(
        &app,
        "claude-session",
        git_status_on("claude-code", "toolu_1"),
    )
    .await;
    let grant = grant_by_deciding(
        &app,
        "claude-session",
        "toolu_1",
        pb::Decision::Approve,
        pb::Scope::Workspace,
        None,
    )
    .await;
    assert_eq!(grant.kind, "shell");
    assert_eq!(
        grant.tool, "Bash",
        "the tool it was remembered from, for people"
    );
    assert_eq!(
        grant.matcher,
        Some(exact_input(r#"{"command":"git status","cwd":"/repo"}"#)),
        "exactly the action decided"
    );
    let by_grant = format!("grant:{}", grant.id);

    // Codex's waiting call is decided at once, and the ACP agent's and Gemini CLI's as they
    // arrive, with no person.
    assert_eq!(
        outcome_of(&app, "codex-session", "codex-1")
            .await
            .decided_by,
        by_grant
    );
    for host in ["acp", "gemini-cli"] {
        assert_eq!(
            submitted_one(&app, host, git_status_on(host, "later")).await,
            (CallStatus::Approved, by_grant.clone()),
            "{host}"
        );
    }
    let explained = explain_stored(&app, "acp", "later").await;
    assert_eq!(explained.decided_by, by_grant);
    assert_eq!(explained.grant.map(|g| g.id), Some(grant.id));
    assert!(
        explained.reason.contains("acp's `execute`"),
        "{}",
        explained.reason
    );

    // Not another command, not another directory, not another workspace, not a call with no
    // host that looks the same.
    for (session, spec) in [
        (
            "s",
            host_call(
                "codex",
                "n1",
                "Bash",
                r#"{"command":"git status; rm -rf ~"}"#,
            ),
        ),
        (
            "s",
            host_call(
                "gemini-cli",
                "n2",
                "run_shell_command",
                r#"{"command":"git status","dir_path":"/etc"}"#,
            ),
        ),
        (
            "s",
            pb::CallSpec {
                host: "codex".into(),
                ..call_in("/elsewhere", "n3", "Bash", r#"{"command":"git status"}"#)
            },
        ),
        (
            "s",
            call_in("/repo", "n4", "Bash", r#"{"command":"git status"}"#),
        ),
    ] {
        let call_id = spec.call_id.clone();
        assert_eq!(
            submitted_one(&app, session, spec).await,
            (CallStatus::Pending, String::new()),
            "{call_id}"
        );
    }

    // Revoked, it decides nothing more, on any host.
    app.admin()
        .revoke_grant(pb::RevokeGrantRequest {
            target: Some(pb::revoke_grant_request::Target::Id(grant.id)),
            agent: String::new(),
        })
        .await
        .expect("revoke");
    assert_eq!(
        submitted_one(&app, "codex-session", git_status_on("codex", "codex-2")).await,
        (CallStatus::Pending, String::new())
    );
}

async fn a_remembered_host_decision_never_approves_its_authors_own_call(app: TestApp) {
    // Alice asked Codex for `git status`; the call is pending for someone else. She then
    // approves Claude Code's same command for the workspace: her grant must not approve her
    // own Codex call, nor her later ones.
    let mine = |call_id: &str| pb::CallSpec {
        requested_by: "alice@example.com".into(),
        ..git_status_on("codex", call_id)
    };
    submit_one(&app, "codex-session", mine("mine-1")).await;
    submit_one(
        &app,
        "claude-session",
        git_status_on("claude-code", "toolu_1"),
    )
    .await;
    let grant = grant_by_deciding(
        &app,
        "claude-session",
        "toolu_1",
        pb::Decision::Approve,
        pb::Scope::Always,
        None,
    )
    .await;
    assert_eq!(grant.kind, "shell");
    assert_eq!(
        get_call(&app, "codex-session", "mine-1").await.status,
        pb::CallStatus::Pending as i32,
        "her grant did not approve her own pending call"
    );
    assert_eq!(
        submitted_one(&app, "codex-session", mine("mine-2")).await,
        (CallStatus::Pending, String::new()),
        "nor her later one"
    );
    // Someone else's identical call is approved by it.
    assert_eq!(
        submitted_one(&app, "gemini", git_status_on("gemini-cli", "theirs")).await,
        (CallStatus::Approved, format!("grant:{}", grant.id))
    );
}

backend_tests! {
    a_host_call_is_stored_with_its_host_and_read_as_a_common_action,
    a_rule_naming_a_kind_decides_that_action_on_every_host_and_nothing_else,
    a_decision_remembered_on_one_host_decides_the_same_action_on_the_others,
    a_remembered_host_decision_never_approves_its_authors_own_call,
}
