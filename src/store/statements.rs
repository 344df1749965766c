//! The SQL text both backends run, written once. Parameters are numbered (`$1`, `$2`, ...):
//! Postgres reads them as its own, sqlx's SQLite driver reads `$N` as argument N, and SQLite
//! itself (rusqlite, on the writer thread) numbers a named parameter by its first appearance, so
//! every statement here names its parameters in increasing order the first time it uses each
//! (a test prepares every statement on SQLite and checks). Status, event kind and scope codes
//! are spliced in as literals with `code!`, so the partial indexes (`WHERE status = 1`) apply.
//!
//! What only one backend runs (Postgres's locks and sequencer, SQLite's pragmas) stays in that
//! backend's file, except the writes of an approval cycle, which the benchmark's raw baseline
//! (`approval-bench`) makes with these very statements; where a statement differs only in part,
//! the shared part is here and says why the other part differs. Nothing here may use syntax one of the two databases lacks
//! (no `ANY($1)` arrays, no `?` placeholders, no `::` casts).

use crate::domain::policy::GrantScope;
use crate::domain::policy::RevokeTarget;
use crate::domain::{AgentId, code};

/// The columns `rows::call_from_row` reads, from `calls c` joined with its batch `b`.
///
/// The call's Resolved event is a subquery, not a join: it runs once per row returned, through
/// the `events_call` index, whatever the plan around it. As a `LEFT JOIN`, a plan made before
/// the tables had statistics (a young database before autovacuum's first `ANALYZE`, or one whose
/// server runs without autovacuum) scanned every Resolved event into memory for each read; the
/// log connections keep the plan of their first read (`store::postgres`) until statistics
/// arrive, and that read grew with the log (`EXPLAIN ANALYZE` in docs/benchmarks-notes.md). SQLite
/// plans both forms alike.
macro_rules! call_columns {
    () => {
        concat!(
            "c.id, c.agent, c.session_id, c.call_id, c.batch_id, c.position, b.size, c.tool, \
             c.input, c.title, c.message, c.workspace, c.supersede_key, c.deadline, \
             c.created_at, c.status, c.decided_at, c.decided_by, c.reason, c.tool_result, \
             c.run_input, c.input_edited, \
             (SELECT r.seq FROM events r WHERE r.call_rowid = c.id AND r.kind = ",
            $crate::domain::code!(EventKind::Resolved),
            ") AS resolved_seq, c.escalation, c.next_step, c.next_step_at, c.requested_by, \
             c.requirement, c.votes, c.host"
        )
    };
}

/// `SELECT` of every call column, followed by the given clauses.
macro_rules! select_calls {
    ($($rest:expr),*) => {
        concat!(
            "SELECT ", $crate::store::statements::call_columns!(),
            " FROM calls c JOIN batches b ON b.batch_id = c.batch_id ",
            $($rest),*
        )
    };
}

/// The columns `rows::grant_from_row` reads.
macro_rules! grant_columns {
    () => {
        "id, agent, scope, session_id, workspace, tool, matcher, effect, created_by, created_at, \
         expires_at, revoked_at, revoked_by, source_session, source_call, reason, authors, kind"
    };
}

/// `SELECT` of every grant column, followed by the given clauses.
macro_rules! select_grants {
    ($($rest:expr),*) => {
        concat!("SELECT ", $crate::store::statements::grant_columns!(), " FROM grants ", $($rest),*)
    };
}

/// `SELECT` of every rule column (`rows::rule_from_row` reads them), followed by the given
/// clauses.
macro_rules! select_rules {
    ($($rest:expr),*) => {
        concat!(
            "SELECT id, tool, matcher, effect, priority, description, source, created_at, mode, \
             escalation, approvers, kind FROM rules ",
            $($rest),*
        )
    };
}

/// A new call, unless its (agent, session, call id) is stored already; returns its row id.
/// Postgres wraps it to write the Requested event in the same statement; on SQLite the trigger
/// `calls_requested_event` (migration 0004) writes it. Pending, or with the outcome columns
/// given after the fifteen (see [`INSERT_DECIDED_CALL`]). `$14`: who the agent acts for
/// (`NULL`: nobody named), stored with every call, decided at submit or not; `$15` its host
/// (`NULL`: none named).
macro_rules! insert_call {
    () => {
        insert_call!("", "")
    };
    ($columns:literal, $values:literal) => {
        concat!(
            "INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, input, title, \
             message, workspace, supersede_key, deadline, created_at, requested_by, host",
            $columns,
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15",
            $values,
            ") ON CONFLICT (session_id, agent, call_id) DO NOTHING RETURNING id"
        )
    };
}

/// [`insert_call`] of a call a rule or grant decided as it arrived, with its outcome: the
/// columns [`resolve_call`] sets, in its order, as `$16` to `$22`.
macro_rules! insert_decided_call {
    () => {
        insert_call!(
            ", status, decided_at, decided_by, reason, tool_result, run_input, input_edited",
            ", $16, $17, $18, $19, $20, $21, $22"
        )
    };
}

/// A pending call's outcome; returns its batch id, nothing if the call was decided already
/// (first decision wins). Postgres wraps it to write the Resolved event in the same statement.
macro_rules! resolve_call {
    () => {
        concat!(
            "UPDATE calls SET status = $1, decided_at = $2, decided_by = $3, reason = $4, \
             tool_result = $5, run_input = $6, input_edited = $7 \
             WHERE id = $8 AND status = ",
            $crate::domain::code!(Status::Pending),
            " RETURNING batch_id"
        )
    };
}

