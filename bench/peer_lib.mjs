// peer_lib.mjs — what the node benchmarks (decode_peer, turns_peer,
// http_bench, soak) share: the argument parser, medians, the seeded word
// generator, a server's label from /props, and one streamed chat completion
// read chunk by chunk (any OpenAI-compatible server: kvstash, llama-server).

// --key value / --key=value options; keys listed in `repeated` collect every
// value in lists[key]; other words go to rest, in order. die() prints
// "NAME: msg" and exits 2; str() reads an option as a string with a default.
export function parseArgs(name, argv, repeated = []) {
  const opt = {}, lists = {}, rest = [];
  for (const k of repeated) lists[k] = [];
  for (let i = 0; i < argv.length; i++) {
    const m = /^--([\w-]+)(?:=(.*))?$/.exec(argv[i]);
    if (!m) {
      rest.push(argv[i]);
      continue;
    }
    const v = m[2] !== undefined ? m[2] : argv[++i];
    if (m[1] in lists) lists[m[1]].push(v);
    else opt[m[1]] = v;
  }
  const die = (msg) => {
    process.stderr.write(`${name}: ${msg}\n`);
    process.exit(2);
  };
  const str = (k, d) => (opt[k] !== undefined ? String(opt[k]) : d);
  return { opt, lists, rest, die, str };
}

export const now = () => performance.now();

export function median(xs) {
  const v = xs.filter(Number.isFinite).sort((a, b) => a - b);
  if (!v.length) return NaN;
  const h = v.length >> 1;
  return v.length % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// Deterministic words (mulberry32): each one token of the bench model's
// vocabulary (mkmodel's word list); any model takes them as plain English.
export const WORDS = ('water river mountain city tree house school music paper story friend family animal country ' +
  'world people ocean island garden morning night light color sound road street town car boat plane ship ' +
  'horse bird dog fish food book letter song game rock fire wind rain snow sun moon star earth field farm ' +
  'plant wood stone gold king war money power machine system problem question answer example idea science ' +
  'language number word sentence picture travel remember learn study teach listen watch build carry follow ' +
  'change begin start open close walk run draw paint write read think feel talk sing play help small large ' +
  'great little old young new good best better early late long short high low deep warm cold hot dark clear ' +
  'quick slow simple special common north south east west between together always often never after before ' +
  'during toward against through under above near about because while until since every several enough many').split(' ');
// A seeded uniform generator in [0, 1): mulberry32.
export function rng(seed) {
  let a = (seed >>> 0) ^ 0x9e3779b9;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// n words drawn from `list` (default WORDS) with rng(seed).
export function words(n, seed, list = WORDS) {
  const r = rng(seed);
  const w = [];
  for (let i = 0; i < n; i++) w.push(list[Math.floor(r() * list.length)]);
  return w.join(' ');
}

export async function label(url) {
  try {
    const p = await (await fetch(`${url}/props`, { headers: auth() })).json();
    if (p.build_info) return p.kvstash ? `kvstash (${p.build_info})` : `llama-server ${p.build_info}`;
  } catch {
    /* no /props */
  }
  return url;
}

// POSTs body (stream: true is added) to URL/v1/chat/completions and reads the
// stream. Returns { t0, times (arrival of every content chunk), ttft (to the
// first content or finish chunk), total, text, finish, usage, timings } —
// usage, timings and cache (kvstash's cache object, on the finish chunk) from
// whichever chunk carried them.
// KS_BENCH_KEY: the API key the servers require (every server measured gets it).
const auth = () => (process.env.KS_BENCH_KEY ? { Authorization: `Bearer ${process.env.KS_BENCH_KEY}` } : {});

export async function streamChat(url, body) {
  const t0 = now();
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', ...auth() },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
  });
  if (res.status !== 200) throw new Error(`${url}: HTTP ${res.status} ${await res.text()}`);
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = '', text = '', usage = null, timings = null, cache = null, finish = null, ttft = NaN;
  const times = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const t = now();
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i).trim();
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data:')) continue;
      const d = ev.slice(5).trim();
      if (d === '[DONE]') continue;
      const j = JSON.parse(d);
      if (j.error) throw new Error(`${url}: stream error ${JSON.stringify(j.error)}`);
      const c = j.choices && j.choices[0];
      const piece = c && c.delta ? c.delta.content : null;
      if (Number.isNaN(ttft) && (piece || (c && c.finish_reason))) ttft = t - t0;
      if (piece) {
        times.push(t);
        text += piece;
      }
      if (c && c.finish_reason) finish = c.finish_reason;
      if (j.usage) usage = j.usage;
      if (j.timings) timings = j.timings;
      if (j.cache) cache = j.cache;
    }
  }
  return { t0, times, ttft, total: now() - t0, text, finish, usage, timings, cache };
}

