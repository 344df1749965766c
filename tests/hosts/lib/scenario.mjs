// One scripted turn with a real host, as every host's suite runs it: a fresh HOME and workspace,
// a scripted model server that asks for one shell command writing `ran.txt`, the host run to its
// end while the test plays the approver (waits for the call to be pending at the broker, then
// decides it), and what happened: the run, the pending call the approver saw, the file's
// content (undefined when the command did not run) and the tool results the model read.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Script } from "./models/server.mjs";
import { testDirectories } from "./run.mjs";

/**
 * `host(dirs, { model, broker, wait })` runs the host (`wait`: the hook's `--timeout`); `model(script)` starts its scripted model
 * server; `tool` and `input(command)` say how that host's model asks for a shell command;
 * `approver(call)` decides the pending call (none: nobody decides, e.g. the broker is down).
 */
export async function shellScenario({ broker, brokerUrl = broker.url, wait, name, host, model, tool, input, callId, command, approver, prepare }) {
  const dirs = testDirectories(name);
  const script = new Script({ tool, input: input(command), callId, text: "Finished." });
  const server = await model(script);
  try {
    prepare?.(dirs);
    let seen;
    let finished;
    const running = host(dirs, { model: server.url, broker: brokerUrl, wait }).then((run) => {
      finished = run;
      return run;
    });
    // Waiting for the call ends when the host exits first (its hook never asked).
    const exitedFirst = () =>
      finished === undefined
        ? undefined
        : `${name} exited (${finished.code}) first; the model read ${JSON.stringify(script.toolResults)}\n--- stdout ---\n${finished.stdout.slice(-3000)}\n--- stderr ---\n${finished.stderr.slice(-3000)}`;
    const decided = approver
      ? broker
          .waitForPendingWhere((call) => call.inputJson.includes(command), `${name}: ${command}`, 120_000, exitedFirst)
          .then((call) => {
            seen = call;
            return approver(call);
          })
      : Promise.resolve();
    // The host's run ends either way; a failed decision is reported after it.
    const [run, decision] = await Promise.all([running, decided.catch((e) => e)]);
    if (decision instanceof Error) throw decision;
    const ranFile = join(dirs.workspace, "ran.txt");
    return {
      run,
      script,
      call: seen,
      decision,
      workspace: dirs.workspace,
      ran: existsSync(ranFile) ? readFileSync(ranFile, "utf8") : undefined,
      requests: server.requests,
    };
  } finally {
    await server.close();
    dirs.remove();
  }
}

/** The pending call's input with its `command` replaced: an approver's edit of a shell call. */
export function withCommand(call, command) {
  return { ...JSON.parse(call.inputJson), command };
}
