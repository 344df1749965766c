//! The SQLite backend: the zero-setup default, one file, one broker process.
//!
//! Every write runs on one thread over one connection (`writer`), group-committed, and begins
//! with `BEGIN IMMEDIATE`, so write transactions are serialised and sequence numbers are
//! assigned in commit order. Reads use a separate pool (sqlx) and WAL snapshots, except those
//! that belong with the writes: Explain (what a submit would read now) and the events each
//! commit hands to the event pump.
//! `synchronous=FULL` by default: a commit is on disk before it is acknowledged, even across
//! power loss.

mod lifecycle;
#[cfg(test)]
mod wal_tests;
mod writer;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

pub use self::writer::{CHECKPOINT_EVERY, WRITER_CHECKPOINT_PAGES};
use self::writer::{SqliteTx, WriteConnection};
use super::health::Watch;
use super::primitives::Transact;
use super::reads::{BackendReads, Reads};
use super::{Backend, Calls, CommittedEvents, Deadlines, EventLog};
use crate::domain::{Call, Event, Timestamp, ToolResultTexts};
use crate::error::{Error, Result};
use crate::operations::Writes;
use crate::operations::tx::{GroupCommit, Queued};
use crate::operations::{Transactions, escalate, expire};
use crate::receipts::Notary;

/// SQLite's `synchronous` setting for the database file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is flushed to disk before it is acknowledged: power-safe (the default).
    #[default]
    Full,
    /// Faster, and safe against a crash of the broker, but a power loss or OS crash may lose
    /// the last acknowledged commits. Not power-safe.
    Normal,
}

impl FromStr for Synchronous {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "full" => Ok(Synchronous::Full),
            "normal" => Ok(Synchronous::Normal),
            other => Err(format!("expected `full` or `normal`, got `{other}`")),
        }
    }
}

pub struct SqliteStore {
    /// Every write: submits, decisions and cancels group-committed, the rest alone, all on the
    /// one writer thread.
    group: Arc<GroupCommit<Queued<WriteConnection>>>,
    /// Only to hand committed events over (every write goes through `group`).
    writer: WriteConnection,
    reads: BackendReads,
    texts: ToolResultTexts,
    /// The database file, for backups (a connection of their own).
    path: PathBuf,
    /// Storage health, told by the reads and the writer's transactions; here for the probe.
    health: Watch,
}

