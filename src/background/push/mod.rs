//! Web Push to approvers' phones and desktops (RFC 8030), so a pending call reaches the person
//! who may decide it without the inbox tab open. The page subscribes with the broker's VAPID
//! public key (`vapid`); the broker encrypts each message for the subscription (`ece`, RFC 8291)
//! and POSTs it to the browser's push service (`http`), signed with a VAPID token (RFC 8292).
//!
//! What a message says is [`Notice`]: the tool and the input's first line (bounded), the call's
//! key, and where the inbox shows it. The service worker (`web/public/sw.js`) shows it, tagged
//! with the call's key so that a later `withdrawn` message for the same call closes it.
//! Approving from the notification is not offered: its click opens the call in the inbox. A
//! call whose requirement asks for a passkey says so (`step_up`, and its line starts with
//! [`PASSKEY_NOTE`]): it can only be approved in the inbox, with the person's passkey.
//!
//! Sending never happens on a decision's write path: a push service that hangs costs at most
//! [`Pusher`]'s bounded attempts, in the background.

pub mod ece;
pub mod http;
pub mod sender;
pub mod vapid;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use bytes::Bytes;
use serde_json::json;

use crate::background::events::EventBus;
use crate::background::webhooks::DeliverySettings;
use crate::background::webhooks::egress::EgressPolicy;
use crate::domain::time::parse_duration;
use crate::domain::{Timestamp, Viewer};
use crate::error::{Error, Result};
use crate::receipts::{KeyHome, ReceiptsMode};
use crate::store::{Store, StoredPushSubscription};

pub use self::http::Answer;
pub use self::vapid::Vapid;

/// The longest endpoint URL a subscription may have, in bytes.
const MAX_ENDPOINT_BYTES: usize = 2048;
/// How much of the input's first line a notification shows, in characters.
const MAX_LINE_CHARS: usize = 120;
/// What a notification's line starts with when the call needs a passkey to be approved.
pub const PASSKEY_NOTE: &str = "Needs your passkey · ";

/// A browser's push subscription, as `PushSubscription.toJSON()` gives it: where to POST, and
/// the keys to encrypt for.
#[derive(Clone, PartialEq, Eq)]
pub struct Subscription {
    pub endpoint: String,
    pub p256dh: Vec<u8>,
    pub auth: Vec<u8>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The endpoint is a capability (anyone holding it can push): log its origin only.
        f.debug_struct("Subscription")
            .field("origin", &origin(&self.endpoint).unwrap_or_default())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// Validates a subscription a page sent: an `https://` endpoint the egress policy admits
    /// (`http://` only for a host `--webhook-allow-hosts` names, as tests on loopback do), a
    /// 65-byte uncompressed P-256 key and a 16-byte auth secret, both base64url.
    pub fn parse(endpoint: &str, p256dh: &str, auth: &str, egress: &EgressPolicy) -> Result<Self> {
        if endpoint.len() > MAX_ENDPOINT_BYTES {
            return Err(Error::invalid(
                "endpoint",
                format!("must be at most {MAX_ENDPOINT_BYTES} bytes"),
            ));
        }
        let url = crate::domain::webhook::WebhookUrl::parse("endpoint", endpoint)?;
        let uri: hyper::Uri = endpoint
            .parse()
            .map_err(|e| Error::invalid("endpoint", format!("is not a URL: {e}")))?;
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if uri.scheme_str() != Some("https") {
            let loopback = host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                return Err(Error::invalid(
                    "endpoint",
                    "must be an https:// URL (a push service's endpoint)",
                ));
            }
        }
        // A loopback or other internal target passes only when the allow-list names it.
        egress
            .check_url(&url)
            .map_err(|e| Error::invalid("endpoint", e))?;
        let p256dh = decode("p256dh", p256dh)?;
        if p256dh.len() != ece::P256DH_LEN || p256dh[0] != 0x04 {
            return Err(Error::invalid(
                "p256dh",
                "must be an uncompressed P-256 public key (65 bytes, base64url)",
            ));
        }
        if !ece::on_curve(&p256dh) {
            return Err(Error::invalid(
                "p256dh",
                "is not a point on the P-256 curve",
            ));
        }
        let auth = decode("auth", auth)?;
        if auth.len() != ece::AUTH_LEN {
            return Err(Error::invalid(
                "auth",
                "must be the subscription's 16-byte auth secret (base64url)",
            ));
        }
        Ok(Self {
            endpoint: endpoint.to_owned(),
            p256dh,
            auth,
        })
    }
}

