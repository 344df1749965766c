//! Configuration: every setting is a flag with an environment fallback, grouped by concern
//! (serving, database, request limits, streams, connections, authentication, policy, outcome
//! texts, telemetry, webhooks, receipts). Invalid settings stop the broker at start with a message naming the
//! setting (clap does that for us). A broker embedded in tests is configured explicitly
//! ([`Config::for_tests`]) and never reads the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::broker::Limits;
use crate::domain::ToolResultTexts;

pub(crate) use crate::domain::time::{parse_duration, parse_duration_up_to};

pub use crate::receipts::ReceiptsMode;
pub use crate::store::StoreSettings;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "approval-broker",
    version,
    about = "A gRPC broker between LLM agents and the humans who approve their tool calls."
)]
pub struct Config {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeSettings,
    #[command(flatten)]
    pub push: crate::background::push::PushFlags,
    #[command(flatten)]
    pub store: StoreSettings,
    #[command(flatten)]
    pub requests: RequestLimits,
    #[command(flatten)]
    pub streams: StreamSettings,
    #[command(flatten)]
    pub connections: ConnectionSettings,
    #[command(flatten)]
    pub auth: AuthSettings,
    #[command(flatten)]
    pub policy: PolicySettings,
    #[command(flatten)]
    pub texts: OutcomeTexts,
    #[command(flatten)]
    pub telemetry: TelemetrySettings,
    #[command(flatten)]
    pub webhooks: WebhookSettings,
    #[command(flatten)]
    pub escalation: EscalationSettings,
    #[command(flatten)]
    pub lifecycle: LifecycleSettings,
    #[command(flatten)]
    pub receipts: ReceiptsSettings,
    #[command(flatten)]
    pub links: crate::door::links::LinkFlags,
    #[command(flatten)]
    pub slack: SlackFlags,
    #[command(flatten)]
    pub passkeys: crate::door::passkeys::PasskeyFlags,
}

/// What happens to calls nobody answers (see `domain::escalation`).
#[derive(Debug, Clone, Args)]
pub struct EscalationSettings {
    /// A JSON file holding the default escalation ladder, loaded at start:
    /// `{"steps": [{"after": "15m", "kind": "reminder", "endpoints": ["team"]}, ...]}`. Every call
    /// left to a human gets it, unless the ask rule that sent it there has a ladder of its own.
    /// None by default.
    #[arg(long, env = "APPROVALS_ESCALATION_FILE")]
    pub escalation_file: Option<PathBuf>,
}

/// Signed receipts for every outcome (docs/receipts.md).
#[derive(Debug, Clone, Args)]
pub struct ReceiptsSettings {
    /// Whether every outcome gets a signed receipt: `auto` (on with SQLite, whose key is
    /// generated beside the database on first start; on with Postgres when --receipt-key is
    /// given, else off with a warning), `on` (refuses to start without a key on Postgres), or
    /// `off`.
    #[arg(
        id = "receipts",
        long,
        env = "APPROVALS_RECEIPTS",
        default_value = "auto"
    )]
    pub mode: ReceiptsMode,

    /// The Ed25519 key receipts are signed with: a PKCS#8 `PRIVATE KEY` PEM (as `openssl genpkey
    /// -algorithm ed25519` writes) or a file of the 32-byte seed. Default with SQLite:
    /// `<database file>.receipt-key.pem`, created (mode 0600) on first start.
    #[arg(long, env = "APPROVALS_RECEIPT_KEY")]
    pub receipt_key: Option<PathBuf>,

    /// A file of the public keys this broker signed receipts with before its current one (key
    /// rotation), in the format `verify --key` reads: PEM blocks or base64 lines, each line
    /// optionally with `from=` and `until=` (RFC 3339). Served by `ListReceiptKeys` with their
    /// validity, and used to report whether older receipts verify. A line naming the current
    /// key gives the time it started signing (`from=`).
    #[arg(long, env = "APPROVALS_RECEIPT_RETIRED_KEYS")]
    pub receipt_retired_keys: Option<PathBuf>,
}

/// Where and how gRPC is served, and how it stops.
#[derive(Debug, Clone, Args)]
pub struct ServeSettings {
    /// The address to serve gRPC on.
    #[arg(long, env = "APPROVALS_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,

    /// A PEM certificate chain to serve TLS with (needs --tls-key).
    #[arg(long, env = "APPROVALS_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "APPROVALS_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// A PEM CA certificate: clients must present a certificate it signed (mutual TLS).
    #[arg(long, env = "APPROVALS_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Serve the approval inbox: the web page at `/` on this same port, and HTTP/1.1 for browsers
    /// on `http://` (the page and its gRPC-Web calls). `false`: no page, HTTP/2 only (gRPC, and
    /// gRPC-Web over HTTP/2, which carries the same tokens and limits as gRPC).
    #[arg(long, env = "APPROVALS_INBOX", default_value_t = true, action = clap::ArgAction::Set)]
    pub inbox: bool,

    /// On SIGTERM, how long open requests and commits get to finish before the broker exits.
    #[arg(long, env = "APPROVALS_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
}

/// How large requests and replies may be, and how much one agent may leave pending.
#[derive(Debug, Clone, Args)]
pub struct RequestLimits {
    /// The largest tool input accepted, in bytes of JSON text.
    #[arg(long, env = "APPROVALS_MAX_INPUT_BYTES", default_value_t = crate::domain::DEFAULT_MAX_INPUT_BYTES)]
    pub max_input_bytes: usize,

    /// The largest gRPC message accepted, in bytes.
    #[arg(long, env = "APPROVALS_MAX_MESSAGE_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_message_bytes: usize,

