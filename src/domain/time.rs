//! Instants as microseconds since the Unix epoch: the one representation the domain and the
//! store share.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The furthest ahead a deadline may be: a call nobody may decide for more than a year is a
/// mistake, and the cap keeps every deadline printable as a protobuf Timestamp.
pub const MAX_DEADLINE_AHEAD: Duration = Duration::from_secs(366 * 24 * 3600);

/// The range of a protobuf `Timestamp` (0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999999Z),
/// in seconds since the Unix epoch. Outside it, clients' JSON libraries cannot print an instant.
pub const PROTO_TIMESTAMP_SECONDS: std::ops::RangeInclusive<i64> =
    -62_135_596_800..=253_402_300_799;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    pub fn now() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self(since.as_micros() as i64)
    }

    pub fn from_micros(micros: i64) -> Self {
        Self(micros)
    }

    pub fn as_micros(self) -> i64 {
        self.0
    }

    pub fn saturating_add(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(d.as_micros().min(i64::MAX as u128) as i64),
        )
    }

    pub fn saturating_sub(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_sub(d.as_micros().min(i64::MAX as u128) as i64),
        )
    }

    /// How long from `self` until `later`; zero if `later` is not later.
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_micros(later.0.saturating_sub(self.0).max(0) as u64)
    }
}

/// The longest duration any setting takes: longer is surely a typo (and far beyond it, instants
/// would overflow). Deadlines have the same cap ([`MAX_DEADLINE_AHEAD`]).
pub const MAX_SETTING_DURATION: Duration = MAX_DEADLINE_AHEAD;

/// A duration such as `500ms`, `90s`, `15m`, `1h30m` or `1d` (humantime's syntax), or a bare
/// number of seconds. Zero, overflow and anything over [`MAX_SETTING_DURATION`] are refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_duration_up_to(s, MAX_SETTING_DURATION)
}

pub fn parse_duration_up_to(s: &str, max: Duration) -> Result<Duration, String> {
    let s = s.trim();
    let d = if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        s.parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|_| format!("`{s}` is too large"))?
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("`{s}` is not a duration like 90s, 15m, 1h30m or 1d: {e}"))?
    };
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    if d > max {
        return Err(format!(
            "`{s}` is longer than the most this setting takes, {}",
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}
