/** An agent's Ed25519 identity and the key file of the Python CLI (JSON, version 1, mode 0600). */
import type { KeyObject } from "node:crypto";
import { constants, openSync, readFileSync, statSync, writeSync, closeSync } from "node:fs";
import { didKeyFromPublicKey, isDid, keyIdForDidKey, publicKeyEntry, type PublicKeyEntry } from "./did.js";
import { newSeed, privateKeyFromSeed, publicKeyRaw } from "./ed25519.js";
import { b64uDecodeOrNull, b64uEncode, dumps, isObject, loads } from "./encoding.js";
import { A2AError, InvalidParams } from "./errors.js";
import { signJws } from "./jws.js";

export const KEY_FILE_VERSION = 1;

export class KeyFileError extends A2AError {}

export class Identity {
  readonly did: string;
  readonly kid: string;
  readonly publicKey: Buffer;
  readonly #priv: KeyObject;
  readonly #seed: Buffer;

  constructor(seed: Uint8Array, readonly agentId: string, opts: { did?: string; kid?: string } = {}) {
    if ([...agentId].length < 1 || [...agentId].length > 128) throw new InvalidParams("agent_id must be 1-128 characters");
    this.#seed = Buffer.from(seed);
    this.#priv = privateKeyFromSeed(this.#seed);
    this.publicKey = publicKeyRaw(this.#priv);
    const didKey = didKeyFromPublicKey(this.publicKey);
    this.did = opts.did ?? didKey;
    if (this.did.startsWith("did:key:") && this.did !== didKey) throw new KeyFileError("key file DID does not match its private key");
    if (!this.did.startsWith("did:key:") && !opts.kid) throw new InvalidParams("a did:web identity needs the key id from its DID document");
    this.kid = opts.kid ?? keyIdForDidKey(this.did);
  }

  static generate(agentId = "a2a-agent"): Identity {
    return new Identity(newSeed(), agentId);
  }

  static load(path: string, checkPermissions = true): Identity {
    let st;
    try {
      st = statSync(path);
    } catch {
      throw new KeyFileError(`key file not found: ${path}`);
    }
    if (checkPermissions && process.platform !== "win32" && (st.mode & 0o077) !== 0)
      throw new KeyFileError(`key file ${path} is accessible by group or others (mode ${(st.mode & 0o777).toString(8)}); run: chmod 600`);
    if (st.size > 65536) throw new KeyFileError("key file too large");
    let data;
    try {
      data = loads(readFileSync(path));
    } catch {
      throw new KeyFileError(`key file cannot be read: ${path}`);
    }
    if (!isObject(data) || data.version !== KEY_FILE_VERSION) throw new KeyFileError("not an a2a-secure key file");
    const seed = b64uDecodeOrNull(data.private_key);
    if (!seed || seed.length !== 32 || typeof data.agent_id !== "string") throw new KeyFileError("key file lacks private_key or agent_id");
    const did = typeof data.did === "string" && isDid(data.did) ? data.did : undefined;
    const kid = typeof data.kid === "string" ? data.kid : undefined;
    if (did?.startsWith("did:web:") && !kid) throw new KeyFileError("did:web key file lacks kid");
    return new Identity(seed, data.agent_id, { did, kid: did?.startsWith("did:web:") ? kid : undefined });
  }

  save(path: string, overwrite = false): void {
    const text = dumps({ version: KEY_FILE_VERSION, agent_id: this.agentId, did: this.did, kid: this.kid, private_key: b64uEncode(this.#seed) });
    const flags = constants.O_WRONLY | constants.O_CREAT | (overwrite ? constants.O_TRUNC : constants.O_EXCL) | (constants.O_NOFOLLOW ?? 0);
    const fd = openSync(path, flags, 0o600);
    try {
      writeSync(fd, text);
    } finally {
      closeSync(fd);
    }
  }

  get publicKeyEntry(): PublicKeyEntry {
    return publicKeyEntry(this.kid, this.publicKey);
  }

  sign(typ: string, payload: unknown): string {
    return signJws(this.#priv, this.kid, typ, payload);
  }

  /** For the answer key of §12.6 and keys derived from this identity: the seed, never sent. */
  seedForDerivation(): Buffer {
    return Buffer.from(this.#seed);
  }
}
