//! Group commit: writes that share a transaction (and one fsync) stay as independent as if each
//! had its own. A write that fails in the middle of a group undoes only its own changes; the
//! writes around it commit and are acknowledged. On Postgres, where replicas' groups run
//! concurrently, a group the database aborts (a deadlock between two replicas' groups, a
//! serialization failure) runs again, whole, and nothing of the aborted attempt is acknowledged;
//! and the group numbers its own events, so the log stays gapless and each event appears once.
//! (Postgres groups only under `--postgres-group-commit`; its tests here turn it on.)

use std::time::Duration;

use approval_broker::proto::v1 as pb;
use sqlx::Connection as _;
use tokio::task::{JoinHandle, JoinSet};
use tonic::Code;

use crate::helpers::*;

/// Makes the store refuse, with a storage error, to insert a call whose id is `poison`: a failure
/// that strikes after the same write already stored its batch and an earlier call.
async fn poison(app: &TestApp) {
    let sql = match app.backend {
        Backend::Sqlite => {
            "CREATE TRIGGER poison BEFORE INSERT ON calls WHEN NEW.call_id = 'poison' \
             BEGIN SELECT RAISE(ABORT, 'poisoned'); END;"
        }
        Backend::Postgres(_) => {
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN IF NEW.call_id = 'poison' THEN RAISE EXCEPTION 'poisoned'; END IF; \
             RETURN NEW; END $$; \
             CREATE TRIGGER poison BEFORE INSERT ON calls FOR EACH ROW EXECUTE FUNCTION poison();"
        }
    };
    app.run_sql(sql).await;
}

async fn a_write_that_fails_mid_group_undoes_only_itself(app: TestApp) {
    poison(&app).await;
    const WRITERS: usize = 64;
    for round in 0..3 {
        let mut writes = JoinSet::new();
        for i in 0..WRITERS {
            let mut agent = app.agent();
            writes.spawn(async move {
                let session = format!("r{round}-s{i}");
                let calls = if i == WRITERS / 2 {
                    vec![call("before", "t", "{}"), call("poison", "t", "{}")]
                } else {
                    vec![call("c", "t", "{}")]
                };
                let result = agent
                    .submit(pb::SubmitRequest {
                        batch: Some(batch(&session, calls)),
                    })
                    .await;
                (i, result)
            });
        }
        while let Some(joined) = writes.join_next().await {
            let (i, result) = joined.expect("join");
            if i == WRITERS / 2 {
                let status = result.expect_err("the poisoned write fails");
                assert_eq!(status.code(), Code::Internal, "{status:?}");
            } else {
                let response = result.expect("the other writes commit").into_inner();
                assert_eq!(response.acks.len(), 1);
            }
        }
        // Nothing of the failed write was stored, not even what it wrote before it failed...
        let poisoned = format!("r{round}-s{}", WRITERS / 2);
        for state in states(&app, &poisoned, &["before", "poison"]).await {
            assert!(
                matches!(state.state, Some(pb::call_state::State::Unknown(_))),
                "{state:?}"
            );
        }
        // ...and everything else was.
        for i in (0..WRITERS).filter(|i| *i != WRITERS / 2) {
            let state = states(&app, &format!("r{round}-s{i}"), &["c"])
                .await
                .remove(0);
            assert!(
                matches!(state.state, Some(pb::call_state::State::Pending(_))),
                "{state:?}"
            );
        }
    }
    // The log holds exactly the committed calls, each once, and the broker still serves.
    assert_eq!(all_calls(&app).await.len(), 3 * (WRITERS - 1));
    submit(&app, batch("after", vec![call("c", "t", "{}")])).await;
}

backend_tests! {
    a_write_that_fails_mid_group_undoes_only_itself,
}

