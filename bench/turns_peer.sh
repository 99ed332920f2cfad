#!/usr/bin/env bash
# turns_peer.sh — time to first token per turn of a multi-turn conversation over
# HTTP: `kvstash serve` beside llama.cpp's own `llama-server` built from the
# same pinned llama.cpp source (bench/peer.sh), or any OpenAI-compatible servers
# given by URL. One conversation (a SYS_WORDS-word system prompt, then TURNS
# user messages of MSG_WORDS words, deterministic text) is sent to every server;
# each keeps its own history (its own greedy replies appended, as a chat UI
# does), so each server's prompt cache sees its own conversation. Turn t goes to
# every server before turn t+1, rotating who goes first; requests are streamed
# (temperature 0, cache_prompt, max_tokens MAX_TOKENS) and TTFT is measured
# client-side at the first content chunk. Per turn and server it records TTFT,
# total time and the prompt tokens the server reused and prefilled (kvstash:
# usage.prompt_tokens_details.cached_tokens; llama-server: timings.cache_n and
# timings.prompt_n); the table compares every server's TTFT with the first
# one's, and the summary gives the median over turns 2..T of first / other
# (the cached turns) and turn 1 (cold) apart (bench/turns_peer.mjs: method).
# Deep conversations are where flash attention (llama-server's default) shows:
# e.g. SYS_WORDS=2000 MSG_WORDS=800 TURNS=10 CTX=16384 grows to about 10,300
# tokens on the bench model (one token per word; about SYS_WORDS +
# TURNS * (MSG_WORDS + MAX_TOKENS + 10)).
#
# usage: bench/turns_peer.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing of kvstash;
#                llama-server is built by bench/peer.sh when missing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets):
#   URLS         comma-separated base URLs of running servers: measure them and
#                start nothing (the first is the reference of the ratios)
#   SERVERS [kvstash,llama-server]  which servers to start when URLS is unset,
#                in this order (the first is the reference: put kvstash first):
#                kvstash (default flags), kvstash-no-exact (--no-exact),
#                kvstash-no-ckpt (--ctx-checkpoints 0),
#                kvstash-prebuilt (KS_GGML_CPU=prebuilt: the npm CPU variants, so
#                exactness by pair decoding), llama-server (its defaults: flash
#                attention auto = on for the CPU), llama-server-fa-off
#                (started by bench/peer_lib.sh)
#   THREADS [2]  SLOTS [2]  CTX [4096] (context per slot; llama-server gets
#                -c SLOTS*CTX with -np SLOTS) — of every server started; the
#                whole conversation must fit in CTX (checked before starting)
#   KS_ARGS []   more `kvstash serve` flags (e.g. --flash-attn)
#   NAME [turns_peer]  the outputs' base name (e.g. turns_peer_hybrid)
#   FLOOR [0]    1: also the first server's floor per turn (`kvstash bench floor`:
#                the prefill of its new tokens after its reused ones, llama.cpp alone)
#   PEER_ARGS []  more llama-server flags
#   TURNS [10]  SYS_WORDS [300]  MSG_WORDS [60]  MAX_TOKENS [32]
#   EDIT_REPLIES [0]  replies go back into the history less their last N words,
#                so every turn diverges inside the reply the server holds
#                (turns_peer.mjs --edit-replies)
#   GAP_MS [0]   wait before each request, so that no server's polling threads
#                still hold the cores (turns_peer.mjs --gap-ms)
# Writes bench/out/NAME.{md,csv}, bench/out/NAME_ttft.csv, the servers' logs
# bench/out/NAME-*.log and docs/img/NAME.png; prints
# the markdown table.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TURNS=${TURNS:-10} SYS_WORDS=${SYS_WORDS:-300} MSG_WORDS=${MSG_WORDS:-60} MAX_TOKENS=${MAX_TOKENS:-32}
EDIT_REPLIES=${EDIT_REPLIES:-0} GAP_MS=${GAP_MS:-0}
THREADS=${THREADS:-2} SLOTS=${SLOTS:-2} CTX=${CTX:-4096}
SERVERS=${SERVERS:-kvstash,llama-server}
KS_ARGS=${KS_ARGS:-} PEER_ARGS=${PEER_ARGS:-} FLOOR=${FLOOR:-0} NAME=${NAME:-turns_peer}
OUT=$ROOT/bench/out IMG=$ROOT/docs/img
SETTINGS="TURNS=$TURNS SYS_WORDS=$SYS_WORDS MSG_WORDS=$MSG_WORDS MAX_TOKENS=$MAX_TOKENS"
[ "$EDIT_REPLIES" != 0 ] && SETTINGS+=" EDIT_REPLIES=$EDIT_REPLIES"
[ "$GAP_MS" != 0 ] && SETTINGS+=" GAP_MS=$GAP_MS"
MEASURE=(node "$ROOT/bench/turns_peer.mjs" --turns "$TURNS" --sys-words "$SYS_WORDS" --msg-words "$MSG_WORDS"
    --max-tokens "$MAX_TOKENS" --edit-replies "$EDIT_REPLIES" --gap-ms "$GAP_MS" --out "$OUT" --prefix "$NAME")