    /// The largest reply sent, in bytes (never more than --max-message-bytes). Listings are cut
    /// into pages under it; a write's reply lists what fits and counts the rest. The default,
    /// 4 MiB, is the receive limit of gRPC clients in most languages.
    #[arg(long, env = "APPROVALS_MAX_REPLY_BYTES", default_value_t = 4 * 1024 * 1024)]
    pub max_reply_bytes: usize,

    /// The most pending calls one agent may have (with auth off, every client is the same
    /// agent). New calls beyond it are refused with RESOURCE_EXHAUSTED, each for itself.
    #[arg(long, env = "APPROVALS_MAX_PENDING_PER_AGENT", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_pending_per_agent: u64,
}

/// The streams the broker holds open, and the events buffered for them.
#[derive(Debug, Clone, Args)]
pub struct StreamSettings {
    /// Undelivered events a subscriber may have queued before its stream is ended (it then
    /// resumes with `after_seq`).
    #[arg(long, env = "APPROVALS_SUBSCRIBER_BUFFER", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub subscriber_buffer: u32,

    /// Recent events kept in memory for live fan-out; consumers further behind read the store.
    #[arg(long, env = "APPROVALS_EVENT_BUFFER", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..))]
    pub event_buffer: u32,

    /// The most `Connect` and `WatchOutcomes` streams open at once.
    #[arg(long, env = "APPROVALS_MAX_AGENT_STREAMS", default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_agent_streams: u32,

    /// The most `Subscribe` streams open at once.
    #[arg(long, env = "APPROVALS_MAX_SUBSCRIBERS", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_subscribers: u32,

    /// The most `grpc.health.v1.Health/Watch` streams open at once (health needs no token, so
    /// this is what bounds them).
    #[arg(long, env = "APPROVALS_MAX_HEALTH_WATCHES", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_health_watches: u32,

    /// The most server reflection streams (v1 and v1alpha together) open at once; reflection
    /// needs no token, so this is what bounds them.
    #[arg(long, env = "APPROVALS_MAX_REFLECTION_STREAMS", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_reflection_streams: u32,
}

/// What one client connection may do: how many there are, how fast they must start, how often
/// they may ping, and how dead ones are noticed.
#[derive(Debug, Clone, Args)]
pub struct ConnectionSettings {
    /// The most concurrent HTTP/2 streams (RPCs) one client connection may open.
    #[arg(long, env = "APPROVALS_MAX_CONCURRENT_STREAMS", default_value_t = 1_024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent_streams: u32,

    /// The most client connections open at once; more are closed as soon as they are accepted.
    /// Keep it below the process's open-file limit (`ulimit -n`), which the store needs too.
    #[arg(long, env = "APPROVALS_MAX_CONNECTIONS", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// How long a new connection has to finish its TLS handshake and send the HTTP/2 preface
    /// before it is closed.
    #[arg(long, env = "APPROVALS_HANDSHAKE_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,

    /// The most HTTP/2 PING frames, and apart from them SETTINGS frames, a client connection may
    /// send in a second (pings that follow data the broker sent are free); past it the
    /// connection is closed with GOAWAY ENHANCE_YOUR_CALM.
    #[arg(long, env = "APPROVALS_MAX_CONTROL_FRAMES_PER_SECOND", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_control_frames_per_second: u32,

    /// How often to ping an idle client connection (HTTP/2 keepalive), so dead clients are noticed.
    #[arg(long, env = "APPROVALS_KEEPALIVE_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub keepalive_interval: Duration,

    /// How long a ping may go unanswered before the connection is closed.
    #[arg(long, env = "APPROVALS_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub keepalive_timeout: Duration,
}

impl ConnectionSettings {
    /// `http1`: whether browsers may speak HTTP/1.1 (the inbox is served); `authenticated`:
    /// whether the broker takes tokens.
    pub fn limits(
        &self,
        http1: bool,
        authenticated: bool,
    ) -> crate::door::connections::ConnectionLimits {
        crate::door::connections::ConnectionLimits {
            max_connections: self.max_connections as usize,
            handshake_timeout: self.handshake_timeout,
            max_control_frames_per_second: self.max_control_frames_per_second,
            http1,
            authenticated,
        }
    }
}

/// Who may call: bearer tokens from a file, inline, or both.
#[derive(Debug, Clone, Args)]
pub struct AuthSettings {
    /// A file of bearer tokens, one per line: `ROLE IDENTITY sha256:HEX` (role agent, approver
    /// or admin; hash from `approval-broker hash-token`). Naming no token source turns auth
    /// off; a named source with no token in it stops the broker.
    #[arg(long, env = "APPROVALS_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,

    /// Bearer tokens inline, in the same form, entries separated by `;` or new lines.
    #[arg(long, env = TOKENS_ENV, hide_env_values = true)]
    pub tokens: Option<String>,

    /// The OpenID issuer whose JWTs are accepted as bearer tokens (beside the static tokens),
    /// exactly as its tokens' `iss` spell it. Its keys come from `--jwt-jwks-url`, else from
    /// `<issuer>/.well-known/openid-configuration`. See docs/identity.md.
    #[arg(long, env = "APPROVALS_JWT_ISSUER", requires = "jwt_audience")]
    pub jwt_issuer: Option<String>,

    /// The audience a JWT's `aud` must include (the broker's client id or API identifier).
    #[arg(long, env = "APPROVALS_JWT_AUDIENCE", requires = "jwt_issuer")]
    pub jwt_audience: Option<String>,

