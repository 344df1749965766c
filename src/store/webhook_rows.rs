//! The webhook statements both backends run, written once, and their rows decoded. Parameters
//! are `$1`, `$2`, ... numbered in the order they first appear, which Postgres reads as numbers
//! and SQLite as names bound in order of appearance: keep them so when editing. Nothing here
//! decides anything; the store implementations only run these.

use super::primitives::Param;
use super::rows::Columns;
use crate::domain::Timestamp;
use crate::domain::webhook::{
    PayloadFormat, Webhook, WebhookFilter, WebhookId, WebhookSecret, WebhookState, WebhookUrl,
};
use crate::error::{Error, Result};

macro_rules! select_webhooks {
    ($($tail:literal)?) => {
        concat!(
            "SELECT id, url, secret, event_kinds, tool, workspace, agent, format, max_in_flight, \
             paused_reason, last_error, consecutive_failures, cursor, from_file, created_at \
             FROM webhooks",
            $(" ", $tail)?
        )
    };
}

pub const SELECT_WEBHOOKS: &str = select_webhooks!("ORDER BY id");
pub const SELECT_WEBHOOK: &str = select_webhooks!("WHERE id = $1");
/// Postgres: the row locked until the transaction ends (SQLite's one writer needs no lock).
pub const SELECT_WEBHOOK_FOR_UPDATE: &str = select_webhooks!("WHERE id = $1 FOR UPDATE");
pub const SELECT_FILE_WEBHOOK_IDS: &str = "SELECT id FROM webhooks WHERE from_file";

/// Refused (no row) when the id is taken.
pub const INSERT_WEBHOOK: &str = "INSERT INTO webhooks (id, url, secret, event_kinds, tool, \
     workspace, agent, format, max_in_flight, paused_reason, last_error, consecutive_failures, \
     cursor, from_file, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
     ON CONFLICT (id) DO NOTHING";

/// A file's endpoint: added, or given the file's settings (its cursor and state stay).
pub const UPSERT_FILE_WEBHOOK: &str = "INSERT INTO webhooks (id, url, secret, event_kinds, tool, \
     workspace, agent, format, max_in_flight, paused_reason, last_error, consecutive_failures, \
     cursor, from_file, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
     ON CONFLICT (id) DO UPDATE SET url = excluded.url, secret = excluded.secret, \
     event_kinds = excluded.event_kinds, tool = excluded.tool, workspace = excluded.workspace, \
     agent = excluded.agent, format = excluded.format, max_in_flight = excluded.max_in_flight, \
     from_file = excluded.from_file";

/// Settings and state; the cursor and the lease belong to delivery.
pub const UPDATE_WEBHOOK: &str = "UPDATE webhooks SET url = $1, secret = $2, event_kinds = $3, \
     tool = $4, workspace = $5, agent = $6, format = $7, max_in_flight = $8, \
     paused_reason = $9, consecutive_failures = $10, from_file = $11 WHERE id = $12";

pub const DELETE_WEBHOOK: &str = "DELETE FROM webhooks WHERE id = $1";

/// Bound: owner, until, id, now.
pub const LEASE_WEBHOOK: &str = "UPDATE webhooks SET lease_owner = $1, lease_until = $2 \
     WHERE id = $3 AND (lease_owner IS NULL OR lease_owner = $1 OR lease_until <= $4)";

/// Bound: owner, until, id. Where one process serves the database (SQLite, under its process
/// lock), a lease left by an earlier process (killed before it released it) is taken at once.
pub const TAKE_WEBHOOK_LEASE: &str =
    "UPDATE webhooks SET lease_owner = $1, lease_until = $2 WHERE id = $3";

/// Bound: id, owner.
pub const RELEASE_WEBHOOK: &str = "UPDATE webhooks SET lease_owner = NULL, lease_until = NULL \
     WHERE id = $1 AND lease_owner = $2";

/// Bound: cursor, id, owner. A delivery that succeeded ends the run of failures and clears the
/// last error, so `ListWebhooks` shows none for an endpoint that works again.
pub const RECORD_DELIVERED: &str = "UPDATE webhooks \
     SET cursor = CASE WHEN cursor < $1 THEN $1 ELSE cursor END, consecutive_failures = 0, \
     last_error = '' WHERE id = $2 AND lease_owner = $3";

/// Bound: error, pause after, pause reason, id, owner.
pub const RECORD_FAILURE: &str = "UPDATE webhooks SET last_error = $1, \
     consecutive_failures = consecutive_failures + 1, \
     paused_reason = CASE WHEN paused_reason IS NULL AND consecutive_failures + 1 >= $2 \
     THEN $3 ELSE paused_reason END \
     WHERE id = $4 AND lease_owner = $5";

