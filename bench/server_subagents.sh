#!/usr/bin/env bash
# server_subagents.sh — sub-agents (issue 4): agents with their own system prompts interleaved on fewer slots; --imc, --spc --imc, --spc --imc + store vs --no-cache-prompt.
# Over real HTTP against `kvstash serve` (bench/http_bench.mjs subagents); docs/BENCHMARKS.md.
#
# usage: bench/server_subagents.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): THREADS [2] (--threads of every server)
#   AGENTS [6] TURNS [5] MSG_WORDS [40] SYS_WORDS [300] MAX_TOKENS [16] SLOTS [3]
#   STORE [1]  0 leaves out the server with a persistent store
# Writes bench/out/server_subagents.{md,csv}, the servers' logs bench/out/server_subagents-*.log and
# docs/img/server_subagents.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_subagents.sh "$@"

AGENTS=${AGENTS:-6}; TURNS=${TURNS:-5}; MSG_WORDS=${MSG_WORDS:-40}; SYS_WORDS=${SYS_WORDS:-300}
MAX_TOKENS=${MAX_TOKENS:-16}; SLOTS=${SLOTS:-3}; STORE=${STORE:-1}
SETTINGS="AGENTS=$AGENTS TURNS=$TURNS MSG_WORDS=$MSG_WORDS SYS_WORDS=$SYS_WORDS MAX_TOKENS=$MAX_TOKENS SLOTS=$SLOTS STORE=$STORE"
ARGS=(--agents "$AGENTS" --turns "$TURNS" --msg-words "$MSG_WORDS" --sys-words "$SYS_WORDS" --max-tokens "$MAX_TOKENS" --slots "$SLOTS" --store "$STORE")
CMD=(node "$ROOT/bench/http_bench.mjs" subagents --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" "${ARGS[@]}")
echo "\$ ${CMD[*]}" >&2
# The tables name the command that made them: this script with its settings.
export KS_BENCH_CMD="THREADS=$THREADS $SETTINGS bench/server_subagents.sh"
"${CMD[@]}"

NCOL=$(($(head -1 "$OUT/server_subagents.csv" | awk -F, "{print NF}") - 1)) # the last column is the floor at depth
gnuplot -e "csv='$OUT/server_subagents.csv'; out='$IMG/server_subagents.png'; ncol=$NCOL; ttl='kvstash serve: sub-agents, median time to first token per turn'; subtitle='$AGENTS agents with $SYS_WORDS-word system prompts on $SLOTS slots, $MSG_WORDS-word messages, $THREADS threads'" \
    "$ROOT/bench/plot_server_turns.gp"
echo >&2 "server_subagents.sh: tables in $OUT/server_subagents.md, plot in $IMG/server_subagents.png"