    /// The issuer's JWKS URL, instead of discovery.
    #[arg(long, env = "APPROVALS_JWT_JWKS_URL", requires = "jwt_issuer")]
    pub jwt_jwks_url: Option<String>,

    /// A PEM CA certificate the identity provider's HTTPS certificate is checked with (a
    /// private CA), besides the Mozilla roots built in.
    #[arg(long, env = "APPROVALS_JWT_CA_FILE", requires = "jwt_issuer")]
    pub jwt_ca_file: Option<PathBuf>,

    /// Claim values mapped to roles: `ROLE=VALUE[,VALUE]` entries separated by `;`, e.g.
    /// `admin=broker-admins;approver=approvers;agent=approval-agents`. Required with an issuer.
    #[arg(long, env = "APPROVALS_JWT_ROLES")]
    pub jwt_roles: Option<String>,

    /// The claims whose values `--jwt-roles` maps (comma-separated; a string claim is read as
    /// space-separated values, a dotted name reads a nested claim: `realm_access.roles`).
    #[arg(long, env = "APPROVALS_JWT_ROLE_CLAIMS", default_value = "roles")]
    pub jwt_role_claims: String,

    /// The claim naming a person (approver, auditor, admin): `email` or `sub`.
    #[arg(long, env = "APPROVALS_JWT_IDENTITY_CLAIM", default_value = "email")]
    pub jwt_identity_claim: String,

    /// The claim naming an agent (a service client): `client_id`, `azp` or `sub`.
    #[arg(long, env = "APPROVALS_JWT_AGENT_CLAIM", default_value = "client_id")]
    pub jwt_agent_claim: String,

    /// The claim listing a person's approver groups.
    #[arg(long, env = "APPROVALS_JWT_GROUPS_CLAIM", default_value = "groups")]
    pub jwt_groups_claim: String,

    /// How far the broker's clock and the issuer's may disagree on `exp` and `nbf`.
    #[arg(long, env = "APPROVALS_JWT_CLOCK_SKEW", default_value = "60s", value_parser = parse_duration)]
    pub jwt_clock_skew: Duration,

    /// The least time between two fetches of the issuer's keys caused by tokens naming a key
    /// id not cached (forged tokens cannot make the broker fetch more often).
    #[arg(long, env = "APPROVALS_JWT_KEYS_REFETCH_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub jwt_keys_refetch_interval: Duration,

    /// People sign in to the inbox with the `--jwt-issuer` provider (OpenID Connect,
    /// Authorization Code with PKCE), the inbox a public client of this id; tokens whose `aud`
    /// is this id (their ID tokens) are accepted for people, never agents. See docs/identity.md.
    #[arg(long, env = "APPROVALS_INBOX_OIDC_CLIENT_ID", requires = "jwt_issuer")]
    pub inbox_oidc_client_id: Option<String>,

    /// The scopes the inbox asks for at sign-in, space-separated (`openid` among them).
    #[arg(
        long,
        env = "APPROVALS_INBOX_OIDC_SCOPES",
        default_value = "openid email profile"
    )]
    pub inbox_oidc_scopes: String,
}

/// How calls are judged before a person sees them.
#[derive(Debug, Clone, Args)]
pub struct PolicySettings {
    /// A JSON file of policy rules, loaded at start: `{"rules": [{"id", "tool", "effect", ...}]}`.
    /// Its rules replace the rules an earlier file loaded; rules made with CreateRule stay.
    #[arg(long, env = "APPROVALS_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,

    /// The deadline given to calls submitted without one, e.g. `90s`, `15m`, `1h30m`, `1d` (at most
    /// 366d). None by default.
    #[arg(long, env = "APPROVALS_DEFAULT_DEADLINE", value_parser = parse_duration)]
    pub default_deadline: Option<Duration>,

    /// Who may decide the calls that no ask rule names approvers for, and how many must agree,
    /// as JSON: `{"groups": ["ops"], "quorum": 2, "distinct_groups": false, "denials_to_deny":
    /// 1}` (every key optional). None by default: any approver decides, alone. Fixed on each
    /// call at submit (docs/approver-routing.md).
    #[arg(long, env = "APPROVALS_DEFAULT_APPROVERS", value_parser = parse_approvers)]
    pub default_approvers: Option<crate::domain::policy::Approvers>,
}

fn parse_approvers(text: &str) -> Result<crate::domain::policy::Approvers, String> {
    let value: serde_json::Value =
        crate::domain::json::parse("--default-approvers", text).map_err(|e| e.to_string())?;
    crate::domain::policy::Approvers::from_json("--default-approvers", &value)
        .map_err(|e| e.to_string())
}

/// The tool-result texts handed to the model with each outcome but APPROVED.
#[derive(Debug, Clone, Args)]
pub struct OutcomeTexts {
    /// The tool-result text for DENIED (a reason is appended as " Reason: ...").
    #[arg(long, env = "APPROVALS_TEXT_DENIED")]
    pub text_denied: Option<String>,
    /// The tool-result text for DENIED by a policy rule (the rule's description is appended as
    /// " Reason: ...").
    #[arg(long, env = "APPROVALS_TEXT_DENIED_BY_POLICY")]
    pub text_denied_by_policy: Option<String>,
    /// The tool-result text for SUPERSEDED.
    #[arg(long, env = "APPROVALS_TEXT_SUPERSEDED")]
    pub text_superseded: Option<String>,
    /// The tool-result text for SKIPPED.
    #[arg(long, env = "APPROVALS_TEXT_SKIPPED")]
    pub text_skipped: Option<String>,
    /// The tool-result text for EXPIRED.
    #[arg(long, env = "APPROVALS_TEXT_EXPIRED")]
    pub text_expired: Option<String>,
    /// The tool-result text for CANCELLED.
    #[arg(long, env = "APPROVALS_TEXT_CANCELLED")]
    pub text_cancelled: Option<String>,
}

