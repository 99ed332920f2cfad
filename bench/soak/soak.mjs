#!/usr/bin/env node
// soak.mjs — a soak test of `kvstash serve` (issue 13): many concurrent
// streaming clients for minutes on the tiny model, over loopback only.
// Not a test of the suite (it is a benchmark: bench/soak/soak.sh runs it);
// it exits non-zero when the server misbehaved, so it can gate a release.
//
// usage: node bench/soak/soak.mjs [--key value ...]
//   --bin B          kvstash binary ($KS_BIN, default build/kvstash)
//   --model M        GGUF ($KS_MODEL, default build/models/tiny.gguf; made with mkmodel --preset tiny)
//   --out D          report, RSS trace, server logs (default bench/out)
//   --clients N      concurrent clients (64)
//   --duration S     seconds of load (300); no request starts after it
//   --max-requests N stop after this many requests in all (200000)
//   --slots N --ctx N --threads N --max-queue N   the server's (4, 1024, 1, 56)
//   --samples N      outputs compared with a sequential run (48)
//   --seed N         (1)
//
// What each client does, in a loop (its own seeded random choices):
//   continue  its conversation grows by a turn (a cache hit: the slot's KV,
//             IMC, or a restore from the store); when the next turn could
//             outgrow the context it starts a new one;
//   miss      a fresh one-turn prompt of random words (nothing to reuse);
//   shared    a system prompt all clients share + a random question (prefix);
//   abandon   a stream the client drops after a few chunks or milliseconds
//             (the server must count it as canceled and free the slot).
// The store is on with small budgets (ram 2 MiB, shm 4 MiB, disk 8 MiB), a
// short stride and continued saves every 16 tokens: the writer queue is busy
// and every tier evicts all the time. SPC is on, its RAM bounded (2 MiB).
// --max-queue is below what 64 clients fill: the documented 503 queue_full
// is part of the load (a rejected client waits 200-500 ms).
//
// Recorded: requests by kind and outcome, errors by status and code (only
// the documented 503s queue_full / too_many_connections / shutting_down are
// allowed), the server's RSS every 2 s (start, peak, end, trend), the slots
// and queue at the end (/slots, /metrics), and a sample of completed
// outputs (greedy) compared with the same requests sent one at a time to a
// fresh server with no cache at all: they must be equal.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, rng, WORDS } from '../peer_lib.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const { opt, rest, die } = parseArgs('soak', process.argv.slice(2));
if (rest.length) die(`bad argument ${rest[0]}`);
const num = (k, d) => (opt[k] === undefined ? d : Number(opt[k]));
const BIN = path.resolve(opt.bin || process.env.KS_BIN || path.join(ROOT, 'build/kvstash'));
const MODEL = path.resolve(opt.model || process.env.KS_MODEL || path.join(ROOT, 'build/models/tiny.gguf'));
const OUT = path.resolve(opt.out || path.join(ROOT, 'bench/out'));
const CLIENTS = num('clients', 64);
const DURATION_S = num('duration', 300);
const MAX_REQUESTS = num('max-requests', 200000);
const SLOTS = num('slots', 4);
const CTX = num('ctx', 1024);
const THREADS = num('threads', 1);
const MAX_QUEUE = num('max-queue', 56);
const N_SAMPLES = num('samples', 48);
const SEED = num('seed', 1);
const DOCUMENTED_503 = new Set(['queue_full', 'too_many_connections', 'shutting_down']);
fs.mkdirSync(OUT, { recursive: true });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// The first 67 of the benchmarks' words (through "science"): the soak's vocabulary.
const SOAK_WORDS = WORDS.slice(0, WORDS.indexOf('science') + 1);
const words = (r, n) => Array.from({ length: n }, () => SOAK_WORDS[Math.floor(r() * SOAK_WORDS.length)]).join(' ');

// ---------------------------------------------------------------- the server
const live = new Set();
process.on('exit', () => { for (const p of live) try { p.kill('SIGKILL'); } catch { /* gone */ } });
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(sig, () => process.exit(130));

