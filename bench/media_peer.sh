#!/usr/bin/env bash
# media_peer.sh — a conversation about one image (issue 29's acceptance):
# `kvstash serve --mmproj` beside llama.cpp's own `llama-server --mmproj` built
# from the same pinned source (bench/peer.sh), the bench model and its random
# projector; TURNS turns (the image in turn 1, text after it, the image staying
# in the history), then both servers restarted and the next turn sent to the
# new processes: kvstash restores the conversation, image KV included, from its
# store; llama-server's caches were in RAM and it encodes and prefills again
# (bench/media_peer.mjs: method).
#
# usage: bench/media_peer.sh [KVSTASH_BIN [MODEL.gguf [MMPROJ.gguf]]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing of kvstash;
#                llama-server is built by bench/peer.sh when missing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
#   MMPROJ       default build/models/bench-mmproj.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1 --mmproj MMPROJ` when
#                missing (the model it writes beside it is the same bench.gguf:
#                written to a temporary file and removed)
# Environment (defaults in brackets): THREADS [2] SLOTS [2] CTX [4096] (of
#   both servers) TURNS [6] MSG_WORDS [30] MAX_TOKENS [32] SIZE [224] (the
#   image's side) REPEAT [3] GAP_MS [1000] TIERS [default] (kvstash's store:
#   default tiers, or disk: the disk tier alone) NAME [media_peer]
# Writes bench/out/NAME.{md,csv}, bench/out/NAME_ttft.csv, the servers' logs
# bench/out/NAME-*.log and docs/img/NAME.png; prints the markdown table.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TURNS=${TURNS:-6} MSG_WORDS=${MSG_WORDS:-30} MAX_TOKENS=${MAX_TOKENS:-32} SIZE=${SIZE:-224}
REPEAT=${REPEAT:-3} GAP_MS=${GAP_MS:-1000} TIERS=${TIERS:-default} NAME=${NAME:-media_peer}
SLOTS=${SLOTS:-2} CTX=${CTX:-4096}
command -v node >/dev/null 2>&1 || { echo "media_peer.sh: node is required" >&2; exit 1; }

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare media_peer.sh "$@"
MMPROJ=${3:-$ROOT/build/models/bench-mmproj.gguf}
if [ ! -f "$MMPROJ" ]; then
    echo "media_peer.sh: generating the bench projector at $MMPROJ" >&2
    tmp=$(mktemp -d)
    "$BIN" mkmodel --preset bench --seed 1 --mmproj "$MMPROJ" "$tmp/model.gguf"
    rm -rf "$tmp"
fi
"$ROOT/bench/peer.sh" path >/dev/null # build llama-server first when missing

extra=
[ "$NAME" != media_peer ] && extra=" NAME=$NAME"
export KS_BENCH_CMD="THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX TURNS=$TURNS MSG_WORDS=$MSG_WORDS MAX_TOKENS=$MAX_TOKENS SIZE=$SIZE REPEAT=$REPEAT GAP_MS=$GAP_MS TIERS=$TIERS$extra bench/media_peer.sh${*:+ $*}"
CMD=(node "$ROOT/bench/media_peer.mjs" --bin "$BIN" --model "$MODEL" --mmproj "$MMPROJ" --peer "$ROOT/bench/peer.sh"
    --out "$OUT" --prefix "$NAME" --threads "$THREADS" --slots "$SLOTS" --ctx "$CTX" --turns "$TURNS"
    --msg-words "$MSG_WORDS" --max-tokens "$MAX_TOKENS" --size "$SIZE" --repeat "$REPEAT" --gap-ms "$GAP_MS" --tiers "$TIERS")
echo "\$ ${CMD[*]}" >&2
"${CMD[@]}"

gnuplot -e "csv='$OUT/${NAME}_ttft.csv'; out='$IMG/$NAME.png'; turns=$TURNS; subtitle='$(basename "$MODEL") + $(basename "$MMPROJ"), a ${SIZE}x${SIZE} PNG in turn 1, $MSG_WORDS-word messages, $MAX_TOKENS-token replies, $SLOTS slots, $THREADS threads, store: $TIERS, median of $REPEAT'" \
    "$ROOT/bench/plot_media_peer.gp"
echo >&2 "media_peer.sh: table in $OUT/$NAME.md, plot in $IMG/$NAME.png"
