//! The real `approval-broker` binary as a child process, for what only a process shows: signals,
//! exit codes, metrics, log output. The process itself is the test kit's [`BrokerProcess`].

pub use testkit::{BrokerProcess, broker_command, free_port, postgres_url};

/// The binary on `database_url` with `args` and `env` (on top of an environment without the
/// developer's broker settings), on a free port and serving SERVING when this returns.
pub async fn start_broker(
    database_url: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> BrokerProcess {
    env.iter()
        .fold(
            testkit::Launch::new(env!("CARGO_BIN_EXE_approval-broker"), database_url).args(args),
            |launch, (name, value)| launch.env(name, value),
        )
        .start()
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// `approval-broker` as a command without the developer's broker settings
/// ([`testkit::is_broker_setting`]) in its environment.
pub fn broker_binary() -> std::process::Command {
    broker_command(env!("CARGO_BIN_EXE_approval-broker"))
}
