// Why this exists: the TypeScript client (clients/typescript, built to dist/) as an agent that is a
// service client of a real OpenID provider, driven by agents.test.mjs. It reviews calls with
// `ClientCredentials` across its token's expiry and then with the provider stopped, printing one
// JSON line per step; the test approves the calls, stops the provider when told, and checks the
// lines. Settings come from the environment, as for agents_client.py.

import { createInterface } from "node:readline";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const { ClientCredentials, connectBroker, TokenUnavailable } = await import(
  pathToFileURL(join(ROOT, "clients/typescript/dist/node.js")).href
);

const say = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

const env = process.env;
const ttlMs = Number(env.TTL) * 1000;
const source = new ClientCredentials({
  tokenUrl: env.TOKEN_URL,
  clientId: env.CLIENT_ID,
  clientSecretFile: env.SECRET_FILE,
  scope: env.SCOPE,
  resource: env.RESOURCE,
});
const session = `ts-${Date.now()}`;

async function review(callId) {
  const broker = connectBroker(env.BROKER, { token: source, unavailableTimeoutMs: 5_000 });
  try {
    const [outcome] = await broker.review(session, [{ callId, tool: "read_file", input: { path: callId } }], { timeoutMs: 30_000 });
    return outcome.status;
  } finally {
    await broker.close();
  }
}

say({ step: "first", status: await review("c1"), requests: source.requests });
await sleep(ttlMs * 0.85);
say({ step: "renewed", status: await review("c2"), requests: source.requests });
say({ step: "stop-provider" });
await lines.next();
say({ step: "cached", status: await review("c3"), requests: source.requests });
await sleep(ttlMs * 1.1);
try {
  say({ step: "expired", status: await review("c4"), error: null });
} catch (e) {
  if (!(e instanceof TokenUnavailable)) throw e;
  say({ step: "expired", status: null, error: e.name, message: e.message });
}
process.exit(0);
