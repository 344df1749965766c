//! The raw storage limit: the durable writes the broker makes per approval cycle, done directly
//! through sqlx on the same kind of database with the same settings and the broker's own
//! migrations. A cycle is the submit transaction (insert the batch, the call and its Requested
//! event; on SQLite the schema's trigger writes that event and records its sequence number on the
//! call, as it does for the broker) and the decide
//! transaction (update the call with its outcome, insert its Resolved event, mark the batch
//! complete). Reads the broker does inside those transactions (finding the call first) are not
//! counted: this is the write floor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

/// Cycles per second, one transaction per write and `group` cycles per transaction.
#[derive(Debug, Clone, Copy)]
pub struct StorageRates {
    pub per_write: f64,
    pub batched: f64,
    pub group: u32,
    pub concurrency: u32,
    pub connections: u32,
    pub batch_tasks: u32,
}

#[derive(Clone)]
enum Db {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// SQLite: a fresh file in `dir`, WAL, `synchronous=FULL`, one writer connection, SQLite's
/// defaults otherwise. (The broker's writer also keeps statement journals in memory and
/// checkpoints from a thread of its own; with the first and the broker's checkpoint threshold,
/// this raw loop measured slower, so it keeps the defaults: the stronger baseline.)
pub async fn sqlite(
    dir: &std::path::Path,
    concurrency: u32,
    run_for: Duration,
    input: &str,
) -> Result<StorageRates, String> {
    let options = SqliteConnectOptions::new()
        .filename(dir.join("raw.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(10))
        .foreign_keys(true);
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .min_connections(1)
        .connect_with(options)
        .await
        .map_err(|e| format!("raw SQLite: {e}"))?;
    sqlx::migrate!("./migrations/sqlite")
        .run(&pool)
        .await
        .map_err(|e| format!("raw SQLite migrations: {e}"))?;
    run(Db::Sqlite(pool), concurrency, 1, run_for, input).await
}

/// Postgres: the schema `url` puts first on the search path, `connections` connections.
pub async fn postgres(
    url: &str,
    concurrency: u32,
    connections: u32,
    run_for: Duration,
    input: &str,
) -> Result<StorageRates, String> {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect(url)
        .await
        .map_err(|e| format!("raw Postgres: {e}"))?;
    sqlx::migrate!("./migrations/postgres")
        .run(&pool)
        .await
        .map_err(|e| format!("raw Postgres migrations: {e}"))?;
    run(Db::Postgres(pool), concurrency, connections, run_for, input).await
}

async fn run(
    db: Db,
    concurrency: u32,
    connections: u32,
    run_for: Duration,
    input: &str,
) -> Result<StorageRates, String> {
    const GROUP: u32 = 100;
    let per_write = measure(&db, concurrency, 1, run_for, input).await?;
    // Batched, the writer is the concurrency: on SQLite one task (100 calls submitted, then
    // the same 100 decided, as a group-committing broker would); on Postgres one per connection.
    let batch_tasks = match db {
        Db::Sqlite(_) => 1,
        Db::Postgres(_) => connections,
    };
    let batched = measure(&db, batch_tasks, GROUP, run_for, input).await?;
    match db {
        Db::Sqlite(pool) => pool.close().await,
        Db::Postgres(pool) => pool.close().await,
    }
    Ok(StorageRates {
        per_write,
        batched,
        group: GROUP,
        concurrency,
        connections,
        batch_tasks,
    })
}

/// `concurrency` tasks doing cycles, `group` cycles per transaction, for `run_for`: cycles/s.
async fn measure(
    db: &Db,
    concurrency: u32,
    group: u32,
    run_for: Duration,
    input: &str,
) -> Result<f64, String> {
    // Committed writes (a submit or a decide: half a cycle each), counted at each commit so a
    // short window with many tasks queued on one connection does not undercount.
    let writes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let (db, writes, stop, input) =
            (db.clone(), writes.clone(), stop.clone(), input.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let prefix = format!("g{group}-t{task}-{n}");
                n += 1;
                match &db {
                    Db::Sqlite(pool) => sqlite_cycles(pool, &prefix, group, &input, &writes).await,
                    Db::Postgres(pool) => {
                        postgres_cycles(pool, &prefix, group, &input, &writes).await
                    }
                }?;
            }
            Ok::<(), sqlx::Error>(())
        }));
    }
    tokio::time::sleep(run_for).await;
    let done = writes.load(Ordering::Relaxed) as f64 / 2.0;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await
            .map_err(|e| format!("raw storage task: {e}"))?
            .map_err(|e| format!("raw storage: {e}"))?;
    }
    Ok(done / elapsed.as_secs_f64())
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// `group` cycles: one submit transaction holding `group` calls, then one decide transaction
/// resolving them all (with `group == 1`, one transaction per write).
async fn sqlite_cycles(
    pool: &SqlitePool,
    prefix: &str,
    group: u32,
    input: &str,
    writes: &AtomicU64,
) -> Result<(), sqlx::Error> {
    let now = now_micros();
    let mut rows = Vec::with_capacity(group as usize);
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    for i in 0..group {
        let batch_id = format!("{prefix}-{i}");
        sqlx::query(
            "INSERT INTO batches (batch_id, agent, session_id, on_deny, size, created_at) \
             VALUES (?, 'default', ?, 1, 1, ?)",
        )
        .bind(&batch_id)
        .bind(prefix)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let rowid: i64 = sqlx::query_scalar(
            "INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, input, \
             title, message, workspace, supersede_key, deadline, created_at) \
             VALUES ('default', ?, ?, ?, 0, 'edit_file', ?, 'Edit a file', '', 'bench', NULL, \
             NULL, ?) RETURNING id",
        )
        .bind(prefix)
        .bind(&batch_id)
        .bind(&batch_id)
        .bind(input)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        // The Requested event and the call's `requested_seq` are written by the schema's trigger
        // `calls_requested_event` (migration 0004), as for the broker: writing them here too
        // would make the raw loop do more than the broker does.
        rows.push((rowid, batch_id));
    }
    tx.commit().await?;
    writes.fetch_add(u64::from(group), Ordering::Relaxed);

    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    for (rowid, batch_id) in rows {
        sqlx::query_scalar::<_, String>(
            "UPDATE calls SET status = 2, decided_at = ?, decided_by = 'approver:bench', \
             reason = '', tool_result = '', run_input = input, input_edited = 0 \
             WHERE id = ? AND status = 1 RETURNING batch_id",
        )
        .bind(now)
        .bind(rowid)
        .fetch_one(&mut *tx)
        .await?;
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO events (kind, call_rowid, created_at) VALUES (2, ?, ?) RETURNING seq",
        )
        .bind(rowid)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE events SET batch_completed = 1 WHERE seq = ? AND NOT EXISTS \
             (SELECT 1 FROM calls WHERE batch_id = ? AND status = 1)",
        )
        .bind(seq)
        .bind(&batch_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    writes.fetch_add(u64::from(group), Ordering::Relaxed);
    Ok(())
}

