// A scripted model behind the Gemini API (`POST /v1beta/models/{model}:streamGenerateContent`
// with `alt=sse`), as Gemini CLI calls it with `GOOGLE_GEMINI_BASE_URL`. The turn comes from the
// request (see server.mjs); the `functionResponse` answering the scripted call is recorded
// (its `output`, or its `error`: the text the model reads). `:generateContent` and
// `:countTokens` are answered too, should the host ask.
import { notFound, sendEvents, startModelServer } from "./server.mjs";

export async function geminiModel(script) {
  return startModelServer((request, body, reply) => {
    const path = request.url.split("?")[0];
    if (request.method !== "POST") return notFound(reply, `${request.method} ${path}`);
    if (path.endsWith(":countTokens")) {
      reply.writeHead(200, { "content-type": "application/json" });
      reply.end(JSON.stringify({ totalTokens: 10 }));
      return;
    }
    const streaming = path.endsWith(":streamGenerateContent");
    if (!streaming && !path.endsWith(":generateContent")) return notFound(reply, `POST ${path}`);
    const result = toolResultIn(body, script);
    const offered = (body.tools ?? []).some((tool) => (tool.functionDeclarations ?? []).some((f) => f.name === script.tool));
    let part;
    if (result === undefined && offered) {
      script.toolCallsSent += 1;
      part = { functionCall: { id: script.callId, name: script.tool, args: script.input } };
    } else {
      if (result !== undefined && script.toolResults.at(-1) !== result) script.toolResults.push(result);
      part = { text: script.text };
    }
    const answer = {
      candidates: [{ content: { role: "model", parts: [part] }, finishReason: "STOP", index: 0 }],
      usageMetadata: { promptTokenCount: 10, candidatesTokenCount: 5, totalTokenCount: 15 },
      modelVersion: "gemini-2.5-pro",
    };
    if (!streaming) {
      reply.writeHead(200, { "content-type": "application/json" });
      reply.end(JSON.stringify(answer));
      return;
    }
    sendEvents(reply, [[null, answer]]);
  });
}

/** The text of the functionResponse for the scripted call (by id when the host kept it). */
function toolResultIn(body, script) {
  for (const content of body?.contents ?? []) {
    for (const part of content.parts ?? []) {
      const response = part.functionResponse;
      if (!response || response.name !== script.tool) continue;
      if (response.id !== undefined && response.id !== script.callId) continue;
      const value = response.response ?? {};
      const text = value.output ?? value.error ?? value;
      return typeof text === "string" ? text : JSON.stringify(text);
    }
  }
  return undefined;
}
