#!/usr/bin/env node
// multihost.mjs — several kvstash servers behind a round-robin client (issue
// 14): does a turn that lands on another host cost what its new tokens cost?
// Not a test: nothing here fails on a number.
//
// usage: node bench/multihost.mjs [--key value ...]
//   --bin B --model M --out D --threads N (every server)   --hosts N [2]
//   --convs N [20] --turns N [5] --sys-words N [400] --msg-words N [40] --max-tokens N [16]
//   --redis-server PATH [redis-server]
//   --gap-ms N [500]  pause before each measured request: a server's CPU threads
//                 keep polling for work a while after its request (the cache-off
//                 server's, right before each turn of the redis setup), taking the
//                 cores from the next request (docs/BENCHMARKS.md, side-by-side artefact)
//   --rows FILE   no run: the floors and tables again from an earlier run's multihost_rows.json
// Environment: MH_LOG=debug gives the servers --log debug (restore and chunk-read times).
//
// Setups, one after the other, each on fresh directories and a fresh Redis:
//   redis   N servers, each with its own store (ram, shm, disk in its own
//           directories: N hosts) and the redis tier on one redis-server over
//           loopback TCP. Turn t of conversation c goes to host (c + t) % N:
//           every turn after the first lands on another host than the one before.
//   local   the same N servers without the redis tier (today: a turn on another
//           host finds at most what that host saw two turns ago).
//   single  one server with its store, every turn on it (one host, the ideal).
// and a cache-off server (--no-cache-prompt) that measures, right after each
// turn of the redis setup, the cold prefill of the same prompt and a fresh
// prompt of as many tokens as the turn prefilled (its "new tokens").
// TTFT is client-side (first streamed content). Every reply is compared with
// the cache-off server's; the history takes the cache-off reply.
// Floor of a turn served from another host = prefill of its new tokens
// (fresh, same count) + its restore_ms (lookup, Redis transfer, state set).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, words, median, streamChat } from './peer_lib.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const { opt, rest, die, str } = parseArgs('multihost', process.argv.slice(2));
if (rest.length) die(`bad argument ${rest[0]}`);
const num = (k, d) => (opt[k] === undefined ? d : Number(opt[k]));
const BIN = path.resolve(str('bin', path.join(ROOT, 'build/kvstash')));
const MODEL = path.resolve(str('model', path.join(ROOT, 'build/models/bench.gguf')));
const OUT = path.resolve(str('out', path.join(ROOT, 'bench/out')));
const REDIS = str('redis-server', 'redis-server');
const THREADS = num('threads', 2), HOSTS = num('hosts', 2), CONVS = num('convs', 20), TURNS = num('turns', 5);
const SYS_WORDS = num('sys-words', 400), MSG_WORDS = num('msg-words', 40), MAX_TOKENS = num('max-tokens', 16);
const GAP_MS = num('gap-ms', 500);
fs.mkdirSync(OUT, { recursive: true });
const TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'kvstash-multihost-'));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---------------------------------------------------------------- processes
const live = new Set();
process.on('exit', () => {
  for (const p of live) try { p.kill('SIGKILL'); } catch { /* gone */ }
  fs.rmSync(TMP, { recursive: true, force: true });
});
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(130));

async function freePort() {
  return new Promise((res) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => {
      const p = s.address().port;
      s.close(() => res(p));
    });
  });
}

async function startRedis(name) {
  const dir = path.join(TMP, name);
  fs.mkdirSync(dir, { recursive: true });
  const port = await freePort();
  const proc = spawn(REDIS, ['--port', String(port), '--bind', '127.0.0.1', '--dir', dir, '--save', '',
    '--appendonly', 'no'], { stdio: 'ignore' });
  live.add(proc);
  for (let i = 0; i < 100; i++) {
    const ok = await new Promise((res) => {
      const c = net.connect(port, '127.0.0.1', () => { c.end(); res(true); });
      c.on('error', () => res(false));
    });
    if (ok) break;
    await sleep(50);
  }
  return { proc, url: `redis://127.0.0.1:${port}`, stop() { proc.kill('SIGKILL'); live.delete(proc); } };
}