/// The same on Postgres (whose broker assigns event sequence numbers after commit, in a
/// sequencer transaction this does not model).
async fn postgres_cycles(
    pool: &PgPool,
    prefix: &str,
    group: u32,
    input: &str,
    writes: &AtomicU64,
) -> Result<(), sqlx::Error> {
    let now = now_micros();
    let mut rows = Vec::with_capacity(group as usize);
    let mut tx = pool.begin().await?;
    for i in 0..group {
        let batch_id = format!("{prefix}-{i}");
        sqlx::query(
            "INSERT INTO batches (batch_id, agent, session_id, on_deny, size, created_at) \
             VALUES ($1, 'default', $2, 1, 1, $3)",
        )
        .bind(&batch_id)
        .bind(prefix)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        let rowid: i64 = sqlx::query_scalar(
            "INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, input, \
             title, message, workspace, supersede_key, deadline, created_at) \
             VALUES ('default', $1, $2, $2, 0, 'edit_file', $3, 'Edit a file', '', 'bench', \
             NULL, NULL, $4) RETURNING id",
        )
        .bind(prefix)
        .bind(&batch_id)
        .bind(input)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO events (kind, call_rowid, created_at) VALUES (1, $1, $2)")
            .bind(rowid)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        rows.push((rowid, batch_id));
    }
    tx.commit().await?;
    writes.fetch_add(u64::from(group), Ordering::Relaxed);

    let mut tx = pool.begin().await?;
    for (rowid, batch_id) in rows {
        sqlx::query_scalar::<_, String>(
            "UPDATE calls SET status = 2, decided_at = $1, decided_by = 'approver:bench', \
             reason = '', tool_result = '', run_input = input, input_edited = FALSE \
             WHERE id = $2 AND status = 1 RETURNING batch_id",
        )
        .bind(now)
        .bind(rowid)
        .fetch_one(&mut *tx)
        .await?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO events (kind, call_rowid, created_at) VALUES (2, $1, $2) RETURNING id",
        )
        .bind(rowid)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE events SET batch_completed = TRUE WHERE id = $1 AND NOT EXISTS \
             (SELECT 1 FROM calls WHERE batch_id = $2 AND status = 1)",
        )
        .bind(id)
        .bind(&batch_id)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    writes.fetch_add(u64::from(group), Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Connection as _;

    /// The raw loop writes what the broker writes, no more: one Requested and one Resolved event
    /// per call, the Requested one the call's `requested_seq`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_raw_sqlite_loop_writes_one_requested_event_per_call_like_the_broker() {
        let dir = tempfile::tempdir().expect("dir");
        let rates = sqlite(dir.path(), 2, Duration::from_millis(300), "{}")
            .await
            .expect("a raw run");
        assert!(rates.per_write > 0.0 && rates.batched > 0.0, "{rates:?}");
        let url = format!("sqlite://{}", dir.path().join("raw.db").display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("open");
        let (calls, requested, resolved, linked): (i64, i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM calls), \
                    (SELECT count(*) FROM events WHERE kind = 1), \
                    (SELECT count(*) FROM events WHERE kind = 2), \
                    (SELECT count(*) FROM calls c JOIN events e \
                       ON e.seq = c.requested_seq AND e.kind = 1 AND e.call_rowid = c.id)",
        )
        .fetch_one(&mut conn)
        .await
        .expect("count");
        assert!(calls > 0);
        assert_eq!(
            (requested, linked),
            (calls, calls),
            "one Requested event per call"
        );
        assert!(resolved <= calls, "at most one Resolved event per call");
    }
}