impl OutcomeTexts {
    /// The configured texts, each unset one at its default.
    pub fn resolve(&self) -> ToolResultTexts {
        let defaults = ToolResultTexts::default();
        let pick = |set: &Option<String>, default: String| set.clone().unwrap_or(default);
        ToolResultTexts {
            denied: pick(&self.text_denied, defaults.denied),
            denied_by_policy: pick(&self.text_denied_by_policy, defaults.denied_by_policy),
            superseded: pick(&self.text_superseded, defaults.superseded),
            skipped: pick(&self.text_skipped, defaults.skipped),
            expired: pick(&self.text_expired, defaults.expired),
            cancelled: pick(&self.text_cancelled, defaults.cancelled),
        }
    }
}

/// What the broker tells its operators: metrics and the form of its logs.
#[derive(Debug, Clone, Args)]
pub struct TelemetrySettings {
    /// The address to serve Prometheus metrics on (plain HTTP, any path), or `off`.
    #[arg(long, env = "APPROVALS_METRICS_LISTEN", default_value = "127.0.0.1:9464", value_parser = parse_metrics_listen)]
    pub metrics_listen: MetricsListen,

    /// Log format: `text` (human-readable) or `json` (one object per line). The level is set
    /// by `RUST_LOG` (default `info`).
    #[arg(long, env = "APPROVALS_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"], global = true)]
    pub log_format: String,

    /// Export traces over OTLP/gRPC to this collector (`http://HOST:4317`). Off when unset
    /// (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is read too; `OTEL_SDK_DISABLED=true` turns it
    /// off). See docs/observability.md.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Where events are pushed over HTTP, and how delivery retries, pauses and fails over.
#[derive(Debug, Clone, Args)]
pub struct WebhookSettings {
    /// A JSON file of webhook endpoints, loaded at start:
    /// `{"webhooks": [{"id", "url", "secret", "event_kinds", "tool", "workspace", "agent",
    /// "format", "max_in_flight"}]}`. Its endpoints replace those an earlier file loaded (each
    /// keeps its cursor); endpoints made with CreateWebhook stay.
    #[arg(long, env = "APPROVALS_WEBHOOKS_FILE")]
    pub webhooks_file: Option<PathBuf>,

    /// Failed deliveries in a row after which a webhook endpoint is paused.
    #[arg(long, env = "APPROVALS_WEBHOOK_PAUSE_AFTER", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub webhook_pause_after: u32,

    /// The first webhook retry's delay; each further one doubles (with jitter).
    #[arg(long, env = "APPROVALS_WEBHOOK_RETRY_MIN", default_value = "1s", value_parser = parse_duration)]
    pub webhook_retry_min: Duration,

    /// The longest delay between webhook retries.
    #[arg(long, env = "APPROVALS_WEBHOOK_RETRY_MAX", default_value = "5m", value_parser = parse_duration)]
    pub webhook_retry_max: Duration,

    /// How long one webhook request may take, connecting included.
    #[arg(long, env = "APPROVALS_WEBHOOK_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub webhook_timeout: Duration,

    /// How long a replica's claim on delivering a webhook endpoint lasts without renewal: how
    /// soon another replica takes over after it died.
    #[arg(long, env = "APPROVALS_WEBHOOK_LEASE", default_value = "15s", value_parser = parse_duration)]
    pub webhook_lease: Duration,

    /// The inbox's base URL as people open it (`https://approvals.example.com`), for the
    /// links to calls in Slack-format webhook messages.
    #[arg(long, env = "APPROVALS_WEBHOOKS_INBOX_URL")]
    pub webhooks_inbox_url: Option<String>,

    /// Internal receivers webhooks may reach, comma-separated: networks (`10.1.0.0/16`,
    /// `127.0.0.1`, `fd00::/8`) and host names (`hooks.internal`). Without them, delivery
    /// refuses loopback, link-local, private, shared, unique-local and unspecified addresses,
    /// checked after DNS on the address it connects to.
    #[arg(long, env = "APPROVALS_WEBHOOK_ALLOW_HOSTS", value_delimiter = ',', value_parser = parse_allowed_host)]
    pub webhook_allow_hosts: Vec<crate::background::webhooks::egress::AllowedHost>,
}

fn parse_allowed_host(
    text: &str,
) -> Result<crate::background::webhooks::egress::AllowedHost, String> {
    text.parse()
}

/// How long decided calls are kept, and where backups go.
#[derive(Debug, Clone, Args)]
pub struct LifecycleSettings {
    /// Prune calls decided more than this long ago (e.g. `30d`), with their events; pending
    /// calls, grants and rules are never pruned. Unset (the default): keep everything.
    #[arg(long, env = "APPROVALS_RETAIN_DECIDED", value_parser = parse_retention)]
    pub retain_decided: Option<Duration>,

    /// How often retention runs (with --retain-decided).
    #[arg(long, env = "APPROVALS_PRUNE_EVERY", default_value = "1m", value_parser = parse_duration)]
    pub prune_every: Duration,

    /// Decided calls retention looks at per transaction: small, so writes run between chunks.
    #[arg(long, env = "APPROVALS_PRUNE_CHUNK", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub prune_chunk: u32,

