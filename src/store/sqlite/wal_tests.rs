//! The coalesced-WAL VFS (`sqlite_ffi::coalesced_wal`) as the writer uses it: what a commit
//! writes reaches the file in one write, before another connection sees it; frames spilled,
//! rewritten or rolled back leave exactly what was committed; a failed write is written later.
//! Here rather than beside the VFS, so that they run with the broker's tests (`cargo test`).

use rusqlite::{Connection, OpenFlags, params};

use sqlite_ffi::coalesced_wal::{VFS, fail_wal_writes, register, wal_writes};

/// A write connection through this VFS (`synchronous = FULL`, WAL) and a reader through
/// SQLite's own, on a fresh file holding table `t`.
fn writer_and_reader() -> (tempfile::TempDir, Connection, Connection) {
    opened("")
}

/// As [`writer_and_reader`], the database opened with the URI parameters `query`.
fn opened(query: &str) -> (tempfile::TempDir, Connection, Connection) {
    register().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_URI;
    let uri = format!("file:{}{query}", path.display());
    let writer = Connection::open_with_flags_and_vfs(&uri, flags, VFS).unwrap();
    let mode: String = writer
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    writer.pragma_update(None, "synchronous", "FULL").unwrap();
    writer
        .execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        .unwrap();
    let reader = Connection::open(&path).unwrap();
    (dir, writer, reader)
}

/// What the reader sees of `t`: rows, and the sum of their bodies' lengths.
fn seen(reader: &Connection) -> (i64, i64) {
    reader
        .query_row(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(body)), 0) FROM t",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap()
}

fn integrity(conn: &Connection) -> String {
    conn.query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap()
}

fn insert(writer: &Connection, rows: i64, len: usize) {
    let tx = writer.unchecked_transaction().unwrap();
    for _ in 0..rows {
        tx.execute("INSERT INTO t (body) VALUES (?1)", params!["x".repeat(len)])
            .unwrap();
    }
    tx.commit().unwrap();
}

#[test]
fn a_commits_frames_reach_the_wal_in_one_write_before_another_connection_sees_it() {
    let (_dir, writer, reader) = writer_and_reader();
    insert(&writer, 1, 10);
    let (asked_before, written_before) = wal_writes(&writer).expect("a coalesced WAL");
    // 40 rows of 1,000 bytes: about 10 pages of the table, each frame two writes.
    insert(&writer, 40, 1000);
    let (asked, written) = wal_writes(&writer).unwrap();
    let (asked, written) = (asked - asked_before, written - written_before);
    assert!(asked >= 20, "SQLite asked for {asked} writes");
    assert_eq!(written, 1, "{asked} writes reached the file as {written}");
    // Seen by another connection (its own file handle) as soon as the commit returned.
    assert_eq!(seen(&reader), (41, 40_010));
    for round in 1..=20 {
        insert(&writer, round, 300);
        let (rows, _) = seen(&reader);
        assert_eq!(rows, 41 + (1..=round).sum::<i64>());
    }
    // More than the unix VFS writes at once (128 KiB): in pieces of at most that.
    let (asked_before, written_before) = wal_writes(&writer).unwrap();
    insert(&writer, 400, 1000);
    let (asked, written) = wal_writes(&writer).unwrap();
    let (asked, written) = (asked - asked_before, written - written_before);
    assert!(asked >= 200, "SQLite asked for {asked} writes");
    assert!(
        (3..=6).contains(&written),
        "{asked} writes reached the file as {written}"
    );
    assert_eq!(seen(&reader).0, 41 + 210 + 400);
}