async function startServer(name, args) {
  const full = ['serve', '-m', MODEL, '--port', '0', '--log', process.env.MH_LOG || 'info', '--threads', String(THREADS), '--slots', '2',
    '--ctx', '4096', ...args];
  const proc = spawn(BIN, full, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  live.add(proc);
  const log = fs.createWriteStream(path.join(OUT, `multihost-${name}.log`));
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; log.write(d); });
  const exited = new Promise((res) => proc.on('exit', () => { live.delete(proc); res(); }));
  let port = null;
  for (let i = 0; i < 1200 && !port; i++) {
    const m = /kvstash: port=(\d+)/.exec(stderr);
    if (m) port = Number(m[1]);
    else await sleep(100);
  }
  if (!port) die(`${name} did not start:\n${stderr}`);
  const url = `http://127.0.0.1:${port}`;
  for (;;) {
    try { if ((await fetch(`${url}/health`)).status === 200) break; } catch { /* not yet */ }
    await sleep(100);
  }
  return {
    name, url, cmd: `kvstash ${full.join(' ').replace(MODEL, path.basename(MODEL))}`,
    async stop() { proc.kill('SIGTERM'); await exited; log.end(); },
  };
}

function storeConfig(name, redisUrl) {
  const d = path.join(TMP, name);
  fs.mkdirSync(d, { recursive: true });
  const lines = ['store:', '  enabled: true', `  cache_dir: ${d}/disk`, `  shm_dir: ${d}/shm`];
  if (redisUrl) lines.push('  tiers:', '    redis:', `      url: "${redisUrl}"`, '      key_prefix: bench');
  fs.writeFileSync(path.join(d, 'kvstash.yaml'), lines.join('\n') + '\n');
  return path.join(d, 'kvstash.yaml');
}

// Waits until a server's store writer has nothing queued (saves are async).
async function settle(srv) {
  for (let i = 0; i < 600; i++) {
    const t = await (await fetch(`${srv.url}/metrics`)).text();
    const m = /^kvstash_store_queued_saves (\S+)$/m.exec(t);
    if (!m || Number(m[1]) === 0) return;
    await sleep(50);
  }
}

// ---------------------------------------------------------------- conversations
const sysPrompt = (c) => words(SYS_WORDS, 101 + c);
const userMsg = (c, t) => words(MSG_WORDS, 10007 * (c + 1) + 31 * t);
const body = (messages, max = MAX_TOKENS) => ({ messages, max_tokens: max, temperature: 0, seed: 1 });

