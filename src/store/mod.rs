//! Storage behind traits that speak the domain's language ([`Calls`], [`Deadlines`],
//! [`EventLog`], [`Policies`], [`Webhooks`]; [`Store`] is all of them). Every state change (a call accepted, a
//! call resolved) is written in the same transaction as its event, and nothing is acknowledged
//! before that transaction commits. The operations themselves are written once, in
//! `crate::operations`; so are the SQL both backends run (`statements`), the transaction
//! primitives over it (`primitives`), the reads (`reads`) and, over `primitives::Transact`,
//! rules and grants (`policies`), passkeys (`passkeys`) and the parts with no operation of
//! their own (`webhooks`, `push`, `slack`): each backend owns its connections and adds only
//! what it does differently. Storage health (`health`) is told where those connections are
//! used, so no method of the traits below can escape it.

mod database;
mod fault;
pub mod health;
mod listing;
mod passkey_rows;
mod passkeys;
mod policies;
mod policy_cache;
mod postgres;
mod primitives;
mod push;
pub mod push_rows;
mod reads;
pub mod receipt_rows;
mod retention;
mod rows;
mod settings;
mod slack;
pub mod slack_rows;
pub(crate) mod sqlite;
pub mod statements;
mod webhook_rows;
mod webhooks;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::sync::Notify;

use crate::domain::policy::{
    ExplainTarget, Explanation, RevokeReport, RevokeTarget, Rule, RuleId, RuleMode, ShadowVerdict,
};
use crate::domain::receipt::Sealed;
use crate::domain::webhook::{DeliveryFailure, Webhook, WebhookChange, WebhookId};
use crate::domain::{
    AgentId, BatchId, Call, CallId, CallKey, CallPage, CallQuery, Event, GrantPage, GrantQuery,
    SessionId, Timestamp, ToolResultTexts,
};
use crate::error::Result;
use crate::operations::Writes;
use health::{StorageHealth, Watch};

pub use database::{DATABASE_URL_SETTING, Database};
pub use postgres::PostgresStore;
pub use push_rows::StoredPushSubscription;
pub use reads::{BackendReads, PoolStats};
pub use receipt_rows::StoredReceipt;
pub use settings::StoreSettings;
pub use slack_rows::StoredSlackMessage;
pub use sqlite::{
    CHECKPOINT_EVERY, ProcessLock, SqliteStore, Synchronous, WRITER_CHECKPOINT_PAGES,
};
pub use sqlite_ffi::allocator as sqlite_allocator;

/// The broker's durable state: every part below, from one backend. What startup opens and the
/// broker holds; each other part of the broker needs only the part it names.
pub trait Store:
    Calls
    + Deadlines
    + EventLog
    + Policies
    + Webhooks
    + Lifecycle
    + Receipts
    + PushSubscriptions
    + SlackMessages
    + Passkeys
{
}

impl<
    T: Calls
        + Deadlines
        + EventLog
        + Policies
        + Webhooks
        + Lifecycle
        + Receipts
        + PushSubscriptions
        + SlackMessages
        + Passkeys,
> Store for T
{
}

/// Slack app mode (`crate::surface::slack`): which message each call was posted as, and by which broker
/// process, so one process of a fleet posts each call and its message is updated after a restart.
#[async_trait]
pub trait SlackMessages: Backend {
    /// Claims the posting of `key`'s message for `owner` (`at`: microseconds since the epoch);
    /// whether this claim was the first, or took over one made before `stale_before` whose post
    /// never got an answer.
    async fn claim_slack_message(
        &self,
        key: &CallKey,
        owner: &str,
        at: i64,
        stale_before: i64,
    ) -> Result<bool>;
    /// Records where the claimed message was posted.
    async fn record_slack_message(&self, key: &CallKey, channel: &str, ts: &str) -> Result<()>;
    /// The message of `key`, if its posting was claimed.
    async fn slack_message(&self, key: &CallKey) -> Result<Option<StoredSlackMessage>>;
    /// Where the Slack poster stopped in the event log (the furthest any replica recorded);
    /// `None` before it ever ran.
    async fn slack_cursor(&self) -> Result<Option<u64>>;
    /// Records that the poster handled every event up to `seq` (never moves the position back).
    async fn record_slack_cursor(&self, seq: u64) -> Result<()>;
}

