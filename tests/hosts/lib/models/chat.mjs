// A scripted model behind the OpenAI Chat Completions API (`POST /v1/chat/completions`,
// streaming SSE), which Copilot CLI speaks to a custom provider (`COPILOT_PROVIDER_BASE_URL`).
// The turn comes from the request (see server.mjs); the `tool` message answering the scripted
// call is recorded. `GET /v1/models` lists the one model asked for.
import { contentText, notFound, sendEvents, startModelServer } from "./server.mjs";

export async function chatModel(script, modelId = "claude-sonnet-4.5") {
  return startModelServer((request, body, reply) => {
    const path = request.url.split("?")[0];
    if (request.method === "GET" && path.endsWith("/models")) {
      reply.writeHead(200, { "content-type": "application/json" });
      reply.end(JSON.stringify({ object: "list", data: [{ id: modelId, object: "model", created: 0, owned_by: "scripted" }] }));
      return;
    }
    if (request.method !== "POST" || !path.endsWith("/chat/completions")) return notFound(reply, `${request.method} ${path}`);
    const result = toolResultIn(body, script.callId);
    const offered = (body.tools ?? []).some((tool) => (tool.function?.name ?? tool.custom?.name ?? tool.name) === script.tool);
    const base = { id: `chatcmpl-${Math.random().toString(36).slice(2)}`, object: "chat.completion.chunk", created: Math.floor(Date.now() / 1000), model: body?.model ?? modelId };
    const chunk = (delta, finish) => [null, { ...base, choices: [{ index: 0, delta, finish_reason: finish }] }];
    const usage = [null, { ...base, choices: [], usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } }];
    if (result === undefined && offered) {
      script.toolCallsSent += 1;
      const call = { index: 0, id: script.callId, type: "function", function: { name: script.tool, arguments: JSON.stringify(script.input) } };
      sendEvents(reply, [chunk({ role: "assistant", content: null, tool_calls: [call] }, null), chunk({}, "tool_calls"), usage, [null, "[DONE]"]]);
      return;
    }
    if (result !== undefined && script.toolResults.at(-1) !== result) script.toolResults.push(result);
    sendEvents(reply, [chunk({ role: "assistant", content: script.text }, null), chunk({}, "stop"), usage, [null, "[DONE]"]]);
  });
}

function toolResultIn(body, callId) {
  for (const message of body?.messages ?? []) {
    if (message.role === "tool" && message.tool_call_id === callId) return contentText(message.content ?? "");
  }
  return undefined;
}
