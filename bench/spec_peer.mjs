#!/usr/bin/env node
// spec_peer.mjs — speculative decoding beside no speculation, on each server
// family: how fast replies decode, and whether a reply with speculation is the
// reply without it. No npm dependencies. Not a test: it prints a markdown table.
//
// usage: node bench/spec_peer.mjs URL [URL ...] --name LABEL ... --family F ... --spec 0|1 ...
//   one --name, --family (kvstash, llama-server) and --spec (0: without,
//   1: with speculation) per URL, in the same order
//   --prompts N      prompts (default 4)
//   --max-tokens N   reply length (default 256; ignore_eos makes every reply that long)
//   --temperature T  0 (default): greedy; > 0: sampled with a fixed seed per prompt
//   --sys-words N    words of the system prompt (default 120; 0: none)   --msg-words N (default 40)
//   --gap-ms N       wait before each request (default 500)
//   --out DIR        write DIR/spec_peer-<tag>.{md,csv}   --tag T (default greedy|sampled)
// Method: for every prompt, every server in turn (rotating who goes first)
// gets the same streamed request (the same seed); decode tok/s = (completion
// tokens - 1) / (last content chunk - first content chunk), the servers'
// draft_n/draft_n_accepted when they report them; a server with --spec 1 is
// "identical" on a prompt when its text equals its family's --spec 0 text.
// Reported per server: median tok/s (min-max), the ratio to its family's
// no-speculation median, drafted and accepted tokens per reply, identical replies.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs, median, words, streamChat } from './peer_lib.mjs';

const { opt, lists, rest, die } = parseArgs('spec_peer', process.argv.slice(2), ['name', 'family', 'spec']);
const urls = rest.map((u) => u.replace(/\/+$/, ''));
const num = (k, d, min = 0) => {
  if (opt[k] === undefined) return d;
  const v = Number(opt[k]);
  if (!Number.isFinite(v) || v < min) die(`--${k} wants a number >= ${min}`);
  return v;
};
const N = num('prompts', 4, 1), MT = num('max-tokens', 256, 2), TEMP = num('temperature', 0);
const SW = num('sys-words', 120), UW = num('msg-words', 40), GAP = num('gap-ms', 500);
const TAG = opt.tag || (TEMP > 0 ? 'sampled' : 'greedy');
if (!urls.length || lists.name.length !== urls.length || lists.family.length !== urls.length ||
    lists.spec.length !== urls.length)
  die('usage: node bench/spec_peer.mjs URL ... --name L ... --family F ... --spec 0|1 ... [options]');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const S = urls.map((u, i) => ({ url: u, name: lists.name[i], family: lists.family[i], spec: lists.spec[i] === '1',
  tps: [], drafted: [], accepted: [], texts: [], same: 0, compared: 0 }));

for (let p = 0; p < N; p++) {
  const messages = [...(SW ? [{ role: 'system', content: words(SW, 1000 + p) }] : []),
    { role: 'user', content: words(UW, 2000 + p) }];
  const body = { messages, max_tokens: MT, temperature: TEMP, ignore_eos: true, seed: 42 + p };
  for (let k = 0; k < S.length; k++) {
    const s = S[(p + k) % S.length];
    if (GAP) await sleep(GAP);
    const r = await streamChat(s.url, body);
    const n = r.usage ? r.usage.completion_tokens : r.times.length;
    const span = r.times.length > 1 ? r.times[r.times.length - 1] - r.times[0] : NaN;
    s.tps.push((n - 1) / (span / 1e3));
    s.drafted.push(r.timings && r.timings.draft_n !== undefined ? r.timings.draft_n : 0);
    s.accepted.push(r.timings && r.timings.draft_n_accepted !== undefined ? r.timings.draft_n_accepted : 0);
    s.texts[p] = r.text;
  }
}
const rows = [];
for (const s of S) {
  const base = S.find((x) => x.family === s.family && !x.spec);
  if (s.spec && base) for (let p = 0; p < N; p++) { s.compared++; s.same += s.texts[p] === base.texts[p]; }
  const m = median(s.tps);
  rows.push({ name: s.name, tps: m, min: Math.min(...s.tps), max: Math.max(...s.tps),
    ratio: base ? m / median(base.tps) : NaN, drafted: median(s.drafted), accepted: median(s.accepted),
    same: s.spec && base ? `${s.same}/${s.compared}` : '' });
}
const f = (x, d = 1) => (Number.isFinite(x) ? x.toFixed(d) : '');
let md = `spec_peer (${TAG}): ${N} prompts, ${MT}-token replies, temperature ${TEMP}\n\n` +
  '| server | decode tok/s (median) | min-max | vs its family without speculation | drafted / reply | accepted / reply | same reply as without |\n' +
  '|---|---:|---:|---:|---:|---:|---:|\n';
for (const r of rows)
  md += `| ${r.name} | ${f(r.tps)} | ${f(r.min)}-${f(r.max)} | ${f(r.ratio, 2)}x | ${r.drafted} | ${r.accepted} | ${r.same} |\n`;
console.log(md);
if (opt.out) {
  writeFileSync(path.join(opt.out, `spec_peer-${TAG}.md`), md);
  writeFileSync(path.join(opt.out, `spec_peer-${TAG}.csv`), 'server,tps_median,tps_min,tps_max,ratio,drafted,accepted,same\n' +
    rows.map((r) => [JSON.stringify(r.name), f(r.tps, 2), f(r.min, 2), f(r.max, 2), f(r.ratio, 3), r.drafted, r.accepted,
      r.same].join(',')).join('\n') + '\n');
}
