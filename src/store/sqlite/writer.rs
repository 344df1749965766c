//! SQLite's write transactions, run by rusqlite on the store's writer thread.
//!
//! Every write of the SQLite backend runs on one thread that owns the one write connection (see
//! the group commit in `operations::tx`), and its statements execute right there. Through sqlx,
//! each statement went to the connection's worker thread and back, and those hand-offs (a
//! wake-up each way) cost several times what SQLite spent on the statement; this path has none,
//! and its prepared statements are cached. Writers are serialised by the one connection and
//! `BEGIN IMMEDIATE`, so there is nothing to lock, and an event's row id is its sequence number.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rusqlite::config::DbConfig;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OpenFlags, Params, ToSql, params, params_from_iter};

use tokio::sync::{Notify, mpsc};

use super::Synchronous;
use crate::domain::receipt::{ChainLink, Sealed};
use crate::domain::{Call, CallKey, Event, EventKind};
use crate::error::{Error, Result, StorageFault};
use crate::operations::Transactions;
use crate::receipts::Notary;
use crate::receipts::signer::{Sealing, Signer};
use crate::store::CommittedEvents;
use crate::store::health::Watch;
use crate::store::policy_cache::{PolicyCache, PolicyView};
use crate::store::primitives::{Decode, Param, Run, SqlTx, read_chain_head};
use crate::store::receipt_rows::{self, NewReceipt, ReceiptForm};
use crate::store::rows::{ColumnNames, NamedRow, event_from_row};
use crate::store::statements as sql;
use sqlite_ffi::coalesced_wal;

/// Enough for every statement of the write path (about 30) and a few shapes of `IN` lists.
const STATEMENT_CACHE: usize = 64;

/// How often the checkpointer copies what was committed from the WAL into the database file.
/// Each checkpoint syncs the WAL and the database file, and a commit that syncs meanwhile waits
/// longer: ten a second made the tail of one call in flight; rarer checkpoints leave more for
/// the writer's own ([`WRITER_CHECKPOINT_PAGES`]). Measured in docs/benchmarks-notes.md ("SQLite's
/// allocations and the checkpointer's interval").
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

/// How often the checkpointer compares the database's files with those opened.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// WAL pages (32 MiB) after which the writer checkpoints by itself. Under steady load the WAL
/// only starts over from its beginning after a checkpoint the writer runs (the checkpointer's
/// never catches up with a writer that keeps committing), so this bounds the WAL file, and how
/// often the writer spends a commit's time copying pages and syncing the database file
/// (SQLite's default, 1,000, would be every few groups; larger values are a little faster but
/// each rarer checkpoint is a longer pause). Measured in docs/benchmarks-notes.md.
pub const WRITER_CHECKPOINT_PAGES: u32 = 8_192;

/// The receipts of the commits since the events were last read back, with their calls.
type CommittedReceipts = Arc<Mutex<Vec<(CallKey, Arc<Sealed>)>>>;

/// The one write connection. A transaction takes it out and puts it back when it ends, so a
/// transaction is an owned value that can cross `await`s; only the writer thread runs
/// transactions on it (the store's clone only starts the hand-over of events).
#[derive(Clone)]
pub struct WriteConnection {
    home: Arc<Mutex<Option<Connection>>>,
    /// Commits so far: the checkpointer and the hand-over of events each act only when it moved.
    commits: Arc<AtomicU64>,
    published: Arc<Mutex<Published>>,
    files: Arc<DatabaseFiles>,
    /// The rules and grants, kept between transactions (see `policy_cache`).
    policy: Arc<PolicyCache>,
    /// What every outcome's receipt is signed by (beside the writer); `None` when receipts are
    /// off.
    signer: Option<Arc<Signer>>,
    /// The receipts committed since the events were last read back, by call: each Resolved
    /// event read back takes its call's from here (see [`Self::read_committed`]).
    sealed: CommittedReceipts,
    /// Storage health, told by every transaction on this connection (see `store::health`).
    health: Watch,
}

