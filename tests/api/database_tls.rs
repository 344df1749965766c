//! Managed Postgres requires TLS: the broker connects over TLS when its `DATABASE_URL` says
//! `sslmode=require` (encrypted) or `verify-ca` / `verify-full` with `sslrootcert` (encrypted and
//! the server's certificate checked), and refuses to start when the certificate does not check
//! out. Runs against the local server, which serves TLS with a self-signed certificate.

use sqlx::Connection as _;

use approval_broker::proto::v1 as pb;

use crate::helpers::*;

/// The Postgres URL of the tests with `params` added to its query string.
fn with_params(base: &str, params: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

/// Whether the server sees every connection named `application_name` as TLS, and how many.
async fn tls_connections(base: &str, application_name: &str) -> (i64, bool) {
    let mut conn = sqlx::PgConnection::connect(&with_params(base, "sslmode=disable"))
        .await
        .expect("connect");
    sqlx::query_as(
        "SELECT count(*), coalesce(bool_and(s.ssl), false) FROM pg_stat_activity a \
         JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
    )
    .bind(application_name)
    .fetch_one(&mut conn)
    .await
    .expect("pg_stat_ssl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn with_sslmode_require_every_connection_to_postgres_is_encrypted() {
    let base = postgres_url();
    for (sslmode, encrypted) in [("require", true), ("disable", false)] {
        let name = format!("broker-tls-{}", uuid::Uuid::new_v4().simple());
        let url = with_params(&base, &format!("sslmode={sslmode}&application_name={name}"));
        let app = spawn_app_on(Backend::Postgres(url), |_| {}).await;
        let reply = submit(&app, batch("s", vec![call("c1", "t", "{}")])).await;
        assert!(matches!(
            reply.acks[0].result,
            Some(pb::call_ack::Result::Accepted(_))
        ));
        let (count, all_tls) = tls_connections(&base, &name).await;
        assert!(
            count > 0,
            "sslmode={sslmode}: the broker's connections are visible"
        );
        assert_eq!(all_tls, encrypted, "sslmode={sslmode}: {count} connections");
    }
}

fn migrate(url: &str) -> std::process::Output {
    broker_binary()
        .args(["migrate", "--database-url", url])
        .env("NO_COLOR", "1")
        .output()
        .expect("run")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(approvals_test_postgres),
    ignore = "not run: set APPROVALS_TEST_POSTGRES_URL to run the Postgres tests"
)]
async fn a_server_certificate_that_the_configured_root_did_not_sign_stops_the_broker() {
    let base = postgres_url();
    let schema = fresh_schema(&base).await;
    let dir = tempfile::tempdir().expect("dir");
    // A CA of our own, which never signed the server's certificate.
    let ca = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("a CA");
    let root = dir.path().join("other-root.pem");
    std::fs::write(&root, ca.cert.pem()).expect("write");
    for sslmode in ["verify-ca", "verify-full"] {
        let url = with_params(
            &schema.url(),
            &format!("sslmode={sslmode}&sslrootcert={}", root.display()),
        );
        let output = migrate(&url);
        assert!(!output.status.success(), "sslmode={sslmode}: {output:?}");
        let said = String::from_utf8_lossy(&output.stdout).to_lowercase();
        assert!(
            said.contains("certificate") || said.contains("tls"),
            "{said}"
        );
    }
    // The same URL asking only for encryption works: only the certificate was at fault.
    let output = migrate(&with_params(&schema.url(), "sslmode=require"));
    assert!(output.status.success(), "{output:?}");
}
