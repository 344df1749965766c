//! The real `approval-broker` binary as a child process, the fresh database it runs on, and the
//! free port it listens on: written once for the API tests, the crash harness and
//! `approval-bench` (which includes this file with `#[path]`, as a bin cannot use a
//! dev-dependency). So it depends only on crates the broker itself depends on (tokio, tonic,
//! tonic-health, sqlx, uuid), and reports failures as `Err(String)` for each caller to panic on
//! or print.
//!
//! It must never let the developer's own settings reach a broker it starts: every `APPROVALS_*`
//! variable, `DATABASE_URL` and `RUST_LOG` are removed from the child's environment, so a test
//! or a benchmark runs the broker it asks for, whatever the shell exported.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

/// How long a start (or restart) may take before it is given up.
pub const START_PATIENCE: Duration = Duration::from_secs(30);

/// The environment variables the broker reads its settings from (besides its flags), so none of
/// them is inherited: every `APPROVALS_*`, `DATABASE_URL`, `RUST_LOG` (the log level) and every
/// `OTEL_*` (trace export).
pub fn is_broker_setting(name: &str) -> bool {
    name.starts_with("APPROVALS_")
        || name.starts_with("OTEL_")
        || name == "DATABASE_URL"
        || name == "RUST_LOG"
}

/// `binary` as a command whose environment holds none of the developer's broker settings (see
/// [`is_broker_setting`]); everything else (PATH, HOME, ...) is inherited.
pub fn broker_command(binary: impl AsRef<Path>) -> Command {
    let mut command = Command::new(binary.as_ref());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(is_broker_setting) {
            command.env_remove(&name);
        }
    }
    command
}

