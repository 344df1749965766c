//! The raw storage limit: the durable writes the broker makes per approval cycle, made with the
//! broker's own statements (`approval_broker::store::statements`) through the driver the broker
//! writes with, on the same kind of database with the broker's migrations. A cycle is the submit
//! transaction (the batch, the call, and its Requested event: on SQLite the schema's trigger
//! writes it, on Postgres the same statement as the call) and the decide transaction (the call's
//! outcome, its Resolved event, the batch marked complete). The reads the broker does inside
//! those transactions (finding the call first, the policy) are not made: this is the write floor.
//!
//! With receipts on (the broker's default), the decide transaction also appends each outcome's
//! receipt as the broker does: the chain's head read (on Postgres, locked), the receipt row as
//! the broker stores it for the same call (on SQLite in parts: the payload, the key's id and the
//! signature; on Postgres the whole envelope), and the head moved. Signing is CPU the broker
//! spends, not storage, so the receipt here is signed once and written for every call.
//!
//! Two figures each: one transaction per write (a submit, then its decide), and the same rows
//! `GROUP` cycles to a transaction (the submits of `GROUP` calls, then their decides), the limit
//! a broker that groups commits approaches. Each with the CPU a cycle cost this machine (the
//! loop's own and, on Postgres, the database's), and, with receipts on, the time one signature
//! takes: the bench's ceiling is made of them.
//!
//! SQLite: rusqlite on a thread of its own, as the broker's writer (`store/sqlite/writer.rs`);
//! through sqlx every statement would cross to sqlx's worker thread and back, a cost the broker
//! does not pay. Postgres: sqlx, several connections at once, as the broker's replicas write.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use approval_broker::domain::receipt::{ChainLink, payload, sha256_hex};
use approval_broker::domain::{
    AgentId, BatchId, Call, CallId, CallKey, DecidedBy, EventKind, OnDeny, Outcome, OutcomeKind,
    SessionId, Timestamp, ToolInput, ToolName,
};
use approval_broker::receipts::Notary;
use approval_broker::store::receipt_rows;
use approval_broker::store::statements as sql;
use approval_broker::store::{CHECKPOINT_EVERY, WRITER_CHECKPOINT_PAGES};
use rusqlite::{Connection, params};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use crate::broker::{self, ProcessCpu, per_cycle_us};

/// Cycles per transaction in the batched figure.
const GROUP: u32 = 100;

/// What the raw loop writes for each outcome's receipt, when the broker signs receipts: the
/// broker's receipt for the bench's call (signed once, with a throwaway key) in the forms the
/// broker stores, its parts (SQLite) and its envelope (Postgres), and its payload's digest; and
/// what signing it costs, which every broker pays per outcome and the loop does not.
#[derive(Debug, Clone)]
pub struct RawReceipt {
    payload: String,
    keyid: String,
    sig: String,
    envelope: String,
    digest: String,
    /// CPU per signature of the payload, in microseconds (the fastest of [`SIGNING_ROUNDS`]).
    pub signing_cpu_us: f64,
}

/// Rounds of [`SIGNATURES_PER_ROUND`] signatures timed for [`RawReceipt::signing_cpu_us`].
const SIGNING_ROUNDS: usize = 5;
const SIGNATURES_PER_ROUND: u32 = 100;

