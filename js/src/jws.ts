/** Compact JWS, EdDSA (PROTOCOL.md §3). */
import type { KeyObject } from "node:crypto";
import { signBytes, verifySignature } from "./ed25519.js";
import { b64uDecodeOrNull, b64uEncode, dumps, isObject, loads, type JsonObject } from "./encoding.js";
import { AuthenticationFailed, InvalidParams } from "./errors.js";

export const TYP = {
  policy: "a2a-policy+jws",
  proof: "a2a-proof+jws",
  accept: "a2a-accept+jws",
  session: "a2a-session+jws",
  request: "a2a-request+jws",
  close: "a2a-close+jws",
  response: "a2a-response+jws",
  event: "a2a-event+jws",
  audit: "a2a-audit+jws",
  delegation: "a2a-delegation+jws",
  refusal: "a2a-refusal+jws",
} as const;

export function signJws(priv: KeyObject, kid: string, typ: string, payload: unknown): string {
  const h = Buffer.from(dumps({ alg: "EdDSA", typ, kid })).toString("base64url");
  const p = Buffer.from(dumps(payload)).toString("base64url");
  const signingInput = `${h}.${p}`;
  return `${signingInput}.${b64uEncode(signBytes(priv, Buffer.from(signingInput, "ascii")))}`;
}

export interface ParsedJws {
  header: JsonObject;
  payload: JsonObject;
  signingInput: string;
  signature: Buffer;
}

/** The form of a token: three canonical base64url segments, the first two JSON objects
 * (I-JSON; duplicates refused). Anything else is -32602. */
export function parseJws(token: unknown): ParsedJws {
  if (typeof token !== "string" || token.length > 1 << 20) throw new InvalidParams("malformed JWS");
  const parts = token.split(".");
  if (parts.length !== 3) throw new InvalidParams("malformed JWS");
  const [h, p, s] = parts as [string, string, string];
  const hb = b64uDecodeOrNull(h), pb = b64uDecodeOrNull(p), sb = b64uDecodeOrNull(s);
  if (!hb || !pb || !sb || h === "" || p === "") throw new InvalidParams("malformed JWS");
  const header = loads(hb, { error: InvalidParams });
  const payload = loads(pb, { error: InvalidParams });
  if (!isObject(header) || !isObject(payload)) throw new InvalidParams("malformed JWS");
  return { header, payload, signingInput: `${h}.${p}`, signature: sb };
}

/** Check header (exactly alg/typ/kid, EdDSA, the expected typ and kid) and the signature:
 * any failure is -32040. */
export function verifyParsed(jws: ParsedJws, pub: Uint8Array, typ: string, kid: string): JsonObject {
  const hd = jws.header;
  const keys = Object.keys(hd);
  if (keys.length !== 3 || hd.alg !== "EdDSA" || hd.typ !== typ || hd.kid !== kid)
    throw new AuthenticationFailed(`bad JWS header (expected typ ${typ})`);
  if (!verifySignature(pub, Buffer.from(jws.signingInput, "ascii"), jws.signature))
    throw new AuthenticationFailed("bad signature");
  return jws.payload;
}

export function verifyJws(token: unknown, pub: Uint8Array, typ: string, kid: string): JsonObject {
  return verifyParsed(parseJws(token), pub, typ, kid);
}
