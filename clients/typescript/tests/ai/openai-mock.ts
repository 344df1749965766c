/**
 * `@ai-sdk/openai` for the README's Vercel AI SDK example, which runs as written: loaded with
 * `node --import` before the example, this module makes the example's
 * `import { openai } from "@ai-sdk/openai"` resolve to itself (a Node module resolve hook), and
 * its `openai(modelId)` is an `ai/test` mock model, not OpenAI. The model asks, in one response,
 * for `run_shell` (`rm -rf build`) and `read_file` (`notes.txt`); once its prompt holds their
 * results, it answers with the text the file's tool result gave it.
 */
import { register } from "node:module";
import { MockLanguageModelV4 } from "ai/test";

register(
  `data:text/javascript,${encodeURIComponent(
    `export async function resolve(specifier, context, next) {
      return specifier === "@ai-sdk/openai" ? { url: ${JSON.stringify(import.meta.url)}, shortCircuit: true } : next(specifier, context);
    }`,
  )}`,
);

const USAGE = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};

type ToolResultPart = { type: string; toolName: string; output: { type: string; value?: unknown } };

export function openai(modelId: string) {
  return new MockLanguageModelV4({
    provider: "openai.responses",
    modelId,
    doGenerate: async ({ prompt }) => {
      const results = prompt.flatMap((m) => (m.role === "tool" ? (m.content as ToolResultPart[]) : [])).filter((p) => p.type === "tool-result");
      if (results.length === 0) {
        return {
          content: [
            { type: "tool-call" as const, toolCallId: "call_1", toolName: "run_shell", input: JSON.stringify({ command: "rm -rf build" }) },
            { type: "tool-call" as const, toolCallId: "call_2", toolName: "read_file", input: JSON.stringify({ path: "notes.txt" }) },
          ],
          finishReason: { unified: "tool-calls" as const, raw: "tool_calls" },
          usage: USAGE,
          warnings: [],
        };
      }
      const read = results.find((p) => p.toolName === "read_file" && p.output.type === "text");
      const text = read ? `The file says: ${String(read.output.value).trim()}` : "I could not read the file.";
      return { content: [{ type: "text" as const, text }], finishReason: { unified: "stop" as const, raw: "stop" }, usage: USAGE, warnings: [] };
    },
  });
}
