#!/usr/bin/env node
// http_bench.mjs — benchmarks of `kvstash serve` over real HTTP (no npm
// dependencies: fetch + child_process). Not a test: nothing here fails on a
// number; it prints markdown tables and writes CSV files for the plots.
//
// usage: node bench/http_bench.mjs WORKLOAD [--key value ...]
//   WORKLOAD   multiturn | subagents | sharedsys | restart | workingset | saves | context
//   --bin B    kvstash binary (default build/kvstash; $KS_BIN)
//   --model M  GGUF model (default build/models/bench.gguf; $KS_MODEL)
//   --out D    CSV / markdown / server logs (default bench/out)
//   --threads N  --threads of every server (default 2)
//   other --keys: the workload's sizes (see WORKLOADS below; every default is printed).
//
// Method (docs/BENCHMARKS.md, "Server benchmarks"):
//  - Cache-on and cache-off servers run at the same time; every step sends the
//    same messages to each of them in turn (rotating who goes first) and waits
//    for the answer before the next request, so only one server computes at a
//    time and both see the same machine noise.
//  - TTFT = client-side time from sending the request (stream: true) to the
//    first SSE chunk that carries content (or the finish chunk when the reply
//    is empty). The server's timings.prompt_ms is recorded beside it.
//  - Floor of a cached request = TTFT of a fresh single-user-message request
//    with the same number of prompt tokens as the request prefilled
//    (n = prompt_tokens - cached_tokens), sent to the cache-off server right
//    after it. A request with nothing cached has the cache-off TTFT of the very
//    same prompt as its floor. Every message word is one token of the bench
//    model's vocabulary, so a floor prompt has n tokens exactly (checked).
//  - "ideal n" = the tokens this conversation's server has never seen: the
//    prompt minus the previous turn's prompt + reply (minus a system prompt
//    another conversation sent before, for the shared-system workload). Its
//    floor is measured the same way, once per step. A least-squares line
//    through the floor samples (ms = a + b n) is printed as the prefill speed.
//  - The conversation history always takes the cache-off server's reply, so
//    every server sees the same prompts; replies that differ are counted
//    (kvstash promises they never do).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, words, floorProcess } from './peer_lib.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

// ---------------------------------------------------------------- arguments
const { opt, rest, die, str } = parseArgs('http_bench', process.argv.slice(2));
const WL = rest[0];
if (rest.length > 1) die(`bad argument ${rest[1]}`);
const num = (k, d) => {
  if (opt[k] === undefined) return d;
  const v = Number(opt[k]);
  if (!Number.isFinite(v)) die(`--${k} wants a number`);
  return v;
};
const BIN = path.resolve(str('bin', process.env.KS_BIN || path.join(ROOT, 'build/kvstash')));
const MODEL = path.resolve(str('model', process.env.KS_MODEL || path.join(ROOT, 'build/models/bench.gguf')));
const OUT = path.resolve(str('out', path.join(ROOT, 'bench/out')));
const THREADS = num('threads', 2);
fs.mkdirSync(OUT, { recursive: true });

// ---------------------------------------------------------------- utilities
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

function median(xs) {
  const v = xs.filter((x) => x !== null && x !== undefined && Number.isFinite(x)).sort((a, b) => a - b);
  if (!v.length) return NaN;
  const h = v.length >> 1;
  return v.length % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}
const sum = (xs) => xs.reduce((a, b) => a + b, 0);
function f(x, d = 0) {
  if (x === null || x === undefined || !Number.isFinite(x)) return '–';
  return x.toFixed(d);
}
const fr = (x) => (Number.isFinite(x) ? `${x.toFixed(2)}×` : '–');

function table(headers, rows) {
  const numeric = (c) => /^(-?[\d.]+|–)(×|%| ms)?$/.test(String(c));
  const align = headers.map((_, i) => (rows.length && rows.every((r) => numeric(r[i]) || r[i] === 'all') ? '--:' : '---'));
  const out = [`| ${headers.join(' | ')} |`, `|${align.join('|')}|`];
  for (const r of rows) out.push(`| ${r.join(' | ')} |`);
  return out.join('\n');
}

let seedCounter = 1000;
const freshSeed = () => ++seedCounter * 7919;

// ---------------------------------------------------------------- machine facts / CPU accounting
function procStatBusy() {
  const l = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal
  const idle = l[3] + (l[4] || 0);
  const total = l.slice(0, 8).reduce((a, b) => a + b, 0);
  return { busy: total - idle, total };
}
function pidCpuTicks(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const rest = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return Number(rest[11]) + Number(rest[12]); // utime stime
  } catch {
    return 0;
  }
}
const TICK = 100; // USER_HZ
const facts = {};
function machineFacts() {
  const cpu = os.cpus();
  facts.date = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
  facts.nproc = cpu.length;
  facts.cpu = cpu[0] ? cpu[0].model.trim() : '?';
  facts.load_start = os.loadavg().map((x) => x.toFixed(2)).join(' ');
  try {
    facts.git = execFileSync('git', ['-C', ROOT, 'describe', '--always', '--dirty'], { encoding: 'utf8' }).trim();
  } catch {
    facts.git = '?';
  }
  try {
    facts.version = execFileSync(BIN, ['version'], { encoding: 'utf8' }).trim().split('\n')[0];
  } catch {
    facts.version = '?';
  }
  facts.stat0 = procStatBusy();
  facts.t0 = now();
}
let serverTicks = 0; // CPU ticks of servers this run started (added at their exit)

// ---------------------------------------------------------------- servers
const live = new Set();
process.on('exit', () => {
  for (const p of live) {
    try {
      p.kill('SIGKILL');
    } catch {
      /* gone */
    }
  }
});
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => process.exit(130));

const logsOpened = new Set();
const servers = []; // every server started: its name and command line (for the report)

async function startServer(name, args, { log = 'info', timeoutMs = 120000 } = {}) {
  const full = ['serve', '-m', MODEL, '--port', '0', '--log', log, '--threads', String(THREADS), ...args];
  const proc = spawn(BIN, full, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  live.add(proc);
  const logFile = path.join(OUT, `server_${WL}-${name}.log`);
  // One log per server name and run (a restarted server appends to its log).
  const ws = fs.createWriteStream(logFile, { flags: logsOpened.has(logFile) ? 'a' : 'w' });
  logsOpened.add(logFile);
  ws.write(`# ${new Date().toISOString()} ${BIN} ${full.join(' ')}\n`);
  let stderr = '';
  let exited = null;
  const exitP = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      serverTicks += srv.ticks;
      live.delete(proc);
      exited = { code, signal };
      resolve(exited);
    });
  });
  proc.stderr.on('data', (d) => {
    stderr += d;
    ws.write(d);
  });
  const srv = {
    name,
    proc,
    cmd: `kvstash ${full.join(' ').replace(MODEL, path.relative(ROOT, MODEL))}`,
    get stderr() {
      return stderr;
    },
    ticks: 0,
    async stop(timeoutMs2 = 60000) {
      srv.ticks = pidCpuTicks(proc.pid);
      if (!exited) proc.kill('SIGTERM');
      let timer;
      const t = new Promise((res) => {
        timer = setTimeout(() => res('timeout'), timeoutMs2);
      });
      const r = await Promise.race([exitP, t]);
      clearTimeout(timer);
      if (r === 'timeout') {
        proc.kill('SIGKILL');
        await exitP;
      }
      ws.end();
      return exited;
    },
  };
  // stop() samples ticks just before SIGTERM; a crash leaves them at 0.
  servers.push({ name, cmd: srv.cmd });
  const t0 = Date.now();
  srv.port = await new Promise((resolve, reject) => {
    const timer = setInterval(() => {
      const m = /kvstash: port=(\d+)/.exec(stderr);
      if (m) {
        clearInterval(timer);
        resolve(Number(m[1]));
      } else if (exited || Date.now() - t0 > timeoutMs) {
        clearInterval(timer);
        reject(new Error(`server ${name} did not start: ${stderr.slice(-2000)}`));
      }
    }, 20);
  });
  srv.base = `http://127.0.0.1:${srv.port}`;
  for (;;) {
    try {
      const r = await fetch(`${srv.base}/health`);
      if (r.status === 200) break;
    } catch {
      /* not yet */
    }
    if (Date.now() - t0 > timeoutMs) throw new Error(`server ${name}: /health never answered`);
    await sleep(50);
  }
  return srv;
}