#[test]
fn spilled_rewritten_and_rolled_back_frames_leave_exactly_what_was_committed() {
    let (dir, writer, reader) = writer_and_reader();
    // A cache of 8 pages: a large transaction spills uncommitted frames into the WAL, and
    // writes pages it already wrote there again (SQLite rewrites those frames in place).
    writer.pragma_update(None, "cache_size", 8).unwrap();
    let (asked_before, _) = wal_writes(&writer).unwrap();
    let tx = writer.unchecked_transaction().unwrap();
    for _ in 0..300 {
        tx.execute("INSERT INTO t (body) VALUES (?1)", params!["a".repeat(900)])
            .unwrap();
    }
    let (asked, _) = wal_writes(&tx).unwrap();
    assert!(
        asked > asked_before,
        "the transaction spilled frames into the WAL"
    );
    // Read back, the frames it spilled last (still kept) among them.
    assert_eq!(seen(&tx), (300, 300 * 900));
    tx.execute("UPDATE t SET body = body || 'b'", []).unwrap();
    tx.execute("UPDATE t SET body = substr(body, 2)", [])
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(seen(&reader), (300, 300 * 900));
    // A spilled transaction rolled back leaves nothing, and the next commit is whole.
    let tx = writer.unchecked_transaction().unwrap();
    for _ in 0..300 {
        tx.execute("INSERT INTO t (body) VALUES (?1)", params!["c".repeat(900)])
            .unwrap();
    }
    drop(tx);
    insert(&writer, 5, 100);
    assert_eq!(seen(&reader), (305, 300 * 900 + 500));
    // The WAL written again from its start (a new header) after a checkpoint.
    writer
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    insert(&writer, 3, 2000);
    assert_eq!(seen(&reader), (308, 300 * 900 + 500 + 6000));
    assert_eq!(integrity(&reader), "ok");
    // And all of it is in the files as the writer left them, WAL included, as a crash would
    // leave them: a copy taken while it is open, recovered by SQLite's own VFS.
    let copy = tempfile::tempdir().unwrap();
    for file in ["t.db", "t.db-wal"] {
        std::fs::copy(dir.path().join(file), copy.path().join(file)).unwrap();
    }
    let recovered = Connection::open(copy.path().join("t.db")).unwrap();
    assert_eq!(seen(&recovered), (308, 300 * 900 + 500 + 6000));
    assert_eq!(integrity(&recovered), "ok");
}

#[test]
fn what_a_failed_write_kept_is_written_later_and_the_commit_holds_all_of_it() {
    let (_dir, writer, reader) = writer_and_reader();
    // A trigger: a statement that fails is then undone alone, its transaction kept open.
    writer
        .execute_batch(
            "CREATE TABLE log (x); \
             CREATE TRIGGER logged AFTER INSERT ON t BEGIN INSERT INTO log VALUES (NEW.id); END;",
        )
        .unwrap();
    writer.pragma_update(None, "cache_size", 10).unwrap();
    let tx = writer.unchecked_transaction().unwrap();
    for i in 0..400 {
        tx.execute(
            "INSERT INTO t (body) VALUES (?1)",
            params![format!("{i:04}").repeat(200)],
        )
        .unwrap();
    }
    // Reading spilled frames back writes what is kept first; that write fails (a full disk).
    fail_wal_writes(&tx, 1);
    let failed = tx.execute(
        "INSERT INTO t (body) SELECT body || 'u' FROM t WHERE id IN (3, 150, 390)",
        [],
    );
    assert!(failed.is_err(), "{failed:?}");
    assert!(!tx.is_autocommit(), "SQLite undid the statement alone");
    for i in 0..20 {
        tx.execute(
            "INSERT INTO t (body) VALUES (?1)",
            params![format!("late{i}")],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    // The commit wrote what the failed write kept: every frame it counts is in the file.
    let late: i64 = (0..20).map(|i| format!("late{i}").len() as i64).sum();
    assert_eq!(seen(&reader), (420, 400 * 800 + late));
    assert_eq!(integrity(&reader), "ok");
}

#[test]
fn the_wal_of_a_database_that_is_not_power_safe_is_written_as_sqlite_writes_it() {
    // SQLite pads such a database's commits past their sync, and publishes the padding:
    // nothing may be kept then.
    let (_dir, writer, reader) = opened("?psow=0");
    for round in 1..=5 {
        insert(&writer, 3, 700);
        assert_eq!(seen(&reader), (3 * round, 3 * 700 * round));
    }
    assert_eq!(wal_writes(&writer), None);
}
