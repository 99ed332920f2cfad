#!/usr/bin/env bash
# server_restart.sh — after a restart (issue 5): a ~2,000-token conversation continued by a new process from the persistent store (default tiers, and disk only).
# Over real HTTP against `kvstash serve` (bench/http_bench.mjs restart); docs/BENCHMARKS.md.
#
# usage: bench/server_restart.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): THREADS [2] (--threads of every server)
#   TOKENS [2000] SYS_WORDS [300] BUILD_WORDS [150] MSG_WORDS [60] MAX_TOKENS [16] REPEAT [3]
#   WARMUP [1]: 0 measures the new process's first request (no warm-up request before it)
# Writes bench/out/server_restart.{md,csv}, the servers' logs bench/out/server_restart-*.log and
# docs/img/server_restart.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_restart.sh "$@"

TOKENS=${TOKENS:-2000}; SYS_WORDS=${SYS_WORDS:-300}; BUILD_WORDS=${BUILD_WORDS:-150}; MSG_WORDS=${MSG_WORDS:-60}
MAX_TOKENS=${MAX_TOKENS:-16}; REPEAT=${REPEAT:-3}; WARMUP=${WARMUP:-1}
SETTINGS="TOKENS=$TOKENS SYS_WORDS=$SYS_WORDS BUILD_WORDS=$BUILD_WORDS MSG_WORDS=$MSG_WORDS MAX_TOKENS=$MAX_TOKENS REPEAT=$REPEAT WARMUP=$WARMUP"
ARGS=(--tokens "$TOKENS" --sys-words "$SYS_WORDS" --build-words "$BUILD_WORDS" --msg-words "$MSG_WORDS" --max-tokens "$MAX_TOKENS" --repeat "$REPEAT" --warmup "$WARMUP")
CMD=(node "$ROOT/bench/http_bench.mjs" restart --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" "${ARGS[@]}")
echo "\$ ${CMD[*]}" >&2
# The tables name the command that made them: this script with its settings.
export KS_BENCH_CMD="THREADS=$THREADS $SETTINGS bench/server_restart.sh"
"${CMD[@]}"

gnuplot -e "csv='$OUT/server_restart_summary.csv'; out='$IMG/server_restart.png'; subtitle='$(basename "$MODEL"), $THREADS threads, median of $REPEAT restarts'" \
    "$ROOT/bench/plot_server_restart.gp"
echo >&2 "server_restart.sh: tables in $OUT/server_restart.md, plot in $IMG/server_restart.png"
