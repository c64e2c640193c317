/**
 * Strict Ed25519 (PROTOCOL.md §2) over Node's crypto, and X25519 for §12.6.
 *
 * Node's verifier (OpenSSL) accepts small-order and non-canonical keys; the checks libsodium
 * makes are added here: S < L, R and A canonical and not of small order, and for keys taken
 * from a DID, membership of the prime-order subgroup (L·A = identity).
 */
import {
  createPrivateKey,
  createPublicKey,
  diffieHellman,
  generateKeyPairSync,
  randomBytes,
  sign as nodeSign,
  verify as nodeVerify,
  type KeyObject,
} from "node:crypto";
import { DIDResolutionError } from "./errors.js";

const P = 2n ** 255n - 19n;
const L = 2n ** 252n + 27742317777372353535851937790883648493n;
const D = (-121665n * inv(121666n)) % P;
const SQRT_M1 = pow(2n, (P - 1n) / 4n);

function mod(a: bigint): bigint {
  const r = a % P;
  return r >= 0n ? r : r + P;
}
function pow(b: bigint, e: bigint): bigint {
  let r = 1n;
  b = mod(b);
  while (e > 0n) {
    if (e & 1n) r = (r * b) % P;
    b = (b * b) % P;
    e >>= 1n;
  }
  return r;
}
function inv(a: bigint): bigint {
  return pow(a, P - 2n);
}
function leToBig(b: Uint8Array): bigint {
  let r = 0n;
  for (let i = b.length - 1; i >= 0; i--) r = (r << 8n) | BigInt(b[i]!);
  return r;
}

/** y of the encodings of the points of small order (libsodium's blocklist, sign ignored). */
const SMALL_ORDER_Y = new Set<bigint>([
  0n,
  1n,
  P - 1n,
  leToBig(Buffer.from("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", "hex")),
  leToBig(Buffer.from("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", "hex")),
]);

function yOf(enc: Uint8Array): bigint {
  const b = Buffer.from(enc);
  b[31] = b[31]! & 0x7f;
  return leToBig(b);
}

/** Canonical (y < p) and not of small order. */
function canonicalNotSmall(enc: Uint8Array): boolean {
  if (enc.length !== 32) return false;
  const y = yOf(enc);
  if (y >= P) return false;
  return !SMALL_ORDER_Y.has(y);
}

type Pt = [bigint, bigint, bigint, bigint];

function decompress(enc: Uint8Array): Pt | null {
  const y = yOf(enc);
  if (y >= P) return null;
  const sign = (enc[31]! >> 7) & 1;
  const y2 = (y * y) % P;
  const u = mod(y2 - 1n);
  const v = mod(D * y2 + 1n);
  let x = (u * pow(v, 3n) * pow(u * pow(v, 7n), (P - 5n) / 8n)) % P;
  const vx2 = mod(v * x * x);
  if (vx2 === u) {
    /* ok */
  } else if (vx2 === mod(-u)) x = (x * SQRT_M1) % P;
  else return null;
  if (x === 0n && sign === 1) return null;
  if (Number(x & 1n) !== sign) x = P - x;
  return [x, y, 1n, (x * y) % P];
}

function add(p: Pt, q: Pt): Pt {
  const [x1, y1, z1, t1] = p;
  const [x2, y2, z2, t2] = q;
  const a = mod((y1 - x1) * (y2 - x2));
  const b = mod((y1 + x1) * (y2 + x2));
  const c = mod(2n * D * t1 * t2);
  const d = mod(2n * z1 * z2);
  const e = b - a, f = d - c, g = d + c, h = b + a;
  return [mod(e * f), mod(g * h), mod(f * g), mod(e * h)];
}

function isIdentity(p: Pt): boolean {
  return mod(p[0]) === 0n && mod(p[1] - p[2]) === 0n;
}

