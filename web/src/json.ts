// Shows a call's input as a person must see it: pretty-printed and highlighted, long strings
// folded (never cut: the whole text is one click away, and the length is shown), and every
// character that changes how text looks without showing itself (bidirectional controls,
// zero-width and other invisible format characters, tag characters, line and paragraph
// separators) written out as a visible `U+202E` badge where it stands. The list is the broker's
// own (./invisible, generated from src/domain/invisible.rs). Builds DOM nodes only (never HTML
// text), so nothing in an input can become markup.
import { INVISIBLE } from "./invisible";

const HIDDEN = new RegExp(INVISIBLE.source, "gu");

const FOLD_AT = 160;

export function hasHidden(text: string): boolean {
  HIDDEN.lastIndex = 0;
  return HIDDEN.test(text);
}

/** `text` as nodes, each hidden character replaced by a visible badge. */
export function revealed(text: string): Node[] {
  const nodes: Node[] = [];
  let last = 0;
  HIDDEN.lastIndex = 0;
  for (let m = HIDDEN.exec(text); m !== null; m = HIDDEN.exec(text)) {
    if (m.index > last) nodes.push(document.createTextNode(text.slice(last, m.index)));
    const badge = document.createElement("mark");
    badge.className = "hidden-char";
    const code = `U+${m[0].codePointAt(0)!.toString(16).toUpperCase().padStart(4, "0")}`;
    badge.textContent = code;
    badge.title = `invisible character ${code}`;
    nodes.push(badge);
    last = m.index + m[0].length;
  }
  if (last < text.length) nodes.push(document.createTextNode(text.slice(last)));
  return nodes;
}

function span(cls: string, ...children: (Node | string)[]): HTMLSpanElement {
  const s = document.createElement("span");
  s.className = cls;
  s.append(...children);
  return s;
}

/** Folds `text` after its first `at` characters (code points, so no pair is cut in two): a
 * closed `<details class="fold">` whose summary says how many more there are, and how many in
 * all. `show` turns text into nodes (the JSON view quotes it; a command is shown as is). */
export function foldable(text: string, at: number, show: (text: string, whole: boolean) => Node): Node {
  const chars = Array.from(text);
  if (chars.length <= at) return show(text, true);
  const fold = document.createElement("details");
  fold.className = "fold";
  const summary = document.createElement("summary");
  summary.append(show(chars.slice(0, at).join(""), false), span("j-more", ` … ${chars.length - at} more characters (${chars.length} in all; folded)`));
  fold.append(summary, show(text, true));
  return fold;
}

function stringNode(value: string): Node {
  return foldable(value, FOLD_AT, (text, whole) => span("j-str", ...revealed(whole ? JSON.stringify(text) : JSON.stringify(text).slice(0, -1))));
}

function valueNode(value: unknown, indent: string): Node[] {
  if (value === null) return [span("j-lit", "null")];
  if (typeof value === "boolean") return [span("j-lit", String(value))];
  if (typeof value === "number") return [span("j-num", JSON.stringify(value))];
  if (typeof value === "string") return [stringNode(value)];
  const inner = indent + "  ";
  if (Array.isArray(value)) {
    if (value.length === 0) return [span("j-punct", "[]")];
    const out: Node[] = [span("j-punct", "[")];
    value.forEach((item, i) => {
      out.push(document.createTextNode(`\n${inner}`), ...valueNode(item, inner));
      if (i < value.length - 1) out.push(span("j-punct", ","));
    });
    out.push(document.createTextNode(`\n${indent}`), span("j-punct", "]"));
    return out;
  }
  const entries = Object.entries(value as Record<string, unknown>);
  if (entries.length === 0) return [span("j-punct", "{}")];
  const out: Node[] = [span("j-punct", "{")];
  entries.forEach(([key, item], i) => {
    out.push(
      document.createTextNode(`\n${inner}`),
      span("j-key", ...revealed(JSON.stringify(key))),
      span("j-punct", ": "),
      ...valueNode(item, inner),
    );
    if (i < entries.length - 1) out.push(span("j-punct", ","));
  });
  out.push(document.createTextNode(`\n${indent}`), span("j-punct", "}"));
  return out;
}

/** A `<pre>` showing `json` highlighted; the raw text, revealed, if it does not parse. */
export function jsonView(json: string): HTMLPreElement {
  const pre = document.createElement("pre");
  pre.className = "json";
  try {
    pre.append(...valueNode(JSON.parse(json), ""));
  } catch {
    pre.append(...revealed(json));
  }
  return pre;
}

/** A `<pre>` showing a parsed JSON value highlighted. */
export function valueView(value: unknown): HTMLPreElement {
  const pre = document.createElement("pre");
  pre.className = "json";
  pre.append(...valueNode(value, ""));
  return pre;
}

/** The edited input, or why it cannot be sent (the broker takes JSON objects only). */
export function parseEdit(text: string): { json: string } | { error: string } {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (e) {
    return { error: `not valid JSON: ${(e as Error).message}` };
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    return { error: "the input must be a JSON object ({ ... })" };
  }
  return { json: JSON.stringify(value) };
}

export function pretty(json: string): string {
  try {
    return JSON.stringify(JSON.parse(json), null, 2);
  } catch {
    return json;
  }
}
