// lib.mjs — helpers for the end-to-end tests of `kvstash serve`.
//
// startServer() runs the real binary ($KS_BIN) on the tiny model ($KS_TINY_MODEL)
// with --port 0, reads the port from the "kvstash: port=N" line on stderr and
// waits for /health. stop() sends SIGTERM and returns the exit code; every
// server still running when the process exits is killed, so a failing test never
// leaves one behind.
import { execFileSync, spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const BIN = process.env.KS_BIN;
export const MODEL = process.env.KS_TINY_MODEL;

const live = new Set();
function killAll() {
  for (const p of live) {
    try { p.kill('SIGKILL'); } catch { /* already gone */ }
  }
}
process.on('exit', killAll);
// A runner that times out sends SIGTERM/SIGINT: take the servers down too.
for (const sig of ['SIGTERM', 'SIGINT', 'SIGHUP']) {
  process.on(sig, () => { killAll(); process.exit(128 + (sig === 'SIGINT' ? 2 : sig === 'SIGHUP' ? 1 : 15)); });
}

// The official client SDKs, installed by `make test` (scripts/setup_clients.sh)
// from tests/e2e/package.json into build/e2e-npm. Missing is a failure, never a skip.
export const CLIENTS_DIR = process.env.KS_E2E_NPM ||
  path.join(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'build', 'e2e-npm');

export async function importClient(name) {
  const dir = path.join(CLIENTS_DIR, 'node_modules', ...name.split('/'));
  assert.ok(existsSync(path.join(dir, 'package.json')),
    `${name} is not installed in ${CLIENTS_DIR}: run scripts/setup_clients.sh (make test does)`);
  const pkg = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8'));
  const want = JSON.parse(readFileSync(path.join(CLIENTS_DIR, 'package.json'), 'utf8')).dependencies[name];
  assert.equal(pkg.version, want, `${name}: ${pkg.version} installed, tests/e2e/package.json pins ${want}`);
  // ESM entry of the package: exports["."].import (or .default), else module/main.
  const exp = pkg.exports && (pkg.exports['.'] ?? pkg.exports);
  let entry = (exp && (exp.import?.default ?? exp.import ?? exp.default)) || pkg.module || pkg.main || 'index.js';
  if (typeof entry === 'object') entry = entry.default;
  return import(pathToFileURL(path.join(dir, entry)).href);
}

export function requireEnv() {
  assert.ok(BIN, 'KS_BIN must point to the kvstash binary');
  assert.ok(MODEL, 'KS_TINY_MODEL must point to the tiny GGUF model');
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export { sleep };

// Small, deterministic defaults: 2 slots of 512 tokens, one thread (the test
// machine has 2 shared cores; ggml's spinning threads crawl when oversubscribed).
// defaults: false leaves --slots and --ctx to the server (or its --config).
// model: the -m model (null: none, for a server of several models from its --config).
export async function startServer(args = [], { timeoutMs = 60000, env = {}, defaults: useDefaults = true,
  model = MODEL } = {}) {
  requireEnv();
  const defaults = useDefaults ? { '--slots': '2', '--ctx': '512', '--threads': '1' } : { '--threads': '1' };
  const full = ['serve', ...(model ? ['-m', model] : []), '--port', '0', '--log', 'info'];
  for (const [k, v] of Object.entries(defaults)) if (!args.includes(k)) full.push(k, v);
  full.push(...args);
  const proc = spawn(BIN, full, {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, GGML_NO_BACKTRACE: '1', ...env },
  });
  live.add(proc);
  let stderr = '';
  let stdout = '';
  const exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      live.delete(proc);
      resolve({ code, signal });
    });
  });
  proc.stdout.on('data', (d) => { stdout += d; });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no port line after ${timeoutMs} ms; stderr:\n${stderr}`)), timeoutMs);
    proc.stderr.on('data', (d) => {
      stderr += d;
      const m = /kvstash: port=(\d+)/.exec(stderr);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    exited.then(({ code, signal }) => {
      clearTimeout(timer);
      reject(new Error(`server exited (code ${code}, signal ${signal}) before listening; stderr:\n${stderr}`));
    });
  });
  const srv = {
    proc,
    port,
    base: `http://127.0.0.1:${port}`,
    get stderr() { return stderr; },
    get stdout() { return stdout; },
    exited,
    // SIGTERM, then the exit status (SIGKILL after timeoutMs, reported as a failure).
    async stop(timeoutMs = 30000) {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGTERM');
      let timer;
      const t = new Promise((r) => { timer = setTimeout(() => r('timeout'), timeoutMs); });
      const r = await Promise.race([exited, t]);
      clearTimeout(timer);
      if (r === 'timeout') {
        proc.kill('SIGKILL');
        await exited;
        return { code: null, signal: 'timeout', stderr };
      }
      return { ...r, stderr };
    },
  };
  // Listening is announced after the daemon started; /health must answer.
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const r = await fetch(`${srv.base}/health`);
      if (r.status === 200) break;
    } catch { /* not yet */ }
    if (Date.now() > deadline) throw new Error(`/health never answered; stderr:\n${stderr}`);
    await sleep(50);
  }
  return srv;
}

