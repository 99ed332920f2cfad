#!/usr/bin/env bash
# draft_cache.sh — what caching a draft model's KV buys: a conversation back on
# its slot after another took it, kvstash with its draft KV cached beside
# KS_DRAFT_CACHE=0 (bench/draft_cache.mjs: method), the bench pair
# (bench-target with bench-draft).
#
# usage: bench/draft_cache.sh [KVSTASH_BIN]
# Environment (defaults in brackets): THREADS [2]  ROUNDS [3]  SYS_WORDS [1200]  MAX_TOKENS [128]
# Writes bench/out/draft_cache.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export THREADS=${THREADS:-2}
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare draft_cache.sh "${1:-}" "$ROOT/build/models/bench-target.gguf"
bench_models draft_cache.sh "$ROOT/build/models/bench-draft.gguf"
node "$ROOT/bench/draft_cache.mjs" --kvstash "$BIN" --model "$ROOT/build/models/bench-target.gguf" \
    --draft "$ROOT/build/models/bench-draft.gguf" --threads "$THREADS" --rounds "${ROUNDS:-3}" \
    --sys-words "${SYS_WORDS:-1200}" --max-tokens "${MAX_TOKENS:-128}" --out "$OUT"