async function metrics(srv) {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  const m = new Map();
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const i = line.lastIndexOf(' ');
    m.set(line.slice(0, i), Number(line.slice(i + 1)));
  }
  m.g = (k) => m.get(k) ?? 0;
  return m;
}

// One streamed chat completion. Returns client TTFT and total, and the
// server's usage / timings / cache fields.
async function chat(srv, messages, { maxTokens = 32, extra = {} } = {}) {
  const body = {
    messages,
    max_tokens: maxTokens,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
    ...extra,
  };
  const payload = JSON.stringify(body);
  const t0 = now();
  const res = await fetch(`${srv.base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: payload,
  });
  if (res.status !== 200) throw new Error(`${srv.name}: HTTP ${res.status} ${await res.text()}`);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  let ttft = null;
  let content = '';
  let usage = null;
  let timings = null;
  let cache = null;
  let finish = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ')) continue;
      const d = ev.slice(6);
      if (d === '[DONE]') continue;
      const j = JSON.parse(d);
      if (j.error) throw new Error(`${srv.name}: stream error ${JSON.stringify(j.error)}`);
      const c = j.choices && j.choices[0];
      const piece = c && c.delta ? c.delta.content : null;
      if (ttft === null && (piece || (c && c.finish_reason))) ttft = now() - t0;
      if (piece) content += piece;
      if (c && c.finish_reason) finish = c.finish_reason;
      if (j.usage) usage = j.usage;
      if (j.timings) timings = j.timings;
      if (j.cache) cache = j.cache;
    }
  }
  const total = now() - t0;
  const pt = usage ? usage.prompt_tokens : NaN;
  const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : 0;
  return {
    server: srv.name,
    ttft,
    total,
    content,
    finish,
    prompt_tokens: pt,
    cached_tokens: cached,
    n_prefilled: pt - cached,
    completion_tokens: usage ? usage.completion_tokens : NaN,
    prompt_ms: timings ? timings.prompt_ms : NaN,
    prompt_n: timings ? timings.prompt_n : NaN,
    mode: cache ? cache.mode : '?',
    reason: cache && cache.reason ? cache.reason : '',
    tier: cache && cache.tier ? cache.tier : '',
    restore_ms: cache && typeof cache.restore_ms === 'number' ? cache.restore_ms : NaN,
    slot: cache ? cache.slot : -1,
  };
}

// ---------------------------------------------------------------- floors
// Calibrated on the cache-off server: prompt_tokens of a single user message
// of w words = fixed + w (checked with two sizes).
const floorFit = { fixed: null, perWord: 1 };
const samples = []; // [n prefilled, ttft] of fresh prefills on the cache-off server
async function calibrate(off) {
  const a = await chat(off, [{ role: 'user', content: words(20, 1) }], { maxTokens: 1 });
  const b = await chat(off, [{ role: 'user', content: words(120, 2) }], { maxTokens: 1 });
  floorFit.perWord = (b.prompt_tokens - a.prompt_tokens) / 100;
  floorFit.fixed = a.prompt_tokens - 20 * floorFit.perWord;
  samples.push([a.prompt_tokens, a.ttft], [b.prompt_tokens, b.ttft]);
  if (Math.abs(floorFit.perWord - 1) > 0.15)
    process.stderr.write(`http_bench: warning: ${floorFit.perWord} tokens per word (expected 1: not the bench model?)\n`);
}
// TTFT of a fresh request that prefills n tokens, on the cache-off server.
async function floor(off, n) {
  let w = Math.max(1, Math.round((n - floorFit.fixed) / floorFit.perWord));
  const r = await chat(off, [{ role: 'user', content: words(w, freshSeed()) }], { maxTokens: 1 });
  samples.push([r.prompt_tokens, r.ttft]);
  return r;
}
// Least-squares line ms = a + b n through the fresh-prefill samples.
function fitLine() {
  const s = samples.filter(([n, t]) => Number.isFinite(n) && Number.isFinite(t));
  if (s.length < 2) return { a: NaN, b: NaN, at: () => NaN };
  const mx = sum(s.map((x) => x[0])) / s.length;
  const my = sum(s.map((x) => x[1])) / s.length;
  let sxy = 0;
  let sxx = 0;
  for (const [x, y] of s) {
    sxy += (x - mx) * (y - my);
    sxx += (x - mx) * (x - mx);
  }
  const b = sxx > 0 ? sxy / sxx : 0;
  const a = my - b * mx;
  return { a, b, n: s.length, at: (n) => a + b * n };
}
// ------------------------------------------------------ floor at depth
// shared/DESIGN.md: the floor of a cached request is the prefill of its new
// tokens plus the state restore. The new tokens of a turn attend to the whole
// history before them, so `kvstash bench floor --stdin` measures their prefill
// on llama.cpp alone *at that depth*: `depth` tokens of history are put in the
// KV untimed, then only the n new tokens are decoded (timed, to the first
// token's argmax), plus the time to set a depth-token sequence state back into
// the context (added to the floor of a request that restored a state: mode
// spc or store). No kvstash code runs in the timed part, so TTFT / floor@depth
// is what the cache adds on top of the work no cache can skip. Same --threads
// and batch as the servers; it computes only while the servers are idle.
let dproc = null;
async function depthFloor(depth, n) {
  if (!dproc) {
    dproc = floorProcess({ bin: BIN, model: MODEL, threads: THREADS, ctx: 8192, onSpawn: (p) => {
      live.add(p);
      p.on('exit', () => live.delete(p));
    } });
  }
  return dproc.measure(depth, n);
}
function stopDepthFloor() {
  if (dproc) dproc.stop();
  dproc = null;
}
// The floor@depth of request x (its depth measurement d): the prefill, plus
// the restore when the request restored a state.
const restored = (r) => r.mode === 'spc' || r.mode === 'store';
const atDepth = (d, r) => (d ? d.prefill + (restored(r) && d.depth > 0 ? d.restore : 0) : NaN);

// A cached request's floor: the off server's TTFT of the same prompt when it
// prefilled (almost) everything, else a measured fresh prefill of n tokens
// (depth 0), and the floor at the request's depth (.depth).
// The floor of the tokens a conversation added ("ideal n"): measured once per
// step, also at depth (prompt - ideal).
// The floor of a request that prefills (about) its whole prompt: the cache-off
// TTFT of the same prompt, at depth 0 as well.
const sameAsOff = (offSame) => ({ ttft: offSame.ttft, prompt_tokens: offSame.prompt_tokens, same: true,
  depth: { prefill: offSame.ttft, restore: 0, depth: 0 } });
async function idealFloor(off, ideal, offSame) {
  if (ideal >= 0.95 * offSame.prompt_tokens) return { ms: offSame.ttft, depth: sameAsOff(offSame).depth };
  const ms = (await floor(off, Math.max(1, ideal))).ttft;
  return { ms, depth: await depthFloor(offSame.prompt_tokens - ideal, ideal) };
}
async function floorFor(off, on, offSame) {
  if (on.cached_tokens === 0 && offSame) return sameAsOff(offSame);
  const r = await floor(off, Math.max(1, on.n_prefilled));
  r.depth = await depthFloor(on.cached_tokens, on.n_prefilled);
  return r;
}

// ---------------------------------------------------------------- reporting
const report = [];
const say = (s = '') => {
  report.push(s);
  process.stdout.write(s + '\n');
};
function header(title, what) {
  say(`### ${title}`);
  say();
  say(what);
  say();
}
function footer() {
  const st = procStatBusy();
  const el = (now() - facts.t0) / 1000;
  const busyS = (st.busy - facts.stat0.busy) / TICK;
  const mine = serverTicks / TICK + (process.cpuUsage().user + process.cpuUsage().system) / 1e6;
  const other = Math.max(0, busyS - mine) / el;
  say();
  say(`Machine: ${facts.cpu}, nproc ${facts.nproc}; ${facts.date}; kvstash ${facts.version} (git ${facts.git}); ` +
    `--threads ${THREADS}; model ${path.relative(ROOT, MODEL)}. Run time ${el.toFixed(0)} s; load average ` +
    `${facts.load_start} at start, ${os.loadavg().map((x) => x.toFixed(2)).join(' ')} at end; CPU used by other ` +
    `processes during the run: ${other.toFixed(2)} cores on average.`);
  say();
  say('Servers:');
  say();
  const seen = new Set();
  for (const s of servers) {
    if (seen.has(s.cmd)) continue;
    seen.add(s.cmd);
    say(`- ${s.name}: \`${s.cmd}\``);
  }
  const fit = fitLine();
  if (Number.isFinite(fit.b))
    say(`\nFresh prefill on the cache-off server (${fit.n} samples): TTFT ≈ ${fit.a.toFixed(0)} ms + ` +
      `${fit.b.toFixed(2)} ms/token (${(1000 / fit.b).toFixed(0)} tokens/s).`);
  fs.writeFileSync(path.join(OUT, `server_${WL}.md`), report.join('\n') + '\n');
}
function csv(name, headers, rows) {
  fs.writeFileSync(path.join(OUT, name), [headers.join(','), ...rows.map((r) => r.join(','))].join('\n') + '\n');
}
function countModes(rs) {
  const c = {};
  for (const r of rs) {
    const k = r.mode + (r.tier ? `/${r.tier}` : '');
    c[k] = (c[k] || 0) + 1;
  }
  return Object.entries(c)
    .sort((a, b) => b[1] - a[1])
    .map(([k, v]) => `${k} ${v}`)
    .join(', ');
}
const tmpDirs = [];
process.on('exit', () => tmpDirs.forEach((x) => rmDirs(x)));
function tmpStoreDirs(tag) {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), `ks-bench-${tag}-`));
  const shm = fs.existsSync('/dev/shm') ? fs.mkdtempSync(`/dev/shm/ks-bench-${tag}-`) : path.join(d, 'shm');
  const disk = path.join(d, 'disk');
  tmpDirs.push({ d, disk, shm });
  return { d, disk, shm };
}
function rmDirs(dirs) {
  for (const p of [dirs.d, dirs.shm]) fs.rmSync(p, { recursive: true, force: true });
}
function writeConfig(dirs, { ram, shm, disk, reasons } = {}) {
  const lines = ['store:', '  enabled: true', `  cache_dir: ${dirs.disk}`, `  shm_dir: ${dirs.shm}`];
  if (ram !== undefined || shm !== undefined || disk !== undefined) {
    lines.push('  tiers:');
    if (ram !== undefined) lines.push(`    ram: { max_bytes: ${ram} }`);
    if (shm !== undefined) lines.push(`    shm: { max_bytes: ${shm} }`);
    if (disk !== undefined) lines.push(`    disk: { max_bytes: ${disk} }`);
  }
  if (reasons) lines.push(`  reasons: { ${Object.entries(reasons).map(([k, v]) => `${k}: ${v}`).join(', ')} }`);
  const file = path.join(dirs.d, 'kvstash.yaml');
  fs.writeFileSync(file, lines.join('\n') + '\n');
  return { file, text: lines.join('\n') };
}
async function warmup(srv) {
  // The first request of a process pays page faults and allocations.
  await chat(srv, [{ role: 'user', content: words(40, 77) }], { maxTokens: 2 });
}