impl RawReceipt {
    /// The receipt the broker would sign for the bench's call with `input`, approved as asked.
    pub fn like_the_brokers(input: &str) -> Result<Self, String> {
        let id = |e: approval_broker::Error| e.to_string();
        let input = ToolInput::from_stored(input.to_owned());
        let now = Timestamp::from_micros(now_micros());
        let call = Call {
            key: CallKey {
                agent: AgentId::parse("agent", "default").map_err(id)?,
                session: SessionId::parse("session_id", "g1-t0-0").map_err(id)?,
                call_id: CallId::parse("call_id", "g1-t0-0-0").map_err(id)?,
            },
            batch_id: BatchId::parse("batch_id", "g1-t0-0-0").map_err(id)?,
            position: 0,
            batch_size: 1,
            tool: ToolName::parse("tool", "edit_file").map_err(id)?,
            input: input.clone(),
            title: "Edit a file".into(),
            message: String::new(),
            workspace: "bench".into(),
            supersede_key: None,
            deadline: None,
            created_at: now,
            escalation: None,
            requested_by: String::new(),
            approval: None,
            host: None,
            action: None,
            outcome: Some(Outcome {
                kind: OutcomeKind::Approved,
                decided_at: now,
                decided_by: DecidedBy::Approver("bench".into()),
                reason: String::new(),
                tool_result: String::new(),
                run_input: Some(input),
                input_edited: false,
                seq: None,
                receipt: None,
            }),
        };
        let link = ChainLink::after(Some((1, sha256_hex(b"the previous receipt"))));
        let payload = payload(&call, &link).ok_or("the bench's call has no outcome")?;
        let notary = Notary::from_seed(&[7; 32]).map_err(id)?;
        Ok(Self {
            keyid: notary.key_id().to_owned(),
            sig: notary.sign(&payload),
            envelope: notary.seal(&payload),
            digest: sha256_hex(payload.as_bytes()),
            signing_cpu_us: signing_cpu_us(&notary, &payload),
            payload,
        })
    }
}

/// The CPU one signature of `payload` takes, in microseconds: the fastest of a few rounds, timed
/// by the clock, so a round whose thread was interrupted (or moved off its core) does not count
/// and the figure errs low, as a floor should.
fn signing_cpu_us(notary: &Notary, payload: &str) -> f64 {
    (0..SIGNING_ROUNDS)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..SIGNATURES_PER_ROUND {
                std::hint::black_box(notary.sign(std::hint::black_box(payload)));
            }
            started.elapsed().as_secs_f64() * 1e6 / f64::from(SIGNATURES_PER_ROUND)
        })
        .fold(f64::INFINITY, f64::min)
}

/// Cycles per second, one transaction per write and `group` cycles per transaction.
#[derive(Debug, Clone, Copy)]
pub struct StorageRates {
    pub per_write: f64,
    pub batched: f64,
    pub group: u32,
    pub concurrency: u32,
    pub connections: u32,
    pub batch_tasks: u32,
    /// How the writes reach the database.
    pub driver: &'static str,
    /// Postgres: the CPU of its processes on this machine per cycle, in microseconds, in each
    /// loop (`None` on SQLite, whose work is the loop's own, or when Postgres runs elsewhere).
    pub per_write_database_cpu_us: Option<f64>,
    pub batched_database_cpu_us: Option<f64>,
    /// All the CPU a cycle of each loop cost this machine, in microseconds: the loop's own (this
    /// process's) and, on Postgres, the database's (`None` when Postgres runs elsewhere).
    pub per_write_cpu_us: Option<f64>,
    pub batched_cpu_us: Option<f64>,
    /// CPU per receipt signature, in microseconds: a cost of every outcome the loop does not
    /// pay (`None`: receipts are off).
    pub signing_cpu_us: Option<f64>,
}

/// What one loop measured: its cycles/s and the CPU it cost per cycle, in microseconds, in this
/// process and in Postgres's processes on this machine.
#[derive(Debug, Clone, Copy)]
struct LoopRate {
    cycles_per_s: f64,
    own_cpu_us: Option<f64>,
    database_cpu_us: Option<f64>,
}