/// Marks an event as the one that completed its batch if no call of the batch is pending. The
/// event is named by `$event` = `$1`: SQLite's `seq` is the event's row id; Postgres's events have
/// an `id` from the start and a `seq` only once the sequencer numbers them after commit.
macro_rules! complete_batch_if_done {
    ($event:literal) => {
        concat!(
            "UPDATE events SET batch_completed = TRUE WHERE ",
            $event,
            " = $1 AND NOT EXISTS (SELECT 1 FROM calls WHERE batch_id = $2 AND status = ",
            $crate::domain::code!(Status::Pending),
            ")"
        )
    };
}

pub(crate) use {call_columns, grant_columns, select_calls, select_grants};

/// `WHERE ... status = <pending>`, spliced.
macro_rules! pending {
    () => {
        code!(Status::Pending)
    };
}

pub const PENDING_COUNT: &str = concat!(
    "SELECT COUNT(*) AS n FROM calls WHERE status = ",
    pending!()
);
pub const NEXT_DEADLINE: &str = concat!(
    "SELECT MIN(deadline) AS next FROM calls WHERE status = ",
    pending!(),
    " AND deadline IS NOT NULL"
);
/// The last sequence number given: the log's last event, or the pruned horizon when retention
/// took every event up to it (numbering continues after both).
pub const LATEST_SEQ: &str = "SELECT MAX(seq) AS seq FROM (SELECT MAX(seq) AS seq FROM events \
     UNION ALL SELECT pruned_through AS seq FROM retention) AS heads";

/// The events after sequence number `$1`, with their calls, oldest first, at most `$2` of them;
/// each row with the retention horizon (`pruned_through`) in the same snapshot, so a reader
/// checks for a gap without a read of its own. `$receipts`: the receipt columns and their join.
macro_rules! events_after {
    ($($receipts:expr),*) => {
        concat!(
            "SELECT e.seq, e.kind, e.batch_completed, e.step, ",
            "(SELECT pruned_through FROM retention) AS pruned_through, ",
            call_columns!(),
            $($receipts,)*
            " WHERE e.seq > $1 ORDER BY e.seq LIMIT $2"
        )
    };
}

/// The log's events (see `events_after!`), a Resolved one with its call's receipt (`rr`, see
/// `rows::sealed_from_row`; written in the outcome's transaction, so there by any commit that
/// logged the event), so every outcome the feed delivers carries it. A call row has one
/// receipt at most (one outcome; a pruned call's receipts are unlinked from its row).
pub const EVENTS_AFTER: &str = events_after!(
    ", rr.envelope AS receipt_envelope, rr.payload AS receipt_payload, \
     rr.keyid AS receipt_keyid, rr.sig AS receipt_sig \
     FROM events e JOIN calls c ON c.id = e.call_rowid \
     JOIN batches b ON b.batch_id = c.batch_id \
     LEFT JOIN receipts rr ON rr.call_row = c.id AND e.kind = ",
    crate::domain::code!(EventKind::Resolved)
);

/// [`EVENTS_AFTER`] without the receipts: SQLite's writer reads back the events it just
/// committed, and gives each outcome the receipt it has in memory.
pub const EVENTS_AFTER_UNSEALED: &str = events_after!(
    " FROM events e JOIN calls c ON c.id = e.call_rowid \
     JOIN batches b ON b.batch_id = c.batch_id"
);

/// A batch's calls in order, each decided one with its receipt (as [`EVENTS_AFTER`] reads it):
/// read to tell an agent its batch is complete, every outcome with its receipt.
pub const BATCH_CALLS: &str = concat!(
    "SELECT ",
    call_columns!(),
    ", rr.envelope AS receipt_envelope, rr.payload AS receipt_payload, \
     rr.keyid AS receipt_keyid, rr.sig AS receipt_sig \
     FROM calls c JOIN batches b ON b.batch_id = c.batch_id \
     LEFT JOIN receipts rr ON rr.call_row = c.id \
     WHERE c.batch_id = $1 ORDER BY c.position"
);
pub const FIND_CALL: &str =
    select_calls!("WHERE c.agent = $1 AND c.session_id = $2 AND c.call_id = $3");
/// Postgres: [`FIND_CALL`], locking the found call's batch row as `lock_batches` locks it.
pub const FIND_CALL_LOCKING_BATCH: &str = select_calls!(
    "WHERE c.agent = $1 AND c.session_id = $2 AND c.call_id = $3 FOR NO KEY UPDATE OF b"
);
pub const LOAD_CALL: &str = select_calls!("WHERE c.id = $1");
/// Postgres: an approval of call (`$1`, `$2`, `$3`) that the gate admitted, in one statement
/// (migration 0022's `approve_call`, given the outcome's time, decider, reason, edited input or
/// NULL, and whether edited): its `call_row` (NULL: no such call) and `resolved_event` (NULL:
/// nothing written), with the call's columns as the statement's snapshot holds them, taken
/// before the function ran (NULL if the call was not committed then).
pub const APPROVE_CALL: &str = concat!(
    "SELECT ",
    call_columns!(),
    ", a.call_row, a.resolved_event \
     FROM approve_call($1, $2, $3, $4, $5, $6, $7, $8) AS a \
     LEFT JOIN (calls c JOIN batches b ON b.batch_id = c.batch_id) ON c.id = a.call_row"
);
pub const CALLS_OF_BATCH: &str = select_calls!(
    "WHERE c.batch_id = $1 AND c.agent = $2 AND c.session_id = $3 ORDER BY c.position"
);
pub const PENDING_IN_SESSION: &str = select_calls!(
    "WHERE c.agent = $1 AND c.session_id = $2 AND c.status = ",
    pending!(),
    " ORDER BY c.id"
);

