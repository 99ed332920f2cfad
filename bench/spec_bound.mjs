#!/usr/bin/env node
// spec_bound.mjs — how much faster any n-gram drafter could make these replies
// on this machine, before any drafter runs: the replies' own repetition against
// what a verification row costs here. Not a test: it prints a markdown table.
//
// usage: node bench/spec_bound.mjs --bin BIN --model MODEL --costs "1:1,2:1.55,..."
//   [--prompts 8] [--max-tokens 256] [--threads 2] [--out DIR]
// --costs: a decode of r rows in one-row units (bench_verify_rows' table; a
// count between two measured ones costs as the larger).
//
// Method: kvstash without speculation (greedy, ignore_eos) writes each reply
// of spec_peer.mjs's prompts (the same seeded words); the rendered prompt
// (/apply-template) and the reply are tokenized (/tokenize; the reply's text
// round-trips to its 256 tokens on the bench model). Then, per reply, in units
// of a one-row decode:
// - oracle: at each position the longest continuation that any earlier
//   occurrence of the last n tokens (n >= --min-n, default 2) predicts, and a
//   drafter that knows in advance how much of it will be kept (it never pays for
//   a rejected row); the best schedule of step sizes by dynamic programming.
//   No n-gram drafter can beat it: its speed-up bounds theirs.
// - prompt lookup: a real drafter — the most recent (or the first) earlier
//   occurrence of the longest suffix of n_max..n_min tokens, its next k tokens
//   drafted and verified whole, kept up to the first miss — the best of a grid of
//   (n_min, n_max, k, recent/first) chosen after the fact on these very replies
//   (so it is itself an optimistic figure); plus llama.cpp's ngram-simple
//   defaults as kvstash ships them (n 12, m 48: most recent occurrence of 12).
// Costs only: the drafter's and the sampler's own time is left out.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs, median, words, streamChat, freePort, startServer, stopServer } from './peer_lib.mjs';

const { str, die } = parseArgs('spec_bound', process.argv.slice(2));
const BIN = str('bin') || die('--bin BIN');
const MODEL = str('model') || die('--model MODEL');
const COSTS = (str('costs') || die('--costs "1:1,2:1.55,..."')).split(',').map((kv) => kv.split(':').map(Number))
  .sort((a, b) => a[0] - b[0]);
const N = Number(str('prompts', '8')), MT = Number(str('max-tokens', '256')), MIN_N = Number(str('min-n', '2'));
if (!COSTS.length || COSTS[0][0] !== 1 || COSTS.some(([r, c]) => !(r >= 1 && c > 0))) die('--costs: "1:1,2:C2,..."');
const cost = (r) => { const e = COSTS.find(([k]) => k >= r); return e ? e[1] : COSTS[COSTS.length - 1][1] * r / COSTS[COSTS.length - 1][0]; };
const KMAX = COSTS[COSTS.length - 1][0] - 1;

const port = await freePort();
const s = await startServer('kvstash', BIN, ['serve', '-m', MODEL, '--port', String(port), '--threads', str('threads', '2'),
  '--slots', '1', '--spec-type', 'none'], port);
const post = async (p, b) => (await fetch(s.url + p, { method: 'POST', headers: { 'content-type': 'application/json' },
  body: JSON.stringify(b) })).json();
const replies = [];
try {
  for (let p = 0; p < N; p++) {
    // spec_peer.mjs's prompts: the same seeds
    const messages = [{ role: 'system', content: words(120, 1000 + p) }, { role: 'user', content: words(40, 2000 + p) }];
    const prompt = (await post('/apply-template', { messages })).prompt;
    const r = await streamChat(s.url, { messages, max_tokens: MT, temperature: 0, ignore_eos: true, seed: 42 + p });
    replies.push({ prompt: (await post('/tokenize', { content: prompt })).tokens,
      reply: (await post('/tokenize', { content: r.text })).tokens });
  }
} finally {
  await stopServer(s);
}