fn decode(field: &str, value: &str) -> Result<Vec<u8>> {
    let trimmed = value.trim_end_matches('=');
    B64.decode(trimmed)
        .or_else(|_| base64::engine::general_purpose::STANDARD_NO_PAD.decode(trimmed))
        .map_err(|_| Error::invalid(field, "is not base64url"))
}

/// `scheme://host[:port]` of a URL: a VAPID token's audience.
pub fn origin(endpoint: &str) -> Option<String> {
    let uri: hyper::Uri = endpoint.parse().ok()?;
    Some(format!(
        "{}://{}",
        uri.scheme_str()?,
        uri.authority()?.as_str()
    ))
}

/// What happened to a call that a message tells of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    /// A new pending call the person may decide.
    Pending,
    /// A reminder or escalation of one still pending.
    Reminder,
    /// Decided, cancelled or expired: close the notification.
    Withdrawn,
}

impl NoticeKind {
    fn as_str(self) -> &'static str {
        match self {
            NoticeKind::Pending => "pending",
            NoticeKind::Reminder => "reminder",
            NoticeKind::Withdrawn => "withdrawn",
        }
    }
}

/// One message's content, before encryption.
#[derive(Debug, Clone)]
pub struct Notice {
    pub kind: NoticeKind,
    /// The call's key as the page names it: `agent`, `session`, `call_id`.
    pub agent: String,
    pub session: String,
    pub call_id: String,
    pub tool: String,
    /// The input as the inbox shows it; only its first line, bounded, is sent.
    pub input: String,
    /// Its requirement asks for a passkey with each approval (approve in the inbox only).
    pub step_up: bool,
}

impl Notice {
    /// The notification's tag: one per call, so a later message replaces or closes it.
    pub fn tag(&self) -> String {
        format!("call:{}/{}/{}", self.agent, self.session, self.call_id)
    }

    /// The JSON the service worker reads.
    pub fn to_json(&self) -> String {
        let line: String = self
            .input
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .chars()
            .take(MAX_LINE_CHARS)
            .collect();
        let line = match self.step_up {
            true => format!("{PASSKEY_NOTE}{line}"),
            false => line,
        };
        let query = format!(
            "agent={}&session={}&call={}",
            urlencode(&self.agent),
            urlencode(&self.session),
            urlencode(&self.call_id)
        );
        json!({
            "v": 1,
            "kind": self.kind.as_str(),
            "tag": self.tag(),
            "agent": self.agent,
            "session": self.session,
            "call_id": self.call_id,
            "tool": self.tool,
            "line": line,
            "step_up": self.step_up,
            "url": format!("/#{query}"),
        })
        .to_string()
    }
}

fn urlencode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How sending behaves (`--push-*` settings).
#[derive(Debug, Clone)]
pub struct PushSettings {
    /// The VAPID `sub` claim: how a push service reaches the operator (`mailto:` or `https:`).
    pub subject: String,
    /// How long a push service keeps an undelivered message (the `TTL` header).
    pub ttl: Duration,
    /// How long one request may take.
    pub timeout: Duration,
    /// Attempts per message (the first included) on 429, 5xx or no answer.
    pub attempts: u32,
    /// The first retry's delay; each further one doubles.
    pub retry_min: Duration,
    pub egress: Arc<EgressPolicy>,
}

impl Default for PushSettings {
    fn default() -> Self {
        Self {
            subject: "mailto:approvals@localhost".into(),
            ttl: Duration::from_secs(3600),
            timeout: Duration::from_secs(10),
            attempts: 4,
            retry_min: Duration::from_millis(500),
            egress: Arc::default(),
        }
    }
}