/// SQLite: a fresh file `raw.db` in `dir`, written by one thread over one connection with the
/// broker writer's settings (WAL, `synchronous=FULL`, foreign keys on, statement journals in
/// memory, the writer checkpointing only past [`WRITER_CHECKPOINT_PAGES`] while a thread of its
/// own copies pages every [`CHECKPOINT_EVERY`]), so the raw loop pays for nothing the broker's
/// writer does not.
pub async fn sqlite(
    dir: &Path,
    run_for: Duration,
    input: &str,
    receipt: Option<RawReceipt>,
) -> Result<StorageRates, String> {
    let path = dir.join("raw.db");
    let migrator = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(
            SqliteConnectOptions::new()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal),
        )
        .await
        .map_err(|e| format!("raw SQLite: {e}"))?;
    sqlx::migrate!("../migrations/sqlite")
        .run(&migrator)
        .await
        .map_err(|e| format!("raw SQLite migrations: {e}"))?;
    migrator.close().await;

    let (done, rates) = tokio::sync::oneshot::channel();
    let input = input.to_owned();
    std::thread::Builder::new()
        .name("raw-sqlite-writer".into())
        .spawn(move || {
            let _ = done.send(sqlite_rates(path, run_for, &input, receipt.as_ref()));
        })
        .map_err(|e| format!("raw SQLite thread: {e}"))?;
    rates
        .await
        .map_err(|_| "the raw SQLite thread died".to_owned())?
        .map_err(|e| format!("raw SQLite: {e}"))
}