    /// SQLite: the directory the Backup RPC writes its copies to. Default: the database file's
    /// own directory.
    #[arg(long, env = "APPROVALS_BACKUP_DIR")]
    pub backup_dir: Option<PathBuf>,
}

impl LifecycleSettings {
    /// Retention's policy, if `--retain-decided` turns it on.
    pub fn retention(&self) -> Option<crate::background::retention::RetentionPolicy> {
        self.retain_decided.map(
            |keep_decided| crate::background::retention::RetentionPolicy {
                keep_decided,
                every: self.prune_every,
                chunk: self.prune_chunk,
            },
        )
    }
}

/// Where metrics are served, if anywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsListen {
    Off,
    On(SocketAddr),
}

fn parse_metrics_listen(value: &str) -> Result<MetricsListen, String> {
    if value.eq_ignore_ascii_case("off") {
        return Ok(MetricsListen::Off);
    }
    value
        .parse()
        .map(MetricsListen::On)
        .map_err(|_| format!("expected an address such as 127.0.0.1:9464, or `off`; got `{value}`"))
}

/// What to do instead of serving.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Apply the database migrations and exit (for operators who migrate before a rollout).
    Migrate,
    /// Print the `sha256:...` hash to configure a bearer token with (reads the token from
    /// standard input when none is given), e.g. `agent build-bot sha256:...`.
    HashToken {
        /// The token; omit it to read it from standard input (keeps it out of shell history).
        token: Option<String>,
    },
    /// Answer an agent host's approval hook through a running broker (prints the host's
    /// decision JSON): `hook claude-code`, `codex`, `gemini-cli`, `copilot` or `cursor`; see
    /// docs/hosts.md.
    #[command(subcommand)]
    Hook(crate::agent::hook::HookCommand),
    /// Stand between an MCP client and an MCP server, putting every tool call through a running
    /// broker; see `mcp-gateway --help`.
    McpGateway(crate::agent::mcp::McpGatewayArgs),
    /// Stand between an editor (an Agent Client Protocol client) and an ACP agent, answering the
    /// agent's permission requests through a running broker; see `acp-proxy --help`.
    AcpProxy(crate::agent::acp::AcpProxyArgs),
    /// Write the audit of a time range as JSON Lines (one object per call), read from the
    /// database directly (`--database-url`); safe while the broker runs.
    Export(crate::commands::export::ExportArgs),
    /// Verify signed receipts offline against the broker's public key: one receipt, or an
    /// exported chain (in order, none missing). Exits non-zero naming what failed.
    Verify(crate::commands::verify::VerifyArgs),
}

impl Config {
    /// The settings of the command line and the environment (`APPROVALS_*`, `DATABASE_URL`):
    /// what the binary runs with.
    pub fn from_command_line() -> Self {
        let mut config = Config::parse();
        // clap treats an empty environment variable as unset; an operator who set
        // `APPROVALS_TOKENS=""` meant it, and `tokens()` refuses a source that holds no token.
        if config.auth.tokens.is_none() {
            config.auth.tokens =
                std::env::var_os(TOKENS_ENV).map(|v| v.to_string_lossy().into_owned());
        }
        config
    }

