//! Rounds of retries for what a notifier could not deliver within its own attempts (a Slack
//! message not posted or updated, a Web Push not accepted): one mechanism for both, so they
//! wait, give up and stay bounded alike. Each entry is keyed by what it brings in line (a call,
//! or a call on one subscription) and carries what its notifier needs to know of it; a round
//! reads the call as it is then, so nothing here knows what a call is.
//!
//! The rounds wait `first` (the notifier's `--webhook-retry-max`), then twice that, and so on
//! (each at most [`MAX_ROUND_WAIT`]), [`ROUNDS`] of them; then the entry is given up (the
//! notifier logs it). At most [`MAX_WAITING`] entries wait at once: past that a new one is
//! given up at once, so a notifier down for long holds bounded memory.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Rounds after the first failure before an entry is given up.
pub const ROUNDS: u32 = 6;

/// The longest wait between two rounds.
pub const MAX_ROUND_WAIT: Duration = Duration::from_secs(3600);

/// The most entries waiting at once.
pub const MAX_WAITING: usize = 10_000;

/// One entry waiting for its next round.
#[derive(Debug, Clone)]
pub struct Waiting<T> {
    /// Rounds tried so far.
    pub round: u32,
    due: Instant,
    /// What the notifier keeps of the entry.
    pub data: T,
}

/// The entries waiting for a round, by key.
pub struct Rounds<K, T> {
    first: Duration,
    waiting: Mutex<HashMap<K, Waiting<T>>>,
    added: Notify,
}

/// What became of an entry handed back after a failed round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Waits for its next round.
    Scheduled,
    /// Tried [`ROUNDS`] times, or no room: given up.
    GivenUp,
}

impl<K: Eq + Hash + Clone, T> Rounds<K, T> {
    /// Rounds whose first waits `first`.
    pub fn new(first: Duration) -> Self {
        Self {
            first,
            waiting: Mutex::new(HashMap::new()),
            added: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<K, Waiting<T>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `key` failed every attempt: it waits for its first round. One already waiting keeps its
    /// place and folds `data` into its own with `merge`.
    pub fn first_failure(&self, key: K, data: T, merge: impl FnOnce(&mut T, T)) -> Next {
        self.schedule(key, 0, data, merge)
    }

    /// The round after the `tried` before of `key` failed too (`data`: what the notifier keeps
    /// of it now): it waits for the next, unless that was the last.
    pub fn failed_again(&self, key: K, tried: u32, data: T, merge: impl FnOnce(&mut T, T)) -> Next {
        let round = tried + 1;
        if round >= ROUNDS {
            return Next::GivenUp;
        }
        self.schedule(key, round, data, merge)
    }

    fn schedule(&self, key: K, round: u32, data: T, merge: impl FnOnce(&mut T, T)) -> Next {
        let due = Instant::now() + round_wait(self.first, round + 1);
        let mut waiting = self.lock();
        let full = waiting.len() >= MAX_WAITING;
        match waiting.get_mut(&key) {
            Some(w) => {
                w.round = w.round.min(round);
                w.due = w.due.min(due);
                merge(&mut w.data, data);
            }
            None if full => return Next::GivenUp,
            None => {
                waiting.insert(key, Waiting { round, due, data });
            }
        }
        drop(waiting);
        self.added.notify_one();
        Next::Scheduled
    }

    /// Every waiting entry due now (the notifier answers again).
    pub fn bring_forward(&self) {
        let now = Instant::now();
        let mut waiting = self.lock();
        if waiting.is_empty() {
            return;
        }
        for w in waiting.values_mut() {
            w.due = w.due.min(now);
        }
        drop(waiting);
        self.added.notify_one();
    }

    /// Waits until entries fall due and takes them, the longest due first.
    pub async fn due(&self) -> Vec<(K, Waiting<T>)> {
        loop {
            let next = self.lock().values().map(|w| w.due).min();
            match next {
                None => self.added.notified().await,
                Some(due) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        () = self.added.notified() => continue,
                    }
                }
            }
            let taken = self.take_due();
            if !taken.is_empty() {
                return taken;
            }
        }
    }

    fn take_due(&self) -> Vec<(K, Waiting<T>)> {
        let now = Instant::now();
        let mut waiting = self.lock();
        let keys: Vec<K> = waiting
            .iter()
            .filter(|(_, w)| w.due <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut due: Vec<(K, Waiting<T>)> = keys
            .into_iter()
            .filter_map(|k| waiting.remove(&k).map(|w| (k, w)))
            .collect();
        due.sort_by_key(|(_, w)| w.due);
        due
    }

    /// How many entries wait.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The wait before round `round` (from 1): `first`, doubling, at most [`MAX_ROUND_WAIT`].
pub fn round_wait(first: Duration, round: u32) -> Duration {
    first
        .saturating_mul(1 << round.saturating_sub(1).min(20))
        .min(MAX_ROUND_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_wait_doubling_from_the_first_up_to_the_longest() {
        let first = Duration::from_secs(300);
        assert_eq!(round_wait(first, 1), first);
        assert_eq!(round_wait(first, 2), first * 2);
        assert_eq!(round_wait(first, 4), first * 8);
        assert_eq!(round_wait(first, 5), MAX_ROUND_WAIT);
        assert_eq!(round_wait(first, 60), MAX_ROUND_WAIT);
    }

    fn keep_first(mine: &mut Option<i64>, theirs: Option<i64>) {
        *mine = mine.or(theirs);
    }

    #[tokio::test]
    async fn an_entry_waits_once_and_bringing_forward_makes_every_entry_due() {
        let rounds: Rounds<&str, Option<i64>> = Rounds::new(Duration::from_secs(60));
        rounds.first_failure("c1", Some(7), keep_first);
        rounds.first_failure("c1", None, keep_first);
        rounds.first_failure("c2", None, keep_first);
        assert_eq!(rounds.len(), 2, "one entry per key");
        assert!(rounds.take_due().is_empty(), "nothing due yet");
        rounds.bring_forward();
        let due = rounds.due().await;
        assert_eq!(due.len(), 2);
        let c1 = &due.iter().find(|(k, _)| *k == "c1").unwrap().1;
        assert_eq!((c1.round, c1.data), (0, Some(7)), "the data merged");
        assert!(rounds.is_empty());
    }

    #[tokio::test]
    async fn an_entry_is_given_up_after_the_last_round() {
        let rounds: Rounds<&str, ()> = Rounds::new(Duration::from_millis(1));
        assert_eq!(rounds.first_failure("c", (), |_, _| ()), Next::Scheduled);
        for _ in 1..ROUNDS {
            let (key, waiting) = rounds.due().await.remove(0);
            let next = rounds.failed_again(key, waiting.round, (), |_, _| ());
            assert_eq!(next, Next::Scheduled);
        }
        let (key, waiting) = rounds.due().await.remove(0);
        assert_eq!(waiting.round, ROUNDS - 1);
        let next = rounds.failed_again(key, waiting.round, (), |_, _| ());
        assert_eq!(next, Next::GivenUp);
        assert!(rounds.is_empty());
    }
}
