//! The binary: `approval-broker migrate` applies the migrations and exits, on either backend,
//! and an invalid setting stops the broker at start with a message naming it.

use std::process::Command;

use crate::helpers::*;

fn broker() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_approval-broker"));
    command.env_remove("DATABASE_URL").env("RUST_LOG", "info");
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
    ] {
        let output = broker().args([flag, value]).output().expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{flag}: {stderr}");
    }
    let output = broker()
        .args(["--database-url", "sqlite::memory:"])
        .output()
        .expect("run");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("DATABASE_URL"),
        "{output:?}"
    );
}

backend_tests! {
    the_migrate_subcommand_applies_the_migrations_and_exits,
}
