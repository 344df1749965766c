// An editor's side of the Agent Client Protocol, played with `@agentclientprotocol/sdk`'s client:
// it starts the agent command (in the tests, `approval-broker acp-proxy -- <agent>`), runs one
// prompt turn (initialize, session/new, session/prompt) and keeps what the editor would see:
// the session's updates (tool calls and their status) and any `session/request_permission`
// that reached it. Behind the proxy none should: the broker answers them. Should one arrive
// anyway, this editor rejects it, so a proxy that relayed it could not make the tool run.
import { spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { client, ndJsonStream } from "@agentclientprotocol/sdk";

/**
 * Runs one prompt turn; resolves `{ stopReason, sessionId, updates, permissionRequests, stderr }`.
 * `during({ agent, sessionId })`, when given, runs while the prompt is under way (an editor's
 * user cancelling the turn, say).
 */
export async function acpTurn({ command, args, cwd, env, prompt, during, timeoutMs = 180_000 }) {
  const child = spawn(command, args, { cwd, env, stdio: ["pipe", "pipe", "pipe"], detached: true });
  let stderr = "";
  child.stderr.on("data", (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolveExit) => child.once("close", (code, signal) => resolveExit({ code, signal })));
  const updates = [];
  const permissionRequests = [];
  const editor = client()
    .onNotification("session/update", ({ params }) => {
      updates.push(params.update);
    })
    .onRequest("session/request_permission", ({ params }) => {
      permissionRequests.push(params);
      const reject = params.options.find((option) => option.kind === "reject_once");
      return reject ? { outcome: { outcome: "selected", optionId: reject.optionId } } : { outcome: { outcome: "cancelled" } };
    });
  const stream = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));
  let timer;
  const timedOut = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`the ACP turn did not end within ${timeoutMs / 1000}s\n--- stderr ---\n${stderr.slice(-4000)}`)), timeoutMs);
  });
  try {
    const turn = editor.connectWith(stream, async (agent) => {
      await agent.request("initialize", {
        protocolVersion: 1,
        clientCapabilities: { fs: { readTextFile: false, writeTextFile: false }, terminal: false },
        clientInfo: { name: "approval-broker-host-tests", version: "0.0.0" },
      });
      const session = await agent.request("session/new", { cwd, mcpServers: [] });
      const prompting = agent.request("session/prompt", { sessionId: session.sessionId, prompt: [{ type: "text", text: prompt }] });
      const [reply] = await Promise.all([prompting, during?.({ agent, sessionId: session.sessionId })]);
      return { stopReason: reply.stopReason, sessionId: session.sessionId };
    });
    const result = await Promise.race([turn, timedOut]);
    return { ...result, updates, permissionRequests, stderr };
  } catch (error) {
    error.message += `\n--- agent stderr ---\n${stderr.slice(-4000)}`;
    throw error;
  } finally {
    clearTimeout(timer);
    child.stdin.end();
    try {
      process.kill(-child.pid, "SIGTERM");
    } catch {
      // already gone
    }
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5_000))]);
    try {
      process.kill(-child.pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
}

/** The final state of one tool call from the session's updates: `{ status, content, rawInput, kind }`. */
export function toolCallState(updates, toolCallId) {
  const state = {};
  for (const update of updates) {
    if ((update.sessionUpdate === "tool_call" || update.sessionUpdate === "tool_call_update") && update.toolCallId === toolCallId) {
      for (const [key, value] of Object.entries(update)) if (value !== undefined && value !== null) state[key] = value;
    }
  }
  return state;
}