async function startServer(name, args) {
  const full = ['serve', '-m', MODEL, '--host', '127.0.0.1', '--port', '0', '--threads', String(THREADS),
    '--slots', String(SLOTS), '--ctx', String(CTX), '--log', 'info', ...args];
  const proc = spawn(BIN, full, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  live.add(proc);
  const log = fs.createWriteStream(path.join(OUT, `soak-${name}.log`));
  log.write(`# ${BIN} ${full.join(' ')}\n`);
  let head = '';
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => { live.delete(proc); resolve({ code, signal }); }));
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${name}: no port line`)), 120000);
    proc.stderr.on('data', (d) => {
      log.write(d);
      if (head.length < 65536) head += d;
      const m = /kvstash: port=(\d+)/.exec(head);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    });
    exited.then((e) => reject(new Error(`${name} exited before listening: ${JSON.stringify(e)}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; i++) {
    try { if ((await fetch(`${base}/health`)).status === 200) break; } catch { /* not yet */ }
    if (i > 2400) throw new Error(`${name}: /health never answered`);
    await sleep(50);
  }
  return {
    proc, base, exited,
    async stop() {
      proc.kill('SIGTERM');
      const r = await Promise.race([exited, sleep(60000).then(() => null)]);
      if (!r) { proc.kill('SIGKILL'); return { code: null, signal: 'timeout' }; }
      return r;
    },
  };
}

function rssKiB(pid) {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : null;
  } catch { return null; }
}

async function metrics(srv) {
  const text = await (await fetch(`${srv.base}/metrics`)).text();
  const m = new Map();
  for (const line of text.split('\n')) {
    const x = /^([a-z_]+(?:\{[^}]*\})?) ([-+0-9.eE]+|NaN)$/.exec(line);
    if (x) m.set(x[1], Number(x[2]));
  }
  return m;
}
const family = (m, name) => [...m].filter(([k]) => k === name || k.startsWith(name + '{')).reduce((a, [, v]) => a + v, 0);