pub const INSERT_BATCH: &str = "INSERT INTO batches \
     (batch_id, agent, session_id, on_deny, size, created_at) VALUES ($1, $2, $3, $4, $5, $6)";
pub const DELETE_BATCH: &str = "DELETE FROM batches WHERE batch_id = $1";
pub const RESIZE_BATCH: &str = "UPDATE batches SET size = $1 WHERE batch_id = $2";
pub const INSERT_CALL: &str = insert_call!();
/// A call stored decided: a rule or grant decided it as it arrived, so it never enters the
/// pending calls' indexes only to leave them in the same transaction (fewer pages per commit).
pub const INSERT_DECIDED_CALL: &str = insert_decided_call!();
pub const RESOLVE_CALL: &str = resolve_call!();
/// Postgres: an insert of a call (`$13` its time) and the call's Requested event, in one
/// statement (one round trip). On SQLite the trigger writes that event (and records its `seq` on
/// the call); on Postgres a trigger would gain nothing, the event's `seq` being given after
/// commit.
macro_rules! with_requested_event {
    ($insert:expr) => {
        with_requested_event!("", $insert)
    };
    ($before:expr, $insert:expr) => {
        concat!(
            "WITH ",
            $before,
            "call AS (",
            $insert,
            "), event AS (INSERT INTO events (kind, call_rowid, created_at) SELECT ",
            code!(EventKind::Requested),
            ", id, $13 FROM call) SELECT id FROM call"
        )
    };
}
/// Postgres: [`INSERT_CALL`] and the call's Requested event, in one statement.
pub const INSERT_CALL_AND_EVENT: &str = with_requested_event!(insert_call!());
/// Postgres: [`INSERT_DECIDED_CALL`] and the call's Requested event, in one statement.
pub const INSERT_DECIDED_CALL_AND_EVENT: &str = with_requested_event!(insert_decided_call!());
/// The call's new batch, as a `WITH` clause before the call's insert: its id (`$4`), agent
/// (`$1`), session (`$2`) and time (`$13`) are the call's, its `on_deny` and `size` the given
/// parameters. The call's foreign key is checked at the statement's end, after the batch's
/// insert.
macro_rules! new_batch {
    ($on_deny:literal, $size:literal) => {
        concat!(
            "batch AS (INSERT INTO batches (batch_id, agent, session_id, on_deny, size, \
             created_at) VALUES ($4, $1, $2, ",
            $on_deny,
            ", ",
            $size,
            ", $13)), "
        )
    };
}
/// Postgres: [`INSERT_CALL_AND_EVENT`] of the first call of a new batch, and the batch (its
/// `on_deny` `$16`, its `size` `$17`), in one statement.
pub const INSERT_BATCH_CALL_AND_EVENT: &str =
    with_requested_event!(new_batch!("$16", "$17"), insert_call!());
/// Postgres: [`INSERT_DECIDED_CALL_AND_EVENT`] of the first call of a new batch, and the batch
/// (its `on_deny` `$23`, its `size` `$24`), in one statement.
pub const INSERT_BATCH_DECIDED_CALL_AND_EVENT: &str =
    with_requested_event!(new_batch!("$23", "$24"), insert_decided_call!());
/// Postgres: [`RESOLVE_CALL`] and the call's Resolved event, in one statement (one round trip);
/// returns the batch id and the event's `id`. SQLite runs the two statements: it has no
/// data-modifying `WITH`, and a statement costs it no round trip.
pub const RESOLVE_CALL_AND_EVENT: &str = concat!(
    "WITH call AS (",
    resolve_call!(),
    "), event AS (INSERT INTO events (kind, call_rowid, created_at) SELECT ",
    code!(EventKind::Resolved),
    ", $8, $2 FROM call RETURNING id) SELECT call.batch_id, event.id FROM call, event"
);
/// Postgres: [`RESOLVE_CALL_AND_EVENT`] for the last call a transaction resolves in its batch:
/// the event is also flagged as completing the batch if no other call of it is pending, what
/// [`COMPLETE_BATCH_AT_ID`] would do after it, in the same round trip. The batch is locked
/// (`lock_batches`) before this statement, whose snapshot sees every transaction that resolved a
/// call of it before, and this one's earlier statements; the call it resolves is still pending
/// in that snapshot, hence `id <> $8`.
pub const RESOLVE_CALL_COMPLETING_AND_EVENT: &str = concat!(
    "WITH call AS (",
    resolve_call!(),
    "), event AS (INSERT INTO events (kind, call_rowid, created_at, batch_completed) SELECT ",
    code!(EventKind::Resolved),
    ", $8, $2, NOT EXISTS (SELECT 1 FROM calls o WHERE o.batch_id = call.batch_id AND o.id <> $8 \
     AND o.status = ",
    pending!(),
    ") FROM call RETURNING id) SELECT call.batch_id, event.id FROM call, event"
);
/// SQLite: an event of kind `$1` for call row `$2` at `$3`; returns its sequence number (its
/// row id: SQLite's writers are serialised, so row ids follow commit order) as `event`.
pub const APPEND_EVENT: &str =
    "INSERT INTO events (kind, call_rowid, created_at) VALUES ($1, $2, $3) RETURNING seq AS event";
