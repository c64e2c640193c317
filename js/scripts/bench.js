#!/usr/bin/env node
// Server CPU per signed intent (the TypeScript server, §6.1-§6.2) against a plain Node `http`
// JSON echo, in the same run: each server is a child process whose own CPU time
// (process.cpuUsage, user + system) is read before and after each batch; batches of the
// three kinds are interleaved, so the machine's noise falls on all of them alike.
//
//   node scripts/bench.js [--rounds 5] [--batch 300]
//
// Prints CPU microseconds per request for: plain echo, signed intent, sealed signed intent.
import { fork } from "node:child_process";
import { createServer, Agent as HttpAgent, request as httpRequest } from "node:http";
import { parseArgs } from "node:util";

const role = process.argv[2];

if (role === "plain" || role === "secure") {
  let handler;
  let extra = {};
  if (role === "plain") {
    handler = (req, res) => {
      const chunks = [];
      req.on("data", (c) => chunks.push(c));
      req.on("end", () => {
        const body = JSON.parse(Buffer.concat(chunks).toString());
        const out = JSON.stringify({ jsonrpc: "2.0", id: body.id, result: body.params });
        res.writeHead(200, { "content-type": "application/json" });
        res.end(out);
      });
    };
  } else {
    const a2a = await import("../dist/index.js");
    const identity = a2a.Identity.generate("bench-server");
    const core = new a2a.ServerCore({ identity, policy: { ...a2a.DEFAULT_POLICY, rate_limit: 10_000_000 } });
    a2a.registerTestAgent(core);
    handler = a2a.nodeHandler(core);
    extra = { did: identity.did };
  }
  const srv = createServer(handler);
  srv.keepAliveTimeout = 60_000;
  srv.listen(0, "127.0.0.1", () => process.send({ port: srv.address().port, ...extra }));
  process.on("message", (m) => {
    if (m === "cpu") {
      const u = process.cpuUsage();
      process.send({ cpu: u.user + u.system });
    } else if (m === "exit") process.exit(0);
  });
} else {
  const { values } = parseArgs({ options: { rounds: { type: "string" }, batch: { type: "string" } } });
  const rounds = Number(values.rounds ?? 5);
  const batch = Number(values.batch ?? 300);
  const a2a = await import("../dist/index.js");

  const start = (kind) =>
    new Promise((resolve) => {
      const child = fork(new URL(import.meta.url).pathname, [kind], { stdio: ["ignore", "inherit", "inherit", "ipc"] });
      child.once("message", (m) => resolve({ child, ...m }));
    });
  const cpuOf = (child) => new Promise((resolve) => {
    child.once("message", (m) => resolve(m.cpu));
    child.send("cpu");
  });

  const plain = await start("plain");
  const secure = await start("secure");
  const me = a2a.Identity.generate("bench-client");
  const clear = new a2a.Client(me, { sealed: false, exactlyOnce: false });
  const sealedClient = new a2a.Client(me, { sealed: true, exactlyOnce: false });
  const url = `http://127.0.0.1:${secure.port}`;
  const sClear = await clear.connect(secure.did, url);
  const sSealed = await sealedClient.connect(secure.did, url);

  const keepAlive = new HttpAgent({ keepAlive: true, maxSockets: 1 });
  const body = JSON.stringify({ jsonrpc: "2.0", method: "intent", id: 1, params: { goal: "echo", inputs: { text: "Hello world", target_language: "es" } } });
  const plainOnce = () =>
    new Promise((resolve, reject) => {
      const req = httpRequest({ host: "127.0.0.1", port: plain.port, method: "POST", path: "/", agent: keepAlive, headers: { "content-type": "application/json" } }, (res) => {
        res.resume();
        res.on("end", resolve);
      });
      req.on("error", reject);
      req.end(body);
    });
  const inputs = { text: "Hello world", target_language: "es" };
  const kinds = {
    "plain http echo": { child: plain.child, once: plainOnce },
    "signed intent": { child: secure.child, once: () => clear.request(sClear, "echo", inputs) },
    "sealed signed intent": { child: secure.child, once: () => sealedClient.request(sSealed, "echo", inputs) },
  };
  const totals = Object.fromEntries(Object.keys(kinds).map((k) => [k, { cpu: 0, n: 0 }]));
  for (const k of Object.keys(kinds)) for (let i = 0; i < 50; i++) await kinds[k].once(); // warm up
  for (let r = 0; r < rounds; r++) {
    for (const [name, k] of Object.entries(kinds)) {
      const before = await cpuOf(k.child);
      for (let i = 0; i < batch; i++) await k.once();
      const after = await cpuOf(k.child);
      totals[name].cpu += after - before;
      totals[name].n += batch;
    }
  }
  const base = totals["plain http echo"].cpu / totals["plain http echo"].n;
  console.log(`node ${process.version}, ${rounds} rounds x ${batch} requests per kind, interleaved; server CPU (user+system) per request:`);
  for (const [name, t] of Object.entries(totals)) {
    const per = t.cpu / t.n;
    console.log(`  ${name.padEnd(22)} ${per.toFixed(1).padStart(8)} µs   ${(per / base).toFixed(2)}x the plain echo`);
  }
  // The core alone, in this process (no HTTP): ServerCore.handle on prepared signed requests,
  // the client's signing outside the timed part (Python's bench_sealed.py "core" figure).
  const core = new a2a.ServerCore({ identity: a2a.Identity.generate("bench-core"), sealed: false, intentId: false, policy: { ...a2a.DEFAULT_POLICY, rate_limit: 10_000_000 } });
  a2a.registerTestAgent(core);
  const realFetch = globalThis.fetch;
  globalThis.fetch = async (u, init) => {
    const path = new URL(u).pathname;
    if (path.endsWith("agent-card.json")) return new Response(JSON.stringify(core.card().card));
    const r = await core.handle(path, Buffer.from(init.body));
    return new Response(r.body, { status: r.status, headers: r.headers });
  };
  const cs = await new a2a.Client(me, { sealed: false }).connect(core.identity.did, "http://core");
  globalThis.fetch = realFetch;
  const n = rounds * batch;
  const bodies = [];
  for (let i = 1; i <= n; i++) {
    const intent = { goal: "echo", inputs };
    const jws = me.sign("a2a-request+jws", { session_id: cs.id, session_commitment: cs.commitment, sequence: i, timestamp: a2a.nowSeconds(), intent });
    bodies.push(Buffer.from(JSON.stringify({ jsonrpc: "2.0", method: "intent", id: i, params: { session_id: cs.id, session_commitment: cs.commitment, sequence: i, intent, request_jws: jws } })));
  }
  const t0 = process.cpuUsage();
  for (const b of bodies) await core.handle("/a2a/intent", b);
  const t1 = process.cpuUsage(t0);
  console.log(`  ${"core alone (no HTTP)".padEnd(22)} ${((t1.user + t1.system) / n).toFixed(1).padStart(8)} µs   per signed intent`);
  plain.child.send("exit");
  secure.child.send("exit");
  keepAlive.destroy();
}
