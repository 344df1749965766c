//! Whether the store can write, as `grpc.health.v1.Health` reports it.
//!
//! A broker whose every write fails (a full disk, a read-only or deleted file, Postgres down)
//! must not look healthy: load balancers and orchestrators would keep sending it clients.
//! A storage fault (`Error::storage_fault`) makes the storage *failing*; a write that stored
//! something makes it *writable* again, except after corruption, which only an operator mends.
//! [`probe_while_open`] writes a little every second, so the state follows the storage when no
//! client writes, and recovers as soon as writes work again. It never retries or hides a
//! client's failure: it only reports.
//!
//! Health is told where the storage is touched, not by each store method, so no method can be
//! missed: a backend opened with a [`StorageHealth`] hands its [`Watch`] to the three things
//! every read and write of it passes through, and nothing else touches the database:
//! - the shared reads (`reads::BackendReads`): every read's failure;
//! - each transaction (`SqlTx`: SQLite's `SqliteTx`, Postgres's `PgTx`): the failure of its
//!   BEGIN, of any of its statements or of its commit, and a commit that changed rows;
//! - what Postgres runs outside a transaction (the probe, the sequencer, the one-statement
//!   approval), each where it runs (`store/postgres.rs`).
//!
//! Backups are not watched: they write another file, and a failure there (that file's disk is
//! full) says nothing about whether the database can be written.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Store;
use crate::error::{Error, Result, StorageFault};

/// How often [`probe_while_open`] writes.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The storage's state: `None` while writes work, else the fault that made the last one fail.
pub struct StorageHealth {
    state: watch::Sender<Option<StorageFault>>,
}

impl StorageHealth {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: watch::Sender::new(None),
        })
    }

    /// The state now and its changes.
    pub fn subscribe(&self) -> watch::Receiver<Option<StorageFault>> {
        self.state.subscribe()
    }

    /// Takes note of `result`: a storage fault makes the storage failing; success makes it
    /// writable if `wrote` says the success wrote to the database. (What [`Watch`] does, told
    /// in one call, for the test.)
    #[cfg(test)]
    fn observe<T>(&self, result: &Result<T>, wrote: impl FnOnce(&T) -> bool) {
        match result {
            Err(err) => self.observe_error(err),
            Ok(value) if wrote(value) => self.wrote(),
            Ok(_) => {}
        }
    }

    /// Takes note of a write that stored something: the storage is writable again.
    fn wrote(&self) {
        self.state.send_if_modified(|state| {
            // Corruption does not mend itself, however many writes succeed: only an operator
            // restoring the database (and restarting the broker) does.
            if matches!(state, None | Some(StorageFault::Corrupt)) {
                return false;
            }
            tracing::info!("storage writable again: health is SERVING");
            *state = None;
            true
        });
    }

    /// Takes note of a failed read or write: a storage fault makes the storage failing. A
    /// transaction the database aborted to break a deadlock is no fault of the storage (its
    /// group runs again), and is not counted.
    fn observe_error(&self, err: &Error) {
        if err.is_transaction_conflict() {
            return;
        }
        count_storage_error(err);
        let Some(fault) = err.storage_fault() else {
            return;
        };
        self.state.send_if_modified(|state| {
            if *state == Some(fault) || *state == Some(StorageFault::Corrupt) {
                return false;
            }
            tracing::error!(
                error = %err,
                %fault,
                "storage failing: writes fail, health is NOT_SERVING until one succeeds"
            );
            *state = Some(fault);
            true
        });
    }
}

/// Counts an error of the storage itself (not a client's mistake the store refused), by fault.
fn count_storage_error(err: &Error) {
    let fault = match err.storage_fault() {
        Some(StorageFault::Full) => "full",
        Some(StorageFault::Unavailable) => "unavailable",
        Some(StorageFault::Corrupt) => "corrupt",
        None if matches!(
            err,
            Error::Storage { .. } | Error::Migrate(_) | Error::Internal(_)
        ) =>
        {
            "other"
        }
        None => return,
    };
    crate::observe::meters::store_error(fault);
}

/// What a backend tells its [`StorageHealth`], from where it touches the database (see the
/// module's documentation); nothing where there is none (a command reading beside a broker, a
/// unit test). Cheap to clone: every transaction holds one.
#[derive(Clone, Default)]
pub struct Watch(Option<Arc<StorageHealth>>);

