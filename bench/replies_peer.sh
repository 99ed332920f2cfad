#!/usr/bin/env bash
# replies_peer.sh — long greedy replies with and without the prompt cache, on
# `kvstash serve` and llama.cpp's own `llama-server` of the same pinned source
# (bench/peer.sh): how many turns give the same reply both ways
# (bench/replies_peer.mjs: method). kvstash's promise is every one.
#
# usage: bench/replies_peer.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (llama-server is built by bench/peer.sh when missing)
#   MODEL        default build/models/bench.gguf (generated when missing; a bench
#                preset's name, e.g. build/models/bench-moe-q4k.gguf, writes that preset)
# Environment (defaults in brackets):
#   URLS         comma-separated base URLs of running servers: measure them, start nothing
#   SERVERS [kvstash,llama-server]  as bench/decode_peer.sh (bench/peer_lib.sh)
#   THREADS [2]  SLOTS [2]  CTX [4096]  KS_ARGS []  PEER_ARGS []
#   CONVS [3]  TURNS [4]  MAX_TOKENS [128]  SYS_WORDS [120]  MSG_WORDS [40]
#   GAP_MS [0]   wait before each request
#   SPEC [0]     1: speculation instead of the cache — each turn's reply from a server
#                with speculation against its family's without (both cache_prompt:
#                false); SERVERS then defaults to kvstash-no-spec,kvstash-spec,
#                llama-server,llama-server-spec (KS_SPEC_ARGS, PEER_SPEC_ARGS: peer_lib.sh)
# Writes bench/out/replies_peer.{md,csv} and the servers' logs
# bench/out/replies_peer-*.log; prints the markdown table.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONVS=${CONVS:-3} TURNS=${TURNS:-4} MAX_TOKENS=${MAX_TOKENS:-128} SYS_WORDS=${SYS_WORDS:-120}
MSG_WORDS=${MSG_WORDS:-40} GAP_MS=${GAP_MS:-0}
THREADS=${THREADS:-2} SLOTS=${SLOTS:-2} CTX=${CTX:-4096} SPEC=${SPEC:-0}
[ "$SPEC" = 1 ] && export SERVERS=${SERVERS:-kvstash-no-spec,kvstash-spec,llama-server,llama-server-spec}
OUT=$ROOT/bench/out
MEASURE=(node "$ROOT/bench/replies_peer.mjs" --convs "$CONVS" --turns "$TURNS" --max-tokens "$MAX_TOKENS"
    --sys-words "$SYS_WORDS" --msg-words "$MSG_WORDS" --gap-ms "$GAP_MS" --out "$OUT")
command -v node >/dev/null 2>&1 || { echo "replies_peer.sh: node is required" >&2; exit 1; }
mkdir -p "$OUT"

if [ -n "${URLS:-}" ]; then
    IFS=, read -r -a urls <<<"$URLS"
    echo "\$ ${MEASURE[*]} ${urls[*]}" >&2
    exec "${MEASURE[@]}" "${urls[@]}"
fi

# The longest conversation must fit in a slot: about one token per word.
need=$((SYS_WORDS + TURNS * (MSG_WORDS + MAX_TOKENS + 16) + 32))
if [ "$need" -gt "$CTX" ]; then
    echo "replies_peer.sh: a conversation grows to about $need tokens, more than CTX=$CTX per slot: raise CTX" >&2
    exit 2
fi

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare replies_peer.sh "$@"
# shellcheck source=bench/peer_lib.sh
. "$ROOT/bench/peer_lib.sh"
peer_start_servers replies_peer.sh replies_peer # sets urls, names (--name LABEL pairs), keys

if [ "$SPEC" = 1 ]; then
    # each *-spec server against its family's server without speculation
    args=()
    for i in "${!keys[@]}"; do
        case ${keys[$i]} in *-no-spec | llama-server | kvstash) continue ;; esac
        base=${keys[$i]%-spec}; [ "$base" = kvstash ] && base=kvstash-no-spec
        for j in "${!keys[@]}"; do
            [ "${keys[$j]}" = "$base" ] && args+=(--name "${keys[$i]}" --base "${urls[$j]}" "${urls[$i]}")
        done
    done
    echo "\$ ${MEASURE[*]} ${args[*]}" >&2
    "${MEASURE[@]}" "${args[@]}"
else
    echo "\$ ${MEASURE[*]} ${names[*]} ${urls[*]}" >&2
    "${MEASURE[@]}" "${names[@]}" "${urls[@]}"
fi
echo >&2 "replies_peer.sh: THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX; table in $OUT/replies_peer.md"
