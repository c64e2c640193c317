/**
 * `a2a-secure-js`: the Python CLI's commands, flags, key-file and chain-file formats.
 * Exit codes: 0 success, 1 a refusal or unusable file (one line on stderr), 2 a usage error.
 */
import { existsSync, openSync, readFileSync, writeSync, closeSync, constants } from "node:fs";
import { createServer } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { parseArgs } from "node:util";
import { AuditLog, verifyAuditLog } from "./audit.js";
import { Agent } from "./client/client.js";
import { loadChain, MAX_TTL } from "./delegation.js";
import { isObject, JsonFloat, loads, type JsonObject } from "./encoding.js";
import { A2AError } from "./errors.js";
import { didWebResolver } from "./didweb.js";
import { Identity } from "./identity.js";
import { DIDResolver } from "./resolver.js";
import { loadSettings } from "./policy.js";
import { ServerCore } from "./server/core.js";
import { nodeHandler } from "./server/http.js";
import { registerTestAgent } from "./server/testAgent.js";

const PROG = "a2a-secure-js";

class Usage extends Error {}

function fail(msg: string): void {
  process.stderr.write(`${PROG}: error: ${msg.replace(/[\x00-\x1f\x7f]/g, "?")}\n`);
}

function printJson(v: unknown): void {
  process.stdout.write(JSON.stringify(v, (_k, x: unknown) => (x instanceof JsonFloat ? x.value : x), 2) + "\n");
}

function parse(args: string[], options: Record<string, { type: "string" | "boolean"; multiple?: boolean }>, required: string[] = []) {
  let r;
  try {
    r = parseArgs({ args, options, strict: true, allowPositionals: true });
  } catch (e) {
    throw new Usage((e as Error).message);
  }
  for (const k of required) if (r.values[k] === undefined) throw new Usage(`the following arguments are required: --${k}`);
  // Option values are strings, booleans or string arrays as declared in `options`.
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  return { values: r.values as Record<string, any>, positionals: r.positionals };
}

export function parseDuration(text: string): number {
  const m = /^([0-9]{1,9})([smhd]?)$/.exec(text.trim().toLowerCase());
  if (!m) throw new Usage(`not a duration: '${text}' (use e.g. 3600, 30m, 24h, 7d)`);
  return Number(m[1]) * ({ "": 1, s: 1, m: 60, h: 3600, d: 86400 } as Record<string, number>)[m[2]!]!;
}

function keygen(argv: string[]): number {
  const { values } = parse(argv, { out: { type: "string" }, "agent-id": { type: "string" }, force: { type: "boolean" } });
  const id = Identity.generate(values["agent-id"] ?? "a2a-agent");
  if (!values.out) {
    process.stderr.write(`${PROG}: keep A2A_PRIVATE_KEY secret; anyone who has it is this agent\n`);
    process.stdout.write(`A2A_PRIVATE_KEY=${id.seedForDerivation().toString("base64url")}\n`);
  } else {
    id.save(values.out, values.force === true);
    process.stdout.write(`key file: ${values.out} (mode 0600)\nkid: ${id.kid}\n`);
  }
  process.stdout.write(id.did + "\n");
  return 0;
}

function did(argv: string[]): number {
  const rest = argv[0] === "show" ? argv.slice(1) : argv;
  const { values } = parse(rest, { "key-file": { type: "string" } }, ["key-file"]);
  const id = Identity.load(values["key-file"]!);
  printJson({ agent_id: id.agentId, did: id.did, kid: id.kid, public_key_entry: id.publicKeyEntry });
  return 0;
}

async function serve(argv: string[]): Promise<number> {
  const { values } = parse(argv, {
    "key-file": { type: "string" }, host: { type: "string" }, port: { type: "string" }, policy: { type: "string" },
    url: { type: "string" }, "audit-log": { type: "string" }, "tls-cert": { type: "string" }, "tls-key": { type: "string" },
  }, ["key-file"]);
  if (Boolean(values["tls-cert"]) !== Boolean(values["tls-key"])) throw new Usage("--tls-cert and --tls-key go together");
  const tls = values["tls-cert"] ? { cert: readFileSync(values["tls-cert"]), key: readFileSync(values["tls-key"]) } : null;
  const identity = Identity.load(values["key-file"]!);
  const settings = loadSettings(values.policy);
  const host = values.host ?? "127.0.0.1";
  const port = Number(values.port ?? "8000");
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Usage("--port must be 0-65535");
  const audit = values["audit-log"] ? new AuditLog(values["audit-log"], "server", identity) : undefined;
  const wildcard = host === "0.0.0.0" || host === "::";
  const server = new ServerCore({
    identity, name: identity.agentId, description: "The test agent of section 11", policy: settings.policy, sealed: settings.sealed,
    requireSealed: settings.requireSealed, priorityRights: settings.priorityRights, delegation: settings.delegation, audit,
    url: values.url ?? (wildcard ? "" : `${tls ? "https" : "http"}://${host.includes(":") ? `[${host}]` : host}:${port}`),
  });
  registerTestAgent(server);
  const http = tls ? createHttpsServer(tls, nodeHandler(server)) : createServer(nodeHandler(server));
  await new Promise<void>((resolve, reject) => {
    http.once("error", reject);
    http.listen(port, host, () => resolve());
  });
  const addr = http.address();
  const bound = typeof addr === "object" && addr ? addr.port : port;
  process.stderr.write(`${PROG}: serving ${identity.did} on ${tls ? "https" : "http"}://${host}:${bound}\n`);
  await new Promise<void>((resolve) => {
    const stop = (): void => {
      http.close();
      audit?.close();
      resolve();
    };
    process.once("SIGINT", stop);
    process.once("SIGTERM", stop);
  });
  return 0;
}

