//! A real, migrated SQLite database for the operations' unit tests. Each test runs an operation
//! in a transaction of its own and reads back what it wrote through the same primitives: the
//! backend production runs, not a fake that could agree with a wrong operation.

use tempfile::TempDir;

use super::{PolicyTx, Transactions, WriteTx};
use crate::domain::policy::{Rule, RuleSource};
use crate::domain::{
    AgentId, CallId, CallKey, Decision, NewBatch, NewCall, OnDeny, SessionId, Timestamp, ToolInput,
    ToolName, ToolResultTexts, Verdict,
};
use crate::store::{SqliteStore, Synchronous};

/// The agent every call of these tests belongs to.
pub const AGENT: &str = "agent";

pub struct Db {
    dir: TempDir,
    store: SqliteStore,
}

impl Db {
    /// A fresh database file, migrated.
    pub async fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("ops.db");
        let store = SqliteStore::open(&path, Synchronous::Normal, texts(), Some(notary()))
            .await
            .expect("a fresh store");
        Self { dir, store }
    }

    /// A write transaction; dropped without a commit, it rolls back.
    pub async fn tx(&self) -> impl WriteTx + PolicyTx + use<> {
        self.store
            .writer()
            .begin_write()
            .await
            .expect("a write transaction")
    }

    /// The store itself, for its reads (the event log).
    pub fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// Checks that the receipts stored so far are those of session `session`'s calls `ids`, in
    /// that order, each attesting the call as a read of it gives now (its payload's digest,
    /// link for link).
    pub async fn assert_receipts_attest(&self, session: &str, ids: &[&str]) {
        use crate::domain::receipt::{ChainLink, payload, sha256_hex};
        use crate::store::Receipts as _;
        let receipts = self.store().receipts_after(0, 100).await.unwrap();
        assert_eq!(receipts.len(), ids.len());
        let mut tx = self.tx().await;
        let mut previous = None;
        for (receipt, id) in receipts.iter().zip(ids) {
            let verified =
                crate::receipts::verify::receipt(&receipt.envelope, notary().public_key()).unwrap();
            let stored = tx.find_call(&key(session, id)).await.unwrap().unwrap().call;
            assert!(stored.outcome.is_some(), "{id}");
            let link = ChainLink {
                sequence: receipt.sequence,
                previous: previous.clone(),
            };
            let expected = payload(&stored, &link).unwrap();
            assert_eq!(verified.digest, sha256_hex(expected.as_bytes()), "{id}");
            previous = Some(verified.digest);
        }
    }

    /// Runs `sql` on the database file over a connection of its own: for a test that watches
    /// the rows themselves (with a trigger, say), not what the primitives read back.
    pub fn execute_batch(&self, sql: &str) {
        self.connection()
            .execute_batch(sql)
            .expect("the test's SQL runs");
    }

    /// The first column of every row `sql` returns, as text, over a connection of its own.
    pub fn texts(&self, sql: &str) -> Vec<String> {
        let conn = self.connection();
        let mut statement = conn.prepare(sql).expect("the test's query prepares");
        statement
            .query_map([], |row| row.get(0))
            .expect("the test's query runs")
            .collect::<Result<_, _>>()
            .expect("text rows")
    }

    fn connection(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(self.dir.path().join("ops.db")).expect("the database file")
    }

    /// The backend's writer, for operations that open their own transactions.
    pub fn writer(&self) -> &impl Transactions {
        self.store.writer()
    }
}

pub fn texts() -> ToolResultTexts {
    ToolResultTexts::default()
}

/// The key these tests' outcomes are signed with: every operation runs with receipts on, as
/// the broker does by default.
pub fn notary() -> std::sync::Arc<crate::receipts::Notary> {
    std::sync::Arc::new(crate::receipts::Notary::from_seed(&[9; 32]).expect("a seed"))
}

pub fn key(session: &str, call_id: &str) -> CallKey {
    CallKey {
        agent: AgentId::from_stored(AGENT.into()),
        session: SessionId::from_stored(session.into()),
        call_id: CallId::from_stored(call_id.into()),
    }
}

/// A call of `tool` carrying every field a person is shown and a receipt attests (title with a
/// hidden character, message, workspace, a deadline a minute after `now`, who it acts for).
pub fn shown_call(call_id: &str, tool: &str, now: Timestamp) -> NewCall {
    NewCall {
        title: "List \u{200b}it".into(),
        message: "why: because".into(),
        workspace: "/w".into(),
        deadline: Some(Timestamp::from_micros(now.as_micros() + 60_000_000)),
        requested_by: "carol".into(),
        ..call(call_id, tool, r#"{"n":[1,2],"path":"/tmp"}"#)
    }
}

/// A call of `tool` with `input` (JSON text, already canonical).
pub fn call(call_id: &str, tool: &str, input: &str) -> NewCall {
    NewCall {
        host: None,
        index: 0,
        path: String::new(),
        call_id: CallId::from_stored(call_id.into()),
        tool: ToolName::from_stored(tool.into()),
        input: ToolInput::from_stored(input.into()),
        title: String::new(),
        message: String::new(),
        workspace: String::new(),
        supersede_key: None,
        requested_by: String::new(),
        deadline: None,
        prejudged: Default::default(),
    }
}

/// A batch of `calls` in `session`, indexed in order.
pub fn batch(session: &str, calls: impl IntoIterator<Item = NewCall>) -> NewBatch {
    let calls = calls
        .into_iter()
        .enumerate()
        .map(|(i, call)| NewCall {
            index: i as u32,
            path: format!("batch.calls[{i}]"),
            ..call
        })
        .collect();
    NewBatch {
        agent: AgentId::from_stored(AGENT.into()),
        session: SessionId::from_stored(session.into()),
        on_deny: OnDeny::default(),
        supersede_pending: false,
        calls,
        pending_cap: None,
        default_escalation: None,
        default_approvers: None,
    }
}

/// An approver's decision, remembered once.
pub fn decision(verdict: Verdict, reason: &str) -> Decision {
    Decision {
        verdict,
        reason: reason.into(),
        edited_input: None,
        approver: "approver".into(),
        approver_groups: None,
        viewer: crate::domain::Viewer::Operator,
        remember: None,
        responds: false,
        prejudged: Default::default(),
        passkey: None,
    }
}

/// A rule for `tool` (a glob) with `effect` (`allow`, `deny` or `ask`), matching any input, as
/// CreateRule makes it (an operator's, not a policy file's).
pub fn rule(id: &str, tool: &str, effect: &str) -> Rule {
    let json = serde_json::json!({"id": id, "tool": tool, "effect": effect});
    Rule {
        approvers: None,
        source: RuleSource::Admin,
        ..Rule::from_json(&json, 1 << 20, Timestamp::now()).expect("a valid rule")
    }
}
