//! Slack app mode: each pending call posted to the channel its route names, with Approve, Deny
//! and Open buttons; the message updated when the call is decided anywhere; reminders,
//! escalations and recorded votes threaded under it; and the buttons answered through the one
//! gate (`Broker::decide`), as the approver the Slack user is mapped to.
//!
//! - this file: the settings, the `--slack-file` (channels and people), and the poster, which
//!   follows the committed event log from where it stopped (as Web Push does), so Slack being
//!   slow or down never slows a decision, and a call decided while no broker ran Slack app mode
//!   has its message updated when one starts: posting happens after the fact, retried;
//! - `blocks`: the messages (Block Kit, escaped, bounded); `api`: the Web API client;
//! - `signature`: `X-Slack-Signature` and replays; `interactivity`: the HTTP endpoint Slack
//!   POSTs clicks to, on the gRPC port;
//! - `retry`: the calls whose message failed every attempt, tried again on a bounded schedule.
//!
//! Nothing here ever decides a call itself: a click becomes a `Decision` whose approver and
//! groups come from the configured mapping, and the broker's gate judges it like any other.

pub mod api;
pub mod blocks;
pub mod interactivity;
mod retry;
pub mod signature;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::background::cursor::{Follower, Handle};
use crate::background::events::{Delivery, EventBus};
use crate::background::webhooks::egress::EgressPolicy;
use crate::domain::identity::Identity;
use crate::domain::policy::group_name;
use crate::domain::{Call, CallKey, CallQuery, Event, EventKind, Status};
use crate::error::{Error, Result};
use crate::store::Store;

use self::api::WebApi;
use self::signature::Verifier;

/// Slack's Web API, unless `--slack-api-url` says otherwise (tests: a loopback server).
pub const DEFAULT_API_URL: &str = "https://slack.com/api";

/// Which channel a call goes to: the first route whose every named field matches the call
/// (its workspace, its tool, a group of its requirement); a field left out matches any call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub channel: String,
    pub workspace: Option<String>,
    pub tool: Option<String>,
    pub group: Option<String>,
}

impl Route {
    fn matches(&self, call: &Call) -> bool {
        let groups: &[String] = call
            .approval
            .as_ref()
            .map_or(&[], |a| &a.requirement.approvers.groups);
        self.workspace.as_ref().is_none_or(|w| *w == call.workspace)
            && self.tool.as_ref().is_none_or(|t| t == call.tool.as_str())
            && self.group.as_ref().is_none_or(|g| groups.contains(g))
    }
}

/// A person who may decide from Slack: their Slack user id (or the email `users.info` gives for
/// it), the approver identity they are (canonical, like every identity), and their groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlackPerson {
    pub slack_user: Option<String>,
    pub email: Option<String>,
    pub identity: String,
    /// The entry's own `groups` when it gives them; else, once [`groups_from_tokens`] ran, the
    /// groups the token file gives the identity.
    pub groups: Vec<String>,
    /// Whether the entry gives `groups` itself (then they win over the token file's).
    pub groups_given: bool,
}

/// Gives each person whose entry names no `groups` the groups `token_groups` says their
/// identity has in the token file (every approver or admin token of it, merged). An entry's own
/// `groups` win, even `[]`: the Slack file may keep Slack to fewer groups than the inbox. A JWT's
/// claims cannot apply: a click carries no token, so the broker never sees them.
pub fn groups_from_tokens(
    people: &mut [SlackPerson],
    token_groups: impl Fn(&str) -> Option<Vec<String>>,
) {
    for person in people.iter_mut().filter(|p| !p.groups_given) {
        if let Some(groups) = token_groups(&person.identity) {
            person.groups = groups;
        }
    }
}