// ---------------------------------------------------------------- requests
// One streamed chat request. abandonAfter: {chunks, ms} to drop it early.
async function streamChat(srv, body, abandonAfter = null) {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(new Error('timeout')), 120000);
  let abandoned = false;
  let msTimer = null;
  if (abandonAfter?.ms !== undefined) msTimer = setTimeout(() => { abandoned = true; ac.abort(); }, abandonAfter.ms);
  const out = { status: 0, code: null, content: '', finish: null, usage: null, cache: null, abandoned: false, neterr: null };
  try {
    const res = await fetch(`${srv.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }), signal: ac.signal,
    });
    out.status = res.status;
    if (res.status !== 200) {
      const t = await res.text();
      try { out.code = JSON.parse(t).error?.code ?? null; } catch { out.code = 'unparsable'; }
      return out;
    }
    const dec = new TextDecoder();
    let buf = '';
    let chunks = 0;
    for await (const part of res.body) {
      buf += dec.decode(part, { stream: true });
      let i;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (!ev.startsWith('data: ')) continue;
        const data = ev.slice(6);
        if (data === '[DONE]') continue;
        const j = JSON.parse(data);
        if (j.error) { out.code = j.error.code ?? 'stream_error'; continue; }
        const ch = j.choices?.[0];
        if (ch?.delta?.content) out.content += ch.delta.content;
        if (ch?.finish_reason) out.finish = ch.finish_reason;
        if (j.usage) out.usage = j.usage;
        if (j.cache) out.cache = j.cache;
        chunks++;
      }
      if (abandonAfter?.chunks !== undefined && chunks >= abandonAfter.chunks) { abandoned = true; ac.abort(); break; }
    }
  } catch (e) {
    if (!abandoned) out.neterr = String(e?.cause?.code || e?.message || e);
  } finally {
    clearTimeout(timer);
    if (msTimer) clearTimeout(msTimer);
  }
  out.abandoned = abandoned;
  return out;
}

// ---------------------------------------------------------------- the run
const stats = {
  started: 0, byKind: {}, outcomes: {}, errors: {}, undocumented: 0, neterrs: {},
  cacheModes: {}, completionTokens: 0, samples: [],
};
const bump = (o, k, n = 1) => { o[k] = (o[k] || 0) + n; };
const SHARED_SYS = { role: 'system', content: `Shared: ${words(rng(SEED * 77), 120)}` };

async function client(srv, id, deadline) {
  const r = rng(SEED * 1000 + id);
  let conv = null;
  let convTokens = 0; // the conversation's prompt + reply tokens at its last turn
  const newConv = () => [{ role: 'system', content: `Client ${id}: ${words(r, 40 + Math.floor(r() * 80))}` }];
  while (Date.now() < deadline && stats.started < MAX_REQUESTS) {
    const x = r();
    const kind = x < 0.55 ? 'continue' : x < 0.75 ? 'miss' : x < 0.85 ? 'shared' : 'abandon';
    const max_tokens = 4 + Math.floor(r() * 28);
    let msgs;
    if (kind === 'continue' || (kind === 'abandon' && r() < 0.5)) {
      // A new conversation before the next turn could outgrow the context (a user
      // turn of <= 45 words and a reply of <= 32 tokens fit in what is left).
      if (!conv || convTokens > CTX - 400) { conv = newConv(); convTokens = 0; }
      msgs = [...conv, { role: 'user', content: words(r, 5 + Math.floor(r() * 40)) }];
    } else if (kind === 'shared') {
      msgs = [SHARED_SYS, { role: 'user', content: words(r, 5 + Math.floor(r() * 30)) }];
    } else {
      msgs = [{ role: 'user', content: words(r, 20 + Math.floor(r() * 250)) }];
    }
    const abandonAfter = kind === 'abandon' ? (r() < 0.5 ? { chunks: 1 + Math.floor(r() * 6) } : { ms: 5 + Math.floor(r() * 300) }) : null;
    stats.started++;
    bump(stats.byKind, kind);
    const body = { model: 'tiny', messages: msgs, max_tokens, temperature: 0 };
    const res = await streamChat(srv, body, abandonAfter);
    if (res.abandoned) { bump(stats.outcomes, 'abandoned'); continue; }
    if (res.neterr) { bump(stats.neterrs, res.neterr); bump(stats.outcomes, 'network_error'); stats.undocumented++; continue; }
    if (res.status !== 200 || res.code) {
      const key = `${res.status} ${res.code}`;
      bump(stats.errors, key);
      bump(stats.outcomes, 'error');
      if (!(res.status === 503 && DOCUMENTED_503.has(res.code))) stats.undocumented++;
      await sleep(res.status === 503 ? 200 + Math.floor(r() * 300) : 50);
      continue;
    }
    bump(stats.outcomes, 'ok');
    bump(stats.cacheModes, res.cache?.mode ?? 'none');
    stats.completionTokens += res.usage?.completion_tokens ?? 0;
    if (kind === 'continue') {
      conv = [...msgs, { role: 'assistant', content: res.content }];
      convTokens = (res.usage?.prompt_tokens ?? CTX) + (res.usage?.completion_tokens ?? 0);
    }
    // Every so often an output is kept for the sequential comparison.
    if (stats.samples.length < N_SAMPLES && r() < 0.02)
      stats.samples.push({ kind, body, content: res.content, finish: res.finish, tokens: res.usage?.completion_tokens });
  }
}

async function main() {
  if (!fs.existsSync(BIN)) die(`no kvstash binary at ${BIN} (make build)`);
  if (!fs.existsSync(MODEL)) {
    fs.mkdirSync(path.dirname(MODEL), { recursive: true });
    execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', '1', MODEL], { stdio: 'inherit' });
  }
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'kvstash-soak-'));
  const cfg = path.join(work, 'soak.yaml');
  fs.writeFileSync(cfg, ['store:', '  enabled: true', `  cache_dir: ${work}/disk`, `  shm_dir: ${work}/shm`,
    '  stride: 16', '  min_tokens: 16', '  continued_interval: 16',
    '  tiers: { ram: { max_bytes: 2MiB }, shm: { max_bytes: 4MiB }, disk: { max_bytes: 8MiB } }',
    // SPC's RAM bounded too, so that RSS shows whether anything else grows.
    'models:', '  default:', '    spc_max_bytes: 2MiB', ''].join('\n'));
  const t0 = Date.now();
  const srv = await startServer('load', ['--config', cfg, '--imc', '--spc', '--max-queue', String(MAX_QUEUE)]);
  const rss = [];
  const sample = () => { const v = rssKiB(srv.proc.pid); if (v !== null) rss.push({ t: (Date.now() - t0) / 1000, kib: v }); };
  sample();
  const rssStart = rss[0].kib;
  const sampler = setInterval(sample, 2000);
  const loadStart = Date.now();
  const deadline = loadStart + DURATION_S * 1000;
  const progress = setInterval(() => {
    process.stderr.write(`soak: ${((Date.now() - loadStart) / 1000).toFixed(0)} s, ${stats.started} requests, ` +
      `${JSON.stringify(stats.outcomes)}, RSS ${(rss.at(-1).kib / 1024).toFixed(1)} MiB\n`);
  }, 30000);
  await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(srv, i, deadline)));
  const loadSeconds = (Date.now() - loadStart) / 1000;
  clearInterval(progress);
  sample();
  const rssEndLoad = rss.at(-1).kib;

  // The end state: every slot idle, nothing queued, the store's queue written.
  let slotsIdle = false, m = null, slots = null;
  for (let i = 0; i < 600 && !slotsIdle; i++) {
    slots = await (await fetch(`${srv.base}/slots`)).json();
    m = await metrics(srv);
    slotsIdle = slots.every((s) => !s.busy) && m.get('kvstash_slots_busy') === 0 && m.get('kvstash_queue_depth') === 0;
    if (!slotsIdle) await sleep(50);
  }
  for (let i = 0; i < 600 && m.get('kvstash_store_queued_saves') !== 0; i++) { await sleep(50); m = await metrics(srv); }
  clearInterval(sampler);
  sample();
  const rssEnd = rss.at(-1).kib;
  const stop = await srv.stop();

  // The sample again, one request at a time, on a server with no cache.
  const ref = await startServer('reference', ['--no-cache-prompt', '--cache-ram', '0']);
  let equal = 0;
  const diffs = [];
  for (const s of stats.samples) {
    const res = await (await fetch(`${ref.base}/v1/chat/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(s.body),
    })).json();
    const c = res.choices?.[0]?.message?.content;
    if (c === s.content && res.choices[0].finish_reason === s.finish) equal++;
    else diffs.push({ kind: s.kind, soak: s.content, sequential: c });
  }
  const refStop = await ref.stop();
  fs.rmSync(work, { recursive: true, force: true });

  // ------------------------------------------------------------ report
  const peak = rss.reduce((a, x) => Math.max(a, x.kib), 0);
  const half = rss.filter((x) => x.t >= rss.at(-1).t / 2);
  const n = half.length, mt = half.reduce((a, x) => a + x.t, 0) / n, mk = half.reduce((a, x) => a + x.kib, 0) / n;
  const slope = half.reduce((a, x) => a + (x.t - mt) * (x.kib - mk), 0) / Math.max(1e-9, half.reduce((a, x) => a + (x.t - mt) ** 2, 0));
  const mib = (k) => (k / 1024).toFixed(1);
  fs.writeFileSync(path.join(OUT, 'soak_rss.csv'), 't_s,rss_kib\n' + rss.map((x) => `${x.t.toFixed(1)},${x.kib}`).join('\n') + '\n');
  const done = stats.outcomes.ok || 0;
  const report = {
    date: new Date().toISOString(), bin: BIN, model: MODEL, clients: CLIENTS, duration_s: DURATION_S,
    load_seconds: Number(loadSeconds.toFixed(1)), server: { slots: SLOTS, ctx: CTX, threads: THREADS, max_queue: MAX_QUEUE },
    requests: stats.started, by_kind: stats.byKind, outcomes: stats.outcomes, errors_by_status: stats.errors,
    network_errors: stats.neterrs, undocumented_errors: stats.undocumented, cache_modes: stats.cacheModes,
    completion_tokens: stats.completionTokens,
    rss_mib: { start: Number(mib(rssStart)), peak: Number(mib(peak)), end_of_load: Number(mib(rssEndLoad)), end: Number(mib(rssEnd)),
      second_half_trend_mib_per_min: Number((slope * 60 / 1024).toFixed(2)) },
    end: { slots_idle: slotsIdle, slots: slots.map((s) => ({ id: s.id, busy: s.busy })),
      requests_total: m.get('kvstash_requests_total'), canceled: m.get('kvstash_requests_canceled_total'),
      rejected: m.get('kvstash_requests_rejected_total'), client_disconnects: m.get('kvstash_client_disconnects_total'),
      store_saves: family(m, 'kvstash_store_saves_total'), store_not_written: family(m, 'kvstash_store_saves_not_written_total'),
      store_evictions: family(m, 'kvstash_store_tier_evictions_total'), store_hits: family(m, 'kvstash_store_hits_total'),
      store_not_written_by_cause: Object.fromEntries([...m].filter(([k]) => k.startsWith('kvstash_store_saves_not_written_total{'))),
      spc_bytes: m.get('kvstash_spc_bytes'), spc_evictions: m.get('kvstash_spc_evictions_total'),
      store_queued_saves: m.get('kvstash_store_queued_saves'), cache_hit_ratio: m.get('kvstash_cache_hit_ratio') },
    server_exit: stop, reference_exit: refStop,
    samples: { compared: stats.samples.length, equal, diffs: diffs.slice(0, 5) },
  };
  fs.writeFileSync(path.join(OUT, 'soak.json'), JSON.stringify(report, null, 2) + '\n');
  const lines = [
    `# Soak: ${CLIENTS} streaming clients, ${loadSeconds.toFixed(0)} s, tiny model (${report.date})`, '',
    `| requests | completed | abandoned by the client | errors | undocumented errors | tokens generated |`, '|--:|--:|--:|--:|--:|--:|',
    `| ${stats.started} | ${done} | ${stats.outcomes.abandoned || 0} | ${stats.outcomes.error || 0} | ${stats.undocumented} | ${stats.completionTokens} |`, '',
    `Requests by kind: ${Object.entries(stats.byKind).map(([k, v]) => `${k} ${v}`).join(', ')}.`,
    `Errors by status: ${Object.entries(stats.errors).map(([k, v]) => `${k} × ${v}`).join(', ') || 'none'}` +
      `${Object.keys(stats.neterrs).length ? `; network errors: ${JSON.stringify(stats.neterrs)}` : ''}.`,
    `Cache modes of completed requests: ${Object.entries(stats.cacheModes).map(([k, v]) => `${k} ${v}`).join(', ')}.`, '',
    `| RSS start | peak | end of load | end (idle) | trend, 2nd half |`, '|--:|--:|--:|--:|--:|',
    `| ${mib(rssStart)} MiB | ${mib(peak)} MiB | ${mib(rssEndLoad)} MiB | ${mib(rssEnd)} MiB | ${report.rss_mib.second_half_trend_mib_per_min} MiB/min |`, '',
    `End: slots idle ${slotsIdle} (${slots.length} slots), queue ${m.get('kvstash_queue_depth')}, store queue ${m.get('kvstash_store_queued_saves')}; ` +
      `server: ${m.get('kvstash_requests_total')} requests, ${m.get('kvstash_requests_canceled_total')} canceled, ` +
      `${m.get('kvstash_requests_rejected_total')} rejected; store ${report.end.store_saves} saves, ` +
      `${report.end.store_evictions} evictions, ${report.end.store_hits} hits; SPC ${mib(report.end.spc_bytes / 1024)} MiB; ` +
      `exit ${JSON.stringify(stop)}.`,
    `Outputs compared with a sequential run on a server without cache: ${equal} of ${stats.samples.length} equal.`,
  ];
  fs.writeFileSync(path.join(OUT, 'soak.md'), lines.join('\n') + '\n');
  process.stdout.write(lines.join('\n') + '\n');
  const ok = stats.undocumented === 0 && slotsIdle && equal === stats.samples.length && stats.samples.length > 0 &&
    stop.code === 0 && (stats.outcomes.ok || 0) > 0;
  if (!ok) process.stderr.write('soak: FAILED (undocumented errors, busy slots, unequal outputs or an unclean exit)\n');
  process.exit(ok ? 0 : 1);
}
main().catch((e) => { process.stderr.write(`soak: ${e.stack || e}\n`); process.exit(1); });