/// Postgres: [`APPEND_EVENT`], returning the event's `id` as `event` (its `seq` is given after
/// commit, by the sequencer).
pub const APPEND_EVENT_AT_ID: &str =
    "INSERT INTO events (kind, call_rowid, created_at) VALUES ($1, $2, $3) RETURNING id AS event";
/// SQLite's [`complete_batch_if_done`]: `$1` is the Resolved event's `seq`.
pub const COMPLETE_BATCH_AT_SEQ: &str = complete_batch_if_done!("seq");
/// Postgres's [`complete_batch_if_done`]: `$1` is the Resolved event's `id`.
pub const COMPLETE_BATCH_AT_ID: &str = complete_batch_if_done!("id");

/// The requirement (`$1`) fixed on call row `$2` at submit.
pub const ROUTE_CALL: &str = "UPDATE calls SET requirement = $1 WHERE id = $2";
/// The votes (`$1`, JSON) recorded on pending call row `$2`; nothing if it was decided.
pub const RECORD_VOTES: &str = concat!(
    "UPDATE calls SET votes = $1 WHERE id = $2 AND status = ",
    pending!()
);
/// An event of kind `$1` for call row `$2` at `$3`, numbered as every event is (SQLite: its
/// row id; Postgres: by the sequencer after commit).
pub const RECORD_EVENT: &str =
    "INSERT INTO events (kind, call_rowid, created_at) VALUES ($1, $2, $3)";

/// How many calls of agent `$1` are pending, counting to `$2` at most.
pub const PENDING_OF_AGENT: &str = concat!(
    "SELECT COUNT(*) AS n FROM (SELECT 1 FROM calls WHERE agent = $1 AND status = ",
    pending!(),
    " LIMIT $2) AS pending"
);
pub const PENDING_WITH_KEY: &str = concat!(
    "SELECT id FROM calls WHERE agent = $1 AND session_id = $2 AND supersede_key = $3 \
     AND status = ",
    pending!(),
    " ORDER BY id"
);
/// Read through the index `calls_pending_batch` (migration 0005), as is
/// [`COMPLETE_BATCH_AT_SEQ`], never by walking every pending call of the store; a test checks
/// the plans.
pub const PENDING_IN_BATCH: &str = concat!(
    "SELECT id FROM calls WHERE batch_id = $1 AND status = ",
    pending!(),
    " ORDER BY position"
);
pub const ON_DENY: &str = "SELECT on_deny FROM batches WHERE batch_id = $1";
/// Pending calls whose deadline is at or before `$1`, earliest first, at most `$2`.
pub const DUE_CALLS: &str = concat!(
    "SELECT id, batch_id FROM calls WHERE status = ",
    pending!(),
    " AND deadline IS NOT NULL AND deadline <= $1 ORDER BY deadline LIMIT $2"
);

/// Starts a pending call's escalation: its ladder `$1` (`Ladder::to_stored`), none fired, the
/// first step due at `$2` (NULL: none before the deadline), for call row `$3`.
pub const START_ESCALATION: &str = concat!(
    "UPDATE calls SET escalation = $1, next_step = 0, next_step_at = $2 WHERE id = $3 \
     AND status = ",
    pending!()
);
/// Records that step `$4` of call row `$3` fired: `$1` steps fired, the next due at `$2` (NULL:
/// none left). Conditional on the call still pending with that step next, so of two replicas
/// (or a sweep racing a decision) exactly one fires a step, and never for a decided call.
pub const ADVANCE_ESCALATION: &str = concat!(
    "UPDATE calls SET next_step = $1, next_step_at = $2 WHERE id = $3 AND next_step = $4 \
     AND status = ",
    pending!()
);
/// Pending calls with a step due at or before `$1`, earliest first, at most `$2`. Read through
/// the partial index `calls_step_due` (migrations: sqlite 0007, postgres 0004).
pub const DUE_STEPS: &str = select_calls!(
    "WHERE c.status = ",
    pending!(),
    " AND c.next_step_at IS NOT NULL AND c.next_step_at <= $1 ORDER BY c.next_step_at LIMIT $2"
);
pub const NEXT_STEP_DUE: &str = concat!(
    "SELECT MIN(next_step_at) AS next FROM calls WHERE status = ",
    pending!(),
    " AND next_step_at IS NOT NULL"
);
/// A fired step's event: kind `$1` for call row `$2` at `$3`, step index `$4`. Both backends:
/// SQLite's `seq` is its row id, Postgres's sequencer numbers it after commit.
pub const APPEND_STEP_EVENT: &str =
    "INSERT INTO events (kind, call_rowid, created_at, step) VALUES ($1, $2, $3, $4)";