// Stops the server and asserts a clean exit (code 0).
export async function stopOk(srv) {
  const r = await srv.stop();
  assert.equal(r.code, 0, `server exit code ${r.code} signal ${r.signal}; stderr tail:\n${r.stderr.slice(-3000)}`);
}

export async function postJSON(srv, path, body, { headers = {}, raw = false, signal } = {}) {
  const res = await fetch(srv.base + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: raw ? body : JSON.stringify(body),
    signal,
  });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}

export async function getJSON(srv, path, { headers = {} } = {}) {
  const res = await fetch(srv.base + path, { headers });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}

// A non-streamed chat completion that must succeed; returns the response JSON.
export async function chat(srv, messages, extra = {}, opts = {}) {
  const r = await postJSON(srv, '/v1/chat/completions', { messages, temperature: 0, max_tokens: 16, ...extra }, opts);
  assert.equal(r.status, 200, `chat failed: ${r.status} ${r.text}`);
  return r.json;
}

// Parses an SSE body into events: each { data } string; JSON-decoded into
// .json unless it is [DONE]. Asserts the framing: "data: X" lines, blank-line separated.
export function parseSSE(text) {
  const events = [];
  const blocks = text.split('\n\n');
  assert.equal(blocks.pop(), '', `SSE body does not end with a blank line: ${JSON.stringify(text.slice(-80))}`);
  for (const b of blocks) {
    assert.ok(b.startsWith('data: '), `SSE event without "data: ": ${JSON.stringify(b.slice(0, 80))}`);
    const data = b.slice(6);
    assert.ok(!data.includes('\n'), 'an SSE event spans lines');
    events.push({ data, json: data === '[DONE]' ? null : JSON.parse(data) });
  }
  return events;
}

