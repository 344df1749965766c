//! Group commit: writes that share a transaction (and one fsync) stay as independent as if each
//! had its own. A write that fails in the middle of a group undoes only its own changes; the
//! writes around it commit and are acknowledged.

use approval_broker::proto::v1 as pb;
use tokio::task::JoinSet;
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
    match app.backend {
        Backend::Sqlite => {
            use sqlx::Connection as _;
            let mut conn = sqlx::SqliteConnection::connect(&app.database_url)
                .await
                .expect("open the database");
            sqlx::raw_sql(sql)
                .execute(&mut conn)
                .await
                .expect("trigger");
        }
        Backend::Postgres(_) => {
            use sqlx::Connection as _;
            let mut conn = sqlx::PgConnection::connect(&app.database_url)
                .await
                .expect("open the database");
            sqlx::raw_sql(sql)
                .execute(&mut conn)
                .await
                .expect("trigger");
        }
    }
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