// Sends msgs to every server of `list` in turn (rotating the first by step),
// returns { name: result }. Appends nothing.
async function roundRobin(list, msgs, step, maxTokens) {
  const out = {};
  for (let k = 0; k < list.length; k++) {
    const s = list[(k + step) % list.length];
    out[s.name] = await chat(s, msgs, { maxTokens });
  }
  return out;
}

// ================================================================= workloads
// Issue 3: S conversations x T turns, round-robin, cache on vs --no-cache-prompt.
async function wlMultiturn() {
  const S = num('convs', 4), T = num('turns', 8), UW = num('msg-words', 60), SW = num('sys-words', 150);
  const MT = num('max-tokens', 32), SLOTS = num('slots', 4), CTX = num('ctx', 2048);
  const on = await startServer('on', ['--slots', String(SLOTS), '--ctx', String(CTX)]);
  const off = await startServer('off', ['--slots', String(SLOTS), '--ctx', String(CTX), '--no-cache-prompt']);
  await warmup(on);
  await calibrate(off);
  const convs = [];
  for (let s = 0; s < S; s++) convs.push([{ role: 'system', content: words(SW, 500 + s) }]);
  const rows = [];
  let step = 0, mismatches = 0;
  for (let t = 1; t <= T; t++) {
    for (let s = 0; s < S; s++) {
      const msgs = convs[s];
      msgs.push({ role: 'user', content: words(UW, 10000 + 100 * s + t) });
      const r = await roundRobin([on, off], msgs, step++, MT);
      if (r.on.content !== r.off.content) mismatches++;
      const fl = await floorFor(off, r.on, r.off);
      const prev = rows.filter((x) => x.conv === s).at(-1);
      const ideal = prev ? r.on.prompt_tokens - (prev.on.prompt_tokens + prev.on.completion_tokens) : r.on.prompt_tokens;
      rows.push({ conv: s, turn: t, on: r.on, off: r.off, floor: fl, ideal, dfl: atDepth(fl.depth, r.on) });
      msgs.push({ role: 'assistant', content: r.off.content });
      process.stderr.write(`turn ${t} conv ${s}: on ${f(r.on.ttft)} ms (${r.on.mode}, cached ${r.on.cached_tokens}/${r.on.prompt_tokens}) ` +
        `off ${f(r.off.ttft)} ms floor(${fl.prompt_tokens}) ${f(fl.ttft)} ms\n`);
    }
  }
  const mOn = await metrics(on);
  await on.stop();
  await off.stop();

  header(`Multi-turn conversations (issue 3): ${S} conversations × ${T} turns, round-robin`,
    `${SW}-word system prompt per conversation, ${UW}-word user messages, max_tokens ${MT}, temperature 0, ` +
    `${SLOTS} slots, ctx ${CTX}. Cache on (default settings) vs \`--no-cache-prompt\`, both servers alive, ` +
    'requests alternated. Per turn: medians over the conversations. "new" = prompt − cached tokens (what the ' +
    'cache-on server prefilled); floor = TTFT of a fresh request of that many tokens on the cache-off server (depth 0); ' +
    'floor@depth = the prefill of those tokens after the cached ones, on llama.cpp alone (`kvstash bench floor`).');
  const trows = [];
  const crow = [];
  for (let t = 1; t <= T; t++) {
    const rs = rows.filter((x) => x.turn === t);
    const ratio = median(rs.map((x) => x.on.ttft / x.floor.ttft));
    const row = {
      t,
      prompt: median(rs.map((x) => x.on.prompt_tokens)),
      cached: median(rs.map((x) => x.on.cached_tokens)),
      nnew: median(rs.map((x) => x.on.n_prefilled)),
      on: median(rs.map((x) => x.on.ttft)),
      off: median(rs.map((x) => x.off.ttft)),
      onp: median(rs.map((x) => x.on.prompt_ms)),
      offp: median(rs.map((x) => x.off.prompt_ms)),
      fl: median(rs.map((x) => x.floor.ttft)),
      dfl: median(rs.map((x) => x.dfl)),
      dratio: median(rs.map((x) => x.on.ttft / x.dfl)),
      ratio,
    };
    trows.push([t, f(row.prompt), f(row.cached), f(row.nnew), f(row.on), f(row.off), fr(row.off / row.on), f(row.fl),
      fr(ratio), f(row.dfl), fr(row.dratio), f(row.onp, 1), f(row.offp, 1), countModes(rs.map((x) => x.on))]);
    crow.push([t, row.prompt, row.cached, row.nnew, f(row.on, 2), f(row.off, 2), f(row.fl, 2), f(ratio, 3), f(row.dfl, 2), f(row.dratio, 3)]);
  }
  say(table(['turn', 'prompt tok', 'cached', 'new', 'TTFT on ms', 'TTFT off ms', 'off/on', 'floor@0 ms', 'on/floor@0',
    'floor@depth ms', 'on/floor@depth', 'prompt_ms on', 'prompt_ms off', 'modes (on)'], trows));
  const later = rows.filter((x) => x.turn >= 2);
  say();
  say(`Turns 2–${T} (${later.length} requests): median TTFT on ${f(median(later.map((x) => x.on.ttft)))} ms, off ` +
    `${f(median(later.map((x) => x.off.ttft)))} ms; median on/floor@depth ${fr(median(later.map((x) => x.on.ttft / x.dfl)))} ` +
    `(target ≤ 1.2×), worst ${fr(Math.max(...later.map((x) => x.on.ttft / x.dfl)))}, within 1.2× in ` +
    `${later.filter((x) => x.on.ttft / x.dfl <= 1.2).length} of ${later.length}; median on/floor@0 ` +
    `${fr(median(later.map((x) => x.on.ttft / x.floor.ttft)))}, worst ${fr(Math.max(...later.map((x) => x.on.ttft / x.floor.ttft)))}. Replies on ≠ off: ${mismatches} of ${rows.length}. ` +
    `Cache hit ratio (on): ${f(100 * mOn.g('kvstash_cache_hit_ratio'), 1)}%.`);
  csv('server_multiturn.csv', ['turn', 'prompt', 'cached', 'new', 'ttft_on', 'ttft_off', 'floor', 'ratio', 'floor_depth', 'ratio_depth'], crow);
}