// A streamed request read to the end. Returns { status, events, text, done, finish, usage }.
export async function stream(srv, path, body, { headers = {} } = {}) {
  const res = await fetch(srv.base + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...headers },
    body: JSON.stringify({ ...body, stream: true }),
  });
  const raw = await res.text();
  if (res.status !== 200) return { status: res.status, raw, json: JSON.parse(raw) };
  assert.match(res.headers.get('content-type'), /^text\/event-stream/);
  const events = parseSSE(raw);
  let text = '';
  let finish = null;
  let usage = null;
  let error = null;
  for (const e of events) {
    if (!e.json) continue;
    if (e.json.error) { error = e.json.error; continue; }
    if (e.json.usage) usage = e.json;
    for (const c of e.json.choices ?? []) {
      text += c.delta?.content ?? c.text ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  const done = events.length > 0 && events[events.length - 1].data === '[DONE]';
  return { status: res.status, raw, events, text, done, finish, usage, error };
}

// Reads a streamed response incrementally: calls onEvent(json|null, data) per
// event; stops when onEvent returns true (then aborts the request) or at the end.
export async function streamUntil(srv, path, body, onEvent, { signal } = {}) {
  const ac = new AbortController();
  if (signal) signal.addEventListener('abort', () => ac.abort());
  const res = await fetch(srv.base + path, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ ...body, stream: true }),
    signal: ac.signal,
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  const seen = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return { aborted: false, events: seen };
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        assert.ok(block.startsWith('data: '));
        const data = block.slice(6);
        const json = data === '[DONE]' ? null : JSON.parse(data);
        seen.push(data);
        if (onEvent(json, data)) {
          ac.abort();
          return { aborted: true, events: seen };
        }
      }
    }
  } catch (e) {
    if (ac.signal.aborted) return { aborted: true, events: seen };
    throw e;
  }
}

// Polls fn until it returns a truthy value; fails after timeoutMs.
export async function until(fn, what, timeoutMs = 20000, stepMs = 50) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(stepMs);
  }
}

// Parses Prometheus text; asserts every non-comment line is `name{labels} value`.
// Returns a Map from "name{labels}" (or "name") to the numeric value.
export function parseProm(text) {
  const out = new Map();
  const sample = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (-?[0-9.eE+-]+|NaN|[+-]Inf)$/;
  for (const line of text.split('\n')) {
    if (line === '') continue;
    if (line.startsWith('#')) {
      assert.match(line, /^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$/, `bad comment line: ${line}`);
      continue;
    }
    const m = sample.exec(line);
    assert.ok(m, `not a Prometheus sample line: ${JSON.stringify(line)}`);
    out.set(m[1] + (m[2] ?? ''), Number(m[3]));
  }
  return out;
}

export async function metrics(srv, headers = {}) {
  const res = await fetch(srv.base + '/metrics', { headers });
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/plain/);
  return parseProm(await res.text());
}

// An OpenAI-style error body with the expected status/code/param.
export function assertError(r, status, code, param) {
  assert.equal(r.status, status, `expected ${status}, got ${r.status}: ${r.text}`);
  assert.ok(r.json && typeof r.json.error === 'object', `no error object: ${r.text}`);
  const e = r.json.error;
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, 'string');
  if (code !== undefined) assert.equal(e.code, code, `code: ${r.text}`);
  if (param !== undefined) assert.equal(e.param, param, `param: ${r.text}`);
  return e;
}

// A request that keeps its slot busy for seconds on the tiny model, whatever
// it samples: a ~7200-token prompt prefilled one token per step. Servers for
// it need LONG_ARGS (8192-token slots, batch 2: the scheduler decodes >= 2 rows
// per sequence, so 2 is the smallest batch that makes progress).
export const LONG_ARGS = ['--ctx', '8192', '--batch', '2'];
export const LONG_PROMPT = 'hello world '.repeat(1800);
export const longChat = (extra = {}) => ({
  messages: [{ role: 'user', content: LONG_PROMPT }], temperature: 0, max_tokens: 64, cache_prompt: false, ...extra,
});

export async function slots(srv, headers = {}) {
  const r = await getJSON(srv, '/slots', { headers });
  assert.equal(r.status, 200);
  return r.json;
}

// ---------------------------------------------------------------------------
// Persistent store helpers (store.test.mjs).

