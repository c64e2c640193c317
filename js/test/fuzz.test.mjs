// Every bad input gets a JSON-RPC error with its status, never a 500 or a crash: documented
// requests mutated member by member (deterministically) through the server core.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as a2a from "../dist/index.js";
import { examples } from "./helpers.mjs";

const EX = examples();
const VALUES = [null, true, 0, -1, 1.5, 2 ** 53, "", "x", "A".repeat(43), [], [1], {}, { a: 1 }, "e30.e30.AA", "sha256:" + "0".repeat(64)];

function* mutations(obj, path = []) {
  if (obj === null || typeof obj !== "object") return;
  for (const k of Object.keys(obj)) {
    for (const v of VALUES) yield [[...path, k], v];
    yield [[...path, k], undefined];
    yield* mutations(obj[k], [...path, k]);
  }
  if (!Array.isArray(obj)) yield [[...path, "extra"], 1];
}

function mutate(obj, path, value) {
  const out = structuredClone(obj);
  let o = out;
  for (const k of path.slice(0, -1)) o = o[k];
  if (value === undefined) delete o[path[path.length - 1]];
  else o[path[path.length - 1]] = value;
  return out;
}

test("mutated handshake and intent messages: always a JSON-RPC error with a 4xx status, or a success", async () => {
  const core = new a2a.ServerCore({ identity: a2a.Identity.generate("fuzz") });
  a2a.registerTestAgent(core);
  const bodies = [
    ["/a2a/handshake", EX.hello.json], ["/a2a/handshake", EX.proof.json], ["/a2a/handshake", EX["accept-policy"].json],
    ["/a2a/intent", EX["intent-request"].json], ["/a2a/intent", EX["close-request"].json], ["/a2a/intent", EX["sealed-intent-request"].json],
    ["/a2a/intent", EX["delegation-request"].json],
  ];
  let n = 0;
  for (const [path, body] of bodies) {
    for (const [where, value] of mutations(body)) {
      const reply = await core.handle(path, Buffer.from(JSON.stringify(mutate(body, where, value))));
      n++;
      assert.ok("body" in reply, where.join("."));
      assert.ok(reply.status < 500, `${where.join(".")} = ${JSON.stringify(value)}: ${reply.status} ${reply.body}`);
      const j = JSON.parse(reply.body);
      assert.equal(j.jsonrpc, "2.0");
      assert.ok("error" in j || "result" in j);
    }
  }
  for (const raw of ["", "\xff", "{\"a\":" + "[".repeat(40), "[]", "1e999", '"\\ud800"', "{}".repeat(3)]) {
    const reply = await core.handle("/a2a/intent", Buffer.from(raw, "latin1"));
    assert.ok(reply.status === 400, raw);
  }
  assert.ok(n > 1000, `${n} mutations`);
});