/// Postgres groups its writes only when told to (`--postgres-group-commit`).
fn grouped(config: &mut approval_broker::config::Config) {
    config.store.postgres_group_commit = true;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_write_that_fails_mid_a_postgres_group_undoes_only_itself() {
    a_write_that_fails_mid_group_undoes_only_itself(
        spawn_app_on(Backend::postgres(), grouped).await,
    )
    .await;
}

// Postgres only: a replica's group is formed deterministically by holding its writer. A test
// connection holds the advisory lock a submit to session `hold` takes; the writer's group with
// that submit waits for it, the writes sent meanwhile queue, and when the lock is let go they
// run in the next group, in the order they were sent.

/// How long between two writes sent to a held writer, so they queue in the order sent.
const QUEUEING: Duration = Duration::from_millis(800);

/// A connection holding session `session`'s submit lock (agent `default`) until released.
struct Held {
    conn: sqlx::PgConnection,
    session: String,
}

const SESSION_LOCK: &str =
    "hashtext(current_schema() || ':session'), hashtext('default' || chr(31) || $1)";

impl Held {
    async fn lock(app: &TestApp, session: &str) -> Held {
        let mut conn = sqlx::PgConnection::connect(&app.database_url)
            .await
            .expect("connect");
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT pg_advisory_lock({SESSION_LOCK})"
        )))
        .bind(session)
        .execute(&mut conn)
        .await
        .expect("lock");
        Held {
            conn,
            session: session.into(),
        }
    }

    async fn release(mut self) {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT pg_advisory_unlock({SESSION_LOCK})"
        )))
        .bind(&self.session)
        .execute(&mut self.conn)
        .await
        .expect("unlock");
    }
}

/// Holds `app`'s writer: a submit to the held session `hold` is sent, and waits in the writer's
/// group until the lock is released. Returns the lock and the blocked submit.
async fn hold_writer(app: &TestApp, hold: &str) -> (Held, JoinHandle<pb::SubmitResponse>) {
    let held = Held::lock(app, hold).await;
    let blocked = {
        let app_agent = app.agent();
        let hold = hold.to_string();
        tokio::spawn(async move {
            let mut agent = app_agent;
            agent
                .submit(pb::SubmitRequest {
                    batch: Some(batch(&hold, vec![call("held", "t", "{}")])),
                })
                .await
                .expect("the held submit")
                .into_inner()
        })
    };
    tokio::time::sleep(QUEUEING).await;
    (held, blocked)
}

/// A write sent to a broker, answered later.
type Sent = JoinHandle<Result<(), tonic::Status>>;

fn send_submit(app: &TestApp, session: &str, calls: Vec<pb::CallSpec>) -> Sent {
    let mut agent = app.agent();
    let batch = batch(session, calls);
    tokio::spawn(async move {
        agent
            .submit(pb::SubmitRequest { batch: Some(batch) })
            .await
            .map(|_| ())
    })
}

fn send_approve(app: &TestApp, session: &str, call_id: &str) -> Sent {
    let mut approver = app.approver();
    let request = decide_request(session, call_id, pb::Decision::Approve, "");
    tokio::spawn(async move { approver.decide(request).await.map(|_| ()) })
}

/// A write to send when its turn comes.
type Write<'a> = Box<dyn FnOnce() -> Sent + Send + 'a>;

/// Sends each write, one after the other, `QUEUEING` apart (so they queue in this order).
async fn send_in_order(writes: Vec<Write<'_>>) -> Vec<Sent> {
    let mut sent = Vec::new();
    for write in writes {
        sent.push(write());
        tokio::time::sleep(QUEUEING).await;
    }
    sent
}

/// Runs `writes` in the next group of each held writer: holds every `(app, session)` writer,
/// sends the writes in order (so they queue behind the holds), lets go of every hold at once (so
/// replicas' groups run side by side), and returns each write's answer.
async fn in_held_groups(
    held: &[(&TestApp, &str)],
    writes: Vec<Write<'_>>,
) -> Vec<Result<(), tonic::Status>> {
    let mut holds = Vec::new();
    for (app, session) in held {
        holds.push(hold_writer(app, session).await);
    }
    let sent = send_in_order(writes).await;
    let (locks, blocked): (Vec<_>, Vec<_>) = holds.into_iter().unzip();
    let releases: Vec<_> = locks
        .into_iter()
        .map(|held| tokio::spawn(held.release()))
        .collect();
    for release in releases {
        release.await.expect("released");
    }
    for submit in blocked {
        submit.await.expect("the held submit");
    }
    answers(sent).await
}

