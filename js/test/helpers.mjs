// Shared by the tests: the documented examples of docs/PROTOCOL.md and the vectors.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const JS_ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO = join(JS_ROOT, "..");
const VECTORS = process.env.A2A_SECURE_VECTORS ?? join(REPO, "tests", "vectors");

export function vector(name) {
  return JSON.parse(readFileSync(join(VECTORS, name), "utf8"));
}

/** Every `<!-- example: NAME [http=NNN] -->` block of docs/PROTOCOL.md, by name. */
export function examples() {
  const text = readFileSync(join(REPO, "docs", "PROTOCOL.md"), "utf8");
  const re = /<!-- example: ([a-z0-9-]+)(?: http=(\d{3}))? -->\n```(json|text)\n([\s\S]*?)\n```/g;
  const out = {};
  for (const m of text.matchAll(re)) out[m[1]] = { http: m[2] ? Number(m[2]) : null, body: m[3] === "json" ? m[4] : m[4], json: m[3] === "json" ? JSON.parse(m[4]) : null };
  return out;
}

/** scripts/protocol_examples.py's deterministic random source. */
export function seededRandom(label) {
  let counter = 0n;
  return (n) => {
    let out = Buffer.alloc(0);
    while (out.length < n) {
      counter += 1n;
      const c = Buffer.alloc(8);
      c.writeBigUInt64BE(counter);
      out = Buffer.concat([out, createHash("sha256").update(Buffer.concat([Buffer.from(label), c])).digest()]);
    }
    return out.subarray(0, n);
  };
}

export const seedOf = (label) => createHash("sha256").update(label).digest();