/// Passkeys (`crate::broker::passkeys`): the challenges the broker issues, and the credentials
/// approvers register, each step one transaction (`operations::passkeys`). The step-up check of
/// a vote is not here: it runs in the decision's own transaction.
#[async_trait]
pub trait Passkeys: Backend {
    /// Keeps a challenge just issued (and forgets the expired ones).
    async fn issue_passkey_challenge(
        &self,
        challenge: &crate::domain::passkey::Challenge,
    ) -> Result<()>;
    /// Checks `registration` against its challenge (used up either way) and keeps its
    /// credential.
    async fn register_passkey(
        &self,
        registration: crate::domain::passkey::Registration,
    ) -> Result<crate::domain::passkey::Passkey>;
    /// `approver`'s credentials, revoked ones too (everyone's: `None`), oldest first.
    async fn passkeys(
        &self,
        approver: Option<&str>,
    ) -> Result<Vec<crate::domain::passkey::Passkey>>;
    /// Revokes a credential (as admin `by`); it as it stands. NOT_FOUND if unknown.
    async fn revoke_passkey(
        &self,
        credential_id: &str,
        by: &str,
    ) -> Result<crate::domain::passkey::Passkey>;
}

/// Web Push subscriptions (`crate::background::push`): kept per approver, read whole by the sender.
#[async_trait]
pub trait PushSubscriptions: Backend {
    /// Keeps `subscription`, replacing one with the same endpoint.
    async fn add_push_subscription(&self, subscription: &StoredPushSubscription) -> Result<()>;
    /// Forgets `endpoint` if `approver` added it; whether it did.
    async fn remove_push_subscription(&self, endpoint: &str, approver: &str) -> Result<bool>;
    /// Forgets `endpoint` whoever added it (the push service said it is gone).
    async fn drop_push_subscription(&self, endpoint: &str) -> Result<()>;
    /// Every subscription.
    async fn push_subscriptions(&self) -> Result<Vec<StoredPushSubscription>>;
    /// Claims the pushes of event `seq` for this process: `false` when another replica did.
    async fn claim_push_event(&self, seq: u64) -> Result<bool>;
    /// Where the sender stopped in the event log (the furthest any replica recorded); `None`
    /// before it ever ran.
    async fn push_cursor(&self) -> Result<Option<u64>>;
    /// Records that the sender handled every event up to `seq` (never moves the position back).
    async fn record_push_cursor(&self, seq: u64) -> Result<()>;
}

/// What every part of a store shares: the reads both backends answer alike, from their own
/// pools ([`BackendReads`]). The parts' read methods default to them; a backend writes only what
/// it does its own way.
pub trait Backend: Send + Sync + 'static {
    fn reads(&self) -> &BackendReads;
}

/// Calls: the port their writes go through (submit, decide and cancel: [`Writes`]), and the
/// reads the API answers from.
#[async_trait]
pub trait Calls: Backend {
    /// The writes of calls (`operations::tx`): the group commit, or the backend's own transactions.
    fn writes(self: Arc<Self>) -> Arc<dyn Writes>;

    /// The named calls of a session, in the order asked; `None` for unknown ids.
    async fn calls_by_id(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<Vec<Option<Call>>> {
        self.reads().calls_by_id(agent, session, call_ids).await
    }

    /// The calls of a batch in position order.
    async fn batch_calls(&self, batch: &BatchId) -> Result<Vec<Call>> {
        self.reads().batch_calls(batch).await
    }

    /// A page of calls matching `query`, oldest first, with the cursor to continue after.
    async fn list_calls(&self, query: &CallQuery) -> Result<CallPage> {
        self.reads().list_calls(query).await
    }

    /// A small write transaction that reaches the disk as every commit does, and changes
    /// nothing the broker reads: whether writes work (see `health`).
    async fn probe(&self) -> Result<()>;
}

/// What the deadline sweeper reads and writes: deadlines, and escalation steps coming due.
#[async_trait]
pub trait Deadlines: Backend {
    /// Expires every pending call whose deadline is at or before `now`; returns them decided.
    async fn expire_due(&self, now: Timestamp) -> Result<Vec<Call>>;

    /// How many calls are pending, in the whole store.
    async fn pending_count(&self) -> Result<u64> {
        self.reads().pending_count().await
    }

    /// The earliest deadline of a pending call, if any.
    async fn next_deadline(&self) -> Result<Option<Timestamp>> {
        self.reads().next_deadline().await
    }