    /// Every setting at its default, with the database at `database_url`, whatever the
    /// environment says: for tests and embedding, so a developer's exported `APPROVALS_*` or
    /// `DATABASE_URL` never changes a broker built here.
    pub fn for_tests(database_url: impl Into<String>) -> Self {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let defaults = Config::command()
            .mut_args(|arg| arg.env(None::<&'static str>))
            .get_matches_from(["approval-broker"]);
        let mut config = Config::from_arg_matches(&defaults).expect("the defaults parse");
        config.store.database_url = database_url.into();
        config
    }

    /// What the broker enforces on requests and streams.
    pub fn limits(&self) -> Limits {
        Limits {
            max_input_bytes: self.requests.max_input_bytes,
            default_deadline: self.policy.default_deadline,
            subscriber_buffer: self.streams.subscriber_buffer as usize,
            max_agent_streams: self.streams.max_agent_streams as usize,
            max_subscribers: self.streams.max_subscribers as usize,
            max_reply_bytes: self
                .requests
                .max_reply_bytes
                .min(self.requests.max_message_bytes),
            max_pending_per_agent: self.requests.max_pending_per_agent,
            default_approvers: self.policy.default_approvers.clone(),
        }
    }

    /// The size no reply may exceed; refused when one item of the largest input allowed could
    /// not fit.
    pub fn reply_limit(&self) -> crate::Result<usize> {
        crate::surface::grpc::oversize::reply_limit(
            self.requests.max_reply_bytes,
            self.requests.max_message_bytes,
            self.requests.max_input_bytes,
        )
    }

    /// The configured bearer tokens (file and inline together); `None` when no token source is
    /// named at all, which turns auth off. A source that is named but holds no token (an empty or
    /// comment-only file, `APPROVALS_TOKENS=""`) is an error: running without auth must be chosen
    /// by naming no source, never reached by a file that lost its contents.
    pub fn tokens(&self) -> crate::Result<Option<crate::door::auth::Tokens>> {
        let mut text = String::new();
        let mut named = false;
        if let Some(path) = &self.auth.tokens_file {
            let setting = "--tokens-file / APPROVALS_TOKENS_FILE";
            let file = setting_file(setting, path, |text| {
                Ok::<_, std::convert::Infallible>(text.to_owned())
            })?;
            let what = format!("{setting} ({})", path.display());
            let tokens = crate::door::auth::Tokens::parse(&file, &what)?;
            if tokens.is_empty() {
                return Err(no_token_in(&what));
            }
            named = true;
            text.push_str(&file);
            text.push('\n');
        }
        if let Some(inline) = &self.auth.tokens {
            let what = "--tokens / APPROVALS_TOKENS";
            if crate::door::auth::Tokens::parse(inline, what)?.is_empty() {
                return Err(no_token_in(what));
            }
            named = true;
            text.push_str(inline);
        }
        if !named {
            return Ok(None);
        }
        // Parsed together, so the same token under two sources is refused like one listed twice.
        crate::door::auth::Tokens::parse(&text, "--tokens-file and --tokens together").map(Some)
    }
}

impl Config {
    /// The JWT verifier settings; `None` without `--jwt-issuer`. An issuer without a role
    /// mapping, or with an unusable URL, stops the broker.
    pub fn jwt(
        &self,
    ) -> crate::Result<
        Option<(
            crate::door::auth::jwt::Settings,
            crate::door::auth::jwks::HttpKeys,
        )>,
    > {
        use crate::door::auth::jwt::{ClaimMapping, Settings};
        let auth = &self.auth;
        let (Some(issuer), Some(audience)) = (&auth.jwt_issuer, &auth.jwt_audience) else {
            return Ok(None);
        };
        let roles_setting = "--jwt-roles / APPROVALS_JWT_ROLES";
        let roles = auth.jwt_roles.as_deref().ok_or_else(|| {
            crate::Error::invalid(
                roles_setting,
                "is required with --jwt-issuer: it says which claim values make an agent, an \
                 approver, an auditor or an admin",
            )
        })?;
        let roles = ClaimMapping::parse_roles(roles)
            .map_err(|why| crate::Error::invalid(roles_setting, why))?;
        let mut keys = crate::door::auth::jwks::HttpKeys::new(issuer, auth.jwt_jwks_url.as_deref())
            .map_err(|why| crate::Error::invalid("--jwt-issuer / --jwt-jwks-url", why))?;
        if let Some(path) = &auth.jwt_ca_file {
            let tls = crate::door::outbound::Tls::with_ca_file(path)
                .map_err(|why| crate::Error::invalid("--jwt-ca-file", why))?;
            keys = keys.with_tls(tls);
        }
        let role_claims = auth
            .jwt_role_claims
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        let settings = Settings {
            issuer: issuer.clone(),
            audience: audience.clone(),
            person_audience: auth.inbox_oidc_client_id.clone(),
            clock_skew: auth.jwt_clock_skew,
            refetch_interval: auth.jwt_keys_refetch_interval,
            claims: ClaimMapping {
                identity_claim: auth.jwt_identity_claim.clone(),
                agent_claim: auth.jwt_agent_claim.clone(),
                role_claims,
                roles,
                groups_claim: auth.jwt_groups_claim.clone(),
            },
        };
        Ok(Some((settings, keys)))
    }

    /// What the inbox tells the page to sign people in with; `None` without
    /// `--inbox-oidc-client-id`. Scopes without `openid` stop the broker.
    pub fn inbox_sign_in(&self) -> crate::Result<Option<crate::surface::inbox::SignIn>> {
        let auth = &self.auth;
        let (Some(client_id), Some(issuer)) = (&auth.inbox_oidc_client_id, &auth.jwt_issuer) else {
            return Ok(None);
        };
        crate::surface::inbox::SignIn::new(
            issuer,
            client_id,
            &auth.inbox_oidc_scopes,
            &auth.jwt_identity_claim,
        )
        .map(Some)
        .map_err(|why| crate::Error::invalid("--inbox-oidc-client-id / --inbox-oidc-scopes", why))
    }
}

/// The file a setting names, read and parsed by `parse`: an unreadable file, or one `parse`
/// refuses, is an error naming the setting and the file (and what `parse` says is wrong). Every
/// `--X-file` setting is read here.
fn setting_file<T, E: std::fmt::Display>(
    setting: &str,
    path: &std::path::Path,
    parse: impl FnOnce(&str) -> std::result::Result<T, E>,
) -> crate::Result<T> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        crate::Error::invalid(setting, format!("cannot read {}: {e}", path.display()))
    })?;
    parse(&text).map_err(|e| crate::Error::invalid(setting, format!("{}: {e}", path.display())))
}

/// The environment variable of `--tokens`.
const TOKENS_ENV: &str = "APPROVALS_TOKENS";

fn no_token_in(source: &str) -> crate::Error {
    crate::Error::invalid(
        source,
        "holds no token, so authentication would be off; add `ROLE IDENTITY sha256:HEX` lines, \
         or name no token source at all to run without authentication",
    )
}

impl Config {
    /// The rules of `--policy-file`, if one is set. An unreadable or invalid file is an error
    /// naming the setting and the rule at fault.
    pub fn policy_rules(&self) -> crate::Result<Option<Vec<crate::domain::policy::Rule>>> {
        let Some(path) = &self.policy.policy_file else {
            return Ok(None);
        };
        let setting = "--policy-file / APPROVALS_POLICY_FILE";
        setting_file(setting, path, |text| {
            crate::domain::policy::parse_policy_file(text, self.requests.max_input_bytes)
        })
        .map(Some)
    }
}

