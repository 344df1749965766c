// Which agent host asked, and what the call does in the words common to every host (issue 48):
// the broker reads a host adapter's call (`Call.host`) as an action (`Call.action`: a kind and
// its fields), which rules and remembered decisions match on every host alike. A card shows the
// host and the action's key field (the command, the path, the URL, the MCP server and tool)
// beside the raw tool and input, which stay the fact: this line never replaces them, and a call
// without a host shows nothing here. Text only, built as DOM nodes: a command holding markup
// stays text.
import { h } from "./dom";
import type { Call } from "./gen/approvals/v1/types_pb";
import { jsonView, revealed } from "./json";

/** The hosts' names as people know them (`CallSpec.host` in proto/approvals/v1/types.proto). */
const HOST_NAMES: Record<string, string> = {
  "claude-code": "Claude Code",
  codex: "Codex",
  "gemini-cli": "Gemini CLI",
  copilot: "Copilot CLI",
  cursor: "Cursor",
  acp: "ACP agent",
};

/** Every host a call may name, in the order people are shown them. */
export const HOSTS = Object.keys(HOST_NAMES);

/** A key field longer than this (in characters) is cut on this line; the input below holds it
 * whole (folded, and unfolded before any approval). */
const KEY_FIELD_AT = 200;

/** The host's human name; an unknown value is shown as sent. */
export function hostName(host: string): string {
  return HOST_NAMES[host] ?? host;
}

/** What a host call does: its kind, and the one field a person reads first (`label` names it). */
export interface ActionSummary {
  kind: string;
  label: string;
  value: string;
}

function fieldsOf(json: string): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(json);
    return value !== null && typeof value === "object" && !Array.isArray(value) ? (value as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

const text = (value: unknown): string => (typeof value === "string" ? value : value === undefined || value === null ? "" : JSON.stringify(value));

/** The action's kind and key field: the command for shell, the path for edit, write and read,
 * the URL for fetch, server/tool for mcp; no key field for other kinds. `undefined` for a call
 * without a host (or, defensively, without an action). */
export function actionSummary(call: Call): ActionSummary | undefined {
  if (call.host === "" || !call.action) return undefined;
  const kind = call.action.kind || "other";
  const fields = fieldsOf(call.action.fieldsJson);
  switch (kind) {
    case "shell":
      return { kind, label: "command", value: text(fields.command) };
    case "edit":
    case "write":
    case "read":
      return { kind, label: "path", value: text(fields.path) };
    case "fetch":
      return { kind, label: "URL", value: text(fields.url) };
    case "mcp": {
      const server = text(fields.server);
      const tool = text(fields.tool);
      return { kind, label: "server/tool", value: server || tool ? `${server}/${tool}` : "" };
    }
    default:
      return { kind, label: "", value: "" };
  }
}

function cut(value: string): { shown: string; more: number } {
  const chars = Array.from(value);
  return chars.length <= KEY_FIELD_AT ? { shown: value, more: 0 } : { shown: chars.slice(0, KEY_FIELD_AT).join(""), more: chars.length - KEY_FIELD_AT };
}

/** The line a host call's card (and history row) shows above the raw input: "Codex asks to run
 * a shell action: command `git status`"; `null` for a call without a host, which looks as it
 * always did. */
export function hostView(call: Call): HTMLElement | null {
  if (call.host === "") return null;
  const action = actionSummary(call);
  const host = h("strong", { class: "host", "data-host": call.host }, hostName(call.host));
  if (!action) return h("p", { class: "action" }, host, " asks for this call");
  const { shown, more } = cut(action.value);
  return h(
    "p",
    { class: "action", "data-kind": action.kind },
    host,
    " · ",
    h("span", { class: "kind", title: "what the call does, in the words every host shares" }, action.kind),
    action.label !== ""
      ? [
          ` ${action.label} `,
          h("code", { class: "key-field" }, ...(action.value === "" ? ["(none)"] : revealed(shown))),
          more > 0 ? h("span", { class: "meta" }, ` … ${more} more characters (see the input below)`) : null,
        ]
      : null,
  );
}

/** How the action reads in the scope choice: "`git status` (shell)", "`src/main.rs` (edit)",
 * "shell" when the grant matches any input of the kind, or when there is no key field. */
export function actionWords(call: Call, anyInput: boolean): string | undefined {
  const action = actionSummary(call);
  if (!action) return undefined;
  if (anyInput || action.value === "") return `any ${action.kind} action`;
  const { shown, more } = cut(action.value);
  return `\`${shown}${more > 0 ? "…" : ""}\` (${action.kind})`;
}

/** The action's fields in full, for a card's Details: what rules and grants with a kind test;
 * `null` for a call without a host. */
export function actionDetail(call: Call): HTMLElement | null {
  const action = actionSummary(call);
  if (!action || !call.action) return null;
  const fields = jsonView(call.action.fieldsJson);
  fields.setAttribute("aria-label", `The ${action.kind} action's fields`);
  return h(
    "div",
    { class: "action-fields" },
    h("p", { class: "meta" }, `${hostName(call.host)}'s ${JSON.stringify(call.tool)} read as every host's calls are: kind ${action.kind}, with the fields that rules and remembered decisions test:`),
    fields,
  );
}
