// docs/PROTOCOL.md's generated examples: every token verifies and re-signs byte for byte,
// and the documented client messages replayed against this server get the documented replies.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as a2a from "../dist/index.js";
import { examples, seedOf, seededRandom } from "./helpers.mjs";

const EX = examples();
const client = new a2a.Identity(seedOf("a2a-secure example client"), "example-client");
const server = new a2a.Identity(seedOf("a2a-secure example server"), "example-server");
const POLICY = { rate_limit: 1000, rate_period: 3600, allowed_intents: ["echo", "count"], blocked_intents: [], session_timeout: 3600 };
const payloadOf = (tok) => JSON.parse(Buffer.from(tok.split(".")[1], "base64url"));

test("the example identities are the documented DIDs", () => {
  assert.equal(EX.hello.json.params.agent_did, client.did);
  assert.equal(EX.challenge.json.result.server_did, server.did);
});

test("hashes: card -> manifest_hash, hello_hash, challenge_hash, commitment, request_hash", () => {
  const ch = EX.challenge.json.result;
  assert.equal(a2a.hashOf(EX["agent-card"].json), ch.manifest_hash);
  assert.equal(a2a.hashOf({ agent_id: "example-client", did: client.did }), EX.hello.json.params.manifest_hash);
  assert.equal(a2a.hashOf(EX.hello.json.params), EX["policy-payload"].json.hello_hash);
  assert.equal(a2a.hashOf(ch), EX["proof-payload"].json.challenge_hash);
  assert.equal(a2a.hashOf(EX.policy.json.result.policy), ch.policy_hash);
  assert.equal(a2a.checks.commitmentOf(EX.hello.json.params.nonce, ch.nonce_b, ch.policy_hash), EX["accept-payload"].json.session_commitment);
  assert.equal(a2a.textHash(EX["intent-request"].json.params.request_jws), EX["response-payload"].json.request_hash);
});

test("every documented token verifies, and this SDK signs the same bytes", () => {
  const pairs = [
    [EX.challenge.json.result.policy_signature, server, "a2a-policy+jws"],
    [EX.proof.json.params.proof_jws, client, "a2a-proof+jws"],
    [EX["accept-policy"].json.params.accept_jws, client, "a2a-accept+jws"],
    [EX.session.json.result.session_jws, server, "a2a-session+jws"],
    [EX["intent-request"].json.params.request_jws, client, "a2a-request+jws"],
    [EX["intent-result"].json.result.response_jws, server, "a2a-response+jws"],
    [EX["error-result"].json.error.data.response_jws, server, "a2a-response+jws"],
    [EX["close-request"].json.params.request_jws, client, "a2a-close+jws"],
    [EX["stream-event-first"].json.result.response_jws, server, "a2a-event+jws"],
    [EX["sealed-intent-request"].json.params.request_jws, client, "a2a-request+jws"],
  ];
  for (const [tok, who, typ] of pairs) {
    const p = a2a.verifyJws(tok, who.publicKey, typ, who.kid);
    assert.equal(who.sign(typ, p), tok, typ);
  }
  assert.deepEqual(payloadOf(EX["sealed-intent-request"].json.params.request_jws), EX["sealed-request-payload"].json);
});