/// Encrypts, signs and sends messages.
#[derive(Debug, Clone)]
pub struct Pusher {
    vapid: Arc<Vapid>,
    settings: PushSettings,
}

impl Pusher {
    pub fn new(vapid: Arc<Vapid>, settings: PushSettings) -> Self {
        Self { vapid, settings }
    }

    pub fn vapid(&self) -> &Vapid {
        &self.vapid
    }

    /// Sends `notice` to `subscription`, retrying 429, 5xx and silence with doubling delays up
    /// to the configured attempts. `Gone` tells the caller to drop the subscription.
    pub async fn send(&self, subscription: &Subscription, notice: &Notice) -> Answer {
        let body = match ece::encrypt(
            notice.to_json().as_bytes(),
            &subscription.p256dh,
            &subscription.auth,
        ) {
            Ok(body) => Bytes::from(body),
            Err(e) => return Answer::Refused(e),
        };
        let Some(audience) = origin(&subscription.endpoint) else {
            return Answer::Refused("the endpoint has no origin".into());
        };
        let topic = topic(&notice.tag());
        let urgency = match notice.kind {
            NoticeKind::Withdrawn => "normal",
            _ => "high",
        };
        let mut delay = self.settings.retry_min;
        let mut last = Answer::Retry("not sent".into());
        for attempt in 0..self.settings.attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
            }
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
            let authorization =
                match self
                    .vapid
                    .authorization(&audience, &self.settings.subject, now)
                {
                    Ok(value) => value,
                    Err(e) => return Answer::Refused(e.to_string()),
                };
            let request = http::PushRequest {
                endpoint: &subscription.endpoint,
                authorization: &authorization,
                ttl_secs: u32::try_from(self.settings.ttl.as_secs()).unwrap_or(u32::MAX),
                urgency,
                topic: Some(&topic),
                body: body.clone(),
            };
            last = http::post(&request, &self.settings.egress, self.settings.timeout).await;
            if !matches!(last, Answer::Retry(_)) {
                return last;
            }
            tracing::debug!(?subscription, ?last, attempt, "push not accepted yet");
        }
        last
    }
}

/// The `--push-*` settings (docs/notifications.md).
#[derive(Debug, Clone, clap::Args)]
pub struct PushFlags {
    /// Web Push to approvers' browsers: `auto` (on with SQLite, whose VAPID key is generated
    /// beside the database on first start; on with Postgres when --push-vapid-key is given),
    /// `on` (refuses to start without a key on Postgres), or `off`.
    #[arg(id = "push", long, env = "APPROVALS_PUSH", default_value = "auto")]
    pub mode: ReceiptsMode,

    /// The VAPID key (ECDSA P-256, a PKCS#8 `PRIVATE KEY` PEM). Default with SQLite:
    /// `<database file>.vapid-key.pem`, created (mode 0600) on first start. Every replica of a
    /// Postgres broker must be given the same one. A new key orphans every subscription.
    #[arg(long, env = "APPROVALS_PUSH_VAPID_KEY")]
    pub push_vapid_key: Option<std::path::PathBuf>,

    /// The contact push services see in each VAPID token (`sub`): `mailto:` or `https:`.
    #[arg(
        long,
        env = "APPROVALS_PUSH_SUBJECT",
        default_value = "mailto:approvals@localhost"
    )]
    pub push_subject: String,

    /// How long a push service keeps a message for a browser that is offline (`TTL`).
    #[arg(long, env = "APPROVALS_PUSH_TTL", default_value = "1h", value_parser = parse_duration)]
    pub push_ttl: Duration,

    /// Attempts at one message on 429, 5xx or no answer; the waits between them start at
    /// --webhook-retry-min and double. Each attempt ends within --webhook-timeout. A message
    /// that fails every attempt is tried again in rounds, from --webhook-retry-max doubling.
    #[arg(long, env = "APPROVALS_PUSH_ATTEMPTS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10))]
    pub push_attempts: u32,
}