/// Everything Slack app mode needs, parsed and checked at start.
#[derive(Clone)]
pub struct SlackSettings {
    pub api_url: String,
    pub bot_token: String,
    pub signing_secret: String,
    pub routes: Vec<Route>,
    pub people: Vec<SlackPerson>,
    /// The inbox's base URL, for the Open button (`--webhooks-inbox-url`).
    pub inbox_url: Option<String>,
    pub timeout: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// Attempts at one Web API call before it is given up (logged).
    pub attempts: u32,
    pub egress: Arc<EgressPolicy>,
}

impl std::fmt::Debug for SlackSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackSettings")
            .field("api_url", &self.api_url)
            .field("routes", &self.routes)
            .field("people", &self.people.len())
            .finish_non_exhaustive()
    }
}

/// Reads `--slack-file`: `{"channels": [{"channel", "workspace"?, "tool"?, "group"?}],
/// "people": [{"slack_user"? , "email"?, "identity", "groups"?}]}`. Errors name the entry.
pub fn parse_file(text: &str) -> Result<(Vec<Route>, Vec<SlackPerson>)> {
    let value: Value = crate::domain::json::parse("slack file", text)?;
    let object = value
        .as_object()
        .ok_or_else(|| Error::invalid("slack file", "must be a JSON object"))?;
    for key in object.keys() {
        if key != "channels" && key != "people" {
            return Err(Error::invalid(
                "slack file",
                format!("unknown key `{key}` (expected `channels` and `people`)"),
            ));
        }
    }
    let list = |name: &str| -> Result<Vec<Value>> {
        match object.get(name) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => Ok(items.clone()),
            Some(_) => Err(Error::invalid(name, "must be a list")),
        }
    };
    let text_field = |entry: &Value, at: &str, key: &str| -> Result<Option<String>> {
        match entry.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_owned())),
            Some(_) => Err(Error::invalid(
                format!("{at}.{key}"),
                "must be a non-empty string",
            )),
        }
    };
    let check_keys = |entry: &Value, at: &str, known: &[&str]| -> Result<()> {
        let object = entry
            .as_object()
            .ok_or_else(|| Error::invalid(at, "must be an object"))?;
        match object.keys().find(|k| !known.contains(&k.as_str())) {
            Some(key) => Err(Error::invalid(
                at,
                format!("unknown key `{key}` (known: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    };
    let mut routes = Vec::new();
    for (i, entry) in list("channels")?.iter().enumerate() {
        let at = format!("channels[{i}]");
        check_keys(entry, &at, &["channel", "workspace", "tool", "group"])?;
        let channel = text_field(entry, &at, "channel")?
            .ok_or_else(|| Error::invalid(format!("{at}.channel"), "is required"))?;
        if !channel
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '#')
        {
            return Err(Error::invalid(
                format!("{at}.channel"),
                "a channel id (C0123ABC) or name (#approvals)",
            ));
        }
        let group = match text_field(entry, &at, "group")? {
            Some(g) => Some(group_name(&format!("{at}.group"), &g)?),
            None => None,
        };
        routes.push(Route {
            channel,
            workspace: text_field(entry, &at, "workspace")?,
            tool: text_field(entry, &at, "tool")?,
            group,
        });
    }
    let mut people: Vec<SlackPerson> = Vec::new();
    for (i, entry) in list("people")?.iter().enumerate() {
        let at = format!("people[{i}]");
        check_keys(entry, &at, &["slack_user", "email", "identity", "groups"])?;
        let slack_user = text_field(entry, &at, "slack_user")?;
        let email = text_field(entry, &at, "email")?.map(|e| e.to_lowercase());
        if slack_user.is_none() && email.is_none() {
            return Err(Error::invalid(
                &at,
                "needs `slack_user` (U0123ABC) or `email`",
            ));
        }
        let typed = text_field(entry, &at, "identity")?
            .ok_or_else(|| Error::invalid(format!("{at}.identity"), "is required"))?;
        let identity = Identity::parse(&format!("{at}.identity"), &typed)?.into_string();
        let mut groups = Vec::new();
        let groups_given = matches!(entry.get("groups"), Some(Value::Array(_)));
        match entry.get("groups") {
            None | Some(Value::Null) => {}
            Some(Value::Array(names)) => {
                for (j, name) in names.iter().enumerate() {
                    let field = format!("{at}.groups[{j}]");
                    let name = name
                        .as_str()
                        .ok_or_else(|| Error::invalid(&field, "must be a string"))?;
                    let name = group_name(&field, name)?;
                    if !groups.contains(&name) {
                        groups.push(name);
                    }
                }
            }
            Some(_) => return Err(Error::invalid(format!("{at}.groups"), "must be a list")),
        }
        groups.sort();
        if let Some(user) = &slack_user
            && let Some(first) = people
                .iter()
                .position(|p| p.slack_user.as_ref() == Some(user))
        {
            return Err(Error::invalid(
                format!("{at}.slack_user"),
                format!("`{user}` is already mapped by people[{first}]: one person, one entry"),
            ));
        }
        people.push(SlackPerson {
            slack_user,
            email,
            identity,
            groups,
            groups_given,
        });
    }
    Ok((routes, people))
}

/// The poster as a follower of the log: live events told as they come, events read back caught
/// up on.
struct LogReader<'a> {
    slack: &'a Slack,
    caught_up: Mutex<CaughtUp>,
}

#[async_trait]
impl Handle for LogReader<'_> {
    async fn handle(&self, delivery: &Delivery) {
        match delivery.live {
            true => self.slack.tell(&delivery.event).await,
            false => self.slack.catch_up(&delivery.event, &self.caught_up).await,
        }
    }
}

/// The calls whose message a catch-up brought in line, each with the log's end when their state
/// was read: an event of theirs up to there changes nothing more. Bounded: past
/// [`CaughtUp::MAX`] calls it starts again, at worst updating a message once more.
#[derive(Default)]
struct CaughtUp(std::collections::HashMap<CallKey, u64>);

impl CaughtUp {
    const MAX: usize = 4096;

    fn covers(&self, key: &CallKey, seq: u64) -> bool {
        self.0.get(key).is_some_and(|read_at| seq <= *read_at)
    }

    fn remember(&mut self, key: &CallKey, read_at: u64) {
        if self.0.len() >= Self::MAX {
            self.0.clear();
        }
        self.0.insert(key.clone(), read_at);
    }
}

/// Where a call's message is: its channel and timestamp (Slack's id of a message), and whether
/// this process posted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub channel: String,
    pub ts: String,
    pub ours: bool,
}