async function run() {
  const off = await startServer('off', ['--no-cache-prompt']);
  const rows = []; // per turn: setup, conv, turn, host, prompt, cached, ttft, tier, restore_ms, cold, fresh_new
  let mismatches = 0;
  const setups = [['redis', HOSTS, true], ['local', HOSTS, false], ['single', 1, false]];
  // The history: every setup sends the same prompts (the cache-off replies).
  const history = Array.from({ length: CONVS }, (_, c) => [{ role: 'system', content: sysPrompt(c) }]);
  const replies = Array.from({ length: CONVS }, () => []);
  for (const [setup, n, withRedis] of setups) {
    const redis = withRedis ? await startRedis(`redis-${setup}`) : null;
    const hosts = [];
    for (let h = 0; h < n; h++)
      hosts.push(await startServer(`${setup}-${h}`, ['--config', storeConfig(`${setup}-${h}`, redis && redis.url)]));
    process.stderr.write(`multihost: ${setup}: ${n} host(s)${redis ? ', redis ' + redis.url : ''}\n`);
    for (let t = 0; t < TURNS; t++) {
      for (let c = 0; c < CONVS; c++) {
        const msgs = history[c].slice(0, 1 + 2 * t).concat([{ role: 'user', content: userMsg(c, t) }]);
        const host = hosts[(c + t) % n];
        if (GAP_MS) await sleep(GAP_MS);
        const r = await streamChat(host.url, body(msgs));
        await settle(host);
        const row = { setup, conv: c, turn: t + 1, host: (c + t) % n, prompt: r.usage.prompt_tokens,
          cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0, ttft: r.ttft,
          tier: '', restore_ms: NaN, cold: NaN, fresh_new: NaN };
        // The finish chunk carries the timings (cache_n) and kvstash's cache object (tier, restore_ms).
        if (r.timings) row.cached = r.timings.cache_n ?? row.cached;
        if (r.cache) { row.tier = r.cache.tier ?? ''; row.restore_ms = r.cache.restore_ms ?? NaN; }
        let ref;
        if (setup === 'redis') {
          // The reference (cache-off) reply, its cold TTFT, and the new tokens' fresh prefill.
          if (GAP_MS) await sleep(GAP_MS);
          ref = await streamChat(off.url, body(msgs));
          row.cold = ref.ttft;
          const nNew = Math.max(1, row.prompt - row.cached);
          if (GAP_MS) await sleep(GAP_MS);
          const fresh = await streamChat(off.url, body([{ role: 'user', content: words(Math.max(1, nNew - 9), 777 + t * 97 + c) }], 1));
          row.fresh_new = fresh.ttft;
          row.fresh_tokens = fresh.usage.prompt_tokens;
          replies[c][t] = ref.text;
          history[c].push({ role: 'user', content: userMsg(c, t) }, { role: 'assistant', content: ref.text });
        }
        if (r.text !== replies[c][t]) mismatches++;
        rows.push(row);
      }
      process.stderr.write(`multihost: ${setup}: turn ${t + 1} done\n`);
    }
    for (const h of hosts) await h.stop();
    if (redis) redis.stop();
  }
  await off.stop();
  return { rows, mismatches };
}

// ------------------------------------------------------------ floor at depth
// The new tokens of a turn attend to the whole history before them: their
// prefill is measured on llama.cpp alone at that depth (`kvstash bench floor
// --stdin`, as bench/http_bench.mjs does), with the time to set the restored
// state back. No kvstash code runs in the timed part.
async function depthFloors(rows) {
  const p = spawn(BIN, ['bench', 'floor', '-m', MODEL, '--threads', String(THREADS), '--ctx', '8192', '--stdin'],
    { stdio: ['pipe', 'pipe', 'ignore'], env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  live.add(p);
  let buf = '';
  const waiting = [];
  p.stdout.on('data', (d) => {
    buf += d;
    let i;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      const w = waiting.shift();
      if (w) w(line);
    }
  });
  const ready = await new Promise((res) => waiting.push(res));
  if (!ready.startsWith('ready')) die(`bench floor did not start: ${ready}`);
  for (const r of rows) {
    if (r.setup !== 'redis' || r.turn === 1 || !(r.cached > 0)) continue;
    const line = await new Promise((res) => {
      waiting.push(res);
      p.stdin.write(`${r.cached} ${Math.max(1, r.prompt - r.cached)} 1\n`);
    });
    const m = /^([\d.]+) ([\d.]+)$/.exec(line);
    if (m) { r.prefill_depth = Number(m[1]); r.state_set = Number(m[2]); }
  }
  p.stdin.end();
  await new Promise((res) => p.on('exit', res));
  live.delete(p);
}

let rows, mismatches;
if (opt.rows) {
  // The rows of an earlier run (its multihost_rows.json): only the floors and tables are made again.
  const saved = JSON.parse(fs.readFileSync(opt.rows, 'utf8'));
  ({ rows, mismatches } = Array.isArray(saved) ? { rows: saved, mismatches: num('mismatches', NaN) } : saved);
} else {
  ({ rows, mismatches } = await run());
  fs.writeFileSync(path.join(OUT, 'multihost_rows.json'), JSON.stringify({ rows, mismatches }));
}
await depthFloors(rows);
const by = (setup, turn) => rows.filter((r) => r.setup === setup && r.turn === turn);
const ratio = (a, b) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? (a / b).toFixed(2) + '×' : '–');
const f0 = (x) => (Number.isFinite(x) ? x.toFixed(0) : '–');
const lines = [];
lines.push(`Hosts ${HOSTS}, ${CONVS} conversations × ${TURNS} turns, system ${SYS_WORDS} words, messages ${MSG_WORDS} words, ` +
  `${MAX_TOKENS} tokens per reply, --threads ${THREADS}; medians per turn (ms). Replies that differ from the cache-off server: ${mismatches}.`);