/// The pending calls of agent `$1` for tool `$2` that a new grant's scope covers: with the scope's
/// value as `$3` (session or workspace), or every one (`Always`).
pub const PENDING_IN_SESSION_SCOPE: &str = select_calls!(
    "WHERE c.agent = $1 AND c.tool = $2 AND c.status = ",
    pending!(),
    " AND c.session_id = $3 ORDER BY c.id"
);
pub const PENDING_IN_WORKSPACE_SCOPE: &str = select_calls!(
    "WHERE c.agent = $1 AND c.tool = $2 AND c.status = ",
    pending!(),
    " AND c.workspace = $3 ORDER BY c.id"
);
pub const PENDING_IN_ALWAYS_SCOPE: &str = select_calls!(
    "WHERE c.agent = $1 AND c.tool = $2 AND c.status = ",
    pending!(),
    " ORDER BY c.id"
);
/// The pending calls a grant of an action kind may cover: agent `$1`'s calls from any host
/// (whatever their tool; the grant's matcher judges their action), in session (or workspace)
/// `$2`.
pub const PENDING_HOST_CALLS_IN_SESSION_SCOPE: &str = select_calls!(
    "WHERE c.agent = $1 AND c.host IS NOT NULL AND c.status = ",
    pending!(),
    " AND c.session_id = $2 ORDER BY c.id"
);
pub const PENDING_HOST_CALLS_IN_WORKSPACE_SCOPE: &str = select_calls!(
    "WHERE c.agent = $1 AND c.host IS NOT NULL AND c.status = ",
    pending!(),
    " AND c.workspace = $2 ORDER BY c.id"
);
pub const PENDING_HOST_CALLS_IN_ALWAYS_SCOPE: &str = select_calls!(
    "WHERE c.agent = $1 AND c.host IS NOT NULL AND c.status = ",
    pending!(),
    " ORDER BY c.id"
);

pub const RULES: &str = select_rules!();
pub const FIND_RULE: &str = select_rules!("WHERE id = $1");
/// A rule, unless one with its id exists.
pub const INSERT_RULE: &str = "INSERT INTO rules \
     (id, tool, matcher, effect, priority, description, source, created_at, mode, escalation, \
     kind) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (id) DO NOTHING";
/// Rule `$2`'s mode becomes `$1`.
pub const SET_RULE_MODE: &str = "UPDATE rules SET mode = $1 WHERE id = $2";
/// What shadow rule `$2` would have done (`$3`) with call row `$1`, recorded at its submit.
pub const INSERT_SHADOW_VERDICT: &str = "INSERT INTO shadow_verdicts (call_rowid, rule_id, \
     verdict) VALUES ($1, $2, $3) ON CONFLICT (call_rowid, rule_id) DO NOTHING";
/// The shadow verdicts recorded for call (`$1` agent, `$2` session, `$3` call id), by rule id.
pub const SHADOW_VERDICTS_OF_CALL: &str = "SELECT v.rule_id, v.verdict FROM shadow_verdicts v \
     JOIN calls c ON c.id = v.call_rowid \
     WHERE c.agent = $1 AND c.session_id = $2 AND c.call_id = $3 ORDER BY v.rule_id";
/// An ask rule's `approvers` (`$1`, JSON), written after [`INSERT_RULE`] stored rule `$2`.
pub const SET_RULE_APPROVERS: &str = "UPDATE rules SET approvers = $1 WHERE id = $2";
pub const DELETE_RULE: &str = "DELETE FROM rules WHERE id = $1";
/// Every rule loaded from source `$1` (a policy file).
pub const DELETE_RULES_FROM: &str = "DELETE FROM rules WHERE source = $1";

pub const INSERT_GRANT: &str = "INSERT INTO grants \
     (agent, scope, session_id, workspace, tool, matcher, effect, created_by, created_at, \
     expires_at, source_session, source_call, reason, authors, kind) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) RETURNING id";
/// The latest grant the decision of call ($1, $2, $3) created.
pub const GRANT_FROM_CALL: &str = select_grants!(
    "WHERE agent = $1 AND source_session = $2 AND source_call = $3 ORDER BY id DESC LIMIT 1"
);
pub const GRANT_BY_ID: &str = select_grants!("WHERE id = $1");
/// Agent `$1`'s grants of one scope for session (or workspace) `$2`, active at `$3`.
pub const ACTIVE_SESSION_GRANTS: &str = select_grants!(
    "WHERE agent = $1 AND scope = ",
    code!(Scope::Session),
    " AND session_id = $2 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $3) \
     ORDER BY id"
);
pub const ACTIVE_WORKSPACE_GRANTS: &str = select_grants!(
    "WHERE agent = $1 AND scope = ",
    code!(Scope::Workspace),
    " AND workspace = $2 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $3) \
     ORDER BY id"
);

/// Retention: decided calls decided before `$1`, after the walk's position (`$2` decided at, `$3`
/// row id), oldest decision first, at most `$4`; through the index `calls_decided_at`.
pub const PRUNE_CANDIDATES: &str = concat!(
    "SELECT id, decided_at, batch_id FROM calls WHERE status <> ",
    pending!(),
    " AND decided_at < $1 AND (decided_at > $2 OR (decided_at = $2 AND id > $3)) \
     ORDER BY decided_at, id LIMIT $4"
);
/// How far pruning may reach into the log: up to its last event (numbering continues after the
/// pruned horizon, raised in the same transaction, so even the last may go) and the lowest
/// webhook cursor (events an endpoint has not delivered are kept).
pub const PRUNE_BOUND: &str = "SELECT (SELECT MAX(seq) FROM events) AS latest, \
     (SELECT MIN(cursor) FROM webhooks) AS delivered";
