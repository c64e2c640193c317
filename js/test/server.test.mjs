// The TypeScript server and client end to end over 127.0.0.1: §4's envelope table through
// both adapters (Node http and the Fetch handler decide alike), §6.1's steps, refusals.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";
import * as a2a from "../dist/index.js";

const servers = [];
after(() => servers.forEach((s) => s.closeAllConnections?.() ?? s.close()));

async function listen(handler) {
  const srv = createServer(handler);
  servers.push(srv);
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  return `http://127.0.0.1:${srv.address().port}`;
}

/** The Fetch handler behind Node http, so the same requests reach both adapters. */
function viaFetch(handle) {
  return async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const r = await handle(new Request(`http://x${req.url}`, { method: req.method, headers: req.headers, body: req.method === "POST" ? Buffer.concat(chunks) : undefined }));
    res.writeHead(r.status, Object.fromEntries(r.headers));
    res.end(Buffer.from(await r.arrayBuffer()));
  };
}

function makeServer(opts = {}) {
  const core = new a2a.ServerCore({ identity: a2a.Identity.generate("srv"), ...opts });
  a2a.registerTestAgent(core);
  return core;
}

/** An attacker on the path: lets the first intent through, answers it with a forged unsigned
 * -32043. Returns the function that puts the real fetch back. */
function forgeFirstUnknownSession() {
  let forged = false;
  const real = globalThis.fetch;
  globalThis.fetch = async (u, init) => {
    const r = await real(u, init);
    if (!forged && String(u).endsWith("/a2a/intent") && init?.body?.includes('"method":"intent"')) {
      forged = true;
      await r.text();
      return new Response(JSON.stringify({ jsonrpc: "2.0", id: 1, error: { code: -32043, message: "unknown session" } }), { status: 401, headers: { "content-type": "application/json" } });
    }
    return r;
  };
  return () => {
    globalThis.fetch = real;
  };
}

const post = (url, body, ct = "application/json") => fetch(url, { method: "POST", headers: { "content-type": ct }, body });

describe("the envelope table of §4, through both adapters", () => {
  const core = makeServer();
  const urls = {};
  before(async () => {
    urls.node = await listen(a2a.nodeHandler(core));
    urls.fetch = await listen(viaFetch(a2a.fetchHandler(core)));
  });
  const table = [
    ["not JSON", "/a2a/handshake", "{", "application/json", 400, -32700, null],
    ["duplicate names", "/a2a/handshake", '{"jsonrpc":"2.0","jsonrpc":"2.0","id":1,"method":"hello","params":{}}', "application/json", 400, -32700, null],
    ["batch", "/a2a/handshake", "[]", "application/json", 400, -32600, null],
    ["notification", "/a2a/handshake", '{"jsonrpc":"2.0","method":"hello","params":{}}', "application/json", 400, -32600, null],
    ["bad jsonrpc", "/a2a/handshake", '{"jsonrpc":"1.0","method":"hello","params":{},"id":7}', "application/json", 400, -32600, 7],
    ["extra member", "/a2a/handshake", '{"jsonrpc":"2.0","method":"hello","params":{},"id":7,"x":1}', "application/json", 400, -32600, 7],
    ["wrong endpoint", "/a2a/intent", '{"jsonrpc":"2.0","method":"hello","params":{},"id":"a"}', "application/json", 404, -32601, "a"],
    ["no params", "/a2a/handshake", '{"jsonrpc":"2.0","method":"hello","id":1}', "application/json", 400, -32602, 1],
    ["content type", "/a2a/handshake", "{}", "text/plain", 415, -32600, null],
    ["charset quoted, any case", "/a2a/handshake", '{"jsonrpc":"2.0","method":"hello","id":1}', 'Application/JSON; Charset="UTF-8"', 400, -32602, 1],
    ["other parameter", "/a2a/handshake", "{}", "application/json; profile=x", 415, -32600, null],
    ["unknown path", "/a2a/other", "{}", "application/json", 404, -32601, null],
    ["session_id not canonical", "/a2a/intent", JSON.stringify({ jsonrpc: "2.0", method: "close", id: 1, params: { session_id: "A".repeat(42) + "B", session_commitment: "sha256:" + "0".repeat(64), sequence: 1, request_jws: "a.b.c" } }), "application/json", 400, -32602, 1],
    ["unknown session", "/a2a/intent", JSON.stringify({ jsonrpc: "2.0", method: "close", id: 1, params: { session_id: "A".repeat(43), session_commitment: "sha256:" + "0".repeat(64), sequence: 1, request_jws: "e30.e30.AA" } }), "application/json", 401, -32043, 1],
  ];
  for (const [name, path, body, ct, status, code, id] of table) {
    test(name, async () => {
      for (const which of ["node", "fetch"]) {
        const r = await post(urls[which] + path, body, ct);
        assert.equal(r.status, status, `${which}: ${name}`);
        const j = await r.json();
        assert.equal(j.error.code, code, `${which}: ${name}`);
        assert.equal(j.id, id, `${which}: ${name}`);
      }
    });
  }
  test("405 with Allow, 413 over 1 MiB, the card by GET", async () => {
    for (const which of ["node", "fetch"]) {
      const g = await fetch(urls[which] + "/a2a/intent");
      assert.equal(g.status, 405);
      assert.equal(g.headers.get("allow"), "POST");
      const big = await post(urls[which] + "/a2a/intent", "x".repeat((1 << 20) + 1));
      assert.equal(big.status, 413);
      const card = await (await fetch(urls[which] + "/.well-known/agent-card.json")).json();
      assert.equal(a2a.hashOf(card), core.card().hash);
    }
  });
});