// Writes a YAML config with a `store:` section into file and returns its path.
// cacheDir and shmDir are required: a test never uses ~/.cache or /dev/shm.
// tiers: { ram, shm, disk } budgets in bytes; reasons: { cold: 'disk', ... }.
export async function writeStoreConfig(file, { cacheDir, shmDir, stride = 16, minTokens = 32,
  continuedInterval, shutdownTimeoutMs, finishSaveDelayMs, tiers = {}, reasons = {} }) {
  const { writeFileSync } = await import('node:fs');
  assert.ok(cacheDir && shmDir, 'writeStoreConfig needs cacheDir and shmDir');
  const lines = ['store:', '  enabled: true', `  cache_dir: ${cacheDir}`, `  shm_dir: ${shmDir}`,
    `  stride: ${stride}`, `  min_tokens: ${minTokens}`];
  if (continuedInterval !== undefined) lines.push(`  continued_interval: ${continuedInterval}`);
  if (shutdownTimeoutMs !== undefined) lines.push(`  shutdown_timeout_ms: ${shutdownTimeoutMs}`);
  if (finishSaveDelayMs !== undefined) lines.push(`  finish_save_delay_ms: ${finishSaveDelayMs}`);
  const t = Object.entries(tiers);
  if (t.length) {
    lines.push('  tiers:');
    for (const [k, v] of t) lines.push(`    ${k}: { max_bytes: ${v} }`);
  }
  const r = Object.entries(reasons);
  if (r.length) lines.push(`  reasons: { ${r.map(([k, v]) => `${k}: ${v}`).join(', ')} }`);
  writeFileSync(file, lines.join('\n') + '\n');
  return file;
}

const sumPrefix = (m, prefix) => [...m].filter(([k]) => k.startsWith(prefix)).reduce((a, [, v]) => a + v, 0);

// Waits until the store has processed every save the scheduler handed it:
// no finish save still waiting for its delay (store.finish_save_delay_ms),
// nothing queued, and every save request accounted for (written or not written,
// with its cause). Returns the final metrics. headers: for a server with keys.
export async function settleStore(srv, timeoutMs = 30000, headers = {}) {
  let last;
  try {
    return await until(async () => {
      const m = (last = await metrics(srv, headers));
      const asked = sumPrefix(m, 'kvstash_store_save_requests_total{');
      const done = sumPrefix(m, 'kvstash_store_saves_total{') + sumPrefix(m, 'kvstash_store_saves_not_written_total{');
      return !m.get('kvstash_store_deferred_saves') && m.get('kvstash_store_queued_saves') === 0 && done === asked
        ? m : null;
    }, 'the store writer to finish its queue', timeoutMs, 25);
  } catch (e) {
    const lines = last ? [...last].filter(([k]) => k.startsWith('kvstash_store')).map(([k, v]) => `${k} ${v}`) : [];
    throw new Error(`${e.message}\n${lines.join('\n')}`);
  }
}

// Sum of a metric family's samples ("kvstash_store_saves_total" -> every reason).
export function metricSum(m, name) { return sumPrefix(m, name + '{'); }

// Published kvfiles (<64 hex>.kvs) and temp files (.*.tmp) of a tier directory.
export async function kvFiles(dir) {
  const { readdirSync, existsSync } = await import('node:fs');
  if (!existsSync(dir)) return [];
  return readdirSync(dir).filter((f) => /^[0-9a-f]{64}\.kvs$/.test(f)).sort();
}
export async function tempFiles(dir) {
  const { readdirSync, existsSync } = await import('node:fs');
  if (!existsSync(dir)) return [];
  return readdirSync(dir).filter((f) => f.endsWith('.tmp'));
}

// The fixed part of a kvfile header (docs/kvfile-format.md).
export function kvHeader(buf) {
  assert.ok(buf.length >= 160, `kvfile of ${buf.length} bytes`);
  return {
    magic: buf.subarray(0, 8).toString('latin1'),
    version: buf.readUInt32LE(8),
    headerLen: buf.readUInt32LE(12),
    stateVersion: buf.readUInt32LE(16),
    reason: buf.readUInt32LE(20),
    nTokens: buf.readUInt32LE(24),
    flags: buf.readUInt32LE(28),
    payloadLen: Number(buf.readBigUInt64LE(32)),
    modelFp: buf.subarray(48, 80).toString('hex'),
    key: buf.subarray(112, 144).toString('hex'),
    headerCheck: buf.readBigUInt64LE(152),
  };
}

