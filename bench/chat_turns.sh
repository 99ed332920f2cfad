#!/usr/bin/env bash
# chat_turns.sh — the single-engine multi-turn cache benchmark (docs/BENCHMARKS.md).
#
# usage: bench/chat_turns.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): TURNS [20] MSG_WORDS [60] REPLY_TOKENS [48]
#   CTX [8192] THREADS [2] REPEAT [3]  DECODE_TOKENS [128] DECODE_ROUNDS [3]
#   KS_BENCH_DECODE [1]  0 skips the exact-on/off decode-cost run
# Writes bench/out/chat_turns.{csv,md}, bench/out/decode_cost.md and
# docs/img/chat_turns.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare chat_turns.sh "$@" # BIN, MODEL, THREADS [2], OUT, IMG
TURNS=${TURNS:-20}
MSG_WORDS=${MSG_WORDS:-60}
REPLY_TOKENS=${REPLY_TOKENS:-48}
CTX=${CTX:-8192}
REPEAT=${REPEAT:-3}
DECODE_TOKENS=${DECODE_TOKENS:-128}
DECODE_ROUNDS=${DECODE_ROUNDS:-3}

CMD=("$BIN" bench chat -m "$MODEL" --turns "$TURNS" --msg-words "$MSG_WORDS" --reply-tokens "$REPLY_TOKENS"
     --ctx "$CTX" --threads "$THREADS" --repeat "$REPEAT" --csv "$OUT/chat_turns.csv")
echo "\$ ${CMD[*]}" >&2
"${CMD[@]}" >"$OUT/chat_turns.md"

gnuplot -e "csv='$OUT/chat_turns.csv'; out='$IMG/chat_turns.png'; subtitle='$(basename "$MODEL"), $TURNS turns, $MSG_WORDS-word messages, $REPLY_TOKENS-token replies, threads per chat: $THREADS, median of $REPEAT runs'" \
    "$ROOT/bench/plot_chat_turns.gp"

echo "## chat turns ($OUT/chat_turns.csv, $IMG/chat_turns.png)"
echo
cat "$OUT/chat_turns.md"

if [ "${KS_BENCH_DECODE:-1}" != 0 ]; then
    DCMD=("$BIN" bench decode -m "$MODEL" --tokens "$DECODE_TOKENS" --rounds "$DECODE_ROUNDS" --threads "$THREADS")
    echo "\$ ${DCMD[*]}" >&2
    "${DCMD[@]}" >"$OUT/decode_cost.md"
    echo
    echo "## decode cost of exact pair decoding ($OUT/decode_cost.md)"
    echo
    cat "$OUT/decode_cost.md"
fi
