/** Sealed intents (PROTOCOL.md §12.6): key schedule, nonce, associated data, AEAD. */
import { createCipheriv, createDecipheriv, createHmac, hkdfSync } from "node:crypto";
import { b64uDecodeOrNull, b64uEncode, dumps, jcs, loads, sha256, textHash, type Json } from "./encoding.js";

export const LABEL = "a2a-secure/sealed/v1";
export const PART = { inputs: 1, result: 2, error_data: 3, event: 4, answer_key: 5, delegation: 6 } as const;
export type Part = keyof typeof PART;
const C2S_PARTS: readonly Part[] = ["inputs", "answer_key", "delegation"];

export interface SealKeys {
  c2s: Buffer;
  s2c: Buffer;
}

export interface TranscriptMembers {
  client_did: string;
  server_did: string;
  nonce_a: string;
  nonce_b: string;
  session_id: string;
  session_commitment: string;
  client_seal_key: string;
  server_seal_key: string;
}

export function transcript(m: TranscriptMembers): string {
  return jcs({ label: LABEL, ...m });
}

export function deriveKeys(shared: Uint8Array, m: TranscriptMembers): SealKeys {
  const salt = sha256(transcript(m));
  const okm = Buffer.from(hkdfSync("sha256", shared, salt, Buffer.from(`${LABEL} keys`, "ascii"), 64));
  return { c2s: okm.subarray(0, 32), s2c: okm.subarray(32, 64) };
}

export function nonceFor(sequence: number, part: Part, index: number): Buffer {
  const n = Buffer.alloc(12);
  const seq = Buffer.alloc(8);
  seq.writeBigUInt64BE(BigInt(sequence));
  seq.copy(n, 0, 1, 8);
  n[7] = PART[part];
  n.writeUInt32BE(index, 8);
  return n;
}

export function aadFor(sessionId: string, sequence: number, part: Part, index: number, binding: string): Buffer {
  const dir = C2S_PARTS.includes(part) ? "c2s" : "s2c";
  return Buffer.from(`${LABEL}|${dir}|${sessionId}|${sequence}|${part}|${index}|${binding}`, "utf8");
}

export function sealBytes(key: Buffer, nonce: Buffer, aad: Buffer, plaintext: Uint8Array): string {
  const c = createCipheriv("chacha20-poly1305", key, nonce, { authTagLength: 16 });
  c.setAAD(aad, { plaintextLength: plaintext.length });
  const ct = Buffer.concat([c.update(plaintext), c.final(), c.getAuthTag()]);
  return b64uEncode(ct);
}

export function openBytes(key: Buffer, nonce: Buffer, aad: Buffer, sealed: unknown): Buffer | null {
  const raw = b64uDecodeOrNull(sealed);
  if (!raw || raw.length < 16) return null;
  try {
    const d = createDecipheriv("chacha20-poly1305", key, nonce, { authTagLength: 16 });
    d.setAAD(aad, { plaintextLength: raw.length - 16 });
    d.setAuthTag(raw.subarray(raw.length - 16));
    return Buffer.concat([d.update(raw.subarray(0, raw.length - 16)), d.final()]);
  } catch {
    return null;
  }
}

/** One session's sealing, from one side (`client` seals c2s parts and opens s2c ones). */
export class Sealer {
  constructor(
    readonly keys: SealKeys,
    readonly sessionId: string,
  ) {}
  private keyFor(part: Part): Buffer {
    return C2S_PARTS.includes(part) ? this.keys.c2s : this.keys.s2c;
  }
  sealJson(part: Part, sequence: number, index: number, binding: string, value: unknown): string {
    return this.sealRaw(part, sequence, index, binding, Buffer.from(dumps(value), "utf8"));
  }
  sealRaw(part: Part, sequence: number, index: number, binding: string, data: Uint8Array): string {
    return sealBytes(this.keyFor(part), nonceFor(sequence, part, index), aadFor(this.sessionId, sequence, part, index, binding), data);
  }
  openRaw(part: Part, sequence: number, index: number, binding: string, sealed: unknown): Buffer | null {
    return openBytes(this.keyFor(part), nonceFor(sequence, part, index), aadFor(this.sessionId, sequence, part, index, binding), sealed);
  }
  /** The JSON value sealed, or undefined when it does not open or is not I-JSON. */
  openJson(part: Part, sequence: number, index: number, binding: string, sealed: unknown): Json | undefined {
    const raw = this.openRaw(part, sequence, index, binding, sealed);
    if (raw === null) return undefined;
    try {
      return loads(raw);
    } catch {
      return undefined;
    }
  }
}

/** The digest a signed payload carries in place of a sealed value. */
export const sealedDigest = textHash;

/** The client's answer key for an intent_id (this implementation: HKDF of the seed). */
export function deriveAnswerKey(seed: Buffer, serverDid: string, intentId: string): Buffer {
  return Buffer.from(hkdfSync("sha256", seed, Buffer.alloc(0), Buffer.from(`${LABEL} answer key|${serverDid}|${intentId}`, "utf8"), 32));
}

/** The intent as an intent_id claim hashes it on a sealed session (§12.6). */
export function claimIntent(intent: Record<string, Json>, inputs: Json, answerKey: Buffer): Record<string, Json> {
  const out: Record<string, Json> = {};
  for (const [k, v] of Object.entries(intent)) if (k !== "sealed" && k !== "sealed_key") out[k] = v;
  out.inputs = "hmac-sha256:" + createHmac("sha256", answerKey).update(jcs(inputs)).digest("hex");
  return out;
}
