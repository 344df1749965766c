// Words for what grants and rules do, so a person reads what a grant will match before it is
// created, and what each one covers after. Must say exactly what the broker matches, no more.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { CallStatus, Effect, Scope, type Call, type Grant, type InputMatcher, type Rule } from "./gen/approvals/v1/types_pb";
import { narrowText } from "./answers";
import { actionSummary, actionWords } from "./host";

export function statusName(status: CallStatus): string {
  return CallStatus[status] ?? String(status);
}

export function effectName(effect: Effect): string {
  return Effect[effect] ?? String(effect);
}

/** What `matcher` accepts. `onAction`: it tests a host call's action fields (a grant or rule
 * with a kind), not the tool's own input. */
export function matcherText(matcher: InputMatcher | undefined, onAction = false): string {
  const kind = matcher?.kind;
  const [one, many] = onAction ? ["action fields", "actions"] : ["input", "inputs"];
  switch (kind?.case) {
    case undefined:
    case "any":
      return onAction ? "any fields" : "any input";
    case "exactJson":
      return kind.value === "" ? (onAction ? "exactly this action" : "exactly this input") : `${one} exactly ${kind.value}`;
    case "fields":
      return (
        `${many} where ` +
        kind.value.conditions
          .map((c) => {
            const t = c.test;
            switch (t.case) {
              case "equals":
                return `${c.field} = ${JSON.stringify(t.value)}`;
              case "equalsJson":
                return `${c.field} = ${t.value}`;
              case "prefix":
                return `${c.field} starts with ${JSON.stringify(t.value)}`;
              case "glob":
                return `${c.field} matches ${JSON.stringify(t.value)}`;
              case "commandPrefix":
              case "pathUnder":
              case "urlHost":
                return narrowText(t.case, c.field, t.value);
              default:
                return `${c.field} ?`;
            }
          })
          .join(" and ")
      );
  }
}

function scopeWhere(scope: Scope, session: string, workspace: string): string {
  switch (scope) {
    case Scope.SESSION:
      return `in session ${JSON.stringify(session)}`;
    case Scope.WORKSPACE:
      return `in workspace ${JSON.stringify(workspace)}`;
    case Scope.ALWAYS:
      return "in every session";
    default:
      return "";
  }
}

/**
 * Who may decide a call and how far its votes have come ("1 of 2 approvals (alice) · who may
 * decide: ops, sec"); empty when any approver decides alone.
 */
export function approvalText(call: Call): string {
  const a = call.approval;
  if (!a) return "";
  const who = a.approvers && a.approvers.groups.length > 0 ? a.approvers.groups.join(", ") : "any approver";
  const approvers = a.votes.filter((v) => v.approve).map((v) => v.approver);
  const parts = [`${a.summary}${approvers.length > 0 ? ` (${approvers.join(", ")})` : ""}`];
  if (a.approvers?.distinctGroups) parts.push("each from a different group");
  if (a.denials > 0) parts.push(`${a.denials} of ${a.approvers?.denialsToDeny ?? 1} denials`);
  parts.push(`who may decide: ${who}`);
  return parts.join(" · ");
}

/** How a scope choice reads in the Remember list. A host call's choice names the action and
 * says it holds on every host ("For `git status` (shell) on every host, this session"): the
 * broker remembers the action, not the host's tool. */
export function scopeLabel(call: Call, scope: Scope, anyInput: boolean): string {
  const plain: Record<number, string> = {
    [Scope.ONCE]: "Once",
    [Scope.SESSION]: "This session",
    [Scope.WORKSPACE]: "This workspace",
    [Scope.ALWAYS]: "Always (this agent)",
  };
  const action = rememberedAction(call, anyInput);
  if (scope === Scope.ONCE || scope === Scope.UNSPECIFIED || action === undefined) return plain[scope] ?? "Once";
  const where = scope === Scope.SESSION ? "this session" : scope === Scope.WORKSPACE ? "this workspace" : "always (this agent)";
  return `For ${action} on every host, ${where}`;
}

/** The action a remembered decision on `call` covers on every host, in words; `undefined` when
 * the call has no common kind (no host, or `other`), and a grant covers this tool alone. */
function rememberedAction(call: Call, anyInput: boolean): string | undefined {
  const action = actionSummary(call);
  if (!action || action.kind === "other") return undefined;
  return actionWords(call, anyInput);
}

/** What a decision with `scope` will remember, said before it is made. */
export function grantPreview(call: Call, scope: Scope, anyInput: boolean): string {
  if (scope === Scope.ONCE || scope === Scope.UNSPECIFIED) return "Decides this call only; remembers nothing.";
  if (scope === Scope.WORKSPACE && call.workspace === "") return "This call has no workspace: choose another scope.";
  const action = actionSummary(call);
  if (action && action.kind !== "other") {
    const fields = anyInput ? "any fields" : `fields exactly ${call.action?.fieldsJson ?? "{}"}`;
    return (
      `Creates a grant: ALLOW (on Approve) or DENY (on Deny) every later ${action.kind} action, on every host ` +
      `(whichever tool asks for it, not only ${JSON.stringify(call.tool)}), ` +
      `${scopeWhere(scope, call.sessionId, call.workspace)} of agent ${JSON.stringify(call.agent)}, ` +
      `for ${fields}, until revoked. It also decides the pending calls it matches now.`
    );
  }
  const what = anyInput ? "any input" : `input exactly ${call.inputJson}`;
  return (
    `Creates a grant: ALLOW (on Approve) or DENY (on Deny) every later ${JSON.stringify(call.tool)} call ` +
    `${scopeWhere(scope, call.sessionId, call.workspace)} of agent ${JSON.stringify(call.agent)}, ` +
    `for ${what}, until revoked. It also decides the pending calls it matches now.`
  );
}

export function when(ts: Timestamp | undefined): string {
  return ts ? timestampDate(ts).toLocaleString() : "";
}

export function grantText(g: Grant): string {
  const expiry = g.revokedAt
    ? `revoked ${when(g.revokedAt)} by ${g.revokedBy}`
    : g.expiresAt
      ? `expires ${when(g.expiresAt)}`
      : "until revoked";
  // A grant with a kind covers the action on every host; its tool only says where it was made.
  const what = g.kind ? `${g.kind} actions on every host (made on ${JSON.stringify(g.tool)})` : JSON.stringify(g.tool);
  return (
    `${effectName(g.effect)} ${what} ${scopeWhere(g.scope, g.sessionId, g.workspace)} ` +
    `of agent ${JSON.stringify(g.agent)}, for ${matcherText(g.matcher, g.kind !== "")}; ${expiry}. ` +
    `Made by ${g.createdBy} ${when(g.createdAt)}.`
  );
}

export function ruleText(r: Rule): string {
  // A rule with a kind matches that action on every host; its tool glob is then `*` (any tool)
  // unless the operator narrowed it.
  const what = r.kind
    ? `${r.kind} actions on every host${r.tool && r.tool !== "*" ? `, of tools ${JSON.stringify(r.tool)}` : ""}`
    : `tools ${JSON.stringify(r.tool)}`;
  return `${effectName(r.effect)} ${what} for ${matcherText(r.matcher, r.kind !== "")} (priority ${r.priority}, from ${r.source})`;
}

/** "3m 20s" for a number of seconds. */
export function span(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}