impl Config {
    /// The default ladder of `--escalation-file` (empty if none is set). An unreadable or
    /// invalid file is an error naming the setting and the step at fault. Steps due at or after
    /// `--default-deadline` are allowed (a call's own deadline may be later) but warned about:
    /// for calls with that deadline they never fire.
    pub fn escalation_ladder(&self) -> crate::Result<crate::domain::escalation::Ladder> {
        let Some(path) = &self.escalation.escalation_file else {
            return Ok(Default::default());
        };
        let setting = "--escalation-file / APPROVALS_ESCALATION_FILE";
        let ladder = setting_file(
            setting,
            path,
            crate::domain::escalation::parse_escalation_file,
        )?;
        if let Some(deadline) = self.policy.default_deadline {
            for (i, step) in ladder.steps().iter().enumerate() {
                if step.after >= deadline {
                    tracing::warn!(
                        field = %format!("steps[{i}].after"),
                        after = %humantime::format_duration(step.after),
                        default_deadline = %humantime::format_duration(deadline),
                        "an escalation step is due at or after --default-deadline: calls with \
                         that deadline expire before it fires"
                    );
                }
            }
        }
        tracing::info!(
            steps = ladder.steps().len(),
            "default escalation ladder loaded"
        );
        Ok(ladder)
    }

    /// The endpoints of `--webhooks-file`, if one is set. An unreadable or invalid file is an
    /// error naming the setting and the endpoint at fault.
    pub fn webhooks_file(&self) -> crate::Result<Option<Vec<crate::domain::webhook::Webhook>>> {
        let Some(path) = &self.webhooks.webhooks_file else {
            return Ok(None);
        };
        let setting = "--webhooks-file / APPROVALS_WEBHOOKS_FILE";
        let hooks = setting_file(setting, path, crate::domain::webhook::parse_webhooks_file)?;
        let egress = self.webhook_egress();
        for (i, hook) in hooks.iter().enumerate() {
            egress.check_url(&hook.url).map_err(|reason| {
                crate::Error::invalid(
                    setting,
                    format!("{}: webhooks[{i}].url: {reason}", path.display()),
                )
            })?;
        }
        Ok(Some(hooks))
    }

    fn webhook_egress(&self) -> crate::background::webhooks::egress::EgressPolicy {
        crate::background::webhooks::egress::EgressPolicy::new(
            self.webhooks.webhook_allow_hosts.clone(),
        )
    }

    pub fn webhook_delivery(&self) -> crate::background::webhooks::DeliverySettings {
        crate::background::webhooks::DeliverySettings {
            pause_after: self.webhooks.webhook_pause_after,
            retry_min: self.webhooks.webhook_retry_min,
            retry_max: self
                .webhooks
                .webhook_retry_max
                .max(self.webhooks.webhook_retry_min),
            timeout: self.webhooks.webhook_timeout,
            lease: self.webhooks.webhook_lease,
            inbox_url: self.webhooks.webhooks_inbox_url.clone(),
            links: None,
            egress: std::sync::Arc::new(self.webhook_egress()),
        }
    }
}

// --- Slack app mode (issue 49) ------------------------------------------------------------------

/// Slack app mode: pending calls posted to channels with Approve / Deny / Open, and the clicks
/// decided through the same gate (docs/notifications.md). Off unless `--slack-file` is set.
#[derive(Debug, Clone, Args)]
pub struct SlackFlags {
    /// A JSON file of the channels calls are posted to and the people who may decide from Slack:
    /// `{"channels": [{"channel", "workspace", "tool", "group"}], "people": [{"slack_user",
    /// "email", "identity", "groups"}]}`. Setting it turns Slack app mode on.
    #[arg(long, env = "APPROVALS_SLACK_FILE")]
    pub slack_file: Option<PathBuf>,

    /// A file holding the bot token (`xoxb-…`); or set APPROVALS_SLACK_BOT_TOKEN.
    #[arg(long, env = "APPROVALS_SLACK_BOT_TOKEN_FILE")]
    pub slack_bot_token_file: Option<PathBuf>,

    /// The bot token itself: set it in the environment (a flag would show it in `ps`).
    #[arg(
        long,
        env = "APPROVALS_SLACK_BOT_TOKEN",
        hide = true,
        hide_env_values = true
    )]
    pub slack_bot_token: Option<String>,

    /// A file holding the app's signing secret; or set APPROVALS_SLACK_SIGNING_SECRET.
    #[arg(long, env = "APPROVALS_SLACK_SIGNING_SECRET_FILE")]
    pub slack_signing_secret_file: Option<PathBuf>,

    /// The signing secret itself: set it in the environment.
    #[arg(
        long,
        env = "APPROVALS_SLACK_SIGNING_SECRET",
        hide = true,
        hide_env_values = true
    )]
    pub slack_signing_secret: Option<String>,

    /// Slack's Web API base URL (a test points it at a loopback server, which
    /// --webhook-allow-hosts must then allow).
    #[arg(long, env = "APPROVALS_SLACK_API_URL", default_value = crate::surface::slack::DEFAULT_API_URL)]
    pub slack_api_url: String,

    /// Attempts at one Web API call (post, update, thread); the waits between them are
    /// --webhook-retry-min doubling up to --webhook-retry-max. A post or update that fails them
    /// all is tried again later, in rounds (docs/notifications.md).
    #[arg(long, env = "APPROVALS_SLACK_ATTEMPTS", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub slack_attempts: u32,
}