/// The last sequence number of batch `$1`'s events, if the whole batch may be pruned: every
/// call decided before `$2`, and every event numbered, at or below `$3`. No row otherwise.
pub const PRUNABLE_BATCH: &str = concat!(
    "SELECT MAX(e.seq) AS last_seq FROM calls c LEFT JOIN events e ON e.call_rowid = c.id \
     WHERE c.batch_id = $1 HAVING SUM(CASE WHEN c.status = ",
    pending!(),
    " OR c.decided_at >= $2 OR e.seq IS NULL OR e.seq > $3 THEN 1 ELSE 0 END) = 0"
);
pub const PRUNE_EVENTS_OF_BATCH: &str =
    "DELETE FROM events WHERE call_rowid IN (SELECT id FROM calls WHERE batch_id = $1)";
pub const PRUNE_CALLS_OF_BATCH: &str = "DELETE FROM calls WHERE batch_id = $1";
/// The Slack messages of batch `$1`'s calls, pruned with them (a batch's calls share its agent
/// and session: the key's first two columns).
pub const PRUNE_SLACK_MESSAGES_OF_BATCH: &str = "DELETE FROM slack_messages \
     WHERE agent = (SELECT agent FROM batches WHERE batch_id = $1) \
     AND session_id = (SELECT session_id FROM batches WHERE batch_id = $1) \
     AND call_id IN (SELECT call_id FROM calls WHERE batch_id = $1)";
/// Raises the pruned horizon to `$1` (never lowers it).
pub const ADVANCE_PRUNED_THROUGH: &str =
    "UPDATE retention SET pruned_through = $1 WHERE pruned_through < $1";
pub const PRUNED_THROUGH: &str = "SELECT pruned_through FROM retention";

/// The statement reading the pending calls a new grant of `scope` covers (`$1` agent, `$2`
/// tool), and the scope's value it takes as `$3` (none for `Always`); for a grant of an action
/// kind (`by_kind`), every host call's (`$1` agent, the scope's value `$2`).
pub fn pending_in_scope(scope: &GrantScope, by_kind: bool) -> (&'static str, Option<&str>) {
    match (scope, by_kind) {
        (GrantScope::Session(session), false) => (PENDING_IN_SESSION_SCOPE, Some(session.as_str())),
        (GrantScope::Session(session), true) => {
            (PENDING_HOST_CALLS_IN_SESSION_SCOPE, Some(session.as_str()))
        }
        (GrantScope::Workspace(workspace), false) => (PENDING_IN_WORKSPACE_SCOPE, Some(workspace)),
        (GrantScope::Workspace(workspace), true) => {
            (PENDING_HOST_CALLS_IN_WORKSPACE_SCOPE, Some(workspace))
        }
        (GrantScope::Always, false) => (PENDING_IN_ALWAYS_SCOPE, None),
        (GrantScope::Always, true) => (PENDING_HOST_CALLS_IN_ALWAYS_SCOPE, None),
    }
}

/// How to read the grants a revocation names.
pub enum GrantsNamed<'a> {
    /// [`GRANT_BY_ID`], active or not.
    Id(i64),
    /// This statement, with the agent (`$1`) and the session or workspace (`$2`); `$3` is now.
    Active(&'static str, &'a AgentId, &'a str),
}

pub fn grants_named(target: &RevokeTarget) -> GrantsNamed<'_> {
    match target {
        RevokeTarget::Id(id) => GrantsNamed::Id(*id),
        RevokeTarget::Session(agent, session) => {
            GrantsNamed::Active(ACTIVE_SESSION_GRANTS, agent, session.as_str())
        }
        RevokeTarget::Workspace(agent, workspace) => {
            GrantsNamed::Active(ACTIVE_WORKSPACE_GRANTS, agent, workspace)
        }
    }
}

/// The policy version (migrations sqlite 0013, postgres 0010): moved by every change to rules or
/// grants, in its transaction (see `policy_cache`).
pub const POLICY_VERSION: &str = "SELECT version FROM policy_version";
/// Agent `$2`'s grants active at `$1`, for every tool: what the policy cache keeps of an agent.
pub const AGENT_GRANTS: &str = select_grants!(
    "WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1) AND agent = $2 ORDER BY id"
);
/// [`AGENT_GRANTS`], and of session grants only those of session `$3`.
pub const AGENT_SESSION_GRANTS: &str = select_grants!(
    "WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1) AND agent = $2 \
     AND (session_id IS NULL OR session_id = $3) ORDER BY id"
);

/// Agent `$2`'s grants active at `$1` for any of `tools` tools (`$3`...) or for an action
/// kind (any tool), and, given a session, only those of that session or of no session, oldest
/// first.
pub fn live_grants(tools: usize, session: bool) -> String {
    let mut sql = format!(
        "{} AND (tool IN ({}) OR kind IS NOT NULL)",
        select_grants!(
            "WHERE revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $1) AND agent = $2"
        ),
        numbered(3, tools)
    );
    if session {
        sql.push_str(&format!(
            " AND (session_id IS NULL OR session_id = ${})",
            3 + tools
        ));
    }
    sql.push_str(" ORDER BY id");
    sql
}