/// The reads both backends answer alike are the shared ones (see `store::Backend`).
impl Backend for SqliteStore {
    fn reads(&self) -> &BackendReads {
        &self.reads
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path` and applies the migrations under
    /// `migrations/sqlite`; its storage health is told nobody.
    pub async fn open(
        path: &Path,
        synchronous: Synchronous,
        texts: ToolResultTexts,
        notary: Option<Arc<Notary>>,
    ) -> Result<Self> {
        Self::open_watched(path, synchronous, texts, notary, Watch::default()).await
    }

    /// [`Self::open`], telling `health` how the storage does (see `store::health`).
    pub async fn open_watched(
        path: &Path,
        synchronous: Synchronous,
        texts: ToolResultTexts,
        notary: Option<Arc<Notary>>,
        health: Watch,
    ) -> Result<Self> {
        let companions = ["-wal", "-shm", ".lock", ".receipt-key.pem"].map(|suffix| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        });
        crate::private_files::warn_if_shared(
            std::iter::once(path).chain(companions.iter().map(PathBuf::as_path)),
        );
        // SQLite gives the WAL and shared-memory files the database file's mode.
        crate::private_files::create_private_if_missing(path).map_err(|e| {
            Error::invalid(
                crate::store::DATABASE_URL_SETTING,
                format!("cannot create {}: {e}", path.display()),
            )
        })?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let migrator = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&migrator).await?;
        migrator.close().await;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options.read_only(true))
            .await?;
        let writer = WriteConnection::open(path, synchronous, notary)?.watched_by(health.clone());
        Ok(Self {
            group: Arc::new(GroupCommit::start(writer.clone(), texts.clone())?),
            writer,
            reads: BackendReads::Sqlite(Reads::new(reader, health.clone())),
            texts,
            path: path.to_owned(),
            health,
        })
    }
}

/// What docs/data-lifecycle.md ("Going back to an older version") has an operator run before
/// starting a binary from before migration 0014 on a file: approvals get their input to run
/// stored again, and the migration's record goes.
#[cfg(test)]
pub(crate) const GOING_BACK_BEFORE_0014: &str = "\
    UPDATE calls SET run_input = input WHERE status = 2 AND run_input IS NULL; \
    DELETE FROM _sqlx_migrations WHERE version = 14;";

/// What docs/data-lifecycle.md has an operator run before starting a binary from before
/// migration 0017 on a file: the session index it listed a session's calls with, back.
#[cfg(test)]
const GOING_BACK_BEFORE_0017: &str = "\
    CREATE INDEX calls_session ON calls (session_id, id); \
    DELETE FROM _sqlx_migrations WHERE version = 17;";

/// An exclusive lock on `<database>.lock`, held while the broker runs: one broker process per
/// SQLite file, as the design assumes (its one writer numbers events in commit order, and its
/// event fan-out sees every commit only because it makes them). Released when dropped, and by the
/// operating system when the process dies, so a crash never leaves the file locked. A file of
/// its own, not the database: SQLite's own (POSIX) locks on the database would be released by
/// any close of it in this process.
pub struct ProcessLock {
    _file: std::fs::File,
}

impl ProcessLock {
    pub fn claim(database: &Path) -> Result<Self> {
        let database = database.display();
        let path = format!("{database}.lock");
        let file = crate::private_files::open_private_lock_file(Path::new(&path)).map_err(|e| {
            Error::invalid(
                crate::store::DATABASE_URL_SETTING,
                format!("cannot open {path}: {e}"),
            )
        })?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => Err(Error::FailedPrecondition(format!(
                "the SQLite database {database} is in use by another broker process (it holds \
                 {path}); one SQLite file serves one broker: stop the other one, or use Postgres \
                 to run several"
            ))),
            Err(std::fs::TryLockError::Error(e)) => Err(Error::invalid(
                crate::store::DATABASE_URL_SETTING,
                format!("cannot lock {path}: {e}"),
            )),
        }
    }
}

#[cfg(test)]
impl SqliteStore {
    /// The store's one write connection, for unit tests that run operations in transactions of
    /// their own: nothing else may write meanwhile (a test's store serves nobody else).
    pub(crate) fn writer(&self) -> &WriteConnection {
        &self.writer
    }
}

#[async_trait]
impl Calls for SqliteStore {
    fn writes(self: Arc<Self>) -> Arc<dyn Writes> {
        self.group.clone()
    }

    async fn probe(&self) -> Result<()> {
        self.group
            .alone(move |writer| async move { writer.probe() })
            .await?;
        // It changes no row, so its commit says nothing by itself; it wrote all the same.
        self.health.wrote();
        Ok(())
    }
}

#[async_trait]
impl Deadlines for SqliteStore {
    async fn expire_due(&self, now: Timestamp) -> Result<Vec<Call>> {
        // A chunk per turn of the writer, so groups of writes run between chunks.
        expire::expire_in_chunks(|| {
            let texts = self.texts.clone();
            self.group.alone(move |writer| async move {
                expire::expire_chunk(&writer, &texts, now).await
            })
        })
        .await
    }

    async fn escalate_due(&self, now: Timestamp) -> Result<u64> {
        // A chunk per turn of the writer, as for expiry.
        escalate::escalate_in_chunks(|| {
            self.group
                .alone(move |writer| async move { escalate::escalate_chunk(&writer, now).await })
        })
        .await
    }
}

#[async_trait]
impl EventLog for SqliteStore {
    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>> {
        self.reads.events_after(after, limit).await
    }

    async fn latest_seq(&self) -> Result<u64> {
        self.reads.latest_seq().await
    }

    fn take_committed_events(&self) -> Option<CommittedEvents> {
        self.writer.hand_over()
    }
}

/// The parts written once over `Transact` (rules and grants, webhooks, push, Slack) write on
/// the one writer thread, between groups, each in a transaction of its own, as every write here
/// is (so `statements` is `transaction`); Explain reads there too, between writes.
#[async_trait]
impl Transact for SqliteStore {
    type Tx = SqliteTx;

    async fn transaction<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(SqliteTx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.group
            .alone(move |writer| async move { work(writer.begin_write().await?).await })
            .await
    }

    async fn snapshot<T, W, F>(&self, work: W) -> Result<T>
    where
        T: Send + 'static,
        W: FnOnce(SqliteTx) -> F + Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        self.group
            .alone(move |writer| async move { work(writer.begin_read()?).await })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentId, CallId, CallKey, NewBatch, SessionId, SubmitReport};
    use crate::store::statements as sql;

    /// The store's read-only pool.
    fn reader(store: &SqliteStore) -> &sqlx::SqlitePool {
        match &store.reads {
            BackendReads::Sqlite(reads) => reads.pool(),
            BackendReads::Postgres(_) => unreachable!("a SQLite store reads SQLite"),
        }
    }
    use sqlx::Row;
    use sqlx::sqlite::SqliteConnection;

    async fn open(url: &str, synchronous: Synchronous) -> SqliteStore {
        let Ok(crate::store::Database::Sqlite { path, .. }) =
            crate::store::Database::parse(url, synchronous, 2)
        else {
            panic!("{url} names no SQLite file");
        };
        SqliteStore::open(&path, synchronous, ToolResultTexts::default(), None)
            .await
            .unwrap()
    }

    /// A store on a new database file with the default settings, its URL, and the directory
    /// holding it (removed when dropped).
    async fn fresh() -> (tempfile::TempDir, String, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("a.db").display());
        let store = open(&url, Synchronous::default()).await;
        (dir, url, store)
    }

    async fn pragma(store: &SqliteStore, name: &'static str) -> String {
        store
            .group
            .alone(move |writer| async move { writer.pragma(name) })
            .await
            .unwrap()
    }

    /// The migrations of this build but `left_out`, as a binary from before it knew them
    /// (copied into `dir`).
    async fn migrations_without(dir: &Path, left_out: u32) -> sqlx::migrate::Migrator {
        migrations_where(dir, "migrations", |version| version != left_out).await
    }

    /// The migrations before `version`: what a binary from before it had applied to a file.
    async fn migrations_before(dir: &Path, version: u32) -> sqlx::migrate::Migrator {
        migrations_where(dir, "migrations-before", |v| v < version).await
    }

    /// The migrations of this build whose version `keep` keeps, copied into `dir`/`name`.
    async fn migrations_where(
        dir: &Path,
        name: &str,
        keep: impl Fn(u32) -> bool,
    ) -> sqlx::migrate::Migrator {
        let older = dir.join(name);
        std::fs::create_dir(&older).unwrap();
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
        for entry in std::fs::read_dir(here).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_owned();
            let version: u32 = name[..4].parse().unwrap();
            if keep(version) {
                std::fs::copy(&path, older.join(name)).unwrap();
            }
        }
        sqlx::migrate::Migrator::new(older).await.unwrap()
    }

    /// `older` (the migrations without `version`) refuses the file `pool` opens, as a binary
    /// from before `version` would, until `going_back` ran on it; then it runs.
    async fn refused_until_gone_back(
        older: &sqlx::migrate::Migrator,
        pool: &sqlx::SqlitePool,
        version: i64,
        going_back: &str,
    ) {
        let refused = older.run(pool).await;
        assert!(
            matches!(refused, Err(sqlx::migrate::MigrateError::VersionMissing(v)) if v == version),
            "{refused:?}"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(going_back))
            .execute(pool)
            .await
            .unwrap();
        older.run(pool).await.unwrap();
    }

    /// A binary from before migration 0014 reads an approval stored without its input to run
    /// as one with nothing to run, so it must not open a file this version wrote: sqlx refuses
    /// a database holding a migration the binary does not know, as that binary's own
    /// `migrate!` (the migrations as it knew them, from a copy of the directory without 0014).
    #[tokio::test]
    async fn a_binary_from_before_the_input_stored_once_refuses_the_file() {
        let (dir, url, store) = fresh().await;
        drop(store);
        let older = migrations_without(dir.path(), 14).await;
        let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
        // The way back docs/data-lifecycle.md gives: the input stored again, the marker gone.
        refused_until_gone_back(&older, &pool, 14, GOING_BACK_BEFORE_0014).await;
    }

    /// Migration 0017 builds `calls` again with its key reordered. Every row and id, every index
    /// but the session index the key replaces, the trigger, and every reference to a call from
    /// events, shadow verdicts (ON DELETE CASCADE) and receipts (ON DELETE SET NULL) come through
    /// it: dropping the old table with foreign keys on would have deleted or unlinked them. And
    /// the way back docs/data-lifecycle.md gives lets the binary before it run again.
    #[tokio::test]
    async fn reordering_the_calls_key_keeps_every_row_index_and_reference() {
        use std::str::FromStr as _;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("a.db").display());
        let older = migrations_without(dir.path(), 17).await;
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true)
            .foreign_keys(true);
        let pool = sqlx::SqlitePool::connect_with(options.clone())
            .await
            .unwrap();
        // The file as a binary from before 0017 left it (later migrations come after 0017).
        migrations_before(dir.path(), 17)
            .await
            .run(&pool)
            .await
            .unwrap();
        sqlx::raw_sql(
            "INSERT INTO batches VALUES ('b1', 'a', 's', 0, 2, 1), ('b2', 'z', 's', 0, 1, 2);
             INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, input,
                                title, message, workspace, created_at, status)
             VALUES ('a', 's', 'c1', 'b1', 0, 't', '{}', '', '', '', 1, 2),
                    ('a', 's', 'c2', 'b1', 1, 't', '{}', '', '', '', 1, 1),
                    ('z', 's', 'c1', 'b2', 0, 't', '{}', '', '', '', 2, 1);
             INSERT INTO shadow_verdicts VALUES (1, 'r', 2), (3, 'r', 1);
             INSERT INTO receipts (seq, agent, session_id, call_id, digest, envelope, call_row)
             VALUES (1, 'a', 's', 'c1', 'd', 'e', 1);",
        )
        .execute(&pool)
        .await
        .unwrap();
        const ROWS: &str = "SELECT 'call ' || id || agent || session_id || call_id || requested_seq
                                   || status FROM calls
                            UNION ALL SELECT 'event ' || seq || kind || call_rowid FROM events
                            UNION ALL SELECT 'verdict ' || call_rowid || rule_id || verdict
                                      FROM shadow_verdicts
                            UNION ALL SELECT 'receipt ' || seq || call_row FROM receipts
                            ORDER BY 1";
        const INDEXES: &str = "SELECT name FROM sqlite_schema WHERE tbl_name = 'calls'
                                 AND type IN ('index', 'trigger') ORDER BY name";
        let rows: Vec<String> = sqlx::query_scalar(ROWS).fetch_all(&pool).await.unwrap();
        let mut indexes: Vec<String> = sqlx::query_scalar(INDEXES).fetch_all(&pool).await.unwrap();
        assert_eq!(rows.len(), 3 + 3 + 2 + 1, "{rows:?}");
        pool.close().await;

        let store = open(&url, Synchronous::default()).await;
        assert_eq!(
            sqlx::query_scalar::<_, String>(ROWS)
                .fetch_all(reader(&store))
                .await
                .unwrap(),
            rows
        );
        indexes.retain(|name| name != "calls_session");
        assert_eq!(
            sqlx::query_scalar::<_, String>(INDEXES)
                .fetch_all(reader(&store))
                .await
                .unwrap(),
            indexes
        );
        let key: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM pragma_index_info('sqlite_autoindex_calls_1') ORDER BY seqno",
        )
        .fetch_all(reader(&store))
        .await
        .unwrap();
        assert_eq!(key, ["session_id", "agent", "call_id"]);
        let broken: Vec<String> =
            sqlx::query_scalar("SELECT \"table\" FROM pragma_foreign_key_check")
                .fetch_all(reader(&store))
                .await
                .unwrap();
        assert!(broken.is_empty(), "{broken:?}");
        assert_eq!(pragma(&store, "foreign_keys").await, "1");
        // The trigger is back: a new call gets its Requested event.
        store.group.submit(one_call("s", "after")).await.unwrap();
        let requested: i64 =
            sqlx::query_scalar("SELECT requested_seq FROM calls WHERE call_id = 'after'")
                .fetch_one(reader(&store))
                .await
                .unwrap();
        assert_eq!(requested, 4);
        drop(store);

        let pool = sqlx::SqlitePool::connect_with(options).await.unwrap();
        refused_until_gone_back(&older, &pool, 17, GOING_BACK_BEFORE_0017).await;
    }

    /// The steps of SQLite's plan for `statement` (its parameters unbound: the plan does not
    /// depend on their values).
    async fn query_plan(store: &SqliteStore, statement: &str) -> Vec<String> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN QUERY PLAN {statement}"
        )))
        .fetch_all(reader(store))
        .await
        .unwrap()
        .iter()
        .map(|row| row.try_get("detail").unwrap())
        .collect()
    }

    /// A session's calls, listed with or without their agent, are found through the calls' key
    /// (its first column is the session), never by reading the whole table.
    #[tokio::test]
    async fn a_sessions_calls_are_listed_through_the_key_not_a_scan() {
        let (_dir, _, store) = fresh().await;
        for agent in [None, Some(AgentId::from_stored("agent".into()))] {
            let q = crate::domain::CallQuery {
                agent,
                session: Some("s".into()),
                ..Default::default()
            };
            let listing = crate::store::listing::Listing::<sqlx::Sqlite>::calls(&q);
            let plan = query_plan(&store, &listing.into_string()).await;
            assert!(
                plan.iter()
                    .any(|step| step.contains("sqlite_autoindex_calls_1 (session_id=?")),
                "{plan:?}"
            );
        }
    }

    #[tokio::test]
    async fn a_batchs_pending_calls_are_found_through_their_index_not_a_scan() {
        let (_dir, _, store) = fresh().await;
        for statement in [sql::PENDING_IN_BATCH, sql::COMPLETE_BATCH_AT_SEQ] {
            let plan = query_plan(&store, statement).await;
            assert!(
                plan.iter().any(|step| step.contains("calls_pending_batch")),
                "{statement}: {plan:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_database_is_power_safe_by_default_wal_with_synchronous_full() {
        let (_dir, url, store) = fresh().await;
        assert_eq!(pragma(&store, "journal_mode").await, "wal");
        assert_eq!(pragma(&store, "synchronous").await, "2", "2 is FULL");
        assert_eq!(pragma(&store, "foreign_keys").await, "1");
        drop(store);
        let relaxed = open(&url, Synchronous::Normal).await;
        assert_eq!(pragma(&relaxed, "synchronous").await, "1", "1 is NORMAL");
    }

    /// The writes SQLite asked of the write connection's WAL and those made, so far.
    async fn wal_writes(store: &SqliteStore) -> Option<(u64, u64)> {
        store
            .group
            .alone(|writer| async move { writer.wal_writes() })
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_power_safe_commit_reaches_the_wal_in_one_write_and_readers_see_it_at_once() {
        let (_dir, url, store) = fresh().await;
        store.group.submit(one_call("s", "first")).await.unwrap();
        let before = wal_writes(&store)
            .await
            .expect("FULL: the WAL is coalesced");
        store.group.submit(one_call("s", "second")).await.unwrap();
        let after = wal_writes(&store).await.unwrap();
        let (asked, written) = (after.0 - before.0, after.1 - before.1);
        assert!(
            asked >= 10,
            "a submit's commit asked {asked} writes of the WAL"
        );
        // One, or two when the checkpointer emptied the WAL between the submits and this
        // commit started it over (a new header, synced on its own).
        assert!(
            (1..=2).contains(&written),
            "{asked} writes reached the WAL as {written}"
        );
        // The readers (sqlx's connections, SQLite's own VFS) see the commit it acknowledged.
        let events = store.events_after(0, 10).await.unwrap();
        let ids: Vec<&str> = events.iter().map(|e| e.call.key.call_id.as_str()).collect();
        assert_eq!(ids, ["first", "second"]);
        drop(store);
        // Under NORMAL a commit does not sync, so nothing would write what was kept before
        // the readers may see it: that WAL is written as SQLite writes it.
        let relaxed = open(&url, Synchronous::Normal).await;
        relaxed.group.submit(one_call("s", "third")).await.unwrap();
        assert_eq!(wal_writes(&relaxed).await, None);
        assert_eq!(relaxed.events_after(0, 10).await.unwrap().len(), 3);
    }

    fn one_call(session: &str, call_id: &str) -> NewBatch {
        use crate::domain::{NewCall, OnDeny, ToolInput, ToolName};
        NewBatch {
            agent: AgentId::from_stored("agent".into()),
            session: SessionId::from_stored(session.into()),
            on_deny: OnDeny::default(),
            supersede_pending: false,
            pending_cap: None,
            default_escalation: None,
            default_approvers: None,
            calls: vec![NewCall {
                host: None,
                index: 0,
                path: "batch.calls[0]".into(),
                call_id: CallId::from_stored(call_id.into()),
                tool: ToolName::from_stored("tool".into()),
                input: ToolInput::from_stored("{}".into()),
                title: String::new(),
                message: String::new(),
                workspace: String::new(),
                supersede_key: None,
                requested_by: String::new(),
                deadline: None,
                prejudged: Default::default(),
            }],
        }
    }

    #[tokio::test]
    async fn each_commits_events_are_handed_over_in_order_and_an_overflow_is_signalled() {
        use super::writer::PUBLISHED_QUEUE;
        use crate::domain::EventKind;
        let (_dir, _, store) = fresh().await;
        let mut committed = store.take_committed_events().expect("handed over");
        assert!(store.take_committed_events().is_none(), "taken once");

        store.group.submit(one_call("s", "first")).await.unwrap();
        let events = committed.events.recv().await.unwrap();
        let got: Vec<(u64, EventKind, &str)> = events
            .iter()
            .map(|e| (e.seq, e.kind, e.call.key.call_id.as_str()))
            .collect();
        assert_eq!(got, [(1, EventKind::Requested, "first")]);

        // Nobody reads: the queue fills, and the commit after that is signalled as missed.
        for i in 0..PUBLISHED_QUEUE {
            store
                .group
                .submit(one_call("s", &format!("c{i}")))
                .await
                .unwrap();
        }
        store.group.submit(one_call("s", "overflow")).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), committed.missed.notified())
            .await
            .expect("the dropped hand-over is signalled");
        let mut seqs = Vec::new();
        while let Ok(events) = committed.events.try_recv() {
            seqs.extend(events.iter().map(|e| e.seq));
        }
        let expected: Vec<u64> = (2..=PUBLISHED_QUEUE as u64 + 1).collect();
        assert_eq!(seqs, expected, "in order, without repeats");
    }

    /// A store whose database runs `sql` (triggers that poison some writes) once migrated.
    async fn poisoned(sql: &'static str) -> (tempfile::TempDir, SqliteStore) {
        use sqlx::Connection as _;
        let (dir, url, store) = fresh().await;
        let mut conn = SqliteConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(sql).execute(&mut conn).await.unwrap();
        (dir, store)
    }

    /// Submits one call per (session, call id), all in one group. Returns each submit's result.
    async fn submit_as_one_group(
        store: &SqliteStore,
        calls: &[(&str, &str)],
    ) -> Vec<Result<SubmitReport>> {
        let submits = calls
            .iter()
            .map(|(session, id)| store.group.submit(one_call(session, id)));
        as_one_group(store, submits).await
    }

    /// Runs `writes` all in one group: the writer is held while they queue (each is polled
    /// once, which enqueues it), then let go. Returns each write's result, in order.
    async fn as_one_group<T>(
        store: &SqliteStore,
        writes: impl IntoIterator<Item = impl Future<Output = T>>,
    ) -> Vec<T> {
        use tokio::sync::oneshot;
        let (started, running) = oneshot::channel();
        let (release, held) = oneshot::channel::<()>();
        let mut holding = Box::pin(store.group.alone(move |_| async move {
            let _ = started.send(());
            let _ = held.await;
            Ok(())
        }));
        let _ = tokio::time::timeout(Duration::ZERO, &mut holding).await;
        running.await.unwrap();
        let mut writes: Vec<_> = writes.into_iter().map(Box::pin).collect();
        for write in &mut writes {
            let _ = tokio::time::timeout(Duration::ZERO, write).await;
        }
        release.send(()).unwrap();
        holding.await.unwrap();
        let mut results = Vec::new();
        for write in writes {
            results.push(write.await);
        }
        results
    }

    /// A group's receipts are handed to the signing thread while the rest of the group runs;
    /// a group of one write (one call in flight) has nothing to run meanwhile, so the writer
    /// signs its receipt itself and never wakes the signer. A lone write with several receipts
    /// (a denial that skips the rest of its batch) hands over all but its last. Whoever signed,
    /// every envelope verifies and the chain links (mutation checked: holding every group's
    /// receipts, or none, fails the counts, and so does a lone write that drops its earlier
    /// receipts instead of handing them over).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_writes_receipt_is_signed_on_the_writer_a_groups_beside_it() {
        use crate::domain::Verdict;
        use crate::operations::testing::decision;
        let notary = Arc::new(Notary::from_seed(&[7; 32]).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let texts = ToolResultTexts::default();
        let store = SqliteStore::open(&path, Synchronous::default(), texts, Some(notary.clone()))
            .await
            .unwrap();
        let ids = ["alone", "first", "second", "third"];
        for id in ids {
            store.group.submit(one_call("s", id)).await.unwrap();
        }
        let mut batch = one_call("s", "denied");
        let mut skipped = batch.calls[0].clone();
        skipped.index = 1;
        skipped.path = "batch.calls[1]".into();
        skipped.call_id = CallId::from_stored("skipped".into());
        batch.calls.push(skipped);
        store.group.submit(batch).await.unwrap();
        let key = |id: &str| CallKey {
            agent: AgentId::from_stored("agent".into()),
            session: SessionId::from_stored("s".into()),
            call_id: CallId::from_stored(id.into()),
        };
        let approve = decision(Verdict::Approve, "");

        store.group.decide(&key("alone"), &approve).await.unwrap();
        assert_eq!(store.writer.receipts_handed_over(), 0, "one call in flight");

        let keys: Vec<CallKey> = ids[1..].iter().map(|id| key(id)).collect();
        let decided =
            as_one_group(&store, keys.iter().map(|k| store.group.decide(k, &approve))).await;
        assert!(decided.iter().all(Result::is_ok), "{decided:?}");
        assert_eq!(
            store.writer.receipts_handed_over(),
            3,
            "a group's receipts handed over"
        );

        let deny = decision(Verdict::Deny, "no");
        let denied = store.group.decide(&key("denied"), &deny).await.unwrap();
        assert_eq!(denied.skipped.len(), 1, "{denied:?}");
        assert_eq!(
            store.writer.receipts_handed_over(),
            4,
            "a lone write's receipts but its last handed over"
        );

        let in_parts: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM receipts WHERE envelope = '' AND payload IS NOT NULL",
        )
        .fetch_one(reader(&store))
        .await
        .unwrap();
        assert_eq!(in_parts, 6, "every receipt stored in parts");
        use crate::store::Receipts as _;
        let envelopes: Vec<String> = store
            .receipts_after(0, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|receipt| receipt.envelope)
            .collect();
        let chain = crate::receipts::verify::chain(
            envelopes.iter().map(String::as_str),
            notary.public_key(),
        )
        .unwrap();
        assert_eq!((chain.first, chain.last, chain.receipts), (1, 6, 6));
    }

    /// Which of these (session, call id) are stored.
    async fn stored(store: &SqliteStore, calls: &[(&str, &str)]) -> Vec<bool> {
        let agent = AgentId::from_stored("agent".into());
        let mut stored = Vec::new();
        for (session, id) in calls {
            let session = SessionId::from_stored(session.to_string());
            let found = store
                .calls_by_id(&agent, &session, &[CallId::from_stored(id.to_string())])
                .await
                .unwrap();
            stored.push(found[0].is_some());
        }
        stored
    }

    /// A commit that fails fails every write of its group: none is acknowledged, none is kept,
    /// and each is stored when retried. The COMMIT itself is made to fail: a trigger breaks a
    /// deferred foreign key when the call `poison` is stored, which SQLite checks only then.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_that_fails_fails_every_write_of_its_group_and_keeps_none() {
        let (_dir, store) = poisoned(
            "CREATE TABLE poison_parent (id INTEGER PRIMARY KEY); \
             CREATE TABLE poison_child (parent INTEGER \
                 REFERENCES poison_parent (id) DEFERRABLE INITIALLY DEFERRED); \
             CREATE TRIGGER poison AFTER INSERT ON calls WHEN NEW.call_id = 'poison' \
             BEGIN INSERT INTO poison_child VALUES (42); END;",
        )
        .await;
        let calls = [("s", "first"), ("s", "poison"), ("s", "last")];
        for (call, result) in calls.iter().zip(submit_as_one_group(&store, &calls).await) {
            let err = result
                .err()
                .unwrap_or_else(|| panic!("{call:?} acknowledged"));
            assert!(err.to_string().contains("not committed"), "{call:?}: {err}");
        }
        assert_eq!(stored(&store, &calls).await, [false; 3], "none kept");
        assert_eq!(store.latest_seq().await.unwrap(), 0, "no event kept");

        // The writer goes on: a retry is stored.
        let retried = store.group.submit(one_call("s", "first")).await.unwrap();
        assert!(retried.batch_id.is_some(), "stored on retry");
        assert_eq!(store.latest_seq().await.unwrap(), 1);
    }

    /// When SQLite rolls a group's transaction back by itself (here a trigger's
    /// `RAISE(ROLLBACK)`, as SQLite does on a full disk or an interrupt), the writes before it
    /// are undone too: the group starts over without the failed write, so every write
    /// acknowledged is stored, and the failed one alone is refused. Two guards tell the group
    /// that something was undone: the failed statement counts as a write, and `writes()` is
    /// `None` once the connection is back in autocommit; the test fails without both (had the
    /// rest of the group run in autocommit, `last` would be stored yet refused).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_sqlite_rolled_back_by_itself_starts_over_without_the_failed_write() {
        let (_dir, store) = poisoned(
            "CREATE TRIGGER poison BEFORE INSERT ON batches WHEN NEW.session_id = 'poisoned' \
             BEGIN SELECT RAISE(ROLLBACK, 'poisoned'); END;",
        )
        .await;
        let calls = [("s", "first"), ("poisoned", "poison"), ("s", "last")];
        let results = submit_as_one_group(&store, &calls).await;
        let acknowledged: Vec<bool> = results.iter().map(Result::is_ok).collect();
        assert_eq!(acknowledged, [true, false, true], "{results:?}");
        let refused = results[1].as_ref().err().unwrap().to_string();
        assert!(refused.contains("poisoned"), "{refused}");
        assert_eq!(stored(&store, &calls).await, [true, false, true]);
        assert_eq!(
            store.latest_seq().await.unwrap(),
            2,
            "one event per stored call"
        );
    }

    /// A submit answers with the calls it stored without reading them back; they are exactly
    /// what reading them back returns.
    #[tokio::test]
    async fn the_calls_a_submit_answers_with_are_the_calls_stored() {
        use crate::domain::SubmitResult;
        use crate::domain::Timestamp;
        let (_dir, _, store) = fresh().await;
        let mut batch = one_call("s", "plain");
        let mut rich = batch.calls[0].clone();
        rich.index = 1;
        rich.call_id = CallId::from_stored("rich".into());
        rich.title = "Edit a file".into();
        rich.message = "Replaces one line".into();
        rich.workspace = "repo".into();
        rich.supersede_key = Some("edit:src/main.rs".into());
        rich.deadline = Some(Timestamp::from_micros(4_102_444_800_000_000));
        batch.calls.push(rich);

        let report = store.group.submit(batch).await.unwrap();
        let answered: Vec<String> = report
            .items
            .iter()
            .map(|item| match &item.result {
                SubmitResult::Accepted(call) => format!("{call:?}"),
                other => panic!("not accepted: {other:?}"),
            })
            .collect();
        let batch_id = report.batch_id.expect("stored");
        let read: Vec<String> = store
            .batch_calls(&batch_id)
            .await
            .unwrap()
            .iter()
            .map(|call| format!("{call:?}"))
            .collect();
        assert_eq!(answered, read);
    }

    /// Expiry runs a chunk of due calls per turn of the writer (256): more than a chunk due at
    /// once are all expired, each once, in one call.
    #[tokio::test]
    async fn more_calls_due_than_one_chunk_all_expire() {
        use crate::domain::{OutcomeKind, Status, Timestamp};
        let (_dir, _, store) = fresh().await;
        // A deadline still ahead at submit (one passed already would refuse the new call),
        // swept as of a later time.
        let deadline = Timestamp::now().saturating_add(std::time::Duration::from_secs(3600));
        let later = deadline.saturating_add(std::time::Duration::from_secs(1));
        for b in 0..3 {
            let mut batch = one_call("s", "unused");
            let template = batch.calls.pop().unwrap();
            for i in 0..100 {
                let mut call = template.clone();
                call.index = i;
                call.call_id = CallId::from_stored(format!("c{b}-{i}"));
                call.deadline = Some(deadline);
                batch.calls.push(call);
            }
            store.group.submit(batch).await.unwrap();
        }
        let expired = store.expire_due(later).await.unwrap();
        assert_eq!(expired.len(), 300);
        let mut ids: Vec<&str> = expired.iter().map(|c| c.key.call_id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 300, "each once");
        assert!(
            expired
                .iter()
                .all(|c| c.status() == Status::Decided(OutcomeKind::Expired))
        );
        assert_eq!(store.pending_count().await.unwrap(), 0);
        assert!(store.expire_due(later).await.unwrap().is_empty());
    }
}
