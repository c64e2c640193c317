/** The test agent of PROTOCOL.md §11: `echo`, streamed `count`, and each goal the policy's
 * `delegation` member reserves, answered like `echo`. */
import { exactMembers, isInt, type Json, type JsonObject } from "../encoding.js";
import { InvalidParams } from "../errors.js";
import type { ServerCore } from "./core.js";
import { sleep } from "./core.js";

export async function echo(inputs: JsonObject): Promise<Json> {
  return inputs;
}

export async function* count(inputs: JsonObject): AsyncGenerator<Json> {
  if (!exactMembers(inputs, ["n"], ["delay_ms"])) throw new InvalidParams("count takes exactly n and optionally delay_ms");
  const n = inputs.n;
  const delay = inputs.delay_ms ?? 0;
  if (!isInt(n, 1, 50)) throw new InvalidParams("count n must be an integer in 1..50");
  if (!isInt(delay, 0, 1000)) throw new InvalidParams("count delay_ms must be an integer in 0..1000");
  for (let i = 0; i < n; i++) {
    if (i && delay) await sleep(delay);
    yield { i };
  }
}

export function registerTestAgent(server: ServerCore): void {
  server.add("echo", echo);
  server.addStream("count", count);
  for (const goal of server.delegation?.required.keys() ?? []) if (goal !== "echo" && goal !== "count") server.add(goal, echo);
}
