//! `approval-broker hook ...`: commands an agent host runs as its own approval hook, so its tool
//! calls go through the broker with no code on the host's side. Each adapter reads the host's
//! hook input, reviews the call through the broker ([`review`]), and answers in the host's
//! format. A hook must fail closed: no failure, timeout or malformed input ever answers "allow".

pub mod claude_code;
pub mod receipt_check;
pub mod review;

use std::process::ExitCode;

/// The hook adapters, one per agent host.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum HookCommand {
    /// Claude Code's `PreToolUse` and `PermissionRequest` hooks: reads the hook input on
    /// standard input, has the broker review the tool call, prints the hook's decision JSON.
    ClaudeCode(claude_code::ClaudeCodeArgs),
}

/// Runs the hook. Standard output carries the host's answer and nothing else.
pub async fn run(command: &HookCommand) -> ExitCode {
    match command {
        HookCommand::ClaudeCode(args) => claude_code::run(args).await,
    }
}