impl Watch {
    pub fn new(health: &Arc<StorageHealth>) -> Self {
        Self(Some(Arc::clone(health)))
    }

    /// `result`, as it is, once its failure (if any) is noted.
    pub fn seen<T>(&self, result: Result<T>) -> Result<T> {
        if let (Some(health), Err(err)) = (&self.0, &result) {
            health.observe_error(err);
        }
        result
    }

    /// A commit that changed rows, or the probe's, succeeded: writes work.
    pub fn wrote(&self) {
        if let Some(health) = &self.0 {
            health.wrote();
        }
    }
}

/// Probes `store` every [`PROBE_EVERY`] for as long as the task runs. Meant for a store opened
/// with a [`StorageHealth`] (`store::open_watched`), which turns each probe's result into
/// health.
pub async fn probe_while_open(store: Arc<dyn Store>) {
    loop {
        if let Err(err) = store.probe().await
            && err.storage_fault().is_none()
        {
            tracing::warn!(error = %err, "the storage probe failed");
        }
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn failed(fault: StorageFault) -> Result<bool> {
        Err(Error::StorageFault {
            fault,
            cause: "for the test".into(),
        })
    }

    /// Storage is failing from the first storage fault until a success that wrote something; a
    /// client's own error or a success that wrote nothing proves nothing either way. Corruption
    /// stays reported whatever succeeds after it.
    #[test]
    fn only_a_write_that_wrote_mends_failing_storage_and_corruption_stays() {
        let health = StorageHealth::new();
        let state = health.subscribe();
        let wrote = |wrote: &bool| *wrote;
        health.observe(&failed(StorageFault::Unavailable), wrote);
        assert_eq!(*state.borrow(), Some(StorageFault::Unavailable));
        health.observe(&Err(Error::NotFound("no such call".into())), wrote);
        health.observe(&Ok(false), wrote);
        assert_eq!(*state.borrow(), Some(StorageFault::Unavailable));
        health.observe(&Ok(true), wrote);
        assert_eq!(*state.borrow(), None);

        health.observe(&failed(StorageFault::Corrupt), wrote);
        health.observe(&Ok(true), wrote);
        health.observe(&failed(StorageFault::Full), wrote);
        assert_eq!(*state.borrow(), Some(StorageFault::Corrupt));
    }

    /// Every method of a store opened with health is watched, with no list of methods to keep
    /// up to date: here Web Push's, which came after health did. A commit that changed rows
    /// mends failing storage; a read, or a write that changed nothing, does not. A write once
    /// the database's files are gone fails into health. (Mutation checked: without the watch
    /// on the transaction's commit or on its BEGIN, this fails.)
    #[tokio::test]
    async fn every_store_method_is_watched_through_the_transaction_it_runs_in() {
        use crate::store::{PushSubscriptions as _, SqliteStore, StoredPushSubscription};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let health = StorageHealth::new();
        let state = health.subscribe();
        let texts = crate::domain::ToolResultTexts::default();
        let watch = Watch::new(&health);
        let store = SqliteStore::open_watched(&path, Default::default(), texts, None, watch)
            .await
            .unwrap();
        let subscription = StoredPushSubscription {
            endpoint: "https://push.example/1".into(),
            approver: "alice".into(),
            sees_all: true,
            groups: Vec::new(),
            p256dh: "key".into(),
            auth: "auth".into(),
            created_at: 1,
        };

        health.observe(&failed(StorageFault::Unavailable), |_| false);
        store.push_subscriptions().await.unwrap();
        store.drop_push_subscription("nobody's").await.unwrap();
        assert_eq!(
            *state.borrow(),
            Some(StorageFault::Unavailable),
            "nothing written"
        );
        store.add_push_subscription(&subscription).await.unwrap();
        assert_eq!(*state.borrow(), None, "a row written");

        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.as_os_str().to_owned();
            file.push(suffix);
            std::fs::remove_file(&file).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.add_push_subscription(&subscription).await.is_ok() {
            assert!(
                std::time::Instant::now() < deadline,
                "the deletion went unnoticed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(*state.borrow(), Some(StorageFault::Unavailable));
    }
}
