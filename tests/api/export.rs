//! `approval-broker export`: the audit of a time range as JSON Lines, read from the database
//! while the broker runs: one line per call with who decided, why and when, inputs only when
//! asked for, and the range bounding the calls by when they were requested.

use std::collections::HashMap;

use serde_json::Value;

use crate::helpers::*;

/// Runs `approval-broker export` on the app's database with `args`; its lines by call id.
async fn export(app: &TestApp, args: &[&str]) -> HashMap<String, Value> {
    let output = run_export(app, args).await;
    assert!(
        output.status.success(),
        "export failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .map(|line| {
            let value: Value = serde_json::from_str(line).expect("a JSON line");
            (value["callId"].as_str().expect("callId").to_owned(), value)
        })
        .collect()
}

async fn run_export(app: &TestApp, args: &[&str]) -> std::process::Output {
    let mut command = broker_binary();
    command
        .args(["export", "--database-url", &app.database_url])
        .args(args);
    tokio::task::spawn_blocking(move || command.output().expect("run the broker binary"))
        .await
        .expect("the export")
}

async fn the_export_lists_each_call_of_the_range_with_who_decided_and_inputs_only_when_asked(
    app: TestApp,
) {
    submit(
        &app,
        batch("s", vec![call("ran", "shell", r#"{"cmd":"ls"}"#)]),
    )
    .await;
    approve(&app, "s", "ran").await;
    submit(
        &app,
        batch("s", vec![call("refused", "shell", r#"{"cmd":"rm"}"#)]),
    )
    .await;
    deny(&app, "s", "refused", "too risky").await;
    submit(&app, batch("s", vec![call("waiting", "edit", "{}")])).await;

    let lines = export(&app, &[]).await;
    assert_eq!(lines.len(), 3, "{lines:#?}");
    let ran = &lines["ran"];
    assert_eq!(ran["agent"], "default");
    assert_eq!(ran["sessionId"], "s");
    assert_eq!(ran["tool"], "shell");
    assert_eq!(ran["status"], "CALL_STATUS_APPROVED");
    assert_eq!(ran["decidedBy"], "approver:alice@example.com");
    assert!(ran["decidedAt"].is_string() && ran["createdAt"].is_string());
    let refused = &lines["refused"];
    assert_eq!(refused["status"], "CALL_STATUS_DENIED");
    assert_eq!(refused["reason"], "too risky");
    let waiting = &lines["waiting"];
    assert_eq!(waiting["status"], "CALL_STATUS_PENDING");
    assert!(waiting["decidedBy"].is_null() && waiting["decidedAt"].is_null());
    assert!(
        lines.values().all(|line| line.get("inputJson").is_none()),
        "no inputs by default"
    );

    let with_inputs = export(&app, &["--inputs"]).await;
    assert_eq!(with_inputs["ran"]["inputJson"], r#"{"cmd":"ls"}"#);
    assert_eq!(with_inputs["waiting"]["inputJson"], "{}");

    // The range bounds when calls were requested: from `refused` on, and before it.
    let from = refused["createdAt"].as_str().unwrap();
    let mut later: Vec<String> = export(&app, &["--from", from]).await.into_keys().collect();
    later.sort();
    assert_eq!(later, ["refused", "waiting"]);
    let earlier: Vec<String> = export(&app, &["--to", from]).await.into_keys().collect();
    assert_eq!(earlier, ["ran"]);

    let backwards = run_export(&app, &["--from", from, "--to", from]).await;
    assert!(!backwards.status.success());
    let message = String::from_utf8_lossy(&backwards.stderr);
    assert!(message.contains("--to"), "{message}");
}

backend_tests!(the_export_lists_each_call_of_the_range_with_who_decided_and_inputs_only_when_asked,);

/// An export of a SQLite file that does not exist names the flag it was given, and creates
/// nothing.
#[test]
fn an_export_of_a_missing_sqlite_file_names_the_flag_it_was_given() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("nope.db");
    let output = broker_binary()
        .args(["export", "--database-url"])
        .arg(format!("sqlite://{}", missing.display()))
        .output()
        .expect("run the broker binary");
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("--database-url (DATABASE_URL): there is no SQLite database at"),
        "{message}"
    );
    assert!(!missing.exists(), "nothing created");
}
