//! The broker under test, as the bench sees it: where its binary is, a connection to it, and
//! what /proc says about it. Starting it on a free port with a fresh database is the test kit's
//! (`testkit/src/broker.rs`, included by `main.rs`).

use std::collections::BTreeMap;
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
            "{} not found: build it first (cargo build --release --workspace --bins)",
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
    stat_cpu(&stat).map(|(_, seconds)| seconds)
}

/// User plus system CPU seconds of each live thread of a process, added up by what the thread
/// does (its name, from `/proc/<pid>/task/*/stat`): `runtime` (tokio's workers), `writer` (the
/// SQLite store's one writer), `signer` (its receipt signer), `readers` (sqlx's SQLite reader
/// workers), `checkpoint`, `main` and `other`. Threads that already exited are in no kind: the process total minus these sums
/// is what they used.
pub fn cpu_by_thread(pid: &str) -> Option<BTreeMap<&'static str, f64>> {
    let mut kinds = BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let Ok(task) = task else { continue };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let Some((name, seconds)) = stat_cpu(&stat) else {
            continue;
        };
        *kinds.entry(thread_kind(name)).or_insert(0.0) += seconds;
    }
    Some(kinds)
}

/// The command name and user plus system CPU seconds of a `stat` line.
fn stat_cpu(stat: &str) -> Option<(&str, f64)> {
    let name = &stat[stat.find('(')? + 1..stat.rfind(')')?];
    // The name may hold spaces and parentheses: fields start after the last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is rest[0]; utime is field 14, stime field 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((name, (utime + stime) / CLOCK_TICKS))
}

/// The command name of a Postgres server's processes (postmaster and backends) in `/proc`.
pub const DATABASE_PROCESS: &str = "postgres";

/// The CPU of some processes (Postgres's, say, the broker, or this one) from a first reading on.
pub struct ProcessCpu {
    whose: Whose,
    start: BTreeMap<u32, f64>,
}

/// Which processes a [`ProcessCpu`] reads.
#[derive(Clone, Copy)]
enum Whose {
    /// Every process of this command name.
    Named(&'static str),
    /// One process (all its threads, those that exited included).
    Pid(u32),
}

impl Whose {
    fn read(self) -> BTreeMap<u32, f64> {
        match self {
            Whose::Named(name) => cpu_of_processes(name),
            Whose::Pid(pid) => cpu_seconds(&pid.to_string())
                .map(|seconds| (pid, seconds))
                .into_iter()
                .collect(),
        }
    }
}

impl ProcessCpu {
    /// Reads the CPU of every process named `name` now.
    pub fn start(name: &'static str) -> Self {
        Self::reading(Whose::Named(name))
    }

    /// Reads the CPU of process `pid` now.
    pub fn of(pid: u32) -> Self {
        Self::reading(Whose::Pid(pid))
    }

    /// Reads this process's CPU now.
    pub fn this_process() -> Self {
        Self::of(std::process::id())
    }

    fn reading(whose: Whose) -> Self {
        Self {
            whose,
            start: whose.read(),
        }
    }

    /// The CPU seconds they used since the first reading (see [`cpu_between`]); `None` where
    /// none runs on this machine.
    pub fn used(&self) -> Option<f64> {
        cpu_between(&self.start, &self.whose.read())
    }
}

/// CPU seconds `used` over `cycles` cycles, in microseconds per cycle (`None` without cycles).
pub fn per_cycle_us(used: Option<f64>, cycles: f64) -> Option<f64> {
    used.filter(|_| cycles > 0.0).map(|cpu| cpu * 1e6 / cycles)
}

/// User plus system CPU seconds of every process named `name` (its command name in `/proc`, at
/// most 15 bytes), by pid; empty where none runs on this machine (a remote database).
fn cpu_of_processes(name: &str) -> BTreeMap<u32, f64> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeMap::new();
    };
    entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (comm, seconds) = stat_cpu(&stat)?;
            (comm == name).then_some((pid, seconds))
        })
        .collect()
}

/// The CPU seconds processes used between two readings of [`cpu_of_processes`]: what each used
/// since the first (all of it for a process started since); a process that exited meanwhile is
/// missing from the second and counts for nothing. `None` where no such process was seen.
fn cpu_between(start: &BTreeMap<u32, f64>, end: &BTreeMap<u32, f64>) -> Option<f64> {
    (!end.is_empty()).then(|| {
        end.iter()
            .map(|(pid, seconds)| seconds - start.get(pid).copied().unwrap_or(0.0))
            .sum()
    })
}

/// What a broker thread does, by its name (at most 15 bytes in `/proc`).
fn thread_kind(name: &str) -> &'static str {
    if name.starts_with("tokio-rt") || name.starts_with("tokio-runtime") {
        "runtime"
    } else if name.starts_with("store-writer") {
        "writer"
    } else if name.starts_with("receipt-signer") {
        "signer"
    } else if name.starts_with("sqlx-sqlite") {
        "readers"
    } else if name.starts_with("sqlite-checkpoi") {
        "checkpoint"
    } else if name.starts_with("approval-broker") {
        "main"
    } else {
        "other"
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_thread_name_and_cpu_seconds() {
        let stat = "42 (tokio-runtime-w) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 1";
        assert_eq!(stat_cpu(stat), Some(("tokio-runtime-w", 2.0)));
        assert_eq!(thread_kind("tokio-runtime-w"), "runtime");
        assert_eq!(thread_kind("tokio-rt-worker"), "runtime");
        assert_eq!(thread_kind("store-writer"), "writer");
        assert_eq!(thread_kind("receipt-signer"), "signer");
        assert_eq!(thread_kind("sqlx-sqlite-wor"), "readers");
    }

    #[test]
    fn this_process_has_threads_with_cpu_time() {
        let kinds = cpu_by_thread("self").expect("/proc/self/task");
        assert!(!kinds.is_empty());
    }

    #[test]
    fn processes_are_found_by_name_and_their_cpu_counted_between_two_readings() {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        let (name, _) = stat_cpu(&stat).unwrap();
        let me: u32 = std::process::id();
        let start = cpu_of_processes(name);
        assert!(start.contains_key(&me), "{name}: {start:?}");
        // Burn CPU until /proc shows a tick more.
        let mut end = cpu_of_processes(name);
        while end[&me] <= start[&me] {
            std::hint::black_box((0..100_000u64).sum::<u64>());
            end = cpu_of_processes(name);
        }
        assert!(cpu_between(&start, &end).unwrap() > 0.0);
        assert!(cpu_of_processes("no-such-proces").is_empty());
        assert_eq!(cpu_between(&start, &BTreeMap::new()), None);
        // A process started since counts whole; one that exited, not at all.
        let started = BTreeMap::from([(1, 2.0), (7, 0.5)]);
        assert_eq!(
            cpu_between(&BTreeMap::from([(1, 1.5), (9, 4.0)]), &started),
            Some(1.0)
        );
    }
}