/// A port free at the time of asking.
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A directory of its own under the system's temp directory, removed on drop (the bench cannot
/// use `tempfile`, a dev-dependency).
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> std::io::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Leaves the directory in place (for a post-mortem) and returns it.
    pub fn keep(self) -> PathBuf {
        let path = self.0.clone();
        std::mem::forget(self);
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Postgres schema the caller owns, first on the search path of [`Schema::url`]; dropped with
/// it (or by [`Schema::drop_now`]) unless [`Schema::keep`] is called.
pub struct Schema {
    base_url: String,
    name: String,
    keep: bool,
}

impl Schema {
    /// A new schema named `<prefix>_<random>` in the database `base_url` names.
    pub async fn create(base_url: &str, prefix: &str) -> Result<Schema, String> {
        use sqlx::Connection as _;
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(base_url)
            .await
            .map_err(|e| format!("{base_url} is unreachable: {e}"))?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await
            .map_err(|e| format!("create schema {name}: {e}"))?;
        Ok(Schema {
            base_url: base_url.to_owned(),
            name,
            keep: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The database URL with this schema first on the search path.
    pub fn url(&self) -> String {
        let sep = if self.base_url.contains('?') {
            '&'
        } else {
            '?'
        };
        format!(
            "{}{sep}options=-c%20search_path%3D{}",
            self.base_url, self.name
        )
    }

    /// Gathers the statistics of every table of the schema, as autovacuum does once a table
    /// has changed enough (within a minute of its first 50 rows, at the default settings). A
    /// plan cached while the tables were empty is made again with them.
    pub async fn analyze(&self) -> Result<(), String> {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect(&self.url())
            .await
            .map_err(|e| format!("analyze {}: {e}", self.name))?;
        let tables: Vec<String> =
            sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = $1")
                .bind(&self.name)
                .fetch_all(&mut conn)
                .await
                .map_err(|e| format!("analyze {}: {e}", self.name))?;
        for table in tables {
            let sql = format!("ANALYZE {}.\"{table}\"", self.name);
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
                .map_err(|e| format!("analyze {}.{table}: {e}", self.name))?;
        }
        Ok(())
    }

    /// Leaves the schema in the database (for a post-mortem).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    /// Drops the schema now, saying so if that fails.
    pub async fn drop_now(mut self) {
        self.keep = true;
        if let Err(e) = drop_schema(&self.base_url, &self.name).await {
            eprintln!("could not drop schema {}: {e}", self.name);
        }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let (base_url, name) = (self.base_url.clone(), self.name.clone());
        block_on_own_thread(async move {
            let _ = drop_schema(&base_url, &name).await;
        });
    }
}

/// Runs `work` to its end on a thread and runtime of its own, for async clean-up in `Drop`,
/// which may run inside a runtime that must not be blocked on.
pub fn block_on_own_thread(work: impl std::future::Future<Output = ()> + Send + 'static) {
    let _ = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(work);
    })
    .join();
}

async fn drop_schema(base_url: &str, name: &str) -> Result<(), sqlx::Error> {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(base_url).await?;
    let sql = format!("SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS {name} CASCADE");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await?;
    Ok(())
}

/// The broker binary running as a child process on a port of its own, which stays the same
/// across [`BrokerProcess::restart`]s. Killed (SIGKILL) and reaped on drop.
pub struct BrokerProcess {
    binary: PathBuf,
    port: u16,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: PathBuf,
    /// Holds the log when the caller named no place for it.
    _log_dir: Option<TempDir>,
    child: Option<Child>,
    channel: Channel,
    /// How many times a broker process was started (the first start included).
    pub starts: u32,
    /// How long each restart took, from the new process to its first SERVING answer.
    pub restart_times: Vec<Duration>,
}

/// What to start: the binary, its database and anything else it is told.
pub struct Launch {
    binary: PathBuf,
    database_url: String,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: Option<PathBuf>,
}

impl Launch {
    /// `binary` on `database_url`, every other setting at its default, except that no metrics
    /// endpoint is served (brokers started side by side would share its port; `--metrics-listen`
    /// in [`Launch::args`] or [`Launch::env`] asks for one).
    pub fn new(binary: impl Into<PathBuf>, database_url: &str) -> Launch {
        Launch {
            binary: binary.into(),
            database_url: database_url.to_owned(),
            args: Vec::new(),
            env: vec![("APPROVALS_METRICS_LISTEN".into(), "off".into())],
            log: None,
        }
    }

    /// More command-line arguments.
    pub fn args<I, S>(mut self, args: I) -> Launch
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable for the broker (set after the developer's are removed).
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Launch {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Where the broker's standard output and error go (appended to); a temp file by default.
    pub fn log(mut self, log: impl Into<PathBuf>) -> Launch {
        self.log = Some(log.into());
        self
    }

    /// Starts the broker on a free port and waits until it answers SERVING.
    pub async fn start(self) -> Result<BrokerProcess, String> {
        let (log, log_dir) = match self.log {
            Some(log) => (log, None),
            None => {
                let dir = TempDir::new("approval-broker").map_err(|e| format!("temp dir: {e}"))?;
                (dir.path().join("broker.log"), Some(dir))
            }
        };
        let port = free_port().map_err(|e| format!("free port: {e}"))?;
        let mut args: Vec<OsString> = vec![
            "--listen".into(),
            format!("127.0.0.1:{port}").into(),
            "--database-url".into(),
            self.database_url.into(),
        ];
        args.extend(self.args);
        let mut broker = BrokerProcess {
            binary: self.binary,
            port,
            args,
            env: self.env,
            log,
            _log_dir: log_dir,
            child: None,
            channel: lazy_channel(&format!("http://127.0.0.1:{port}")),
            starts: 0,
            restart_times: Vec::new(),
        };
        broker.spawn()?;
        broker.wait_until_serving(false).await?;
        Ok(broker)
    }
}

impl BrokerProcess {
    /// `http://127.0.0.1:PORT`: the same across restarts.
    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A channel to the broker that connects (and reconnects) when used.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Everything the broker has written to its standard output and error so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The running process's id (`None` once it was killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How the process ended, if it has.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL (no handler runs, nothing is flushed), and reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the broker and starts a new process on the same port and database; waits until it
    /// serves.
    pub async fn restart(&mut self) -> Result<(), String> {
        self.kill();
        let started = Instant::now();
        self.spawn()?;
        self.wait_until_serving(true).await?;
        self.restart_times.push(started.elapsed());
        Ok(())
    }

    fn spawn(&mut self) -> Result<(), String> {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", self.log.display()))?;
        let child = broker_command(&self.binary)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.binary.display()))?;
        self.starts += 1;
        self.child = Some(child);
        Ok(())
    }

    /// Waits for SERVING. A process that exits first is an error, except on a restart, where
    /// the port may not be free again yet: then it is started again until [`START_PATIENCE`].
    async fn wait_until_serving(&mut self, again_on_exit: bool) -> Result<(), String> {
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            if serving(&self.address()).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the broker did not serve within {START_PATIENCE:?}; log {}:\n{}",
                    self.log.display(),
                    log_tail(&self.log)
                ));
            }
            match self.try_wait() {
                Some(status) if again_on_exit => {
                    eprintln!("the broker exited during start ({status}); starting it again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    self.spawn()?;
                }
                Some(status) => {
                    return Err(format!(
                        "the broker exited during start ({status}); log {}:\n{}",
                        self.log.display(),
                        log_tail(&self.log)
                    ));
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A channel to `address` that connects (and reconnects) when used, giving up a connection
/// attempt after half a second (a broker that is down is noticed at once).
pub fn lazy_channel(address: &str) -> Channel {
    Endpoint::from_shared(address.to_owned())
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy()
}

/// A fresh connection to `address`, or `None` at once while nothing answers there.
pub async fn connect(address: &str) -> Option<Channel> {
    let endpoint = Endpoint::from_shared(address.to_owned())
        .ok()?
        .connect_timeout(Duration::from_millis(500));
    match tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await {
        Ok(Ok(channel)) => Some(channel),
        _ => None,
    }
}

/// Whether `grpc.health.v1.Health/Check` at `address` answers SERVING now, over a fresh
/// connection.
pub async fn serving(address: &str) -> bool {
    use tonic_health::pb::health_client::HealthClient;
    let Some(channel) = connect(address).await else {
        return false;
    };
    let request = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), HealthClient::new(channel).check(request)).await,
        Ok(Ok(response))
            if response.get_ref().status
                == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    )
}

/// The last 40 lines of a log file, for a failure message.
pub fn log_tail(path: &Path) -> String {
    use std::io::Read as _;
    let mut text = String::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
