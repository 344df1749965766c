//! Backups: the Backup RPC writes a consistent copy of a running SQLite broker's database while
//! writes go on, and a fresh broker started on the copy holds every call committed before it;
//! a backup never overwrites a file nor leaves its directory; on Postgres it is refused, pointing
//! at pg_dump.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use approval_broker::proto::v1 as pb;
use tonic::Code;

use crate::helpers::*;

fn backup_request(name: &str) -> pb::BackupRequest {
    pb::BackupRequest { name: name.into() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_writes_are_in_flight_holds_every_call_committed_before_it() {
    let app = spawn_app().await;
    let acknowledged = Arc::new(Mutex::new(Vec::<String>::new()));
    let writing = Arc::new(AtomicBool::new(true));
    let mut writers = Vec::new();
    for writer in 0..2 {
        let (agent, acknowledged, writing) =
            (app.agent(), Arc::clone(&acknowledged), Arc::clone(&writing));
        writers.push(tokio::spawn(async move {
            let mut agent = agent;
            let mut n = 0;
            while writing.load(Ordering::SeqCst) {
                let id = format!("w{writer}-{n}");
                let spec = batch("s", vec![call(&id, "t", "{}")]);
                agent
                    .submit(pb::SubmitRequest { batch: Some(spec) })
                    .await
                    .expect("submit");
                acknowledged.lock().unwrap().push(id);
                n += 1;
            }
        }));
    }
    while acknowledged.lock().unwrap().len() < 50 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    let before: Vec<String> = acknowledged.lock().unwrap().clone();
    let reply = app
        .admin()
        .backup(backup_request("copy.db"))
        .await
        .expect("Backup")
        .into_inner();
    writing.store(false, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }
    assert_eq!(
        std::path::Path::new(&reply.path),
        app.dir.path().join("copy.db"),
        "beside the database by default"
    );
    assert!(reply.bytes > 0);

    // A second backup never overwrites the first; a name never leaves the directory.
    let again = app.admin().backup(backup_request("copy.db")).await;
    assert_status(again, Code::AlreadyExists, "copy.db");
    let escaping = app.admin().backup(backup_request("../copy.db")).await;
    assert_status(escaping, Code::InvalidArgument, "name");

    // Restore: a fresh broker on the copy.
    let restored = spawn_app_on(Backend::Sqlite, |config| {
        config.store.database_url = format!("sqlite://{}", reply.path);
    })
    .await;
    let stored: HashSet<String> = all_calls(&restored)
        .await
        .into_iter()
        .map(|call| call.call_id)
        .collect();
    let missing: Vec<&String> = before.iter().filter(|id| !stored.contains(*id)).collect();
    assert!(
        missing.is_empty(),
        "committed before the backup, missing from it: {missing:?}"
    );
    // Consistent: the copy's log holds each stored call's Requested event, and nothing more.
    let mut subscription = Subscription::open(&restored, pb::CallFilter::default(), Some(0)).await;
    for _ in 0..stored.len() {
        let event = subscription.next().await;
        assert!(
            matches!(event.event, Some(pb::approver_event::Event::Requested(_))),
            "{event:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_backup_on_postgres_is_refused_pointing_at_pg_dump() {
    let app = spawn_app_on(Backend::postgres(), |_| {}).await;
    let status = app
        .admin()
        .backup(backup_request("copy.db"))
        .await
        .expect_err("refused");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("pg_dump"), "{}", status.message());
}
