//! Retention and backups on Postgres. Pruning runs a chunk per transaction (small batched
//! DELETEs), so no long transaction holds the tables; replicas may prune at once (the second
//! finds the rows gone). Backups are the database's own business: `pg_dump`, or the provider's
//! snapshots, never the broker's.

use std::path::Path;

use async_trait::async_trait;

use super::PostgresStore;
use crate::domain::Timestamp;
use crate::error::{Error, Result};
use crate::operations::prune::{self, PruneReport};
use crate::store::{BACKUP_ON_POSTGRES, Lifecycle};

#[async_trait]
impl Lifecycle for PostgresStore {
    async fn prune_decided(&self, cutoff: Timestamp, chunk: u32) -> Result<PruneReport> {
        prune::prune_in_chunks(|from| prune::prune_chunk(self, cutoff, from, chunk)).await
    }

    async fn backup(&self, _to: &Path) -> Result<()> {
        Err(Error::FailedPrecondition(BACKUP_ON_POSTGRES.into()))
    }
}
