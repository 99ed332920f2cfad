#!/usr/bin/env node
// decode_peer.mjs — single-stream decode speed of OpenAI-compatible servers
// over HTTP, e.g. `kvstash serve` and llama.cpp's `llama-server`
// (bench/peer.sh). No npm dependencies (fetch). Not a test: nothing fails on a
// number; it prints a markdown table (and writes it with a CSV when --out is given).
//
// usage: node bench/decode_peer.mjs URL [URL ...] [--key value ...]
//   URL            a server's base URL (http://127.0.0.1:8080); with several,
//                  every round visits each in turn, rotating who goes first
//   --name LABEL   the label of a server, once per URL in the same order
//                  (default: from GET /props build_info, else the URL)
//   --rounds N     measured requests per server (default 5)
//   --max-tokens N reply length (default 128; ignore_eos makes every reply that long)
//   --prompt-words N  words of the user message (default 32)
//   --out DIR      write DIR/decode_peer.{md,csv} too
//   --gap-ms N     wait N ms before each request (default 0), so that no other
//                  server's polling threads still hold the cores (on 2 cores a
//                  2-thread decode beside them crawls at its barriers)
//
// Method:
//  - Each request: POST /v1/chat/completions, stream: true, temperature 0
//    (greedy), max_tokens N, ignore_eos: true, one user message of random
//    words (a new message every round, the same for every server in that round);
//    requests go one at a time, so only one server computes at a time.
//  - One unmeasured warm-up request per server first.
//  - Client tok/s = (content chunks - 1) / (arrival of the last content chunk -
//    arrival of the first): decode only, no prefill and no first token. Each
//    chunk carries one token when the server streams token by token (checked:
//    content chunks vs usage.completion_tokens are printed; when they differ,
//    (completion_tokens - 1) is used instead and a warning is printed).
//  - Server tok/s = timings.predicted_per_second as the server reports it.
//    Not the same quantity everywhere: this llama-server divides the decode
//    steps after the first token (predicted_n - 1) by the time from the end of
//    the prefill to the last token (as the client column does); kvstash divides
//    predicted_n by its generation time. Compare servers by the client column.
//  - TTFT = request sent to first content chunk.
//  - Reported: the median over the rounds, with the min and max.
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs, median, words, label, streamChat } from './peer_lib.mjs';

const { opt, lists, rest, die } = parseArgs('decode_peer', process.argv.slice(2), ['name']);
const urls = rest.map((u) => u.replace(/\/+$/, ''));
const names0 = lists.name; // --name, one per URL
const num = (k, d, min = 1) => {
  if (opt[k] === undefined) return d;
  const v = Number(opt[k]);
  if (!Number.isInteger(v) || v < min) die(`--${k} wants an integer >= ${min}`);
  return v;
};
if (!urls.length) die('usage: node bench/decode_peer.mjs URL [URL ...] [--name LABEL ...] [--rounds N] [--max-tokens N] [--prompt-words N] [--out DIR]');
const ROUNDS = num('rounds', 5), MT = num('max-tokens', 128), PW = num('prompt-words', 32), GAP = num('gap-ms', 0, 0);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '–');

// One streamed request; arrival times of every content chunk.
async function run(url, content) {
  const { t0, times, total, text, finish, usage, timings } = await streamChat(url, {
    messages: [{ role: 'user', content }],
    max_tokens: MT,
    temperature: 0,
    ignore_eos: true,
  });
  const n = usage ? usage.completion_tokens : NaN;
  const chunks = times.length;
  const span = chunks > 1 ? times[chunks - 1] - times[0] : NaN;
  const intervals = chunks === n ? chunks - 1 : n - 1;
  return {
    ttft: chunks ? times[0] - t0 : NaN,
    total,
    chunks,
    tokens: n,
    finish,
    tps: (1000 * intervals) / span,
    server_tps: timings ? timings.predicted_per_second : NaN,
    predicted_n: timings ? timings.predicted_n : NaN,
    prompt_n: timings ? timings.prompt_n : NaN,
    text,
  };
}

const names = names0.length ? names0 : await Promise.all(urls.map(label));
if (names.length !== urls.length) die('--name: give one per URL, or none');
const results = urls.map(() => []);
let warned = false;
process.stderr.write(`decode_peer: ${urls.length} server(s), ${ROUNDS} rounds, max_tokens ${MT}, ${PW}-word prompts\n`);
for (let s = 0; s < urls.length; s++) await run(urls[s], words(PW, 1)); // warm-up
for (let r = 0; r < ROUNDS; r++) {
  const msg = words(PW, 1000 + r);
  const line = [];
  for (let k = 0; k < urls.length; k++) {
    const s = (r + k) % urls.length; // rotate who goes first
    if (GAP) await sleep(GAP);
    const x = await run(urls[s], msg);
    if (x.chunks !== x.tokens && !warned) {
      warned = true;
      process.stderr.write(`decode_peer: warning: ${names[s]} sent ${x.chunks} content chunks for ${x.tokens} tokens; using tokens - 1\n`);
    }
    if (x.tokens !== MT) process.stderr.write(`decode_peer: warning: ${names[s]} replied ${x.tokens} tokens, not ${MT} (finish ${x.finish})\n`);
    results[s].push(x);
    line.push(`${names[s]} ${f(x.tps)} tok/s (server ${f(x.server_tps)})`);
  }
  // Greedy decoding of the same prompt: do the servers agree?
  const texts = urls.map((_, s) => results[s][r].text);
  const same = texts.every((t) => t === texts[0]);
  process.stderr.write(`round ${r + 1}: ${line.join('; ')}${urls.length > 1 ? (same ? '; same replies' : '; replies differ') : ''}\n`);
}

const rows = urls.map((u, s) => {
  const xs = results[s];
  const tps = xs.map((x) => x.tps);
  return [names[s], xs.length, f(median(xs.map((x) => x.tokens)), 0), f(median(tps)), f(Math.min(...tps)), f(Math.max(...tps)),
    f(median(xs.map((x) => x.server_tps))), f(median(xs.map((x) => x.ttft)), 0), f(median(xs.map((x) => x.prompt_n)), 0)];
});
const hdr = ['server', 'rounds', 'reply tok', 'client tok/s (median)', 'min', 'max', 'server tok/s (median)', 'TTFT ms', 'prompt_n'];
const md = [`| ${hdr.join(' | ')} |`, `|---|${hdr.slice(1).map(() => '--:').join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
let differ = 0;
for (let r = 0; r < ROUNDS && urls.length > 1; r++) if (!urls.every((_, s) => results[s][r].text === results[0][r].text)) differ++;
const note = `Single-stream decode, streamed, greedy, max_tokens ${MT} with ignore_eos, ${PW}-word prompts, ${ROUNDS} rounds` +
  (urls.length > 1 ? ` (servers alternate; replies that differ between servers: ${differ} of ${ROUNDS})` : '') +
  '. Client tok/s: content chunks after the first over the time from the first to the last; server tok/s: timings.predicted_per_second.';
process.stdout.write(`${md}\n\n${note}\n`);
if (opt.out) {
  const out = path.resolve(String(opt.out));
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, 'decode_peer.md'), `${md}\n\n${note}\n`);
  const csv = ['server,round,tokens,client_tps,server_tps,ttft_ms'];
  urls.forEach((_, s) => results[s].forEach((x, r) => csv.push(`"${names[s]}",${r + 1},${x.tokens},${f(x.tps, 2)},${f(x.server_tps, 2)},${f(x.ttft, 1)}`)));
  fs.writeFileSync(path.join(out, 'decode_peer.csv'), csv.join('\n') + '\n');
}