    /// Fires every escalation step of a pending call due at or before `now`, each once (also
    /// on several replicas at once), each with its event; returns how many fired.
    async fn escalate_due(&self, now: Timestamp) -> Result<u64>;

    /// When the next escalation step of a pending call falls due, if any.
    async fn next_step_due(&self) -> Result<Option<Timestamp>> {
        self.reads().next_step_due().await
    }
}

/// The durable event log the fan-out and replays read: every committed change, numbered.
#[async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Up to `limit` events after `after`, in sequence order.
    async fn events_after(&self, after: u64, limit: u32) -> Result<Vec<Event>>;

    /// The last sequence number in the log (0 when it is empty), covering every commit so far.
    async fn latest_seq(&self) -> Result<u64>;

    /// Numbers the committed events that have no sequence number yet, in commit order, and
    /// returns how many it numbered. Backends that number events as they commit (SQLite, whose
    /// writers are serialised) have nothing to do.
    async fn sequence_events(&self) -> Result<u64> {
        Ok(0)
    }

    /// Woken when another broker process committed events to the same database, if the backend
    /// can tell. A hint only: readers also poll.
    fn remote_commits(&self) -> Option<Arc<RemoteCommits>> {
        None
    }

    /// The events committed from now on, as they commit, from a backend that writes every event
    /// itself (SQLite's one writer reads them back on its own connection right after each
    /// commit), so the event pump need not read the log for them. Taken once; `None` where only
    /// reading the log can tell (Postgres).
    fn take_committed_events(&self) -> Option<CommittedEvents> {
        None
    }
}

/// Grants and rules: their administration, and Explain.
#[async_trait]
pub trait Policies: Backend {
    /// Revokes what `target` names, recording `by`. One transaction.
    async fn revoke_grants(&self, target: &RevokeTarget, by: &str) -> Result<RevokeReport>;

    /// A page of grants matching `query`, oldest first.
    async fn list_grants(&self, query: &GrantQuery) -> Result<GrantPage> {
        self.reads().list_grants(query).await
    }

    /// Adds a rule; the same rule again is returned as stored, another with its id is refused.
    async fn create_rule(&self, rule: &Rule) -> Result<Rule>;

    /// Removes a rule and returns it.
    async fn delete_rule(&self, id: &RuleId) -> Result<Rule>;

    /// Sets a rule's mode (enforce, shadow, disabled) and returns the rule. One transaction.
    async fn set_rule_mode(&self, id: &RuleId, mode: RuleMode) -> Result<Rule>;

    /// What shadow rules would have done with a call, recorded at its submit, by rule id.
    async fn shadow_verdicts(&self, key: &CallKey) -> Result<Vec<ShadowVerdict>> {
        self.reads().shadow_verdicts(key).await
    }

    /// Every rule.
    async fn list_rules(&self) -> Result<Vec<Rule>> {
        self.reads().list_rules().await
    }

    /// Replaces the rules an earlier policy file loaded with `rules` (by id, replacing rules made
    /// through CreateRule with the same id). One transaction.
    async fn load_file_rules(&self, rules: &[Rule]) -> Result<()>;

    /// What would decide `target` if it were submitted now, read as a submit reads it.
    async fn explain(&self, target: &ExplainTarget) -> Result<Explanation>;
}

/// Webhook endpoints and their delivery state. Writes that only a delivering process makes
/// (cursor, failures) name its `owner` and change nothing unless it still holds the endpoint's
/// lease, so a process that lost the lease cannot move the cursor of the one that took it.
#[async_trait]
pub trait Webhooks: Backend {
    /// Adds an endpoint; another one with its id is ALREADY_EXISTS.
    async fn create_webhook(&self, hook: &Webhook) -> Result<Webhook>;

    /// Every endpoint, by id.
    async fn webhooks(&self) -> Result<Vec<Webhook>> {
        self.reads().webhooks().await
    }

    /// One endpoint; NOT_FOUND when there is none with that id.
    async fn webhook(&self, id: &WebhookId) -> Result<Webhook> {
        self.reads().webhook(id).await
    }

    /// Applies `change` to the endpoint as stored, read and written in one transaction (so a
    /// failure delivery records meanwhile is neither lost nor undone), and returns the result;
    /// never touches the cursor, which only delivery moves. NOT_FOUND when there is none.
    async fn update_webhook(&self, id: &WebhookId, change: WebhookChange) -> Result<Webhook>;

