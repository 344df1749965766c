// A scripted model behind the Anthropic Messages API (`POST /v1/messages`, streaming SSE), as
// Claude Code and the Claude Agent SDK (under the ACP agent) call it with `ANTHROPIC_BASE_URL`.
// The turn comes from the request (see server.mjs): the scripted `tool_use`, or the final text
// once the request carries the `tool_result` for it, which is recorded.
import { contentText, notFound, sendEvents, startModelServer } from "./server.mjs";

/** Starts the server for this Script; returns the server (`url` is the host's base URL). */
export async function anthropicModel(script) {
  return startModelServer((request, body, reply) => {
    const path = request.url.split("?")[0];
    if (request.method === "POST" && path === "/v1/messages/count_tokens") {
      reply.writeHead(200, { "content-type": "application/json" });
      reply.end(JSON.stringify({ input_tokens: 10 }));
      return;
    }
    if (request.method !== "POST" || path !== "/v1/messages") return notFound(reply, `${request.method} ${path}`);
    const result = toolResultIn(body, script.callId);
    const offered = (body.tools ?? []).some((tool) => tool.name === script.tool);
    let content;
    if (result !== undefined) {
      if (script.toolResults.at(-1) !== result) script.toolResults.push(result);
      content = { type: "text", text: script.text };
    } else if (offered) {
      script.toolCallsSent += 1;
      content = { type: "tool_use", id: script.callId, name: script.tool, input: script.input };
    } else {
      content = { type: "text", text: script.text };
    }
    answer(reply, body, content);
  });
}

/** The text of the `tool_result` block answering this tool-use id, if the request has one. */
function toolResultIn(body, callId) {
  for (const message of body?.messages ?? []) {
    if (!Array.isArray(message.content)) continue;
    for (const block of message.content) {
      if (block.type === "tool_result" && block.tool_use_id === callId) return contentText(block.content ?? "");
    }
  }
  return undefined;
}

function answer(reply, body, content) {
  const message = {
    id: `msg_${Math.random().toString(36).slice(2)}`,
    type: "message",
    role: "assistant",
    model: body?.model ?? "claude-sonnet-4-5",
    content: [],
    stop_reason: null,
    stop_sequence: null,
    usage: { input_tokens: 10, output_tokens: 1 },
  };
  const stopReason = content.type === "tool_use" ? "tool_use" : "end_turn";
  if (!body?.stream) {
    reply.writeHead(200, { "content-type": "application/json" });
    reply.end(JSON.stringify({ ...message, content: [content], stop_reason: stopReason }));
    return;
  }
  const start = content.type === "tool_use" ? { ...content, input: {} } : { type: "text", text: "" };
  const delta =
    content.type === "tool_use"
      ? { type: "input_json_delta", partial_json: JSON.stringify(content.input) }
      : { type: "text_delta", text: content.text };
  sendEvents(reply, [
    ["message_start", { type: "message_start", message }],
    ["content_block_start", { type: "content_block_start", index: 0, content_block: start }],
    ["content_block_delta", { type: "content_block_delta", index: 0, delta }],
    ["content_block_stop", { type: "content_block_stop", index: 0 }],
    ["message_delta", { type: "message_delta", delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: 10 } }],
    ["message_stop", { type: "message_stop" }],
  ]);
}
