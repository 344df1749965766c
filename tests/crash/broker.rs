//! The broker as a child process that the harness kills with SIGKILL and starts again on the
//! same port and database (a temp SQLite file, or a fresh Postgres schema dropped at the end), so
//! what survives is only what the broker made durable.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

/// How long a (re)start may take before the harness gives up.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// Where the broker keeps its state, plus a directory for its log.
pub struct Database {
    pub url: String,
    pub backend: &'static str,
    pub dir: tempfile::TempDir,
    schema: Option<Schema>,
}

impl Database {
    pub fn sqlite() -> Database {
        let dir = temp_dir();
        let url = format!("sqlite://{}", dir.path().join("approvals.db").display());
        Database {
            url,
            backend: "sqlite",
            dir,
            schema: None,
        }
    }

    /// A new schema in the database `base_url` names.
    pub async fn postgres(base_url: &str) -> Database {
        let schema = Schema::create(base_url).await;
        Database {
            url: schema.url(),
            backend: "postgres",
            dir: temp_dir(),
            schema: Some(schema),
        }
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("broker.log")
    }

    /// Keeps the directory (the SQLite file and the broker's log) and the Postgres schema for a
    /// post-mortem; returns the directory.
    pub fn keep(self) -> PathBuf {
        let Database {
            dir, mut schema, ..
        } = self;
        if let Some(schema) = schema.as_mut() {
            eprintln!("crash: keeping the Postgres schema {}", schema.name);
            schema.keep = true;
        }
        dir.keep()
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("approvals-crash-")
        .tempdir()
        .expect("temp dir")
}

/// A Postgres schema the run owns; dropped with it.
struct Schema {
    base_url: String,
    name: String,
    keep: bool,
}

impl Schema {
    async fn create(base_url: &str) -> Schema {
        use sqlx::Connection as _;
        let name = format!("crash_{}", uuid::Uuid::new_v4().simple());
        let mut conn = sqlx::PgConnection::connect(base_url)
            .await
            .unwrap_or_else(|e| panic!("{base_url} is unreachable: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await
            .expect("create schema");
        Schema {
            base_url: base_url.to_owned(),
            name,
            keep: false,
        }
    }

    /// The database URL with this schema first on the search path.
    fn url(&self) -> String {
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
}

impl Drop for Schema {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let base_url = self.base_url.clone();
        let sql = format!(
            "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS {} CASCADE",
            self.name
        );
        // Drop may run inside the test's runtime: do the async work on a thread of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                use sqlx::Connection as _;
                if let Ok(mut conn) = sqlx::PgConnection::connect(&base_url).await {
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// The broker binary running as a child process on a fixed port.
pub struct BrokerProcess {
    port: u16,
    database_url: String,
    log: PathBuf,
    child: Option<Child>,
    /// How many times a broker process was started (first start included).
    pub starts: u32,
    /// How long each restart took, from the new process to its first SERVING answer.
    pub restart_times: Vec<Duration>,
}

impl BrokerProcess {
    /// Starts the broker on a free port and waits until it serves.
    pub async fn start(database: &Database) -> BrokerProcess {
        let mut broker = BrokerProcess {
            port: free_port(),
            database_url: database.url.clone(),
            log: database.log_path(),
            child: None,
            starts: 0,
            restart_times: Vec::new(),
        };
        broker.start_and_wait().await;
        broker
    }

    /// `http://127.0.0.1:PORT`: the same across restarts.
    pub fn address(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// SIGKILL, and reap the process.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // `Child::kill` sends SIGKILL on Unix: no handler runs, nothing is flushed.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a new broker process on the same port and database; waits until it serves.
    pub async fn restart(&mut self) {
        self.kill();
        let started = Instant::now();
        self.start_and_wait().await;
        self.restart_times.push(started.elapsed());
    }

    fn spawn(&mut self) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("broker log");
        let stderr = log.try_clone().expect("broker log");
        self.starts += 1;
        let child = Command::new(env!("CARGO_BIN_EXE_approval-broker"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--database-url")
            .arg(&self.database_url)
            // No metrics endpoint: brokers of tests running side by side would share its port.
            .args(["--metrics-listen", "off"])
            // Every other setting at its default (`synchronous=FULL` on SQLite), whatever the
            // environment of the test says.
            .env_clear()
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("start the broker binary");
        self.child = Some(child);
    }

    async fn start_and_wait(&mut self) {
        let deadline = Instant::now() + START_PATIENCE;
        self.spawn();
        loop {
            if serving(&self.address()).await {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "the broker did not serve within {START_PATIENCE:?}; log: {}\n{}",
                    self.log.display(),
                    log_tail(&self.log)
                );
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                // E.g. the port was not free yet: try again.
                eprintln!("crash: the broker exited during start ({status}); starting it again");
                tokio::time::sleep(Duration::from_millis(200)).await;
                self.spawn();
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("address").port()
}

/// A fresh connection to `address` (fails fast while the broker is down).
pub async fn connect(address: &str) -> Option<Channel> {
    let endpoint = Endpoint::from_shared(address.to_owned())
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(500));
    match tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await {
        Ok(Ok(channel)) => Some(channel),
        _ => None,
    }
}

/// A channel that connects (and reconnects) when used.
pub fn lazy_channel(address: &str) -> Channel {
    Endpoint::from_shared(address.to_owned())
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy()
}

/// Whether `grpc.health.v1.Health/Check` answers SERVING.
async fn serving(address: &str) -> bool {
    use tonic_health::pb::health_client::HealthClient;
    let Some(channel) = connect(address).await else {
        return false;
    };
    let mut health = HealthClient::new(channel);
    let request = tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), health.check(request)).await,
        Ok(Ok(response))
            if response.get_ref().status
                == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    )
}

/// The last lines of the broker's log, for a failure message.
pub fn log_tail(path: &Path) -> String {
    use std::io::Read as _;
    let mut text = String::new();
    if let Ok(mut file) = File::open(path) {
        let _ = file.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
