// did:web: the specification's URL vectors, the address rules, and a resolution end to end.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";
import * as a2a from "../dist/index.js";
import { vector } from "./helpers.mjs";

const W = vector("did_web_urls.json");

test("did:web -> URL as the specification's examples", () => {
  for (const v of W.vectors) assert.equal(a2a.didWebToUrl(v.did), v.url, v.did);
});

test("DIDs the specification forbids and names the SDK's policy refuses", async () => {
  for (const v of W.invalid_per_spec) assert.throws(() => a2a.didWebToUrl(v.did), (e) => e.code === -32047 || e.code === -32602, v.did);
  const resolve = a2a.didWebResolver();
  for (const v of W.sdk_policy_rejects_not_in_spec) await assert.rejects(resolve(v.did), (e) => e.code === -32047 || e.code === -32602, v.did);
  for (const d of ["did:web:intranet", "did:web:metadata.google.internal", "did:web:printer.local", "did:web:2130706433", "did:web:127.1"])
    await assert.rejects(resolve(d), (e) => e.code === -32047, d);
  assert.equal(a2a.isPublicAddress("8.8.8.8"), true);
  for (const a of ["127.0.0.1", "10.1.2.3", "169.254.169.254", "::1", "::ffff:127.0.0.1", "fe80::1", "100.64.0.1"]) assert.equal(a2a.isPublicAddress(a), false, a);
});

test("document rules: relative ids, another controller ignored, a private JWK refused, expires", () => {
  const id = a2a.Identity.generate("w");
  const did = "did:web:agents.example.com";
  const mb = id.did.slice("did:key:".length);
  const doc = {
    id: did,
    verificationMethod: [
      { id: "#key-1", type: "Multikey", controller: did, publicKeyMultibase: mb },
      { id: `${did}#other`, type: "Multikey", controller: "did:web:evil.example", publicKeyMultibase: mb },
      { id: `${did}#jwk`, type: "JsonWebKey2020", controller: did, publicKeyJwk: { kty: "OKP", crv: "Ed25519", x: id.publicKey.toString("base64url"), d: "x" } },
      { id: `${did}#old`, type: "Multikey", controller: did, publicKeyMultibase: mb, expires: "2020-01-01T00:00:00Z" },
    ],
    authentication: ["#key-1", `${did}#other`, `${did}#jwk`, `${did}#old`],
  };
  const keys = a2a.keysOfDocument(did, doc, Date.now() / 1000);
  assert.deepEqual([...keys.keys()], [`${did}#key-1`]);
  assert.throws(() => a2a.keysOfDocument(did, { ...doc, id: "did:web:x.example" }, 0), (e) => e.code === -32047);
  const bad = structuredClone(doc);
  bad.verificationMethod[0].expires = "tomorrow";
  assert.throws(() => a2a.keysOfDocument(did, bad, 0), (e) => e.code === -32047);
});

test("a did:web agent on loopback (development opt-in): resolved, and a handshake over it", async () => {
  const id = a2a.Identity.generate("web");
  let docFor = null;
  const srv = createServer((req, res) => {
    if (req.url === "/.well-known/did.json" && docFor) {
      res.writeHead(200, { "content-type": "application/did+json" });
      return res.end(JSON.stringify(docFor));
    }
    res.writeHead(404).end();
  });
  await new Promise((r) => srv.listen(0, "127.0.0.1", r));
  try {
    const did = `did:web:localhost%3A${srv.address().port}`;
    docFor = { id: did, verificationMethod: [{ id: `${did}#key-1`, type: "Multikey", controller: did, publicKeyMultibase: id.did.slice(8) }], authentication: [`${did}#key-1`] };
    await assert.rejects(a2a.didWebResolver()(did), (e) => e.code === -32047, "loopback only with the development opt-in");
    const r = await a2a.didWebResolver({ devAllowLoopback: true })(did);
    assert.deepEqual([...r.keys.keys()], [`${did}#key-1`]);
    // That DID as a client of a server whose resolver may reach it.
    const web = new a2a.Identity(id.seedForDerivation(), "web", { did, kid: `${did}#key-1` });
    const resolver = new a2a.DIDResolver({ web: a2a.didWebResolver({ devAllowLoopback: true }) });
    const core = new a2a.ServerCore({ identity: a2a.Identity.generate("s"), resolver });
    a2a.registerTestAgent(core);
    const api = createServer(a2a.nodeHandler(core));
    await new Promise((r) => api.listen(0, "127.0.0.1", r));
    try {
      const c = new a2a.Client(web);
      const s = await c.connect(core.identity.did, `http://127.0.0.1:${api.address().port}`);
      assert.deepEqual((await c.request(s, "echo", { w: 1 })).result, { w: 1 });
    } finally {
      api.close();
    }
  } finally {
    srv.close();
  }
});
