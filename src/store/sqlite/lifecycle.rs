//! Retention and backups on SQLite. Pruning runs a chunk per turn of the one writer, so groups
//! of submits and decisions run between chunks and no long transaction holds writes up. A backup
//! is `VACUUM INTO` on a read-only connection of its own: one WAL snapshot, consistent, taken
//! while the writer goes on.

use std::path::Path;

use async_trait::async_trait;
use rusqlite::{Connection, OpenFlags};

use super::SqliteStore;
use crate::domain::Timestamp;
use crate::error::{Error, Result};
use crate::operations::prune::{self, PruneReport};
use crate::store::Lifecycle;

#[async_trait]
impl Lifecycle for SqliteStore {
    async fn prune_decided(&self, cutoff: Timestamp, chunk: u32) -> Result<PruneReport> {
        prune::prune_in_chunks(|from| {
            self.group.alone(move |writer| async move {
                prune::prune_chunk(&writer, cutoff, from, chunk).await
            })
        })
        .await
    }

    async fn backup(&self, to: &Path) -> Result<()> {
        let (from, to) = (self.path.clone(), to.to_owned());
        tokio::task::spawn_blocking(move || copy_into(&from, &to))
            .await
            .map_err(|e| Error::Internal(format!("the backup task failed: {e}")))?
    }
}

/// Writes a consistent copy of the database at `from` to the new file `to`.
fn copy_into(from: &Path, to: &Path) -> Result<()> {
    let conn = Connection::open_with_flags(
        from,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    let to = to
        .to_str()
        .ok_or_else(|| Error::invalid("name", "the backup path is not valid UTF-8"))?;
    // Created private first: VACUUM INTO writes into an empty file as it finds it.
    crate::private_files::create_private_if_missing(Path::new(to))
        .map_err(|e| Error::Internal(format!("cannot create the backup {to}: {e}")))?;
    conn.execute("VACUUM INTO ?1", [to])?;
    Ok(())
}