// a[t]: reply tokens from t on that the best earlier occurrence of a suffix of >= MIN_N tokens predicts
function predictable(all, P, T) {
  const a = new Array(T).fill(0);
  for (let t = 0; t < T; t++) {
    const pos = P + t;
    for (let j = MIN_N; j < pos; j++) {
      let n = 0;
      while (n < MIN_N && all[j - 1 - n] === all[pos - 1 - n]) n++;
      if (n < MIN_N) continue;
      let m = 0;
      while (pos + m < P + T && all[j + m] === all[pos + m]) m++;
      if (m > a[t]) a[t] = m;
    }
  }
  return a;
}
function oracle(a, T) {
  const f = new Array(T + 1).fill(Infinity);
  f[T] = 0;
  for (let t = T - 1; t >= 0; t--)
    for (let d = 0; d <= Math.min(a[t], KMAX, T - t - 1); d++) f[t] = Math.min(f[t], cost(d + 1) + f[t + d + 1]);
  return T / f[0];
}
function lookup(all, pos, nMin, nMax, k, recent) {
  for (let n = nMax; n >= nMin; n--) {
    let found = -1;
    for (let j = pos - 1; j >= n; j--) {
      let q = 1;
      while (q <= n && all[j - q] === all[pos - q]) q++;
      if (q > n) { found = j; if (recent) break; }
    }
    if (found >= 0) return all.slice(found, Math.min(found + k, pos));
  }
  return [];
}
function promptLookup(x, nMin, nMax, k, recent) {
  const all = x.prompt.concat(x.reply), P = x.prompt.length, T = x.reply.length;
  let t = 0, c = 0;
  while (t < T) {
    const d = lookup(all, P + t, nMin, nMax, Math.min(k, T - t - 1), recent);
    let kept = 0;
    while (kept < d.length && d[kept] === all[P + t + kept]) kept++;
    c += cost(d.length + 1);
    t += kept + 1;
  }
  return T / c;
}

const per = replies.map((x) => {
  const all = x.prompt.concat(x.reply), P = x.prompt.length, T = x.reply.length;
  const a = predictable(all, P, T);
  return { tokens: T, predictable: a.filter((v) => v > 0).length, oracle: oracle(a, T) };
});
let best = null;
for (const nMin of [1, 2, 3, 4]) for (const nMax of [nMin, 4, 8, 12]) if (nMax >= nMin)
  for (const k of [1, 2, 3, 5, 7, 11, 15, 23, 31].filter((v) => v <= KMAX)) for (const recent of [true, false]) {
    const m = median(replies.map((x) => promptLookup(x, nMin, nMax, k, recent)));
    if (!best || m > best.m) best = { m, nMin, nMax, k, recent };
  }
const shipped = median(replies.map((x) => promptLookup(x, 12, 12, Math.min(48, KMAX), true)));
const f2 = (v) => v.toFixed(2);
let md = `spec_bound: ${N} greedy ${MT}-token replies (spec_peer.mjs's prompts), row costs ${COSTS.map(([r, c]) => `${r}:${c}`).join(' ')}\n\n` +
  '| reply | tokens a suffix of >= ' + MIN_N + ' earlier tokens predicts (of ' + MT + ') | oracle speed-up |\n|--:|--:|--:|\n' +
  per.map((p, i) => `| ${i + 1} | ${p.predictable} | ${f2(p.oracle)}× |`).join('\n') +
  `\n\n| drafter | decode speed-up, median of the replies |\n|---|--:|\n` +
  `| oracle (knows what will be kept; the bound) | **${f2(median(per.map((p) => p.oracle)))}×** |\n` +
  `| prompt lookup, the best of the grid (n ${best.nMin}..${best.nMax}, k ${best.k}, ${best.recent ? 'most recent' : 'first'} occurrence) | ${f2(best.m)}× |\n` +
  `| ngram-simple as shipped (n 12, m 48), every draft verified whole | ${f2(shipped)}× |\n`;
console.log(md);
if (str('out')) writeFileSync(path.join(str('out'), 'spec_bound.md'), md);
