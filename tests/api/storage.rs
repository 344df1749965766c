//! Storage faults are reported as such: a database that cannot be written answers UNAVAILABLE
//! (a full disk RESOURCE_EXHAUSTED), never INTERNAL, and health turns NOT_SERVING while writes
//! fail and SERVING again once they work. A deleted SQLite file stops every acknowledgement. And
//! one SQLite file serves one broker process: a second one is refused at start.

use std::time::Duration;

use approval_broker::proto::v1 as pb;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::helpers::*;

/// What every storage fault but a full disk tells the client.
const UNAVAILABLE: &str = "storage unavailable: the database cannot be written; retry later";

async fn health_of(channel: &Channel, service: &str) -> ServingStatus {
    let response = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health check");
    response.into_inner().status()
}

/// Waits until the whole server's health and readiness are `wanted` (liveness stays SERVING).
async fn wait_for_health(channel: &Channel, wanted: ServingStatus) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let now = (
            health_of(channel, "").await,
            health_of(channel, "readiness").await,
            health_of(channel, "approvals.v1.AgentService").await,
        );
        if now == (wanted, wanted, wanted) {
            assert_eq!(
                health_of(channel, "liveness").await,
                ServingStatus::Serving,
                "restarting does not mend storage: liveness stays SERVING"
            );
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "health is {now:?}, not {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn try_submit(
    channel: &Channel,
    batch: pb::BatchSpec,
) -> Result<pb::SubmitResponse, tonic::Status> {
    AgentServiceClient::new(channel.clone())
        .submit(pb::SubmitRequest { batch: Some(batch) })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_sqlite_files_stops_acknowledgements_and_turns_health_not_serving() {
    let app = spawn_app().await;
    submit(&app, batch("s", vec![call("before", "t", "{}")])).await;
    let path = app.dir.path().join("approvals.db");
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        std::fs::remove_file(&file).expect("delete");
    }

    // The very next write is refused, before it is acknowledged: its commit went to a file
    // that is gone.
    let refused = try_submit(&app.channel, batch("s", vec![call("after", "t", "{}")]))
        .await
        .expect_err("a write into a deleted database is not acknowledged");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(refused.message(), UNAVAILABLE);
    let refused = app
        .approver()
        .decide(decide_request("s", "before", pb::Decision::Approve, ""))
        .await
        .expect_err("nor is a decision");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    wait_for_health(&app.channel, ServingStatus::NotServing).await;

    // And it stays so: nothing can make a deleted database durable again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = try_submit(&app.channel, batch("s", vec![call("later", "t", "{}")]))
        .await
        .expect_err("still refused");
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(health_of(&app.channel, "").await, ServingStatus::NotServing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_sqlite_file_is_noticed_without_any_write() {
    let app = spawn_app().await;
    std::fs::remove_file(app.dir.path().join("approvals.db")).expect("delete");
    wait_for_health(&app.channel, ServingStatus::NotServing).await;
}

/// A second broker process on the same SQLite file exits at start, saying why; the first one
/// goes on serving. Once the first stops, the file is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_broker_on_the_same_sqlite_file_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("one.db").display());
    let mut first = start_broker(&url, &[], &[]).await;

    let second = exits_within_patience(
        std::process::Command::new(env!("CARGO_BIN_EXE_approval-broker"))
            .args(["--listen", "127.0.0.1:0", "--database-url", &url])
            .env_clear()
            .env("APPROVALS_METRICS_LISTEN", "off")
            .env("NO_COLOR", "1"),
    );
    assert!(!second.status.success(), "{second:?}");
    let said = String::from_utf8_lossy(&second.stdout);
    assert!(
        said.contains("in use by another broker process") && said.contains("one.db.lock"),
        "{said}"
    );
    let migrate = exits_within_patience(
        std::process::Command::new(env!("CARGO_BIN_EXE_approval-broker"))
            .args(["migrate", "--database-url", &url])
            .env_clear(),
    );
    assert!(!migrate.status.success(), "migrate is refused too");

    let channel = first.channel();
    let response = try_submit(&channel, batch("s", vec![call("c", "t", "{}")])).await;
    assert!(response.is_ok(), "the first broker serves on: {response:?}");

    first.kill();
    // A killed broker's lock goes with it.
    let _again = start_broker(&url, &[], &[]).await;
}

/// Runs `command` to its end, which must come within [`PATIENCE`] (a broker that starts serving
/// instead is killed, and the test fails).
fn exits_within_patience(command: &mut std::process::Command) -> std::process::Output {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run");
    let deadline = std::time::Instant::now() + PATIENCE;
    while child.try_wait().expect("wait").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("it did not exit: it runs beside the first broker");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// A broker process whose database lives on a small file system of its own (a 4 MiB tmpfs
/// mounted in a mount namespace of its own, so no privilege is needed where user namespaces are
/// allowed), which the test fills and frees as a full disk would be, through the process's view
/// of its files (`/proc/<pid>/root`).
struct BrokerOnSmallDisk {
    child: std::process::Child,
    channel: Channel,
    /// The database's directory (the tmpfs inside the broker's namespace).
    dir: tempfile::TempDir,
    log: std::path::PathBuf,
}

impl Drop for BrokerOnSmallDisk {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

impl BrokerOnSmallDisk {
    async fn start() -> BrokerOnSmallDisk {
        let dir = tempfile::tempdir().expect("dir");
        let log = std::env::temp_dir().join(format!("broker-{}.log", uuid::Uuid::new_v4()));
        let out = std::fs::File::create(&log).expect("log file");
        let port = free_port().expect("a free port");
        let child = std::process::Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
            .arg(r#"mount -t tmpfs -o size=4m tmpfs "$1" && shift && exec "$@""#)
            .arg("sh")
            .arg(dir.path())
            .arg(env!("CARGO_BIN_EXE_approval-broker"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--database-url")
            .arg(format!("sqlite://{}", dir.path().join("full.db").display()))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("APPROVALS_METRICS_LISTEN", "off")
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .spawn()
            .expect("start the broker under unshare");
        let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .expect("endpoint")
            .connect_lazy();
        let mut broker = BrokerOnSmallDisk {
            child,
            channel,
            dir,
            log,
        };
        let mut health = HealthClient::new(broker.channel.clone());
        for _ in 0..500 {
            if health.check(HealthCheckRequest::default()).await.is_ok() {
                return broker;
            }
            if let Ok(Some(status)) = broker.child.try_wait() {
                panic!(
                    "the broker exited with {status} (this test needs `unshare --user --mount`): {}",
                    broker.log_text()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the broker did not start: {}", broker.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A file on the broker's small disk, as the broker sees it.
    fn on_its_disk(&self, name: &str) -> std::path::PathBuf {
        let dir = self.dir.path().strip_prefix("/").expect("absolute");
        std::path::Path::new(&format!("/proc/{}/root", self.child.id()))
            .join(dir)
            .join(name)
    }

    /// Fills the broker's disk to the last byte with a file of its own.
    fn fill_up(&self) {
        use std::io::Write as _;
        let mut filler = std::fs::File::create(self.on_its_disk("filler")).expect("filler");
        let chunk = vec![0u8; 4096];
        loop {
            match filler.write(&chunk) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
    }

    fn free_up(&self) {
        std::fs::remove_file(self.on_its_disk("filler")).expect("free the disk");
    }
}

/// A full disk is RESOURCE_EXHAUSTED with a message saying so, never INTERNAL; health is
/// NOT_SERVING until writes work again, and SERVING once they do (nothing else changed), and
/// every call acknowledged before is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_resource_exhausted_and_not_serving_until_space_is_freed() {
    let broker = BrokerOnSmallDisk::start().await;
    let input = format!(r#"{{"blob":"{}"}}"#, "x".repeat(100 * 1024));
    for i in 0..3 {
        try_submit(
            &broker.channel,
            batch("s", vec![call(&format!("before{i}"), "t", &input)]),
        )
        .await
        .expect("stored");
    }
    broker.fill_up();
    let mut refused = None;
    for i in 0..20 {
        let batch = batch("s", vec![call(&format!("full{i}"), "t", &input)]);
        if let Err(status) = try_submit(&broker.channel, batch).await {
            refused = Some(status);
            break;
        }
    }
    let status = refused.expect("a full disk refuses writes");
    assert_eq!(
        status.code(),
        Code::ResourceExhausted,
        "{status:?}: {}",
        broker.log_text()
    );
    assert!(
        status.message().starts_with("storage full:"),
        "{}",
        status.message()
    );
    wait_for_health(&broker.channel, ServingStatus::NotServing).await;

    broker.free_up();
    wait_for_health(&broker.channel, ServingStatus::Serving).await;
    let retried = try_submit(
        &broker.channel,
        batch("s", vec![call("after", "t", &input)]),
    )
    .await
    .expect("stored once there is room");
    assert_eq!(ack_status(&retried, 0), CallStatus::Pending);
    let read = AgentServiceClient::new(broker.channel.clone())
        .get_outcomes(pb::GetOutcomesRequest {
            session_id: "s".into(),
            call_ids: vec!["before0".into(), "before1".into(), "before2".into()],
        })
        .await
        .expect("read")
        .into_inner();
    assert!(
        read.calls
            .iter()
            .all(|c| matches!(c.state, Some(pb::call_state::State::Pending(_)))),
        "{:?}",
        read.calls
    );
    assert!(
        !broker.log_text().contains("internal error"),
        "{}",
        broker.log_text()
    );
}

/// A Postgres role of its own for one broker, with a schema it owns, so the test can shut the
/// broker out (and let it back in) without touching anyone else's connections.
struct OwnRole {
    base_url: String,
    name: String,
}

impl OwnRole {
    async fn create(base_url: &str) -> OwnRole {
        let name = format!("broker_{}", uuid::Uuid::new_v4().simple());
        let role = OwnRole {
            base_url: base_url.to_owned(),
            name,
        };
        role.admin(&format!(
            "CREATE ROLE {0} LOGIN; CREATE SCHEMA {0} AUTHORIZATION {0}",
            role.name
        ))
        .await;
        role
    }

    /// The URL the broker connects with: as this role, on its schema.
    fn url(&self) -> String {
        let url = url_with_user(&self.base_url, &self.name);
        let sep = if url.contains('?') { '&' } else { '?' };
        format!("{url}{sep}options=-c%20search_path%3D{}", self.name)
    }

    async fn admin(&self, sql: &str) {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect(&self.base_url)
            .await
            .expect("connect");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// As a database restart that does not come back: every connection of the role ends, and
    /// new ones are refused. A connection that was logging in as the role went out of bounds
    /// shows in `pg_stat_activity` only once it is in, so the connections are ended until none
    /// is left.
    async fn shut_out(&self) {
        use sqlx::Connection as _;
        self.admin(&format!("ALTER ROLE {} NOLOGIN", self.name))
            .await;
        let mut conn = sqlx::PgConnection::connect(&self.base_url)
            .await
            .expect("connect");
        for _ in 0..100 {
            let ended: Vec<bool> = sqlx::query_scalar(
                "SELECT pg_terminate_backend(pid, 1000) FROM pg_stat_activity WHERE usename = $1",
            )
            .bind(&self.name)
            .fetch_all(&mut conn)
            .await
            .expect("terminate");
            if ended.is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the role's connections keep coming back");
    }

    async fn let_in(&self) {
        self.admin(&format!("ALTER ROLE {} LOGIN", self.name)).await;
    }
}

impl Drop for OwnRole {
    fn drop(&mut self) {
        let (base_url, name) = (self.base_url.clone(), self.name.clone());
        testkit::block_on_own_thread(async move {
            use sqlx::Connection as _;
            if let Ok(mut conn) = sqlx::PgConnection::connect(&base_url).await {
                let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE usename = '{name}'; \
                     DROP SCHEMA IF EXISTS {name} CASCADE; DROP ROLE IF EXISTS {name}"
                )))
                .execute(&mut conn)
                .await;
            }
        });
    }
}

/// `postgres://user@host/db` with another user (and no password: the test server trusts).
fn url_with_user(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let rest = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{rest}")
}

/// Postgres going away (its connections terminated, new ones refused) makes writes UNAVAILABLE,
/// not INTERNAL, and health NOT_SERVING; once it is back, writes succeed and health is SERVING
/// again, without restarting the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn postgres_going_away_makes_writes_unavailable_and_health_not_serving_until_it_is_back() {
    let base_url = postgres_url();
    let role = OwnRole::create(&base_url).await;
    let broker = start_broker(&role.url(), &[], &[]).await;
    try_submit(
        &broker.channel(),
        batch("s", vec![call("before", "t", "{}")]),
    )
    .await
    .expect("stored");

    role.shut_out().await;
    for i in 0..3 {
        let refused = try_submit(
            &broker.channel(),
            batch("s", vec![call(&format!("down{i}"), "t", "{}")]),
        )
        .await
        .expect_err("Postgres is gone");
        assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
        assert_eq!(refused.message(), UNAVAILABLE);
    }
    wait_for_health(&broker.channel(), ServingStatus::NotServing).await;

    role.let_in().await;
    wait_for_health(&broker.channel(), ServingStatus::Serving).await;
    let response = try_submit(
        &broker.channel(),
        batch("s", vec![call("after", "t", "{}")]),
    )
    .await
    .expect("stored again");
    assert_eq!(ack_status(&response, 0), CallStatus::Pending);
    assert!(
        !broker.log_text().contains("internal error"),
        "{}",
        broker.log_text()
    );
}

/// A corrupt page reaches clients as UNAVAILABLE (the log says corruption), never INTERNAL, and
/// health turns NOT_SERVING and stays so: writes that still work elsewhere in the file do not
/// mend a damaged database; an operator restoring it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_sqlite_page_is_unavailable_and_health_stays_not_serving() {
    use sqlx::Connection as _;
    let mut app = spawn_app().await;
    for i in 0..20 {
        submit(&app, batch("s", vec![call(&format!("c{i}"), "t", "{}")])).await;
    }
    app.shut_down().await;
    // Everything in the database file, then the root page of an index every new call updates
    // (and nothing reads at start) made invalid.
    let mut conn = sqlx::SqliteConnection::connect(&app.database_url)
        .await
        .expect("open");
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut conn)
        .await
        .expect("checkpoint");
    let root: i64 =
        sqlx::query_scalar("SELECT rootpage FROM sqlite_master WHERE name = 'calls_batch'")
            .fetch_one(&mut conn)
            .await
            .expect("root page");
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await
        .expect("page size");
    conn.close().await.expect("close");
    {
        use std::io::{Seek as _, SeekFrom, Write as _};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(app.dir.path().join("approvals.db"))
            .expect("open the file");
        file.seek(SeekFrom::Start(((root - 1) * page_size) as u64))
            .expect("seek");
        file.write_all(&[0xff; 16]).expect("corrupt");
    }
    let app = app.start_again().await;

    let refused = try_submit(&app.channel, batch("s", vec![call("new", "t", "{}")]))
        .await
        .expect_err("a corrupt index cannot be written");
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert_eq!(refused.message(), UNAVAILABLE);
    wait_for_health(&app.channel, ServingStatus::NotServing).await;
    // The storage probe's writes (the file's header) still succeed: corruption stays reported.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(health_of(&app.channel, "").await, ServingStatus::NotServing);
}

/// The files a SQLite broker keeps its state in (the database, its WAL and shared memory, its
/// lock, its receipt key, and every backup) are readable by the broker's user alone, whatever the
/// umask; the start log says plainly where the inbox, gRPC, metrics and the state are.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_holding_the_state_is_private_and_the_start_log_says_where_things_are() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let database = dir.path().join("state.db");
    let url = format!("sqlite://{}", database.display());
    let broker = start_broker(&url, &[], &[]).await;
    let channel = broker.channel();
    try_submit(&channel, batch("s", vec![call("c", "t", "{}")]))
        .await
        .expect("submit");
    pb::admin_service_client::AdminServiceClient::new(channel)
        .backup(pb::BackupRequest {
            name: "copy.db".into(),
        })
        .await
        .expect("backup");
    let mut files: Vec<_> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    let names: Vec<_> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for expected in [
        "state.db",
        "state.db-wal",
        "state.db-shm",
        "state.db.lock",
        "state.db.receipt-key.pem",
        "copy.db",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    // The quick start runs in a checkout: none of these may be committed by `git add -A`.
    let ignored = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.gitignore"))
        .expect(".gitignore");
    for name in &names {
        let covered =
            ignored
                .lines()
                .map(str::trim)
                .any(|pattern| match pattern.strip_prefix('*') {
                    Some(suffix) => !suffix.contains(['*', '/']) && name.ends_with(suffix),
                    None => pattern == name,
                });
        assert!(covered, ".gitignore does not cover {name}: {ignored}");
    }
    for file in &files {
        let mode = std::fs::metadata(file).expect("mode").permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", file.display());
    }

    let log = broker.log_text();
    let address = broker.address();
    let port = address.rsplit(':').next().expect("a port");
    assert!(
        log.contains(&format!("inbox http://127.0.0.1:{port}/")),
        "the inbox URL: {log}"
    );
    assert!(log.contains(&format!("gRPC 127.0.0.1:{port}")), "{log}");
    assert!(
        log.contains(&format!("state in {}", database.display())),
        "{log}"
    );
    assert!(!log.contains("address=Some("), "{log}");
    assert!(
        !log.contains("chmod 600"),
        "no warning for its own files: {log}"
    );
}

/// A database file others may read is named at start, with the command that fixes it.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_file_others_may_read_is_warned_about_at_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let database = dir.path().join("shared.db");
    std::fs::write(&database, b"").expect("create");
    std::fs::set_permissions(&database, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let url = format!("sqlite://{}", database.display());
    let broker = start_broker(&url, &[], &[]).await;
    let log = broker.log_text();
    assert!(
        log.contains(&format!("chmod 600 {}", database.display())) && log.contains("644"),
        "{log}"
    );
}