/// Why an endpoint was paused after a run of failures.
pub fn pause_reason(failures: u32, error: &str) -> String {
    format!("paused after {failures} failed deliveries in a row; the last: {error}")
}

/// An endpoint's columns, as the statements bind them ([`Self::inserted`], [`Self::updated`]).
pub struct WebhookRow<'a> {
    pub id: &'a str,
    pub url: &'a str,
    pub secret: &'a str,
    pub event_kinds: i64,
    pub tool: &'a str,
    pub workspace: &'a str,
    pub agent: &'a str,
    pub format: i64,
    pub max_in_flight: i64,
    pub paused_reason: Option<&'a str>,
    pub last_error: &'a str,
    pub consecutive_failures: i64,
    pub cursor: i64,
    pub from_file: bool,
    pub created_at: i64,
}

impl<'a> WebhookRow<'a> {
    pub fn of(hook: &'a Webhook) -> Self {
        let text = |value: &'a Option<String>| value.as_deref().unwrap_or("");
        Self {
            id: hook.id.as_str(),
            url: hook.url.as_str(),
            secret: hook.secret.reveal(),
            event_kinds: hook.filter.kinds_code(),
            tool: text(&hook.filter.tool),
            workspace: text(&hook.filter.workspace),
            agent: text(&hook.filter.agent),
            format: hook.format.code(),
            max_in_flight: i64::from(hook.max_in_flight),
            paused_reason: match &hook.state {
                WebhookState::Active => None,
                WebhookState::Paused { reason } => Some(reason),
            },
            last_error: &hook.last_error,
            consecutive_failures: i64::from(hook.consecutive_failures),
            cursor: hook.cursor as i64,
            from_file: hook.from_file,
            created_at: hook.created_at.as_micros(),
        }
    }

    /// What [`INSERT_WEBHOOK`] and [`UPSERT_FILE_WEBHOOK`] bind.
    pub fn inserted(&self) -> [Param<'a>; 15] {
        [
            Param::Text(self.id),
            Param::Text(self.url),
            Param::Text(self.secret),
            Param::Int(self.event_kinds),
            Param::Text(self.tool),
            Param::Text(self.workspace),
            Param::Text(self.agent),
            Param::Int(self.format),
            Param::Int(self.max_in_flight),
            Param::OptText(self.paused_reason),
            Param::Text(self.last_error),
            Param::Int(self.consecutive_failures),
            Param::Int(self.cursor),
            Param::Flag(self.from_file),
            Param::Int(self.created_at),
        ]
    }

    /// What [`UPDATE_WEBHOOK`] binds: the settings and state, then the id (never the cursor,
    /// which only delivery moves, nor when it was made).
    pub fn updated(&self) -> [Param<'a>; 12] {
        let [
            id,
            url,
            secret,
            kinds,
            tool,
            workspace,
            agent,
            format,
            in_flight,
            paused,
            _,
            failures,
            _,
            from_file,
            _,
        ] = self.inserted();
        [
            url, secret, kinds, tool, workspace, agent, format, in_flight, paused, failures,
            from_file, id,
        ]
    }
}

pub fn webhook_from_row(row: &(impl Columns + ?Sized)) -> Result<Webhook> {
    let some = |text: String| (!text.is_empty()).then_some(text);
    let format = row.int("format")?;
    Ok(Webhook {
        id: WebhookId::from_stored(row.text("id")?),
        url: WebhookUrl::from_stored(row.text("url")?),
        secret: WebhookSecret::from_stored(row.text("secret")?)?,
        filter: WebhookFilter {
            kinds: WebhookFilter::kinds_from_code(row.int("event_kinds")?),
            tool: some(row.text("tool")?),
            workspace: some(row.text("workspace")?),
            agent: some(row.text("agent")?),
        },
        format: PayloadFormat::from_code(format)
            .ok_or_else(|| Error::Internal(format!("unknown stored webhook format {format}")))?,
        max_in_flight: row.int("max_in_flight")?.clamp(1, i64::from(u32::MAX)) as u32,
        state: match row.opt_text("paused_reason")? {
            None => WebhookState::Active,
            Some(reason) => WebhookState::Paused { reason },
        },
        last_error: row.text("last_error")?,
        consecutive_failures: row.int("consecutive_failures")?.max(0) as u32,
        cursor: row.int("cursor")?.max(0) as u64,
        from_file: row.flag("from_file")?,
        created_at: Timestamp::from_micros(row.int("created_at")?),
    })
}

pub fn not_found(id: &WebhookId) -> Error {
    Error::NotFound(format!("no webhook with id `{id}`"))
}

pub fn already_exists(id: &WebhookId) -> Error {
    Error::AlreadyExists(format!("a webhook with id `{id}` already exists"))
}
