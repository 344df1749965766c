//! The broker under test, as the bench sees it: where its binary is, a connection to it, and
//! what /proc says about it. Starting it on a free port with a fresh database is the test kit's
//! (`testkit/src/broker.rs`, included by `main.rs`).

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// `approval-broker`, next to this executable (both are built into the same `target/<profile>/`).
pub fn binary() -> Result<PathBuf, String> {
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
    Ok(binary)
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