async fn answers(sent: Vec<Sent>) -> Vec<Result<(), tonic::Status>> {
    let mut answers = Vec::new();
    for write in sent {
        answers.push(write.await.expect("join"));
    }
    answers
}

/// The transaction id that wrote each call (the row's `xmin`): calls written by one group
/// share it.
async fn writers_of(app: &TestApp, calls: &[(&str, &str)]) -> Vec<Option<String>> {
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let mut writers = Vec::new();
    for (session, call_id) in calls {
        let xmin: Option<String> = sqlx::query_scalar(
            "SELECT xmin::text FROM calls WHERE session_id = $1 AND call_id = $2",
        )
        .bind(session)
        .bind(call_id)
        .fetch_optional(&mut conn)
        .await
        .expect("xmin");
        writers.push(xmin);
    }
    writers
}

/// Every event in the log, as seen by a new subscriber of `app`: the snapshot's last sequence
/// number, which a gapless log of `events` events ends at.
async fn last_seq(app: &TestApp) -> u64 {
    let mut subscriber = Subscription::open(app, pb::CallFilter::default(), None).await;
    subscriber.snapshot().await.1
}

/// How many times each (session, call id) was resolved, per `Resolved` event in the log.
async fn resolved_events(app: &TestApp) -> std::collections::BTreeMap<(String, String), i64> {
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT c.session_id, c.call_id, count(*) FROM events e JOIN calls c \
         ON c.id = e.call_rowid WHERE e.kind = 2 GROUP BY 1, 2",
    )
    .fetch_all(&mut conn)
    .await
    .expect("resolved");
    rows.into_iter().map(|(s, c, n)| ((s, c), n)).collect()
}

/// The numbers of the log: 1 to N, each once, none missing.
async fn assert_gapless(app: &TestApp, events: u64) {
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let (count, distinct, max, unnumbered): (i64, i64, Option<i64>, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT seq), max(seq), count(*) FILTER (WHERE seq IS NULL) \
         FROM events",
    )
    .fetch_one(&mut conn)
    .await
    .expect("events");
    assert_eq!(
        (count, distinct, max, unnumbered),
        (events as i64, events as i64, Some(events as i64), 0),
        "every event numbered once, 1 to {events}"
    );
    assert_eq!(last_seq(app).await, events);
}

/// In one Postgres group: a write that fails without writing (deciding an unknown call) and one
/// whose statement fails (which aborts the whole Postgres transaction) each fail alone; the
/// others are acknowledged, stored, committed together (one transaction), and their events
/// numbered without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn in_one_postgres_group_failed_writes_fail_alone_and_the_rest_commit_together() {
    let app = spawn_app_on(Backend::postgres(), grouped).await;
    poison(&app).await;
    submit(&app, batch("earlier", vec![call("e", "t", "{}")])).await;
    let writes: Vec<Write<'_>> = vec![
        Box::new(|| send_submit(&app, "s1", vec![call("c", "t", "{}")])),
        Box::new(|| send_approve(&app, "s1", "unknown")),
        Box::new(|| {
            send_submit(
                &app,
                "s2",
                vec![call("before", "t", "{}"), call("poison", "t", "{}")],
            )
        }),
        Box::new(|| send_submit(&app, "s3", vec![call("c", "t", "{}")])),
        Box::new(|| send_approve(&app, "earlier", "e")),
    ];
    let answered = in_held_groups(&[(&app, "hold")], writes).await;
    let answers = answered;
    let codes: Vec<Option<Code>> = answers
        .iter()
        .map(|a| a.as_ref().err().map(tonic::Status::code))
        .collect();
    assert_eq!(
        codes,
        [None, Some(Code::NotFound), Some(Code::Internal), None, None],
        "{answers:?}"
    );

    let writers = writers_of(
        &app,
        &[
            ("s1", "c"),
            ("s3", "c"),
            ("s2", "before"),
            ("s2", "poison"),
            ("hold", "held"),
        ],
    )
    .await;
    assert!(writers[0].is_some() && writers[1].is_some(), "{writers:?}");
    assert_eq!(writers[0], writers[1], "committed in one transaction");
    assert_eq!(
        writers[2..4],
        [None, None],
        "nothing of the failed write kept"
    );
    assert_ne!(
        writers[4], writers[0],
        "the held write was a group of its own"
    );
    assert_eq!(
        status_of(&outcome_of(&app, "earlier", "e").await),
        CallStatus::Approved
    );
    // earlier's Requested and Resolved, held's, s1's and s3's Requested.
    assert_gapless(&app, 5).await;
}

