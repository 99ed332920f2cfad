#!/usr/bin/env bash
# server_workingset.sh — a working set larger than the store's RAM tier (issue 5): many conversations round-robin; finish saves to a small ram tier over a disk tier, and everything to disk, vs --no-cache-prompt.
# Over real HTTP against `kvstash serve` (bench/http_bench.mjs workingset); docs/BENCHMARKS.md.
#
# usage: bench/server_workingset.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): THREADS [2] (--threads of every server)
#   CONVS [16] TURNS [3] SYS_WORDS [300] MSG_WORDS [60] MAX_TOKENS [8] SLOTS [4] RAM_MIB [32]
# Writes bench/out/server_workingset.{md,csv}, the servers' logs bench/out/server_workingset-*.log and
# docs/img/server_workingset.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_workingset.sh "$@"

CONVS=${CONVS:-16}; TURNS=${TURNS:-3}; SYS_WORDS=${SYS_WORDS:-300}; MSG_WORDS=${MSG_WORDS:-60}
MAX_TOKENS=${MAX_TOKENS:-8}; SLOTS=${SLOTS:-4}; RAM_MIB=${RAM_MIB:-32}
SETTINGS="CONVS=$CONVS TURNS=$TURNS SYS_WORDS=$SYS_WORDS MSG_WORDS=$MSG_WORDS MAX_TOKENS=$MAX_TOKENS SLOTS=$SLOTS RAM_MIB=$RAM_MIB"
ARGS=(--convs "$CONVS" --turns "$TURNS" --sys-words "$SYS_WORDS" --msg-words "$MSG_WORDS" --max-tokens "$MAX_TOKENS" --slots "$SLOTS" --ram-mib "$RAM_MIB")
CMD=(node "$ROOT/bench/http_bench.mjs" workingset --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" "${ARGS[@]}")
echo "\$ ${CMD[*]}" >&2
# The tables name the command that made them: this script with its settings.
export KS_BENCH_CMD="THREADS=$THREADS $SETTINGS bench/server_workingset.sh"
"${CMD[@]}"

NCOL=$(($(head -1 "$OUT/server_workingset.csv" | awk -F, "{print NF}") - 1)) # the last column is the floor at depth
gnuplot -e "csv='$OUT/server_workingset.csv'; out='$IMG/server_workingset.png'; ncol=$NCOL; ttl='kvstash serve: working set larger than the ram tier, median time to first token per turn'; subtitle='$CONVS conversations round-robin, ram tier $RAM_MIB MiB + disk tier, $SLOTS slots, $THREADS threads'" \
    "$ROOT/bench/plot_server_turns.gp"
echo >&2 "server_workingset.sh: tables in $OUT/server_workingset.md, plot in $IMG/server_workingset.png"