/// Both SQLite figures, on the calling thread.
fn sqlite_rates(
    path: PathBuf,
    run_for: Duration,
    input: &str,
    receipt: Option<&RawReceipt>,
) -> rusqlite::Result<StorageRates> {
    let mut conn = Connection::open(&path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    let checkpointer = Connection::open(&path)?;
    checkpointer.pragma_update(None, "synchronous", "FULL")?;
    let writing = Arc::new(AtomicBool::new(true));
    let checkpointing = {
        let writing = Arc::clone(&writing);
        std::thread::spawn(move || {
            while writing.load(Ordering::Relaxed) {
                std::thread::sleep(CHECKPOINT_EVERY);
                let _ = checkpointer.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
            }
        })
    };
    let mut rate = |group: u32| -> rusqlite::Result<LoopRate> {
        let cpu = ProcessCpu::this_process();
        let started = Instant::now();
        let mut cycles = 0u64;
        while started.elapsed() < run_for {
            let prefix = format!("g{group}-{cycles}");
            sqlite_cycles(&mut conn, &prefix, group, input, receipt)?;
            cycles += u64::from(group);
        }
        let elapsed = started.elapsed();
        // The checkpointer's copies are in this process's CPU, as the broker's are in its own.
        let used = cpu.used();
        Ok(LoopRate {
            cycles_per_s: cycles as f64 / elapsed.as_secs_f64(),
            own_cpu_us: per_cycle_us(used, cycles as f64),
            database_cpu_us: None,
        })
    };
    let rates = (rate(1), rate(GROUP));
    writing.store(false, Ordering::Relaxed);
    let _ = checkpointing.join();
    let (per_write, batched) = (rates.0?, rates.1?);
    Ok(StorageRates {
        per_write: per_write.cycles_per_s,
        batched: batched.cycles_per_s,
        group: GROUP,
        concurrency: 1,
        connections: 1,
        batch_tasks: 1,
        driver: "the broker's statements, rusqlite on one thread",
        per_write_database_cpu_us: None,
        batched_database_cpu_us: None,
        // SQLite's work is the loop's own.
        per_write_cpu_us: per_write.own_cpu_us,
        batched_cpu_us: batched.own_cpu_us,
        signing_cpu_us: receipt.map(|r| r.signing_cpu_us),
    })
}

/// Who approves the bench's calls, as the broker records an approver.
const DECIDED_BY: &str = "approver:bench";

/// `group` cycles: one submit transaction holding `group` calls, then one decide transaction
/// resolving them all (with `group == 1`, one transaction per write).
fn sqlite_cycles(
    conn: &mut Connection,
    prefix: &str,
    group: u32,
    input: &str,
    receipt: Option<&RawReceipt>,
) -> rusqlite::Result<()> {
    let now = now_micros();
    let mut stored = Vec::with_capacity(group as usize);
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for i in 0..group {
        let batch_id = format!("{prefix}-{i}");
        tx.prepare_cached(sql::INSERT_BATCH)?.execute(params![
            batch_id,
            "default",
            prefix,
            OnDeny::default().as_i64(),
            1,
            now
        ])?;
        // The trigger `calls_requested_event` writes the Requested event, as for the broker.
        let rowid: i64 = tx.prepare_cached(sql::INSERT_CALL)?.query_row(
            params![
                "default",
                prefix,
                batch_id,
                batch_id,
                0,
                "edit_file",
                input,
                "Edit a file",
                "",
                "bench",
                None::<&str>,
                None::<i64>,
                now,
                None::<&str>,
                // No agent host.
                None::<&str>
            ],
            |row| row.get(0),
        )?;
        stored.push((rowid, batch_id));
    }
    tx.commit()?;

    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for (rowid, batch_id) in stored {
        let _batch: String = tx.prepare_cached(sql::RESOLVE_CALL)?.query_row(
            params![
                OutcomeKind::Approved.code(),
                now,
                DECIDED_BY,
                "",
                "",
                // The input to run, stored only when edited, as the broker's SQLite writer does.
                None::<&str>,
                false,
                rowid
            ],
            |row| row.get(0),
        )?;
        let seq: i64 = tx
            .prepare_cached(sql::APPEND_EVENT)?
            .query_row(params![EventKind::Resolved.code(), rowid, now], |row| {
                row.get(0)
            })?;
        tx.prepare_cached(sql::COMPLETE_BATCH_AT_SEQ)?
            .execute(params![seq, batch_id])?;
        if let Some(receipt) = receipt {
            let head: i64 = tx
                .prepare_cached(receipt_rows::CHAIN_HEAD)?
                .query_row([], |row| row.get(0))?;
            tx.prepare_cached(receipt_rows::INSERT_RECEIPT)?
                .execute(params![
                    head + 1,
                    "default",
                    prefix,
                    batch_id,
                    receipt.digest,
                    "",
                    rowid,
                    receipt.payload,
                    receipt.keyid,
                    receipt.sig
                ])?;
            tx.prepare_cached(receipt_rows::ADVANCE_CHAIN)?
                .execute(params![head + 1, receipt.digest])?;
        }
    }
    tx.commit()
}

/// Postgres: the schema `url` puts first on the search path, `concurrency` tasks writing over
/// `connections` connections one transaction per write; batched, one task per connection.
pub async fn postgres(
    url: &str,
    concurrency: u32,
    connections: u32,
    run_for: Duration,
    input: &str,
    receipt: Option<RawReceipt>,
) -> Result<StorageRates, String> {
    let pool = PgPoolOptions::new()
        .max_connections(connections)
        .connect(url)
        .await
        .map_err(|e| format!("raw Postgres: {e}"))?;
    sqlx::migrate!("../migrations/postgres")
        .run(&pool)
        .await
        .map_err(|e| format!("raw Postgres migrations: {e}"))?;
    let receipt = receipt.as_ref();
    let per_write = postgres_rate(&pool, concurrency, 1, run_for, input, receipt).await?;
    let batched = postgres_rate(&pool, connections, GROUP, run_for, input, receipt).await?;
    pool.close().await;
    // The client's CPU and the database's, where the database runs on this machine.
    let machine = |rate: LoopRate| {
        rate.own_cpu_us
            .zip(rate.database_cpu_us)
            .map(|(own, database)| own + database)
    };
    Ok(StorageRates {
        per_write: per_write.cycles_per_s,
        batched: batched.cycles_per_s,
        group: GROUP,
        concurrency,
        connections,
        batch_tasks: connections,
        driver: "the broker's statements, sqlx",
        per_write_database_cpu_us: per_write.database_cpu_us,
        batched_database_cpu_us: batched.database_cpu_us,
        per_write_cpu_us: machine(per_write),
        batched_cpu_us: machine(batched),
        signing_cpu_us: receipt.map(|r| r.signing_cpu_us),
    })
}

/// `tasks` tasks doing cycles, `group` cycles per transaction, for `run_for`: cycles/s, and the
/// CPU per cycle meanwhile of this process and of Postgres's processes on this machine.
async fn postgres_rate(
    pool: &PgPool,
    tasks: u32,
    group: u32,
    run_for: Duration,
    input: &str,
    receipt: Option<&RawReceipt>,
) -> Result<LoopRate, String> {
    // Committed writes (a submit or a decide: half a cycle each), counted at each commit so a
    // short window with many tasks queued on few connections does not undercount.
    let writes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let database = ProcessCpu::start(broker::DATABASE_PROCESS);
    let own = ProcessCpu::this_process();
    let started = Instant::now();
    let mut running = Vec::new();
    for task in 0..tasks {
        let (pool, writes, stop, input, receipt) = (
            pool.clone(),
            writes.clone(),
            stop.clone(),
            input.to_owned(),
            receipt.cloned(),
        );
        running.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let prefix = format!("g{group}-t{task}-{n}");
                n += 1;
                postgres_cycles(&pool, &prefix, group, &input, receipt.as_ref(), &writes).await?;
            }
            Ok::<(), sqlx::Error>(())
        }));
    }
    tokio::time::sleep(run_for).await;
    // The readings right after the count (this process's first: the database's scans `/proc`).
    let done = writes.load(Ordering::Relaxed) as f64 / 2.0;
    let elapsed = started.elapsed();
    let own_cpu_us = per_cycle_us(own.used(), done);
    let database_cpu_us = per_cycle_us(database.used(), done);
    stop.store(true, Ordering::Relaxed);
    for task in running {
        task.await
            .map_err(|e| format!("raw storage task: {e}"))?
            .map_err(|e| format!("raw storage: {e}"))?;
    }
    Ok(LoopRate {
        cycles_per_s: done / elapsed.as_secs_f64(),
        own_cpu_us,
        database_cpu_us,
    })
}