/// The database's files as this process opened them (device and inode of the database, its WAL
/// and its shared-memory file). Once one of them is deleted or replaced, SQLite goes on writing
/// to the open (unlinked) files: commits succeed, and all of them are gone at the next start,
/// which finds no file or another one. So every commit, and the checkpointer every 100 ms,
/// compares the paths with what was opened, and once they differ the store stops acknowledging
/// for good: only an operator can tell what became of the database.
pub(super) struct DatabaseFiles {
    opened: Vec<(PathBuf, (u64, u64))>,
    /// Why the store stopped writing, once it did.
    lost: Mutex<Option<String>>,
}

impl DatabaseFiles {
    /// Notes the identity of the database's files that exist now (after a connection opened it
    /// in WAL mode, all three).
    fn of(database: &Path) -> Result<Self> {
        let mut opened = Vec::new();
        for suffix in ["", "-wal", "-shm"] {
            let mut path = database.as_os_str().to_owned();
            path.push(suffix);
            let path = PathBuf::from(path);
            match std::fs::metadata(&path) {
                Ok(meta) => opened.push((path, (meta.dev(), meta.ino()))),
                Err(_) if !suffix.is_empty() => {}
                Err(e) => {
                    return Err(Error::StorageFault {
                        fault: StorageFault::Unavailable,
                        cause: format!("cannot read {}: {e}", path.display()),
                    });
                }
            }
        }
        Ok(Self {
            opened,
            lost: Mutex::new(None),
        })
    }

    /// Whether every file is still the one opened. Once one is not, never again (logged once).
    fn check(&self) -> Result<()> {
        let mut lost = self.lost.lock().unwrap_or_else(PoisonError::into_inner);
        if lost.is_none() {
            for (path, identity) in &self.opened {
                let now = std::fs::metadata(path).map(|meta| (meta.dev(), meta.ino()));
                let what = match now {
                    Ok(now) if now == *identity => continue,
                    Ok(_) => "was replaced by another file",
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => "was deleted",
                    // Not a verdict on the file (the next look decides): its own errors are the
                    // statements' to report.
                    Err(e) => {
                        tracing::debug!(error = %e, file = %path.display(), "cannot look at a database file");
                        continue;
                    }
                };
                let why = format!(
                    "the SQLite file {} {what} while the broker ran; nothing is acknowledged \
                     from now on: stop the broker and restore the database",
                    path.display()
                );
                tracing::error!("{why}");
                *lost = Some(why);
                break;
            }
        }
        match &*lost {
            None => Ok(()),
            Some(why) => Err(Error::StorageFault {
                fault: StorageFault::Unavailable,
                cause: why.clone(),
            }),
        }
    }

    /// The failure of [`Self::check`] once it failed, without looking at the files again.
    fn lost(&self) -> Result<()> {
        match &*self.lost.lock().unwrap_or_else(PoisonError::into_inner) {
            None => Ok(()),
            Some(why) => Err(Error::StorageFault {
                fault: StorageFault::Unavailable,
                cause: why.clone(),
            }),
        }
    }
}

/// The events the writer hands to the event pump: the last sequence number read, the commit
/// count then, and where to (nowhere until the pump takes them).
struct Published {
    last: u64,
    commits: u64,
    to: Option<mpsc::Sender<Vec<Event>>>,
    missed: Arc<Notify>,
}

/// Commits whose events may wait for the event pump; beyond, the pump reads them itself.
pub(super) const PUBLISHED_QUEUE: usize = 256;

