//! Replaying a candidate rule against history: over decided calls, what the rule (not yet
//! stored) would have done with each, and whether that agrees with what the humans decided.
//! Pure counting; the broker reads the calls, a page at a time, and never writes.
//!
//! Agreement is counted only where a person decided (`decided_by` is `approver:...`):
//! **agree** is "would approve" for a call a person APPROVED, or "would deny" for one a person
//! DENIED; **disagree** is "would approve" for one a person DENIED, or "would deny" for one a
//! person APPROVED. A call the rule would leave to a human, or one decided by a grant, a rule,
//! the deadline, the agent or the broker, is neither.

use std::time::Duration;

use super::Rule;
use super::{RuleVerdict, Subject, candidate_verdict};
use crate::domain::{Call, CallKey, DecidedBy, OutcomeKind, Timestamp};
use crate::error::{Error, Result};

/// At most this many disagreements are sampled per page.
pub const MAX_REPLAY_SAMPLES: usize = 10;

/// The longest time range one replay request may cover.
pub const MAX_REPLAY_RANGE: Duration = Duration::from_secs(31 * 24 * 3600);

/// The calls a replay looks at: those created at or after `from` and before `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayRange {
    pub from: Timestamp,
    pub to: Timestamp,
}

impl ReplayRange {
    /// Both ends are required, `to` after `from`, at most [`MAX_REPLAY_RANGE`] apart. Errors
    /// name `from_field` or `to_field`.
    pub fn new(
        (from_field, from): (&str, Option<Timestamp>),
        (to_field, to): (&str, Option<Timestamp>),
    ) -> Result<Self> {
        let from = from.ok_or_else(|| Error::invalid(from_field, "is required"))?;
        let to = to.ok_or_else(|| Error::invalid(to_field, "is required"))?;
        if to.as_micros() <= from.as_micros() {
            return Err(Error::invalid(
                to_field,
                format!("must be after {from_field}"),
            ));
        }
        let span = (to.as_micros() - from.as_micros()) as u128;
        if span > MAX_REPLAY_RANGE.as_micros() {
            return Err(Error::invalid(
                to_field,
                format!(
                    "must be at most {} days after {from_field}; replay a longer history in \
                     several requests",
                    MAX_REPLAY_RANGE.as_secs() / 86_400
                ),
            ));
        }
        Ok(Self { from, to })
    }
}

/// A call where the candidate rule and the person who decided it differ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    pub call: CallKey,
    /// APPROVED or DENIED.
    pub actual: OutcomeKind,
    pub decided_by: DecidedBy,
    /// Approve or deny: what the rule would have done.
    pub would: RuleVerdict,
}

/// What a candidate rule would have done with some decided calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayTally {
    /// Decided calls looked at.
    pub calls: u64,
    pub would_approve: u64,
    pub would_deny: u64,
    pub left_to_human: u64,
    /// See the module's documentation for what agrees and what disagrees.
    pub agree: u64,
    pub disagree: u64,
    /// The first [`MAX_REPLAY_SAMPLES`] disagreements, in call order.
    pub samples: Vec<Disagreement>,
}

impl ReplayTally {
    /// Counts what `candidate` would have done with `call` (a decided call; pending ones are
    /// not counted).
    pub fn count(&mut self, candidate: &Rule, call: &Call) {
        let Some(outcome) = &call.outcome else {
            return;
        };
        let would = candidate_verdict(candidate, &Subject::of_call(call), call.created_at);
        self.calls += 1;
        match would {
            RuleVerdict::Approve => self.would_approve += 1,
            RuleVerdict::Deny => self.would_deny += 1,
            RuleVerdict::AskHuman => self.left_to_human += 1,
        }
        if !matches!(outcome.decided_by, DecidedBy::Approver(_)) {
            return;
        }
        let agrees = match (would, outcome.kind) {
            (RuleVerdict::Approve, OutcomeKind::Approved)
            | (RuleVerdict::Deny, OutcomeKind::Denied) => true,
            (RuleVerdict::Approve, OutcomeKind::Denied)
            | (RuleVerdict::Deny, OutcomeKind::Approved) => false,
            _ => return,
        };
        if agrees {
            self.agree += 1;
            return;
        }
        self.disagree += 1;
        if self.samples.len() < MAX_REPLAY_SAMPLES {
            self.samples.push(Disagreement {
                call: call.key.clone(),
                actual: outcome.kind,
                decided_by: outcome.decided_by.clone(),
                would,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(micros: i64) -> Option<Timestamp> {
        Some(Timestamp::from_micros(micros))
    }

    #[test]
    fn a_range_needs_both_ends_in_order_and_at_most_the_longest_span() {
        let err = |from, to| {
            ReplayRange::new(("from", from), ("to", to))
                .unwrap_err()
                .to_string()
        };
        assert!(err(None, at(1)).starts_with("from: is required"));
        assert!(err(at(1), None).starts_with("to: is required"));
        assert!(err(at(5), at(5)).starts_with("to: must be after from"));
        let day = 86_400 * 1_000_000;
        assert!(err(at(0), at(32 * day)).starts_with("to: must be at most 31 days"));
        let range = ReplayRange::new(("from", at(0)), ("to", at(31 * day))).unwrap();
        assert_eq!(range.to.as_micros(), 31 * day);
    }
}
