//! The `approval-broker` binary: reads the configuration, binds, and runs the server until
//! SIGINT or SIGTERM. Everything else lives in the library.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use approval_broker::config::{Command, Config, MetricsListen};
use approval_broker::{observe::meters, observe::telemetry, observe::traces, startup, store};
use tokio::net::TcpListener;

/// mimalloc rather than glibc's malloc: the hot path allocates per message on every thread and
/// frees on another (a request built by the runtime, dropped by the writer), which glibc pays for
/// in arena locks. Measured in docs/benchmarks-notes.md ("The allocator and the writer's
/// checkpoints").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Before the runtime starts its threads, and before anything opens a database.
    let sqlite_allocator = store::sqlite_allocator::install();
    run(sqlite_allocator)
}

#[tokio::main]
async fn run(sqlite_allocator: Result<(), std::ffi::c_int>) -> ExitCode {
    let config = Config::from_command_line();
    // Before logging starts: a hook's standard output is its answer and holds nothing else.
    if let Some(Command::Hook(hook)) = &config.command {
        return approval_broker::agent::hook::run(hook).await;
    }
    // Likewise: in stdio mode the gateway's standard output is the MCP channel.
    if let Some(Command::McpGateway(gateway)) = &config.command {
        return approval_broker::agent::mcp::run(gateway).await;
    }
    // Likewise: the proxy's standard output is the editor's ACP channel.
    if let Some(Command::AcpProxy(proxy)) = &config.command {
        return approval_broker::agent::acp::run(proxy).await;
    }
    if let Some(Command::Verify(args)) = &config.command {
        return approval_broker::commands::verify::run(args, &config.store).await;
    }
    // Likewise: the export's standard output is the audit.
    if let Some(Command::Export(args)) = &config.command {
        return match config.store.database() {
            Ok(database) => approval_broker::commands::export::run(&database, args).await,
            Err(err) => {
                eprintln!("{err}");
                ExitCode::FAILURE
            }
        };
    }
    let json = config.telemetry.log_format == "json";
    let traces = match traces::endpoint(config.telemetry.otlp_endpoint.as_deref()) {
        None => None,
        Some(endpoint) => match traces::exporter(&endpoint) {
            Ok(provider) => Some((provider, endpoint)),
            Err(err) => {
                telemetry::init("info", json);
                tracing::error!(error = %err, "cannot export traces (--otlp-endpoint / OTEL_EXPORTER_OTLP_ENDPOINT)");
                return ExitCode::FAILURE;
            }
        },
    };
    telemetry::init_traced("info", json, traces.as_ref().map(|(provider, _)| provider));
    if let Some((_, endpoint)) = &traces {
        tracing::info!(%endpoint, "exporting traces over OTLP");
    }
    if let Err(code) = sqlite_allocator {
        tracing::warn!(
            code,
            "SQLite refused mimalloc as its allocator and keeps its own"
        );
    }
    let exit = serve(config).await;
    if let Some((provider, _)) = traces {
        // Sends the spans still batched; blocking, so off the runtime's workers.
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(err)) = flushed {
            tracing::warn!(error = %err, "traces not all exported at exit");
        }
    }
    exit
}

/// Runs the subcommand, or serves until SIGINT or SIGTERM.
async fn serve(config: Config) -> ExitCode {
    match &config.command {
        Some(Command::Migrate) => {
            return match startup::migrate(&config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!(error = %err, "migration failed");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::HashToken { token }) => return hash_token(token.clone()),
        Some(
            Command::Hook(_)
            | Command::McpGateway(_)
            | Command::AcpProxy(_)
            | Command::Export(_)
            | Command::Verify(_),
        ) => {
            unreachable!("answered above")
        }
        None => {}
    }
    let listener = match TcpListener::bind(config.serve.listen).await {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(listen = %config.serve.listen, error = %err, "cannot bind --listen / APPROVALS_LISTEN");
            return ExitCode::FAILURE;
        }
    };
    if let MetricsListen::On(address) = config.telemetry.metrics_listen
        && let Err(err) = meters::serve(address)
    {
        tracing::error!(error = %err, "cannot serve metrics (--metrics-listen / APPROVALS_METRICS_LISTEN)");
        return ExitCode::FAILURE;
    }
    match startup::run(listener, config, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "the broker stopped with an error");
            ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// `approval-broker hash-token [TOKEN]`: prints the hash to configure the token with.
fn hash_token(token: Option<String>) -> ExitCode {
    let token = match token {
        Some(token) => token,
        None => {
            let mut line = String::new();
            if std::io::stdin().read_line(&mut line).is_err() {
                eprintln!("cannot read the token from standard input");
                return ExitCode::FAILURE;
            }
            line.trim_end_matches(['\r', '\n']).to_owned()
        }
    };
    if token.is_empty() {
        eprintln!("the token is empty");
        return ExitCode::FAILURE;
    }
    println!("{}", approval_broker::door::auth::hash_token(&token));
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use approval_broker::store::sqlite_allocator;

    /// SQLite takes mimalloc's functions before it first runs, and then runs on them: rows that
    /// make it allocate, grow (realloc) and free buffers and pages, read back whole. The only test
    /// of this binary that uses SQLite, so SQLite is not initialised before it.
    #[test]
    fn sqlite_allocates_through_mimalloc() {
        assert_eq!(sqlite_allocator::install(), Ok(()));
        assert!(sqlite_allocator::in_use(), "SQLite frees with mi_free");

        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (n INTEGER PRIMARY KEY, text TEXT NOT NULL);
             WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 2000)
             INSERT INTO t SELECT n, printf('%.*c', n * 7, 'x') FROM r;
             CREATE INDEX t_text ON t (text);
             UPDATE t SET text = text || text WHERE n % 3 = 0;",
        )
        .unwrap();
        let (rows, bytes): (i64, i64) = conn
            .query_row("SELECT COUNT(*), SUM(LENGTH(text)) FROM t", [], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .unwrap();
        let expected: i64 = (1..=2000i64)
            .map(|n| if n % 3 == 0 { 14 * n } else { 7 * n })
            .sum();
        assert_eq!((rows, bytes), (2000, expected));
    }
}