/// A group the database aborts with a serialization failure (here a trigger raising SQLSTATE
/// 40001 the first time only) runs again, whole: every write is acknowledged once, stored once,
/// in one transaction, and its events numbered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_postgres_group_aborted_by_a_conflict_runs_again_whole() {
    let app = spawn_app_on(Backend::postgres(), grouped).await;
    app.run_sql(
        "CREATE SEQUENCE conflict_once; \
         CREATE FUNCTION conflict_once() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.call_id = 'conflict' AND nextval('conflict_once') = 1 THEN \
         RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER conflict_once BEFORE INSERT ON calls FOR EACH ROW \
         EXECUTE FUNCTION conflict_once();",
    )
    .await;
    let writes: Vec<Write<'_>> = vec![
        Box::new(|| send_submit(&app, "s1", vec![call("c", "t", "{}")])),
        Box::new(|| send_submit(&app, "s2", vec![call("conflict", "t", "{}")])),
        Box::new(|| send_submit(&app, "s3", vec![call("c", "t", "{}")])),
    ];
    let answered = in_held_groups(&[(&app, "hold")], writes).await;
    for answer in answered {
        answer.expect("acknowledged after the retry");
    }
    let writers = writers_of(&app, &[("s1", "c"), ("s2", "conflict"), ("s3", "c")]).await;
    assert!(
        writers.iter().all(|w| w.is_some() && *w == writers[0]),
        "{writers:?}"
    );
    assert_eq!(all_calls(&app).await.len(), 4, "each stored once");
    assert_gapless(&app, 4).await;
}

/// A group the database keeps aborting is run a bounded number of times (5), then fails
/// whole: none of its writes is acknowledged or kept, each is told to retry (UNAVAILABLE), and
/// the writer goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_postgres_group_that_keeps_deadlocking_fails_whole_after_bounded_attempts() {
    let app = spawn_app_on(Backend::postgres(), grouped).await;
    app.run_sql(
        "CREATE SEQUENCE attempts; \
         CREATE FUNCTION deadlocked() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.call_id = 'deadlocked' THEN PERFORM nextval('attempts'); \
         RAISE EXCEPTION 'deadlocked' USING ERRCODE = '40P01'; END IF; RETURN NEW; END $$; \
         CREATE TRIGGER deadlocked BEFORE INSERT ON calls FOR EACH ROW \
         EXECUTE FUNCTION deadlocked();",
    )
    .await;
    let writes: Vec<Write<'_>> = vec![
        Box::new(|| send_submit(&app, "s1", vec![call("c", "t", "{}")])),
        Box::new(|| send_submit(&app, "s2", vec![call("deadlocked", "t", "{}")])),
        Box::new(|| send_submit(&app, "s3", vec![call("c", "t", "{}")])),
    ];
    let answered = in_held_groups(&[(&app, "hold")], writes).await;
    for answer in answered {
        let status = answer.expect_err("not acknowledged");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }
    let writers = writers_of(&app, &[("s1", "c"), ("s2", "deadlocked"), ("s3", "c")]).await;
    assert_eq!(writers, [None, None, None], "none kept");
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    let attempts: i64 = sqlx::query_scalar("SELECT last_value FROM attempts")
        .fetch_one(&mut conn)
        .await
        .expect("attempts");
    assert_eq!(attempts, 5, "bounded");
    assert_gapless(&app, 1).await;
    // The writer goes on: a retry is stored.
    submit(&app, batch("s1", vec![call("c", "t", "{}")])).await;
    assert_gapless(&app, 2).await;
}

