#!/usr/bin/env node
// media_peer.mjs — a conversation about one image, `kvstash serve` beside
// llama.cpp's own `llama-server` of the same pinned source, both with the same
// projector (`--mmproj`), and then both restarted (issue 29's acceptance).
// Starts and stops the servers itself (bench/media_peer.sh gives the paths).
// No npm dependencies (fetch). Not a test: nothing fails on a number; it
// prints a markdown table and writes it with CSV files.
//
// usage: node bench/media_peer.mjs --bin KVSTASH --model MODEL.gguf --mmproj PROJ.gguf
//          --peer bench/peer.sh --out DIR [--key value ...]
//   --threads N [2] --slots N [2] --ctx N [4096]   of both servers
//   --turns N [6]       user turns of the conversation (the image in turn 1)
//   --msg-words N [30]  words of every user message (besides the image)
//   --max-tokens N [32] reply length limit
//   --size N [224]      the image's width and height (a PNG made here)
//   --repeat N [1]      the whole thing (fresh store, fresh servers) N times
//   --gap-ms N [1000]   wait before each measured request (2 cores: a server's
//                       threads may still poll after its request)
//   --tiers default|disk [default]  kvstash's store: its default tiers (RAM, shm,
//                       disk; a restarted process finds the states in shm), or
//                       the disk tier alone (RAM and shm tiers 0 bytes, every
//                       save to disk: what a reboot leaves; server_restart.sh's
//                       "disk only")
//   --prefix NAME [media_peer]  the outputs' base name
//
// Method, per repeat:
//  1. Start both servers (2 slots, 2 threads each): kvstash with a full store
//     (its disk tier and shm tier in fresh directories of this run, given by a
//     config file, so nothing of another run or process is found), llama-server
//     through `bench/peer.sh serve` (its defaults: prompt cache and RAM prompt
//     cache on). One unmeasured warm-up request to each: another image (so the
//     first encode of the process is not measured) and a short question, a
//     2-token reply.
//  2. Turns 1..T: turn 1's user message holds the image between two short texts
//     ("Here is my screen:" <image> + words), later turns are text only; the
//     image stays in the history. Every server keeps its own history (its own
//     greedy replies), as a chat UI does. Turn t goes to both before t+1,
//     rotating who goes first. Streamed, temperature 0, max_tokens, cache_prompt.
//  3. Restart: stop both (SIGTERM, wait for the exit), start both again
//     (kvstash on the same store directories; llama-server's caches were in
//     RAM and are gone), warm them up as in 1, and send turn T+1 (each server's
//     own history of T turns plus a new question): kvstash restores the
//     conversation, image KV included, from its store; llama-server encodes
//     the image and prefills everything again.
//  TTFT: client-side, to the first content chunk (peer_lib.mjs streamChat).
//  cached/new: timings.cache_n / timings.prompt_n (both servers set them), else
//  usage.prompt_tokens_details.cached_tokens. encodes (kvstash): the change of
//  kvstash_media_encodes_total over the request (/metrics).
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { parseArgs, median, words, streamChat } from './peer_lib.mjs';
import { png } from '../tests/e2e/media.mjs';

const { opt, die, str } = parseArgs('media_peer', process.argv.slice(2));
const num = (k, d, min = 1) => {
  if (opt[k] === undefined) return d;
  const v = Number(opt[k]);
  if (!Number.isInteger(v) || v < min) die(`--${k} wants an integer >= ${min}`);
  return v;
};
for (const k of ['bin', 'model', 'mmproj', 'peer', 'out']) if (!opt[k]) die(`--${k} is required`);
const BIN = str('bin'), MODEL = str('model'), MMPROJ = str('mmproj'), PEER = str('peer');
const OUT = path.resolve(str('out')), PREFIX = str('prefix', 'media_peer');
const THREADS = num('threads', 2), SLOTS = num('slots', 2), CTX = num('ctx', 4096);
const T = num('turns', 6), UW = num('msg-words', 30), MT = num('max-tokens', 32), SIZE = num('size', 224, 16);
const R = num('repeat', 1), GAP = num('gap-ms', 1000, 0);
const TIERS = str('tiers', 'default');
if (!['default', 'disk'].includes(TIERS)) die('--tiers wants default or disk');
fs.mkdirSync(OUT, { recursive: true });

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
const f = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '–');
const fc = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '');
const fr = (x) => (Number.isFinite(x) ? `${x.toFixed(2)}×` : '–');
const log = (s) => process.stderr.write(`media_peer: ${s}\n`);

// ------------------------------------------------------------- servers
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