describe("client and server: sessions, sequences, refusals", () => {
  let url, core, client, s;
  before(async () => {
    core = makeServer({ policy: { ...a2a.DEFAULT_POLICY, rate_limit: 30 } });
    url = await listen(a2a.nodeHandler(core));
    client = new a2a.Client(a2a.Identity.generate("cli"));
    s = await client.connect(core.identity.did, url);
  });

  test("a sealed session by default; echo and a stream verified and opened", async () => {
    assert.equal(s.sealed, true);
    assert.deepEqual((await client.request(s, "echo", { a: "b" })).result, { a: "b" });
    const got = [];
    for await (const ev of client.stream(s, "count", { n: 3 })) got.push(ev);
    assert.deepEqual(got, [{ i: 0 }, { i: 1 }, { i: 2 }]);
  });

  test("a byte-identical retry gets the stored answer; another request at a used sequence -32044", async () => {
    const c2 = new a2a.Client(a2a.Identity.generate("raw"), { sealed: false });
    const s2 = await c2.connect(core.identity.did, url);
    const ts = a2a.nowSeconds();
    const intent = { goal: "echo", inputs: { n: 1 } };
    const jws = c2.identity.sign("a2a-request+jws", { session_id: s2.id, session_commitment: s2.commitment, sequence: 1, timestamp: ts, intent });
    const body = (id, j = jws, i = intent) => JSON.stringify({ jsonrpc: "2.0", method: "intent", id, params: { session_id: s2.id, session_commitment: s2.commitment, sequence: 1, intent: i, request_jws: j } });
    const a = await (await post(url + "/a2a/intent", body("one"))).json();
    const b = await (await post(url + "/a2a/intent", body("two"))).json();
    assert.equal(b.id, "two");
    assert.equal(b.result.response_jws, a.result.response_jws);
    const other = c2.identity.sign("a2a-request+jws", { session_id: s2.id, session_commitment: s2.commitment, sequence: 1, timestamp: ts, intent: { goal: "echo", inputs: { n: 2 } } });
    const c = await (await post(url + "/a2a/intent", body("three", other, { goal: "echo", inputs: { n: 2 } }))).json();
    assert.equal(c.error.code, -32044);
    assert.ok(c.error.data.response_jws, "signed");
    // A payload that differs from params: -32040, signed with the params' sequence.
    const d = await (await post(url + "/a2a/intent", body("four", jws, { goal: "echo", inputs: { n: 3 } }))).json();
    assert.equal(d.error.code, -32040);
    // Wrong typ: a close token on an intent.
    const closeTok = c2.identity.sign("a2a-close+jws", { session_id: s2.id, session_commitment: s2.commitment, sequence: 2, timestamp: ts, intent });
    const e = await post(url + "/a2a/intent", body("five", closeTok).replace('"sequence":1', '"sequence":2'));
    assert.equal(e.status, 401);
    assert.equal((await e.json()).error.code, -32040);
  });

  test("stale timestamps are -32045, signed", async () => {
    const c2 = new a2a.Client(a2a.Identity.generate("stale"), { sealed: false });
    const s2 = await c2.connect(core.identity.did, url);
    const intent = { goal: "echo", inputs: {} };
    const jws = c2.identity.sign("a2a-request+jws", { session_id: s2.id, session_commitment: s2.commitment, sequence: 1, timestamp: a2a.nowSeconds() - 301, intent });
    const r = await post(url + "/a2a/intent", JSON.stringify({ jsonrpc: "2.0", method: "intent", id: 1, params: { session_id: s2.id, session_commitment: s2.commitment, sequence: 1, intent, request_jws: jws } }));
    assert.equal(r.status, 401);
    const j = await r.json();
    assert.equal(j.error.code, -32045);
    assert.ok(j.error.data.response_jws);
  });

  test("a tampered result is refused by the client (-32040); an unsigned error stays unsigned", async () => {
    const evil = new a2a.Client(client.identity, { tamper: (b) => b.replace(/"status":"success","sequence":(\d+)/, '"status":"success","sequence":$1') .replace(/"result":"[A-Za-z0-9_-]{10}/, '"result":"AAAAAAAAAA') });
    const s3 = await evil.connect(core.identity.did, url);
    await assert.rejects(evil.request(s3, "echo", { v: 1 }), (e) => e.code === -32040);
    const forged = new a2a.Client(client.identity, { tamper: (b) => (b.includes('"error"') || b.includes("challenge") || b.includes('"policy"') || b.includes('"session"') ? b : '{"jsonrpc":"2.0","id":1,"error":{"code":-32043,"message":"unknown session"}}') });
    const s4 = await forged.connect(core.identity.did, url);
    await assert.rejects(forged.request(s4, "echo", {}), (e) => e.code === -32043 && e.signed === false);
  });

  test("close: the session is then unknown (-32043)", async () => {
    const c2 = new a2a.Client(a2a.Identity.generate("closer"));
    const s2 = await c2.connect(core.identity.did, url);
    await c2.close(s2);
    s2.closed = false;
    await assert.rejects(c2.request(s2, "echo", {}), (e) => e.code === -32043 && !e.signed);
  });

  test("the client refuses before sending what the server does not declare or the chain does not cover", async () => {
    const plain = makeServer({ sealed: false, intentId: false });
    const purl = await listen(a2a.nodeHandler(plain));
    await assert.rejects(new a2a.Client(client.identity, { sealed: true }).connect(plain.identity.did, purl), (e) => e.code === -32602);
    const s2 = await client.connect(plain.identity.did, purl);
    assert.equal(s2.sealed, false);
    await assert.rejects(client.request(s2, "echo", {}, { intentId: "A".repeat(22) }), (e) => e.code === -32602);
    await assert.rejects(client.request(s2, "echo", {}, { priority: 6 }), (e) => e.code === -32602);
    const person = a2a.Identity.generate("person");
    const chain = a2a.issue(person, { to: client.identity.did, goals: ["echo"], ttl: 60 });
    await assert.rejects(client.request(s2, "echo", {}, { onBehalfOf: chain }), (e) => e.code === -32602, "no delegation declared");
  });

  test("rate limit: 503 with Retry-After, data.retry_after and data.pool, nothing consumed", async () => {
    const tight = makeServer({ policy: { ...a2a.DEFAULT_POLICY, rate_limit: 1 } });
    const turl = await listen(a2a.nodeHandler(tight));
    const c2 = new a2a.Client(a2a.Identity.generate("busy"));
    const s2 = await c2.connect(tight.identity.did, turl);
    await c2.request(s2, "echo", {});
    await assert.rejects(c2.request(s2, "echo", {}), (e) => e.code === -32048 && e.signed && e.retryAfter >= 1);
  });

  test("a full shared bound says whose pool is full (data.pool): the DID's own intent_ids, then the server's", async () => {
    const core = makeServer();
    core.limits.idsPerDid = 1;
    const url = await listen(a2a.nodeHandler(core));
    const c2 = new a2a.Client(a2a.Identity.generate("ids"));
    const s2 = await c2.connect(core.identity.did, url);
    await c2.request(s2, "echo", {});
    await assert.rejects(c2.request(s2, "echo", {}), (e) => e.code === -32048 && e.signed && e.pool === "own" && /this DID already has 1 intent_ids/.test(e.message));
    core.limits.idsPerDid = 10;
    core.limits.idsTotal = 1;
    const c3 = new a2a.Client(a2a.Identity.generate("ids2"));
    const s3 = await c3.connect(core.identity.did, url);
    await assert.rejects(c3.request(s3, "echo", {}), (e) => e.code === -32048 && e.pool === "shared");
  });
});

describe("delegation and sealing on the TypeScript server", () => {
  test("a chain is sent in full, then by name; a server that forgot it says chain_unknown and the client resends it", async () => {
    const person = a2a.Identity.generate("person");
    const core = makeServer({ delegation: new a2a.DelegationRules(new Map([["calendar", new Set([person.did])]])) });
    core.add("calendar", (i) => i);
    const url = await listen(a2a.nodeHandler(core));
    const me = a2a.Identity.generate("assistant");
    let sent = [];
    const client = new a2a.Client(me);
    const s = await client.connect(core.identity.did, url);
    assert.equal(s.sealed, true, "sealed with delegation: the chain travels as sealed_delegation");
    const chain = a2a.issue(person, { to: me.did, goals: ["calendar"], ttl: 600, targets: [core.identity.did] });
    assert.deepEqual((await client.request(s, "calendar", { a: 1 }, { onBehalfOf: chain })).result, { a: 1 });
    assert.ok(s.chainsSent.has(chain.name));
    // The server forgets the session's chains: the name alone is refused with data.chain_unknown, the client resends in full.
    core["sessions"].get(s.id).chains.clear();
    assert.deepEqual((await client.request(s, "calendar", { a: 2 }, { onBehalfOf: chain })).result, { a: 2 });
    // Without a chain the reserved goal is refused, signed; on a sealed session the message
    // names nothing of the chain and the reason travels sealed in data.
    await assert.rejects(client.request(s, "calendar", {}), (e) => e.code === -32042 && e.signed && e.message === "delegation refused" && /runs only on behalf/.test(e.data.reason));
    const stranger = a2a.Identity.generate("stranger");
    const foreign = a2a.issue(stranger, { to: me.did, goals: ["calendar"], ttl: 600 });
    await assert.rejects(client.request(s, "calendar", {}, { onBehalfOf: foreign }), (e) => e.message === "delegation refused" && /may not run on behalf of did:key/.test(e.data.reason));
    // Unsealed, the same refusal says it in the message.
    const plainClient = new a2a.Client(me, { sealed: false });
    const ps = await plainClient.connect(core.identity.did, url);
    await assert.rejects(plainClient.request(ps, "calendar", {}, { onBehalfOf: foreign }), (e) => e.code === -32042 && /may not run on behalf of/.test(e.message));
    void sent;
  });

  test("require_sealed refuses a session without seal keys at ACCEPT_POLICY", async () => {
    const core = makeServer({ requireSealed: true });
    const url = await listen(a2a.nodeHandler(core));
    await assert.rejects(new a2a.Client(a2a.Identity.generate("c"), { sealed: false }).connect(core.identity.did, url),
      (e) => e.code === -32042 && e.message === "sealed intents required: accept_policy carries no seal_key" && e.signed === true);
    // A refusal whose token was altered on the way is not signed.
    const forged = new a2a.Client(a2a.Identity.generate("c"), { sealed: false, tamper: (b) => b.replace(/"refusal_jws":"([^"]+)"/, (_m, t) => `"refusal_jws":"${t.slice(0, -2)}AA"`) });
    await assert.rejects(forged.connect(core.identity.did, url), (e) => e.code === -32042 && e.signed === false);
    assert.throws(() => a2a.settingsFromObject({ require_sealed: true, sealed_intents: false }), (e) => e.code === -32602);
    const ok = await new a2a.Client(a2a.Identity.generate("c")).connect(core.identity.did, url);
    assert.equal(ok.sealed, true);
  });

  test("policy files: sealed by default, off by sealed_intents false, delegation declares the extension", () => {
    assert.equal(a2a.settingsFromObject({}).sealed, true);
    assert.equal(a2a.settingsFromObject({ sealed_intents: false }).sealed, false);
    assert.ok(a2a.settingsFromObject({ delegation: {} }).delegation);
    assert.throws(() => a2a.settingsFromObject({ rate_limit: "x" }), (e) => e.code === -32602);
    assert.throws(() => a2a.settingsFromObject({ nonsense: 1 }), (e) => e.code === -32602);
  });
});

test("an agent resends after an unsigned -32043 once, on a new session, with the same intent_id: the intent runs once", async () => {
  const core = makeServer();
  let runs = 0;
  core.add("book", (i) => ({ run: ++runs, ...i }));
  const url = await listen(a2a.nodeHandler(core));
  const agent = new a2a.Agent(a2a.Identity.generate("resender"), { peers: { [core.identity.did]: url } });
  // An attacker lets the request through and forges the unsigned "unknown session" answer.
  const restore = forgeFirstUnknownSession();
  try {
    const out = await agent.request(core.identity.did, "book", { room: 4 });
    assert.deepEqual(out, { run: 1, room: 4 }, "the first run's answer, signed again for the new session");
    assert.equal(runs, 1);
  } finally {
    restore();
  }
});

test("a replayed stream resends its first 256 events, then a newly signed final -32048 (§6.4)", async () => {
  const core = makeServer();
  core.addStream("many", async function* () {
    for (let i = 0; i < 300; i++) yield { i };
  });
  const url = await listen(a2a.nodeHandler(core));
  const c = new a2a.Client(a2a.Identity.generate("replayer"), { sealed: false, exactlyOnce: false });
  const s = await c.connect(core.identity.did, url);
  const intent = { goal: "many", inputs: {}, constraints: { stream: true } };
  const jws = c.identity.sign("a2a-request+jws", { session_id: s.id, session_commitment: s.commitment, sequence: 1, timestamp: a2a.nowSeconds(), intent });
  const body = (id) => JSON.stringify({ jsonrpc: "2.0", method: "intent", id, params: { session_id: s.id, session_commitment: s.commitment, sequence: 1, intent, request_jws: jws } });
  const events = async (id) => (await (await post(url + "/a2a/intent", body(id))).text()).split("\n\n").filter((b) => b.startsWith("id: ")).map((b) => JSON.parse(b.split("\ndata: ")[1]));
  const first = await events("a");
  assert.equal(first.length, 301);
  assert.equal(first[300].result.final, true);
  const again = await events("b");
  assert.equal(again.length, 257);
  assert.deepEqual(again.slice(0, 256).map((e) => e.result), first.slice(0, 256).map((e) => e.result), "the kept events byte for byte");
  assert.equal(again[0].id, "b");
  assert.deepEqual([again[256].result.index, again[256].result.final, again[256].result.error.code], [256, true, -32048]);
  const sent = { sessionId: s.id, sequence: 1, requestHash: a2a.textHash(jws), timestamp: a2a.nowSeconds(), server: await new a2a.DIDResolver().resolve(core.identity.did), sealer: null };
  const last = a2a.checks.checkEvent(again[256], sent, 256, a2a.nowSeconds());
  assert.equal(last.error.code, -32048);
  assert.equal(last.error.signed, true);
});

test("a source address that spent its failed PROOF steps gets 503 before any signature check; a wrong kid costs nothing", async () => {
  let mono = 1000;
  const core = makeServer({ monotonic: () => mono });
  const me = a2a.Identity.generate("prover");
  const other = a2a.Identity.generate("forger");
  const rpc = async (method, params, source) => JSON.parse((await core.handle("/a2a/handshake", Buffer.from(JSON.stringify({ jsonrpc: "2.0", method, id: 1, params })), source)).body);
  const hello = { type: "hello", protocol_version: "1.0", agent_did: me.did, agent_id: "prover", manifest_hash: a2a.hashOf({ agent_id: "prover", did: me.did }),
    nonce: Buffer.alloc(32, 7).toString("base64url"), public_keys: [me.publicKeyEntry], timestamp: a2a.nowSeconds() };
  const ch = (await rpc("hello", hello, "10.0.0.9")).result;
  const forged = (kid) => {
    const h = Buffer.from(JSON.stringify({ alg: "EdDSA", typ: "a2a-proof+jws", kid })).toString("base64url");
    const p = Buffer.from(JSON.stringify({ x: 1 })).toString("base64url");
    const sig = other.sign("a2a-proof+jws", { x: 1 }).split(".")[2];
    return `${h}.${p}.${sig}`;
  };
  for (let i = 0; i < 3; i++) assert.equal((await rpc("proof", { type: "proof", nonce_b: ch.nonce_b, proof_jws: forged(other.kid) }, "10.0.0.9")).error.code, -32040, "wrong kid, free");
  let codes = [];
  for (let i = 0; i < 101; i++) codes.push((await rpc("proof", { type: "proof", nonce_b: ch.nonce_b, proof_jws: forged(me.kid) }, "10.0.0.9")).error.code);
  assert.deepEqual([...new Set(codes.slice(0, 100))], [-32040]);
  assert.equal(codes[100], -32048);
  mono += 0.021; // 50 per second: one more try after 20 ms
  assert.equal((await rpc("proof", { type: "proof", nonce_b: ch.nonce_b, proof_jws: forged(me.kid) }, "10.0.0.9")).error.code, -32040);
  assert.equal((await rpc("proof", { type: "proof", nonce_b: ch.nonce_b, proof_jws: forged(me.kid) }, "10.0.0.9")).error.code, -32048);
  // Another address is not affected.
  assert.equal((await rpc("proof", { type: "proof", nonce_b: ch.nonce_b, proof_jws: forged(me.kid) }, "10.0.0.10")).error.code, -32040);
});

test("an agent's stream after a forged -32043 before its first event: resent once, the same intent_id, the handler runs once", async () => {
  const core = makeServer();
  let runs = 0;
  core.addStream("tick", async function* () {
    runs++;
    for (let i = 0; i < 3; i++) yield { i, run: runs };
  });
  const url = await listen(a2a.nodeHandler(core));
  const agent = new a2a.Agent(a2a.Identity.generate("streamer"), { peers: { [core.identity.did]: url } });
  const restore = forgeFirstUnknownSession();
  try {
    const got = [];
    for await (const ev of agent.stream(core.identity.did, "tick", {})) got.push(ev);
    assert.deepEqual(got, [{ i: 0, run: 1 }, { i: 1, run: 1 }, { i: 2, run: 1 }]);
    assert.equal(runs, 1);
  } finally {
    restore();
  }
});
