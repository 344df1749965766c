// What the scripted model servers share: an HTTP server on 127.0.0.1 (a free port) that keeps
// every request a host sent, and a script of one tool call and one final answer. Each wire API
// (anthropic.mjs, responses.mjs, chat.mjs, gemini.mjs) reads its own request shape and writes its
// own SSE; the turn is chosen from the request itself, never from a count, so a host's side
// requests (a title, a topic check) or a retried request cannot shift the script:
//   - the request carries the result of the scripted call: record that result (what the model
//     got back: the tool's output, or the denial text) and answer the final text;
//   - the request offers the scripted tool: answer the tool call;
//   - anything else (no tools): answer the final text, so side requests end quickly.
import { createServer } from "node:http";

/**
 * A model script: `tool` (the host's tool name, as the model calls it), `input` (its arguments,
 * an object; or a string for a free-form tool such as Codex's `apply_patch`), `callId` (the
 * model's own tool-call id, which hooks submit as the broker's call id), `text` (the answer after
 * the tool result).
 */
export class Script {
  constructor({ tool, input, callId, text = "Done." }) {
    Object.assign(this, { tool, input, callId, text });
    /** Every tool result the model got for the scripted call, in order (texts). */
    this.toolResults = [];
    /** How many times the tool call was answered. */
    this.toolCallsSent = 0;
  }

  /** The one tool result the model got; fails when there was none or more than one. */
  get toolResult() {
    if (this.toolResults.length !== 1) {
      throw new Error(`expected one tool result for ${this.callId}, got ${this.toolResults.length}: ${JSON.stringify(this.toolResults)}`);
    }
    return this.toolResults[0];
  }
}

/**
 * Starts a model server: `handle(request, body, reply)` answers one request, where `request` is
 * Node's IncomingMessage, `body` the parsed JSON (or undefined) and `reply` the ServerResponse.
 * Returns `{ url, port, requests, close() }`; `requests` keeps `{ method, url, headers, body }`.
 */
export async function startModelServer(handle) {
  const requests = [];
  const server = createServer((request, reply) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      let body;
      try {
        body = text ? JSON.parse(text) : undefined;
      } catch {
        body = undefined;
      }
      requests.push({ method: request.method, url: request.url, headers: request.headers, body });
      try {
        handle(request, body, reply);
      } catch (error) {
        reply.writeHead(500, { "content-type": "application/json" });
        reply.end(JSON.stringify({ error: { message: `scripted model server: ${error.message}` } }));
      }
    });
  });
  await new Promise((resolveListen) => server.listen(0, "127.0.0.1", resolveListen));
  const { port } = server.address();
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise((resolveClose) => {
        server.closeAllConnections();
        server.close(() => resolveClose());
      }),
  };
}

/** Writes server-sent events: each `[event, data]` pair (event may be null), then ends. */
export function sendEvents(reply, events) {
  reply.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", connection: "keep-alive" });
  for (const [event, data] of events) {
    if (event) reply.write(`event: ${event}\n`);
    reply.write(`data: ${typeof data === "string" ? data : JSON.stringify(data)}\n\n`);
  }
  reply.end();
}

/** A tool result's content as text (a string, or a list of text parts). */
export function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => (typeof part === "string" ? part : (part.text ?? JSON.stringify(part)))).join("\n");
  return JSON.stringify(content);
}

/** Answers 404 in the shape every SDK reads as an API error. */
export function notFound(reply, what) {
  reply.writeHead(404, { "content-type": "application/json" });
  reply.end(JSON.stringify({ error: { type: "not_found_error", message: `the scripted model server has no ${what}` } }));
}