impl Config {
    /// Slack app mode's settings, when `--slack-file` turns it on: the file, the token and the
    /// signing secret read, and the API URL checked against the egress policy, at start.
    pub fn slack(&self) -> crate::Result<Option<crate::surface::slack::SlackSettings>> {
        let Some(path) = &self.slack.slack_file else {
            return Ok(None);
        };
        let (routes, mut people) = setting_file(
            "--slack-file / APPROVALS_SLACK_FILE",
            path,
            crate::surface::slack::parse_file,
        )?;
        if let Some(tokens) = self.tokens()? {
            crate::surface::slack::groups_from_tokens(&mut people, |identity| {
                tokens.approver_groups(identity)
            });
        }
        let secret = |value: &Option<String>, file: &Option<PathBuf>, setting: &str| {
            let text = match (value, file) {
                (Some(value), None) => value.clone(),
                (None, Some(file)) => {
                    setting_file(setting, file, |t| Ok::<_, String>(t.to_owned()))?
                }
                (Some(_), Some(_)) => {
                    return Err(crate::Error::invalid(
                        setting,
                        "set either the file or the variable, not both",
                    ));
                }
                (None, None) => {
                    return Err(crate::Error::invalid(
                        setting,
                        "is required when --slack-file is set",
                    ));
                }
            };
            let text = text.trim().to_owned();
            if text.is_empty() {
                return Err(crate::Error::invalid(setting, "is empty"));
            }
            Ok(text)
        };
        let bot_token = secret(
            &self.slack.slack_bot_token,
            &self.slack.slack_bot_token_file,
            "--slack-bot-token-file / APPROVALS_SLACK_BOT_TOKEN",
        )?;
        let signing_secret = secret(
            &self.slack.slack_signing_secret,
            &self.slack.slack_signing_secret_file,
            "--slack-signing-secret-file / APPROVALS_SLACK_SIGNING_SECRET",
        )?;
        let api_url = crate::domain::webhook::WebhookUrl::parse(
            "--slack-api-url",
            &self.slack.slack_api_url,
        )?;
        let egress = self.webhook_egress();
        egress
            .check_url(&api_url)
            .map_err(|reason| crate::Error::invalid("--slack-api-url", reason))?;
        Ok(Some(crate::surface::slack::SlackSettings {
            api_url: api_url.as_str().to_owned(),
            bot_token,
            signing_secret,
            routes,
            people,
            inbox_url: self.webhooks.webhooks_inbox_url.clone(),
            timeout: self.webhooks.webhook_timeout,
            retry_min: self.webhooks.webhook_retry_min,
            retry_max: self
                .webhooks
                .webhook_retry_max
                .max(self.webhooks.webhook_retry_min),
            attempts: self.slack.slack_attempts,
            egress: std::sync::Arc::new(egress),
        }))
    }
}

/// The longest retention: a century, surely beyond any audit rule.
const MAX_RETENTION: Duration = Duration::from_secs(36_500 * 86_400);

/// A retention period: a duration as [`parse_duration`] reads it, up to [`MAX_RETENTION`]
/// (years of audit are common, so the cap of other settings does not apply).
fn parse_retention(s: &str) -> Result<Duration, String> {
    parse_duration_up_to(s, MAX_RETENTION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::time::MAX_SETTING_DURATION;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn durations_that_overflow_or_exceed_the_cap_are_refused_not_wrapped() {
        // Once accepted and wrapped to 59 minutes.
        let err = parse_duration("5124095576030432h").unwrap_err();
        assert!(err.contains("5124095576030432h"), "{err}");
        assert!(parse_duration("99999999999999999999").is_err());
        assert!(parse_duration("367d").unwrap_err().contains("longer than"));
        assert_eq!(parse_duration("366d"), Ok(MAX_SETTING_DURATION));
        let err =
            Config::try_parse_from(["approval-broker", "--default-deadline", "5124095576030432h"])
                .unwrap_err()
                .to_string();
        assert!(err.contains("--default-deadline"), "{err}");
    }

    #[test]
    fn retention_is_off_by_default_so_everything_is_kept_and_takes_years() {
        let config = Config::for_tests("sqlite://a.db");
        assert_eq!(config.lifecycle.retain_decided, None);
        assert!(config.lifecycle.retention().is_none());
        let config =
            Config::try_parse_from(["approval-broker", "--retain-decided", "730d"]).unwrap();
        let policy = config.lifecycle.retention().expect("on");
        assert_eq!(policy.keep_decided, Duration::from_secs(730 * 86_400));
        assert_eq!(policy.every, Duration::from_secs(60));
        let err = Config::try_parse_from(["approval-broker", "--retain-decided", "0s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--retain-decided"), "{err}");
    }

    #[test]
    fn invalid_settings_are_refused_naming_the_setting() {
        let err = Config::try_parse_from(["approval-broker", "--sqlite-synchronous", "off"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--sqlite-synchronous"), "{err}");
        let err = Config::try_parse_from(["approval-broker", "--listen", "nowhere"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--listen"), "{err}");
    }

    #[test]
    fn a_webhooks_file_aimed_inward_stops_the_broker_unless_the_allow_list_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("webhooks.json");
        std::fs::write(
            &file,
            r#"{"webhooks": [{"id": "ops", "url": "http://169.254.169.254/latest",
                "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}]}"#,
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let config = Config::try_parse_from(["approval-broker", "--webhooks-file", path]).unwrap();
        let err = config.webhooks_file().unwrap_err().to_string();
        assert!(
            err.contains("webhooks[0].url") && err.contains("link-local"),
            "{err}"
        );
        let config = Config::try_parse_from([
            "approval-broker",
            "--webhooks-file",
            path,
            "--webhook-allow-hosts",
            "10.0.0.0/8,169.254.169.254",
        ])
        .unwrap();
        assert_eq!(config.webhooks.webhook_allow_hosts.len(), 2);
        assert_eq!(config.webhooks_file().unwrap().unwrap().len(), 1);
        let err =
            Config::try_parse_from(["approval-broker", "--webhook-allow-hosts", "10.0.0.0/40"])
                .unwrap_err()
                .to_string();
        assert!(err.contains("--webhook-allow-hosts"), "{err}");
    }
}
