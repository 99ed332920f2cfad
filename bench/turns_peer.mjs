#!/usr/bin/env node
// turns_peer.mjs — time to first token per turn of one multi-turn conversation
// sent side by side to OpenAI-compatible servers, e.g. `kvstash serve` and
// llama.cpp's `llama-server` (bench/turns_peer.sh starts them). No npm
// dependencies (fetch). Not a test: nothing fails on a number; it prints a
// markdown table (and writes it with CSV files when --out is given).
//
// usage: node bench/turns_peer.mjs URL [URL ...] [--key value ...]
//   URL              a server's base URL (http://127.0.0.1:8080). The first one
//                    is the reference: every other server's TTFT is compared
//                    with it (put kvstash first)
//   --name LABEL     the label of a server, once per URL in the same order
//                    (default: from GET /props build_info, else the URL)
//   --short NAME     the short name of a server for the table's columns, once
//                    per URL (default: the label's first word, numbered when repeated)
//   --turns N        user turns (default 10)
//   --sys-words N    words of the system prompt (default 300)
//   --msg-words N    words of every user message (default 60)
//   --max-tokens N   reply length limit (default 32)
//   --edit-replies K each reply goes back into the history without its last
//                    K words (default 0), as a client that trims or a template
//                    that strips part of a reply (reasoning) sends it: the next
//                    prompt then diverges inside the reply the server holds, so
//                    the server must cut its cache back into it (hybrid and
//                    recurrent models: to a checkpoint)
//   --floor-bin BIN --floor-model MODEL [--floor-threads N] [--floor-ctx N]
//                    also measure the first server's floor per turn: the
//                    prefill of the tokens it prefilled after the tokens it
//                    reused, on llama.cpp alone (`BIN bench floor`), after all
//                    turns (the servers idle); the table gets the floor and
//                    TTFT / floor (what the cache adds to the work it cannot skip)
//   --gap-ms N       wait N ms before each measured request (default 0): a
//                    server's CPU threads may keep polling for work a while
//                    after its request, taking the cores from the next server's
//                    request (the side-by-side artefact in docs/BENCHMARKS.md)
//   --out DIR        write DIR/turns_peer.md, DIR/turns_peer.csv (one row per
//                    turn and server) and DIR/turns_peer_ttft.csv (turn, then the
//                    TTFT of every server: the plot's input) too
//   --prefix NAME    those files' base name instead of turns_peer
//
// Method:
//  - The conversation: a system prompt of --sys-words words, then --turns user
//    messages of --msg-words words each (deterministic words from a seeded
//    generator: the same text on every run and for every server; every word is
//    one token of the bench model).
//  - Every server keeps its own conversation: its own replies are appended to
//    its own history, as a chat UI does, so each server's cache sees exactly the
//    history it produced. (Greedy replies may differ between servers; then
//    their prompts differ by those tokens: the table shows each one's.)
//  - Each request: POST /v1/chat/completions with the whole history, stream:
//    true, stream_options.include_usage, temperature 0 (greedy), max_tokens N,
//    cache_prompt: true. Requests go one at a time; turn t goes to every
//    server before turn t+1, and the server that goes first rotates each turn.
//  - One unmeasured warm-up request per server first (an unrelated 40-word
//    message, 2 tokens), so turn 1 does not pay a process's first-request costs.
//    Turn 1 is otherwise cold: nothing of the conversation is cached.
//  - TTFT = client-side time from sending the request to the first SSE chunk
//    that carries content (or the finish chunk of an empty reply); total = to
//    the end of the stream.
//  - Tokens, from the final chunks: prompt = usage.prompt_tokens; cached =
//    timings.cache_n (llama-server; kvstash sets it too), else
//    usage.prompt_tokens_details.cached_tokens; new = timings.prompt_n (the
//    tokens prefilled), else prompt - cached. Both cached fields go to the CSV;
//    a warning is printed when they disagree or cached + new != prompt.
//  - Ratio per turn = the first server's TTFT / this server's TTFT (below 1:
//    the first server was faster). Summary: its median over turns 2..T (the
//    turns that can use the cache) and turn 1 (cold) on its own.
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs, median, words, label, streamChat, floorProcess } from './peer_lib.mjs';

