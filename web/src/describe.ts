// Words for what grants and rules do, so a person reads what a grant will match before it is
// created, and what each one covers after. Must say exactly what the broker matches, no more.
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { CallStatus, Effect, Scope, type Call, type Grant, type InputMatcher, type Rule } from "./gen/approvals/v1/types_pb";

export function statusName(status: CallStatus): string {
  return CallStatus[status] ?? String(status);
}

export function effectName(effect: Effect): string {
  return Effect[effect] ?? String(effect);
}

export function matcherText(matcher: InputMatcher | undefined): string {
  const kind = matcher?.kind;
  switch (kind?.case) {
    case undefined:
    case "any":
      return "any input";
    case "exactJson":
      return kind.value === "" ? "exactly this input" : `input exactly ${kind.value}`;
    case "fields":
      return (
        "inputs where " +
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

/** What a decision with `scope` will remember, said before it is made. */
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

export function grantPreview(call: Call, scope: Scope, anyInput: boolean): string {
  if (scope === Scope.ONCE || scope === Scope.UNSPECIFIED) return "Decides this call only; remembers nothing.";
  if (scope === Scope.WORKSPACE && call.workspace === "") return "This call has no workspace: choose another scope.";
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
  return (
    `${effectName(g.effect)} ${JSON.stringify(g.tool)} ${scopeWhere(g.scope, g.sessionId, g.workspace)} ` +
    `of agent ${JSON.stringify(g.agent)}, for ${matcherText(g.matcher)}; ${expiry}. ` +
    `Made by ${g.createdBy} ${when(g.createdAt)}.`
  );
}

export function ruleText(r: Rule): string {
  return `${effectName(r.effect)} tools ${JSON.stringify(r.tool)} for ${matcherText(r.matcher)} (priority ${r.priority}, from ${r.source})`;
}

/** "3m 20s" for a number of seconds. */
export function span(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}
