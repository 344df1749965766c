//! Prune: retention (`--retain-decided`) deletes whole batches whose calls were all decided long
//! enough ago, with their events, a chunk per transaction so other writes run between chunks
//! (as expire does). It never deletes a pending call, a grant or a rule, nor an event a webhook
//! endpoint has not delivered, nor the log's last event (numbering continues after it). It
//! raises the pruned horizon in the same transaction: a reader resuming below it is refused,
//! never handed a gap.

use std::time::Instant;

use async_trait::async_trait;

use super::tx::{Transactions, WriteTx};
use crate::domain::Timestamp;
use crate::error::Result;
use crate::observe::meters;

/// A position in the walk over decided calls, oldest decision first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunePosition {
    pub decided_at: i64,
    pub rowid: i64,
}

/// What a prune deleted, and the pruned horizon after it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub batches: u64,
    pub calls: u64,
    pub events: u64,
    /// The highest sequence number pruned so far (0 when nothing ever was).
    pub pruned_through: u64,
}

impl PruneReport {
    fn add(&mut self, other: &PruneReport) {
        self.batches += other.batches;
        self.calls += other.calls;
        self.events += other.events;
        self.pruned_through = self.pruned_through.max(other.pruned_through);
    }
}

/// A decided call old enough to prune, as the walk finds it.
pub struct Candidate {
    pub position: PrunePosition,
    pub batch_id: String,
}

/// What one batch's deletion removed.
pub struct PrunedBatch {
    pub calls: u64,
    pub events: u64,
    pub last_seq: u64,
}

/// The primitives of pruning, over one write transaction of a backend.
#[async_trait]
pub trait PruneTx: WriteTx {
    /// Decided calls decided before `cutoff`, after `from`, oldest decision first, at most
    /// `limit`.
    async fn prune_candidates(
        &mut self,
        cutoff: Timestamp,
        from: PrunePosition,
        limit: u32,
    ) -> Result<Vec<Candidate>>;
    /// The highest sequence number pruning may delete: below the log's last event, and at or
    /// below every webhook endpoint's cursor.
    async fn prune_bound(&mut self) -> Result<u64>;
    /// Deletes batch `batch_id` with its calls and their events if every call of it was
    /// decided before `cutoff` and every event of it is numbered at or below `bound`; `None`
    /// (nothing deleted) otherwise.
    async fn prune_batch(
        &mut self,
        batch_id: &str,
        cutoff: Timestamp,
        bound: u64,
    ) -> Result<Option<PrunedBatch>>;
    /// Raises the pruned horizon to `seq` (never lowers it).
    async fn advance_pruned_through(&mut self, seq: u64) -> Result<()>;
}

/// Prunes, as of `cutoff`, one chunk of up to `limit` decided calls after `from` in one
/// transaction. Returns what it deleted and where the next chunk starts (`None` after the last).
pub async fn prune_chunk<S>(
    store: &S,
    cutoff: Timestamp,
    from: PrunePosition,
    limit: u32,
) -> Result<(PruneReport, Option<PrunePosition>)>
where
    S: Transactions,
    S::Tx: PruneTx,
{
    let started = Instant::now();
    let mut tx = store.begin_write().await?;
    let candidates = tx.prune_candidates(cutoff, from, limit).await?;
    let next = match candidates.last() {
        Some(last) if candidates.len() == limit as usize => Some(last.position),
        _ => None,
    };
    let report = prune_candidates(&mut tx, &candidates, cutoff).await?;
    tx.commit().await?;
    meters::committed(1, started.elapsed());
    Ok((report, next))
}

/// Deletes the batches of `candidates` that may go, and raises the horizon past them.
async fn prune_candidates(
    tx: &mut impl PruneTx,
    candidates: &[Candidate],
    cutoff: Timestamp,
) -> Result<PruneReport> {
    let mut report = PruneReport::default();
    if candidates.is_empty() {
        return Ok(report);
    }
    let bound = tx.prune_bound().await?;
    let mut batches: Vec<&str> = candidates.iter().map(|c| c.batch_id.as_str()).collect();
    batches.sort_unstable();
    batches.dedup();
    for batch_id in batches {
        if let Some(pruned) = tx.prune_batch(batch_id, cutoff, bound).await? {
            report.add(&PruneReport {
                batches: 1,
                calls: pruned.calls,
                events: pruned.events,
                pruned_through: pruned.last_seq,
            });
        }
    }
    if report.pruned_through > 0 {
        tx.advance_pruned_through(report.pruned_through).await?;
    }
    Ok(report)
}

/// Runs `chunk` (a [`prune_chunk`] from a position) until the walk ends; returns the total.
pub async fn prune_in_chunks<F, Fut>(mut chunk: F) -> Result<PruneReport>
where
    F: FnMut(PrunePosition) -> Fut,
    Fut: std::future::Future<Output = Result<(PruneReport, Option<PrunePosition>)>>,
{
    let mut total = PruneReport::default();
    let mut from = PrunePosition::default();
    loop {
        let (report, next) = chunk(from).await?;
        total.add(&report);
        match next {
            Some(next) => from = next,
            None => return Ok(total),
        }
    }
}
