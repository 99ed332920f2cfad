#!/usr/bin/env node
// models_peer.mjs — one server, two models, one of them loaded at a time
// (issue 37): `kvstash serve --models-dir DIR --models-max 1` beside
// llama.cpp's own llama-server in router mode (`--models-dir DIR
// --models-max 1`, built from the same pinned source by bench/peer.sh). Each
// server is started alone (the other stopped), so they never share the cores.
// Not a test: nothing fails on a number; it prints a markdown table (and
// writes it with a CSV when --out is given).
//
// Per round, on each server (a fresh one, the two in turn): a conversation of 6 turns on model A (its first
// request loads A: load + prefill), one request on model B (A is unloaded for
// it), then turn 7 on A (A loaded again: kvstash restores the conversation
// from its store, the peer prefills it again). A new conversation (another
// system prompt) every round.
//
// usage: node bench/models_peer.mjs --kvstash BIN --peer BIN --dir DIR --a NAME --b NAME
//   [--threads 2] [--ctx 4096] [--rounds 3] [--sys-words 1200] [--msg-words 60] [--max-tokens 32]
//   [--out DIR]
import { writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { parseArgs, median, words, streamChat, now, freePort, startServer, stopServer } from './peer_lib.mjs';

const { str, die } = parseArgs('models_peer', process.argv.slice(2));
const KS = str('kvstash') || die('--kvstash BIN');
const PEER = str('peer') || die('--peer BIN');
const DIR = str('dir') || die('--dir DIR');
const A = str('a', 'bench'), B = str('b', 'bench-q4k');
const THREADS = str('threads', '2'), CTX = str('ctx', '4096');
const ROUNDS = Number(str('rounds', '3')), SYS = Number(str('sys-words', '1200'));
const MSG = Number(str('msg-words', '60')), MAXT = Number(str('max-tokens', '32'));
const OUT = str('out', '');

async function start(kind) {
  const port = await freePort();
  const args = kind === 'kvstash'
    ? ['serve', '--models-dir', DIR, '--models-max', '1', '--port', String(port), '--threads', THREADS, '--slots', '1',
      '--ctx', CTX, '--log', process.env.KS_LOG || 'info']
    : ['--models-dir', DIR, '--models-max', '1', '--port', String(port), '--host', '127.0.0.1', '-t', THREADS, '-tb', THREADS,
      '-np', '1', '-c', CTX, '--no-webui'];
  return startServer(kind, kind === 'kvstash' ? KS : PEER, args, port, 60000);
}

async function round(s, r) {
  const sys = `You are a helpful assistant. ${words(SYS, 1000 + r)}`;
  const msgs = [{ role: 'system', content: sys }];
  const turn = async (model, m) => {
    const t0 = now();
    const x = await streamChat(s.url, { model, messages: m, max_tokens: MAXT, temperature: 0 });
    return { ...x, wall: now() - t0 };
  };
  const rows = [];
  for (let t = 1; t <= 7; t++) {
    if (t === 7) {
      // B in between: A goes (--models-max 1)
      const b = await turn(B, [{ role: 'user', content: `a question for the other model ${words(MSG, 9000 + r)}` }]);
      rows.push({ what: 'B (A unloaded)', ttft: b.ttft, prompt: b.usage?.prompt_tokens, cached: b.usage?.prompt_tokens_details?.cached_tokens ?? b.timings?.cache_n });
    }
    msgs.push({ role: 'user', content: words(MSG, 100 * r + t) });
    const x = await turn(A, msgs);
    msgs.push({ role: 'assistant', content: x.text });
    rows.push({ what: `A turn ${t}`, ttft: x.ttft, prompt: x.usage?.prompt_tokens,
      cached: x.usage?.prompt_tokens_details?.cached_tokens ?? x.timings?.cache_n, text: x.text });
  }
  return rows;
}

const res = { kvstash: [], 'llama-server': [] };
for (let r = 0; r < ROUNDS; r++) {
  // Rounds interleaved, who goes first alternating: the page cache and the
  // machine's load treat both alike. A fresh server per round: every round
  // starts with no model loaded.
  for (const kind of r % 2 ? ['llama-server', 'kvstash'] : ['kvstash', 'llama-server']) {
    const s = await start(kind);
    try {
      res[kind].push(await round(s, r));
    } finally {
      await stopServer(s);
      // KS_LOG_DIR: each server's log, to see where a request's time went
      if (process.env.KS_LOG_DIR) writeFileSync(path.join(process.env.KS_LOG_DIR, `${kind}-${r}.log`), s.log());
    }
    process.stderr.write(`models_peer: round ${r + 1}/${ROUNDS} ${kind} done\n`);
  }
}

const whats = res.kvstash[0].map((x) => x.what);
const med = (kind, i, k = 'ttft') => median(res[kind].map((rr) => rr[i][k]));
const f = (x) => (Number.isFinite(x) ? x.toFixed(0) : '-');
const lines = [`| request | kvstash TTFT ms | llama-server TTFT ms | kvstash / llama-server | prompt tokens | kvstash cached | llama-server cached |`,
  '|---|---:|---:|---:|---:|---:|---:|'];
const csv = ['request,kvstash_ttft_ms,llama_server_ttft_ms,ratio'];
whats.forEach((w, i) => {
  const k = med('kvstash', i), l = med('llama-server', i);
  lines.push(`| ${w} | ${f(k)} | ${f(l)} | ${(k / l).toFixed(2)}× | ${f(med('kvstash', i, 'prompt'))} | ${f(med('kvstash', i, 'cached'))} | ${f(med('llama-server', i, 'cached'))} |`);
  csv.push(`${w},${k.toFixed(1)},${l.toFixed(1)},${(k / l).toFixed(3)}`);
});
const t7 = whats.indexOf('A turn 7'), t1 = whats.indexOf('A turn 1');
lines.push('', `Medians of ${ROUNDS} rounds (a fresh server each, the two interleaved, who goes first alternating), ` +
  `threads ${THREADS}, ctx ${CTX}, --models-max 1, A = ${A}, B = ${B}. **Turn 7 after B** (A loaded again): ` +
  `kvstash / llama-server ${(med('kvstash', t7) / med('llama-server', t7)).toFixed(2)}×; **first request** ` +
  `(load + prefill): ${(med('kvstash', t1) / med('llama-server', t1)).toFixed(2)}×.`);
const md = lines.join('\n');
process.stdout.write(md + '\n');
if (OUT) {
  mkdirSync(OUT, { recursive: true });
  writeFileSync(path.join(OUT, 'models_peer.md'), md + '\n');
  writeFileSync(path.join(OUT, 'models_peer.csv'), csv.join('\n') + '\n');
}