/// Two replicas' groups taking the same sessions' and batches' locks in opposite orders
/// deadlock; Postgres aborts one, which runs again: every submit and decision through either
/// replica is acknowledged, every call stored and resolved exactly once, the log gapless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn two_replicas_groups_that_deadlock_are_retried_and_every_write_lands_once() {
    let a = spawn_app_on(Backend::postgres(), grouped).await;
    let b = a.replica(grouped).await;
    // Each group's first submit lingers with its session locked, so both groups hold their first
    // session before either asks for its second, however the machine schedules the two
    // replicas (without it, one group could finish before the other started, and nothing
    // deadlocked).
    a.run_sql(
        "CREATE FUNCTION first_writes_linger() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN IF NEW.call_id IN ('a1', 'b1') THEN PERFORM pg_sleep(2); END IF; \
         RETURN NEW; END $$; \
         CREATE TRIGGER first_writes_linger BEFORE INSERT ON calls FOR EACH ROW \
         EXECUTE FUNCTION first_writes_linger();",
    )
    .await;
    let deadlocks_before = deadlocks(&a).await;

    // Submits: a's group locks session x then y, b's y then x.
    let writes: Vec<Write<'_>> = vec![
        Box::new(|| send_submit(&a, "x", vec![call("a1", "t", "{}")])),
        Box::new(|| send_submit(&b, "y", vec![call("b1", "t", "{}")])),
        Box::new(|| send_submit(&a, "y", vec![call("a2", "t", "{}")])),
        Box::new(|| send_submit(&b, "x", vec![call("b2", "t", "{}")])),
    ];
    let answered = in_held_groups(&[(&a, "hold-a"), (&b, "hold-b")], writes).await;
    for answer in answered {
        answer.expect("every submit acknowledged");
    }

    // Decisions: a's group locks a1's batch then b1's, b's b1's then a1's (each decides both).
    let writes: Vec<Write<'_>> = vec![
        Box::new(|| send_approve(&a, "x", "a1")),
        Box::new(|| send_approve(&b, "y", "b1")),
        Box::new(|| send_approve(&a, "y", "b1")),
        Box::new(|| send_approve(&b, "x", "a1")),
        Box::new(|| send_approve(&a, "y", "a2")),
        Box::new(|| send_approve(&b, "x", "b2")),
    ];
    let answered = in_held_groups(&[(&a, "hold-a2"), (&b, "hold-b2")], writes).await;
    for answer in answered {
        answer.expect("every decision acknowledged");
    }

    // Backends report their statistics lazily (up to 10 s after going idle, later on a loaded
    // machine): wait for it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while deadlocks(&a).await <= deadlocks_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the groups really deadlocked"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let resolved = resolved_events(&a).await;
    let expected: Vec<((String, String), i64)> =
        [("x", "a1"), ("x", "b2"), ("y", "a2"), ("y", "b1")]
            .iter()
            .map(|(s, c)| ((s.to_string(), c.to_string()), 1))
            .collect();
    assert_eq!(
        resolved.into_iter().collect::<Vec<_>>(),
        expected,
        "each resolved once"
    );
    for (session, call_id) in [("x", "a1"), ("x", "b2"), ("y", "a2"), ("y", "b1")] {
        assert_eq!(
            status_of(&outcome_of(&b, session, call_id).await),
            CallStatus::Approved
        );
    }
    // Four held submits' and four calls' Requested events, four Resolved.
    assert_gapless(&a, 12).await;
    assert_eq!(last_seq(&b).await, 12);
}

/// Deadlocks Postgres has detected in this database (all schemas) so far.
async fn deadlocks(app: &TestApp) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&app.database_url)
        .await
        .expect("connect");
    // The statistics are per transaction snapshot: read them fresh.
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut conn)
        .await
        .expect("clear");
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(&mut conn)
        .await
        .expect("deadlocks")
}
