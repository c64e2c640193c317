/** a2a-secure for Node.js: the wire protocol of docs/PROTOCOL.md. */
export * from "./errors.js";
export * from "./encoding.js";
export * from "./did.js";
export * from "./jws.js";
export { Identity, KeyFileError } from "./identity.js";
export * from "./policy.js";
export * from "./sealing.js";
export * from "./delegation.js";
export * from "./audit.js";
export * from "./resolver.js";
export { ServerCore, PROTOCOL, ENDPOINTS, type IntentContext, type Reply, type ServerOptions, type UnaryHandler, type StreamHandler } from "./server/core.js";
export { nodeHandler, fetchHandler, route, contentTypeOk } from "./server/http.js";
export { registerTestAgent } from "./server/testAgent.js";
export { Client, ClientSession, Agent, type ClientOptions, type RequestOptions, type IntentResult } from "./client/client.js";
export * as checks from "./client/checks.js";
export { checkPublicKey, verifySignature } from "./ed25519.js";
export { didWebResolver, didWebToUrl, didWebHostPort, keysOfDocument, isPublicAddress, hostNameBlocked, type AddressPolicy } from "./didweb.js";