// XXH3-64 (seed 0, default secret) for inputs of 129..240 bytes — enough to
// recompute a kvfile's 152-byte header check. The kvfile format stores a
// computed 0 as "KVSTASH0" (kvNonzero).
const XXH3_SECRET = Buffer.from(
  'b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671fcb79e64eccc0e578825ad07dccff7221' +
  'b8084674f743248ee03590e6813a264c3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8' +
  'a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364eac5ac8334d3ebc3c581a0fffa1363eb' +
  '170ddd51b7f0da49d316552629d4689e2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e', 'hex');
const M64 = (1n << 64n) - 1n;
function xxhMix16(buf, off, soff) {
  const lo = buf.readBigUInt64LE(off) ^ XXH3_SECRET.readBigUInt64LE(soff);
  const hi = buf.readBigUInt64LE(off + 8) ^ XXH3_SECRET.readBigUInt64LE(soff + 8);
  const p = lo * hi;
  return ((p & M64) ^ (p >> 64n)) & M64;
}
function xxhAvalanche(h) {
  h ^= h >> 37n;
  h = (h * 0x165667919E3779F9n) & M64;
  return h ^ (h >> 32n);
}
export function xxh3_64(buf) {
  const len = buf.length;
  assert.ok(len >= 129 && len <= 240, 'xxh3_64 here only handles 129..240 bytes');
  let acc = (BigInt(len) * 0x9E3779B185EBCA87n) & M64;
  for (let i = 0; i < 8; i++) acc = (acc + xxhMix16(buf, 16 * i, 16 * i)) & M64;
  acc = xxhAvalanche(acc);
  for (let i = 8; i < Math.floor(len / 16); i++) acc = (acc + xxhMix16(buf, 16 * i, 16 * (i - 8) + 3)) & M64;
  acc = (acc + xxhMix16(buf, len - 16, 136 - 17)) & M64;
  return xxhAvalanche(acc);
}
export const kvNonzero = (h) => (h === 0n ? 0x4b56535441534830n : h);

