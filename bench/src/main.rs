//! `approval-bench`: the approval broker's throughput, latency and scale benchmark. Two commands:
//!
//! ```sh
//! cargo build --release --workspace --bins
//! target/release/approval-bench --agents 64 --duration 10
//! ```
//!
//! build both binaries (the bench is a crate of its own, `bench/`) and run it: it starts
//! `approval-broker` (from the same `target/<profile>/` directory)
//! as a child process on a free port with a fresh temp SQLite file (`synchronous=FULL`, every
//! setting at its default), and runs A agents (`--agents`), each with a `Connect` stream
//! submitting batches (`--batch-size`) of calls with 1 KiB JSON inputs, S subscribers
//! (`--subscribers`) and D approvers (`--approvers`) approving what their subscription shows, for
//! `--duration` seconds after `--warmup` seconds. `--rate` caps the overall submit rate (calls/s).
//! `--database-url postgres://...` runs the broker on a fresh schema of that database (created
//! and dropped here; its statistics gathered halfway through the warm-up, as autovacuum gathers
//! them early in any deployment); `--target http://host:port` drives a running broker instead (no CPU or
//! memory figures then).
//!
//! It prints full approval cycles/s (submit → acknowledged → seen by a subscriber → decided →
//! outcome at the agent), latency percentiles of submit→ack, submit→seen (the first subscriber
//! to see the call), decide→outcome at the agent and the full cycle, the broker's CPU seconds
//! during the measured window and its peak RSS; then the raw storage limit measured in the same
//! run (the broker's durable writes per cycle made with its own statements through its own
//! driver, same database kind and settings, one transaction per write and 100 cycles per
//! transaction) and the broker's ratio to each, and the most any broker could reach in the run
//! (`Ceiling`: the cores filled by the raw batched cycle's CPU, a receipt's signature and the load
//! generator's CPU per cycle). `--json PATH` writes the figures as JSON.
//!
//! `--check` is the CI smoke mode: a short run (2 s, 0.5 s warm-up, 4 agents unless given)
//! that fails (exit 1) unless every submitted call was acknowledged, shown to every subscriber,
//! decided, and its outcome received by its agent. Speed is never asserted.
//!
//! `--webhooks N` measures what webhook endpoints cost, in one run on one broker: first with
//! none, then with N endpoints (receivers inside the bench, every event to each, the last one in
//! Slack format) created through AdminService, and prints the two rates and their ratio.

mod broker;
mod load;
mod scale;
mod sinks;
mod stats;
mod storage;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Parser;

use kit::{BrokerProcess, Launch, Schema, TempDir};
use load::{AutoApprove, CallRecord, LoadConfig, Shared};
use stats::{Percentiles, ms};
use testkit::broker as kit;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "approval-bench",
    about = "Benchmarks the approval broker: full approval cycles/s, latencies, CPU and memory, \
             against the raw storage limit."
)]
struct Args {
    /// Concurrent agents, each with its own connection and `Connect` stream.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    agents: u32,
    /// Calls per submitted batch (one model turn).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=128))]
    batch_size: u32,
    /// `Subscribe` streams that only watch (submit→seen is measured on them).
    #[arg(long, default_value_t = 1)]
    subscribers: u32,
    /// Approvers: each subscribes and approves its share of what it is shown.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    approvers: u32,
    /// Decisions each approver may have in flight at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    approver_concurrency: u32,
    /// Seconds measured, after the warm-up.
    #[arg(long)]
    duration: Option<f64>,
    /// Seconds of load before measuring.
    #[arg(long)]
    warmup: Option<f64>,
    /// Cap on submitted calls per second, over all agents (e.g. half the peak rate).
    #[arg(long)]
    rate: Option<f64>,
    /// Size of each call's JSON input, in bytes.
    #[arg(long, default_value_t = 1024)]
    input_bytes: usize,
    /// Run the broker on a fresh schema of this Postgres database (`postgres://...`) instead of
    /// a temp SQLite file.
    #[arg(long)]
    database_url: Option<String>,
    /// Drive a running broker at this address (without auth) instead of starting one; no CPU,
    /// memory or raw storage figures then.
    #[arg(long, conflicts_with = "database_url")]
    target: Option<String>,
    /// Extra arguments for the started broker, e.g. `--broker-arg=--sqlite-synchronous=normal`.
    #[arg(long, allow_hyphen_values = true)]
    broker_arg: Vec<String>,
    /// Seconds each raw storage measurement runs (0 skips them).
    #[arg(long)]
    storage_duration: Option<f64>,
    /// Seconds an agent waits for a batch's outcomes after the run before giving up on it.
    #[arg(long, default_value_t = 30.0)]
    drain: f64,
    /// Approve every call at submit, with no approver in the loop: by `rule` (a policy rule
    /// allowing the bench's tool) or by `grant` (a session grant each agent gets from a person
    /// for its first call). Measures the path most calls take in a mature deployment: the
    /// figures are then auto-approved calls/s and submit→outcome at the agent.
    #[arg(long, value_enum)]
    auto_approve: Option<load::AutoApprove>,
    /// Postgres: run this many broker replicas on the one database, agents and watchers spread
    /// over them in turn (replica-wide CPU figures are then not reported).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8), requires = "database_url", conflicts_with_all = ["scale", "webhooks"])]
    replicas: u32,
    /// Measure with no webhook endpoint, then with this many (receivers inside the bench, every
    /// event to each, the last in Slack format), on the same broker, and print both rates.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64), conflicts_with_all = ["scale", "target"])]
    webhooks: u32,
    /// Write the figures as JSON to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Smoke mode for CI: a short run that verifies every submitted call is accounted for.
    #[arg(long)]
    check: bool,
    /// Scale mode: what four requests cost on an empty and on a large store, and the memory of
    /// idle streams (see `--scale-decided`, `--scale-pending`, `--idle-streams`).
    #[arg(long, conflicts_with = "check")]
    scale: bool,
    /// Scale mode: decided calls to store.
    #[arg(long, default_value_t = 1_000_000)]
    scale_decided: u64,
    /// Scale mode: pending calls to store.
    #[arg(long, default_value_t = 100_000)]
    scale_pending: u64,
    /// Scale mode: idle agent `Connect` streams to hold open.
    #[arg(long, default_value_t = 10_000)]
    idle_streams: u32,
    /// Scale mode: idle subscribers to hold open.
    #[arg(long, default_value_t = 100)]
    idle_subscribers: u32,
}

