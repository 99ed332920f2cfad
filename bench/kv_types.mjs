#!/usr/bin/env node
// kv_types.mjs — what a quantized KV cache saves (issue 38), kvstash alone,
// per pair of -ctk/-ctv types: the server's resident memory with 2 slots of a
// 32K context (after start, and after a ~10K-token conversation filled one
// slot), the bytes of that conversation's stored state (the disk tier's file
// of its finish save), and the time to first token of its next turn after a
// restart (the state read back from the disk tier, its file dropped from the
// page cache first: read from the disk) and the restore's own time (the
// store's lookup, read, checksum and state set: kvstash_store_restore_seconds_total),
// against the same turn prefilled with no cache. Not a test: nothing fails on a number.
//
// usage: node bench/kv_types.mjs --bin BIN --model MODEL [--types f16/f16,q8_0/q8_0,q4_0/q4_0]
//   [--threads 2] [--words 7000] [--out DIR]
import { mkdtempSync, readdirSync, statSync, readFileSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import os from 'node:os';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { parseArgs, words, streamChat, freePort, startServer, stopServer, metric } from './peer_lib.mjs';

const { str, die } = parseArgs('kv_types', process.argv.slice(2));
const BIN = str('bin') || die('--bin BIN');
const MODEL = str('model') || die('--model MODEL');
const TYPES = str('types', 'f16/f16,q8_0/q8_0,q4_0/q4_0').split(',').map((t) => t.split('/'));
const THREADS = str('threads', '2'), WORDS = Number(str('words', '7000')), OUT = str('out', '');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const rssMiB = (pid) => Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) / 1024;

async function start(types, cfg) {
  const port = await freePort();
  return startServer('kvstash', BIN, ['serve', '-m', MODEL, '--port', String(port), '--threads', THREADS, '--slots', '2',
    '--ctx', '32768', '-ctk', types[0], '-ctv', types[1], '--config', cfg], port);
}

const rows = [];
for (const t of TYPES) {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-kvtypes-bench-'));
  const cfg = path.join(dir, 'c.yaml');
  writeFileSync(cfg, `store:\n  enabled: true\n  cache_dir: ${dir}/disk\n  shm_dir: ${dir}/shm\n` +
    '  tiers: { shm: { max_bytes: 0 } }\n  reasons: { finish: disk, cold: disk }\n');
  const conv = [{ role: 'system', content: `You are a helpful assistant. ${words(WORDS, 77)}` },
    { role: 'user', content: words(60, 78) }];
  let s = await start(t, cfg);
  const rssStart = rssMiB(s.proc.pid);
  const first = await streamChat(s.url, { messages: conv, max_tokens: 16, temperature: 0 });
  const rssFull = rssMiB(s.proc.pid);
  await sleep(2000); // the writer thread writes the finish save
  await stopServer(s);
  const files = readdirSync(path.join(dir, 'disk'), { recursive: true }).filter((f) => String(f).endsWith('.kvs'))
    .map((f) => statSync(path.join(dir, 'disk', String(f))).size).sort((a, b) => b - a);
  conv.push({ role: 'assistant', content: first.text }, { role: 'user', content: words(60, 79) });
  // A cold restore: the stored files out of the page cache (posix_fadvise
  // DONTNEED through dd), so the state is read from the disk.
  for (const f of readdirSync(path.join(dir, 'disk'), { recursive: true }).filter((x) => String(x).endsWith('.kvs')))
    execFileSync('dd', [`if=${path.join(dir, 'disk', String(f))}`, 'iflag=nocache', 'count=0', 'status=none']);
  s = await start(t, cfg);
  const restoreS = () => metric(s.url, 'kvstash_store_restore_seconds_total');
  const r0 = await restoreS();
  const restored = await streamChat(s.url, { messages: conv, max_tokens: 4, temperature: 0 });
  const restoreMs = (await restoreS() - r0) * 1000;
  const cold = await streamChat(s.url, { messages: conv, max_tokens: 4, temperature: 0, cache_prompt: false });
  await stopServer(s);
  rmSync(dir, { recursive: true, force: true });
  rows.push({ types: t.join('/'), prompt: first.usage?.prompt_tokens, rssStart, rssFull, state: files[0] ?? NaN,
    restoredTtft: restored.ttft, restoredCached: restored.usage?.prompt_tokens_details?.cached_tokens, restoreMs,
    coldTtft: cold.ttft });
  process.stderr.write(`kv_types: ${t.join('/')} done\n`);
}

const f0 = rows[0];
const lines = ['| K/V | RSS at start (2 × 32K) | RSS after a ~10K-token prompt | its stored state | state / f16 | ' +
  'after a restart, page cache dropped: the restore (read, verify, set) | / f16\'s | TTFT (cached) | / f16\'s | prefilled again: TTFT |',
'|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|'];
for (const r of rows)
  lines.push(`| ${r.types} | ${r.rssStart.toFixed(0)} MiB | ${r.rssFull.toFixed(0)} MiB | ${(r.state / 2 ** 20).toFixed(1)} MiB ` +
    `(${r.prompt} tokens) | ${(r.state / f0.state).toFixed(2)}× | ${r.restoreMs.toFixed(0)} ms | ` +
    `${(r.restoreMs / f0.restoreMs).toFixed(2)}× | ${r.restoredTtft.toFixed(0)} ms (${r.restoredCached}) | ` +
    `${(r.restoredTtft / f0.restoredTtft).toFixed(2)}× | ${r.coldTtft.toFixed(0)} ms |`);
const md = lines.join('\n');
process.stdout.write(md + '\n');
if (OUT) {
  mkdirSync(OUT, { recursive: true });
  writeFileSync(path.join(OUT, 'kv_types.md'), md + '\n');
}
