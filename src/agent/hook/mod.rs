//! `approval-broker hook ...`: commands an agent host runs as its own approval hook, so its tool
//! calls go through the broker with no code on the host's side. One shared core
//! ([`host_call`]: the host-neutral call, the review through the broker ([`review`]) with the
//! signed-receipt check ([`receipt_check`]), the host-neutral answer) and one small file per
//! host that only reads the host's hook input and writes its answer. A hook must fail closed: no
//! failure, timeout or malformed input ever answers "allow".

pub mod claude_code;
pub mod codex;
pub mod copilot;
pub mod cursor;
pub mod gemini_cli;
pub mod host_call;
pub mod receipt_check;
pub mod review;

use std::process::ExitCode;

use host_call::HookArgs;

/// The hook adapters, one per agent host. Each reads the hook input on standard input, has the
/// broker review the tool call, and prints the host's answer.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum HookCommand {
    /// Claude Code's `PreToolUse` and `PermissionRequest` hooks.
    ClaudeCode(HookArgs),
    /// Codex's `PreToolUse` (deny, or allow an approver's edit) and `PermissionRequest` hooks.
    Codex(HookArgs),
    /// Gemini CLI's `BeforeTool` hook.
    GeminiCli(HookArgs),
    /// GitHub Copilot CLI's `preToolUse` / `PreToolUse` and `permissionRequest` hooks.
    Copilot(HookArgs),
    /// Cursor's `preToolUse`, `beforeShellExecution`, `beforeMCPExecution` and `beforeReadFile`
    /// hooks.
    Cursor(HookArgs),
}

/// Runs the hook. Standard output carries the host's answer and nothing else.
pub async fn run(command: &HookCommand) -> ExitCode {
    match command {
        HookCommand::ClaudeCode(args) => host_call::run::<claude_code::ClaudeCode>(args).await,
        HookCommand::Codex(args) => host_call::run::<codex::Codex>(args).await,
        HookCommand::GeminiCli(args) => host_call::run::<gemini_cli::GeminiCli>(args).await,
        HookCommand::Copilot(args) => host_call::run::<copilot::Copilot>(args).await,
        HookCommand::Cursor(args) => host_call::run::<cursor::Cursor>(args).await,
    }
}