const { opt, lists, rest, die } = parseArgs('turns_peer', process.argv.slice(2), ['name', 'short']);
const urls = rest.map((u) => u.replace(/\/+$/, ''));
const names0 = lists.name; // --name, one per URL
const shorts0 = lists.short; // --short, one per URL
const num = (k, d, min = 1) => {
  if (opt[k] === undefined) return d;
  const v = Number(opt[k]);
  if (!Number.isInteger(v) || v < min) die(`--${k} wants an integer >= ${min}`);
  return v;
};
if (!urls.length)
  die('usage: node bench/turns_peer.mjs URL [URL ...] [--name LABEL ...] [--short NAME ...] [--turns N] [--sys-words N] ' +
    '[--msg-words N] [--max-tokens N] [--out DIR]');
const T = num('turns', 10), SW = num('sys-words', 300, 0), UW = num('msg-words', 60), MT = num('max-tokens', 32);
const EDIT = num('edit-replies', 0, 0);
const GAP = num('gap-ms', 0, 0);
// The reply as it goes back into the history: less its last EDIT words.
const edited = (text) => (EDIT ? text.split(' ').slice(0, -EDIT).join(' ') : text);

const f = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '–');
const fc = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : ''); // CSV: empty when missing
const fr = (x) => (Number.isFinite(x) ? `${x.toFixed(2)}×` : '–');

async function chat(url, messages, maxTokens) {
  const { ttft, total, text: content, finish, usage, timings } = await streamChat(url, {
    messages,
    max_tokens: maxTokens,
    temperature: 0,
    cache_prompt: true,
  });
  const prompt = usage ? usage.prompt_tokens : NaN;
  const usageCached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : NaN;
  const cacheN = timings && Number.isFinite(timings.cache_n) ? timings.cache_n : NaN;
  const promptN = timings && Number.isFinite(timings.prompt_n) ? timings.prompt_n : NaN;
  const cached = Number.isFinite(cacheN) ? cacheN : usageCached;
  return {
    ttft,
    total,
    content,
    finish,
    prompt,
    cached,
    nnew: Number.isFinite(promptN) ? promptN : prompt - cached,
    usage_cached: usageCached,
    cache_n: cacheN,
    prompt_n: promptN,
    prompt_ms: timings ? timings.prompt_ms : NaN,
    completion: usage ? usage.completion_tokens : timings ? timings.predicted_n : NaN,
    has_usage: !!usage,
    has_timings: !!timings,
  };
}

const names = names0.length ? names0 : await Promise.all(urls.map(label));
if (names.length !== urls.length) die('--name: give one per URL, or none');
if (shorts0.length && shorts0.length !== urls.length) die('--short: give one per URL, or none');
const shorts = shorts0.length ? shorts0 : names.map((n) => n.split(' ')[0]);
shorts.forEach((s, i) => {
  const same = shorts.filter((x, k) => x === s && k < i).length;
  if (same) shorts[i] = `${s}#${same + 1}`;
});
const N = urls.length;
process.stderr.write(`turns_peer: ${N} server(s) (${shorts.join(', ')}), ${T} turns, ${SW}-word system prompt, ` +
  `${UW}-word messages, max_tokens ${MT}${EDIT ? `, replies sent back less their last ${EDIT} word(s)` : ''}\n`);

for (let s = 0; s < N; s++) await chat(urls[s], [{ role: 'user', content: words(40, 77) }], 2); // warm-up

