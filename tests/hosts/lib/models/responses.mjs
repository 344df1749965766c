// A scripted model behind the OpenAI Responses API (`POST /v1/responses`, streaming SSE), the
// only wire API Codex speaks to a custom provider (`wire_api = "responses"`). A string input
// makes a free-form tool call (Codex's `apply_patch`), an object a function call
// (`exec_command`). The turn comes from the request (see server.mjs); the
// `function_call_output` / `custom_tool_call_output` for the scripted call is recorded.
import { contentText, notFound, sendEvents, startModelServer } from "./server.mjs";

export async function responsesModel(script) {
  return startModelServer((request, body, reply) => {
    const path = request.url.split("?")[0];
    if (request.method !== "POST" || !path.endsWith("/responses")) return notFound(reply, `${request.method} ${path}`);
    const result = toolResultIn(body, script.callId);
    const offered = (body.tools ?? []).some((tool) => tool.name === script.tool);
    let item;
    if (result !== undefined) {
      if (script.toolResults.at(-1) !== result) script.toolResults.push(result);
      item = finalMessage(script.text);
    } else if (offered) {
      script.toolCallsSent += 1;
      item =
        typeof script.input === "string"
          ? { type: "custom_tool_call", id: `ctc_${script.callId}`, status: "completed", call_id: script.callId, name: script.tool, input: script.input }
          : {
              type: "function_call",
              id: `fc_${script.callId}`,
              status: "completed",
              call_id: script.callId,
              name: script.tool,
              arguments: JSON.stringify(script.input),
            };
    } else {
      item = finalMessage(script.text);
    }
    const id = `resp_${Math.random().toString(36).slice(2)}`;
    const usage = {
      input_tokens: 10,
      input_tokens_details: { cached_tokens: 0 },
      output_tokens: 5,
      output_tokens_details: { reasoning_tokens: 0 },
      total_tokens: 15,
    };
    sendEvents(reply, [
      ["response.created", { type: "response.created", response: { id, object: "response", status: "in_progress", output: [] } }],
      ["response.output_item.done", { type: "response.output_item.done", output_index: 0, item }],
      ["response.completed", { type: "response.completed", response: { id, object: "response", status: "completed", output: [item], usage } }],
    ]);
  });
}

function finalMessage(text) {
  return {
    type: "message",
    id: `msg_${Math.random().toString(36).slice(2)}`,
    status: "completed",
    role: "assistant",
    content: [{ type: "output_text", text, annotations: [] }],
  };
}

function toolResultIn(body, callId) {
  for (const item of body?.input ?? []) {
    if ((item.type === "function_call_output" || item.type === "custom_tool_call_output") && item.call_id === callId) {
      return contentText(item.output ?? "");
    }
  }
  return undefined;
}