function freePort() {
  return new Promise((resolve) => {
    import('node:net').then(({ createServer }) => {
      const s = createServer();
      s.listen(0, '127.0.0.1', () => {
        const p = s.address().port;
        s.close(() => resolve(p));
      });
    });
  });
}

// Spawns cmd args, its stdout+stderr to logFile (appended); resolves when
// URL/health answers 200. portFrom: a function of the output giving the port
// (kvstash prints it), or a fixed port.
async function start(name, cmd, args, logFile, portFrom, env = {}) {
  const ws = fs.createWriteStream(logFile, { flags: 'a' });
  ws.write(`# ${new Date().toISOString()} ${cmd} ${args.join(' ')}\n`);
  const proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, GGML_NO_BACKTRACE: '1', ...env } });
  live.add(proc);
  let text = '', exited = null;
  const exitP = new Promise((resolve) => proc.on('exit', (code, signal) => {
    live.delete(proc);
    exited = { code, signal };
    resolve(exited);
  }));
  const onData = (d) => {
    text += d;
    ws.write(d);
  };
  proc.stdout.on('data', onData);
  proc.stderr.on('data', onData);
  const t0 = Date.now();
  let port = typeof portFrom === 'number' ? portFrom : null;
  for (;;) {
    if (exited) {
      process.stderr.write(text.slice(-3000));
      die(`${name} exited before it answered /health (log: ${logFile})`);
    }
    if (Date.now() - t0 > 180000) die(`${name}: no /health in 180 s (log: ${logFile})`);
    if (port === null) port = portFrom(text);
    if (port !== null) {
      try {
        if ((await fetch(`http://127.0.0.1:${port}/health`)).status === 200) break;
      } catch {
        /* not yet */
      }
    }
    await sleep(100);
  }
  return {
    name,
    url: `http://127.0.0.1:${port}`,
    get log() {
      return text;
    },
    async stop() {
      if (!exited) proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 60000);
      await exitP;
      clearTimeout(timer);
      ws.end();
      return exited;
    },
  };
}

const storeDirs = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), `ks-${PREFIX}-`));
  const shm = fs.existsSync('/dev/shm') ? fs.mkdtempSync(`/dev/shm/ks-${PREFIX}-`) : path.join(d, 'shm');
  const cfg = path.join(d, 'kvstash.yaml');
  const lines = ['store:', '  enabled: true', `  cache_dir: ${path.join(d, 'disk')}`, `  shm_dir: ${shm}`];
  if (TIERS === 'disk')
    lines.push('  tiers:', '    ram: { max_bytes: 0 }', '    shm: { max_bytes: 0 }',
      '  reasons: { cold: disk, continued: disk, finish: disk, evict: disk, shutdown: disk }');
  fs.writeFileSync(cfg, [...lines, ''].join('\n'));
  return { d, shm, cfg };
};

const KS_ARGS = (cfg) => ['serve', '-m', MODEL, '--mmproj', MMPROJ, '--port', '0', '--threads', String(THREADS),
  '--slots', String(SLOTS), '--ctx', String(CTX), '--config', cfg];
async function startBoth(r, phase, dirs) {
  const ks = await start('kvstash', BIN, KS_ARGS(dirs.cfg), path.join(OUT, `${PREFIX}-kvstash.log`), (t) => {
    const m = /kvstash: port=(\d+)/.exec(t);
    return m ? Number(m[1]) : null;
  });
  const port = await freePort();
  const ls = await start('llama-server', PEER, ['serve', MODEL, String(port), '--mmproj', MMPROJ],
    path.join(OUT, `${PREFIX}-llama-server.log`), port, { THREADS: String(THREADS), SLOTS: String(SLOTS), CTX: String(CTX) });
  log(`repeat ${r} ${phase}: kvstash on ${ks.url}, llama-server on ${ls.url}`);
  return [ks, ls];
}

// ------------------------------------------------------------- requests
const IMG = `data:image/png;base64,${png(SIZE, SIZE, 7).toString('base64')}`;
const WARM_IMG = `data:image/png;base64,${png(SIZE, SIZE, 99).toString('base64')}`;
const imageMsg = (img, text) => ({ role: 'user', content: [
  { type: 'text', text: 'Here is my screen:' },
  { type: 'image_url', image_url: { url: img } },
  { type: 'text', text } ] });

async function encodes(srv) {
  if (srv.name !== 'kvstash') return NaN;
  const t = await (await fetch(`${srv.url}/metrics`)).text();
  const m = /^kvstash_media_encodes_total(?:\{[^}]*\})?\s+([\d.e+]+)/m.exec(t);
  return m ? Number(m[1]) : NaN;
}