// Runs `kvstash ARGS...` to completion: { code, stdout, stderr }.
export async function runBin(args, { timeoutMs = 60000 } = {}) {
  requireEnv();
  const { spawnSync } = await import('node:child_process');
  const r = spawnSync(BIN, args, { encoding: 'utf8', timeout: timeoutMs, env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  if (r.error) throw r.error;
  return { code: r.status, signal: r.signal, stdout: r.stdout, stderr: r.stderr };
}

// ---------------------------------------------------------------------------
// Helpers of the cache tests (imc, spc, config).

// The tiny model's chat template (ChatML, src/engine/mkmodel.c), rendered in
// JS: the tests derive expected token counts from it with countTokens().
export function chatml(messages, addGenerationPrompt = true) {
  let s = '';
  for (const m of messages) s += `<|im_start|>${m.role}\n${m.content}<|im_end|>\n`;
  return addGenerationPrompt ? s + '<|im_start|>assistant\n' : s;
}

// Tokens of `text` as the server tokenizes a prompt (BOS included, special
// tokens parsed): usage.prompt_tokens of a 1-token completion. Use a server
// whose cache does not matter (the --no-cache-prompt reference): a completion
// takes a slot like any request.
export async function countTokens(srv, text) {
  const r = await postJSON(srv, '/v1/completions', { prompt: text, max_tokens: 1, temperature: 0 });
  assert.equal(r.status, 200, `countTokens: ${r.status} ${r.text}`);
  return r.json.usage.prompt_tokens;
}

// Writes a YAML config into a per-process temporary directory (removed at
// exit) and returns its path.
import { mkdtempSync as cfgMkdtemp, writeFileSync as cfgWrite, rmSync as cfgRm } from 'node:fs';
import { tmpdir as cfgTmpdir } from 'node:os';
import { join as cfgJoin } from 'node:path';
let cfgDir = null;
let cfgN = 0;
export function writeConfig(yaml) {
  if (!cfgDir) {
    cfgDir = cfgMkdtemp(cfgJoin(cfgTmpdir(), 'kvstash-e2e-cfg-'));
    process.on('exit', () => { try { cfgRm(cfgDir, { recursive: true, force: true }); } catch { /* gone */ } });
  }
  const p = cfgJoin(cfgDir, `c${++cfgN}.yaml`);
  cfgWrite(p, yaml);
  return p;
}

// The reply text of a chat completion.
export const replyOf = (r) => r.choices[0].message.content;

// say(srv, msgs, user, what): appends a user message to msgs, runs it with
// turn(srv, msgs, what) (a test's own turn, which compares with its reference
// server), appends the reply and returns turn's result.
export const makeSay = (turn) => async (srv, msgs, user, what) => {
  msgs.push({ role: 'user', content: user });
  const r = await turn(srv, msgs, what);
  msgs.push({ role: 'assistant', content: r.choices[0].message.content });
  return r;
};

// Asserts a cached reply equals the reference server's reply to the same request.
export function assertSameReply(got, ref, what) {
  assert.equal(replyOf(got), replyOf(ref), `${what}: text differs from the uncached reference`);
  assert.equal(got.choices[0].finish_reason, ref.choices[0].finish_reason, `${what}: finish_reason`);
  assert.equal(got.usage.completion_tokens, ref.usage.completion_tokens, `${what}: completion_tokens`);
  assert.equal(got.usage.prompt_tokens, ref.usage.prompt_tokens, `${what}: prompt_tokens`);
}

// Value of a metric (0 when absent) and the difference between two scrapes.
export const metric = (m, name) => m.get(name) ?? 0;
export const mdelta = (a, b, name) => metric(b, name) - metric(a, name);

// A tiny random-weight GGUF made for a real chat template (its vocabulary has
// the template's special tokens), written to dir/name; returns its path.
export const QWEN25_TEMPLATE = 'Qwen-Qwen2.5-7B-Instruct.jinja';
export function templateModel(dir, template = QWEN25_TEMPLATE, name = 'qwen25.gguf') {
  const templates = process.env.KS_TEMPLATES_DIR;
  assert.ok(templates, 'KS_TEMPLATES_DIR is not set');
  const out = path.join(dir, name);
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', '1', '--chat-template', path.join(templates, template),
    out], { stdio: 'ignore' });
  return out;
}

// ---------------------------------------------------------------------------
// Raw HTTP over one TCP connection, for what an HTTP client would not send
// (conflicting headers, partial headers, a half-close).
import net from 'node:net';

// Opens a connection (from localAddress: any 127.x.y.z is loopback, and a
// different one is a different client for per-address limits), writes
// payload (string or Buffer; nothing when null), with halfClose shuts down
// the sending side (shutdown(SHUT_WR): the socket still reads), and collects
// what the server sends until it closes the connection or timeoutMs passes.
// Returns { data (Buffer), text (latin1), closed (by the server), reset,
// ms (until closed or timed out) }.
export function rawHTTP(srv, payload, { localAddress, halfClose = false, timeoutMs = 10000 } = {}) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const chunks = [];
    let timedOut = false;
    let reset = false;
    const s = net.connect({ port: srv.port, host: '127.0.0.1', localAddress, allowHalfOpen: true }, () => {
      if (payload !== null) s.write(payload);
      if (halfClose) s.end();
    });
    const timer = setTimeout(() => { timedOut = true; s.destroy(); }, timeoutMs);
    s.on('data', (d) => chunks.push(d));
    s.on('end', () => s.destroy()); // the server closed its side
    s.on('error', (e) => {
      if (e.code === 'ECONNRESET' || e.code === 'EPIPE') { reset = true; return; }
      clearTimeout(timer);
      reject(e);
    });
    s.on('close', () => {
      clearTimeout(timer);
      const data = Buffer.concat(chunks);
      resolve({ data, text: data.toString('latin1'), closed: !timedOut, reset, ms: Date.now() - t0 });
    });
  });
}