command -v node >/dev/null 2>&1 || { echo "turns_peer.sh: node is required" >&2; exit 1; }
mkdir -p "$OUT"

plot() { # $1 = number of servers, $2 = subtitle
    command -v gnuplot >/dev/null 2>&1 || { echo "turns_peer.sh: no gnuplot: no plot" >&2; return 0; }
    mkdir -p "$IMG"
    gnuplot -e "csv='$OUT/${NAME}_ttft.csv'; out='$IMG/$NAME.png'; n=$1; subtitle='$2'" "$ROOT/bench/plot_turns_peer.gp"
    echo >&2 "turns_peer.sh: table in $OUT/$NAME.md, plot in $IMG/$NAME.png"
}

if [ -n "${URLS:-}" ]; then
    IFS=, read -r -a urls <<<"$URLS"
    export KS_BENCH_CMD="URLS=$URLS $SETTINGS bench/turns_peer.sh"
    echo "\$ ${MEASURE[*]} ${urls[*]}" >&2
    "${MEASURE[@]}" "${urls[@]}"
    plot "${#urls[@]}" "$TURNS turns, $SYS_WORDS-word system prompt, $MSG_WORDS-word messages, $MAX_TOKENS-token replies"
    exit 0
fi

# The whole conversation must fit in a slot's context: one token per word of
# the bench model, plus the chat template's few tokens per message.
need=$((SYS_WORDS + TURNS * (MSG_WORDS + MAX_TOKENS + 16) + 32))
if [ "$need" -gt "$CTX" ]; then
    echo "turns_peer.sh: the conversation grows to about $need tokens, more than CTX=$CTX per slot: raise CTX" >&2
    exit 2
fi

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare turns_peer.sh "$@"
# shellcheck source=bench/peer_lib.sh
. "$ROOT/bench/peer_lib.sh"
peer_start_servers turns_peer.sh "$NAME" # sets urls, names (--name LABEL pairs), keys

shorts=()
for k in "${keys[@]}"; do shorts+=(--short "$k"); done
[ "$FLOOR" = 1 ] && MEASURE+=(--floor-bin "$BIN" --floor-model "$MODEL" --floor-threads "$THREADS" --floor-ctx "$CTX")
extra=
[ -n "$KS_ARGS" ] && extra+=" KS_ARGS=\"$KS_ARGS\""
[ -n "$PEER_ARGS" ] && extra+=" PEER_ARGS=\"$PEER_ARGS\""
[ "$FLOOR" = 1 ] && extra+=" FLOOR=1"
[ "$NAME" != turns_peer ] && extra+=" NAME=$NAME"
export KS_BENCH_CMD="THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX SERVERS=$SERVERS$extra $SETTINGS bench/turns_peer.sh${*:+ $*}"
echo "\$ ${MEASURE[*]} ${names[*]} ${shorts[*]} ${urls[*]}" >&2
"${MEASURE[@]}" "${names[@]}" "${shorts[@]}" "${urls[@]}"
plot "${#urls[@]}" "$(basename "$MODEL"), $TURNS turns, $SYS_WORDS-word system prompt, $MSG_WORDS-word messages, $MAX_TOKENS-token replies, $SLOTS slots x ctx $CTX, $THREADS threads"
echo >&2 "turns_peer.sh: THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX"