async function chat(srv, messages, maxTokens = MT) {
  if (GAP) await sleep(GAP);
  const e0 = await encodes(srv);
  const x = await streamChat(srv.url, { messages, max_tokens: maxTokens, temperature: 0, cache_prompt: true });
  const e1 = await encodes(srv);
  const u = x.usage || {};
  const tm = x.timings || {};
  const usageCached = u.prompt_tokens_details ? u.prompt_tokens_details.cached_tokens : NaN;
  const cached = Number.isFinite(tm.cache_n) ? tm.cache_n : usageCached;
  return { ttft: x.ttft, total: x.total, content: x.text, prompt: u.prompt_tokens, cached,
    nnew: Number.isFinite(tm.prompt_n) ? tm.prompt_n : u.prompt_tokens - cached, encodes: e1 - e0 };
}

async function warmup(srvs) {
  for (const s of srvs) await chat(s, [imageMsg(WARM_IMG, words(12, 77))], 2);
}

// ------------------------------------------------------------- the runs
const names = ['kvstash', 'llama-server'];
const runs = []; // runs[r] = { turns: [[ks, ls] per turn], restart: [ks, ls] }
let peerVersion = '';
for (let r = 1; r <= R; r++) {
  const dirs = storeDirs();
  let srvs = await startBoth(r, 'start', dirs);
  if (!peerVersion) peerVersion = (/build (\d+), commit ([0-9a-f]+)/.exec(srvs[1].log) || []).slice(1).join('-');
  await warmup(srvs);
  const convs = [[], []];
  const turns = [];
  for (let t = 1; t <= T; t++) {
    const text = words(UW, 20000 + t);
    const row = [null, null];
    for (let k = 0; k < 2; k++) {
      const s = (t - 1 + k + r - 1) % 2; // rotate who goes first, per turn and per repeat
      convs[s].push(t === 1 ? imageMsg(IMG, text) : { role: 'user', content: text });
      row[s] = await chat(srvs[s], convs[s]);
      convs[s].push({ role: 'assistant', content: row[s].content });
    }
    turns.push(row);
    log(`repeat ${r} turn ${t}: ${row.map((x, s) => `${names[s]} ${f(x.ttft)} ms (prompt ${x.prompt}, cached ${x.cached}, ` +
      `new ${x.nnew}${s === 0 ? `, encodes ${x.encodes}` : ''})`).join('; ')}`);
  }
  await sleep(1000); // the finish save of the last turn
  for (const s of srvs) await s.stop();
  srvs = await startBoth(r, 'restart', dirs);
  await warmup(srvs);
  const text = words(UW, 20000 + T + 1);
  const restart = [null, null];
  for (let k = 0; k < 2; k++) {
    const s = (k + r - 1) % 2;
    convs[s].push({ role: 'user', content: text });
    restart[s] = await chat(srvs[s], convs[s]);
  }
  log(`repeat ${r} after the restart, turn ${T + 1}: ${restart.map((x, s) => `${names[s]} ${f(x.ttft)} ms (prompt ${x.prompt}, ` +
    `cached ${x.cached}, new ${x.nnew}${s === 0 ? `, encodes ${x.encodes}` : ''})`).join('; ')}`);
  for (const s of srvs) await s.stop();
  fs.rmSync(dirs.d, { recursive: true, force: true });
  fs.rmSync(dirs.shm, { recursive: true, force: true });
  runs.push({ turns, restart, same: turns.map((row) => row[0].content === row[1].content) });
}

// ------------------------------------------------------------- report
const med = (xs) => median(xs);
// Per turn: the median over repeats of each server's TTFT, and of the per-repeat ratio.
const hdr = ['turn', 'prompt tok (kvstash / llama-server)', 'kvstash TTFT ms', 'kvstash cached/new', 'kvstash encodes',
  'llama-server TTFT ms', 'llama-server cached/new', 'kvstash / llama-server'];