async function call(argv: string[]): Promise<number> {
  const { values } = parse(argv, {
    "key-file": { type: "string" }, to: { type: "string" }, endpoint: { type: "string" }, goal: { type: "string" },
    domain: { type: "string" }, inputs: { type: "string" }, sealed: { type: "boolean" }, "on-behalf-of": { type: "string" },
    priority: { type: "string" }, "intent-id": { type: "string" }, stream: { type: "boolean" },
    "allow-loopback-dev": { type: "boolean" }, "allow-address": { type: "string", multiple: true }, "allow-host": { type: "string", multiple: true },
  }, ["key-file", "to", "goal"]);
  if (!values.endpoint) throw new Usage("--endpoint is required (a registry is not read by this command)");
  let priority: number | undefined;
  if (values.priority !== undefined) {
    if (!/^[1-5]$/.test(values.priority)) throw new Usage(`--priority must be an integer from 1 to 5, not '${values.priority}'`);
    priority = Number(values.priority);
  }
  const identity = Identity.load(values["key-file"]!);
  const inputs = loads(values.inputs ?? "{}");
  if (!isObject(inputs)) {
    fail("--inputs must be a JSON object");
    return 1;
  }
  const chain = values["on-behalf-of"] ? loadChain(readFileSync(values["on-behalf-of"])) : undefined;
  const resolver = new DIDResolver({
    web: didWebResolver({ devAllowLoopback: values["allow-loopback-dev"] === true, allowAddresses: values["allow-address"], allowHosts: values["allow-host"] }),
  });
  const agent = new Agent(identity, { sealed: values.sealed ? true : null, peers: { [values.to!]: values.endpoint }, onBehalfOf: chain, resolver });
  try {
    const o = { domain: values.domain, priority, intentId: values["intent-id"] };
    if (values.stream) {
      const all = [];
      for await (const r of agent.stream(values.to!, values.goal!, inputs as JsonObject, o)) all.push(r);
      printJson(all);
    } else printJson(await agent.request(values.to!, values.goal!, inputs as JsonObject, o));
  } finally {
    await agent.close();
  }
  return 0;
}

function delegate(argv: string[]): number {
  const { values } = parse(argv, {
    "key-file": { type: "string" }, to: { type: "string" }, goals: { type: "string" }, ttl: { type: "string" },
    target: { type: "string", multiple: true }, "max-priority": { type: "string" }, parent: { type: "string" }, out: { type: "string" },
  }, ["key-file", "to"]);
  const identity = Identity.load(values["key-file"]!);
  const goals = values.goals === undefined ? undefined : values.goals.split(",").map((g: string) => g.trim()).filter(Boolean);
  const ttl = values.ttl === undefined ? undefined : parseDuration(values.ttl);
  if (ttl !== undefined && !(ttl > 0 && ttl <= MAX_TTL)) throw new Usage(`--ttl must be between 1 s and ${MAX_TTL / 86400} days`);
  let maxPriority: number | undefined;
  if (values["max-priority"] !== undefined) {
    if (!/^[1-5]$/.test(values["max-priority"])) throw new Usage("--max-priority must be 1-5");
    maxPriority = Number(values["max-priority"]);
  }
  const agent = new Agent(identity);
  let chain;
  if (values.parent) chain = agent.delegate(values.to!, goals as string[], { ttl, targets: values.target, maxPriority, parent: loadChain(readFileSync(values.parent)) });
  else {
    if (!goals?.length) throw new Usage("--goals is required for a new chain");
    chain = agent.delegate(values.to!, goals, { ttl: ttl ?? 3600, targets: values.target, maxPriority });
  }
  const text = chain.dumps() + "\n";
  if (values.out) {
    const fd = openSync(values.out, constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC, 0o600);
    writeSync(fd, text);
    closeSync(fd);
    const leaf = chain.leaf;
    process.stderr.write(`${values.out}: ${chain.links.length} link(s) on behalf of ${chain.principal}, to ${leaf.aud}, goals ${leaf.goals.join(",")}, until ${leaf.exp}, token id ${leaf.jti}\n`);
  } else process.stdout.write(text);
  return 0;
}

function audit(argv: string[]): number {
  if (argv[0] !== "verify") throw new Usage("usage: audit verify FILE [--did DID] [--checkpoint TOKEN]");
  const { values, positionals } = parse(argv.slice(1), { did: { type: "string" }, checkpoint: { type: "string" } });
  if (positionals.length !== 1 || !existsSync(positionals[0]!)) throw new Usage("audit verify takes one existing FILE");
  const r = verifyAuditLog(positionals[0]!, { did: values.did, checkpoint: values.checkpoint });
  printJson(r);
  return r.ok ? 0 : 1;
}

const COMMANDS: Record<string, (argv: string[]) => number | Promise<number>> = { keygen, did, serve, call, delegate, audit };

export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  if (cmd === "--version") {
    process.stdout.write(`${PROG} 1.0.0\n`);
    return 0;
  }
  const run = cmd ? COMMANDS[cmd] : undefined;
  if (!run) {
    process.stderr.write(`usage: ${PROG} {${Object.keys(COMMANDS).join(",")}} ...\n`);
    return 2;
  }
  try {
    return await run(rest);
  } catch (e) {
    if (e instanceof Usage) {
      process.stderr.write(`${PROG} ${cmd}: error: ${e.message}\n`);
      return 2;
    }
    if (e instanceof A2AError) {
      fail(`${e.message} (${e.code}${e.signed ? ", signed" : ""})`);
      return 1;
    }
    const err = e as NodeJS.ErrnoException;
    fail(err.code ? `${err.path ?? ""}: ${err.message}` : String(err.message ?? err));
    return 1;
  }
}
