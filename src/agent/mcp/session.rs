//! Which broker session a tool call goes into, and which call id it gets. A call is identified
//! at the broker by (session, call id) and submitting the same pair again returns the stored
//! call and its outcome, so two different tool calls must never share a pair. An MCP request id
//! cannot be the call id: ids start again at 0 on every client connection, and a client may use
//! an id again once its request was answered (JSON-RPC asks only that ids of requests still open
//! differ), so a reused id would be handed the earlier call's APPROVED outcome and run the tool
//! again with nobody asked. So every `tools/call` the connection receives gets the next number of
//! the connection's own count, and a session that outlives a connection (given by flag or by the
//! environment) also gets the connection's id in front. MCP never sends a request again to mean
//! the same call (a Streamable HTTP client that lost its stream resumes it with `GET` and
//! `Last-Event-ID`, which replays the answer without a new request), so no retry is lost.

use std::sync::atomic::{AtomicU64, Ordering};

use uuid::Uuid;

/// Where the session id comes from when `--session` is not given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionSource {
    /// A fresh session per client connection (per MCP session over HTTP).
    Connection,
    /// The value of this environment variable, read at start.
    Env(String),
}

impl SessionSource {
    /// `connection` or `env:NAME`.
    pub fn parse(text: &str) -> Result<SessionSource, String> {
        if text == "connection" {
            return Ok(SessionSource::Connection);
        }
        match text.strip_prefix("env:") {
            Some(name) if !name.is_empty() => Ok(SessionSource::Env(name.to_owned())),
            _ => Err(format!(
                "expected `connection` or `env:NAME` (an environment variable); got `{text}`"
            )),
        }
    }
}

/// How every connection of this gateway names its session and its calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionPolicy {
    /// One session per connection, named after it; call ids are the MCP request ids.
    PerConnection,
    /// One session for every connection; call ids carry the connection.
    Shared(String),
}

impl SessionPolicy {
    /// The policy the flags ask for; an `env:` source must name a set, non-empty variable.
    pub fn from_flags(
        session: Option<&str>,
        source: &SessionSource,
    ) -> Result<SessionPolicy, String> {
        if let Some(session) = session {
            return Ok(SessionPolicy::Shared(session.to_owned()));
        }
        match source {
            SessionSource::Connection => Ok(SessionPolicy::PerConnection),
            SessionSource::Env(name) => match std::env::var(name) {
                Ok(value) if !value.is_empty() => Ok(SessionPolicy::Shared(value)),
                _ => Err(format!(
                    "--session-from env:{name}: the environment variable {name} is not set \
                     (or empty), so no session id"
                )),
            },
        }
    }

    /// The names one client connection uses.
    pub fn connection(&self) -> ConnectionNames {
        let connection = Uuid::now_v7().simple().to_string();
        match self {
            SessionPolicy::PerConnection => ConnectionNames {
                session_id: format!("mcp-{connection}"),
                call_prefix: None,
                calls: AtomicU64::new(0),
            },
            SessionPolicy::Shared(session) => ConnectionNames {
                session_id: session.clone(),
                call_prefix: Some(connection),
                calls: AtomicU64::new(0),
            },
        }
    }
}

/// The session and call ids of one client connection.
#[derive(Debug)]
pub struct ConnectionNames {
    pub session_id: String,
    call_prefix: Option<String>,
    /// How many tool calls the connection has received.
    calls: AtomicU64,
}

impl ConnectionNames {
    /// The broker call id of the next `tools/call`, whose MCP request id is `request_id` (a
    /// number or a string, as sent): `N/ID`, the call's number on this connection (from 1) and
    /// the request id, for people to read; the number alone keeps it unique.
    pub fn next_call_id(&self, request_id: &str) -> String {
        let number = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        match &self.call_prefix {
            None => format!("{number}/{request_id}"),
            Some(prefix) => format!("{prefix}/{number}/{request_id}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_per_connection_numbers_its_calls_and_shows_the_request_id() {
        let policy = SessionPolicy::from_flags(None, &SessionSource::Connection).unwrap();
        let (a, b) = (policy.connection(), policy.connection());
        assert_ne!(a.session_id, b.session_id);
        assert!(a.session_id.starts_with("mcp-"));
        assert_eq!(a.next_call_id("7"), "1/7");
        assert_eq!(a.next_call_id("8"), "2/8");
    }

    #[test]
    fn a_request_id_used_again_is_a_new_call() {
        let policy = SessionPolicy::from_flags(None, &SessionSource::Connection).unwrap();
        let names = policy.connection();
        let first = names.next_call_id("1");
        let again = names.next_call_id("1");
        assert_ne!(first, again);
    }

    #[test]
    fn a_shared_session_never_reuses_a_call_id_across_connections() {
        let policy =
            SessionPolicy::from_flags(Some("agent-1"), &SessionSource::Connection).unwrap();
        let (a, b) = (policy.connection(), policy.connection());
        assert_eq!(
            (a.session_id.as_str(), b.session_id.as_str()),
            ("agent-1", "agent-1")
        );
        let (first, second) = (a.next_call_id("0"), b.next_call_id("0"));
        assert_ne!(first, second);
        assert!(first.ends_with("/1/0"), "{first}");
    }

    #[test]
    fn sources_parse_and_an_unset_variable_is_refused() {
        assert_eq!(
            SessionSource::parse("connection"),
            Ok(SessionSource::Connection)
        );
        assert_eq!(
            SessionSource::parse("env:CONVERSATION"),
            Ok(SessionSource::Env("CONVERSATION".into()))
        );
        assert!(SessionSource::parse("env:").is_err());
        assert!(SessionSource::parse("client").is_err());
        let unset = SessionSource::Env("APPROVALS_TEST_SURELY_UNSET_VARIABLE".into());
        let err = SessionPolicy::from_flags(None, &unset).unwrap_err();
        assert!(
            err.contains("APPROVALS_TEST_SURELY_UNSET_VARIABLE"),
            "{err}"
        );
    }
}
