/** DID resolution: did:key here, did:web through ./didweb.js (PROTOCOL.md §2). */
import { checkDidSyntax, resolveDidKey, type ResolvedDID } from "./did.js";
import { didWebResolver } from "./didweb.js";
import { DIDResolutionError } from "./errors.js";

export interface Resolver {
  resolve(did: string): Promise<ResolvedDID>;
}

export type MethodResolver = (did: string) => Promise<ResolvedDID>;

export class DIDResolver implements Resolver {
  private readonly methods = new Map<string, MethodResolver>();
  constructor(methods: Record<string, MethodResolver> = {}) {
    this.methods.set("key", async (did) => resolveDidKey(did));
    this.methods.set("web", didWebResolver());
    for (const [m, r] of Object.entries(methods)) this.methods.set(m, r);
  }
  async resolve(did: string): Promise<ResolvedDID> {
    checkDidSyntax(did);
    const method = did.split(":")[1]!;
    const r = this.methods.get(method);
    if (!r) throw new DIDResolutionError(`DID method '${method}' is not supported`);
    return r(did);
  }
}