// Issue 4a: 6 agents with their own system prompts on 3 slots, 5 turns each, interleaved.
async function wlSubagents() {
  const A = num('agents', 6), T = num('turns', 5), UW = num('msg-words', 40), SW = num('sys-words', 300);
  const MT = num('max-tokens', 16), SLOTS = num('slots', 3), CTX = num('ctx', 2048);
  const withStore = num('store', 1) !== 0;
  const base = ['--slots', String(SLOTS), '--ctx', String(CTX)];
  const list = [];
  list.push(await startServer('imc-nostore', [...base, '--imc', '--cache-ram', '0']));
  list.push(await startServer('spc+imc', [...base, '--spc', '--imc'])); // default: the RAM-only store
  let dirs = null;
  if (withStore) {
    dirs = tmpStoreDirs('subagents');
    const cfg = writeConfig(dirs);
    list.push(await startServer('spc+imc+store', [...base, '--spc', '--imc', '--config', cfg.file]));
  }
  const off = await startServer('off', [...base, '--no-cache-prompt']);
  for (const s of list) await warmup(s);
  await calibrate(off);
  const convs = [];
  for (let a = 0; a < A; a++) convs.push([{ role: 'system', content: words(SW, 700 + a) }]);
  const rows = [];
  let step = 0, mismatches = 0, total = 0;
  const prevOf = {};
  for (let t = 1; t <= T; t++) {
    for (let a = 0; a < A; a++) {
      const msgs = convs[a];
      msgs.push({ role: 'user', content: words(UW, 20000 + 100 * a + t) });
      const r = await roundRobin([...list, off], msgs, step++, MT);
      const prev = prevOf[a];
      const ideal = prev ? r.off.prompt_tokens - (prev.prompt_tokens + prev.completion_tokens) : r.off.prompt_tokens;
      prevOf[a] = r.off;
      const idl = await idealFloor(off, ideal, r.off);
      total += list.length;
      mismatches += await recordStep(rows, list, off, r, t, { agent: a }, ideal, idl);
      msgs.push({ role: 'assistant', content: r.off.content });
      process.stderr.write(`turn ${t} agent ${a}: ${list.map((s) => `${s.name} ${f(r[s.name].ttft)} ms ${r[s.name].mode} ${r[s.name].cached_tokens}/${r[s.name].prompt_tokens}`).join('; ')}; off ${f(r.off.ttft)} ms\n`);
    }
  }
  const mets = {};
  for (const s of list) mets[s.name] = await metrics(s);
  for (const s of [...list, off]) await s.stop();
  if (dirs) rmDirs(dirs);

  header(`Sub-agents (issue 4): ${A} agents × ${T} turns on ${SLOTS} slots, interleaved`,
    `Each agent has its own ${SW}-word system prompt; ${UW}-word user messages, max_tokens ${MT}; agents take turns ` +
    `round-robin (agent 1 turn 1, agent 2 turn 1, …), so ${A} conversations compete for ${SLOTS} slots. ` +
    'Servers: `--imc --cache-ram 0` (no store: an evicted agent is rebuilt), `--spc --imc` (the default RAM-only ' +
    'store), `--spc --imc` with the full store in temp dirs, and `--no-cache-prompt`; all alive at once, requests ' +
    'alternated. "new" = prompt − cached (what the server prefilled) and its ' +
    'floor (measured); "ideal" = tokens the agent added since its last turn (new user message and template), with ' +
    'its floor measured the same way; @depth = at the position those tokens really have (`kvstash bench floor`).');
  summaryTable(rows, list, off, T, mets);
  say();
  say(`Replies that differ from the cache-off server's: ${mismatches} of ${total}.`);
  csvPerTurn('server_subagents.csv', rows, list, T);
}

// One step of a multi-server workload: a row per cache-on server of list
// (its result, its floors for the tokens it prefilled and for the ideal ones,
// at depth 0 and at depth), keyed by `key` ({ agent: a } ...). firstTurnMiss:
// every request misses, the cache-off TTFT is the floor. Returns how many
// replies differ from the cache-off server's.
async function recordStep(rows, list, off, r, t, key, ideal, idl, firstTurnMiss = false) {
  let mismatches = 0;
  for (const s of list) {
    const on = r[s.name];
    if (on.content !== r.off.content) mismatches++;
    const fl = firstTurnMiss ? sameAsOff(r.off) : await floorFor(off, on, r.off);
    rows.push({ srv: s.name, ...key, turn: t, on, off: r.off, floor: fl, ideal, idealMs: idl.ms,
      dfl: atDepth(fl.depth, on), idfl: atDepth(idl.depth, on), idepth: idl.depth.prefill });
  }
  return mismatches;
}

// A summary per server (all turns and turns >= 2) and per turn.
function summaryTable(rows, list, off, T, mets) {
  const trows = [];
  for (const s of list) {
    for (const [label, sel] of [['all', () => true], ['turns ≥ 2', (x) => x.turn >= 2]]) {
      const rs = rows.filter((x) => x.srv === s.name && sel(x));
      trows.push([s.name, label, rs.length, f(median(rs.map((x) => x.on.prompt_tokens))), f(median(rs.map((x) => x.on.cached_tokens))),
        f(median(rs.map((x) => x.on.ttft))), f(median(rs.map((x) => x.off.ttft))), fr(median(rs.map((x) => x.off.ttft / x.on.ttft))),
        f(median(rs.map((x) => x.on.n_prefilled))), fr(median(rs.map((x) => x.on.ttft / x.floor.ttft))),
        fr(median(rs.map((x) => x.on.ttft / x.dfl))),
        f(median(rs.map((x) => x.ideal))), fr(median(rs.map((x) => x.on.ttft / x.idealMs))),
        fr(median(rs.map((x) => x.on.ttft / x.idfl))), countModes(rs.map((x) => x.on))]);
    }
  }
  say(table(['server', 'turns', 'req', 'prompt tok', 'cached', 'TTFT ms', 'TTFT off ms', 'off/on', 'new', 'TTFT/floor@0(new)',
    'TTFT/floor@depth(new)', 'ideal new', 'TTFT/floor@0(ideal)', 'TTFT/floor@depth(ideal)', 'cache modes'], trows));
  say();
  const prow = [];
  for (let t = 1; t <= T; t++) {
    const r = [t];
    const o = rows.filter((x) => x.turn === t && x.srv === list[0].name);
    for (const s of list) {
      const rs = rows.filter((x) => x.turn === t && x.srv === s.name);
      r.push(f(median(rs.map((x) => x.on.ttft))));
    }
    r.push(f(median(o.map((x) => x.off.ttft))));
    r.push(f(median(o.map((x) => x.idealMs))));
    r.push(f(median(o.map((x) => x.idepth))));
    prow.push(r);
  }
  say('Median TTFT per turn (ms):');
  say();
  say(table(['turn', ...list.map((s) => s.name), 'off', 'floor@0(ideal)', 'floor@depth(ideal)'], prow));
  if (mets) {
    say();
    const mrows = [];
    for (const s of list) {
      const m = mets[s.name];
      mrows.push([s.name, ...['prefix', 'imc-hash', 'imc-token-prefix', 'spc', 'store', 'miss'].map((d) => m.g(`kvstash_cache_decisions_total{decision="${d}"}`)),
        m.g('kvstash_slot_evictions_total'), f(100 * m.g('kvstash_cache_hit_ratio'), 1)]);
    }
    say('Cache decisions from /metrics (`kvstash_cache_decisions_total`):');
    say();
    say(table(['server', 'prefix', 'imc-hash', 'imc-token-prefix', 'spc', 'store', 'miss', 'slot evictions', 'hit ratio %'], mrows));
  }
}
function csvPerTurn(name, rows, list, T) {
  const crow = [];
  for (let t = 1; t <= T; t++) {
    const o = rows.filter((x) => x.turn === t && x.srv === list[0].name);
    const r = [t, f(median(o.map((x) => x.off.ttft)), 2), f(median(o.map((x) => x.idealMs)), 2)];
    for (const s of list) r.push(f(median(rows.filter((x) => x.turn === t && x.srv === s.name).map((x) => x.on.ttft)), 2));
    r.push(f(median(o.map((x) => x.idepth)), 2)); // the ideal floor at depth, no restore (an in-slot hit)
    crow.push(r);
  }
  csv(name, ['turn', 'off', 'floor_ideal', ...list.map((s) => s.name), 'floor_ideal_depth'], crow);
}

