/**
 * The README's Vercel AI SDK example, run as it is written: the `ts` block that imports
 * `approval-broker/ai-sdk` is saved inside this package (so `approval-broker/*`, `ai` and `zod`
 * resolve as they do for a user who installed them) and run with Node 22 against a real broker,
 * in a directory holding the `README.md` the approver's edit points at, while the test plays
 * the approver. The one change: `@ai-sdk/openai` resolves to an `ai/test` mock model
 * (tests/ai/openai-mock.ts, loaded with `--import`). Its output is compared with the `text` block
 * that follows it; the broker holds no call pending afterwards. The process must exit on its
 * own after `close()`.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { promisify } from "node:util";
import { approveWhenPending, BrokerProcess, pendingCalls, REPO } from "../broker.js";

const PACKAGE = join(REPO, "clients", "typescript");

/** The `ts` block holding `marker`, and the first `text` block after it. */
function example(markdown: string, marker: string): { code: string; output: string } {
  const blocks = [...markdown.matchAll(/```(\w+)\n([\s\S]*?)```/g)].map((m) => ({ fence: m[1], body: m[2] ?? "" }));
  const at = blocks.findIndex((b) => b.fence === "ts" && b.body.includes(marker));
  assert.ok(at >= 0, `the README has no \`\`\`ts block with ${marker}`);
  const output = blocks.slice(at + 1).find((b) => b.fence === "text");
  assert.ok(output, `the README shows no output after its ${marker} example`);
  return { code: blocks[at]?.body ?? "", output: output.body };
}

test("the README's Vercel AI SDK example runs as written (the model mocked) and prints what the README shows", async () => {
  const { code, output } = example(readFileSync(join(PACKAGE, "README.md"), "utf8"), 'from "approval-broker/ai-sdk"');
  const file = join(PACKAGE, ".test-build", "readme-ai-sdk-example.mjs");
  // The example is plain ECMAScript (no type annotations), so Node runs it as it is.
  writeFileSync(file, code);
  const workdir = mkdtempSync(join(tmpdir(), "approval-broker-ai-readme-"));
  writeFileSync(join(workdir, "README.md"), "Read me first.\n");
  const broker = await BrokerProcess.started();
  try {
    const approving = approveWhenPending(broker, "conversation-43", [
      { callId: "call_2", approve: true, editedInputJson: '{"path": "README.md"}' },
      { callId: "call_1", approve: false, reason: "not on the build machine" },
    ]);
    const mock = pathToFileURL(join(PACKAGE, ".test-build", "tests", "ai", "openai-mock.js")).href;
    const run = promisify(execFile)(process.execPath, ["--import", mock, file], {
      cwd: workdir,
      env: { ...process.env, APPROVAL_BROKER: broker.target },
      timeout: 60_000,
    });
    await approving;
    const { stdout } = await run;
    assert.equal(stdout, output);
    assert.deepEqual(await pendingCalls(broker, "conversation-43"), []);
  } finally {
    await broker.dispose();
    rmSync(workdir, { recursive: true, force: true });
  }
});
