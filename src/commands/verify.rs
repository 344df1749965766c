//! `approval-broker verify`: checks receipts offline, with nothing but the broker's public keys:
//! one receipt, a chain in order, or (`--database`) the chain a database holds together with
//! every call's stored state. It prints what it verified, or exits non-zero with a message
//! naming the receipt, or each call, and what failed.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::verify_database;
use crate::receipts::trust::KeySet;
use crate::receipts::verify::{self, ChainSummary};
use crate::store::{Database, StoreSettings};

/// See [`run`].
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// A public key receipts verify with: a file holding one key or several, or the key itself,
    /// as the broker prints and serves it (base64 of the 32 raw bytes) or as a `PUBLIC KEY` PEM.
    /// Repeat it (or list several in one file) for a chain signed across key rotations: each
    /// receipt is checked with the key it names. In a file, a base64 key may be followed by
    /// `from=<RFC 3339>` and `until=<RFC 3339>`: receipts decided outside that window fail.
    #[arg(long = "key", required = true)]
    pub keys: Vec<String>,

    /// Read the chain from a database instead of a file, and compare every call's stored state
    /// (outcome, who decided, the input that runs, ...) with its receipt, naming each call that
    /// differs. The database is `--database URL`, or `--database-url` / `DATABASE_URL` when no
    /// URL follows. Read only: safe while the broker runs.
    #[arg(long, num_args = 0..=1, default_missing_value = "", conflicts_with = "file")]
    pub database: Option<String>,

    /// With `--database`: a decided call with no receipt (decided while receipts were off, or
    /// before the broker signed receipts) is counted, not a failure.
    #[arg(long, requires = "database")]
    pub allow_unreceipted: bool,

    /// The receipts: one (a DSSE envelope, or GetReceipt's reply as grpcurl prints it) or a
    /// chain in order (ExportReceipts' reply, or JSON Lines of either). `-` or nothing: standard
    /// input.
    pub file: Option<PathBuf>,
}

/// Verifies what `args` name (`store`: the database settings `--database` falls back on);
/// prints a summary, or why not.
pub async fn run(args: &VerifyArgs, store: &StoreSettings) -> ExitCode {
    let outcome = match &args.database {
        Some(url) => verify_database(args, url, store).await,
        None => verify_named(args),
    };
    match outcome {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(why) => {
            eprintln!("verification FAILED: {why}");
            ExitCode::FAILURE
        }
    }
}

fn verify_named(args: &VerifyArgs) -> Result<String, String> {
    let keys = KeySet::from_values(&args.keys).map_err(|e| e.to_string())?;
    let text = match args.file.as_deref() {
        None => read_stdin()?,
        Some(path) if path.as_os_str() == "-" => read_stdin()?,
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
    };
    let envelopes = verify::envelopes_in(&text)?;
    let summary = verify::chain(envelopes.iter().map(String::as_str), &keys)?;
    Ok(describe(&summary))
}

async fn verify_database(
    args: &VerifyArgs,
    url: &str,
    store: &StoreSettings,
) -> Result<String, String> {
    let keys = KeySet::from_values(&args.keys).map_err(|e| e.to_string())?;
    let database = match url {
        "" => store.database(),
        url => Database::parse(
            url,
            store.sqlite_synchronous,
            store.database_max_connections,
        ),
    }
    .map_err(|e| e.to_string())?;
    let report = verify_database::check(&database, &keys, args.allow_unreceipted).await?;
    let chain = match &report.chain {
        Some(summary) => describe(summary),
        None => "no receipt in the database".into(),
    };
    let unreceipted = match report.unreceipted {
        0 => String::new(),
        n => format!(" ({n} decided without a receipt)"),
    };
    if !report.mismatches.is_empty() {
        return Err(format!(
            "{} of {} calls differ from their receipts:\n  {}\n({chain})",
            report.mismatches.len(),
            report.calls,
            report.mismatches.join("\n  ")
        ));
    }
    Ok(format!(
        "{chain}\nand every call's stored state is what its receipt says: {} calls, {} decided \
         compared{unreceipted}",
        report.calls, report.compared
    ))
}

/// What a verified chain covers and the keys that signed it.
fn describe(summary: &ChainSummary) -> String {
    let keys = match summary.keys.as_slice() {
        [one] => format!("with key {}", one.key_id),
        several => format!(
            "with keys {}",
            several
                .iter()
                .map(|k| match k.receipts {
                    1 => format!("{} (receipt {})", k.key_id, k.first),
                    n => format!("{} ({n} receipts, {} to {})", k.key_id, k.first, k.last),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let passkeys = match summary.passkey_approvals {
        0 => String::new(),
        1 => ", and its 1 passkey-signed approval".to_owned(),
        n => format!(", and their {n} passkey-signed approvals"),
    };
    if summary.receipts == 1 {
        format!("verified: receipt {} {keys}{passkeys}", summary.first)
    } else {
        format!(
            "verified: {} receipts, sequence {} to {}, in order and unbroken, {keys}{passkeys}",
            summary.receipts, summary.first, summary.last
        )
    }
}

fn read_stdin() -> Result<String, String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read standard input: {e}"))?;
    Ok(text)
}
