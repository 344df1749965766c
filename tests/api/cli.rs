//! The binary: `approval-broker migrate` applies the migrations and exits, on either backend,
//! and an invalid setting stops the broker at start with a message naming it.

use std::process::Command;

use crate::helpers::*;

fn broker() -> Command {
    let mut command = broker_binary();
    command
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
    assert_eq!(printed, approval_broker::door::auth::hash_token("s3cret"));
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

/// Runs the broker to its exit, on a free port and a fresh SQLite file, with `setup` applied;
/// `None` if it was still running (serving) after 30 s, when it is killed.
fn run_to_exit(setup: impl FnOnce(&mut Command)) -> Option<std::process::Output> {
    let dir = tempfile::tempdir().expect("dir");
    let mut command = broker();
    command
        .args(["--listen", "127.0.0.1:0", "--database-url"])
        .arg(format!("sqlite://{}", dir.path().join("a.db").display()))
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    setup(&mut command);
    let mut child = command.spawn().expect("start");
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(30) {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn a_token_source_that_holds_no_token_stops_the_broker_instead_of_turning_auth_off() {
    let dir = tempfile::tempdir().expect("dir");
    let empty = dir.path().join("empty-tokens");
    std::fs::write(&empty, "").expect("write");
    let comments = dir.path().join("comment-tokens");
    std::fs::write(&comments, "# the tokens\n\n   # none yet\n").expect("write");
    type Setup<'a> = Box<dyn Fn(&mut Command) + 'a>;
    let cases: [(&str, Setup); 4] = [
        (
            "an empty --tokens-file",
            Box::new(|c| {
                c.arg("--tokens-file").arg(&empty);
            }),
        ),
        (
            "a comment-only APPROVALS_TOKENS_FILE",
            Box::new(|c| {
                c.env("APPROVALS_TOKENS_FILE", &comments);
            }),
        ),
        (
            "APPROVALS_TOKENS=\"\"",
            Box::new(|c| {
                c.env("APPROVALS_TOKENS", "");
            }),
        ),
        (
            "--tokens ' ; '",
            Box::new(|c| {
                c.args(["--tokens", " ; "]);
            }),
        ),
    ];
    for (what, setup) in cases {
        let output = run_to_exit(setup)
            .unwrap_or_else(|| panic!("{what}: the broker started (with authentication off)"));
        assert!(!output.status.success(), "{what}: {output:?}");
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(said.contains("holds no token"), "{what}: {said}");
        assert!(said.contains("TOKENS"), "{what} names the setting: {said}");
    }
}

#[test]
fn the_same_token_under_two_roles_stops_the_broker() {
    let hash = approval_broker::door::auth::hash_token("shared-secret");
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("tokens");
    std::fs::write(&file, format!("agent bot {hash}\n")).expect("write");
    // Within one source, and across the file and the inline tokens.
    for inline in [None, Some(format!("admin root {hash}"))] {
        let output = run_to_exit(|c| {
            match &inline {
                None => c.args([
                    "--tokens",
                    &format!("agent bot {hash}; approver alice {hash}"),
                ]),
                Some(inline) => c.arg("--tokens-file").arg(&file).args(["--tokens", inline]),
            };
        })
        .expect("the broker refused to start");
        assert!(!output.status.success(), "{output:?}");
        let said = String::from_utf8_lossy(&output.stdout);
        assert!(said.contains("already configured by entry 1"), "{said}");
    }
}

#[test]
fn help_never_prints_a_secret_from_the_environment() {
    let output = broker()
        .arg("--help")
        .env(
            "DATABASE_URL",
            "postgres://broker:hunter2@db.internal:5432/approvals",
        )
        .env(
            "APPROVALS_TOKENS",
            "agent bot sha256:not-a-secret-but-hidden",
        )
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(
        help.contains("DATABASE_URL"),
        "the setting is still documented: {help}"
    );
    assert!(!help.contains("hunter2"), "{help}");
    assert!(!help.contains("not-a-secret-but-hidden"), "{help}");
}

#[test]
fn durations_take_days_and_compound_forms_and_refuse_overflow() {
    // Once silently wrapped to 59 minutes.
    let output = run_to_exit(|c| {
        c.args(["--default-deadline", "5124095576030432h"]);
    })
    .expect("refused at start");
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("--default-deadline"), "{said}");
    for ok in ["1d", "1h30m"] {
        assert!(
            <approval_broker::config::Config as clap::Parser>::try_parse_from([
                "approval-broker",
                "--default-deadline",
                ok
            ])
            .is_ok(),
            "{ok}"
        );
    }
}

backend_tests! {
    the_migrate_subcommand_applies_the_migrations_and_exits,
}

/// Every subcommand `--help` lists has its row in docs/configuration.md's table of subcommands
/// (`mcp-gateway` once had none).
#[test]
fn every_subcommand_is_in_the_configuration_page() {
    let output = broker().arg("--help").output().expect("run");
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|command| *command != "help")
        .collect();
    assert!(commands.contains(&"mcp-gateway"), "{help}");
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .expect("docs/configuration.md");
    for command in commands {
        assert!(
            page.contains(&format!("| `approval-broker {command}")),
            "docs/configuration.md has no row for `{command}`"
        );
    }
}
