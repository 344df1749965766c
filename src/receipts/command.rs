//! `approval-broker verify`: checks receipts offline, with nothing but the broker's public key:
//! one receipt, or a chain in order. It prints what it verified, or exits non-zero with a
//! message naming the receipt and what failed.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::{PublicKey, verify};

/// See [`run`].
#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    /// The public key: a file holding it, or the key itself, either as the broker prints and
    /// serves it (base64 of the 32 raw bytes) or as a `PUBLIC KEY` PEM.
    #[arg(long)]
    pub key: String,

    /// The receipts: one (a DSSE envelope, or GetReceipt's reply as grpcurl prints it) or a
    /// chain in order (ExportReceipts' reply, or JSON Lines of either). `-` or nothing: standard
    /// input.
    pub file: Option<PathBuf>,
}

/// Verifies what `args` name; prints a summary, or why not.
pub fn run(args: &VerifyArgs) -> ExitCode {
    match verify_named(args) {
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
    let key_text = match std::fs::read_to_string(&args.key) {
        Ok(text) => text,
        Err(_) => args.key.clone(),
    };
    let key = PublicKey::parse(&key_text).map_err(|e| e.to_string())?;
    let text = match args.file.as_deref() {
        None => read_stdin()?,
        Some(path) if path.as_os_str() == "-" => read_stdin()?,
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
    };
    let envelopes = verify::envelopes_in(&text)?;
    let summary = verify::chain(envelopes.iter().map(String::as_str), &key)?;
    Ok(if summary.receipts == 1 {
        format!(
            "verified: receipt {} with key {}",
            summary.first,
            key.key_id()
        )
    } else {
        format!(
            "verified: {} receipts, sequence {} to {}, in order and unbroken, with key {}",
            summary.receipts,
            summary.first,
            summary.last,
            key.key_id()
        )
    })
}

fn read_stdin() -> Result<String, String> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read standard input: {e}"))?;
    Ok(text)
}