/// The broker's allocator, for the load generator and the raw storage loops alike: the raw loop
/// then allocates as the broker's writer does (Rust and SQLite both through mimalloc).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Before the runtime's threads, and before anything opens a database.
    if let Err(code) = approval_broker::store::sqlite_allocator::install() {
        eprintln!("approval-bench: SQLite refused mimalloc as its allocator (code {code})");
    }
    run_to_exit();
}

#[tokio::main]
async fn run_to_exit() {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(message) => {
            eprintln!("approval-bench: {message}");
            std::process::exit(2);
        }
    }
}

/// The broker process (if started here), its database and where to reach it.
struct Setup {
    address: String,
    backend: &'static str,
    broker: Option<BrokerProcess>,
    /// The other replicas (`--replicas`), on the same database.
    replicas: Vec<BrokerProcess>,
    schema: Option<Schema>,
    dir: TempDir,
}

async fn run(mut args: Args) -> Result<bool, String> {
    if args.check {
        args.duration.get_or_insert(2.0);
        args.warmup.get_or_insert(0.5);
        args.storage_duration.get_or_insert(0.5);
        if !std::env::args().any(|a| a == "--agents" || a.starts_with("--agents=")) {
            args.agents = 4;
        }
    }
    let duration = secs(args.duration.unwrap_or(10.0), "--duration")?;
    let warmup = secs(args.warmup.unwrap_or(2.0), "--warmup")?;
    let storage_duration = secs(args.storage_duration.unwrap_or(3.0), "--storage-duration")?;
    let drain = secs(args.drain, "--drain")?;
    if duration.is_zero() {
        return Err("--duration must be greater than zero".into());
    }
    if args.rate.is_some_and(|r| r.is_nan() || r <= 0.0) {
        return Err("--rate must be greater than zero".into());
    }

    let setup = setup(&args).await?;
    let result = if args.scale {
        scale(&args, &setup).await
    } else if args.webhooks > 0 {
        with_and_without_webhooks(&args, &setup, duration, warmup, storage_duration, drain).await
    } else {
        measure(&args, &setup, duration, warmup, storage_duration, drain)
            .await
            .map(|m| m.ok)
    };
    let Setup {
        broker,
        replicas,
        schema,
        dir,
        ..
    } = setup;
    drop(broker);
    drop(replicas);
    if let Some(schema) = schema {
        schema.drop_now().await;
    }
    drop(dir);
    result
}

async fn scale(args: &Args, setup: &Setup) -> Result<bool, String> {
    let config = scale::ScaleConfig {
        decided: args.scale_decided,
        pending: args.scale_pending,
        idle_streams: args.idle_streams,
        idle_subscribers: args.idle_subscribers,
        input_bytes: args.input_bytes,
    };
    let pid = setup
        .broker
        .as_ref()
        .and_then(|b| b.pid())
        .map(|pid| pid.to_string());
    let figures = scale::run(&config, &setup.address, pid).await?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&figures).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(true)
}

fn secs(value: f64, name: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value).map_err(|_| format!("{name}: not a number of seconds"))
}

