//! Retention's primitives ([`PruneTx`]) written once for both backends over the shared
//! statements, like the other primitives (`primitives`): what the prune operation
//! (`operations::prune`) asks of a transaction, and nothing it decides.

use async_trait::async_trait;

use super::primitives::{Param, Run, SqlTx};
use super::statements as sql;
use crate::domain::Timestamp;
use crate::error::Result;
use crate::operations::prune::{Candidate, PrunePosition, PruneTx, PrunedBatch};

#[async_trait]
impl<T: SqlTx> PruneTx for T {
    async fn prune_candidates(
        &mut self,
        cutoff: Timestamp,
        from: PrunePosition,
        limit: u32,
    ) -> Result<Vec<Candidate>> {
        let params = [
            Param::Int(cutoff.as_micros()),
            Param::Int(from.decided_at),
            Param::Int(from.rowid),
            Param::Int(i64::from(limit)),
        ];
        self.rows(Run::read(sql::PRUNE_CANDIDATES, &params), |row| {
            Ok(Candidate {
                position: PrunePosition {
                    decided_at: row.int("decided_at")?,
                    rowid: row.int("id")?,
                },
                batch_id: row.text("batch_id")?,
            })
        })
        .await
    }

    async fn prune_bound(&mut self) -> Result<u64> {
        let bounds = self
            .rows(Run::read(sql::PRUNE_BOUND, &[]), |row| {
                Ok((row.opt_int("latest")?, row.opt_int("delivered")?))
            })
            .await?;
        let (latest, delivered) = bounds.into_iter().next().unwrap_or((None, None));
        // Even the last event may go: both backends number new events after the pruned
        // horizon, which the same transaction raises past it (SQLite's AUTOINCREMENT never
        // reuses a number either). A quiet broker prunes on time.
        let latest = latest.unwrap_or(0);
        let bound = match delivered {
            Some(cursor) => latest.min(cursor),
            None => latest,
        };
        Ok(bound.max(0) as u64)
    }

    async fn prune_batch(
        &mut self,
        batch_id: &str,
        cutoff: Timestamp,
        bound: u64,
    ) -> Result<Option<PrunedBatch>> {
        let params = [
            Param::Text(batch_id),
            Param::Int(cutoff.as_micros()),
            Param::Int(bound as i64),
        ];
        let last = self
            .rows(Run::read(sql::PRUNABLE_BATCH, &params), |row| {
                row.opt_int("last_seq")
            })
            .await?;
        let Some(last_seq) = last.into_iter().next() else {
            return Ok(None);
        };
        let batch = [Param::Text(batch_id)];
        let events = self
            .execute(Run::write(sql::PRUNE_EVENTS_OF_BATCH, &batch))
            .await?;
        // What Slack app mode kept of each call goes with it.
        self.execute(Run::write(sql::PRUNE_SLACK_MESSAGES_OF_BATCH, &batch))
            .await?;
        let calls = self
            .execute(Run::write(sql::PRUNE_CALLS_OF_BATCH, &batch))
            .await?;
        self.execute(Run::write(sql::DELETE_BATCH, &batch)).await?;
        Ok(Some(PrunedBatch {
            calls,
            events,
            last_seq: last_seq.unwrap_or(0).max(0) as u64,
        }))
    }

    async fn advance_pruned_through(&mut self, seq: u64) -> Result<()> {
        let params = [Param::Int(seq as i64)];
        self.execute(Run::write(sql::ADVANCE_PRUNED_THROUGH, &params))
            .await?;
        Ok(())
    }
}
