//! A developer's exported broker settings never reach a test broker: brokers built in process
//! take an explicit configuration (`Config::for_tests`), and the test kit starts the binary with
//! every `APPROVALS_*` / `DATABASE_URL` variable removed. A binary of its own, with one test,
//! because it sets environment variables, which no other test may be reading meanwhile.

use approval_broker::config::Config;
use approval_broker::proto::v1 as pb;
use approval_broker::startup;
use pb::agent_service_client::AgentServiceClient;
use tonic::transport::Channel;

/// Inputs longer than this would be refused if the stray limit were taken.
const STRAY_MAX_INPUT_BYTES: &str = "16";
const INPUT: &str = r#"{"path":"/home/dev/project/src/main.rs"}"#;

#[test]
fn a_stray_setting_in_the_environment_does_not_change_a_test_broker() {
    let stray_token = format!(
        "agent bot {}",
        approval_broker::door::auth::hash_token("not-the-tests-token")
    );
    // SAFETY: this is the only test of this binary, and no thread of its own runs yet, so nothing
    // reads the environment while it changes.
    unsafe {
        std::env::set_var("APPROVALS_MAX_INPUT_BYTES", STRAY_MAX_INPUT_BYTES);
        // Would turn authentication on, so every unauthenticated call would be refused.
        std::env::set_var("APPROVALS_TOKENS", &stray_token);
    }
    // The variables are live: a broker that read its environment would take them.
    let from_environment =
        <Config as clap::Parser>::try_parse_from(["approval-broker"]).expect("the defaults");
    assert_eq!(from_environment.requests.max_input_bytes, 16);
    assert_eq!(
        from_environment.auth.tokens.as_deref(),
        Some(stray_token.as_str())
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("dir");

        // In process.
        let config = Config::for_tests(format!("sqlite://{}", dir.path().join("a.db").display()));
        assert_eq!(
            config.requests.max_input_bytes,
            approval_broker::domain::DEFAULT_MAX_INPUT_BYTES
        );
        assert_eq!(config.auth.tokens, None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(startup::run(listener, config, async {
            let _ = stopped.await;
        }));
        let channel = testkit::lazy_channel(&format!("http://{address}"));
        assert_accepted(&channel, "in process").await;
        let _ = stop.send(());
        server.await.expect("server task").expect("stopped cleanly");

        // The binary, started by the test kit.
        let url = format!("sqlite://{}", dir.path().join("b.db").display());
        let broker = testkit::Launch::new(env!("CARGO_BIN_EXE_approval-broker"), &url)
            .start()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_accepted(&broker.channel(), "the binary").await;
    });
}

/// Submits a call whose input is over the stray limit, without a token; it must be accepted.
async fn assert_accepted(channel: &Channel, broker: &str) {
    let mut agent = AgentServiceClient::new(channel.clone());
    let mut response = None;
    // An in-process broker may not be serving yet.
    for _ in 0..200 {
        match agent
            .submit(pb::SubmitRequest {
                batch: Some(pb::BatchSpec {
                    session_id: "s".into(),
                    calls: vec![pb::CallSpec {
                        call_id: "c1".into(),
                        tool: "read_file".into(),
                        input_json: INPUT.into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
            })
            .await
        {
            Ok(reply) => {
                response = Some(reply.into_inner());
                break;
            }
            Err(status) if status.code() == tonic::Code::Unavailable => {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
            Err(status) => panic!("{broker}: the submit was refused: {status:?}"),
        }
    }
    let response = response.unwrap_or_else(|| panic!("{broker}: never served"));
    assert!(INPUT.len() > STRAY_MAX_INPUT_BYTES.parse().unwrap());
    match &response.acks[0].result {
        Some(pb::call_ack::Result::Accepted(accepted)) => {
            assert_eq!(accepted.status, pb::CallStatus::Pending as i32, "{broker}");
        }
        other => panic!("{broker}: the call was not accepted: {other:?}"),
    }
}