/// Starts Web Push as `flags` say: loads or creates the VAPID key, starts the sender where it
/// stopped in the event log (see `sender`), and returns what the RPCs use; `None` when push is
/// off. Requests go out as webhook delivery's do (`delivery`: its timeout, its first retry's
/// wait, its egress policy), and the rounds of retries wait `--webhook-retry-max` first, as
/// Slack's do.
pub async fn start(
    flags: &PushFlags,
    home: KeyHome<'_>,
    store: Arc<dyn Store>,
    bus: &Arc<EventBus>,
    delivery: &DeliverySettings,
) -> Result<Option<Arc<Registry>>> {
    let egress = Arc::clone(&delivery.egress);
    if flags.mode == ReceiptsMode::Off {
        return Ok(None);
    }
    let vapid = match (&flags.push_vapid_key, home) {
        (Some(path), _) => Vapid::load(path)?,
        (None, KeyHome::BesideFile(database)) => Vapid::load_or_create(&vapid::beside(database))?,
        (None, KeyHome::Shared) if flags.mode == ReceiptsMode::On => {
            return Err(Error::invalid(
                "--push-vapid-key",
                "is required for Web Push on Postgres: every replica must sign with the same key",
            ));
        }
        (None, KeyHome::Shared) => {
            tracing::warn!(
                "Web Push is OFF: on Postgres the replicas' shared VAPID key must be given \
                 (--push-vapid-key / APPROVALS_PUSH_VAPID_KEY)"
            );
            return Ok(None);
        }
    };
    if !(flags.push_subject.starts_with("mailto:") || flags.push_subject.starts_with("https:")) {
        return Err(Error::invalid(
            "--push-subject",
            "must be a mailto: or https: URL push services can reach the operator at",
        ));
    }
    let vapid = Arc::new(vapid);
    tracing::info!(public_key = %vapid.public_key_b64(), "Web Push on");
    let pusher = Pusher::new(
        Arc::clone(&vapid),
        PushSettings {
            subject: flags.push_subject.clone(),
            ttl: flags.push_ttl,
            timeout: delivery.timeout,
            attempts: flags.push_attempts,
            retry_min: delivery.retry_min,
            egress: Arc::clone(&egress),
        },
    );
    let added = Arc::new(AtomicU64::new(0));
    let first_round = delivery.retry_max;
    let sender = sender::Sender::new(Arc::clone(&store), pusher, Arc::clone(&added), first_round);
    let after = sender.resume_point().await?;
    tokio::spawn(sender.run(Arc::downgrade(bus), after));
    Ok(Some(Arc::new(Registry {
        added,
        store,
        public_key: vapid.public_key_b64(),
        egress,
    })))
}

/// What the ApproverService's push RPCs use: the subscriptions' store, the key pages subscribe
/// with, and the egress policy endpoints are checked against.
pub struct Registry {
    /// Moved by every subscription this process adds, so the sender reads the subscriptions
    /// again at once (see `sender::Sender::subscriptions`).
    added: Arc<AtomicU64>,
    store: Arc<dyn Store>,
    public_key: String,
    egress: Arc<EgressPolicy>,
}

impl Registry {
    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// Keeps a subscription for `approver`, who reads calls as `viewer`.
    pub async fn add(
        &self,
        approver: &str,
        viewer: &Viewer,
        endpoint: &str,
        p256dh: &str,
        auth: &str,
    ) -> Result<()> {
        let (sees_all, groups) = match viewer {
            Viewer::Operator => (true, Vec::new()),
            Viewer::Approver { groups } => (false, groups.clone()),
            Viewer::Agent(_) => {
                return Err(Error::PermissionDenied(
                    "an agent's token cannot subscribe to approvers' pushes".into(),
                ));
            }
        };
        let subscription = Subscription::parse(endpoint, p256dh, auth, &self.egress)?;
        let stored = self
            .store
            .add_push_subscription(&StoredPushSubscription {
                endpoint: subscription.endpoint,
                approver: approver.to_owned(),
                sees_all,
                groups,
                p256dh: B64.encode(&subscription.p256dh),
                auth: B64.encode(&subscription.auth),
                created_at: Timestamp::now().as_micros(),
            })
            .await;
        self.added.fetch_add(1, Ordering::Release);
        stored
    }

