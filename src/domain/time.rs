//! Instants as microseconds since the Unix epoch: the one representation the domain and the
//! store share.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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

    /// How long from `self` until `later`; zero if `later` is not later.
    pub fn until(self, later: Timestamp) -> Duration {
        Duration::from_micros(later.0.saturating_sub(self.0).max(0) as u64)
    }
}