impl WriteConnection {
    /// Opens the database file (already migrated) for writing, with the store's settings.
    /// Also starts the checkpointer, which ends when the last clone of this is dropped. Every
    /// outcome written through it is signed by `notary`, if given.
    pub fn open(
        path: &Path,
        synchronous: Synchronous,
        notary: Option<Arc<Notary>>,
    ) -> Result<Self> {
        let conn = connect(path, synchronous, ConnectionKind::Writer)?;
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(Error::Internal(format!(
                "SQLite refused WAL mode (journal_mode is `{mode}`)"
            )));
        }
        conn.pragma_update(None, "wal_autocheckpoint", WRITER_CHECKPOINT_PAGES)?;
        conn.pragma_update(None, "foreign_keys", true)?;
        // Statement journals (a statement with a trigger or a conflict clause keeps one, to undo
        // itself alone) in memory: on disk they cost a write system call per page journaled,
        // about a fifth of the writer's time. They are never needed after a crash.
        conn.pragma_update(None, "temp_store", "MEMORY")?;
        conn.busy_timeout(Duration::from_secs(10))?;
        // Plans that never depend on a bound value (the query planner stability guarantee). This
        // SQLite reads a bound `LIMIT $n` as a constant when it plans, and so marks the
        // statement to be planned again whenever `$n` is bound anew: every run of the pending
        // cap's count, of the event log's page read and of the sweeper's reads re-parsed its
        // SQL (about a tenth of the writer's time at the 64-agent peak, `perf record`).
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let last: Option<i64> = conn.query_row(sql::LATEST_SEQ, [], |row| row.get(0))?;
        let files = Arc::new(DatabaseFiles::of(path)?);
        let signer = notary.map(Signer::start).transpose()?.map(Arc::new);
        let writer = Self {
            home: Arc::new(Mutex::new(Some(conn))),
            commits: Arc::new(AtomicU64::new(0)),
            published: Arc::new(Mutex::new(Published {
                last: last.unwrap_or(0) as u64,
                commits: 0,
                to: None,
                missed: Arc::default(),
            })),
            files: Arc::clone(&files),
            policy: Arc::default(),
            signer,
            sealed: Arc::default(),
            health: Watch::default(),
        };
        let checkpointer = connect(path, synchronous, ConnectionKind::Checkpointer)?;
        let (home, commits) = (Arc::downgrade(&writer.home), Arc::clone(&writer.commits));
        thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || checkpoint_while_open(&checkpointer, &home, &commits, &files))
            .map_err(|e| Error::Internal(format!("cannot start the checkpointer thread: {e}")))?;
        Ok(writer)
    }

    /// This connection, telling `health` how each of its transactions went.
    pub fn watched_by(self, health: Watch) -> Self {
        Self { health, ..self }
    }

    /// Starts handing the events of every commit over (see `Store::take_committed_events`);
    /// `None` if they already are.
    pub fn hand_over(&self) -> Option<CommittedEvents> {
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if published.to.is_some() {
            return None;
        }
        let (to, events) = mpsc::channel(PUBLISHED_QUEUE);
        published.to = Some(to);
        Some(CommittedEvents {
            events,
            missed: Arc::clone(&published.missed),
        })
    }

    /// Reads the events committed since the last call and hands them over, if anything was
    /// committed since (not after a group that failed, or an Explain). On failure (or a full
    /// queue) the pump is told to read the log.
    fn publish_committed(&self) {
        // Taken whether or not events are handed over, so they never pile up.
        let sealed =
            std::mem::take(&mut *self.sealed.lock().unwrap_or_else(PoisonError::into_inner));
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let commits = self.commits.load(Ordering::Relaxed);
        if published.to.as_ref().is_none_or(mpsc::Sender::is_closed) || commits == published.commits
        {
            return;
        }
        published.commits = commits;
        if let Err(err) = self.read_committed(&mut published, sealed) {
            tracing::warn!(error = %err, "reading committed events on the writer failed");
            published.missed.notify_one();
        }
    }

    /// The events committed since the last hand-over, read back on the write connection; each
    /// Resolved one given the receipt its commit left in `sealed` (so the read joins no receipt
    /// row: every outcome an agent is sent carries its receipt, and the writer thread, which
    /// every write waits for, reads and copies no payload for it).
    fn read_committed(
        &self,
        published: &mut Published,
        sealed: Vec<(CallKey, Arc<Sealed>)>,
    ) -> Result<()> {
        const PAGE: i64 = 1024;
        let mut sealed: HashMap<CallKey, Arc<Sealed>> = sealed.into_iter().collect();
        let mut tx = self.begin_read()?;
        loop {
            let mut events = tx.query_rows(
                false,
                sql::EVENTS_AFTER_UNSEALED,
                params![published.last as i64, PAGE],
                |row| event_from_row(row),
            )?;
            if !sealed.is_empty() {
                for event in &mut events {
                    if event.kind == EventKind::Resolved
                        && let Some(outcome) = &mut event.call.outcome
                    {
                        outcome.receipt = sealed.remove(&event.call.key);
                    }
                }
            }
            let Some(last) = events.last().map(|e| e.seq) else {
                return Ok(());
            };
            let full = events.len() == PAGE as usize;
            published.last = last;
            let handed = published.to.as_ref().map(|to| to.try_send(events));
            if !matches!(handed, Some(Ok(()))) {
                // Dropped: the pump reads them, and any after them, from the log.
                published.missed.notify_one();
                return Ok(());
            }
            if !full {
                return Ok(());
            }
        }
    }

    /// A read transaction on the write connection, rolled back: for Explain (it reads what a
    /// submit reads) and for reading back the events just committed.
    pub fn begin_read(&self) -> Result<SqliteTx> {
        self.begin("BEGIN")
    }

    /// A transaction begun with `sql`; its failure to begin is told to storage health.
    fn begin(&self, sql: &str) -> Result<SqliteTx> {
        self.health.seen(self.begin_unwatched(sql))
    }

    fn begin_unwatched(&self, sql: &str) -> Result<SqliteTx> {
        let conn = self
            .home
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| Error::Internal("the SQLite write connection is in use".into()))?;
        let tx = SqliteTx {
            conn: Some(conn),
            home: Arc::clone(&self.home),
            commits: Arc::clone(&self.commits),
            files: Arc::clone(&self.files),
            writes: 0,
            policy: PolicyView::new(&self.policy),
            signer: self.signer.clone(),
            sealing: Vec::new(),
            sealed: Arc::clone(&self.sealed),
            holds: false,
            chain: None,
            health: self.health.clone(),
            changed: 0,
        };
        if !tx.conn().is_autocommit() {
            // The rollback that ended the last transaction failed: try again, or the BEGIN
            // below fails (and every one after it).
            tx.conn().execute_batch("ROLLBACK")?;
        }
        tx.conn().execute_batch(sql)?;
        Ok(tx)
    }

    /// A write transaction that changes nothing the broker reads but reaches the disk as any
    /// commit does (it rewrites the database header's `user_version`, which the broker does not
    /// use: migrations are recorded in `_sqlx_migrations`): whether writes work.
    pub fn probe(&self) -> Result<()> {
        let mut tx = self.begin_write_now()?;
        let written = tx.execute_sql("PRAGMA user_version = 0", []);
        self.health.seen(written.and_then(|_| tx.commit_now()))
    }

    /// A write transaction, refused at once if the database's files are gone.
    fn begin_write_now(&self) -> Result<SqliteTx> {
        self.health.seen(self.files.lost())?;
        self.begin("BEGIN IMMEDIATE")
    }

    /// How many receipts were handed to the signing thread so far.
    #[cfg(test)]
    pub fn receipts_handed_over(&self) -> u64 {
        self.signer.as_ref().map_or(0, |signer| signer.handed())
    }

    /// The writes SQLite asked of the write connection's WAL file and those that reached it
    /// (see `coalesced_wal`); `None` when that WAL is not coalesced.
    #[cfg(test)]
    pub fn wal_writes(&self) -> Result<Option<(u64, u64)>> {
        let tx = self.begin_read()?;
        Ok(coalesced_wal::wal_writes(tx.conn()))
    }

    /// A pragma's value on the write connection.
    #[cfg(test)]
    pub fn pragma(&self, name: &str) -> Result<String> {
        let tx = self.begin_read()?;
        let value = tx.conn().query_row(&format!("PRAGMA {name}"), [], |row| {
            use rusqlite::types::ValueRef;
            Ok(match row.get_ref(0)? {
                ValueRef::Integer(n) => n.to_string(),
                ValueRef::Text(text) => String::from_utf8_lossy(text).into_owned(),
                _ => String::new(),
            })
        })?;
        Ok(value)
    }
}