function inPrimeOrderSubgroup(enc: Uint8Array): boolean {
  const pt = decompress(enc);
  if (pt === null) return false;
  let r: Pt = [0n, 1n, 1n, 0n];
  let q = pt;
  let k = L;
  while (k > 0n) {
    if (k & 1n) r = add(r, q);
    q = add(q, q);
    k >>= 1n;
  }
  return isIdentity(r);
}

const checkedKeys = new Map<string, KeyObject>();
const verifyKeys = new Map<string, KeyObject>();

/** A usable Ed25519 public key (32 bytes, canonical, on the curve, prime order), as a
 * KeyObject; DIDResolutionError otherwise. Results are cached. */
export function checkPublicKey(raw: Uint8Array): KeyObject {
  if (raw.length !== 32) throw new DIDResolutionError("Ed25519 public key must be 32 bytes");
  const id = Buffer.from(raw).toString("hex");
  const hit = checkedKeys.get(id);
  if (hit) return hit;
  if (!canonicalNotSmall(raw) || !inPrimeOrderSubgroup(raw))
    throw new DIDResolutionError("Ed25519 public key is not a valid prime-order point");
  const key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: Buffer.from(raw).toString("base64url") }, format: "jwk" });
  if (checkedKeys.size > 4096) checkedKeys.clear();
  checkedKeys.set(id, key);
  return key;
}

/** True only for a strict signature (never throws). `pub` is a raw key already accepted by
 * checkPublicKey, or raw bytes (checked here for canonical form and small order). */
export function verifySignature(pub: Uint8Array, message: Uint8Array, sig: Uint8Array): boolean {
  try {
    if (pub.length !== 32 || sig.length !== 64) return false;
    if (!canonicalNotSmall(pub)) return false;
    if (!canonicalNotSmall(sig.subarray(0, 32))) return false;
    if (leToBig(sig.subarray(32)) >= L) return false;
    const x = Buffer.from(pub).toString("base64url");
    let key = verifyKeys.get(x);
    if (!key) {
      key = createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x }, format: "jwk" });
      if (verifyKeys.size >= 4096) verifyKeys.clear();
      verifyKeys.set(x, key);
    }
    return nodeVerify(null, message, key, sig);
  } catch {
    return false;
  }
}

const PKCS8_ED25519 = Buffer.from("302e020100300506032b657004220420", "hex");
const PKCS8_X25519 = Buffer.from("302e020100300506032b656e04220420", "hex");

export function privateKeyFromSeed(seed: Uint8Array): KeyObject {
  if (seed.length !== 32) throw new Error("Ed25519 seed must be 32 bytes");
  return createPrivateKey({ key: Buffer.concat([PKCS8_ED25519, seed]), format: "der", type: "pkcs8" });
}

export function publicKeyRaw(priv: KeyObject): Buffer {
  const jwk = createPublicKey(priv).export({ format: "jwk" });
  return Buffer.from(jwk.x as string, "base64url");
}

export function signBytes(priv: KeyObject, message: Uint8Array): Buffer {
  return nodeSign(null, message, priv);
}

export function newSeed(): Buffer {
  return randomBytes(32);
}

/** An X25519 key pair for one handshake (§12.6). */
export function x25519Pair(priv?: Uint8Array): { priv: KeyObject; pub: Buffer } {
  const key = priv
    ? createPrivateKey({ key: Buffer.concat([PKCS8_X25519, priv]), format: "der", type: "pkcs8" })
    : generateKeyPairSync("x25519").privateKey;
  const jwk = createPublicKey(key).export({ format: "jwk" });
  return { priv: key, pub: Buffer.from(jwk.x as string, "base64url") };
}

/** The X25519 shared secret, or null for an unusable peer key (an all-zero secret). */
export function x25519Shared(priv: KeyObject, peerPub: Uint8Array): Buffer | null {
  try {
    const pub = createPublicKey({ key: { kty: "OKP", crv: "X25519", x: Buffer.from(peerPub).toString("base64url") }, format: "jwk" });
    const s = diffieHellman({ privateKey: priv, publicKey: pub });
    return s.every((b) => b === 0) ? null : s;
  } catch {
    return null;
  }
}
