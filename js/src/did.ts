/** DIDs (PROTOCOL.md §2, §9): syntax, did:key, key ids, public key entries, did:web URLs. */
import { checkPublicKey } from "./ed25519.js";
import { b64uDecodeOrNull, b64uEncode, isObject, type Json } from "./encoding.js";
import { AuthenticationFailed, DIDResolutionError, InvalidParams } from "./errors.js";

export const MAX_DID_LENGTH = 2048;
const IDCHAR = "(?:[A-Za-z0-9._-]|%[0-9A-Fa-f]{2})";
const DID_RE = new RegExp(`^did:[a-z0-9]+:(?:${IDCHAR}*:)*${IDCHAR}+$`);
const FRAGMENT_RE = /^(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]+|(?:%[0-9A-Fa-f]{2})+)$/;
const B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";

export function isDid(v: unknown): v is string {
  return typeof v === "string" && v.length <= MAX_DID_LENGTH && /^[\x00-\x7f]*$/.test(v) && DID_RE.test(v);
}

export function checkDidSyntax(v: unknown): string {
  if (typeof v !== "string") throw new InvalidParams("DID must be a string");
  if (v.length > MAX_DID_LENGTH) throw new InvalidParams("DID longer than 2048 characters");
  if (!isDid(v)) throw new InvalidParams("not a DID");
  return v;
}

export function splitKeyId(kid: string): [string, string] {
  const i = kid.indexOf("#");
  if (i < 0) throw new InvalidParams("key id must be a DID URL with a fragment");
  const did = kid.slice(0, i), frag = kid.slice(i + 1);
  if (!isDid(did) || !FRAGMENT_RE.test(frag)) throw new InvalidParams("key id has an invalid fragment");
  return [did, frag];
}

export function b58encode(data: Uint8Array): string {
  let n = 0n;
  for (const b of data) n = (n << 8n) | BigInt(b);
  let out = "";
  while (n > 0n) {
    out = B58[Number(n % 58n)] + out;
    n /= 58n;
  }
  for (const b of data) {
    if (b !== 0) break;
    out = "1" + out;
  }
  return out;
}

export function b58decode(text: string): Buffer | null {
  let n = 0n;
  for (const c of text) {
    const i = B58.indexOf(c);
    if (i < 0) return null;
    n = n * 58n + BigInt(i);
  }
  const bytes: number[] = [];
  while (n > 0n) {
    bytes.unshift(Number(n & 0xffn));
    n >>= 8n;
  }
  for (const c of text) {
    if (c !== "1") break;
    bytes.unshift(0);
  }
  return Buffer.from(bytes);
}

export function didKeyFromPublicKey(pub: Uint8Array): string {
  if (pub.length !== 32) throw new InvalidParams("Ed25519 public key must be 32 bytes");
  return "did:key:z" + b58encode(Buffer.concat([Buffer.from([0xed, 0x01]), pub]));
}

export function keyIdForDidKey(did: string): string {
  return `${did}#${did.slice("did:key:".length)}`;
}

/** The raw key of a `publicKeyMultibase` value (`z` + base58btc(0xed01 ‖ key)), unchecked. */
export function publicKeyFromMultibase(value: unknown): Buffer {
  if (typeof value !== "string" || !value.startsWith("z")) throw new DIDResolutionError("multibase value must be base58btc ('z')");
  const body = value.slice(1);
  const raw = body.length > 0 && body.length <= 64 ? b58decode(body) : null;
  if (raw === null) throw new DIDResolutionError("multibase value is not base58btc");
  if (raw[0] !== 0xed || raw[1] !== 0x01) throw new DIDResolutionError("multicodec is not ed25519-pub (0xed01)");
  if (raw.length !== 34) throw new DIDResolutionError(`Ed25519 key must be 32 bytes, got ${raw.length - 2}`);
  return raw.subarray(2);
}

/** The checked 32-byte key of a did:key (InvalidParams: not a DID; DIDResolutionError:
 * not a usable Ed25519 did:key). */
export function publicKeyFromDidKey(did: string): Buffer {
  checkDidSyntax(did);
  if (!did.startsWith("did:key:")) throw new DIDResolutionError("not a did:key DID");
  const msi = did.slice("did:key:".length);
  if (msi.includes(":")) throw new DIDResolutionError("did:key versions other than the default are not supported");
  const raw = publicKeyFromMultibase(msi);
  checkPublicKey(raw);
  return raw;
}

export interface PublicKeyEntry {
  kid: string;
  kty: "OKP";
  crv: "Ed25519";
  alg: "EdDSA";
  key: string;
}

export function publicKeyEntry(kid: string, pub: Uint8Array): PublicKeyEntry {
  return { kid, kty: "OKP", crv: "Ed25519", alg: "EdDSA", key: b64uEncode(pub) };
}

/** A resolved DID: its usable authentication keys by key id. */
export interface ResolvedDID {
  did: string;
  keys: Map<string, Buffer>;
}

export function resolveDidKey(did: string): ResolvedDID {
  const pub = publicKeyFromDidKey(did);
  return { did, keys: new Map([[keyIdForDidKey(did), pub]]) };
}

/** Check a `public_keys` member (§2) against the resolved DID: 1 to 8 exact entries, every
 * kid a key id of the DID and every key the one it resolves to, no kid twice, the signing
 * key listed. Shape errors are -32602, binding errors -32040. */
export function checkPublicKeys(entries: Json, resolved: ResolvedDID, signingKid?: string): void {
  if (!Array.isArray(entries) || entries.length < 1 || entries.length > 8)
    throw new InvalidParams("public_keys must hold 1 to 8 entries");
  for (const e of entries) {
    if (!isObject(e) || Object.keys(e).length !== 5 || e.kty !== "OKP" || e.crv !== "Ed25519" || e.alg !== "EdDSA" ||
      typeof e.kid !== "string" || e.kid.length > 2304 || b64uDecodeOrNull(e.key)?.length !== 32)
      throw new InvalidParams("malformed public key entry");
  }
  const seen = new Set<string>();
  for (const e of entries as { kid: string; key: string }[]) {
    if (seen.has(e.kid)) throw new AuthenticationFailed("public_keys lists a key id twice");
    seen.add(e.kid);
    const known = resolved.keys.get(e.kid);
    if (!known || known.toString("base64url") !== e.key)
      throw new AuthenticationFailed("public_keys do not match the DID");
  }
  if (signingKid !== undefined && !seen.has(signingKid)) throw new AuthenticationFailed("public_keys lack the signing key");
}
