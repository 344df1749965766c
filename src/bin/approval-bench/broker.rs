//! The broker under test: a child process on a free port with a fresh database (a temp SQLite
//! file, or a Postgres schema created here and dropped at the end), and what /proc says about it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection as _;
use tonic::transport::{Channel, Endpoint};

/// A temp directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> std::io::Result<TempDir> {
        let path =
            std::env::temp_dir().join(format!("approval-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A Postgres schema this run owns: created on `create`, dropped by `drop_now`.
pub struct Schema {
    base_url: String,
    pub name: String,
}

impl Schema {
    pub async fn create(base_url: &str, prefix: &str) -> Result<Schema, String> {
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
        })
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

    pub async fn drop_now(self) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.base_url).await {
            let sql = format!(
                "SET lock_timeout = '5s'; DROP SCHEMA IF EXISTS {} CASCADE",
                self.name
            );
            if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await
            {
                eprintln!("approval-bench: could not drop schema {}: {e}", self.name);
            }
        }
    }
}

/// The broker binary running as a child process.
pub struct BrokerProcess {
    pub address: String,
    pub log: PathBuf,
    child: Child,
}

impl BrokerProcess {
    /// Starts `approval-broker` (next to this executable) on a free port and waits until it
    /// answers SERVING.
    pub async fn start(
        database_url: &str,
        log: &Path,
        extra_args: &[String],
    ) -> Result<BrokerProcess, String> {
        let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let binary = exe
            .parent()
            .map(|dir| dir.join("approval-broker"))
            .ok_or("current_exe has no directory")?;
        if !binary.exists() {
            return Err(format!(
                "{} not found: build it first (cargo build --release --bin approval-broker)",
                binary.display()
            ));
        }
        let port = free_port().map_err(|e| format!("free port: {e}"))?;
        let address = format!("http://127.0.0.1:{port}");
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut command = Command::new(&binary);
        command
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--database-url")
            .arg(database_url)
            .args(extra_args)
            // Every other setting at its default (`synchronous=FULL`, log level `info`),
            // whatever this environment says...
            .env_clear()
            // ...but no metrics endpoint unless asked for (`--broker-arg=--metrics-listen=...`):
            // the default port may be taken, and nothing here reads it.
            .env("APPROVALS_METRICS_LISTEN", "off")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("start {}: {e}", binary.display()))?;
        let mut broker = BrokerProcess {
            address,
            log: log.to_owned(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if serving(&broker.address).await {
                return Ok(broker);
            }
            if let Ok(Some(status)) = broker.child.try_wait() {
                return Err(format!(
                    "the broker exited during start ({status}); log {}:\n{}",
                    broker.log.display(),
                    std::fs::read_to_string(&broker.log).unwrap_or_default()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the broker did not serve within 30 s; log: {}",
                    broker.log.display()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL and reap (the run's database is thrown away anyway).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A channel to `address`, connected now.
pub async fn connect(address: &str) -> Result<Channel, String> {
    Endpoint::from_shared(address.to_owned())
        .map_err(|e| format!("{address}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("connect to {address}: {e}"))
}

/// Whether `grpc.health.v1.Health/Check` answers SERVING.
pub async fn serving(address: &str) -> bool {
    use tonic_health::pb::health_client::HealthClient;
    let Ok(Ok(channel)) = tokio::time::timeout(Duration::from_secs(2), connect(address)).await
    else {
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

/// Clock ticks per second of `/proc/<pid>/stat` times. `libc` is not a dependency of the crate,
/// so this assumes the Linux default, 100 (`getconf CLK_TCK`).
pub const CLOCK_TICKS: f64 = 100.0;

/// User plus system CPU seconds of a process, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is rest[0]; utime is field 14, stime field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / CLOCK_TICKS)
}

/// Peak resident set size in KiB (`VmHWM` of `/proc/<pid>/status`).
pub fn peak_rss_kib(pid: &str) -> Option<u64> {
    proc_status_kib(pid, "VmHWM:")
}

/// Current resident set size in KiB (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_kib(pid: &str) -> Option<u64> {
    proc_status_kib(pid, "VmRSS:")
}

fn proc_status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