// `kvstash bench floor --stdin` as a child process (the floor of a cached
// request: the prefill of n new tokens after `depth` tokens of history, on
// llama.cpp alone; shared/DESIGN.md). measure(depth, n) resolves to
// { prefill, restore, depth } in ms (restore: setting the depth-token state
// back); stop() ends the process. onSpawn(p) sees the child (for cleanup).
export function floorProcess({ bin, model, threads, ctx = 8192, onSpawn }) {
  let proc = null, starting = null;
  async function start() {
    const { spawn } = await import('node:child_process');
    const p = spawn(bin, ['bench', 'floor', '-m', model, '--threads', String(threads), '--ctx', String(ctx), '--stdin'],
      { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
    if (onSpawn) onSpawn(p);
    proc = { p, buf: '', waiting: [], err: '' };
    const me = proc;
    p.stderr.on('data', (d) => { me.err += d; });
    p.stdout.on('data', (d) => {
      me.buf += d;
      let i;
      while ((i = me.buf.indexOf('\n')) >= 0) {
        const line = me.buf.slice(0, i);
        me.buf = me.buf.slice(i + 1);
        const w = me.waiting.shift();
        if (w) w(line);
      }
    });
    const ready = await new Promise((res) => me.waiting.push(res));
    if (!ready.startsWith('ready')) throw new Error(`bench floor did not start: ${ready} ${me.err}`);
  }
  return {
    async measure(depth, n) {
      if (!starting) starting = start();
      await starting;
      const line = await new Promise((res) => {
        proc.waiting.push(res);
        proc.p.stdin.write(`${depth} ${Math.max(1, n)} 1\n`);
      });
      const m = /^([\d.]+) ([\d.]+)$/.exec(line);
      if (!m) throw new Error(`bench floor ${depth} ${n}: ${line} ${proc.err}`);
      return { prefill: Number(m[1]), restore: Number(m[2]), depth };
    },
    stop() {
      if (proc) proc.p.stdin.end();
      proc = starting = null;
    },
  };
}

// A free TCP port on 127.0.0.1.
export function freePort() {
  return import('node:net').then((net) => new Promise((res) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); });
  }));
}

// Starts a server (bin, args holding --port port) and waits for its /health
// (at most timeoutMs): { proc, url, log() }. stopServer sends SIGTERM and
// waits for the exit.
// One Prometheus sample of a server's /metrics (the first series of that
// name, labels or not), NaN when absent.
export async function metric(url, name) {
  const text = await (await fetch(`${url}/metrics`, { headers: auth() })).text();
  return Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text)?.[1] ?? NaN);
}
export async function startServer(what, bin, args, port, timeoutMs = 120000) {
  const { spawn } = await import('node:child_process');
  const proc = spawn(bin, args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const url = `http://127.0.0.1:${port}`;
  for (const end = now() + timeoutMs; now() < end;) {
    try { if ((await fetch(`${url}/health`)).status === 200) return { proc, url, log: () => log }; } catch { /* not yet */ }
    if (proc.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  proc.kill('SIGKILL');
  throw new Error(`${what} did not start:\n${log.slice(-2000)}`);
}
export async function stopServer(s) {
  s.proc.kill('SIGTERM');
  await new Promise((r) => (s.proc.exitCode !== null ? r() : s.proc.on('exit', r)));
}
