//! Calls whose Slack message could not be brought in line with them (a post or an update that
//! failed every attempt), tried again on a bounded schedule while the broker runs: no restart
//! needed once Slack answers again. Each round reads the call as it is then, so a call decided
//! meanwhile is not posted (its message, if one exists, is updated instead), and a post is
//! made only under this process's claim of it (the one `slack_messages` row per call), so a
//! fleet still posts each call once.
//!
//! The rounds wait `--webhook-retry-max`, then twice that, and so on (each at most
//! [`MAX_ROUND_WAIT`]), [`ROUNDS`] of them; then the call is given up (logged) until the next
//! start posts what is still pending. While Slack fails, each Web API call is tried once rather
//! than `--slack-attempts` times (see `Slack::call_with_retries`), so a Slack that is down does
//! not hold the event log's poster; the first answer again brings every waiting call forward.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Slack, blocks};
use crate::domain::{Call, CallKey, Timestamp};

/// Rounds after the first failure before a call is given up.
pub const ROUNDS: u32 = 6;

/// The longest wait between two rounds.
pub const MAX_ROUND_WAIT: Duration = Duration::from_secs(3600);

/// One call waiting for its next round.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// Rounds tried so far.
    round: u32,
    due: Instant,
    /// When this process last claimed the call's posting, while it holds the claim: the next
    /// claim is taken only if the row still holds that one (a compare-and-set on the time).
    claimed_at: Option<i64>,
}

/// The calls waiting for a round, by call.
#[derive(Default)]
pub(super) struct Retries {
    waiting: Mutex<HashMap<CallKey, Waiting>>,
    added: Notify,
}

/// What a round came to.
enum Round {
    /// In line with the call (or nothing left to do: the call is gone, decided and never
    /// posted, or routed nowhere).
    Done,
    /// Slack failed again, or another broker holds the posting for now: try again later.
    Again { claimed_at: Option<i64> },
}

impl Retries {
    /// Schedules `key` for a round `wait` from now (or sooner, if it waits already).
    fn schedule(&self, key: &CallKey, round: u32, wait: Duration, claimed_at: Option<i64>) {
        let due = Instant::now() + wait;
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting
            .entry(key.clone())
            .and_modify(|w| {
                w.round = w.round.min(round);
                w.due = w.due.min(due);
                w.claimed_at = w.claimed_at.or(claimed_at);
            })
            .or_insert(Waiting {
                round,
                due,
                claimed_at,
            });
        drop(waiting);
        self.added.notify_one();
    }

    /// Every waiting call due now (Slack answered again).
    pub(super) fn bring_forward(&self) {
        let now = Instant::now();
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.is_empty() {
            return;
        }
        for w in waiting.values_mut() {
            w.due = w.due.min(now);
        }
        drop(waiting);
        self.added.notify_one();
    }

    fn next_due(&self) -> Option<Instant> {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.values().map(|w| w.due).min()
    }