const rows = [];
const perTurn = [];
for (let t = 1; t <= T + 1; t++) {
  const get = (run) => (t <= T ? run.turns[t - 1] : run.restart);
  const ks = runs.map((run) => get(run)[0]), ls = runs.map((run) => get(run)[1]);
  const ratio = med(runs.map((run) => get(run)[0].ttft / get(run)[1].ttft));
  perTurn.push({ t, ratio, ks: med(ks.map((x) => x.ttft)), ls: med(ls.map((x) => x.ttft)) });
  const last = runs.at(-1);
  const a = get(last)[0], b = get(last)[1];
  rows.push([t <= T ? String(t) : `${t} after the restart`, a.prompt === b.prompt ? f(a.prompt) : `${f(a.prompt)} / ${f(b.prompt)}`,
    f(perTurn.at(-1).ks), `${f(a.cached)}/${f(a.nnew)}`, ks.map((x) => f(x.encodes)).join(' '), f(perTurn.at(-1).ls),
    `${f(b.cached)}/${f(b.nnew)}`, fr(ratio)]);
}
const md = [`| ${hdr.join(' | ')} |`, `|${hdr.map(() => '--:').join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)];
const later = perTurn.slice(1, T);
const perRun = runs.map((run) => ({
  later: med(run.turns.slice(1).map((row) => row[0].ttft / row[1].ttft)),
  restart: run.restart[0].ttft / run.restart[1].ttft,
}));
const lines = [md.join('\n'), ''];
lines.push(`${R} repeat(s); TTFT per turn: the median over the repeats; kvstash / llama-server: the median of the ` +
  `per-repeat ratios; cached/new: the last repeat's (timings.cache_n / timings.prompt_n); encodes: ` +
  `kvstash_media_encodes_total's change over the request, per repeat. Turn 1 holds a ${SIZE}×${SIZE} PNG and ` +
  `${UW} words; turns 2–${T} ${UW} words each; replies of at most ${MT} tokens (greedy, streamed, cache_prompt); ` +
  `turn ${T + 1} is sent to new processes (kvstash on the same store directories). Replies the same on both ` +
  `servers: ${runs.map((run) => run.same.filter(Boolean).length).join(', ')} of ${T} turns per repeat.`);
lines.push('');
lines.push(`**Turns 2–${T}, kvstash TTFT / llama-server's**: median ${fr(med(runs.flatMap((run) => run.turns.slice(1).map((row) => row[0].ttft / row[1].ttft))))} ` +
  `over every cached turn of every repeat (per repeat: ${perRun.map((p) => fr(p.later)).join(', ')}; per turn: ` +
  `${later.map((p) => fr(p.ratio)).join(' ')}); median TTFT ${f(med(later.map((p) => p.ks)))} against ${f(med(later.map((p) => p.ls)))} ms (target ≤ 1.05×).`);
lines.push(`**After the restart (turn ${T + 1})**: ${fr(med(perRun.map((p) => p.restart)))} (per repeat: ` +
  `${perRun.map((p) => fr(p.restart)).join(', ')}); TTFT ${f(perTurn.at(-1).ks)} against ${f(perTurn.at(-1).ls)} ms (target ≤ 0.2×).`);
lines.push(`**Turn 1 (cold, the image encoded)**: ${fr(perTurn[0].ratio)}; TTFT ${f(perTurn[0].ks)} against ${f(perTurn[0].ls)} ms.`);
lines.push('');
lines.push(`Servers: kvstash \`${path.basename(BIN)} ${KS_ARGS('CFG').join(' ').replace(MODEL, path.basename(MODEL)).replace(MMPROJ, path.basename(MMPROJ))}\` ` +
  `(CFG: store enabled, cache_dir and shm_dir in fresh directories${TIERS === 'disk' ? ', the disk tier alone' : ', default tiers'}); llama-server ${peerVersion ? `b${peerVersion} ` : ''}` +
  `\`bench/peer.sh serve ${path.basename(MODEL)} PORT --mmproj ${path.basename(MMPROJ)}\` (THREADS=${THREADS} SLOTS=${SLOTS} CTX=${CTX}).`);
if (process.env.KS_BENCH_CMD) lines.push('', `Command: \`${process.env.KS_BENCH_CMD}\``);
const text = lines.join('\n') + '\n';
process.stdout.write(text);
fs.writeFileSync(path.join(OUT, `${PREFIX}.md`), text);
const csv = ['repeat,turn,server,prompt_tokens,cached_tokens,new_tokens,encodes,ttft_ms,total_ms,restart'];
runs.forEach((run, i) => {
  const all = [...run.turns, run.restart];
  all.forEach((row, k) => row.forEach((x, s) => csv.push([i + 1, k + 1, names[s], fc(x.prompt), fc(x.cached), fc(x.nnew),
    fc(x.encodes), fc(x.ttft, 2), fc(x.total, 2), k === T ? 1 : 0].join(','))));
});
fs.writeFileSync(path.join(OUT, `${PREFIX}.csv`), csv.join('\n') + '\n');
// The plot's input: turn, then the median TTFT of each server.
fs.writeFileSync(path.join(OUT, `${PREFIX}_ttft.csv`), ['turn,kvstash,llama-server',
  ...perTurn.map((p) => [p.t, fc(p.ks, 2), fc(p.ls, 2)].join(','))].join('\n') + '\n');