// Opens a connection, writes payload (unless null) and keeps it open:
// { sock, closed (a promise of the ms from open to the server's close or
// reset), isClosed (), data () (what arrived so far) }.
export function rawOpen(srv, payload, { localAddress } = {}) {
  return new Promise((resolve, reject) => {
    const t0 = Date.now();
    const chunks = [];
    let connected = false;
    let closedMs = null;
    let onClose;
    const closed = new Promise((r) => { onClose = r; });
    const s = net.connect({ port: srv.port, host: '127.0.0.1', localAddress }, () => {
      connected = true;
      if (payload !== null) s.write(payload);
      resolve({ sock: s, closed, isClosed: () => closedMs !== null, data: () => Buffer.concat(chunks) });
    });
    s.on('data', (d) => chunks.push(d));
    s.on('error', (e) => { if (!connected) reject(e); }); // after the connect: a reset, 'close' follows
    s.on('close', () => { closedMs = Date.now() - t0; onClose(closedMs); });
  });
}

// Splits what a server sent on one connection into responses: [{ status,
// headers (lower-case names), body (Buffer, de-chunked) }], interim 1xx
// responses included. Stops at an incomplete response.
export function parseHTTP(buf) {
  const out = [];
  let at = 0;
  while (at < buf.length) {
    const end = buf.indexOf('\r\n\r\n', at, 'latin1');
    if (end < 0) break;
    const lines = buf.subarray(at, end).toString('latin1').split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]);
    assert.ok(m, `not a status line: ${JSON.stringify(lines[0])}`);
    const headers = {};
    for (const l of lines.slice(1)) {
      const i = l.indexOf(':');
      headers[l.slice(0, i).trim().toLowerCase()] = l.slice(i + 1).trim();
    }
    const status = Number(m[1]);
    at = end + 4;
    let body = Buffer.alloc(0);
    if (status >= 200 && headers['transfer-encoding'] === 'chunked') {
      const parts = [];
      for (;;) {
        const eol = buf.indexOf('\r\n', at, 'latin1');
        if (eol < 0) return out;
        const n = parseInt(buf.subarray(at, eol).toString('latin1'), 16);
        at = eol + 2;
        if (n === 0) { at += 2; break; }
        parts.push(buf.subarray(at, at + n));
        at += n + 2;
      }
      body = Buffer.concat(parts);
    } else if (status >= 200 && headers['content-length'] !== undefined) {
      const n = Number(headers['content-length']);
      if (at + n > buf.length) break;
      body = buf.subarray(at, at + n);
      at += n;
    }
    out.push({ status, headers, body });
  }
  return out;
}

// A request as bytes: method, path, extra header lines, body (null: none,
// and no Content-Length).
export function rawRequest(method, path, { headers = [], body = '' } = {}) {
  const b = Buffer.from(body ?? '');
  const h = ['Host: 127.0.0.1', ...headers];
  if (body !== null && !headers.some((l) => /^(content-length|transfer-encoding)\s*:/i.test(l)))
    h.push(`Content-Length: ${b.length}`);
  return Buffer.concat([Buffer.from(`${method} ${path} HTTP/1.1\r\n${h.join('\r\n')}\r\n\r\n`), b]);
}

// The model the agent tests run: the tiny shape with a vocabulary as dense
// as a real tokenizer's on coding agents' prompts and a 128K trained context
// (mkmodel preset tiny-agent), with Qwen3-Coder's template, the template of a
// model people run behind agents. Written to dir/agent.gguf.
export function agentModel(dir, template = 'Qwen3-Coder.jinja') {
  const templates = process.env.KS_TEMPLATES_DIR;
  assert.ok(templates, 'KS_TEMPLATES_DIR is not set');
  const out = path.join(dir, 'agent.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny-agent', '--seed', '1', '--chat-template', path.join(templates, template),
    out], { stdio: 'ignore' });
  return out;
}

