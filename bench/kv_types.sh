#!/usr/bin/env bash
# kv_types.sh — what a quantized KV cache saves, kvstash alone (bench/kv_types.mjs:
# method): resident memory at 2 slots × 32K, the size of a ~10K-token stored
# state, and its restore after a restart, for f16, q8_0 and q4_0 K/V.
#
# usage: bench/kv_types.sh [KVSTASH_BIN [MODEL.gguf]]
# Environment (defaults in brackets): THREADS [2]  TYPES [f16/f16,q8_0/q8_0,q4_0/q4_0]  WORDS [7000]
# Writes bench/out/kv_types.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export THREADS=${THREADS:-2}
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare kv_types.sh "$@"
node "$ROOT/bench/kv_types.mjs" --bin "$BIN" --model "$MODEL" --threads "$THREADS" \
    --types "${TYPES:-f16/f16,q8_0/q8_0,q4_0/q4_0}" --words "${WORDS:-7000}" --out "$OUT"
