//! ReplayRule through the broker: reads one page of decided calls of a time range (the same
//! keyset listing ListCalls reads) and counts what a candidate rule would have done with each.
//! Read-only: nothing is written, stored or sent to anyone; the candidate is never stored.

use std::time::{Duration, Instant};

use super::Broker;
use crate::domain::policy::{ReplayRange, ReplayTally, Rule};
use crate::domain::{CallQuery, Cursor, OutcomeKind, Status};
use crate::error::Result;

/// How long one page may spend judging calls; past it, the page ends early and its
/// `next` continues after the last call judged.
pub const REPLAY_PAGE_BUDGET: Duration = Duration::from_secs(2);

/// One page of a replay: its own totals, and where the next page starts (`None`: the last).
#[derive(Debug)]
pub struct ReplayPage {
    pub tally: ReplayTally,
    pub next: Option<Cursor>,
}

impl Broker {
    /// What `candidate` would have done with the (at most `limit`) decided calls created in
    /// `range` after `after`, oldest first.
    #[tracing::instrument(name = "replay_rule", skip_all, fields(rule = %candidate.id))]
    pub async fn replay_rule(
        &self,
        candidate: &Rule,
        range: ReplayRange,
        limit: u32,
        after: Option<Cursor>,
    ) -> Result<ReplayPage> {
        let query = CallQuery {
            statuses: OutcomeKind::ALL.into_iter().map(Status::Decided).collect(),
            created_after: Some(range.from),
            created_before: Some(range.to),
            after,
            limit,
            ..CallQuery::default()
        };
        let page = self.store.list_calls(&query).await?;
        let started = Instant::now();
        let mut tally = ReplayTally::default();
        let last = page.calls.len().saturating_sub(1);
        for (i, (call, cursor)) in page.calls.iter().zip(&page.cursors).enumerate() {
            tally.count(candidate, call);
            if i < last && started.elapsed() > REPLAY_PAGE_BUDGET {
                return Ok(ReplayPage {
                    tally,
                    next: Some(*cursor),
                });
            }
        }
        Ok(ReplayPage {
            tally,
            next: page.next,
        })
    }
}