// Issue 4b: one long system prompt shared by U users, 2 turns each.
async function wlSharedsys() {
  const U = num('users', 6), T = num('turns', 2), UW = num('msg-words', 60), SW = num('sys-words', 800);
  const MT = num('max-tokens', 16), SLOTS = num('slots', 3), CTX = num('ctx', 2048);
  const base = ['--slots', String(SLOTS), '--ctx', String(CTX)];
  const list = [await startServer('prefix-nostore', [...base, '--cache-ram', '0']),
    await startServer('prefix', base), await startServer('spc', [...base, '--spc']),
    await startServer('spc+imc', [...base, '--spc', '--imc'])];
  let dirs = null;
  if (num('store', 1) !== 0) {
    dirs = tmpStoreDirs('sharedsys');
    list.push(await startServer('spc+imc+store', [...base, '--spc', '--imc', '--config', writeConfig(dirs).file]));
  }
  const off = await startServer('off', [...base, '--no-cache-prompt']);
  for (const s of list) await warmup(s);
  await calibrate(off);
  const sys = { role: 'system', content: words(SW, 4242) };
  const convs = [];
  for (let u = 0; u < U; u++) convs.push([sys]);
  const rows = [];
  let step = 0, mismatches = 0, total = 0, nSys = null;
  const prevOf = {};
  for (let t = 1; t <= T; t++) {
    for (let u = 0; u < U; u++) {
      const msgs = convs[u];
      msgs.push({ role: 'user', content: words(UW, 30000 + 100 * u + t) });
      const r = await roundRobin([...list, off], msgs, step++, MT);
      // The system prompt's token count: what a first turn reused from another user's KV.
      if (t === 1 && u > 0) for (const s of list) if (r[s.name].cached_tokens > 0) nSys = Math.min(nSys ?? 1e9, r[s.name].cached_tokens);
      const prev = prevOf[u];
      // The system prompt was seen before unless this is the very first request.
      const seenSys = t > 1 || u > 0;
      const ideal = prev ? r.off.prompt_tokens - (prev.prompt_tokens + prev.completion_tokens) : r.off.prompt_tokens - (seenSys ? nSys ?? SW + 3 : 0);
      prevOf[u] = r.off;
      const idl = await idealFloor(off, ideal, r.off);
      total += list.length;
      mismatches += await recordStep(rows, list, off, r, t, { user: u }, ideal, idl);
      msgs.push({ role: 'assistant', content: r.off.content });
      process.stderr.write(`turn ${t} user ${u}: ${list.map((s) => `${s.name} ${f(r[s.name].ttft)} ms ${r[s.name].mode} ${r[s.name].cached_tokens}/${r[s.name].prompt_tokens}`).join('; ')}; off ${f(r.off.ttft)} ms\n`);
    }
  }
  const mets = {};
  for (const s of list) mets[s.name] = await metrics(s);
  for (const s of [...list, off]) await s.stop();
  if (dirs) rmDirs(dirs);
  header(`Shared system prompt (issue 4): ${U} users × ${T} turns on ${SLOTS} slots, one ${SW}-word system prompt`,
    `${UW}-word user messages, max_tokens ${MT}; users take turns round-robin. Plain prefix reuse without a store ` +
    '(`--cache-ram 0`), plain prefix reuse (default settings: the RAM-only store), ' +
    '`--spc`, `--spc --imc` and (with a store in temp dirs) `--spc --imc --config store.yaml` vs `--no-cache-prompt`, ' +
    'all alive at once, requests alternated. "ideal new" = the tokens ' +
    'no earlier request had sent (everything after the system prompt on a first turn, the new user message later).');
  summaryTable(rows, list, off, T, mets);
  say();
  say(`Replies that differ from the cache-off server's: ${mismatches} of ${total}. System prompt: ${nSys ?? '?'} tokens.`);
  csvPerTurn('server_sharedsys.csv', rows, list, T);
}

