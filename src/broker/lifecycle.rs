//! The data lifecycle through the broker: the horizon below which retention pruned the event
//! log (a resume point under it is refused, never served with a gap), and online backups.

use std::path::PathBuf;

use super::Broker;
use crate::error::{Error, Result};
use crate::store::BACKUP_ON_POSTGRES;

/// The file name a backup is written to, inside the backup directory: a plain name, so a
/// request can never reach another directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupName(String);

impl BackupName {
    pub fn parse(field: &str, name: String) -> Result<Self> {
        let refuse = |why: &str| Err(Error::invalid(field, why));
        if name.is_empty() {
            return refuse("is required: the backup's file name, such as approvals-2026-11-24.db");
        }
        if name.len() > 255 {
            return refuse("is longer than 255 bytes");
        }
        if name.contains(['/', '\\', '\0']) || name == "." || name == ".." {
            return refuse("must be a plain file name (no directory): backups go to --backup-dir");
        }
        if name.starts_with('.') {
            return refuse("must not start with `.`");
        }
        Ok(Self(name))
    }
}

/// A backup written.
#[derive(Debug, Clone)]
pub struct BackupReport {
    pub path: PathBuf,
    pub bytes: u64,
}

impl Broker {
    /// The broker writing backups to `dir` (a SQLite broker's).
    pub fn with_backup_dir(mut self, dir: PathBuf) -> Self {
        self.backup_dir = Some(dir);
        self
    }

    /// OUT_OF_RANGE when retention pruned events after `after`.
    pub async fn refuse_pruned(&self, after: u64) -> Result<()> {
        let through = self.store.pruned_through().await?;
        if after < through {
            return Err(Error::Pruned { after, through });
        }
        Ok(())
    }

    /// Writes a consistent copy of the database, taken while writes go on, to `name` in the
    /// backup directory. ALREADY_EXISTS if that file exists (a backup never overwrites).
    pub async fn backup(&self, name: &BackupName) -> Result<BackupReport> {
        let Some(dir) = &self.backup_dir else {
            return Err(Error::FailedPrecondition(BACKUP_ON_POSTGRES.into()));
        };
        let path = dir.join(&name.0);
        if path.exists() {
            return Err(Error::AlreadyExists(format!(
                "{} exists already; a backup never overwrites a file: choose another name",
                path.display()
            )));
        }
        self.store.backup(&path).await?;
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        tracing::info!(path = %path.display(), bytes, "backup written");
        Ok(BackupReport { path, bytes })
    }
}