// The server's line for each finished generation since `from` (an offset
// into its stderr): [{ id, prompt, cached, model }] in the order they
// finished (model: the model that served it, only on a server of several).
export function servedSince(srv, from = 0) {
  const out = [];
  const re = /I http +(\S+?)(?:\[\d+\])? slot \d+: prompt (\d+) tok, cached (\d+) ([^\n]*)/g;
  for (const m of srv.stderr.slice(from).matchAll(re)) {
    const model = /, model (\S+)$/.exec(m[4])?.[1];
    out.push({ id: m[1], prompt: +m[2], cached: +m[3], ...(model ? { model } : {}) });
  }
  return out;
}

// The refusals (4xx) the server logged since `from`.
export const refusedSince = (srv, from = 0) => srv.stderr.slice(from).split('\n').filter((l) => / -> 4\d\d /.test(l));

// ---------------------------------------------------------------------------
// A redis-server on <root>/r.sock (no TCP, no persistence) for the tests of a
// shared cache, and the store configuration of one "host" using it.
// startRedis(root) -> { sock, kill() }; redisHostConfig(root, host, sock,
// prefix) -> the YAML file of a full store in <root>/<host> with the redis tier.
export async function startRedis(root) {
  const { spawn: spawnR, spawnSync: spawnSyncR } = await import('node:child_process');
  const { existsSync } = await import('node:fs');
  assert.equal(spawnSyncR('redis-server', ['--version']).status, 0, 'redis-server is needed (scripts/setup.sh installs it)');
  const sock = path.join(root, 'r.sock');
  const proc = spawnR('redis-server', ['--port', '0', '--unixsocket', sock, '--unixsocketperm', '700', '--dir', root,
    '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  await until(() => existsSync(sock) &&
    spawnSyncR('redis-cli', ['-s', sock, 'ping'], { encoding: 'utf8' }).stdout?.trim() === 'PONG', 'redis-server to answer', 10000);
  return { sock, kill: () => proc.kill('SIGKILL') };
}
export async function redisHostConfig(root, host, sock, prefix) {
  const { mkdirSync: mk, writeFileSync: wr } = await import('node:fs');
  const d = path.join(root, host);
  mk(d, { recursive: true });
  const f = path.join(d, 'kvstash.yaml');
  wr(f, ['store:', '  enabled: true', `  cache_dir: ${d}/disk`, `  shm_dir: ${d}/shm`, '  stride: 16',
    '  min_tokens: 16', '  tiers:', '    redis:', `      url: "unix://${sock}"`, `      key_prefix: ${prefix}`].join('\n') + '\n');
  return f;
}

// A conversation whose turns alternate between two hosts sharing one Redis
// (redisHostConfig): questions[i] goes to hosts[i % 2] through
// compare(srv, msgs, what) — the caller's check that the reply equals the
// uncached one, returning the reply — and from the second turn on is read
// from Redis (cache mode store, tier redis); check(reply, what, turn) adds
// the caller's own assertions. Each host's saves reach Redis before the
// other host is asked.
export async function alternateHosts(hosts, msgs, questions, compare, check = () => {}) {
  for (let turn = 0; turn < questions.length; turn++) {
    const srv = hosts[turn % 2];
    msgs.push({ role: 'user', content: questions[turn] });
    const what = `turn ${turn + 1} on host ${'ab'[turn % 2]}`;
    const a = await compare(srv, msgs, what);
    if (turn > 0) {
      assert.equal(a.cache.mode, 'store', `${what}: ${JSON.stringify(a.cache)}`);
      assert.equal(a.cache.tier, 'redis', `${what}: ${JSON.stringify(a.cache)}`);
    }
    check(a, what, turn);
    msgs.push({ role: 'assistant', content: replyOf(a) });
    await settleStore(srv);
  }
}