// Issue 5a: a long conversation, SIGTERM, a new process on the same store.
async function wlRestart() {
  const SW = num('sys-words', 300), TURNW = num('build-words', 150), TARGET = num('tokens', 2000);
  const UW = num('msg-words', 60), MT = num('max-tokens', 16), R = num('repeat', 3), CTX = num('ctx', 4096);
  const base = ['--slots', '2', '--ctx', String(CTX)];
  const off = await startServer('off', [...base, '--no-cache-prompt']);
  await calibrate(off);
  // The warm twin: a server alive throughout that is sent the same conversation,
  // so the measured turn meets its history in the slot: the same turn "in a warm
  // process" (issue 12's reference), HTTP and all, beside llama.cpp's floor.
  const warmSrv = await startServer('warm', base);
  await warmup(warmSrv);
  // warmup 0: the measured turn is the first request of the new process (issue 12: a
  // warm start makes it cost what a later one does); 1: an unrelated short request first.
  const WARM = num('warmup', 1);
  const variants = [
    { name: 'default tiers', cfg: {} },
    { name: 'disk only', cfg: { ram: 0, shm: 0, reasons: { cold: 'disk', continued: 'disk', finish: 'disk', evict: 'disk', shutdown: 'disk' } } },
    // The first process stays up; a second one on the same store takes the next turn.
    { name: 'second process', second: true, cfg: { reasons: { cold: 'shm', continued: 'shm', finish: 'shm', evict: 'shm', shutdown: 'shm' } } },
  ];
  const rows = [];
  const cfgTexts = [];
  let vi = 0;
  for (const v of variants) {
    vi++;
    const dirs = tmpStoreDirs(`restart${vi}`);
    const cfg = writeConfig(dirs, v.cfg);
    cfgTexts.push([v.name, cfg.text]);
    const msgs = [{ role: 'system', content: words(SW, 9000 + vi) }];
    // Build the conversation on the first process (cache on: each turn prefills only its new tokens).
    let srv = await startServer(`store${vi}`, [...base, '--config', cfg.file], { log: 'debug' });
    await warmup(srv);
    let last = null, k = 0;
    while (!last || last.prompt_tokens + last.completion_tokens < TARGET - TURNW) {
      msgs.push({ role: 'user', content: words(TURNW, 9100 + 10 * vi + k++) });
      last = await chat(srv, msgs, { maxTokens: MT });
      await chat(warmSrv, msgs, { maxTokens: MT });
      msgs.push({ role: 'assistant', content: last.content });
    }
    process.stderr.write(`${v.name}: built ${last.prompt_tokens + last.completion_tokens} tokens in ${k} turns\n`);
    const first = srv;
    for (let rep = 1; rep <= R; rep++) {
      const mBefore = await metrics(srv);
      const stopT0 = now();
      if (!v.second || srv !== first) await srv.stop();
      const stopMs = now() - stopT0;
      await sleep(v.second ? 300 : 0); // the first process's finish save reaches the shm tier
      const ls = cacheLs(dirs);
      const startT0 = now();
      srv = await startServer(v.second ? `store${vi}b` : `store${vi}`, [...base, '--config', cfg.file], { log: 'debug' });
      const startMs = now() - startT0;
      if (WARM) await warmup(srv); // an unrelated short request (below store.min_tokens: nothing saved or restored)
      msgs.push({ role: 'user', content: words(UW, 9500 + 10 * vi + rep) });
      const logLen = srv.stderr.length;
      const r = await roundRobin([srv, off, warmSrv], msgs, 0, MT); // the restarted server first
      const on = r[srv.name];
      const fl = await floor(off, Math.max(1, on.n_prefilled));
      fl.depth = await depthFloor(on.cached_tokens, on.n_prefilled);
      await sleep(50);
      const m = /store-restore (\d+) tokens from (\w+) \((\d+) bytes, ([\d.]+) ms\)/.exec(srv.stderr.slice(logLen));
      const bytes = m ? Number(m[3]) : (ls.find((e) => e.tokens === on.cached_tokens) || {}).bytes;
      const mm = await metrics(srv); // one store hit since start: its read + verify time
      rows.push({ variant: v.name, rep, on, off: r.off, warm: r.warm, floor: fl, dfl: atDepth(fl.depth, on), bytes, stopMs, startMs, same: on.content === r.off.content,
        loadS: mm.g('kvstash_store_load_seconds_total'), entries: ls.length, saveReqs: mBefore });
      msgs.push({ role: 'assistant', content: r.off.content });
      process.stderr.write(`${v.name} rep ${rep}: on ${f(on.ttft)} ms (${on.mode}/${on.tier} ${on.cached_tokens}/${on.prompt_tokens}, ` +
        `restore ${f(on.restore_ms, 2)} ms, ${bytes} bytes) off ${f(r.off.ttft)} ms warm ${f(r.warm.ttft)} ms (cached ${r.warm.cached_tokens}) floor(${fl.prompt_tokens}) ${f(fl.ttft)} ms\n`);
    }
    await srv.stop();
    if (srv !== first) await first.stop();
    rmDirs(dirs);
  }
  await off.stop();
  await warmSrv.stop();

  header('After a restart (issue 5): a ~2,000-token conversation continued by a new process',
    `A ${SW}-word system prompt and ${TURNW}-word user turns (max_tokens ${MT}) until the conversation holds about ` +
    `${TARGET} tokens; then, ${R} times: SIGTERM, start a new server on the same store directories (disk tier in a ` +
    'temp dir, shm tier in a temp dir under /dev/shm), ' +
    (WARM ? 'one unrelated short warm-up request, and the next turn ' : 'and the next turn as the new process\'s first request ' +
      '(no warm-up request: what the server\'s own warm-up before /health leaves) ') +
    '("second process": the first server stays up and a second one on the same store takes the turn) ' +
    `(${UW}-word message). The cache-off server (alive throughout) answers the same turn by prefilling the whole ` +
    'history; floor@0 = a fresh prefill of only the tokens the restarted server prefilled; floor@depth = the prefill ' +
    'of those tokens after the restored ones plus llama\'s state set of the restored tokens from memory, on llama.cpp ' +
    'alone (`kvstash bench floor`); warm = the same turn on a server alive throughout that was sent the same ' +
    'conversation (its slot holds the history: a cached turn in a warm process, HTTP included). Restore throughput = state ' +
    'bytes (from the server\'s debug line `store-restore N tokens from TIER (B bytes, MS ms)`) / `cache.restore_ms` ' +
    '(lookup + read + checksum + token check + llama state set).');
  const trows = [];
  for (const x of rows) {
    trows.push([x.variant, x.rep, x.on.prompt_tokens, x.on.cached_tokens, `${x.on.mode}/${x.on.tier || '–'}`, f(x.on.ttft), f(x.on.prompt_ms, 1),
      f(x.floor.ttft), fr(x.on.ttft / x.floor.ttft), f(x.dfl), fr(x.on.ttft / x.dfl), f(x.warm.ttft), fr(x.on.ttft / x.warm.ttft), f(x.off.ttft), fr(x.off.ttft / x.on.ttft), f(x.on.restore_ms, 2),
      f(x.loadS * 1000, 2), x.bytes ? f(x.bytes / 1048576, 1) : '–', x.bytes ? f(x.bytes / 1e6 / x.on.restore_ms, 2) : '–', x.same ? 'yes' : 'NO']);
  }
  say(table(['variant', 'rep', 'prompt tok', 'cached', 'mode/tier', 'TTFT ms', 'prompt_ms', 'floor@0 ms', 'TTFT/floor@0',
    'floor@depth ms', 'TTFT/floor@depth', 'warm ms', 'TTFT/warm',
    'full prefill ms', 'full/TTFT', 'restore ms', 'of which read+verify ms', 'state MiB', 'restore GB/s', 'same reply'], trows));
  say();
  for (const v of variants) {
    const rs = rows.filter((x) => x.variant === v.name);
    say(`- ${v.name}: median TTFT ${f(median(rs.map((x) => x.on.ttft)))} ms; TTFT/warm ${fr(median(rs.map((x) => x.on.ttft / x.warm.ttft)))} ` +
      `(issue 12: ≤ 1.1×; warm ${f(median(rs.map((x) => x.warm.ttft)))} ms); TTFT/floor@depth ${fr(median(rs.map((x) => x.on.ttft / x.dfl)))} ` +
      `(target ≤ 1.2×), TTFT/floor@0 ${fr(median(rs.map((x) => x.on.ttft / x.floor.ttft)))}; full prefill / TTFT ${fr(median(rs.map((x) => x.off.ttft / x.on.ttft)))} (target ≥ 10×); restore ` +
      `${f(median(rs.map((x) => x.on.restore_ms)), 1)} ms, ${f(median(rs.filter((x) => x.bytes).map((x) => x.bytes / 1e6 / x.on.restore_ms)), 2)} GB/s ` +
      `(target ≥ 1 GB/s from the disk tier in the page cache); server start ${f(median(rs.map((x) => x.startMs)))} ms, ` +
      `SIGTERM to exit ${f(median(rs.map((x) => x.stopMs)))} ms.`);
  }
  say();
  for (const [n, t] of cfgTexts) {
    say(`Config (${n}):`);
    say();
    say('```yaml\n' + t + '\n```');
  }
  csv('server_restart.csv', ['variant', 'rep', 'ttft', 'floor', 'full', 'restore_ms', 'floor_depth'],
    rows.map((x) => [`"${x.variant}"`, x.rep, f(x.on.ttft, 2), f(x.floor.ttft, 2), f(x.off.ttft, 2), f(x.on.restore_ms, 3), f(x.dfl, 2)]));
  csv('server_restart_summary.csv', ['variant', 'after_restart', 'floor', 'full_prefill', 'floor_depth'], variants.map((v) => {
    const rs = rows.filter((x) => x.variant === v.name);
    return [`"${v.name}"`, f(median(rs.map((x) => x.on.ttft)), 2), f(median(rs.map((x) => x.floor.ttft)), 2), f(median(rs.map((x) => x.off.ttft)), 2),
      f(median(rs.map((x) => x.dfl)), 2)];
  }));
}
function cacheLs(dirs) {
  try {
    const out = execFileSync(BIN, ['cache', 'ls', '--cache-dir', dirs.disk, '--shm-dir', dirs.shm], { encoding: 'utf8' });
    const es = [];
    for (const line of out.split('\n')) {
      const c = line.trim().split(/\s+/);
      if (c.length >= 4 && /^[0-9a-f]{8,}/.test(c[0])) es.push({ key: c[0], tokens: Number(c[1]), bytes: Number(c[2]), tier: c[3] });
    }
    return es;
  } catch {
    return [];
  }
}