/// Which of the writer's two connections [`connect`] opens.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConnectionKind {
    /// The one that writes: its commits' WAL writes go out together (see `coalesced_wal`)
    /// where that is safe, under `synchronous = FULL`.
    Writer,
    /// The checkpointer's, which copies pages out of the WAL and never writes into it.
    Checkpointer,
}

/// A read-write connection to the database file with the store's settings.
fn connect(path: &Path, synchronous: Synchronous, role: ConnectionKind) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let coalesced = role == ConnectionKind::Writer && synchronous == Synchronous::Full;
    let conn = match coalesced.then(coalesced_wal::register) {
        Some(Ok(())) => Connection::open_with_flags_and_vfs(path, flags, coalesced_wal::VFS)?,
        Some(Err(code)) => {
            tracing::warn!(
                code,
                "SQLite refused the coalescing VFS; the WAL is written frame by frame"
            );
            Connection::open_with_flags(path, flags)?
        }
        None => Connection::open_with_flags(path, flags)?,
    };
    // Checkpoints sync the database file as this says, so the checkpointer needs it too.
    let synchronous = match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", synchronous)?;
    Ok(conn)
}

/// Copies committed pages from the WAL into the database file every [`CHECKPOINT_EVERY`] while
/// there are new commits, on its own thread and connection: a passive checkpoint waits for
/// no one, and the writer spends none of its time on it. Ends when the writer is gone.
///
/// It also compares the database's files with those opened every [`LOOK_EVERY`] (see
/// [`DatabaseFiles`]), so a deletion is noticed soon even while nothing is written.
fn checkpoint_while_open(
    conn: &Connection,
    writer: &Weak<Mutex<Option<Connection>>>,
    commits: &AtomicU64,
    files: &DatabaseFiles,
) {
    let mut checkpointed = 0;
    let mut last = Instant::now();
    while writer.strong_count() > 0 {
        thread::sleep(LOOK_EVERY);
        if files.check().is_err() {
            // Copying pages into a file nobody will open again is pointless.
            continue;
        }
        let now = commits.load(Ordering::Relaxed);
        if now != checkpointed && last.elapsed() >= CHECKPOINT_EVERY {
            last = Instant::now();
            match conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                Ok(()) => checkpointed = now,
                Err(err) => {
                    tracing::warn!(error = %err, "a SQLite checkpoint failed; the next one retries");
                }
            }
        }
    }
}