/// Slack app mode, running: the Web API client, the request verifier, and where the messages
/// are (in the store, so a restart or another replica finds them).
pub struct Slack {
    settings: SlackSettings,
    api: WebApi,
    verifier: Verifier,
    store: Arc<dyn Store>,
    /// This process's name in the claims.
    owner: String,
    /// The calls whose message is to be tried again (see `retry`).
    retries: retry::Retries,
    /// The last Web API call failed every attempt, and none answered since.
    failing: AtomicBool,
}

impl Slack {
    pub fn new(settings: SlackSettings, store: Arc<dyn Store>) -> Arc<Self> {
        let api = WebApi::new(
            &settings.api_url,
            settings.bot_token.clone(),
            settings.timeout,
            Arc::clone(&settings.egress),
        );
        let verifier = Verifier::new(&settings.signing_secret);
        let retries = retry::Retries::new(settings.retry_max);
        Arc::new(Self {
            settings,
            api,
            verifier,
            store,
            owner: uuid::Uuid::new_v4().simple().to_string(),
            retries,
            failing: AtomicBool::new(false),
        })
    }

    /// The channel a call goes to, if a route names one.
    fn channel_for(&self, call: &Call) -> Option<&str> {
        self.settings
            .routes
            .iter()
            .find(|r| r.matches(call))
            .map(|r| r.channel.as_str())
    }

