// What a pending card shows first: what would run. The title and message are the agent's claim;
// the input is the fact, so every card shows it, above the title: for a shell-like tool the
// command itself (monospaced, as it would run), for any other tool the canonical JSON, long
// values folded with their length said. Invisible characters are badged where they stand. A
// folded input must be unfolded before it is approved: `folded()` says whether anything is
// still out of sight, `unfold()` shows it all.
//
// Calls from the MCP gateway (src/agent/mcp/approval.rs) carry the server's tool hints in the input
// (`_mcp_hints`) and name the server and tool in the message; they are shown as flags and
// fields, labelled as what the server declares (nobody checks them).
import { h } from "./dom";
import type { Call } from "./gen/approvals/v1/types_pb";
import { foldable, revealed, valueView } from "./json";

/** A command longer than this (in characters) is folded. */
const FOLD_COMMAND_AT = 400;

/** Tools that run their input as a command line: Claude Code's `Bash`, `shell`, `run_shell`,
 * `execute_command`, `terminal`... */
const SHELL_TOOL = /bash|shell|zsh|terminal|command|exec|^sh$|^cmd$|^run$/i;
/** Where such a tool's input holds the command. */
const COMMAND_KEYS = ["command", "cmd", "script"];

/** The input key the MCP gateway puts the tool's annotations under (src/agent/mcp/approval.rs). */
const HINTS_KEY = "_mcp_hints";
/** The first sentence of the gateway's message; src/agent/mcp/approval.rs's test
 * `the_message_opens_with_the_sentence_the_inbox_reads_the_server_and_tool_from` checks that
 * both still say the same. */
const MCP_MESSAGE = /^An MCP client asks to run the tool `([^`]*)` of the server `([^`]*)`\./;

export interface InputView {
  el: HTMLElement;
  /** Whether some of the input is still folded away. */
  folded(): boolean;
  unfold(): void;
}

function parsed(json: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(json);
    return value !== null && typeof value === "object" && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** The command a shell-like call would run, and the rest of its input; `undefined` for other
 * calls. */
export function shellCommand(call: Call): { key: string; command: string; rest: Record<string, unknown> } | undefined {
  if (!SHELL_TOOL.test(call.tool)) return undefined;
  const input = parsed(call.inputJson);
  if (!input) return undefined;
  const key = COMMAND_KEYS.find((k) => typeof input[k] === "string");
  if (key === undefined) return undefined;
  const { [key]: command, ...rest } = input;
  return { key, command: command as string, rest };
}

export function inputView(call: Call, label: string): InputView {
  const shell = shellCommand(call);
  let body: Node[];
  if (shell) {
    const command = h("pre", { class: "command", "aria-label": `Command ${label} would run` });
    command.append(foldable(shell.command, FOLD_COMMAND_AT, (text) => h("span", {}, revealed(text))));
    body = [command];
    if (Object.keys(shell.rest).length > 0) {
      body.push(h("p", { class: "meta" }, `and the rest of its input (besides "${shell.key}"):`), valueView(shell.rest));
    }
  } else {
    const input = parsed(call.inputJson);
    const view = input ? valueView(input) : h("pre", { class: "json" }, revealed(call.inputJson));
    view.setAttribute("aria-label", `Input of ${label}`);
    body = [view];
  }
  const el = h("div", { class: "input" }, body);
  const closed = () => [...el.querySelectorAll<HTMLDetailsElement>("details.fold")].filter((d) => !d.open);
  return {
    el,
    folded: () => closed().length > 0,
    unfold: () => {
      for (const fold of closed()) fold.open = true;
    },
  };
}

/** The MCP server and tool, and the hints the server declares, when the call came through the
 * MCP gateway; `undefined` otherwise. */
export function mcpFacts(call: Call): { server?: string; tool?: string; hints: [string, boolean][] } | undefined {
  const named = MCP_MESSAGE.exec(call.message);
  const declared = parsed(call.inputJson)?.[HINTS_KEY];
  const hints: [string, boolean][] = [];
  if (declared !== null && typeof declared === "object" && !Array.isArray(declared)) {
    for (const [name, value] of Object.entries(declared)) if (typeof value === "boolean") hints.push([name, value]);
  }
  if (!named && hints.length === 0) return undefined;
  return { tool: named?.[1], server: named?.[2], hints };
}

/** What each hint says, true and false ([MCP tool annotations]). */
const HINT_WORDS: Record<string, [string, string]> = {
  destructiveHint: ["destructive", "not destructive"],
  openWorldHint: ["open world", "closed world"],
  readOnlyHint: ["read-only", "may write"],
  idempotentHint: ["idempotent", "not idempotent"],
};

/** The MCP server and tool as fields, the hints as flags (red for destructive and open world). */
export function mcpView(call: Call): HTMLElement | null {
  const facts = mcpFacts(call);
  if (!facts) return null;
  const flags = facts.hints.map(([name, value]) => {
    const words = HINT_WORDS[name];
    const text = words ? words[value ? 0 : 1] : `${name}: ${value}`;
    const risky = value && (name === "destructiveHint" || name === "openWorldHint");
    return h("span", { class: risky ? "flag risky" : "flag", "data-hint": name, title: `${name}: ${value}` }, text);
  });
  return h(
    "p",
    { class: "mcp" },
    facts.server !== undefined ? ["MCP server ", h("code", { class: "mcp-server" }, revealed(facts.server)), " "] : null,
    facts.tool !== undefined ? ["tool ", h("code", { class: "mcp-tool" }, revealed(facts.tool)), " "] : null,
    flags.length > 0 ? [h("span", { class: "meta" }, "the server declares (unchecked): "), ...flags] : null,
  );
}

/** A message as text, with `inline code` shown as code rather than as raw backticks. */
export function prose(text: string): Node[] {
  return text.split(/(`[^`\n]+`)/).map((part) =>
    part.length > 2 && part.startsWith("`") && part.endsWith("`") ? h("code", {}, revealed(part.slice(1, -1))) : h("span", {}, revealed(part)),
  );
}
