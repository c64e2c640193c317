// The sans-I/O core against published vectors: encodings, Ed25519 strictness, did:key, JWS.
import assert from "node:assert/strict";
import { test } from "node:test";
import * as a2a from "../dist/index.js";
import { vector } from "./helpers.mjs";

test("base64url: canonical only", () => {
  assert.deepEqual([...a2a.b64uDecodeOrNull("AQID")], [1, 2, 3]);
  for (const bad of ["AQI=", "AQ+D", "A", "AR", "AQJ", " AQID"]) assert.equal(a2a.b64uDecodeOrNull(bad), null, bad);
  assert.ok(a2a.b64uDecodeOrNull("AQ"));
});

test("I-JSON: strict parser refuses what §1 refuses", () => {
  const bad = ['{"a":1,"a":2}', '"\\ud800"', "9007199254740992", "1e400", "\ufeff{}", "[" .repeat(33) + "]".repeat(33), "{,}", "NaN", "[1,]"];
  for (const b of bad) assert.throws(() => a2a.loads(Buffer.from(b)), (e) => e.code === -32700, b);
  assert.equal(a2a.loads("[" .repeat(32) + "]".repeat(32)).length, 1);
  const v = a2a.loads('{"__proto__":1,"n":1.0}');
  assert.equal(Object.keys(v).join(), "__proto__,n");
  assert.equal(a2a.isInt(v.n), false, "1.0 is not an integer (§1)");
  assert.equal(a2a.jcs(v.n), "1");
  assert.equal(a2a.jcs({ b: [1, "é", true], a: null, "\u20ac": 1e21 }), '{"a":null,"b":[1,"é",true],"€":1e+21}');
});

test("RFC 8032 §7.1: exact signatures, verified, tampering refused", () => {
  for (const v of vector("rfc8032_ed25519.json").vectors) {
    const id = new a2a.Identity(Buffer.from(v.secret_key_hex, "hex"), "rfc8032");
    assert.equal(id.publicKey.toString("hex"), v.public_key_hex);
    const msg = Buffer.from(v.message_hex, "hex");
    const sig = Buffer.from(v.signature_hex, "hex");
    assert.ok(a2a.verifySignature(id.publicKey, msg, sig), v.name);
    const bad = Buffer.from(sig);
    bad[5] ^= 1;
    assert.equal(a2a.verifySignature(id.publicKey, msg, bad), false);
  }
});

test("Wycheproof Ed25519: every verdict as libsodium's", () => {
  const w = vector("wycheproof_ed25519_test.json");
  let n = 0;
  for (const g of w.testGroups) {
    const pk = Buffer.from(g.publicKey.pk, "hex");
    for (const t of g.tests) {
      n++;
      const got = a2a.verifySignature(pk, Buffer.from(t.msg, "hex"), Buffer.from(t.sig, "hex"));
      assert.equal(got, t.result === "valid", `tcId ${t.tcId} ${t.comment}`);
    }
  }
  assert.equal(n, 151);
});

test("ed25519-speccheck: only case 3 is accepted (strict, as libsodium)", () => {
  const cases = vector("ed25519_speccheck_cases.json").cases;
  const accepted = cases.flatMap((c, i) => (a2a.verifySignature(Buffer.from(c.pub_key, "hex"), Buffer.from(c.message, "hex"), Buffer.from(c.signature, "hex")) ? [i] : []));
  assert.deepEqual(accepted, [3]);
});

test("did:key vectors: valid DIDs give their keys, invalid ones are refused", () => {
  const d = vector("did_key_ed25519.json");
  for (const v of d.valid) {
    assert.equal(a2a.publicKeyFromDidKey(v.did).toString("hex"), v.public_key_hex, v.name);
    assert.equal(a2a.didKeyFromPublicKey(Buffer.from(v.public_key_hex, "hex")), v.did);
  }
  for (const v of d.invalid) assert.throws(() => a2a.publicKeyFromDidKey(v.input), (e) => e.code === -32602 || e.code === -32047, v.input);
});

test("DID syntax of §9", () => {
  for (const ok of ["did:key:z6Mk", "did:web:agents.example.com%3A8443:a:b", "did:x:a::b"]) assert.ok(a2a.isDid(ok), ok);
  for (const bad of ["did:Key:z6Mk", "did:key:", "did:key:a:", "did:key:a#k", "did:key:a/b", "did:key:a%4"]) assert.equal(a2a.isDid(bad), false, bad);
});

test("RFC 8037 A.4: the JWS signature of the RFC's key", () => {
  const r = vector("rfc8037_jose_ed25519.json");
  const text = JSON.stringify(r);
  const token = (text.match(/eyJhbGciOiJFZERTQSJ9\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+/) ?? [])[0];
  assert.ok(token);
  const [h, p, s] = token.split(".");
  const pub = a2a.publicKeyFromDidKey(a2a.didKeyFromPublicKey(Buffer.from("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "hex")));
  assert.ok(a2a.verifySignature(pub, Buffer.from(`${h}.${p}`), Buffer.from(s, "base64url")));
});

test("JWS: header exactly alg/typ/kid, the expected typ and kid", () => {
  const id = a2a.Identity.generate("t");
  const tok = id.sign("a2a-request+jws", { x: 1 });
  assert.deepEqual(a2a.verifyJws(tok, id.publicKey, "a2a-request+jws", id.kid), { x: 1 });
  assert.throws(() => a2a.verifyJws(tok, id.publicKey, "a2a-close+jws", id.kid), (e) => e.code === -32040);
  assert.throws(() => a2a.verifyJws(tok, id.publicKey, "a2a-request+jws", id.kid + "x"), (e) => e.code === -32040);
  assert.throws(() => a2a.verifyJws(tok + "=", id.publicKey, "a2a-request+jws", id.kid), (e) => e.code === -32602);
  const [, p, s] = tok.split(".");
  const h2 = Buffer.from(JSON.stringify({ alg: "Ed25519", typ: "a2a-request+jws", kid: id.kid })).toString("base64url");
  assert.throws(() => a2a.verifyJws(`${h2}.${p}.${s}`, id.publicKey, "a2a-request+jws", id.kid), (e) => e.code === -32040);
});

test("audit log: chained, checkpointed, tampering and truncation detected", async () => {
  const { mkdtempSync, readFileSync, writeFileSync } = await import("node:fs");
  const { join } = await import("node:path");
  const dir = mkdtempSync(join((await import("node:os")).tmpdir(), "audit-"));
  const path = join(dir, "a.jsonl");
  const id = a2a.Identity.generate("auditor");
  const log = new a2a.AuditLog(path, "server", id, 3);
  for (let i = 0; i < 4; i++) log.record({ event: "intent", status: "success", verified: true, sequence: i + 1, intent_goal: "echo" });
  const token = log.checkpoint();
  assert.ok(token);
  assert.deepEqual(a2a.verifyAuditLog(path, { did: id.did, checkpoint: token }).problems, []);
  const lines = readFileSync(path, "utf8").split("\n");
  writeFileSync(path, lines.slice(0, 2).join("\n") + "\n");
  assert.equal(a2a.verifyAuditLog(path, { did: id.did, checkpoint: token }).ok, false, "truncation is seen against a kept checkpoint");
  writeFileSync(path, lines.join("\n").replace('"sequence":2', '"sequence":9'));
  assert.equal(a2a.verifyAuditLog(path).ok, false, "a changed line breaks the chain");
});
