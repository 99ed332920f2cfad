#!/usr/bin/env bash
# server_context.sh — where the time of a cached request goes: TTFT of ~65 new tokens after N cached
# tokens (attention over the cached context), with and without --flash-attn, vs a fresh prefill of them.
# Over real HTTP against `kvstash serve` (bench/http_bench.mjs context); docs/BENCHMARKS.md.
#
# usage: bench/server_context.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): THREADS [2] (--threads of every server)
#   CACHED [0,256,512,1024,2048] (cached context sizes, tokens)  MSG_WORDS [60]  REPEAT [3]
# Writes bench/out/server_context.{md,csv}, the servers' logs bench/out/server_context-*.log and
# docs/img/server_context.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_context.sh "$@"

CACHED=${CACHED:-0,256,512,1024,2048}; MSG_WORDS=${MSG_WORDS:-60}; REPEAT=${REPEAT:-3}
SETTINGS="CACHED=$CACHED MSG_WORDS=$MSG_WORDS REPEAT=$REPEAT"
ARGS=(--cached "$CACHED" --msg-words "$MSG_WORDS" --repeat "$REPEAT")
CMD=(node "$ROOT/bench/http_bench.mjs" context --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" "${ARGS[@]}")
echo "\$ ${CMD[*]}" >&2
# The tables name the command that made them: this script with its settings.
export KS_BENCH_CMD="THREADS=$THREADS $SETTINGS bench/server_context.sh"
"${CMD[@]}"

gnuplot -e "csv='$OUT/server_context.csv'; out='$IMG/server_context.png'; subtitle='$(basename "$MODEL"), $MSG_WORDS-word message after N cached tokens, $THREADS threads, median of $REPEAT'" \
    "$ROOT/bench/plot_server_context.gp"
echo >&2 "server_context.sh: tables in $OUT/server_context.md, plot in $IMG/server_context.png"