test("§12.6 key schedule: keys, nonces, aad and the sealed inputs of the example", () => {
  const k = EX["sealed-key-schedule"].json;
  const acc = EX["sealed-accept-payload"].json, ses = EX["sealed-session-payload"].json;
  const cp = a2a.checks ? null : null;
  void cp;
  const m = { client_did: acc.client_did, server_did: acc.server_did, nonce_a: acc.nonce_a, nonce_b: acc.nonce_b, session_id: ses.session_id, session_commitment: ses.session_commitment, client_seal_key: acc.seal_key, server_seal_key: ses.seal_key };
  assert.equal(a2a.transcript(m), k.transcript);
  assert.equal(a2a.sha256Hex(k.transcript), k.salt);
  const keys = a2a.deriveKeys(Buffer.from(k.shared_secret, "hex"), m);
  assert.equal(keys.c2s.toString("hex"), k.c2s_key);
  assert.equal(keys.s2c.toString("hex"), k.s2c_key);
  assert.equal(a2a.nonceFor(1, "inputs", 0).toString("hex"), k.inputs_nonce);
  assert.equal(a2a.aadFor(ses.session_id, 1, "inputs", 0, "echo").toString(), k.inputs_aad);
  const s = new a2a.Sealer(keys, ses.session_id);
  const req = EX["sealed-intent-request"].json.params;
  assert.equal(s.sealRaw("inputs", 1, 0, "echo", Buffer.from(k.inputs_plaintext)), req.intent.sealed);
  const res = EX["sealed-intent-result"].json.result;
  const rh = a2a.textHash(req.request_jws);
  assert.equal(a2a.aadFor(ses.session_id, 1, "result", 0, rh).toString(), k.result_aad);
  assert.deepEqual(s.openJson("result", 1, 0, rh, res.result), JSON.parse(k.inputs_plaintext));
  assert.equal(s.openJson("result", 1, 0, "sha256:" + "0".repeat(64), res.result), undefined, "another binding does not open");
  assert.equal(payloadOf(res.response_jws).result, a2a.sealedDigest(res.result));
});

test("§12.7: the example chain parses, verifies and scopes as documented", async () => {
  const links = EX["delegation-request"].json.params.intent.delegation;
  const chain = a2a.parseChain(links);
  await a2a.verifyChainSignatures(chain, async (did, kid) => new a2a.DIDResolver().resolve(did).then((r) => r.keys.get(kid)));
  assert.equal(chain.name, EX["delegation-again-request"].json.params.intent.delegation);
  assert.deepEqual(payloadOf(links[1]), EX["delegation-hop-payload"].json);
  const at = { clientDid: client.did, serverDid: server.did, priority: 3, now: EX["delegation-root-payload"].json.nbf + 10 };
  assert.equal(chain.refusal({ ...at, goal: "echo" }), null);
  assert.equal(chain.refusal({ ...at, goal: "count" }).message, EX["delegation-refused-error"].json.error.message);
  const spliced = [links[0], links[1].slice(0, -3) + "AAA"];
  const c2 = a2a.parseChain(spliced);
  await assert.rejects(a2a.verifyChainSignatures(c2, async (did, kid) => new a2a.DIDResolver().resolve(did).then((r) => r.keys.get(kid))), (e) => e.code === -32042);
});

test("replayed against this SDK's server, the documented client messages get the documented replies", async () => {
  let now = 0;
  const core = new a2a.ServerCore({
    identity: server, name: "example-server", description: "The test agent of section 11", version: "1.0.0", url: "https://server.example",
    policy: POLICY, sealed: false, clock: () => now, random: seededRandom("a2a-secure example server random"),
  });
  a2a.registerTestAgent(core);
  assert.deepEqual(core.card().card, EX["agent-card"].json);
  const steps = [
    ["/a2a/handshake", "hello", "challenge"], ["/a2a/handshake", "proof", "policy"], ["/a2a/handshake", "accept-policy", "session"],
    ["/a2a/intent", "intent-request", "intent-result"], ["/a2a/intent", "error-request", "error-result"],
    ["/a2a/intent", "stream-request", "stream-body"], ["/a2a/intent", "close-request", "closed-result"], ["/a2a/intent", "close-request", "unsigned-error"],
  ];
  for (const [path, reqName, resName] of steps) {
    const expected = EX[resName];
    const tokenTs = (v) => {
      const tok = v?.result?.policy_signature ?? v?.result?.session_jws ?? v?.result?.response_jws ?? v?.error?.data?.response_jws;
      return tok ? payloadOf(tok).timestamp ?? payloadOf(tok).created_at : null;
    };
    if (expected.json) now = tokenTs(expected.json) ?? expected.json.result?.timestamp ?? now;
    else now = payloadOf(/"response_jws":"([^"]+)"/.exec(expected.body)[1]).timestamp;
    const reply = await core.handle(path, Buffer.from(JSON.stringify(EX[reqName].json)));
    assert.equal(reply.status, expected.http, `${resName} status`);
    if (expected.json) assert.deepEqual(JSON.parse(reply.body), expected.json, resName);
    else {
      let text = "";
      for await (const chunk of reply.stream) text += chunk;
      assert.equal(text, expected.body + "\n", resName);
    }
  }
});