/// The same cycles on Postgres (whose broker numbers events after commit, in a sequencer
/// transaction this does not model).
async fn postgres_cycles(
    pool: &PgPool,
    prefix: &str,
    group: u32,
    input: &str,
    receipt: Option<&RawReceipt>,
    writes: &AtomicU64,
) -> Result<(), sqlx::Error> {
    let now = now_micros();
    let mut stored = Vec::with_capacity(group as usize);
    let mut tx = pool.begin().await?;
    for i in 0..group {
        let batch_id = format!("{prefix}-{i}");
        sqlx::query(sql::INSERT_BATCH)
            .bind(&batch_id)
            .bind("default")
            .bind(prefix)
            .bind(OnDeny::default().as_i64())
            .bind(1_i64)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let rowid: i64 = sqlx::query_scalar(sql::INSERT_CALL_AND_EVENT)
            .bind("default")
            .bind(prefix)
            .bind(&batch_id)
            .bind(&batch_id)
            .bind(0_i64)
            .bind("edit_file")
            .bind(input)
            .bind("Edit a file")
            .bind("")
            .bind("bench")
            .bind(None::<&str>)
            .bind(None::<i64>)
            .bind(now)
            .bind(None::<&str>)
            // No agent host.
            .bind(None::<&str>)
            .fetch_one(&mut *tx)
            .await?;
        stored.push((rowid, batch_id));
    }
    tx.commit().await?;
    writes.fetch_add(u64::from(group), Ordering::Relaxed);

    let mut tx = pool.begin().await?;
    for (rowid, batch_id) in stored {
        let (_batch, event): (String, i64) = sqlx::query_as(sql::RESOLVE_CALL_AND_EVENT)
            .bind(OutcomeKind::Approved.code())
            .bind(now)
            .bind(DECIDED_BY)
            .bind("")
            .bind("")
            .bind(input)
            .bind(false)
            .bind(rowid)
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query(sql::COMPLETE_BATCH_AT_ID)
            .bind(event)
            .bind(&batch_id)
            .execute(&mut *tx)
            .await?;
        if let Some(receipt) = receipt {
            // Locked, as the broker's replicas take turns at the chain.
            let head: i64 = sqlx::query_scalar(receipt_rows::CHAIN_HEAD_LOCKED)
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query(receipt_rows::INSERT_RECEIPT)
                .bind(head + 1)
                .bind("default")
                .bind(prefix)
                .bind(&batch_id)
                .bind(&receipt.digest)
                .bind(&receipt.envelope)
                .bind(rowid)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .bind(None::<&str>)
                .execute(&mut *tx)
                .await?;
            sqlx::query(receipt_rows::ADVANCE_CHAIN)
                .bind(head + 1)
                .bind(&receipt.digest)
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    writes.fetch_add(u64::from(group), Ordering::Relaxed);
    Ok(())
}

fn now_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Connection as _;

    /// The raw loop writes what the broker writes for an approved call, no more and no less:
    /// per call one batch, one Requested event (the call's `requested_seq`) and one Resolved
    /// event marking the batch complete, the call approved, and its receipt on the chain, stored
    /// in parts as the broker's SQLite writer stores it. Every cycle it began it finished, in
    /// both figures, and each figure comes with its CPU, as the signature with its time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_raw_sqlite_loop_makes_exactly_the_brokers_writes_per_cycle() {
        let dir = tempfile::tempdir().expect("dir");
        let receipt = RawReceipt::like_the_brokers("{}").expect("a receipt");
        let rates = sqlite(dir.path(), Duration::from_millis(300), "{}", Some(receipt))
            .await
            .expect("a raw run");
        assert!(rates.per_write > 0.0 && rates.batched > 0.0, "{rates:?}");
        // Each loop's CPU per cycle is measured (a few clock ticks of a short run may read 0),
        // and the signature's time: the bench's ceiling is made of them.
        assert!(rates.per_write_cpu_us.is_some(), "{rates:?}");
        assert!(rates.batched_cpu_us.is_some(), "{rates:?}");
        assert!(rates.signing_cpu_us.is_some_and(|us| us > 0.0), "{rates:?}");
        let url = format!("sqlite://{}", dir.path().join("raw.db").display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.expect("open");
        let counts: (i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64) =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT (SELECT count(*) FROM calls), \
                    (SELECT count(*) FROM batches), \
                    (SELECT count(*) FROM calls WHERE status = {approved}), \
                    (SELECT count(*) FROM events WHERE kind = {requested}), \
                    (SELECT count(*) FROM calls c JOIN events e \
                       ON e.seq = c.requested_seq AND e.kind = {requested} \
                       AND e.call_rowid = c.id), \
                    (SELECT count(*) FROM events WHERE kind = {resolved}), \
                    (SELECT count(*) FROM events e JOIN calls c ON c.id = e.call_rowid \
                       WHERE e.kind = {resolved} AND e.batch_completed), \
                    (SELECT count(*) FROM receipts r JOIN calls c ON c.session_id = r.session_id \
                       AND c.call_id = r.call_id), \
                    (SELECT seq FROM receipt_chain), \
                    (SELECT count(*) FROM calls WHERE run_input IS NULL), \
                    (SELECT count(*) FROM receipts WHERE envelope = '' \
                       AND payload IS NOT NULL AND length(sig) = 88)",
                approved = OutcomeKind::Approved.code(),
                requested = EventKind::Requested.code(),
                resolved = EventKind::Resolved.code(),
            )))
            .fetch_one(&mut conn)
            .await
            .expect("count");
        let calls = counts.0;
        assert!(calls > i64::from(GROUP), "both figures ran: {counts:?}");
        assert_eq!(
            counts,
            (
                calls, calls, calls, calls, calls, calls, calls, calls, calls, calls, calls
            ),
            "(calls, batches, approved, Requested events, linked to their call, \
             Resolved events, completing their batch, a receipt each, the chain's length, \
             approved without storing the input again, receipts in parts)"
        );
    }
}
