/**
 * The README's example, run as it is written: its first `ts` block is saved inside this package
 * (so `approval-broker/node` resolves to this package's build, as it does for a user who
 * installed it), run with Node against a real broker while the test plays the approver, and its
 * output compared with the README's output block. The process must exit on its own after
 * `close()`.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import { approveWhenPending, BrokerProcess, REPO } from "./broker.js";

const PACKAGE = join(REPO, "clients", "typescript");

function block(markdown: string, fence: string, index = 0): string {
  const blocks = [...markdown.matchAll(new RegExp(`\`\`\`${fence}\\n([\\s\\S]*?)\`\`\``, "g"))].map((m) => m[1] ?? "");
  const found = blocks[index];
  assert.ok(found !== undefined, `the README has no \`\`\`${fence} block #${index}`);
  return found;
}

test("the README's example runs as written and prints what the README shows", async () => {
  const readme = readFileSync(join(PACKAGE, "README.md"), "utf8");
  const example = block(readme, "ts");
  const expected = block(readme, "text");
  const file = join(PACKAGE, ".test-build", "readme-example.mjs");
  // The example is plain ECMAScript (no type annotations), so Node runs it as it is.
  writeFileSync(file, example);
  const process_ = await BrokerProcess.started();
  try {
    const approving = approveWhenPending(process_.target, "conversation-42", [
      { callId: "toolu_02", approve: true, editedInputJson: '{"path": "README.md"}' },
      { callId: "toolu_01", approve: false, reason: "not on the build machine" },
    ]);
    const run = promisify(execFile)(process.execPath, [file], {
      env: { ...process.env, APPROVAL_BROKER: process_.target },
      timeout: 60_000,
    });
    await approving;
    const { stdout } = await run;
    assert.equal(stdout, expected);
  } finally {
    await process_.dispose();
  }
});