async fn setup(args: &Args) -> Result<Setup, String> {
    let dir = TempDir::new("approval-bench").map_err(|e| format!("temp dir: {e}"))?;
    if let Some(target) = &args.target {
        return Ok(Setup {
            address: target.clone(),
            backend: "target",
            broker: None,
            replicas: Vec::new(),
            schema: None,
            dir,
        });
    }
    let (url, backend, schema) = match &args.database_url {
        Some(base) if base.starts_with("postgres") => {
            let schema = Schema::create(base, "bench").await?;
            (schema.url(), "postgres", Some(schema))
        }
        Some(other) => {
            return Err(format!(
                "--database-url: expected postgres://..., got {other}"
            ));
        }
        None => (
            format!("sqlite://{}", dir.0.join("approvals.db").display()),
            "sqlite",
            None,
        ),
    };
    let mut broker_args = args.broker_arg.clone();
    // Scale mode stores all its pending calls as one agent (auth is off): let it, unless told.
    if args.scale
        && !broker_args
            .iter()
            .any(|a| a.starts_with("--max-pending-per-agent"))
    {
        let pending = args.scale_pending + 2 * scale::PROBE_CALLS as u64;
        broker_args.push(format!("--max-pending-per-agent={pending}"));
    }
    // `--webhooks` receivers listen on loopback, which delivery refuses unless allowed.
    if args.webhooks > 0
        && !broker_args
            .iter()
            .any(|a| a.starts_with("--webhook-allow-hosts"))
    {
        broker_args.push("--webhook-allow-hosts=127.0.0.1".into());
    }
    let broker = Launch::new(broker::binary()?, &url)
        .log(dir.0.join("broker.log"))
        .args(&broker_args)
        .start()
        .await?;
    let mut replicas = Vec::new();
    for i in 1..args.replicas {
        replicas.push(
            Launch::new(broker::binary()?, &url)
                .log(dir.0.join(format!("broker-{i}.log")))
                .args(&broker_args)
                .start()
                .await?,
        );
    }
    Ok(Setup {
        address: broker.address(),
        backend,
        broker: Some(broker),
        replicas,
        schema,
        dir,
    })
}

/// What one measured run says: whether its counting held, and its rate and CPU per cycle.
struct Measured {
    ok: bool,
    cycles_per_sec: f64,
    cpu_per_cycle_us: Option<f64>,
}

/// `--webhooks N`: the same broker measured with no endpoint, then with N.
async fn with_and_without_webhooks(
    args: &Args,
    setup: &Setup,
    duration: Duration,
    warmup: Duration,
    storage_duration: Duration,
    drain: Duration,
) -> Result<bool, String> {
    use approval_broker::proto::v1::{
        CreateWebhookRequest, WebhookFormat, admin_service_client::AdminServiceClient,
    };
    let without_args = Args {
        json: None,
        ..args.clone()
    };
    println!("--- without webhook endpoints ---");
    let without = measure(
        &without_args,
        setup,
        duration,
        warmup,
        Duration::ZERO,
        drain,
    )
    .await?;
    let mut sinks = Vec::new();
    let channel = load::channels(&setup.address, 1).await?.remove(0);
    let mut admin = AdminServiceClient::new(channel);
    for i in 0..args.webhooks {
        let sink = sinks::Sink::start().await?;
        let format = if i + 1 == args.webhooks && args.webhooks > 1 {
            WebhookFormat::Slack
        } else {
            WebhookFormat::Cloudevents
        };
        admin
            .create_webhook(CreateWebhookRequest {
                id: format!("bench-{i}"),
                url: sink.url.clone(),
                format: format as i32,
                ..CreateWebhookRequest::default()
            })
            .await
            .map_err(|status| format!("CreateWebhook: {status}"))?;
        sinks.push(sink);
    }
    println!("\n--- with {} webhook endpoints ---", args.webhooks);
    let with = measure(args, setup, duration, warmup, storage_duration, drain).await?;
    let received: u64 = sinks.iter().map(sinks::Sink::received).sum();
    let cpu = |m: &Measured| {
        m.cpu_per_cycle_us
            .map(|us| format!(", broker CPU {us:.0} µs per cycle"))
            .unwrap_or_default()
    };
    println!();
    println!(
        "webhooks: no endpoints {:.1} cycles/s{}; {} endpoints {:.1} cycles/s{} ({:.2}x); \
         {received} requests received",
        without.cycles_per_sec,
        cpu(&without),
        args.webhooks,
        with.cycles_per_sec,
        cpu(&with),
        with.cycles_per_sec / without.cycles_per_sec,
    );
    Ok(without.ok && with.ok)
}

