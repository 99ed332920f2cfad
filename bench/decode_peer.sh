#!/usr/bin/env bash
# decode_peer.sh — single-stream decode speed over HTTP: `kvstash serve` beside
# llama.cpp's own `llama-server` built from the same pinned llama.cpp source
# (bench/peer.sh), or any OpenAI-compatible servers given by URL. Streamed,
# greedy, max_tokens fixed with ignore_eos so every reply has the same length;
# tok/s from client-side arrival times of the first and last content token, and
# the servers' own timings.predicted_per_second (bench/decode_peer.mjs: method).
# With two servers every round visits both, rotating who goes first.
#
# usage: bench/decode_peer.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing of kvstash;
#                llama-server is built by bench/peer.sh when missing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets):
#   URLS         comma-separated base URLs of running servers: measure them and
#                start nothing (e.g. URLS=http://127.0.0.1:8080,http://127.0.0.1:8081)
#   SERVERS [kvstash,llama-server]  which servers to start when URLS is unset
#   THREADS [2]  SLOTS [2]  CTX [4096] (context per slot) — of every server started
#   KS_ARGS []   more `kvstash serve` flags (e.g. --no-exact, --flash-attn)
#   PEER_ARGS [--flash-attn off]  more llama-server flags; off by default to match
#                kvstash's default (llama-server's own default is auto, i.e. on for CPU)
#   ROUNDS [5]  MAX_TOKENS [128]  PROMPT_WORDS [32]
# Writes bench/out/decode_peer.{md,csv} and the servers' logs
# bench/out/decode_peer-*.log; prints the markdown table.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-5} MAX_TOKENS=${MAX_TOKENS:-128} PROMPT_WORDS=${PROMPT_WORDS:-32}
THREADS=${THREADS:-2} SLOTS=${SLOTS:-2} CTX=${CTX:-4096}
SERVERS=${SERVERS:-kvstash,llama-server}
KS_ARGS=${KS_ARGS:-} PEER_ARGS=${PEER_ARGS---flash-attn off}
OUT=$ROOT/bench/out
MEASURE=(node "$ROOT/bench/decode_peer.mjs" --rounds "$ROUNDS" --max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS" --out "$OUT")
command -v node >/dev/null 2>&1 || { echo "decode_peer.sh: node is required" >&2; exit 1; }
mkdir -p "$OUT"

if [ -n "${URLS:-}" ]; then
    IFS=, read -r -a urls <<<"$URLS"
    echo "\$ ${MEASURE[*]} ${urls[*]}" >&2
    exec "${MEASURE[@]}" "${urls[@]}"
fi

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare decode_peer.sh "$@"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_health() { # $1 = base URL, $2 = pid, $3 = log
    for _ in $(seq 1 1200); do
        kill -0 "$2" 2>/dev/null || { tail -n 20 "$3" >&2; echo "decode_peer.sh: server died (log: $3)" >&2; exit 1; }
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$1/health" || true)" = 200 ] && return
        sleep 0.1
    done
    echo "decode_peer.sh: $1/health never answered (log: $3)" >&2
    exit 1
}
free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

urls=() names=()
IFS=, read -r -a want <<<"$SERVERS"
for s in "${want[@]}"; do
    log=$OUT/decode_peer-$s.log
    case $s in
    kvstash)
        # shellcheck disable=SC2086 # KS_ARGS is a list of flags
        "$BIN" serve -m "$MODEL" --port 0 --threads "$THREADS" --slots "$SLOTS" --ctx "$CTX" $KS_ARGS 2>"$log" &
        pids+=($!)
        port=
        for _ in $(seq 1 1200); do
            port=$(sed -n 's/.*kvstash: port=\([0-9]*\).*/\1/p' "$log" | head -n 1)
            [ -n "$port" ] && break
            kill -0 "${pids[-1]}" 2>/dev/null || break
            sleep 0.1
        done
        [ -n "$port" ] || { tail -n 20 "$log" >&2; echo "decode_peer.sh: kvstash did not start (log: $log)" >&2; exit 1; }
        names+=(--name "$("$BIN" version | head -n 1)${KS_ARGS:+ $KS_ARGS}")
        ;;
    llama-server)
        "$ROOT/bench/peer.sh" path >/dev/null # build it first (not inside the timed wait)
        port=$(free_port)
        # shellcheck disable=SC2086 # PEER_ARGS is a list of flags
        THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX "$ROOT/bench/peer.sh" serve "$MODEL" "$port" $PEER_ARGS >"$log" 2>&1 &
        pids+=($!)
        names+=(--name "llama-server $("$ROOT/bench/peer.sh" version | sed -n 's/.*build \([0-9]*\), commit \([0-9a-f]*\).*/b\1-\2/p')${PEER_ARGS:+ $PEER_ARGS}")
        ;;
    *) echo "decode_peer.sh: unknown server '$s' (kvstash or llama-server)" >&2; exit 2 ;;
    esac
    urls+=("http://127.0.0.1:$port")
    wait_health "${urls[-1]}" "${pids[-1]}" "$log"
    echo "decode_peer.sh: $s on ${urls[-1]} (log: $log)" >&2
done

echo "\$ ${MEASURE[*]} ${names[*]} ${urls[*]}" >&2
"${MEASURE[@]}" "${names[@]}" "${urls[@]}"
echo >&2 "decode_peer.sh: THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX; table in $OUT/decode_peer.md"