    /// Takes the calls due now, the longest due first.
    fn take_due(&self) -> Vec<(CallKey, Waiting)> {
        let now = Instant::now();
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        let keys: Vec<CallKey> = waiting
            .iter()
            .filter(|(_, w)| w.due <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut due: Vec<(CallKey, Waiting)> = keys
            .into_iter()
            .filter_map(|k| waiting.remove(&k).map(|w| (k, w)))
            .collect();
        due.sort_by_key(|(_, w)| w.due);
        due
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// The wait before round `round` (from 1): `first`, doubling, at most [`MAX_ROUND_WAIT`].
fn round_wait(first: Duration, round: u32) -> Duration {
    first
        .saturating_mul(1 << round.saturating_sub(1).min(20))
        .min(MAX_ROUND_WAIT)
}

impl Slack {
    /// Tries `key`'s message again later: its post (under the claim this process took at
    /// `claimed_at`) or its update failed every attempt.
    pub(super) fn retry_later(&self, key: &CallKey, claimed_at: Option<i64>) {
        let wait = round_wait(self.settings.retry_max, 1);
        self.retries.schedule(key, 0, wait, claimed_at);
    }

    /// Runs the rounds as they fall due, until the task is dropped.
    pub(super) async fn retry_rounds(&self) {
        loop {
            match self.retries.next_due() {
                None => self.retries.added.notified().await,
                Some(due) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(due) => {}
                        _ = self.retries.added.notified() => continue,
                    }
                }
            }
            for (key, waiting) in self.retries.take_due() {
                let round = waiting.round + 1;
                match self.bring_in_line(&key, waiting.claimed_at).await {
                    Round::Done => {}
                    Round::Again { .. } if round >= ROUNDS => {
                        tracing::warn!(
                            agent = %key.agent,
                            session = %key.session,
                            call = %key.call_id,
                            rounds = round,
                            "the call's Slack message could not be posted or updated; given up \
                             (a start posts the calls still pending)"
                        );
                    }
                    Round::Again { claimed_at } => {
                        let wait = round_wait(self.settings.retry_max, round + 1);
                        self.retries.schedule(&key, round, wait, claimed_at);
                    }
                }
            }
        }
    }

    /// One round for `key`: the message updated to the call as it is now if it exists; else
    /// the call posted if it is still pending and this process claims it.
    async fn bring_in_line(&self, key: &CallKey, claimed_at: Option<i64>) -> Round {
        let Some(call) = self.call_now(key).await else {
            return Round::Again { claimed_at };
        };
        let Some(call) = call else {
            return Round::Done;
        };
        if let Some(posted) = self.posted(key).await {
            let body = current_blocks(&call, self.settings.inbox_url.as_deref());
            return match self.update(&posted, body).await {
                true => Round::Done,
                false => Round::Again { claimed_at },
            };
        }
        if call.outcome.is_some() {
            // Decided meanwhile, never posted: nothing to ask in Slack any more.
            return Round::Done;
        }
        let Some(channel) = self.channel_for(&call).map(str::to_owned) else {
            return Round::Done;
        };
        let at = Timestamp::now().as_micros();
        // Still ours (the row holds the claim this process took), or given up by whoever held it.
        let stale_before = match claimed_at {
            Some(mine) => mine + 1,
            None => at - self.claim_lifetime(),
        };
        match self
            .store
            .claim_slack_message(key, &self.owner, at, stale_before)
            .await
        {
            Ok(true) => {}
            Ok(false) => return Round::Again { claimed_at: None },
            Err(error) => {
                tracing::warn!(%error, "cannot claim a call's Slack message");
                return Round::Again { claimed_at };
            }
        }
        if !self.post(&call, &channel).await {
            return Round::Again {
                claimed_at: Some(at),
            };
        }
        // Decided while the post was on its way: the Resolved event found no message to update.
        if let Some(Some(now)) = self.call_now(key).await
            && now.outcome.is_some()
            && let Some(posted) = self.posted(key).await
        {
            let body = current_blocks(&now, self.settings.inbox_url.as_deref());
            if !self.update(&posted, body).await {
                return Round::Again { claimed_at: None };
            }
        }
        Round::Done
    }

    /// The call as stored now: `Some(None)` when it is gone (pruned); `None` when the store
    /// cannot say.
    async fn call_now(&self, key: &CallKey) -> Option<Option<Call>> {
        match self
            .store
            .calls_by_id(&key.agent, &key.session, std::slice::from_ref(&key.call_id))
            .await
        {
            Ok(found) => Some(found.into_iter().next().flatten()),
            Err(error) => {
                tracing::warn!(%error, "cannot read a call to bring its Slack message in line");
                None
            }
        }
    }
}

/// The message a call's state asks for.
fn current_blocks(call: &Call, inbox_url: Option<&str>) -> serde_json::Value {
    match call.outcome {
        Some(_) => blocks::decided(call, inbox_url),
        None => blocks::pending(call, inbox_url),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AgentId, CallId, SessionId};

    fn key(id: &str) -> CallKey {
        CallKey {
            agent: AgentId::parse("agent", "a").unwrap(),
            session: SessionId::parse("session", "s").unwrap(),
            call_id: CallId::parse("call", id).unwrap(),
        }
    }

    #[test]
    fn rounds_wait_doubling_from_the_first_up_to_the_longest() {
        let first = Duration::from_secs(300);
        assert_eq!(round_wait(first, 1), first);
        assert_eq!(round_wait(first, 2), first * 2);
        assert_eq!(round_wait(first, 4), first * 8);
        assert_eq!(round_wait(first, 5), MAX_ROUND_WAIT);
        assert_eq!(round_wait(first, 60), MAX_ROUND_WAIT);
    }

    #[tokio::test]
    async fn a_call_waits_once_and_slack_answering_again_brings_every_call_forward() {
        let retries = Retries::default();
        retries.schedule(&key("c1"), 0, Duration::from_secs(60), Some(7));
        retries.schedule(&key("c1"), 2, Duration::from_secs(600), None);
        retries.schedule(&key("c2"), 0, Duration::from_secs(60), None);
        assert_eq!(retries.len(), 2, "one entry per call");
        assert!(retries.take_due().is_empty(), "nothing due yet");
        retries.bring_forward();
        let due = retries.take_due();
        assert_eq!(due.len(), 2);
        let c1 = due.iter().find(|(k, _)| *k == key("c1")).unwrap().1;
        assert_eq!(
            (c1.round, c1.claimed_at),
            (0, Some(7)),
            "the earlier round and the claim kept"
        );
        assert_eq!(retries.len(), 0);
    }
}
