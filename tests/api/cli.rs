//! The binary: `approval-broker migrate` applies the migrations and exits, on either backend,
//! and an invalid setting stops the broker at start with a message naming it.

use std::process::Command;

use crate::helpers::*;

fn broker() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_approval-broker"));
    command
        .env_remove("DATABASE_URL")
        .env("RUST_LOG", "info")
        // Tests run side by side: none may take the default metrics port.
        .env("APPROVALS_METRICS_LISTEN", "off");
    command
}

async fn table_count(url: &str) -> i64 {
    use sqlx::Connection as _;
    if url.starts_with("postgres") {
        let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema() \
             AND table_name IN ('batches', 'calls', 'events')",
        )
        .fetch_one(&mut conn)
        .await
        .expect("count")
    } else {
        let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
        sqlx::query_scalar(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' \
             AND name IN ('batches', 'calls', 'events')",
        )
        .fetch_one(&mut conn)
        .await
        .expect("count")
    }
}

/// Uses an app only for its fresh database: stops it, then migrates that database again with
/// the binary (idempotent), and on a new SQLite file from nothing.
async fn the_migrate_subcommand_applies_the_migrations_and_exits(mut app: TestApp) {
    app.shut_down().await;
    let output = broker()
        .args(["migrate", "--database-url", &app.database_url])
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(table_count(&app.database_url).await, 3);

    let fresh = format!("sqlite://{}", app.dir.path().join("fresh.db").display());
    let output = broker()
        .args(["migrate"])
        .env("DATABASE_URL", &fresh)
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("migrations applied"));
    assert_eq!(table_count(&fresh).await, 3);
}

#[test]
fn an_invalid_setting_stops_the_broker_naming_it() {
    for (flag, value) in [
        ("--sqlite-synchronous", "off"),
        ("--listen", "not-an-address"),
        ("--default-deadline", "soon"),
        ("--subscriber-buffer", "0"),
        ("--metrics-listen", "everywhere"),
        ("--log-format", "xml"),
    ] {
        let output = broker().args([flag, value]).output().expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{flag}: {stderr}");
    }
    // A metrics port that is taken stops the broker too, naming the setting.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let dir = tempfile::tempdir().expect("dir");
    let output = broker()
        .args(["--listen", "127.0.0.1:0", "--metrics-listen"])
        .arg(taken.local_addr().expect("address").to_string())
        .arg("--database-url")
        .arg(format!("sqlite://{}", dir.path().join("m.db").display()))
        .output()
        .expect("run");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("--metrics-listen"),
        "{output:?}"
    );
    // On a free port, so that only the database URL can be at fault.
    let output = broker()
        .args([
            "--database-url",
            "sqlite::memory:",
            "--listen",
            "127.0.0.1:0",
        ])
        .output()
        .expect("run");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("DATABASE_URL"),
        "{output:?}"
    );
}

#[test]
fn an_invalid_policy_file_stops_the_broker_naming_the_setting_and_the_rule() {
    let dir = tempfile::tempdir().expect("dir");
    let database = format!("sqlite://{}", dir.path().join("a.db").display());
    let bad_rule = dir.path().join("bad-rule.json");
    std::fs::write(
        &bad_rule,
        r#"{"rules": [{"id": "fine", "tool": "t", "effect": "allow"},
                      {"id": "bad-one", "tool": "t", "effect": "maybe"}]}"#,
    )
    .expect("write");
    let missing = dir.path().join("missing.json");
    for (file, expected) in [
        (&bad_rule, "rules[1] (id `bad-one`): effect"),
        (&missing, "cannot read"),
    ] {
        let output = broker()
            .args(["--listen", "127.0.0.1:0", "--database-url", &database])
            .env("APPROVALS_POLICY_FILE", file)
            .output()
            .expect("run");
        assert!(!output.status.success(), "{output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("--policy-file"), "{stdout}");
        assert!(stdout.contains(expected), "{stdout}");
    }
}

#[test]
fn hash_token_prints_the_line_to_configure_a_token_with() {
    let output = broker()
        .args(["hash-token", "s3cret"])
        .output()
        .expect("run");
    assert!(output.status.success());
    let printed = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    assert_eq!(printed, approval_broker::auth::hash_token("s3cret"));
    assert!(printed.starts_with("sha256:") && printed.len() == 7 + 64);

    let mut child = broker()
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    use std::io::Write as _;
    writeln!(child.stdin.take().expect("stdin"), "s3cret").expect("write");
    let output = child.wait_with_output().expect("wait");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        printed,
        "from standard input"
    );
}

#[test]
fn with_no_tokens_the_broker_warns_at_start_that_auth_is_off() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().expect("dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut child = broker()
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--database-url",
            &format!("sqlite://{}", dir.path().join("a.db").display()),
        ])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start");
    let stdout = child.stdout.take().expect("stdout");
    let mut warned = false;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("line");
        if line.contains("authentication is OFF") {
            warned = line.contains("WARN");
            break;
        }
        if line.contains("approval broker serving") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(warned, "a warning that authentication is off");
}

backend_tests! {
    the_migrate_subcommand_applies_the_migrations_and_exits,
}