// Issue 5b: more conversations than the ram tier holds, over a disk tier.
// Two stores side by side: finish saves into the small ram tier (cold and
// evict saves to disk), and every save to disk (the page cache holds it).
async function wlWorkingset() {
  const C = num('convs', 40), T = num('turns', 3), SW = num('sys-words', 450), UW = num('msg-words', 60);
  const MT = num('max-tokens', 8), SLOTS = num('slots', 4), CTX = num('ctx', 2048), RAM = num('ram-mib', 64);
  const base = ['--slots', String(SLOTS), '--ctx', String(CTX)];
  const variants = [
    { name: 'ram+disk', reasons: { cold: 'disk', continued: 'ram', finish: 'ram', evict: 'disk', shutdown: 'disk' } },
    { name: 'disk', reasons: { cold: 'disk', continued: 'disk', finish: 'disk', evict: 'disk', shutdown: 'disk' } },
  ];
  const list = [];
  const cfgs = [];
  for (const v of variants) {
    const dirs = tmpStoreDirs(`workingset-${v.name.replace('+', '')}`);
    const cfg = writeConfig(dirs, { ram: RAM * 1048576, shm: 0, reasons: v.reasons });
    cfgs.push([v.name, cfg.text]);
    list.push(await startServer(v.name, [...base, '--config', cfg.file]));
  }
  const off = await startServer('off', [...base, '--no-cache-prompt']);
  for (const s of list) await warmup(s);
  await calibrate(off);
  const convs = [];
  for (let c = 0; c < C; c++) convs.push([{ role: 'system', content: words(SW, 40000 + c) }]);
  const rows = [];
  let step = 0, mismatches = 0, total = 0;
  const prevOf = {};
  for (let t = 1; t <= T; t++) {
    for (let c = 0; c < C; c++) {
      const msgs = convs[c];
      msgs.push({ role: 'user', content: words(UW, 41000 + 100 * c + t) });
      const r = await roundRobin([...list, off], msgs, step++, MT);
      const prev = prevOf[c];
      const ideal = prev ? r.off.prompt_tokens - (prev.prompt_tokens + prev.completion_tokens) : r.off.prompt_tokens;
      prevOf[c] = r.off;
      const idl = await idealFloor(off, ideal, r.off);
      total += list.length;
      // Turn 1 misses everywhere: its floor is the cache-off TTFT of the same prompt.
      mismatches += await recordStep(rows, list, off, r, t, { conv: c }, ideal, idl, t === 1);
      msgs.push({ role: 'assistant', content: r.off.content });
      process.stderr.write(`turn ${t} conv ${c}: ${list.map((s) => `${s.name} ${f(r[s.name].ttft)} ms ${r[s.name].mode}/${r[s.name].tier} ${r[s.name].cached_tokens}/${r[s.name].prompt_tokens}`).join('; ')}; off ${f(r.off.ttft)} ms\n`);
    }
  }
  const mets = {};
  for (const s of list) mets[s.name] = await metrics(s);
  for (const s of [...list, off]) await s.stop();
  const stateMiB = median(rows.filter((x) => x.turn === T).map((x) => x.on.prompt_tokens)) * 12288 / 1048576;
  header(`Working set larger than the RAM tier (issue 5): ${C} conversations × ${T} turns, round-robin`,
    `${SW}-word system prompt per conversation, ${UW}-word messages, max_tokens ${MT}, ${SLOTS} slots. A state of ` +
    `the last turn is about ${f(stateMiB, 1)} MiB (12 KiB per token), so the ${C} conversations need about ` +
    `${f(stateMiB * C)} MiB, against a ram tier of ${RAM} MiB. Two stores (each in its own temp dirs, no shm tier): ` +
    '**ram+disk** maps the finish and continued saves to the ram tier and cold/evict/shutdown saves to the disk ' +
    'tier; **disk** maps every save to the disk tier (which the page cache holds). Both and `--no-cache-prompt` ' +
    'alive at once, requests alternated.');
  summaryTable(rows, list, off, T, mets);
  say();
  const trows = [];
  for (const s of list) {
    const m = mets[s.name];
    for (const tier of ['ram', 'disk'])
      trows.push([s.name, tier, m.g(`kvstash_store_tier_hits_total{tier="${tier}"}`), f(m.g(`kvstash_store_tier_bytes{tier="${tier}"}`) / 1048576, 1),
        m.g(`kvstash_store_tier_entries{tier="${tier}"}`), f(m.g(`kvstash_store_tier_max_bytes{tier="${tier}"}`) / 1048576), m.g(`kvstash_store_tier_evictions_total{tier="${tier}"}`)]);
  }
  say('Store tiers from /metrics at the end:');
  say();
  say(table(['server', 'tier', 'hits', 'MiB', 'entries', 'budget MiB', 'evictions'], trows));
  say();
  for (const s of list) {
    const m = mets[s.name];
    const saves = ['cold', 'continued', 'finish', 'evict', 'shutdown'].map((r) => `${r} ${m.g(`kvstash_store_saves_total{reason="${r}"}`)}`).join(', ');
    say(`- ${s.name}: lookups ${m.g('kvstash_store_lookups_total')}, hits ${m.g('kvstash_store_hits_total')}; saves written: ${saves}; ` +
      `not written: dedup ${m.g('kvstash_store_saves_not_written_total{cause="dedup"}')}, skipped ${m.g('kvstash_store_saves_not_written_total{cause="skipped"}')}; ` +
      `restoring ${f(m.g('kvstash_store_restore_seconds_total') * 1000)} ms in all (of which reading + verifying ` +
      `${f(m.g('kvstash_store_load_seconds_total') * 1000)} ms), snapshots ${f(m.g('kvstash_snapshot_seconds_total') * 1000)} ms, ` +
      `writer thread ${f(m.g('kvstash_store_save_seconds_total') * 1000)} ms.`);
  }
  say();
  say(`Replies that differ from the cache-off server's: ${mismatches} of ${total}.`);
  say();
  for (const [n, t] of cfgs) {
    say(`Config (${n}):`);
    say();
    say('```yaml\n' + t + '\n```');
  }
  csvPerTurn('server_workingset.csv', rows, list, T);
}

