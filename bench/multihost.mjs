#!/usr/bin/env node
// multihost.mjs — several kvstash servers behind a round-robin client (issue
// 14): does a turn that lands on another host cost what its new tokens cost?
// Not a test: nothing here fails on a number.
//
// usage: node bench/multihost.mjs [--key value ...]
//   --bin B --model M --out D --threads N (every server)   --hosts N [2]
//   --convs N [20] --turns N [5] --sys-words N [400] --msg-words N [40] --max-tokens N [16]
//   --redis-server PATH [redis-server]
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
  const full = ['serve', '-m', MODEL, '--port', '0', '--log', 'info', '--threads', String(THREADS), '--slots', '2',
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
          ref = await streamChat(off.url, body(msgs));
          row.cold = ref.ttft;
          const nNew = Math.max(1, row.prompt - row.cached);
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
  return { rows, mismatches, off };
}

const { rows, mismatches } = await run();
const by = (setup, turn) => rows.filter((r) => r.setup === setup && r.turn === turn);
const lines = [];
lines.push(`Hosts ${HOSTS}, ${CONVS} conversations × ${TURNS} turns, system ${SYS_WORDS} words, messages ${MSG_WORDS} words, ` +
  `${MAX_TOKENS} tokens per reply, --threads ${THREADS}; median TTFT per turn (ms). Replies that differ from the cache-off server: ${mismatches}.`);
lines.push('');
lines.push('| turn | prompt tokens | cache off (cold) | redis tier, other host | no redis, other host | single host | new tokens | floor: new tokens fresh + restore | redis / floor | redis / cold |');
lines.push('|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
const csv = ['turn,prompt,cold,redis,local,single,floor'];
for (let t = 1; t <= TURNS; t++) {
  const R = by('redis', t), L = by('local', t), S = by('single', t);
  const floorRow = R.map((r) => r.fresh_new + (Number.isFinite(r.restore_ms) ? r.restore_ms : 0));
  const mr = median(R.map((r) => r.ttft)), mf = median(floorRow), mc = median(R.map((r) => r.cold));
  const ratio = (a, b) => (Number.isFinite(a) && Number.isFinite(b) && b > 0 ? (a / b).toFixed(2) + '×' : '–');
  const f0 = (x) => (Number.isFinite(x) ? x.toFixed(0) : '–');
  lines.push(`| ${t} | ${f0(median(R.map((r) => r.prompt)))} | ${f0(mc)} | ${f0(mr)} | ${f0(median(L.map((r) => r.ttft)))} | ` +
    `${f0(median(S.map((r) => r.ttft)))} | ${f0(median(R.map((r) => r.prompt - r.cached)))} | ${f0(mf)} | ${t === 1 ? '–' : ratio(mr, mf)} | ${ratio(mr, mc)} |`);
  csv.push([t, median(R.map((r) => r.prompt)), mc, mr, median(L.map((r) => r.ttft)), median(S.map((r) => r.ttft)), mf].map((x) => (Number.isFinite(x) ? x.toFixed(1) : '')).join(','));
}
const cross = rows.filter((r) => r.setup === 'redis' && r.turn > 1);
const tiers = {};
for (const r of cross) tiers[r.tier || 'none'] = (tiers[r.tier || 'none'] || 0) + 1;
lines.push('');
lines.push(`Turns 2–${TURNS} of the redis setup (all on another host than the turn before): restored from ` +
  Object.entries(tiers).map(([k, v]) => `${k} ${v}`).join(', ') + `; median restore_ms ${median(cross.map((r) => r.restore_ms)).toFixed(1)}.`);
fs.writeFileSync(path.join(OUT, 'multihost.md'), lines.join('\n') + '\n');
fs.writeFileSync(path.join(OUT, 'multihost.csv'), csv.join('\n') + '\n');
fs.writeFileSync(path.join(OUT, 'multihost_rows.json'), JSON.stringify(rows, null, 1));
console.log(lines.join('\n'));