#[async_trait]
impl Transactions for WriteConnection {
    type Tx = SqliteTx;

    async fn begin_write(&self) -> Result<Self::Tx> {
        self.begin_write_now()
    }

    fn after_commit(&self) {
        self.publish_committed();
    }
}

/// A transaction on the write connection. It counts the writing statements it issued, so that a
/// write of a group that fails before changing anything needs no rollback (see the group commit,
/// `operations::tx`).
/// Dropped without a commit, it rolls back.
pub struct SqliteTx {
    conn: Option<Connection>,
    home: Arc<Mutex<Option<Connection>>>,
    commits: Arc<AtomicU64>,
    files: Arc<DatabaseFiles>,
    writes: u64,
    /// The process's rules and grants as this transaction may use them: a group of submits
    /// reads the policy version once.
    policy: PolicyView,
    signer: Option<Arc<Signer>>,
    /// The receipts of this transaction (by sequence, with their calls), inserted unsigned and
    /// being signed beside the writer: their signatures are written just before it commits.
    sealing: Vec<(i64, CallKey, Sealing)>,
    /// Where the commit leaves its receipts for the events read back after it (see
    /// `WriteConnection::read_committed`).
    sealed: CommittedReceipts,
    /// Whether the write running is its group's only one (one call in flight). Its receipts are
    /// then held back from the signer, each handed over once the writer has another to sign,
    /// so the last is signed here at the commit, which would wait for it anyway: handing it
    /// over would wake the signer for nothing (measured with one call in flight in
    /// docs/benchmarks-notes.md).
    /// In a larger group each receipt goes to the signer at once, and the rest of the group
    /// runs while it is signed.
    holds: bool,
    /// The receipt chain's head as this transaction moved it (its last receipt's sequence and
    /// payload digest), once it appended a receipt. The commit writes it: one statement a group,
    /// not a read and a write a receipt.
    chain: Option<(u64, String)>,
    /// Storage health: told the failure of any statement or of the commit, and a commit that
    /// changed rows.
    health: Watch,
    /// Rows the statements run through [`SqlTx`] changed (or returned, where they write).
    changed: u64,
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !conn.is_autocommit()
                && let Err(err) = conn.execute_batch("ROLLBACK")
            {
                tracing::error!(error = %err, "rolling back a SQLite write transaction failed");
            }
            *self.home.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn);
        }
    }
}

