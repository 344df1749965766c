//! Crash recovery: acknowledged means durable, and streams resume without loss or repeat, even
//! when the broker process is killed with SIGKILL at random moments under load.
//!
//! The harness starts the real `approval-broker` binary as a child process, drives a steady load
//! (agents submitting batches over `Connect`, with cancels and supersedes; a subscriber; an
//! approver deciding) and kills the broker at random moments (`CRASH_KILLS`, default 20),
//! restarting it each time on the same port and database. Then it stops the load, lets every
//! agent resume and collect its outcomes, approves what is still pending, and checks against the
//! broker's own final state (see `check.rs`), printing the figures. Lost or duplicated must be 0.
//!
//! `sqlite` runs on a temp SQLite file (default `synchronous=FULL`); `postgres` on a fresh
//! schema of the database `APPROVALS_TEST_POSTGRES_URL` names (compiled as ignored when it is unset, so the summary counts it as not run).
//! The seed is printed; `CRASH_SEED=<seed>` replays its choices (kill schedule, batches,
//! decisions), though not the exact interleaving. See the figures with `-- --nocapture`.

mod broker;
mod check;
mod load;
mod rng;

use std::time::{Duration, Instant};

use approval_broker::proto::v1 as pb;
use pb::admin_service_client::AdminServiceClient;
use pb::approver_service_client::ApproverServiceClient;
use tokio::sync::{oneshot, watch};

use broker::{Database, lazy_channel};
use check::{Collected, Figures};
use load::{Agent, EventRecord};
use rng::Rng;

const AGENTS: u64 = 4;

/// The two runs share two cores with the broker: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let _turn = ONE_AT_A_TIME.lock().await;
    run(Database::sqlite()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn postgres() {
    let url = testkit::postgres_url();
    let _turn = ONE_AT_A_TIME.lock().await;
    run(Database::postgres(&url).await).await;
}

fn seed() -> u64 {
    match std::env::var("CRASH_SEED") {
        Ok(seed) => seed
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CRASH_SEED={seed} is not a number")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64,
    }
}

fn kills() -> u32 {
    match std::env::var("CRASH_KILLS") {
        Ok(kills) => kills
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("CRASH_KILLS={kills} is not a number")),
        Err(_) => 20,
    }
}