// Save overhead: concurrent requests, store on vs off (cache_prompt on in both).
async function wlSaves() {
  const ROUNDS = num('rounds', 4), CONC = num('concurrency', 4), SW = num('sys-words', 400), UW = num('msg-words', 60);
  const MT = num('max-tokens', 16), T = num('turns', 2), CTX = num('ctx', 2048);
  const base = ['--slots', String(CONC), '--ctx', String(CTX)];
  const dirs = tmpStoreDirs('saves');
  const cfg = writeConfig(dirs);
  const list = [await startServer('store', [...base, '--config', cfg.file], { log: 'debug' }),
    await startServer('nostore', [...base, '--cache-ram', '0'], { log: 'debug' })];
  for (const s of list) await warmup(s);
  const rows = [];
  const wall = { store: [], nostore: [] };
  let step = 0;
  for (let round = 0; round < ROUNDS; round++) {
    const convs = [];
    for (let c = 0; c < CONC; c++) convs.push([{ role: 'system', content: words(SW, 50000 + 100 * round + c) }]);
    for (let t = 1; t <= T; t++) {
      for (const c of convs) c.push({ role: 'user', content: words(UW, freshSeed()) });
      const order = step++ % 2 ? [list[1], list[0]] : list;
      const res = {};
      for (const s of order) {
        const t0 = now();
        res[s.name] = await Promise.all(convs.map((msgs) => chat(s, msgs, { maxTokens: MT })));
        wall[s.name].push(now() - t0);
        await sleep(200); // let the writer thread finish its queue outside the other server's window
      }
      for (let c = 0; c < CONC; c++) {
        for (const s of list) rows.push({ srv: s.name, round, turn: t, r: res[s.name][c] });
        convs[c].push({ role: 'assistant', content: res.nostore[c].content });
      }
      process.stderr.write(`round ${round} turn ${t}: ${list.map((s) => `${s.name} ${res[s.name].map((x) => f(x.ttft)).join('/')}`).join('; ')}\n`);
    }
  }
  const m = await metrics(list[0]);
  for (const s of list) await s.stop();
  const cpuS = Object.fromEntries(list.map((s) => [s.name, s.ticks / TICK]));
  header(`Save overhead: ${CONC} concurrent requests, store on vs off`,
    `${ROUNDS} rounds; each round ${CONC} new conversations (${SW}-word system prompts, ${UW}-word messages, ` +
    `max_tokens ${MT}) sent at once, ${T} turns; the same batch goes to the store server (default tiers and reasons: ` +
    'cold → disk, finish → shm, both in temp dirs) and to a server without a store; which goes first alternates. ' +
    'Both have prompt caching on. Batch time = until the last of the concurrent answers ended. Turn 1 prefills ' +
    'whole prompts (cold saves at the 256-token stride point, finish saves); later turns reuse the slot and ' +
    'prefill the new message (finish saves of 6–9 MB states).');
  const trows = [];
  const sel = (name, t) => rows.filter((x) => x.srv === name && (t === 'all' || (t === 'later' ? x.turn >= 2 : x.turn === t)));
  const wsel = (name, t) => wall[name].filter((_, i) => t === 'all' || (t === 'later' ? i % T !== 0 : i % T === t - 1));
  const mean = (xs) => sum(xs) / xs.length;
  for (const t of [...Array.from({ length: T }, (_, i) => i + 1), 'later', 'all']) {
    const a = sel('store', t), b = sel('nostore', t);
    const wa = wsel('store', t), wb = wsel('nostore', t);
    trows.push([t === 'later' ? `2–${T}` : t, a.length, f(median(a.map((x) => x.r.prompt_tokens))), f(median(a.map((x) => x.r.cached_tokens))),
      f(median(a.map((x) => x.r.ttft))), f(median(b.map((x) => x.r.ttft))), fr(median(a.map((x) => x.r.ttft)) / median(b.map((x) => x.r.ttft))),
      fr(mean(a.map((x) => x.r.ttft)) / mean(b.map((x) => x.r.ttft))),
      f(median(wa)), f(median(wb)), fr(sum(wa) / sum(wb))]);
  }
  say(table(['turn', 'req', 'prompt tok', 'cached', 'median TTFT store ms', 'median TTFT no store ms', 'ratio of medians',
    'ratio of means', 'median batch store ms', 'median batch no store ms', 'ratio of total batch time'], trows));
  say();
  const saves = ['cold', 'continued', 'finish', 'evict', 'shutdown'].map((r) => `${r} ${m.g(`kvstash_store_saves_total{reason="${r}"}`)}`).join(', ');
  const snapMs = m.g('kvstash_snapshot_seconds_total') * 1000, writerMs = m.g('kvstash_store_save_seconds_total') * 1000;
  say(`Store server: saves written ${saves} (${f(m.g('kvstash_store_saved_bytes_total') / 1048576)} MiB); inference-thread ` +
    `snapshot time ${f(snapMs)} ms in all (${f((100 * snapMs) / 1000 / cpuS.store, 2)}% of the server's CPU time); writer ` +
    `thread ${f(writerMs)} ms of wall time (beside inference; mostly waiting for fsync); lookups ${m.g('kvstash_store_lookups_total')}. ` +
    `CPU time of the servers over the run: store ${f(cpuS.store, 1)} s, no store ${f(cpuS.nostore, 1)} s ` +
    `(${fr(cpuS.store / cpuS.nostore)}). Target: saves add < 5%.`);
  csv('server_saves.csv', ['server', 'round', 'turn', 'ttft'], rows.map((x) => [x.srv, x.round, x.turn, f(x.r.ttft, 2)]));
  const srow = [];
  for (let t = 1; t <= T; t++)
    srow.push([`"turn ${t}"`, ...['store', 'nostore'].map((n) => f(median(rows.filter((x) => x.turn === t && x.srv === n).map((x) => x.r.ttft)), 2)),
      ...['store', 'nostore'].map((n) => f(median(wall[n].filter((_, i) => i % T === t - 1)), 2))]);
  csv('server_saves_summary.csv', ['turn', 'ttft_store', 'ttft_nostore', 'batch_store', 'batch_nostore'], srow);
}

// Where the time of a cached request goes: TTFT of the same number of new
// tokens after N cached tokens (attention over the cached context), with and
// without --flash-attn, vs the floor (the same new tokens prefilled fresh).
async function wlContext() {
  const NS = str('cached', '0,256,512,1024,2048').split(',').map(Number), UW = num('msg-words', 60), R = num('repeat', 3);
  const MT = num('max-tokens', 4), CTX = num('ctx', 4096);
  const base = ['--slots', '2', '--ctx', String(CTX)];
  const list = [await startServer('on', base), await startServer('on-fa', [...base, '--flash-attn'])];
  const off = await startServer('off', [...base, '--no-cache-prompt']);
  for (const s of list) await warmup(s);
  await calibrate(off);
  const rows = [];
  let step = 0;
  for (const N of NS) {
    // A system prompt of about N tokens (the template adds a few).
    const sys = N > 0 ? [{ role: 'system', content: words(Math.max(1, N - 4), 60000 + N) }] : [];
    if (N > 0) await roundRobin(list, [...sys, { role: 'user', content: words(8, 1) }], step++, 1); // fill the slots
    for (let rep = 1; rep <= R; rep++) {
      const msgs = [...sys, { role: 'user', content: words(UW, 61000 + 10 * N + rep) }];
      const r = await roundRobin(list, msgs, step++, MT);
      const fl = await floor(off, r.on.n_prefilled);
      fl.depth = await depthFloor(r.on.cached_tokens, r.on.n_prefilled);
      rows.push({ N, rep, r, floor: fl, dfl: atDepth(fl.depth, r.on) });
      process.stderr.write(`cached ${r.on.cached_tokens}: on ${f(r.on.ttft)} ms (new ${r.on.n_prefilled}), fa ${f(r['on-fa'].ttft)} ms ` +
        `(cached ${r['on-fa'].cached_tokens}), floor(${fl.prompt_tokens}) ${f(fl.ttft)} ms\n`);
    }
  }
  for (const s of [...list, off]) await s.stop();
  header('Where the time of a cached request goes: new tokens after N cached tokens',
    `The same ${UW}-word user message (about ${UW + 5} new tokens) after a system prompt of N tokens that the slot ` +
    `holds already (a first request put it there), ${R} messages per N; cache on without and with \`--flash-attn\`; ` +
    'floor = the same number of tokens prefilled fresh on a `--no-cache-prompt` server, measured after each request. ' +
    'The difference is attention over the cached context (and the mask/softmax over it), which a fresh prefill of the ' +
    'new tokens alone does not do.');
  const trows = [];
  const crow = [];
  for (const N of NS) {
    const rs = rows.filter((x) => x.N === N);
    const on = median(rs.map((x) => x.r.on.ttft)), fa = median(rs.map((x) => x.r['on-fa'].ttft)), fl = median(rs.map((x) => x.floor.ttft));
    trows.push([f(median(rs.map((x) => x.r.on.cached_tokens))), f(median(rs.map((x) => x.r.on.n_prefilled))), f(on), f(fa), f(fl),
      fr(median(rs.map((x) => x.r.on.ttft / x.floor.ttft))), fr(median(rs.map((x) => x.r['on-fa'].ttft / x.floor.ttft))),
      f(median(rs.map((x) => x.dfl))), fr(median(rs.map((x) => x.r.on.ttft / x.dfl))),
      f(median(rs.map((x) => x.r.on.prompt_ms)), 1), f(median(rs.map((x) => x.r['on-fa'].prompt_ms)), 1)]);
    crow.push([median(rs.map((x) => x.r.on.cached_tokens)), f(on, 2), f(fa, 2), f(fl, 2), f(median(rs.map((x) => x.dfl)), 2)]);
  }
  say(table(['cached tok', 'new tok', 'TTFT ms', 'TTFT flash-attn ms', 'floor@0 ms', 'TTFT/floor@0', 'flash-attn/floor@0',
    'floor@depth ms', 'TTFT/floor@depth', 'prompt_ms', 'prompt_ms flash-attn'], trows));
  csv('server_context.csv', ['cached', 'ttft', 'ttft_fa', 'floor', 'floor_depth'], crow);
}

// ---------------------------------------------------------------- main
const WORKLOADS = { context: wlContext, multiturn: wlMultiturn, subagents: wlSubagents, sharedsys: wlSharedsys, restart: wlRestart, workingset: wlWorkingset, saves: wlSaves };
if (!WORKLOADS[WL]) die(`usage: node bench/http_bench.mjs ${Object.keys(WORKLOADS).join('|')} [--key value ...]`);
if (!fs.existsSync(BIN)) die(`no kvstash binary at ${BIN}`);
if (!fs.existsSync(MODEL)) die(`no model at ${MODEL} (kvstash mkmodel --preset bench --seed 1 ${MODEL})`);
machineFacts();
try {
  await WORKLOADS[WL]();
  stopDepthFloor();
  say();
  say(`Command: \`${process.env.KS_BENCH_CMD || `node bench/http_bench.mjs ${process.argv.slice(2).join(' ')}`}\``);
  footer();
} catch (e) {
  process.stderr.write(`http_bench ${WL}: ${e.stack || e}\n`);
  process.exitCode = 1;
}
