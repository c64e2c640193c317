// Interoperability both ways with the Python SDK, through both real CLIs on 127.0.0.1:
// the TypeScript client against `a2a-secure serve`, the Python client against
// `a2a-secure-js serve`. Each feature has a negative case. Skipped (with the reason) when
// the Python SDK is not importable; failing instead when A2A_SECURE_REQUIRE_PYTHON=1.
import assert from "node:assert/strict";
import { execFile, spawn, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { JS_ROOT, REPO } from "./helpers.mjs";
import * as a2a from "../dist/index.js";

const PY = process.env.A2A_SECURE_PYTHON || "python3";
// The Python SDK's sources: this repository's, unless A2A_SECURE_PYTHON_SOURCE names another checkout.
const PY_SOURCE = process.env.A2A_SECURE_PYTHON_SOURCE || REPO;
const PY_ENV = { ...process.env, PYTHONPATH: PY_SOURCE + (process.env.PYTHONPATH ? `:${process.env.PYTHONPATH}` : "") };
const BIN = join(JS_ROOT, "bin", "a2a-secure.js");

function pythonReason() {
  const r = spawnSync(PY, ["-c", "import a2a_secure.cli, a2a_secure.server.run"], { env: PY_ENV, encoding: "utf8", timeout: 60_000 });
  if (r.error) return `no Python at ${PY} (${r.error.message}); set A2A_SECURE_PYTHON`;
  if (r.status !== 0) return `a2a_secure is not importable by ${PY}: ${r.stderr.trim().split("\n").pop()}`;
  return null;
}
const reason = pythonReason();
if (reason && process.env.A2A_SECURE_REQUIRE_PYTHON === "1") throw new Error(`A2A_SECURE_REQUIRE_PYTHON=1 but ${reason}`);
const skip = reason ? `the Python SDK is needed: ${reason}` : false;

/** Whether the Python package holds `text` in its sources (a feature not yet landed there). */
function pythonHas(text) {
  const r = spawnSync("grep", ["-rqF", text, join(PY_SOURCE, "a2a_secure")]);
  return r.status === 0;
}

const dir = mkdtempSync(join(tmpdir(), "a2a-interop-"));
const procs = [];

function run(cmd, args, env = process.env) {
  return new Promise((resolve) => {
    execFile(cmd, args, { env, timeout: 60_000, maxBuffer: 1 << 22 }, (err, stdout, stderr) => {
      resolve({ code: err ? (typeof err.code === "number" ? err.code : 1) : 0, stdout, stderr });
    });
  });
}
const ts = (...args) => run(process.execPath, [BIN, ...args]);
const py = (...args) => run(PY, ["-m", "a2a_secure", ...args], PY_ENV);
const pyClient = (spec) => run(PY, [join(JS_ROOT, "test", "py_client.py"), JSON.stringify(spec)], PY_ENV);

async function freePort() {
  const s = createServer();
  await new Promise((r) => s.listen(0, "127.0.0.1", r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  return port;
}

async function waitCard(url, proc) {
  for (let i = 0; i < 300; i++) {
    if (proc.exitCode !== null) throw new Error(`server exited: ${proc.stderrText}`);
    try {
      const r = await fetch(`${url}/.well-known/agent-card.json`);
      if (r.ok) return await r.json();
    } catch {
      /* not up yet */
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`no card at ${url}: ${proc.stderrText}`);
}

/** Start a server CLI (`which` "py" or "ts") with a policy object; its URL, DID and card. */
async function serve(which, keyFile, policy, extra = []) {
  const port = await freePort();
  const args = ["serve", "--key-file", keyFile, "--host", "127.0.0.1", "--port", String(port), ...extra];
  if (policy) {
    const p = join(dir, `policy-${which}-${port}.json`);
    writeFileSync(p, JSON.stringify(policy));
    args.push("--policy", p);
  }
  const env = { ...PY_ENV, PYTHONPATH: `${PY_ENV.PYTHONPATH}:${join(JS_ROOT, "test")}` };
  const proc = which === "py" ? spawn(PY, ["-m", "a2a_secure", ...args], { env }) : spawn(process.execPath, [BIN, ...args]);
  proc.stderrText = "";
  proc.stderr.on("data", (d) => (proc.stderrText += d));
  procs.push(proc);
  const url = `http://127.0.0.1:${port}`;
  const card = await waitCard(url, proc);
  return { url, did: card.did, card, proc };
}

async function keygen(name) {
  const f = join(dir, `${name}.json`);
  const r = await ts("keygen", "--out", f, "--agent-id", name);
  assert.equal(r.code, 0, r.stderr);
  return { file: f, did: r.stdout.trim().split("\n").pop() };
}

/** A proxy to `target` that rewrites the bodies of replies (an attacker on the path). */
async function proxy(target, alter) {
  const server = createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const r = await fetch(target + req.url, { method: req.method, headers: { "content-type": req.headers["content-type"] ?? "application/json" }, body: req.method === "POST" ? Buffer.concat(chunks) : undefined });
    const text = alter(await r.text(), req.url);
    res.writeHead(r.status, { "content-type": r.headers.get("content-type") ?? "application/json" });
    res.end(text);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  procs.push({ kill: () => server.close() });
  return `http://127.0.0.1:${server.address().port}`;
}

const json = (r) => JSON.parse(r.stdout);

after(() => {
  for (const p of procs) p.kill("SIGTERM");
});

describe("TypeScript client -> Python `a2a-secure serve`", { skip }, () => {
  let me, pyKey, srv, plain;
  before(async () => {
    me = await keygen("ts-client");
    pyKey = await keygen("py-server");
    [srv, plain] = await Promise.all([
      serve("py", pyKey.file, { sealed_intents: true }, ["--audit-log", join(dir, "py-audit.jsonl")]),
      serve("py", pyKey.file, { sealed_intents: false, allowed_intents: ["echo"] }),
    ]);
  });
  const call = (s, ...args) => ts("call", "--key-file", me.file, "--to", s.did, "--endpoint", s.url, ...args);

  test("base protocol: echo verified; a handler's refusal is a signed error, exit 1", async () => {
    const r = await call(srv, "--goal", "echo", "--inputs", '{"text":"héllo","n":[1,2.5,null]}');
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(json(r), { text: "héllo", n: [1, 2.5, null] });
    const bad = await call(srv, "--goal", "count", "--inputs", '{"n":0}');
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /count n must be an integer in 1\.\.50 \(-32602, signed\)/);
  });

  test("policy: a goal the session policy does not allow is refused", async () => {
    const r = await call(plain, "--goal", "count", "--inputs", '{"n":1}');
    assert.equal(r.code, 1);
    assert.match(r.stderr, /-32602|-32042/);
  });

  test("streams: count's events verified in order; a bad count is refused before any event", async () => {
    const r = await call(srv, "--goal", "count", "--inputs", '{"n":4,"delay_ms":5}', "--stream");
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(json(r), [{ i: 0 }, { i: 1 }, { i: 2 }, { i: 3 }]);
    const bad = await call(srv, "--goal", "count", "--inputs", '{"n":51}', "--stream");
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /signed/);
  });

  test("priority: 2 within the default right; 5 refused by the server, signed -32042", async () => {
    assert.equal((await call(srv, "--goal", "echo", "--inputs", "{}", "--priority", "2")).code, 0);
    const r = await call(srv, "--goal", "echo", "--inputs", "{}", "--priority", "5");
    assert.equal(r.code, 1);
    assert.match(r.stderr, /-32042, signed/);
  });

  test("intent_id: a second process resending the id gets the first answer; other inputs under it: signed -32044", async () => {
    const id = "ts-interop-" + Date.now().toString(36).padStart(12, "0");
    const a = await call(srv, "--goal", "echo", "--inputs", '{"book":"room 4"}', "--intent-id", id);
    const b = await call(srv, "--goal", "echo", "--inputs", '{"book":"room 4"}', "--intent-id", id);
    assert.equal(a.code, 0, a.stderr);
    assert.equal(b.code, 0, b.stderr);
    assert.deepEqual(json(b), json(a));
    const c = await call(srv, "--goal", "echo", "--inputs", '{"book":"room 5"}', "--intent-id", id);
    assert.equal(c.code, 1);
    assert.match(c.stderr, /intent_id already used for a different intent \(-32044, signed\)/);
  });

  test("sealed: --sealed works with a server that declares it, and is refused before sending to one that does not", async () => {
    assert.ok(srv.card.a2a_secure_extensions.includes("sealed"));
    const r = await call(srv, "--goal", "echo", "--inputs", '{"secret":"merger"}', "--sealed");
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(json(r), { secret: "merger" });
    const refused = await call(plain, "--goal", "echo", "--inputs", '{"secret":"merger"}', "--sealed");
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /does not declare sealed intents/);
  });

  test("require_sealed: a session without seal keys gets the Python server's signed refusal, verified here; a sealed one opens", async (t) => {
    if (!pythonHas("require_sealed")) return t.skip("the Python server has no `require_sealed` yet (cross-branch agreement 3)");
    const strict = await serve("py", pyKey.file, { require_sealed: true });
    const id = a2a.Identity.load(me.file);
    await assert.rejects(new a2a.Client(id, { sealed: false }).connect(strict.did, strict.url),
      (e) => e.code === -32042 && e.signed === true && /sealed intents required/.test(e.message));
    const s = await new a2a.Client(id).connect(strict.did, strict.url);
    assert.equal(s.sealed, true);
  });

  test("sealed: the inputs never cross the wire in the clear", async () => {
    let seen = "";
    const spy = createServer(async (req, res) => {
      const chunks = [];
      for await (const c of req) chunks.push(c);
      seen += Buffer.concat(chunks).toString();
      const r = await fetch(srv.url + req.url, { method: req.method, headers: { "content-type": "application/json" }, body: req.method === "POST" ? Buffer.concat(chunks) : undefined });
      const text = await r.text();
      seen += text;
      res.writeHead(r.status, { "content-type": r.headers.get("content-type") });
      res.end(text);
    });
    await new Promise((r) => spy.listen(0, "127.0.0.1", r));
    try {
      const r = await ts("call", "--key-file", me.file, "--to", srv.did, "--endpoint", `http://127.0.0.1:${spy.address().port}`, "--goal", "echo", "--inputs", '{"secret":"the-merger-closes"}', "--sealed");
      assert.equal(r.code, 0, r.stderr);
      assert.match(seen, /"sealed":"/);
      assert.doesNotMatch(seen, /the-merger-closes/);
    } finally {
      spy.close();
    }
  });

  test("extensions come only from the authenticated card: an altered card declares nothing", async () => {
    const altered = await proxy(srv.url, (body, path) => (path.includes("agent-card") ? body.replace('"name":', '"name2":"x","name":') : body));
    const r = await ts("call", "--key-file", me.file, "--to", srv.did, "--endpoint", altered, "--goal", "echo", "--inputs", "{}", "--priority", "2");
    assert.equal(r.code, 1);
    assert.match(r.stderr, /does not declare priority \(-32602\)/);
  });

  test("tampered answers are refused (-32040), the genuine ones through the same proxy accepted", async () => {
    const honest = await proxy(srv.url, (b) => b);
    assert.equal((await ts("call", "--key-file", me.file, "--to", srv.did, "--endpoint", honest, "--goal", "echo", "--inputs", '{"v":1}', "--sealed")).code, 0);
    const evil = await proxy(plain.url, (b) => b.replace('"amount":10', '"amount":99'));
    const r = await ts("call", "--key-file", me.file, "--to", plain.did, "--endpoint", evil, "--goal", "echo", "--inputs", '{"amount":10}');
    assert.equal(r.code, 1);
    assert.match(r.stderr, /-32040/);
  });

  test("tampered stream events are refused (-32040)", async () => {
    const open = await serve("py", pyKey.file, { sealed_intents: false });
    const evil2 = await proxy(open.url, (b) => b.replace('"result":{"i":1}', '"result":{"i":7}'));
    const r = await ts("call", "--key-file", me.file, "--to", open.did, "--endpoint", evil2, "--goal", "count", "--inputs", '{"n":3}', "--stream");
    assert.equal(r.code, 1);
    assert.match(r.stderr, /-32040/);
    const honest = await proxy(open.url, (b) => b);
    const ok = await ts("call", "--key-file", me.file, "--to", open.did, "--endpoint", honest, "--goal", "count", "--inputs", '{"n":3}', "--stream");
    assert.equal(ok.code, 0, ok.stderr);
  });

  test("audit: the Python server's log verifies with the TypeScript verifier; a changed line does not", async () => {
    assert.equal((await call(srv, "--goal", "echo", "--inputs", "{}")).code, 0);
    const log = join(dir, "py-audit.jsonl");
    const r = await ts("audit", "verify", log);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    assert.ok(json(r).lines >= 4);
    const copy = join(dir, "py-audit-changed.jsonl");
    writeFileSync(copy, readFileSync(log, "utf8").replace('"event":"hello"', '"event":"proof"'));
    assert.equal((await ts("audit", "verify", copy)).code, 1);
  });

  async function delegationCase(del, tag) {
    const person = await keygen(`person-${tag}`);
    const chainFile = join(dir, `chain-ts-${tag}.json`);
    const d = await ts("delegate", "--key-file", person.file, "--to", me.did, "--goals", "echo", "--ttl", "1h", "--target", del.did, "--out", chainFile);
    assert.equal(d.code, 0, d.stderr);
    const ok = await ts("call", "--key-file", me.file, "--to", del.did, "--endpoint", del.url, "--goal", "echo", "--inputs", '{"x":1}', "--on-behalf-of", chainFile);
    assert.equal(ok.code, 0, ok.stderr);
    assert.deepEqual(json(ok), { x: 1 });
    // Refused by the client before sending (-32602): the chain does not cover count.
    const out = await ts("call", "--key-file", me.file, "--to", del.did, "--endpoint", del.url, "--goal", "count", "--inputs", '{"n":1}', "--on-behalf-of", chainFile);
    assert.equal(out.code, 1);
    assert.match(out.stderr, /outside the delegated goals/);
    // A chain delegated to someone else is refused too (its last audience is not this client).
    const other = await keygen(`other-${tag}`);
    const foreign = join(dir, `chain-foreign-${tag}.json`);
    assert.equal((await ts("delegate", "--key-file", person.file, "--to", other.did, "--goals", "echo", "--ttl", "1h", "--out", foreign)).code, 0);
    const bad = await ts("call", "--key-file", me.file, "--to", del.did, "--endpoint", del.url, "--goal", "echo", "--inputs", "{}", "--on-behalf-of", foreign);
    assert.equal(bad.code, 1);
    // A chain whose leaf was altered on the way fails its signature at the Python server (signed -32042).
    const tokens = JSON.parse(readFileSync(chainFile, "utf8"));
    const [h, p] = tokens[0].split(".");
    const forged = join(dir, `chain-forged-${tag}.json`);
    writeFileSync(forged, JSON.stringify([`${h}.${p}.${"A".repeat(86)}`]));
    const f = await ts("call", "--key-file", me.file, "--to", del.did, "--endpoint", del.url, "--goal", "echo", "--inputs", "{}", "--on-behalf-of", forged);
    assert.equal(f.code, 1);
    assert.match(f.stderr, /-32042, signed/);
  }

  test("delegation: a chain from the TypeScript CLI accepted by a Python server that accepts chains; refusals", async () => {
    const del = await serve("py", pyKey.file, { sealed_intents: false }, ["--app", "py_delegation_app:app"]);
    assert.ok(del.card.a2a_secure_extensions.includes("delegation"));
    await delegationCase(del, "app");
  });

  test("delegation: the policy member `delegation` of `a2a-secure serve` (cross-branch agreement 5)", async (t) => {
    const del = await serve("py", pyKey.file, { sealed_intents: false, delegation: {} }).catch((e) => ({ error: e }));
    if (del.error || !del.card.a2a_secure_extensions?.includes("delegation"))
      return t.skip("the Python `serve --policy` does not read the `delegation` member yet (cross-branch agreement 5)");
    await delegationCase(del, "policy");
  });

  test("delegation on a sealed session: the chain travels sealed to the Python server (cross-branch agreement 4)", async (t) => {
    if (!pythonHas("sealed_delegation")) return t.skip("the Python server does not take `sealed_delegation` yet (cross-branch agreement 4)");
    const del = await serve("py", pyKey.file, { sealed_intents: true }, ["--app", "py_delegation_app:app"]);
    assert.ok(del.card.a2a_secure_extensions.includes("sealed"));
    await delegationCase(del, "sealed");
  });
});

describe("Python client -> TypeScript `a2a-secure-js serve`", { skip }, () => {
  let me, tsKey, srv, plain, person, del, sealedDel;
  before(async () => {
    me = await keygen("py-client");
    tsKey = await keygen("ts-server");
    person = await keygen("principal");
    [srv, plain, del, sealedDel] = await Promise.all([
      serve("ts", tsKey.file, undefined, ["--audit-log", join(dir, "ts-audit.jsonl")]),
      serve("ts", tsKey.file, { sealed_intents: false, allowed_intents: ["echo"] }),
      serve("ts", tsKey.file, { sealed_intents: false, delegation: { calendar: [person.did] } }),
      serve("ts", tsKey.file, { delegation: { calendar: [person.did] } }),
    ]);
  });
  const call = (s, ...args) => py("call", "--key-file", me.file, "--to", s.did, "--endpoint", s.url, ...args);

  test("base protocol: echo verified by the Python client; a refusal exits 1", async () => {
    const r = await call(srv, "--goal", "echo", "--inputs", '{"text":"héllo","n":[1,2.5,null]}');
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(json(r), { text: "héllo", n: [1, 2.5, null] });
    const bad = await call(srv, "--goal", "count", "--inputs", '{"n":0}');
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /count n must be an integer in 1\.\.50/);
    const refused = await call(plain, "--goal", "count", "--inputs", '{"n":1}');
    assert.equal(refused.code, 1, "the session policy allows only echo");
  });

  test("streams: the Python client verifies the TypeScript server's events; a bad count is refused", async () => {
    const r = await pyClient({ key_file: me.file, to: srv.did, endpoint: srv.url, goal: "count", inputs: { n: 3, delay_ms: 5 }, stream: true });
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(json(r), [{ i: 0 }, { i: 1 }, { i: 2 }]);
    const whole = await call(srv, "--goal", "count", "--inputs", '{"n":2}');
    assert.deepEqual(json(whole), [{ i: 0 }, { i: 1 }], "without stream: the array of partial results");
    const bad = await pyClient({ key_file: me.file, to: srv.did, endpoint: srv.url, goal: "count", inputs: { n: 2, extra: 1 }, stream: true });
    assert.equal(bad.code, 1);
    assert.equal(JSON.parse(bad.stderr).code, -32602);
    assert.equal(JSON.parse(bad.stderr).signed, true);
  });

  test("priority: 2 runs; 5 is above the caller's right, a signed -32042", async () => {
    assert.equal((await call(srv, "--goal", "echo", "--inputs", "{}", "--priority", "2")).code, 0);
    const r = await call(srv, "--goal", "echo", "--inputs", "{}", "--priority", "5");
    assert.equal(r.code, 1);
    assert.match(r.stderr, /priority 5 is above/);
  });

  test("intent_id: a second Python process with the same id gets the first answer; other inputs: signed -32044", async () => {
    const id = "py-interop-" + Date.now().toString(36).padStart(12, "0");
    const spec = { key_file: me.file, to: srv.did, endpoint: srv.url, goal: "echo", inputs: { book: "room 4" }, intent_id: id };
    const a = await pyClient(spec);
    const b = await pyClient(spec);
    assert.equal(a.code, 0, a.stderr);
    assert.equal(b.code, 0, b.stderr);
    assert.deepEqual(json(a), json(b));
    const c = await pyClient({ ...spec, inputs: { book: "room 5" } });
    assert.equal(c.code, 1);
    assert.deepEqual(JSON.parse(c.stderr), { code: -32044, signed: true, message: "intent_id already used for a different intent" });
  });

  test("sealed: declared by default and used by `call --sealed`; refused before sending when the policy turns it off", async () => {
    assert.deepEqual(srv.card.a2a_secure_extensions, ["intent_id", "priority", "sealed"]);
    const r = await call(srv, "--goal", "echo", "--inputs", '{"secret":"merger"}', "--sealed");
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(json(r), { secret: "merger" });
    assert.ok(!plain.card.a2a_secure_extensions.includes("sealed"));
    const refused = await call(plain, "--goal", "echo", "--inputs", "{}", "--sealed");
    assert.equal(refused.code, 1);
  });

  test("require_sealed: the Python client without seal keys is refused, with seal keys served", async () => {
    const strict = await serve("ts", tsKey.file, { require_sealed: true });
    const refused = await pyClient({ key_file: me.file, to: strict.did, endpoint: strict.url, goal: "echo", inputs: {}, sealed: false });
    assert.equal(refused.code, 1);
    const err = JSON.parse(refused.stderr);
    assert.equal(err.code, -32042);
    assert.match(err.message, /sealed intents required/);
    if (pythonHas("refusal_jws")) assert.equal(err.signed, true, "the Python client verifies the refusal's signature");
    const ok = await pyClient({ key_file: me.file, to: strict.did, endpoint: strict.url, goal: "echo", inputs: { a: 1 } });
    assert.equal(ok.code, 0, ok.stderr);
  });

  test("delegation: a Python chain for a reserved goal runs; without it, or from another principal, signed -32042", async () => {
    const chainFile = join(dir, "chain-py.json");
    const d = await py("delegate", "--key-file", person.file, "--to", me.did, "--goals", "calendar,echo", "--ttl", "1h", "--out", chainFile);
    assert.equal(d.code, 0, d.stderr);
    const ok = await call(del, "--goal", "calendar", "--inputs", '{"event":"dentist"}', "--on-behalf-of", chainFile);
    assert.equal(ok.code, 0, ok.stderr);
    assert.deepEqual(json(ok), { event: "dentist" });
    const none = await call(del, "--goal", "calendar", "--inputs", "{}");
    assert.equal(none.code, 1);
    assert.match(none.stderr, /runs only on behalf of a principal/);
    const stranger = await keygen("stranger");
    const other = join(dir, "chain-other.json");
    assert.equal((await py("delegate", "--key-file", stranger.file, "--to", me.did, "--goals", "calendar", "--ttl", "1h", "--out", other)).code, 0);
    const bad = await call(del, "--goal", "calendar", "--inputs", "{}", "--on-behalf-of", other);
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /may not run on behalf of/);
  });

  test("delegation on a sealed session: the chain travels sealed (cross-branch agreement 4)", async (t) => {
    if (!pythonHas("sealed_delegation")) return t.skip("the Python client does not send `sealed_delegation` yet (cross-branch agreement 4)");
    const chainFile = join(dir, "chain-py-sealed.json");
    assert.equal((await py("delegate", "--key-file", person.file, "--to", me.did, "--goals", "calendar", "--ttl", "1h", "--out", chainFile)).code, 0);
    const ok = await call(sealedDel, "--goal", "calendar", "--inputs", "{}", "--on-behalf-of", chainFile, "--sealed");
    assert.equal(ok.code, 0, ok.stderr);
    const none = await call(sealedDel, "--goal", "calendar", "--inputs", "{}", "--sealed");
    assert.equal(none.code, 1);
  });

  test("tampered answers from the TypeScript server are refused by the Python client", async () => {
    const evil = await proxy(plain.url, (b) => b.replace('"amount":10', '"amount":99'));
    const r = await py("call", "--key-file", me.file, "--to", plain.did, "--endpoint", evil, "--goal", "echo", "--inputs", '{"amount":10}');
    assert.equal(r.code, 1);
    const honest = await proxy(plain.url, (b) => b);
    assert.equal((await py("call", "--key-file", me.file, "--to", plain.did, "--endpoint", honest, "--goal", "echo", "--inputs", '{"amount":10}')).code, 0);
  });

  test("tampered stream events from the TypeScript server are refused by the Python client", async () => {
    const open = await serve("ts", tsKey.file, { sealed_intents: false });
    const evil = await proxy(open.url, (b) => b.replace('"result":{"i":1}', '"result":{"i":7}'));
    const r = await pyClient({ key_file: me.file, to: open.did, endpoint: evil, goal: "count", inputs: { n: 3 }, stream: true });
    assert.equal(r.code, 1);
    assert.equal(JSON.parse(r.stderr).code, -32040);
    const honest = await proxy(open.url, (b) => b);
    const ok = await pyClient({ key_file: me.file, to: open.did, endpoint: honest, goal: "count", inputs: { n: 3 }, stream: true });
    assert.equal(ok.code, 0, ok.stderr);
  });

  test("audit: the TypeScript server's log verifies with the Python verifier; a changed line does not", async () => {
    assert.equal((await call(srv, "--goal", "echo", "--inputs", "{}")).code, 0);
    const log = join(dir, "ts-audit.jsonl");
    const r = await py("audit", "verify", log);
    assert.equal(r.code, 0, r.stdout + r.stderr);
    const copy = join(dir, "ts-audit-changed.jsonl");
    writeFileSync(copy, readFileSync(log, "utf8").replace('"event":"hello"', '"event":"proof"'));
    assert.notEqual((await py("audit", "verify", copy)).code, 0);
  });

  test("the key file and chain file formats are shared: a Python key file serves the TypeScript CLI", async () => {
    const f = join(dir, "py-made.json");
    const g = await py("keygen", "--out", f);
    assert.equal(g.code, 0, g.stderr);
    const shown = json(await ts("did", "--key-file", f));
    assert.equal(shown.did, g.stdout.trim().split("\n").pop());
    assert.equal(readFileSync(f, "utf8").includes('"version":1'), true);
  });
});