const system = words(SW, 500);
const convs = urls.map(() => (SW > 0 ? [{ role: 'system', content: system }] : []));
const res = urls.map(() => []); // res[s][t-1]
const warned = new Set();
const warn = (key, msg) => {
  if (warned.has(key)) return;
  warned.add(key);
  process.stderr.write(`turns_peer: warning: ${msg}\n`);
};
let differ = 0;
for (let t = 1; t <= T; t++) {
  const user = words(UW, 10000 + t);
  for (let k = 0; k < N; k++) {
    const s = (t - 1 + k) % N; // rotate who goes first
    convs[s].push({ role: 'user', content: user });
    if (GAP) await new Promise((res) => setTimeout(res, GAP));
    let x;
    try {
      x = await chat(urls[s], convs[s], MT);
    } catch (e) {
      die(`turn ${t}, ${names[s]}: ${e.message}\n(a context too small? the conversation is ${res[s].length ? res[s].at(-1).prompt + res[s].at(-1).completion : 0} tokens so far)`);
    }
    convs[s].push({ role: 'assistant', content: edited(x.content) });
    res[s].push(x);
    if (!x.has_usage) warn(`usage${s}`, `${names[s]} sent no usage (stream_options.include_usage ignored?)`);
    if (!x.has_timings) warn(`timings${s}`, `${names[s]} sent no timings: cached tokens from usage, new = prompt - cached`);
    if (Number.isFinite(x.cache_n) && Number.isFinite(x.usage_cached) && x.cache_n !== x.usage_cached)
      warn(`cached${s}`, `${names[s]} turn ${t}: timings.cache_n ${x.cache_n} != usage cached_tokens ${x.usage_cached}`);
    if (Number.isFinite(x.prompt_n) && x.cached + x.nnew !== x.prompt)
      warn(`sum${s}`, `${names[s]} turn ${t}: cached ${x.cached} + prompt_n ${x.nnew} != prompt_tokens ${x.prompt}`);
  }
  const texts = urls.map((_, s) => res[s][t - 1].content);
  const same = texts.every((c) => c === texts[0]);
  if (!same) differ++;
  process.stderr.write(`turn ${t}: ${urls.map((_, s) => {
    const x = res[s][t - 1];
    return `${shorts[s]} ${f(x.ttft)} ms (prompt ${x.prompt}, cached ${x.cached}, new ${x.nnew})`;
  }).join('; ')}${N > 1 ? (same ? '; same replies' : '; replies differ') : ''}\n`);
}

// ------------------------------------------------------------ the floor
// The first server's turns: the prefill of its `new` tokens after its
// `cached` ones (`kvstash bench floor --stdin`), measured now that every
// server is idle. Turn 1 prefills everything: its floor is the same call.
const floors = [];
if (opt['floor-bin']) {
  if (!opt['floor-model']) die('--floor-bin needs --floor-model');
  const fp = floorProcess({ bin: String(opt['floor-bin']), model: String(opt['floor-model']),
    threads: num('floor-threads', 2), ctx: num('floor-ctx', 8192) });
  for (const x of res[0]) floors.push((await fp.measure(Math.max(0, x.cached), x.nnew)).prefill);
  fp.stop();
}
const hasFloor = floors.length === T;

// ---------------------------------------------------------------- report
const hdr = ['turn', 'prompt tok'];
if (hasFloor) hdr.push(`${shorts[0]} floor ms`, `${shorts[0]} TTFT/floor`);
for (let s = 0; s < N; s++) {
  hdr.push(`${shorts[s]} TTFT ms`, `${shorts[s]} cached/new`);
  if (s > 0) hdr.push(`${shorts[0]}/${shorts[s]}`);
}
const rows = [];
for (let t = 1; t <= T; t++) {
  const p0 = res[0][t - 1].prompt;
  const ps = urls.map((_, s) => res[s][t - 1].prompt);
  const row = [t, ps.every((p) => p === p0) ? f(p0) : ps.map((p) => f(p)).join(' / ')];
  if (hasFloor) row.push(f(floors[t - 1]), fr(res[0][t - 1].ttft / floors[t - 1]));
  for (let s = 0; s < N; s++) {
    const x = res[s][t - 1];
    row.push(f(x.ttft), `${f(x.cached)}/${f(x.nnew)}`);
    if (s > 0) row.push(fr(res[0][t - 1].ttft / x.ttft));
  }
  rows.push(row);
}
const md = [`| ${hdr.join(' | ')} |`, `|${hdr.map(() => '--:').join('|')}|`, ...rows.map((r) => `| ${r.join(' | ')} |`)];
const lines = [md.join('\n'), ''];
const last = res[0][T - 1];
lines.push(`One conversation of ${T} turns: a ${SW}-word system prompt, ${UW}-word user messages, replies of at most ` +
  `${MT} tokens (greedy, streamed, cache_prompt)${EDIT ? `, each sent back in the history less its last ${EDIT} word(s)` : ''}${GAP ? `, ${GAP} ms between requests` : ''}, grown to ${f(last.prompt + last.completion)} tokens ` +
  `(${shorts[0]}'s). Every server keeps its own history (its own replies); turn t goes to every server before turn ` +
  `t+1, rotating who goes first. TTFT: client-side, to the first content chunk. cached/new: the prompt tokens the ` +
  `server reused / prefilled (timings.cache_n / timings.prompt_n, else usage.prompt_tokens_details.cached_tokens). ` +
  `${N > 1 ? `${shorts[0]}/X: ${shorts[0]}'s TTFT over X's (below 1×: ${shorts[0]} faster). Turns whose replies differ between servers: ${differ} of ${T}.` : ''}`);