lines.push('');
lines.push('| turn | prompt tok | new tok | cache off (cold) | redis, other host | no redis, other host | one host | restore_ms (redis) | floor@0 | floor@depth | redis / floor@depth | redis / cold |');
lines.push('|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
const csv = ['turn,prompt,cold,redis,local,single,floor'];
for (let t = 1; t <= TURNS; t++) {
  const R = by('redis', t), L = by('local', t), S = by('single', t);
  const rest = (r) => (Number.isFinite(r.restore_ms) ? r.restore_ms : 0);
  // floor@0: the new tokens prefilled fresh + the restore (lookup, transfer, state set);
  // floor@depth: the new tokens prefilled after the restored ones + the same restore.
  const f0s = R.map((r) => r.fresh_new + rest(r));
  const fds = R.map((r) => (Number.isFinite(r.prefill_depth) ? r.prefill_depth + rest(r) : NaN));
  const mr = median(R.map((r) => r.ttft)), mc = median(R.map((r) => r.cold)), mfd = median(fds);
  lines.push(`| ${t} | ${f0(median(R.map((r) => r.prompt)))} | ${f0(median(R.map((r) => r.prompt - r.cached)))} | ${f0(mc)} | ${f0(mr)} | ` +
    `${f0(median(L.map((r) => r.ttft)))} | ${f0(median(S.map((r) => r.ttft)))} | ${t === 1 ? '–' : median(R.map((r) => r.restore_ms)).toFixed(1)} | ` +
    `${f0(median(f0s))} | ${t === 1 ? '–' : f0(mfd)} | ${t === 1 ? '–' : ratio(median(R.map((r, i) => r.ttft / fds[i])), 1)} | ${ratio(mr, mc)} |`);
  csv.push([t, median(R.map((r) => r.prompt)), mc, mr, median(L.map((r) => r.ttft)), median(S.map((r) => r.ttft)),
    t === 1 ? mc : mfd].map((x) => (Number.isFinite(x) ? x.toFixed(1) : '')).join(','));
}
const cross = rows.filter((r) => r.setup === 'redis' && r.turn > 1);
const tiers = {};
for (const r of cross) tiers[r.tier || 'none'] = (tiers[r.tier || 'none'] || 0) + 1;
const perReq = cross.filter((r) => Number.isFinite(r.prefill_depth));
const within = perReq.filter((r) => r.ttft <= 1.2 * (r.prefill_depth + r.restore_ms)).length;
const cold15 = cross.filter((r) => r.ttft <= 0.15 * r.cold).length;
lines.push('');
lines.push(`Turns 2–${TURNS} of the redis setup (each on another host than the turn before): restored from ` +
  Object.entries(tiers).map(([k, v]) => `${k} ${v}`).join(', ') + `; median restore_ms ${median(cross.map((r) => r.restore_ms)).toFixed(1)} ` +
  `(lookup + Redis round trips + transfer + checks + llama state set), of which llama's state set ${median(perReq.map((r) => r.state_set)).toFixed(1)} ms. ` +
  `TTFT ≤ 1.2× floor@depth: ${within} of ${perReq.length}; TTFT ≤ 0.15× cold: ${cold15} of ${cross.length}; ` +
  `median TTFT / cold ${ratio(median(cross.map((r) => r.ttft / r.cold)), 1)}.`);
fs.writeFileSync(path.join(OUT, 'multihost.md'), lines.join('\n') + '\n');
fs.writeFileSync(path.join(OUT, 'multihost.csv'), csv.join('\n') + '\n');
console.log(lines.join('\n'));