    /// Removes an endpoint and returns it; NOT_FOUND when there is none with that id.
    async fn delete_webhook(&self, id: &WebhookId) -> Result<Webhook>;

    /// Makes the endpoints an earlier webhooks file loaded exactly `hooks`: new ones are added
    /// (delivering from `start_cursor` on), existing ones get the file's settings and keep
    /// their cursor, and file endpoints missing from `hooks` are removed. One transaction.
    async fn load_file_webhooks(&self, hooks: &[Webhook], start_cursor: u64) -> Result<()>;

    /// Takes (or extends) the lease on an endpoint for `owner` until `until`, if nobody else
    /// holds one that runs past `now`. Whether `owner` holds it now.
    async fn lease_webhook(
        &self,
        id: &WebhookId,
        owner: &str,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool>;

    /// Gives a lease up (at shutdown), so another process need not wait for it to run out.
    async fn release_webhook(&self, id: &WebhookId, owner: &str) -> Result<()>;

    /// Records that every event up to `cursor` was delivered: the cursor moves (never back),
    /// the run of failures ends and the last error is cleared. Whether `owner` still held the
    /// lease.
    async fn record_delivered(&self, id: &WebhookId, owner: &str, cursor: u64) -> Result<bool>;

    /// Records a failed attempt; pauses the endpoint (with the error as the reason) when this
    /// makes `pause_after` failures in a row. The endpoint as it stands, if the failure's owner
    /// still held the lease.
    async fn record_failure(&self, failure: &DeliveryFailure) -> Result<Option<Webhook>>;
}

/// Why Backup is refused on Postgres, and what to do instead.
pub const BACKUP_ON_POSTGRES: &str = "Backup copies a SQLite database, and this broker keeps its \
     state in Postgres: back it up with pg_dump (the broker's whole schema; see \
     docs/data-lifecycle.md)";

/// Retention and backups: what keeps the database's size, and a copy of it, in an operator's
/// hands (`--retain-decided`, the Backup RPC).
#[async_trait]
pub trait Lifecycle: Backend {
    /// Deletes the batches all of whose calls were decided before `cutoff`, with their calls and
    /// events, `chunk` calls per transaction; keeps what a webhook endpoint has not delivered
    /// and the log's last event. Raises the pruned horizon past what it deleted.
    async fn prune_decided(
        &self,
        cutoff: Timestamp,
        chunk: u32,
    ) -> Result<crate::operations::prune::PruneReport>;

    /// The highest sequence number retention pruned (0 when nothing was): resuming the log
    /// below it is refused.
    async fn pruned_through(&self) -> Result<u64> {
        self.reads().pruned_through().await
    }

    /// Writes a consistent copy of the database, taken while writes go on, to the new file
    /// `to`. FAILED_PRECONDITION where the database is not the broker's to copy (Postgres).
    async fn backup(&self, to: &std::path::Path) -> Result<()>;
}

/// Signed receipts, as the outcomes' transactions wrote them (see `crate::receipts`). Read only:
/// a receipt is written by the primitive that writes its outcome, nowhere else.
#[async_trait]
pub trait Receipts: Backend {
    /// The receipts of the calls decided under a call's id, newest first: none while its call
    /// is pending (or if it was decided while receipts were off), more than one if the id was
    /// used again after retention pruned its call.
    async fn receipts_of(&self, key: &CallKey) -> Result<Vec<StoredReceipt>> {
        self.reads().receipts_of(key).await
    }

    /// The receipts of the stored calls of `agent`'s `session` named in `call_ids`, by call
    /// id, each with its call's batch: none for a pending call, or one decided while receipts
    /// were off. One read for a page of outcomes (`Broker::seal_outcomes`).
    async fn seals_of_calls(
        &self,
        agent: &AgentId,
        session: &SessionId,
        call_ids: &[CallId],
    ) -> Result<HashMap<CallId, (BatchId, Sealed)>> {
        self.reads().seals_of_calls(agent, session, call_ids).await
    }