impl SqliteTx {
    fn conn(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a transaction holds the connection until it is dropped")
    }

    /// Runs a writing statement; returns how many rows it changed.
    fn execute_sql(&mut self, sql: &str, params: impl Params) -> Result<usize> {
        self.writes += 1;
        Ok(self.conn().prepare_cached(sql)?.execute(params)?)
    }

    /// Every row `sql` returns, decoded by `decode`. Counts as a write when `writes`.
    fn query_rows<T>(
        &mut self,
        writes: bool,
        sql: &str,
        params: impl Params,
        mut decode: impl FnMut(&NamedRow<'_, '_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        if writes {
            self.writes += 1;
        }
        let mut statement = self.conn().prepare_cached(sql)?;
        let mut rows = statement.query(params)?;
        let mut decoded = Vec::new();
        let mut names = None;
        while let Some(row) = rows.next()? {
            if names.is_none() && !decoded.is_empty() {
                // A second row: this and the rest find their columns by names copied once.
                names = Some(ColumnNames::of(row));
            }
            decoded.push(decode(&NamedRow::new(row, names.as_ref()))?);
        }
        Ok(decoded)
    }

    /// Commits, then checks that the commit went to the database's own files before anyone is
    /// told (a `stat` of each, next to the commit's fsync): a commit into a deleted file is
    /// lost, so it must not be acknowledged, nor its events published.
    fn commit_now(mut self) -> Result<()> {
        // On failure the drop rolls back what is left of the transaction.
        let mut sealed = Vec::with_capacity(self.sealing.len());
        for (sequence, key, sealing) in std::mem::take(&mut self.sealing) {
            let payload = sealing.payload().to_owned();
            let key_id = sealing.key_id().to_owned();
            let sig = sealing.signature();
            let written = self
                .conn()
                .prepare_cached(receipt_rows::SEAL_RECEIPT)?
                .execute(params![sig, sequence])?;
            if written != 1 {
                return Err(Error::Internal(format!(
                    "receipt {sequence} was not there to seal"
                )));
            }
            let receipt = Sealed::Parts {
                payload,
                key_id,
                sig,
            };
            sealed.push((key, Arc::new(receipt)));
        }
        if let Some((sequence, digest)) = self.chain.take() {
            self.execute_sql(
                receipt_rows::ADVANCE_CHAIN,
                params![sequence as i64, digest],
            )?;
        }
        self.conn().execute_batch("COMMIT")?;
        self.files.check()?;
        if !sealed.is_empty() {
            self.sealed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(sealed);
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// SQLite's transaction. Writers are serialised (one connection, `BEGIN IMMEDIATE`), so there
/// is nothing to lock, and an event's row id is its sequence number.
#[async_trait]
impl SqlTx for SqliteTx {
    /// The trigger `calls_requested_event` (migration 0004) writes the Requested event.
    const INSERT_CALL: &'static str = sql::INSERT_CALL;
    const INSERT_DECIDED_CALL: &'static str = sql::INSERT_DECIDED_CALL;
    const APPEND_EVENT: &'static str = sql::APPEND_EVENT;
    const COMPLETE_BATCH: &'static str = sql::COMPLETE_BATCH_AT_SEQ;
    /// An event's row id is its sequence number.
    const EVENT_IS_SEQ: bool = true;
    /// Unlocked: the one writer is the only one appending to the chain.
    const CHAIN_HEAD: &'static str = receipt_rows::CHAIN_HEAD;
    /// Nothing to lock: the writer is alone.
    const FIND_CALL_LOCKING_BATCH: &'static str = sql::FIND_CALL;
    /// One broker at a time, and migration 0014 keeps older ones off the file.
    const STORES_UNEDITED_INPUT_TO_RUN: bool = false;
    /// One broker process per file (its lock file), and its writer is alone.
    const REPLICAS: bool = false;

    async fn rows<T: Send + 'static>(&mut self, run: Run<'_>, decode: Decode<T>) -> Result<Vec<T>> {
        let params = params_from_iter(run.params);
        let rows = self.query_rows(run.writes, run.sql, params, |row| decode(row));
        let rows = self.health.seen(rows)?;
        if run.writes {
            self.changed += rows.len() as u64;
        }
        Ok(rows)
    }

    async fn execute(&mut self, run: Run<'_>) -> Result<u64> {
        let changed = self.execute_sql(run.sql, params_from_iter(run.params));
        let changed = self.health.seen(changed)? as u64;
        self.changed += changed;
        Ok(changed)
    }

    fn policy_view(&mut self) -> Option<&mut PolicyView> {
        Some(&mut self.policy)
    }

    fn notary(&self) -> Option<Arc<Notary>> {
        self.signer
            .as_ref()
            .map(|signer| Arc::clone(signer.notary()))
    }

    /// Inserted now, in parts and unsigned, so a row that cannot be stored fails this write
    /// alone, not the group's commit; signed on the signer's thread while the group goes on,
    /// except a lone write's last receipt, which the writer signs at the commit (see `holds`);
    /// the signature (and the chain's new head) written by the commit. The chain's head is read
    /// once a transaction, and then kept here. The row is inserted at its final size (a
    /// placeholder signature as long as every signature), so the signature overwrites it where
    /// it lies: grown from nothing, each of a group's receipts moved cells across its pages
    /// again at the commit. Stored in parts, not as a whole envelope (`receipt_rows`): two to a
    /// page for inputs up to about 1 KiB, and the signer does not encode the payload.
    async fn append_receipt(&mut self, notary: &Notary, rowid: i64, call: &Call) -> Result<()> {
        let Some(signer) = self.signer.clone() else {
            return Err(Error::Internal(
                "a receipt to sign with receipts off".into(),
            ));
        };
        let head = match self.chain.take() {
            Some(head) => Some(head),
            None => read_chain_head(self).await?,
        };
        let link = ChainLink::after(head.clone());
        let mut receipt = match NewReceipt::of(call, rowid, &link) {
            Ok(receipt) => receipt,
            Err(err) => {
                self.chain = head;
                return Err(err);
            }
        };
        let unsigned = ReceiptForm::Parts {
            keyid: notary.key_id(),
            sig: receipt_rows::UNSIGNED,
        };
        let inserted = self.execute_sql(
            receipt_rows::INSERT_RECEIPT,
            params_from_iter(receipt.params(unsigned)),
        );
        if let Err(err) = self.health.seen(inserted) {
            self.chain = head;
            return Err(err);
        }
        let payload = std::mem::take(&mut receipt.payload);
        // The writer has another to sign: the one held before it goes to the signer.
        if let Some((_, _, before)) = self.sealing.last_mut() {
            signer.hand_over(before);
        }
        let sealing = if self.holds {
            signer.hold(payload)
        } else {
            signer.sign(payload)
        };
        self.sealing
            .push((receipt.sequence, call.key.clone(), sealing));
        self.chain = Some((link.sequence, receipt.digest));
        Ok(())
    }

    /// Receipts are held while a group's only write runs (see `holds`).
    fn next_write(&mut self, alone: bool) {
        self.holds = alone;
    }

    /// `None` once SQLite rolled the transaction back by itself (after some errors: I/O, a full
    /// disk, no memory), so the group starts over rather than run the rest in autocommit.
    fn statements_written(&self) -> Option<u64> {
        (!self.conn().is_autocommit()).then_some(self.writes)
    }

    /// A commit that changed rows tells storage health that writes work.
    async fn commit(self) -> Result<()> {
        let (health, changed) = (self.health.clone(), self.changed);
        health.seen(self.commit_now())?;
        if changed > 0 {
            health.wrote();
        }
        Ok(())
    }
}

/// The shared statements' parameters, as SQLite takes them.
impl ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match *self {
            Param::Int(value) => ValueRef::Integer(value),
            Param::OptInt(value) => value.map_or(ValueRef::Null, ValueRef::Integer),
            Param::Text(value) => ValueRef::Text(value.as_bytes()),
            Param::OptText(value) => value.map_or(ValueRef::Null, |v| ValueRef::Text(v.as_bytes())),
            Param::Flag(value) => ValueRef::Integer(i64::from(value)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rows::Columns as _;

    /// A writer on a new database file `a.db` holding the tables its start reads: `events`,
    /// and `retention` with the pruned horizon.
    fn writer_on_a_new_file() -> (tempfile::TempDir, WriteConnection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch(
                "CREATE TABLE events (seq INTEGER PRIMARY KEY); \
                 CREATE TABLE retention (pruned_through INTEGER NOT NULL); \
                 INSERT INTO retention VALUES (0);",
            )
            .unwrap();
        let writer = WriteConnection::open(&path, Synchronous::Full, None).unwrap();
        (dir, writer)
    }

    #[tokio::test]
    async fn the_checkpointer_copies_commits_into_the_database_file_without_the_writer() {
        let (dir, writer) = writer_on_a_new_file();
        let path = dir.path().join("a.db");
        let mut tx = writer.begin_write().await.unwrap();
        // About 300 KiB: far below the pages after which the writer would checkpoint itself.
        tx.execute_sql("CREATE TABLE t (x BLOB)", []).unwrap();
        tx.execute_sql(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) \
             INSERT INTO t SELECT randomblob(1000) FROM n",
            [],
        )
        .unwrap();
        tx.commit().await.unwrap();
        let size = || std::fs::metadata(&path).unwrap().len();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while size() < 300 * 1000 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            size() >= 300 * 1000,
            "the database file holds {} bytes",
            size()
        );
    }

    #[tokio::test]
    async fn a_statement_with_a_bound_limit_is_planned_once_not_on_every_run() {
        let (_dir, writer) = writer_on_a_new_file();
        let mut tx = writer.begin_write().await.unwrap();
        const PAGE: &str = "SELECT seq FROM events WHERE seq > $1 ORDER BY seq LIMIT $2";
        for limit in 1..=20_i64 {
            tx.query_rows(false, PAGE, params![limit, limit], |row| row.int("seq"))
                .unwrap();
        }
        let replanned = tx
            .conn()
            .prepare_cached(PAGE)
            .unwrap()
            .get_status(rusqlite::StatementStatus::RePrepare);
        assert_eq!(replanned, 0, "re-prepared on {replanned} of 20 runs");
    }

    /// Every row's columns found by name, whether looked up in the statement's order or not,
    /// in any case, on the first row (through SQLite) and the rest (through the names copied
    /// once); a name the statement does not have is an error naming it.
    #[tokio::test]
    async fn the_rows_of_a_read_find_their_columns_by_name_in_any_order() {
        let (_dir, writer) = writer_on_a_new_file();
        let mut tx = writer.begin_write().await.unwrap();
        tx.conn()
            .execute_batch(
                "CREATE TABLE t (a INTEGER, b TEXT, c INTEGER); \
                 INSERT INTO t VALUES (1, 'one', 10), (2, 'two', 20), (3, NULL, 30)",
            )
            .unwrap();
        let read = |row: &NamedRow<'_, '_>| -> Result<(i64, i64, Option<String>, i64)> {
            Ok((
                row.int("c")?,
                row.int("A")?,
                row.opt_text("b")?,
                row.int("a")?,
            ))
        };
        let rows = tx
            .query_rows(false, "SELECT a, b, c FROM t ORDER BY a", [], read)
            .unwrap();
        assert_eq!(
            rows,
            [
                (10, 1, Some("one".into()), 1),
                (20, 2, Some("two".into()), 2),
                (30, 3, None, 3),
            ]
        );
        // The first row misses (through SQLite), then the third (through the copied names).
        for missing_at in [1, 3] {
            let err = tx
                .query_rows(false, "SELECT a, b, c FROM t ORDER BY a", [], |row| {
                    row.int(if row.int("a")? == missing_at {
                        "nope"
                    } else {
                        "c"
                    })
                })
                .unwrap_err()
                .to_string();
            assert!(err.contains("nope"), "{err}");
        }
    }
}