    /// The message of `key`, once Slack answered its post.
    async fn posted(&self, key: &CallKey) -> Option<Posted> {
        match self.store.slack_message(key).await {
            Ok(Some(stored)) if !stored.ts.is_empty() => Some(Posted {
                ours: stored.owner == self.owner,
                channel: stored.channel,
                ts: stored.ts,
            }),
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(%error, "cannot read which Slack message a call was posted as");
                None
            }
        }
    }

    /// How long a claim whose post never got an answer holds: longer than every attempt of a
    /// post could take; then another broker (or a restart) may take it over.
    fn claim_lifetime(&self) -> i64 {
        let longest = (self.settings.timeout + self.settings.retry_max) * self.settings.attempts;
        i64::try_from(longest.as_micros()).unwrap_or(i64::MAX)
    }

    /// Whether this process posts `key` (the first to claim it, in the whole fleet): when it
    /// claimed it, if it did.
    async fn claim(&self, key: &CallKey) -> Option<i64> {
        let at = crate::domain::Timestamp::now().as_micros();
        // A claim older than every attempt of a post could take is one whose post failed.
        let stale_before = at - self.claim_lifetime();
        match self
            .store
            .claim_slack_message(key, &self.owner, at, stale_before)
            .await
        {
            Ok(true) => Some(at),
            Ok(false) => None,
            Err(error) => {
                tracing::warn!(%error, "cannot claim a call's Slack message; not posting it");
                None
            }
        }
    }

    /// Where to follow the event log from: where the poster stopped (see
    /// `crate::background::cursor`), so the messages of calls decided while no broker ran Slack
    /// app mode are updated when one starts.
    pub async fn resume_point(&self) -> Result<u64> {
        Follower::Slack.resume_point(&*self.store).await
    }

    /// Posts the calls pending now that no broker posted (submitted while none ran Slack app
    /// mode, or while this one was down), then posts, updates and threads from the committed
    /// events after `after`, until the event bus stops. A call both pending now and in the log
    /// is posted once: the claim decides. Beside it, in the same task, the calls whose message
    /// failed every attempt are tried again (`retry`). The bus is held weakly: the poster must
    /// not keep a stopped broker's bus alive.
    pub async fn post_from(self: Arc<Self>, bus: Weak<EventBus>, after: u64) {
        let reader = LogReader {
            slack: &self,
            caught_up: Mutex::default(),
        };
        let follow = async {
            self.post_pending().await;
            Follower::Slack
                .follow(&*self.store, bus, after, &reader)
                .await;
        };
        tokio::select! {
            () = follow => {}
            () = self.retry_rounds() => {}
        }
    }

    /// What an event read back from the log (committed while no broker followed it, or while
    /// this one was behind) does: a call still pending posted if nobody did; a decision or a
    /// vote brings its call's message in line with the call as it is now, which may have
    /// changed since. A call's events read back together are one update: the later ones that
    /// the state read already held are skipped. Reminders and escalations are threaded as live
    /// ones are (by the process that posted the message); votes are not (the message shows them).
    async fn catch_up(&self, event: &Event, caught_up: &Mutex<CaughtUp>) {
        let key = &event.call.key;
        match event.kind {
            // Posted as it was requested: only a call nobody posted is to do.
            EventKind::Requested => self.bring_up_to_date(key, false).await,
            EventKind::Resolved | EventKind::ApprovalRecorded => {
                let covered = caught_up
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .covers(key, event.seq);
                if covered {
                    return;
                }
                // Read before the call: every event up to it is in the state read next.
                let read_at = match self.store.latest_seq().await {
                    Ok(seq) => Some(seq),
                    Err(error) => {
                        tracing::warn!(%error, "cannot read the event log's end");
                        None
                    }
                };
                self.bring_up_to_date(key, true).await;
                if let Some(seq) = read_at {
                    caught_up
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remember(key, seq);
                }
            }
            EventKind::Reminded | EventKind::Escalated => self.tell(event).await,
        }
    }

    /// Posts every pending call a route names and nobody claimed, oldest first.
    async fn post_pending(&self) {
        let mut query = CallQuery {
            statuses: vec![Status::Pending],
            limit: 200,
            ..CallQuery::default()
        };
        loop {
            let page = match self.store.list_calls(&query).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%error, "cannot list the pending calls to post to Slack");
                    return;
                }
            };
            for call in &page.calls {
                self.post_new(call).await;
            }
            match page.next {
                Some(next) if !page.calls.is_empty() => query.after = Some(next),
                _ => return,
            }
        }
    }

    /// What one committed event does to Slack.
    async fn tell(&self, event: &Event) {
        let call = &event.call;
        match event.kind {
            EventKind::Requested => self.post_new(call).await,
            EventKind::Resolved => {
                let Some(posted) = self.posted(&call.key).await else {
                    return;
                };
                let body = blocks::decided(call, self.settings.inbox_url.as_deref());
                if !self.update(&posted, body).await {
                    self.retry_later(&call.key, None);
                }
            }
            EventKind::ApprovalRecorded => {
                let Some(posted) = self.posted(&call.key).await else {
                    return;
                };
                let body = blocks::pending(call, self.settings.inbox_url.as_deref());
                if !self.update(&posted, body).await {
                    self.retry_later(&call.key, None);
                }
                if posted.ours
                    && let Some(vote) = call.approval.as_ref().and_then(|a| a.votes.last())
                {
                    let verb = if vote.approve { "approved" } else { "denied" };
                    let note = format!("{} {verb}; {}", vote.approver, blocks::requirement(call));
                    self.in_thread(&posted, &note).await;
                }
            }
            EventKind::Reminded | EventKind::Escalated => {
                // Only the poster threads, so a fleet replies once.
                let Some(posted) = self.posted(&call.key).await.filter(|p| p.ours) else {
                    return;
                };
                let what = if event.kind == EventKind::Reminded {
                    "Reminder"
                } else {
                    "Escalated"
                };
                let waited = event
                    .fired_step()
                    .map(|s| format!(" for {}", humantime::format_duration(s.after)))
                    .unwrap_or_default();
                let note = format!("{what}: this call is still waiting{waited}.");
                self.in_thread(&posted, &note).await;
            }
        }
    }

    /// Posts a pending call to the channel its route names, if this process claims it first;
    /// a post that fails every attempt is tried again later (`retry`).
    async fn post_new(&self, call: &Call) {
        let Some(channel) = self.channel_for(call) else {
            return;
        };
        let Some(claimed_at) = self.claim(&call.key).await else {
            return;
        };
        if !self.post(call, channel).await {
            self.retry_later(&call.key, Some(claimed_at));
        }
    }

    /// Posts `call`'s message (its claim taken) and stores where it is; whether Slack took it.
    async fn post(&self, call: &Call, channel: &str) -> bool {
        let mut body = blocks::pending(call, self.settings.inbox_url.as_deref());
        body["channel"] = json!(channel);
        body["unfurl_links"] = json!(false);
        body["unfurl_media"] = json!(false);
        let Some(answer) = self.call_with_retries("chat.postMessage", &body).await else {
            return false;
        };
        let channel = answer["channel"].as_str().unwrap_or(channel);
        let ts = answer["ts"].as_str().unwrap_or_default();
        if let Err(error) = self
            .store
            .record_slack_message(&call.key, channel, ts)
            .await
        {
            tracing::warn!(%error, "cannot store which Slack message a call was posted as");
        }
        true
    }

    /// Replaces the message's content with `body`; whether Slack took it.
    async fn update(&self, posted: &Posted, mut body: Value) -> bool {
        body["channel"] = json!(posted.channel);
        body["ts"] = json!(posted.ts);
        self.call_with_retries("chat.update", &body).await.is_some()
    }

    async fn in_thread(&self, posted: &Posted, note: &str) {
        let mut body = blocks::thread_note(note);
        body["channel"] = json!(posted.channel);
        body["thread_ts"] = json!(posted.ts);
        self.call_with_retries("chat.postMessage", &body).await;
    }

    /// Calls `method`, retrying failures with a doubling backoff up to `attempts` in all (one
    /// attempt while Slack is failing: the calls that fail then wait in `retry`); the answer,
    /// or `None` (logged) when every attempt failed.
    async fn call_with_retries(&self, method: &str, body: &Value) -> Option<Value> {
        let attempts = if self.failing.load(Ordering::Relaxed) {
            1
        } else {
            self.settings.attempts.max(1)
        };
        let mut wait = self.settings.retry_min;
        for attempt in 1..=attempts {
            match self.api.call(method, body).await {
                Ok(answer) => {
                    if self.failing.swap(false, Ordering::Relaxed) {
                        tracing::info!("Slack answers again; the messages waiting are tried now");
                        self.retries.bring_forward();
                    }
                    return Some(answer);
                }
                Err(error) if attempt < attempts => {
                    tracing::warn!(%method, %error, attempt, "Slack Web API call failed; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(self.settings.retry_max);
                }
                Err(error) => {
                    tracing::warn!(%method, %error, attempt, "Slack Web API call failed; given up for now");
                    self.failing.store(true, Ordering::Relaxed);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slack_file_is_read_with_identities_canonical_and_groups_sorted() {
        let (routes, people) = parse_file(
            r##"{"channels": [{"channel": "C1", "workspace": "payments"}, {"channel": "#ops", "group": "ops"}],
                "people": [{"slack_user": "U1", "identity": "Alice", "groups": ["ops", "dev", "ops"]},
                           {"email": "Bob@Example.com", "identity": "bob"}]}"##,
        )
        .unwrap();
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[1].group.as_deref(), Some("ops"));
        assert_eq!(people[0].identity, "alice");
        assert_eq!(people[0].groups, vec!["dev", "ops"]);
        assert_eq!(people[1].email.as_deref(), Some("bob@example.com"));
        assert!(people[0].groups_given && !people[1].groups_given);
    }

    #[test]
    fn a_person_without_groups_takes_the_token_files_and_one_with_groups_keeps_theirs() {
        let (_, mut people) = parse_file(
            r#"{"people": [{"slack_user": "U1", "identity": "alice"},
                           {"slack_user": "U2", "identity": "bob", "groups": []},
                           {"slack_user": "U3", "identity": "carol", "groups": ["dev"]},
                           {"slack_user": "U4", "identity": "nobody"}]}"#,
        )
        .unwrap();
        groups_from_tokens(&mut people, |identity| match identity {
            "nobody" => None,
            _ => Some(vec!["ops".to_owned()]),
        });
        let groups: Vec<Vec<String>> = people.iter().map(|p| p.groups.clone()).collect();
        let ops = vec!["ops".to_owned()];
        assert_eq!(groups, [ops, vec![], vec!["dev".to_owned()], vec![]]);
    }

    #[test]
    fn a_wrong_slack_file_is_refused_naming_the_entry() {
        for (text, names) in [
            (r#"{"channel": []}"#, "unknown key `channel`"),
            (
                r#"{"channels": [{"workspace": "x"}]}"#,
                "channels[0].channel",
            ),
            (
                r#"{"channels": [{"channel": "<!here>"}]}"#,
                "channels[0].channel",
            ),
            (r#"{"people": [{"identity": "a"}]}"#, "people[0]"),
            (
                r#"{"people": [{"slack_user": "U1", "identity": "a,b"}]}"#,
                "people[0].identity",
            ),
            (
                r#"{"people": [{"slack_user": "U1", "identity": "a", "groups": ["o p"]}]}"#,
                "people[0].groups[0]",
            ),
            (
                r#"{"people": [{"slack_user": "U1", "identity": "a"}, {"slack_user": "U1", "identity": "b"}]}"#,
                "already mapped by people[0]",
            ),
        ] {
            let error = parse_file(text).unwrap_err().to_string();
            assert!(error.contains(names), "{text}: {error}");
        }
    }
}