    /// Forgets `endpoint` if `approver` added it.
    pub async fn remove(&self, approver: &str, endpoint: &str) -> Result<bool> {
        self.store
            .remove_push_subscription(endpoint, approver)
            .await
    }
}

/// RFC 8030 §5.4: a topic is at most 32 base64url characters; a digest of the tag fits.
fn topic(tag: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, tag.as_bytes());
    B64.encode(&digest.as_ref()[..24])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::background::webhooks::egress::AllowedHost;

    const P256DH: &str =
        "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
    const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";

    #[test]
    fn a_subscription_needs_https_or_an_allowed_loopback_and_keys_of_the_right_size() {
        let open = EgressPolicy::default();
        assert!(Subscription::parse("https://push.example.net/x", P256DH, AUTH, &open).is_ok());
        let err = Subscription::parse("http://push.example.net/x", P256DH, AUTH, &open)
            .unwrap_err()
            .to_string();
        assert!(err.contains("https://"), "{err}");
        assert!(Subscription::parse("http://127.0.0.1:9/x", P256DH, AUTH, &open).is_err());
        let allowed = EgressPolicy::new(vec!["127.0.0.1".parse::<AllowedHost>().unwrap()]);
        assert!(Subscription::parse("http://127.0.0.1:9/x", P256DH, AUTH, &allowed).is_ok());
        assert!(Subscription::parse("https://10.0.0.1/x", P256DH, AUTH, &open).is_err());
        assert!(Subscription::parse("https://p.example/x", &P256DH[..80], AUTH, &open).is_err());
        assert!(Subscription::parse("https://p.example/x", P256DH, "AAAA", &open).is_err());
        assert!(Subscription::parse("https://p.example/x", "!!", AUTH, &open).is_err());
    }

    #[test]
    fn a_notice_carries_the_first_line_bounded_the_tag_and_the_link() {
        let notice = Notice {
            kind: NoticeKind::Pending,
            agent: "a 1".into(),
            session: "s".into(),
            call_id: "c/2".into(),
            tool: "Bash".into(),
            input: format!("\n{}\nsecond line", "x".repeat(500)),
            step_up: false,
        };
        let v: serde_json::Value = serde_json::from_str(&notice.to_json()).unwrap();
        assert_eq!(v["kind"], "pending");
        assert_eq!(v["tool"], "Bash");
        assert_eq!(v["line"].as_str().unwrap().chars().count(), MAX_LINE_CHARS);
        assert_eq!(v["tag"], "call:a 1/s/c/2");
        assert_eq!(v["url"], "/#agent=a%201&session=s&call=c%2F2");
        assert!(topic(&notice.tag()).len() <= 32);
        assert_eq!(v["step_up"], false);
    }

    #[test]
    fn a_call_that_needs_a_passkey_says_so_and_still_opens_the_call() {
        let notice = Notice {
            kind: NoticeKind::Pending,
            agent: "a".into(),
            session: "s".into(),
            call_id: "c".into(),
            tool: "Bash".into(),
            input: "make deploy".into(),
            step_up: true,
        };
        let v: serde_json::Value = serde_json::from_str(&notice.to_json()).unwrap();
        assert_eq!(v["step_up"], true);
        assert_eq!(v["line"], format!("{PASSKEY_NOTE}make deploy"));
        assert_eq!(v["url"], "/#agent=a&session=s&call=c");
    }

    #[test]
    fn statuses_mean_what_rfc_8030_says() {
        assert_eq!(http::classify(201), Answer::Accepted);
        assert_eq!(http::classify(410), Answer::Gone);
        assert_eq!(http::classify(404), Answer::Gone);
        assert!(matches!(http::classify(429), Answer::Retry(_)));
        assert!(matches!(http::classify(503), Answer::Retry(_)));
        assert!(matches!(http::classify(400), Answer::Refused(_)));
    }
}