lines.push('');
lines.push('Servers:');
for (let s = 0; s < N; s++) lines.push(`- ${shorts[s]}: ${names[s]} (${urls[s]})`);
const summary = [];
for (let s = 1; s < N; s++) {
  const later = [];
  for (let t = 2; t <= T; t++) later.push(res[0][t - 1].ttft / res[s][t - 1].ttft);
  const within = later.filter((r) => r <= 1.05).length;
  summary.push(`**${shorts[0]} TTFT / ${shorts[s]} TTFT**: median over turns 2–${T} ${fr(median(later))}` +
    (later.length ? ` (best ${fr(Math.min(...later))}, worst ${fr(Math.max(...later))}, within 1.05× in ${within} of ${later.length})` : '') +
    `; turn 1 (cold) ${fr(res[0][0].ttft / res[s][0].ttft)}. Median TTFT over turns 2–${T}: ${shorts[0]} ` +
    `${f(median(res[0].slice(1).map((x) => x.ttft)))} ms, ${shorts[s]} ${f(median(res[s].slice(1).map((x) => x.ttft)))} ms.`);
}
if (hasFloor) {
  const over = res[0].slice(1).map((x, i) => x.ttft / floors[i + 1]);
  summary.push(`**${shorts[0]} TTFT / floor** (the prefill of the tokens it prefilled, after those it reused, on ` +
    `llama.cpp alone): median over turns 2–${T} ${fr(median(over))} (best ${fr(Math.min(...over))}, worst ` +
    `${fr(Math.max(...over))}); turn 1 ${fr(res[0][0].ttft / floors[0])}.`);
}
if (N === 1) summary.push(`Median TTFT over turns 2–${T}: ${f(median(res[0].slice(1).map((x) => x.ttft)))} ms; turn 1 ${f(res[0][0].ttft)} ms.`);
lines.push('', ...summary);
if (process.env.KS_BENCH_CMD) lines.push('', `Command: \`${process.env.KS_BENCH_CMD}\``);
const text = lines.join('\n') + '\n';
process.stdout.write(text);

if (opt.out) {
  const out = path.resolve(String(opt.out));
  fs.mkdirSync(out, { recursive: true });
  const base = String(opt.prefix ?? 'turns_peer');
  fs.writeFileSync(path.join(out, `${base}.md`), text);
  const q = (s) => `"${String(s).replace(/"/g, '""')}"`;
  const csv = ['server,name,turn,prompt_tokens,cached_tokens,new_tokens,usage_cached_tokens,timings_cache_n,timings_prompt_n,' +
    'prompt_ms,ttft_ms,total_ms,completion_tokens,finish,floor_ms'];
  for (let s = 0; s < N; s++)
    res[s].forEach((x, i) => csv.push([q(shorts[s]), q(names[s]), i + 1, fc(x.prompt), fc(x.cached), fc(x.nnew), fc(x.usage_cached),
      fc(x.cache_n), fc(x.prompt_n), fc(x.prompt_ms, 2), fc(x.ttft, 2), fc(x.total, 2), fc(x.completion), x.finish || '',
      s === 0 && hasFloor ? fc(floors[i], 2) : ''].join(',')));
  fs.writeFileSync(path.join(out, `${base}.csv`), csv.join('\n') + '\n');
  const wide = [['turn', ...shorts.map((s) => s.replace(/,/g, ' '))].join(',')];
  for (let t = 1; t <= T; t++) wide.push([t, ...urls.map((_, s) => fc(res[s][t - 1].ttft, 2))].join(','));
  fs.writeFileSync(path.join(out, `${base}_ttft.csv`), wide.join('\n') + '\n');
}