async fn run(database: Database) {
    let started = Instant::now();
    let seed = seed();
    let kills = kills();
    eprintln!(
        "crash[{}]: seed={seed} kills={kills} (replay with CRASH_SEED={seed})",
        database.backend
    );
    let mut rng = Rng::new(seed);
    let mut broker = database.start_broker().await;
    let address = broker.address();

    let (drain, draining) = watch::channel(false);
    let (stop_subscriber, stop_at) = watch::channel(None::<u64>);
    let (ready, subscribed) = oneshot::channel();
    let subscriber = tokio::spawn(load::subscriber(address.clone(), ready, stop_at));
    tokio::time::timeout(Duration::from_secs(10), subscribed)
        .await
        .expect("the subscriber subscribes")
        .expect("the subscriber runs");
    let approver = tokio::spawn(load::approver(
        address.clone(),
        rng.fork(1000),
        draining.clone(),
    ));
    let agents: Vec<_> = (0..AGENTS)
        .map(|i| {
            let agent = Agent::new(
                address.clone(),
                format!("agent-{i}"),
                rng.fork(i + 1),
                draining.clone(),
            );
            tokio::spawn(agent.run())
        })
        .collect();

    for _ in 0..kills {
        tokio::time::sleep(rng.millis(500, 2500)).await;
        broker.kill();
        tokio::time::sleep(rng.millis(0, 200)).await;
        broker
            .restart()
            .await
            .unwrap_or_else(|e| panic!("crash: {e}"));
    }

    // Stop the load; the agents resume and wait for every outcome they are owed while the
    // sweeper approves whatever is still pending.
    drain.send(true).expect("the load listens");
    let mut sweeper = Vec::new();
    let mut errors = Vec::new();
    while agents.iter().any(|a| !a.is_finished()) {
        load::sweep(&address, &mut sweeper, &mut errors).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut agent_reports = Vec::new();
    for agent in agents {
        agent_reports.push(agent.await.expect("agent task"));
    }
    let pending_at_end = load::sweep(&address, &mut sweeper, &mut errors).await;
    let approver = approver.await.expect("approver task");

    let latest_seq = latest_seq(&address).await;
    stop_subscriber
        .send(Some(latest_seq))
        .expect("the subscriber listens");
    let subscriber = subscriber.await.expect("subscriber task");
    let reference = reference_log(&address, latest_seq).await;
    let stored = all_calls(&address).await;
    broker.kill();

    let mut figures = Figures {
        backend: database.backend,
        seed,
        kills,
        starts: broker.starts,
        restart_times: broker.restart_times.clone(),
        wall: started.elapsed(),
        errors,
        ..Default::default()
    };
    check::check(
        &mut figures,
        &Collected {
            agents: &agent_reports,
            approver: &approver,
            sweeper: &sweeper,
            subscriber: &subscriber,
            reference: &reference,
            latest_seq,
            stored: &stored,
            pending_at_end,
        },
    );
    eprintln!("{figures}");

    // An INTERNAL answer is a broker fault even when nothing is lost (Postgres writers once
    // deadlocked on each other's rows): it fails the run too.
    let healthy = figures.lost() == 0
        && figures.duplicated() == 0
        && figures.internal_refusals == 0
        && figures.errors.is_empty()
        && figures.agents_unfinished == 0
        && figures.subscriber_caught_up
        && figures.acknowledged_calls > 0
        && figures.acknowledged_decisions > 0;
    if !healthy {
        let log = broker.log().to_owned();
        drop(broker);
        let kept = database.keep();
        panic!(
            "crash[{}] seed={seed}: lost={} duplicated={} internal_refusals={} errors={} (the \
             database and the broker's log {} are kept in {})",
            figures.backend,
            figures.lost(),
            figures.duplicated(),
            figures.internal_refusals,
            figures.errors.len(),
            log.display(),
            kept.display()
        );
    }
    assert_eq!(figures.lost(), 0);
    assert_eq!(figures.duplicated(), 0);
}

/// The log's last sequence number, from a snapshot's marker.
async fn latest_seq(address: &str) -> u64 {
    let mut client = ApproverServiceClient::new(lazy_channel(address));
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::CallFilter::default()),
            after_seq: None,
        })
        .await
        .expect("subscribe")
        .into_inner();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the snapshot in time")
            .expect("stream healthy")
            .expect("stream open");
        if let Some(pb::approver_event::Event::SnapshotComplete(_)) = event.event {
            return event.seq;
        }
    }
}

/// The broker's own log: every event from `after_seq: 0` up to `latest`.
async fn reference_log(address: &str, latest: u64) -> Vec<EventRecord> {
    let mut client = ApproverServiceClient::new(lazy_channel(address));
    let mut stream = client
        .subscribe(pb::SubscribeRequest {
            filter: Some(pb::CallFilter::default()),
            after_seq: Some(0),
        })
        .await
        .expect("subscribe from 0")
        .into_inner();
    let mut events = Vec::new();
    let mut last = 0;
    while last < latest {
        let event = match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(event))) => event,
            other => {
                eprintln!("crash: the reference log ended at seq {last} of {latest}: {other:?}");
                break;
            }
        };
        last = event.seq;
        events.extend(EventRecord::of(&event));
    }
    events
}

/// Every stored call, through the admin audit view.
async fn all_calls(address: &str) -> Vec<pb::Call> {
    let client = AdminServiceClient::new(lazy_channel(address));
    let pages = testkit::every_page(|page_token| {
        let mut client = client.clone();
        async move {
            let request = pb::ListCallsRequest {
                page_size: 1000,
                page_token,
                ..Default::default()
            };
            let page = client.list_calls(request).await.expect("list calls");
            let page = page.into_inner();
            (page.calls, page.next_page_token)
        }
    })
    .await;
    pages.into_iter().flatten().collect()
}
