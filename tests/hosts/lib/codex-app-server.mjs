// Codex's app server (`codex app-server`, JSON-RPC lines on standard I/O), played as an IDE would
// drive it, for what `codex exec` cannot show: Codex asking for approval (`approvalPolicy:
// "on-request"`), which its `PermissionRequest` hook answers before any client is asked. The app
// server has no `--dangerously-bypass-hook-trust`: the hooks are trusted as Codex's own hook
// review does it (`hooks/list`, then `config/batchWrite` of each hook's trusted hash). Any
// approval request that still reaches this client is declined and kept, so a test can say none
// came.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

export async function codexAppServerTurn({ command, cwd, env, prompt, timeoutMs = 180_000 }) {
  const child = spawn(command, ["app-server"], { cwd, env, stdio: ["pipe", "pipe", "pipe"], detached: true });
  let stderr = "";
  child.stderr.on("data", (chunk) => {
    stderr += chunk;
  });
  const pending = new Map();
  const notifications = [];
  const approvalRequests = [];
  let nextId = 1;
  let turnDone;
  const turnCompleted = new Promise((resolveTurn) => {
    turnDone = resolveTurn;
  });
  const send = (message) => child.stdin.write(`${JSON.stringify(message)}\n`);
  const request = (method, params) =>
    new Promise((resolveRequest, reject) => {
      const id = nextId++;
      pending.set(id, { resolve: resolveRequest, reject, method });
      send({ id, method, params });
    });
  createInterface({ input: child.stdout }).on("line", (line) => {
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      return;
    }
    if (message.id !== undefined && message.method === undefined) {
      const waiter = pending.get(message.id);
      pending.delete(message.id);
      if (!waiter) return;
      if (message.error) waiter.reject(new Error(`${waiter.method}: ${JSON.stringify(message.error)}`));
      else waiter.resolve(message.result);
    } else if (message.id !== undefined) {
      // A request from the server: an approval the hooks left to the client. Declined.
      approvalRequests.push(message);
      send({ id: message.id, result: { decision: "decline" } });
    } else {
      notifications.push(message);
      if (message.method === "turn/completed") turnDone();
    }
  });
  let timer;
  const timedOut = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`codex app-server: the turn did not end within ${timeoutMs / 1000}s\n${stderr.slice(-3000)}`)), timeoutMs);
  });
  try {
    const work = (async () => {
      await request("initialize", { clientInfo: { name: "approval-broker-host-tests", title: null, version: "0.0.0" }, capabilities: { experimentalApi: true } });
      send({ method: "initialized" });
      const listed = await request("hooks/list", { cwds: [cwd] });
      const edits = [];
      for (const entry of listed.data) {
        for (const hook of entry.hooks) {
          if (hook.trustStatus !== "trusted" && hook.key && hook.currentHash) {
            edits.push({ keyPath: `hooks.state."${hook.key}".trusted_hash`, value: hook.currentHash, mergeStrategy: "upsert" });
          }
        }
      }
      if (edits.length > 0) await request("config/batchWrite", { edits, reloadUserConfig: true });
      const thread = await request("thread/start", { cwd, approvalPolicy: "on-request", sandbox: "workspace-write" });
      await request("turn/start", { threadId: thread.thread.id, input: [{ type: "text", text: prompt, text_elements: [] }] });
      await turnCompleted;
      return { trusted: edits.length, hooks: listed.data };
    })();
    const result = await Promise.race([work, timedOut]);
    return { ...result, notifications, approvalRequests, stderr };
  } finally {
    clearTimeout(timer);
    child.stdin.end();
    try {
      process.kill(-child.pid, "SIGTERM");
    } catch {
      // already gone
    }
  }
}
