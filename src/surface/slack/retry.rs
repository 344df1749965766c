//! Calls whose Slack message could not be brought in line with them (a post or an update that
//! failed every attempt), tried again on a bounded schedule while the broker runs: no restart
//! needed once Slack answers again. Each round reads the call as it is then, so a call decided
//! meanwhile is not posted (its message, if one exists, is updated instead), and a post is
//! made only under this process's claim of it (the one `slack_messages` row per call), so a
//! fleet still posts each call once.
//!
//! The rounds are `crate::background::rounds`' (as Web Push's): they wait `--webhook-retry-max`,
//! then twice that, and so on, a bounded number of them; then the call is given up (logged)
//! until the next start posts what is still pending. While Slack fails, each Web API call is tried once rather
//! than `--slack-attempts` times (see `Slack::call_with_retries`), so a Slack that is down does
//! not hold the event log's poster; the first answer again brings every waiting call forward.

use crate::background::rounds::Next;

use super::{Slack, blocks};
use crate::domain::{Call, CallKey, Timestamp};

/// The calls waiting for a round, each with when this process last claimed its posting, while
/// it holds the claim: the next claim is taken only if the row still holds that one (a
/// compare-and-set on the time).
pub(super) type Retries = crate::background::rounds::Rounds<CallKey, Option<i64>>;

/// What a round came to.
enum Round {
    /// In line with the call (or nothing left to do: the call is gone, decided and never
    /// posted, or routed nowhere).
    Done,
    /// Slack failed again, or another broker holds the posting for now: try again later.
    Again { claimed_at: Option<i64> },
}

/// Two failures of one call: the claim taken first is the one the row may still hold.
fn keep_claim(mine: &mut Option<i64>, theirs: Option<i64>) {
    *mine = mine.or(theirs);
}

impl Slack {
    /// Tries `key`'s message again later: its post (under the claim this process took at
    /// `claimed_at`) or its update failed every attempt.
    pub(super) fn retry_later(&self, key: &CallKey, claimed_at: Option<i64>) {
        if self
            .retries
            .first_failure(key.clone(), claimed_at, keep_claim)
            == Next::GivenUp
        {
            give_up(key);
        }
    }

    /// Runs the rounds as they fall due, until the task is dropped.
    pub(super) async fn retry_rounds(&self) {
        loop {
            for (key, waiting) in self.retries.due().await {
                let Round::Again { claimed_at } = self.bring_in_line(&key, waiting.data).await
                else {
                    continue;
                };
                let next =
                    self.retries
                        .failed_again(key.clone(), waiting.round, claimed_at, keep_claim);
                if next == Next::GivenUp {
                    give_up(&key);
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

    /// Brings `key`'s message in line with the call as it is now, from an event read back from
    /// the log: the message updated if one exists (and `update`: the event changed the call
    /// since it was posted); else the call posted if it is still pending and nobody claimed it.
    /// What fails goes to the rounds.
    pub(super) async fn bring_up_to_date(&self, key: &CallKey, update: bool) {
        let Some(call) = self.call_now(key).await else {
            self.retry_later(key, None);
            return;
        };
        let Some(call) = call else {
            return;
        };
        match self.posted(key).await {
            Some(_) if !update => {}
            Some(posted) => {
                let body = current_blocks(&call, self.settings.inbox_url.as_deref());
                if !self.update(&posted, body).await {
                    self.retry_later(key, None);
                }
            }
            None if call.outcome.is_none() => self.post_new(&call).await,
            // Decided, and never posted: nothing to ask in Slack any more.
            None => {}
        }
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

/// Logs that `key`'s message is given up for this run.
fn give_up(key: &CallKey) {
    tracing::warn!(
        agent = %key.agent,
        session = %key.session,
        call = %key.call_id,
        "the call's Slack message could not be posted or updated; given up \
         (a start posts the calls still pending)"
    );
}