async fn measure(
    args: &Args,
    setup: &Setup,
    duration: Duration,
    warmup: Duration,
    storage_duration: Duration,
    drain: Duration,
) -> Result<Measured, String> {
    // One replica's CPU is not the broker's: with several, none is reported.
    let broker_pid = setup
        .broker
        .as_ref()
        .filter(|_| setup.replicas.is_empty())
        .and_then(|b| b.pid());
    let pid = broker_pid.map(|pid| pid.to_string());
    // Calls approved at submit need no approver.
    let approvers = if args.auto_approve.is_some() {
        0
    } else {
        args.approvers
    };
    let addresses: Vec<String> = std::iter::once(setup.address.clone())
        .chain(setup.replicas.iter().map(BrokerProcess::address))
        .collect();
    let agent_channels = load::channels_across(&addresses, args.agents).await?;
    let watcher_channels = load::channels_across(&addresses, args.subscribers + approvers).await?;
    if args.auto_approve == Some(AutoApprove::Rule) {
        allow_the_bench_tool(agent_channels[0].clone()).await?;
    }

    let started = Instant::now();
    let config = Arc::new(LoadConfig {
        batch_size: args.batch_size,
        approver_concurrency: args.approver_concurrency,
        rate: args.rate,
        input_bytes: args.input_bytes,
        run_id: format!("bench-{}", uuid::Uuid::new_v4().simple()),
        measure_start: started + warmup,
        measure_end: started + warmup + duration,
        patience: drain,
        auto: args.auto_approve,
    });
    let shared = Arc::new(Shared::new(args.subscribers));

    // Watchers first, so they see every call from the first one.
    let mut watchers = Vec::new();
    for (i, channel) in watcher_channels.into_iter().enumerate() {
        let i = i as u32;
        let (subscriber, approver) = if i < args.subscribers {
            (Some(i as usize), None)
        } else {
            (None, Some((i - args.subscribers, approvers)))
        };
        watchers.push(tokio::spawn(load::watcher(
            config.clone(),
            shared.clone(),
            subscriber,
            approver,
            channel,
        )));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The clock starts with the agents.
    let started = Instant::now();
    let config = Arc::new(LoadConfig {
        run_id: config.run_id.clone(),
        measure_start: started + warmup,
        measure_end: started + warmup + duration,
        ..*config
    });
    let mut agents = Vec::new();
    for (i, channel) in agent_channels.into_iter().enumerate() {
        agents.push(tokio::spawn(load::agent(
            config.clone(),
            shared.clone(),
            i as u32,
            channel,
        )));
    }

    if let Some(schema) = &setup.schema {
        // Postgres keeps the plans of a connection's statements, and the first were made while
        // the tables were empty: a sequential scan of the events for every call read, which
        // autovacuum's statistics replace within a minute of any deployment's start. Halfway
        // through the warm-up the statistics are gathered, as they are then; the window
        // measures the broker as it runs from then on.
        tokio::time::sleep_until((started + warmup / 2).into()).await;
        schema.analyze().await?;
    }
    tokio::time::sleep_until(config.measure_start.into()).await;
    let broker_cpu = broker_pid.map(broker::ProcessCpu::of);
    let threads_start = pid.as_deref().and_then(broker::cpu_by_thread);
    let own_cpu = broker::ProcessCpu::this_process();
    // Postgres's processes, where it runs on this machine (it shares the cores with the rest).
    let database =
        (setup.backend == "postgres").then(|| broker::ProcessCpu::start(broker::DATABASE_PROCESS));
    tokio::time::sleep_until(config.measure_end.into()).await;
    let database_cpu = database.and_then(|database| database.used());
    let broker_cpu = broker_cpu.and_then(|cpu| cpu.used());
    let threads_end = pid.as_deref().and_then(broker::cpu_by_thread);
    let cpu_by_thread = threads_end.zip(threads_start).map(|(end, start)| {
        end.into_iter()
            .map(|(kind, seconds)| (kind, seconds - start.get(kind).copied().unwrap_or(0.0)))
            .collect()
    });
    let bench_cpu = own_cpu.used();
    let cpu_total = pid.as_deref().and_then(broker::cpu_seconds);

    let mut records: Vec<CallRecord> = Vec::new();
    for agent in agents {
        records.extend(agent.await.map_err(|e| format!("agent task: {e}"))?);
    }
    let drained_after = config.measure_end.elapsed();
    // Every outcome is in (or an agent gave up): let the last subscriber events arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for watcher in &watchers {
        watcher.abort();
    }
    let peak_rss_kib = pid.as_deref().and_then(broker::peak_rss_kib);

    let report = Report::compute(
        args,
        approvers,
        cpu_by_thread,
        setup,
        &config,
        &shared,
        &records,
        duration,
        broker_cpu,
        cpu_total,
        bench_cpu,
        database_cpu,
        peak_rss_kib,
        drained_after,
    );

    // The raw storage limit, after the broker's run so the two do not compete for the disk, and
    // after the system wrote back what the broker left dirty in the page cache (else the raw
    // writes' syncs would queue behind it).
    let input = load::tool_input(0, 0, args.input_bytes);
    if !storage_duration.is_zero() {
        let _ = tokio::task::spawn_blocking(|| std::process::Command::new("sync").status()).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let concurrency = args.agents;
    // The raw loop writes receipts exactly when the broker does (on by default).
    let receipt = if receipts_off(&args.broker_arg) {
        None
    } else {
        Some(storage::RawReceipt::like_the_brokers(&input)?)
    };
    let raw = if storage_duration.is_zero() {
        None
    } else {
        match (setup.backend, &args.database_url) {
            ("sqlite", _) => {
                Some(storage::sqlite(&setup.dir.0, storage_duration, &input, receipt).await?)
            }
            (_, Some(base)) if base.starts_with("postgres") => {
                let schema = Schema::create(base, "bench_raw").await?;
                let connections = concurrency.min(32);
                let rates = storage::postgres(
                    &schema.url(),
                    concurrency,
                    connections,
                    storage_duration,
                    &input,
                    receipt,
                )
                .await;
                schema.drop_now().await;
                Some(rates?)
            }
            _ => None,
        }
    };

    report.print(raw.as_ref());
    let measured = Measured {
        ok: true,
        cycles_per_sec: report.cycles_per_sec,
        cpu_per_cycle_us: report.per_cycle_us(report.broker_cpu),
    };
    if let Some(path) = &args.json {
        let json = report.json(raw.as_ref());
        std::fs::write(path, serde_json::to_string_pretty(&json).unwrap() + "\n")
            .map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    if args.check {
        let problems = report.accounting_problems();
        if problems.is_empty() {
            println!("check: every submitted call accounted for");
        } else {
            for p in &problems {
                eprintln!("check FAILED: {p}");
            }
            if let Some(broker) = &setup.broker {
                let log = broker.log_text();
                let lines: Vec<&str> = log.lines().collect();
                eprintln!(
                    "the broker's log ends:\n{}",
                    lines[lines.len().saturating_sub(20)..].join("\n")
                );
            }
            return Ok(Measured {
                ok: false,
                ..measured
            });
        }
    }
    Ok(measured)
}

struct Report {
    backend: &'static str,
    agents: u32,
    batch_size: u32,
    subscribers: u32,
    approvers: u32,
    rate: Option<f64>,
    input_bytes: usize,
    duration: Duration,
    submitted: u64,
    acked: u64,
    outcomes: u64,
    approved: u64,
    seen: u64,
    shown: Vec<u64>,
    decided: u64,
    decide_ok: u64,
    decide_errors: u64,
    agent_errors: u64,
    resubscribes: u64,
    first_error: Option<String>,
    cycles_in_window: u64,
    cycles_per_sec: f64,
    submit_ack: Percentiles,
    submit_seen: Percentiles,
    decide_outcome: Percentiles,
    full_cycle: Percentiles,
    broker_cpu: Option<f64>,
    /// The broker's CPU seconds in the window by thread kind (see `broker::cpu_by_thread`).
    broker_cpu_by_thread: Option<BTreeMap<&'static str, f64>>,
    broker_cpu_total: Option<f64>,
    bench_cpu: Option<f64>,
    /// The CPU seconds of every `postgres` process on this machine in the window (`None`: on
    /// SQLite, or Postgres runs elsewhere).
    database_cpu: Option<f64>,
    peak_rss_kib: Option<u64>,
    drained_after: Duration,
    auto: Option<AutoApprove>,
    replicas: u32,
    /// Webhook endpoints run in this process (`--webhooks`) and receive in the window.
    webhook_sinks: bool,
}

impl Report {
    /// Postgres's CPU per cycle measured in the window, in microseconds.
    fn database_cpu_per_cycle_us(&self) -> Option<f64> {
        self.per_cycle_us(self.database_cpu)
    }

    /// The load generator's (this process's) CPU per cycle measured in the window, in
    /// microseconds: the agents', subscribers' and approvers' side of every cycle. None while
    /// this process also receives webhooks: its CPU is then not the load generator's alone.
    fn load_generator_cpu_per_cycle_us(&self) -> Option<f64> {
        self.per_cycle_us(self.bench_cpu.filter(|_| !self.webhook_sinks))
    }

    /// CPU seconds of the window spread over its cycles, in microseconds per cycle.
    fn per_cycle_us(&self, seconds: Option<f64>) -> Option<f64> {
        broker::per_cycle_us(seconds, self.cycles_in_window as f64)
    }

    /// The most cycles/s any broker could reach in this run (see [`Ceiling`]), from the raw
    /// batched loop's CPU per cycle, the receipt's signature's and the load generator's.
    fn ceiling(&self, raw: &storage::StorageRates) -> Option<Ceiling> {
        let cores = std::thread::available_parallelism().ok()?.get();
        Some(Ceiling::of(
            cores,
            raw.batched_cpu_us?,
            raw.signing_cpu_us.unwrap_or(0.0),
            self.load_generator_cpu_per_cycle_us()?,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    fn compute(
        args: &Args,
        approvers: u32,
        broker_cpu_by_thread: Option<BTreeMap<&'static str, f64>>,
        setup: &Setup,
        config: &LoadConfig,
        shared: &Shared,
        records: &[CallRecord],
        duration: Duration,
        broker_cpu: Option<f64>,
        broker_cpu_total: Option<f64>,
        bench_cpu: Option<f64>,
        database_cpu: Option<f64>,
        peak_rss_kib: Option<u64>,
        drained_after: Duration,
    ) -> Report {
        let seen = shared.seen.lock().unwrap();
        let decided = shared.decided.lock().unwrap();
        let in_window = |t: Instant| t >= config.measure_start && t <= config.measure_end;
        let mut submit_ack = Vec::new();
        let mut submit_seen = Vec::new();
        let mut decide_outcome = Vec::new();
        let mut full_cycle = Vec::new();
        let mut cycles_in_window = 0;
        for r in records {
            if r.outcome.is_some_and(in_window) {
                cycles_in_window += 1;
            }
            if !in_window(r.submitted) {
                continue;
            }
            if let Some(acked) = r.acked {
                submit_ack.push(acked.saturating_duration_since(r.submitted));
            }
            if let Some(seen) = seen.get(&r.key) {
                submit_seen.push(seen.saturating_duration_since(r.submitted));
            }
            if let Some(outcome) = r.outcome {
                if let Some(decided) = decided.get(&r.key) {
                    decide_outcome.push(outcome.saturating_duration_since(*decided));
                }
                full_cycle.push(outcome.saturating_duration_since(r.submitted));
            }
        }
        Report {
            backend: setup.backend,
            agents: args.agents,
            batch_size: args.batch_size,
            subscribers: args.subscribers,
            approvers,
            rate: args.rate,
            input_bytes: args.input_bytes,
            duration,
            submitted: records.len() as u64,
            acked: records.iter().filter(|r| r.acked.is_some()).count() as u64,
            outcomes: records.iter().filter(|r| r.outcome.is_some()).count() as u64,
            approved: records.iter().filter(|r| r.approved).count() as u64,
            seen: records.iter().filter(|r| seen.contains_key(&r.key)).count() as u64,
            shown: shared
                .shown
                .iter()
                .map(|n| n.load(Ordering::Relaxed))
                .collect(),
            decided: records
                .iter()
                .filter(|r| decided.contains_key(&r.key))
                .count() as u64,
            decide_ok: shared.decide_ok.load(Ordering::Relaxed),
            decide_errors: shared.decide_errors.load(Ordering::Relaxed),
            agent_errors: shared.agent_errors.load(Ordering::Relaxed),
            resubscribes: shared.resubscribes.load(Ordering::Relaxed),
            first_error: shared.first_error.lock().unwrap().clone(),
            cycles_in_window,
            cycles_per_sec: cycles_in_window as f64 / duration.as_secs_f64(),
            submit_ack: Percentiles::of(&mut submit_ack),
            submit_seen: Percentiles::of(&mut submit_seen),
            decide_outcome: Percentiles::of(&mut decide_outcome),
            full_cycle: Percentiles::of(&mut full_cycle),
            broker_cpu,
            broker_cpu_by_thread,
            broker_cpu_total,
            bench_cpu,
            database_cpu,
            peak_rss_kib,
            drained_after,
            auto: args.auto_approve,
            replicas: args.replicas,
            webhook_sinks: args.webhooks > 0,
        }
    }

    /// What `--check` verifies: every submitted call acknowledged, shown to every subscriber,
    /// decided once, and its (approved) outcome received by its agent.
    fn accounting_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let n = self.submitted;
        if n == 0 {
            problems.push("no call was submitted".into());
        }
        let mut expect = |what: &str, got: u64| {
            if got != n {
                problems.push(format!("{n} calls submitted but {got} {what}"));
            }
        };
        expect("acknowledged", self.acked);
        expect("with an outcome at their agent", self.outcomes);
        expect("approved", self.approved);
        if self.auto.is_none() {
            expect("decided", self.decided);
            expect("decisions answered OK", self.decide_ok);
        }
        if self.subscribers > 0 {
            expect("seen by a subscriber", self.seen);
            for (i, shown) in self.shown.iter().enumerate() {
                expect(&format!("shown to subscriber {i}"), *shown);
            }
        }
        if self.decide_errors + self.agent_errors > 0 {
            problems.push(format!(
                "{} decide errors, {} agent errors; first: {}",
                self.decide_errors,
                self.agent_errors,
                self.first_error.as_deref().unwrap_or("-")
            ));
        }
        problems
    }

    fn print(&self, raw: Option<&storage::StorageRates>) {
        println!(
            "approval-bench: {} broker{}, {} agents x batches of {}, {} subscriber(s), {} approver(s), \
             {} B inputs, {:.1} s measured{}",
            self.backend,
            if self.replicas > 1 {
                format!(
                    " x {} replicas (agents and watchers spread over them)",
                    self.replicas
                )
            } else {
                String::new()
            },
            self.agents,
            self.batch_size,
            self.subscribers,
            self.approvers,
            self.input_bytes,
            self.duration.as_secs_f64(),
            self.rate
                .map(|r| format!(", submit rate capped at {r} calls/s"))
                .unwrap_or_default()
        );
        println!();
        match self.auto {
            None => println!(
                "full approval cycles/s            {:>12.1}  ({} cycles in the window)",
                self.cycles_per_sec, self.cycles_in_window
            ),
            Some(auto) => println!(
                "auto-approved calls/s             {:>12.1}  ({} calls in the window, approved at \
                 submit by {}; full cycle = submit -> outcome at the agent)",
                self.cycles_per_sec,
                self.cycles_in_window,
                auto.name()
            ),
        }
        println!();
        println!(
            "{:<32} {:>8} {:>10} {:>10} {:>10} {:>10}",
            "latency (ms)", "n", "p50", "p90", "p99", "max"
        );
        for (name, p) in [
            ("submit -> ack", &self.submit_ack),
            ("submit -> seen (first subscriber)", &self.submit_seen),
            ("decide -> outcome at agent", &self.decide_outcome),
            ("full cycle", &self.full_cycle),
        ] {
            println!(
                "{:<32} {:>8} {:>10} {:>10} {:>10} {:>10}",
                name,
                p.count,
                ms(p.p50),
                ms(p.p90),
                ms(p.p99),
                ms(p.max)
            );
        }
        println!();
        let opt =
            |v: Option<f64>, unit: &str| v.map_or("-".to_string(), |v| format!("{v:.2}{unit}"));
        println!(
            "broker CPU in the window          {:>12}  ({} of a core, {} per cycle; {} over the whole run)",
            opt(self.broker_cpu, " s"),
            self.broker_cpu.map_or("-".into(), |c| format!(
                "{:.0}%",
                100.0 * c / self.duration.as_secs_f64()
            )),
            self.per_cycle_us(self.broker_cpu)
                .map_or("-".into(), |us| format!("{us:.0} us")),
            opt(self.broker_cpu_total, " s"),
        );
        if let Some(threads) = &self.broker_cpu_by_thread {
            let per_cycle = |seconds: f64| {
                self.per_cycle_us(Some(seconds))
                    .map_or("-".into(), |us| format!("{us:.0} us"))
            };
            let split: Vec<String> = threads
                .iter()
                .map(|(kind, seconds)| format!("{kind} {}", per_cycle(*seconds)))
                .collect();
            println!("  per cycle by thread             {}", split.join(", "));
        }
        println!(
            "bench CPU in the window           {:>12}  (same 2 cores: the load generator competes)",
            opt(self.bench_cpu, " s")
        );
        if self.backend == "postgres" {
            println!(
                "Postgres CPU in the window        {:>12}  ({} per cycle; every `postgres` process of this machine)",
                self.database_cpu
                    .map_or("- (not on this machine)".into(), |c| format!("{c:.2} s")),
                self.database_cpu_per_cycle_us()
                    .map_or("-".into(), |us| format!("{us:.0} us")),
            );
        }
        println!(
            "broker peak RSS                   {:>12}",
            self.peak_rss_kib
                .map_or("-".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
        );
        println!();
        println!(
            "accounting: submitted {} acked {} seen {} decided {} outcomes {} (approved {}); \
             decide errors {}, agent errors {}, resubscribes {}; drained {:.2} s after the window",
            self.submitted,
            self.acked,
            self.seen,
            self.decided,
            self.outcomes,
            self.approved,
            self.decide_errors,
            self.agent_errors,
            self.resubscribes,
            self.drained_after.as_secs_f64()
        );
        if let Some(e) = &self.first_error {
            println!("first error: {e}");
        }
        if let Some(raw) = raw {
            println!();
            println!(
                "raw storage limit ({}, {}, {} tasks on {} connection(s)):",
                self.backend, raw.driver, raw.concurrency, raw.connections
            );
            println!(
                "  one transaction per write       {:>12.1} cycles/s   broker / raw = {:.2}",
                raw.per_write,
                self.cycles_per_sec / raw.per_write
            );
            println!(
                "  {} cycles per transaction      {:>12.1} cycles/s   broker / raw = {:.3}  ({} task(s))",
                raw.group,
                raw.batched,
                self.cycles_per_sec / raw.batched,
                raw.batch_tasks
            );
            if let Some(ceiling) = self.ceiling(raw) {
                // Receipts off: no signature to count.
                let signature = match raw.signing_cpu_us {
                    Some(_) => format!(", a signature's {:.0} us", ceiling.signing_us),
                    None => String::new(),
                };
                println!(
                    "  no broker could pass            {:>12.1} cycles/s   = {:.3} of raw batched",
                    ceiling.cycles_per_s,
                    ceiling.cycles_per_s / raw.batched,
                );
                println!(
                    "    ({} cores filled by a batched raw cycle's {:.0} us of CPU{signature} and \
                     the load generator's {:.0} us, with no gRPC server)",
                    ceiling.cores, ceiling.storage_us, ceiling.load_us,
                );
            }
            if let (Some(per_write), Some(batched)) =
                (raw.per_write_database_cpu_us, raw.batched_database_cpu_us)
            {
                println!(
                    "  Postgres CPU per cycle          {per_write:.0} us per write, {batched:.0} us batched (the broker's: {})",
                    self.database_cpu_per_cycle_us()
                        .map_or("-".into(), |us| format!("{us:.0} us"))
                );
            }
        }
    }

    fn json(&self, raw: Option<&storage::StorageRates>) -> serde_json::Value {
        let ceiling = raw.and_then(|raw| self.ceiling(raw));
        serde_json::json!({
            "backend": self.backend,
            "agents": self.agents,
            "batch_size": self.batch_size,
            "subscribers": self.subscribers,
            "approvers": self.approvers,
            "rate_cap": self.rate,
            "input_bytes": self.input_bytes,
            "duration_s": self.duration.as_secs_f64(),
            "cycles_per_s": self.cycles_per_sec,
            "cycles_in_window": self.cycles_in_window,
            "latency": {
                "submit_ack": self.submit_ack.json(),
                "submit_seen": self.submit_seen.json(),
                "decide_outcome": self.decide_outcome.json(),
                "full_cycle": self.full_cycle.json(),
            },
            "auto_approve": self.auto.map(AutoApprove::name),
            "replicas": self.replicas,
            "broker_cpu_s": self.broker_cpu,
            "broker_cpu_by_thread_s": self.broker_cpu_by_thread,
            "broker_cpu_per_cycle_by_thread_us": self.broker_cpu_by_thread.as_ref().map(|threads| {
                threads
                    .iter()
                    .map(|(kind, seconds)| (*kind, self.per_cycle_us(Some(*seconds)).unwrap_or(0.0)))
                    .collect::<BTreeMap<_, _>>()
            }),
            "broker_cpu_total_s": self.broker_cpu_total,
            "bench_cpu_s": self.bench_cpu,
            "load_generator_cpu_per_cycle_us": self.load_generator_cpu_per_cycle_us(),
            "database_cpu_s": self.database_cpu,
            "database_cpu_per_cycle_us": self.database_cpu_per_cycle_us(),
            "clock_ticks_assumed": broker::CLOCK_TICKS,
            "broker_peak_rss_kib": self.peak_rss_kib,
            "accounting": {
                "submitted": self.submitted,
                "acked": self.acked,
                "seen": self.seen,
                "shown_per_subscriber": self.shown,
                "decided": self.decided,
                "decide_ok": self.decide_ok,
                "outcomes": self.outcomes,
                "approved": self.approved,
                "decide_errors": self.decide_errors,
                "agent_errors": self.agent_errors,
                "resubscribes": self.resubscribes,
                "first_error": self.first_error,
            },
            "raw_storage": raw.map(|raw| serde_json::json!({
                "concurrency": raw.concurrency,
                "connections": raw.connections,
                "per_write_cycles_per_s": raw.per_write,
                "batched_cycles_per_s": raw.batched,
                "batch_cycles_per_transaction": raw.group,
                "batch_tasks": raw.batch_tasks,
                "broker_ratio_to_per_write": self.cycles_per_sec / raw.per_write,
                "broker_ratio_to_batched": self.cycles_per_sec / raw.batched,
                "per_write_database_cpu_per_cycle_us": raw.per_write_database_cpu_us,
                "batched_database_cpu_per_cycle_us": raw.batched_database_cpu_us,
                "per_write_cpu_per_cycle_us": raw.per_write_cpu_us,
                "batched_cpu_per_cycle_us": raw.batched_cpu_us,
                "signing_cpu_per_receipt_us": raw.signing_cpu_us,
                "ceiling_cycles_per_s": ceiling.map(|c| c.cycles_per_s),
                "ceiling_ratio_to_batched": ceiling.map(|c| c.cycles_per_s / raw.batched),
            })),
        })
    }
}

/// The most cycles/s any broker could reach on a machine's cores, sharing them with its load
/// generator as here: the cores filled by what every cycle costs whatever the broker's design,
/// its storage work (the raw batched loop's CPU per cycle: the same rows, a group to a
/// transaction, through a client) and its receipt's signature (with receipts on), and by the
/// load generator's side of the cycle (the agents', subscribers' and approvers'), with no gRPC
/// server at all. A broker measured beside this load generator stays below it; a goal above it
/// cannot be shown met on the machine. The load generator's cost is the one measured at the
/// broker's rate, on cores it shares: a cheaper client, or one on other cores, moves the figure.
#[derive(Debug, Clone, Copy)]
struct Ceiling {
    cores: usize,
    storage_us: f64,
    signing_us: f64,
    load_us: f64,
    cycles_per_s: f64,
}

impl Ceiling {
    fn of(cores: usize, storage_us: f64, signing_us: f64, load_us: f64) -> Self {
        Self {
            cores,
            storage_us,
            signing_us,
            load_us,
            cycles_per_s: cores as f64 * 1e6 / (storage_us + signing_us + load_us),
        }
    }
}

/// Under `--auto-approve rule`: a policy rule allowing the bench's tool, so every call is
/// approved at submit (the broker runs without auth, so any client may administer it).
async fn allow_the_bench_tool(channel: tonic::transport::Channel) -> Result<(), String> {
    use approval_broker::proto::v1::{
        CreateRuleRequest, Effect, Rule, admin_service_client::AdminServiceClient,
    };
    AdminServiceClient::new(channel)
        .create_rule(CreateRuleRequest {
            rule: Some(Rule {
                id: "bench-allow-edit-file".into(),
                tool: "edit_file".into(),
                effect: Effect::Allow as i32,
                description: "approval-bench --auto-approve rule".into(),
                ..Rule::default()
            }),
        })
        .await
        // A second measured run on the same broker (`--webhooks`) finds it there.
        .or_else(|status| match status.code() {
            tonic::Code::AlreadyExists => Ok(tonic::Response::new(Rule::default())),
            _ => Err(format!("CreateRule: {status}")),
        })?;
    Ok(())
}

/// Whether the broker was told not to sign receipts (`--broker-arg=--receipts=off`).
fn receipts_off(broker_args: &[String]) -> bool {
    broker_args
        .iter()
        .zip(broker_args.iter().skip(1).map(Some).chain([None]))
        .any(|(arg, next)| {
            arg == "--receipts=off" || (arg == "--receipts" && next.is_some_and(|n| n == "off"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_is_the_cores_filled_by_the_storage_the_signature_and_the_load_generator() {
        // 2 cores, 30 us of storage, 10 of signing and 60 of load generator per cycle: 100 us a
        // cycle, two at once.
        assert_eq!(Ceiling::of(2, 30.0, 10.0, 60.0).cycles_per_s, 20_000.0);
        assert_eq!(Ceiling::of(1, 100.0, 0.0, 0.0).cycles_per_s, 10_000.0);
    }
}