/// Revokes, at `$1` by `$2`, the `ids` grants (`$3`...) not revoked yet; returns them.
pub fn revoke(ids: usize) -> String {
    format!(
        "UPDATE grants SET revoked_at = $1, revoked_by = $2 \
         WHERE revoked_at IS NULL AND id IN ({}) RETURNING {}",
        numbered(3, ids),
        grant_columns!()
    )
}

/// `$first, $first+1, ...`: `n` parameters for an `IN` list (neither backend shares arrays).
fn numbered(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use testkit::Schema;

    use super::*;

    /// Every statement above and its number of parameters (dynamic ones with a few values).
    fn every_statement() -> Vec<(String, usize)> {
        let fixed = [
            (PENDING_COUNT, 0),
            (NEXT_DEADLINE, 0),
            (LATEST_SEQ, 0),
            (EVENTS_AFTER, 2),
            (EVENTS_AFTER_UNSEALED, 2),
            (BATCH_CALLS, 1),
            (FIND_CALL, 3),
            (LOAD_CALL, 1),
            (CALLS_OF_BATCH, 3),
            (PENDING_IN_SESSION, 2),
            (INSERT_BATCH, 6),
            (DELETE_BATCH, 1),
            (RESIZE_BATCH, 2),
            (INSERT_CALL, 15),
            (INSERT_DECIDED_CALL, 22),
            (RESOLVE_CALL, 8),
            (COMPLETE_BATCH_AT_SEQ, 2),
            (APPEND_EVENT, 3),
            (PENDING_OF_AGENT, 2),
            (PENDING_WITH_KEY, 3),
            (PENDING_IN_BATCH, 1),
            (ON_DENY, 1),
            (DUE_CALLS, 2),
            (PENDING_IN_SESSION_SCOPE, 3),
            (PENDING_IN_WORKSPACE_SCOPE, 3),
            (PENDING_IN_ALWAYS_SCOPE, 2),
            (PENDING_HOST_CALLS_IN_SESSION_SCOPE, 2),
            (PENDING_HOST_CALLS_IN_WORKSPACE_SCOPE, 2),
            (PENDING_HOST_CALLS_IN_ALWAYS_SCOPE, 1),
            (RULES, 0),
            (FIND_RULE, 1),
            (INSERT_RULE, 11),
            (SET_RULE_MODE, 2),
            (INSERT_SHADOW_VERDICT, 3),
            (SHADOW_VERDICTS_OF_CALL, 3),
            (START_ESCALATION, 3),
            (ADVANCE_ESCALATION, 4),
            (DUE_STEPS, 2),
            (NEXT_STEP_DUE, 0),
            (APPEND_STEP_EVENT, 4),
            (SET_RULE_APPROVERS, 2),
            (ROUTE_CALL, 2),
            (RECORD_VOTES, 2),
            (RECORD_EVENT, 3),
            (DELETE_RULE, 1),
            (DELETE_RULES_FROM, 1),
            (INSERT_GRANT, 15),
            (GRANT_FROM_CALL, 3),
            (GRANT_BY_ID, 1),
            (ACTIVE_SESSION_GRANTS, 3),
            (ACTIVE_WORKSPACE_GRANTS, 3),
            (PRUNE_CANDIDATES, 4),
            (PRUNE_BOUND, 0),
            (PRUNABLE_BATCH, 3),
            (PRUNE_EVENTS_OF_BATCH, 1),
            (PRUNE_CALLS_OF_BATCH, 1),
            (PRUNE_SLACK_MESSAGES_OF_BATCH, 1),
            (ADVANCE_PRUNED_THROUGH, 1),
            (PRUNED_THROUGH, 0),
            (POLICY_VERSION, 0),
            (AGENT_GRANTS, 2),
            (AGENT_SESSION_GRANTS, 3),
        ];
        let mut all: Vec<(String, usize)> =
            fixed.iter().map(|(sql, n)| (sql.to_string(), *n)).collect();
        for n in [1, 3] {
            all.push((live_grants(n, false), 2 + n));
            all.push((live_grants(n, true), 3 + n));
            all.push((revoke(n), 2 + n));
        }
        all
    }

    /// SQLite numbers `$N` by first appearance: each statement must name `$1`, `$2`, ... in
    /// that order, or rusqlite's positional parameters would land in the wrong places. Prepared
    /// on the real schema, so every statement is also valid SQLite.
    #[tokio::test]
    async fn every_statement_prepares_on_sqlite_with_its_parameters_in_order() {
        use sqlx::sqlite::SqliteConnectOptions;
        use sqlx::{ConnectOptions as _, Connection as _};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let mut migrated = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        sqlx::migrate!("./migrations/sqlite")
            .run(&mut migrated)
            .await
            .unwrap();
        migrated.close().await.unwrap();
        let conn = rusqlite::Connection::open(&path).unwrap();
        for (sql, n) in every_statement() {
            let statement = conn.prepare(&sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert_eq!(statement.parameter_count(), n, "{sql}");
            for i in 1..=n {
                assert_eq!(
                    statement.parameter_name(i),
                    Some(format!("${i}").as_str()),
                    "{sql}"
                );
            }
        }
    }

    /// The same statements, and Postgres's own, prepared on Postgres's real schema (a fresh
    /// schema of the database `APPROVALS_TEST_POSTGRES_URL` names): each is valid there, with
    /// the parameters it is bound with.
    #[tokio::test]
    #[cfg_attr(
        not(approvals_test_postgres),
        ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
    )]
    async fn every_statement_prepares_on_postgres_with_its_parameters() {
        use sqlx::{Connection as _, Executor as _, SqlSafeStr as _, Statement as _};
        let (_schema, mut conn) = migrated_schema("statements").await;
        let mut all = every_statement();
        all.extend([
            (INSERT_CALL_AND_EVENT.to_owned(), 15),
            (INSERT_DECIDED_CALL_AND_EVENT.to_owned(), 22),
            (INSERT_BATCH_CALL_AND_EVENT.to_owned(), 17),
            (INSERT_BATCH_DECIDED_CALL_AND_EVENT.to_owned(), 24),
            (APPEND_EVENT_AT_ID.to_owned(), 3),
            (RESOLVE_CALL_AND_EVENT.to_owned(), 8),
            (RESOLVE_CALL_COMPLETING_AND_EVENT.to_owned(), 8),
            (COMPLETE_BATCH_AT_ID.to_owned(), 2),
            (FIND_CALL_LOCKING_BATCH.to_owned(), 3),
            (APPROVE_CALL.to_owned(), 8),
        ]);
        let mut failed = Vec::new();
        for (sql, n) in all {
            match conn
                .prepare(sqlx::AssertSqlSafe(sql.as_str()).into_sql_str())
                .await
            {
                Ok(statement) => match statement.parameters() {
                    Some(sqlx::Either::Left(types)) if types.len() == n => {}
                    other => failed.push(format!("{sql}: {other:?} parameters, not {n}")),
                },
                Err(e) => failed.push(format!("{sql}: {e}")),
            }
        }
        conn.close().await.unwrap();
        assert!(failed.is_empty(), "{failed:#?}");
    }

    /// A fresh schema of the test database (dropped with the returned [`Schema`], a failed
    /// assertion's unwinding included), migrated, and a connection whose search path is it.
    async fn migrated_schema(prefix: &str) -> (Schema, sqlx::PgConnection) {
        use sqlx::Connection as _;
        let schema = Schema::create(&testkit::postgres_url(), prefix)
            .await
            .unwrap();
        let mut conn = sqlx::PgConnection::connect(&schema.url()).await.unwrap();
        sqlx::migrate!("./migrations/postgres")
            .run(&mut conn)
            .await
            .unwrap();
        (schema, conn)
    }

    /// The event log's read, planned once for every page as the log's connections plan it
    /// (`plan_cache_mode = force_generic_plan`, `store::postgres`), finds each event's call,
    /// batch and outcome by key, never by reading a whole table (as it did when the outcome was
    /// a join Postgres planned as a scan).
    #[tokio::test]
    #[cfg_attr(
        not(approvals_test_postgres),
        ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
    )]
    async fn the_event_logs_read_on_postgres_finds_each_outcome_by_key_whatever_its_page() {
        use sqlx::{Connection as _, Executor as _, Row as _};
        let (_schema, mut conn) = migrated_schema("event_log_plan").await;
        // 2,000 decided calls, each with its Requested and Resolved event, and no statistics yet,
        // as in a young database before autovacuum's first ANALYZE.
        conn.execute(sqlx::AssertSqlSafe(format!(
            "INSERT INTO batches (batch_id, agent, session_id, on_deny, size, created_at) \
             SELECT 'b' || g, 'agent', 's', 0, 1, 0 FROM generate_series(1, 2000) g; \
             INSERT INTO calls (agent, session_id, call_id, batch_id, position, tool, input, \
             title, message, workspace, created_at, status) \
             SELECT 'agent', 's', 'c' || g, 'b' || g, 0, 'tool', '{{}}', '', '', '', 0, {approved} \
             FROM generate_series(1, 2000) g; \
             INSERT INTO events (seq, kind, call_rowid, created_at) \
             SELECT 2 * id - 1, {requested}, id, 0 FROM calls \
             UNION ALL SELECT 2 * id, {resolved}, id, 0 FROM calls",
            approved = code!(OutcomeKind::Approved),
            requested = code!(EventKind::Requested),
            resolved = code!(EventKind::Resolved),
        )))
        .await
        .unwrap();
        conn.execute("SET plan_cache_mode = force_generic_plan")
            .await
            .unwrap();
        // Young (no statistics), then analyzed: the plan is made anew for each. Failures are
        // gathered, so that one run shows every plan that scans.
        let mut failed = Vec::new();
        for analyze in ["", "ANALYZE"] {
            conn.execute(sqlx::AssertSqlSafe(format!(
                "{analyze}; DEALLOCATE ALL; PREPARE log_page (BIGINT, BIGINT) AS {EVENTS_AFTER}"
            )))
            .await
            .unwrap();
            for (after, limit) in [(0, 256), (3_990, 256), (1_000, 4)] {
                let plan: Vec<String> = conn
                    .fetch_all(sqlx::AssertSqlSafe(format!(
                        "EXPLAIN EXECUTE log_page({after}, {limit})"
                    )))
                    .await
                    .unwrap()
                    .iter()
                    .map(|row| row.get(0))
                    .collect();
                let plan = plan.join("\n");
                let scans =
                    plan.contains("Seq Scan on events") || plan.contains("Seq Scan on calls");
                if scans || !plan.contains("using events_call") {
                    failed.push(format!("{analyze} after {after} limit {limit}:\n{plan}"));
                }
            }
        }
        conn.close().await.unwrap();
        assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    }
}