    /// At most `limit` receipts after sequence `after`, in chain order.
    async fn receipts_after(&self, after: u64, limit: u32) -> Result<Vec<StoredReceipt>> {
        self.reads().receipts_after(after, limit).await
    }
}

impl<T: Backend> Receipts for T {}

/// Committed events, handed over by the writer (see [`EventLog::take_committed_events`]). Best
/// effort: events that could not be handed over (the queue was full, or reading them failed) are
/// signalled on `missed`, and the pump reads them from the log.
pub struct CommittedEvents {
    /// The events of each group of commits, in sequence order.
    pub events: tokio::sync::mpsc::Receiver<Vec<Event>>,
    pub missed: Arc<Notify>,
}

/// Makes this process the only broker on `database` for as long as the returned lock is held:
/// a SQLite file serves one broker process (a second one is refused with an error saying so); any
/// number of replicas share Postgres, so there is nothing to hold.
pub fn claim(database: &Database) -> Result<Option<ProcessLock>> {
    match database {
        Database::Sqlite { path, .. } => ProcessLock::claim(path).map(Some),
        Database::Postgres { .. } => Ok(None),
    }
}

/// The reads of `database` alone: no migrations, no writer, nothing written. For commands that
/// read a database a broker may be serving at the same time (`export`): SQLite's WAL lets a
/// reader beside the broker's writer, and Postgres any number of connections.
pub async fn open_reads(database: &Database) -> Result<BackendReads> {
    Ok(match database {
        Database::Sqlite { path, .. } => {
            if !path.exists() {
                return Err(crate::Error::invalid(
                    crate::store::DATABASE_URL_SETTING,
                    format!("there is no SQLite database at {}", path.display()),
                ));
            }
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .read_only(true)
                .busy_timeout(std::time::Duration::from_secs(10));
            let pool = sqlx::sqlite::SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?;
            BackendReads::Sqlite(reads::Reads::new(pool, Watch::default()))
        }
        Database::Postgres { url, .. } => {
            let options: sqlx::postgres::PgConnectOptions = url.parse()?;
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_with(options)
                .await?;
            BackendReads::Postgres(reads::Reads::new(pool, Watch::default()))
        }
    })
}

/// Opens the store on `database` and applies its migrations.
/// Every outcome written through it is signed by `notary`, if given. Its storage health is
/// told nobody (see [`open_watched`]).
pub async fn open(
    database: &Database,
    texts: ToolResultTexts,
    notary: Option<Arc<crate::receipts::Notary>>,
) -> Result<Arc<dyn Store>> {
    open_watching(database, texts, notary, Watch::default()).await
}

/// [`open`], telling `health` of every storage fault and of the writes that work (see
/// `health`): the store the broker serves from.
pub async fn open_watched(
    database: &Database,
    texts: ToolResultTexts,
    notary: Option<Arc<crate::receipts::Notary>>,
    health: &Arc<StorageHealth>,
) -> Result<Arc<dyn Store>> {
    open_watching(database, texts, notary, Watch::new(health)).await
}

async fn open_watching(
    database: &Database,
    texts: ToolResultTexts,
    notary: Option<Arc<crate::receipts::Notary>>,
    health: Watch,
) -> Result<Arc<dyn Store>> {
    Ok(match database {
        Database::Sqlite { path, synchronous } => {
            Arc::new(SqliteStore::open_watched(path, *synchronous, texts, notary, health).await?)
        }
        Database::Postgres {
            url,
            max_connections,
            group_commit,
        } => Arc::new(
            PostgresStore::open_watched(
                url,
                *max_connections,
                *group_commit,
                texts,
                notary,
                health,
            )
            .await?,
        ),
    })
}

/// What other broker processes' commits tell this one (see [`EventLog::remote_commits`]): a
/// wake-up, and how far they numbered the log meanwhile, when they said.
#[derive(Debug, Default)]
pub struct RemoteCommits {
    wake: Notify,
    /// The highest sequence number announced since the last [`Self::announced`]; `u64::MAX`
    /// when a wake-up did not say (read whatever is there); 0 when nothing was announced.
    through: AtomicU64,
}

impl RemoteCommits {
    /// Events were numbered elsewhere, up to `through` if it is known.
    pub fn announce(&self, through: Option<u64>) {
        self.through
            .fetch_max(through.unwrap_or(u64::MAX), Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Waits for the next announcement; then how far the log was numbered, as the highest of
    /// what was announced since the last call (`u64::MAX`: unknown). Cancel-safe.
    pub async fn announced(&self) -> u64 {
        self.wake.notified().await;
        self.through.swap(0, Ordering::SeqCst)
    }
}
