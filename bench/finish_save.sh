#!/usr/bin/env bash
# finish_save.sh — a request right behind a finished one against one sent
# after a pause, kvstash with the persistent store (finish saves to shm), with
# the finish save deferred (store.finish_save_delay_ms, default 500: the
# conversation's next turn supersedes it) and taken at once (0), one server
# after the other (bench/gpu/clients.py behind: method). On a GPU the copy is
# the cost (bench/gpu/run.sh's behind step); here the state is copied from
# host memory.
#
# usage: bench/finish_save.sh [KVSTASH_BIN [MODEL.gguf]]
# Environment (defaults in brackets): THREADS [2]  TURNS [11]  SYS_WORDS [5000]
#   MSG_WORDS [20]  MAX_TOKENS [16]  PAUSE_S [2]  DELAYS ["500 0"]
# Writes bench/out/finish_save-<delay>.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare finish_save.sh "$@"
command -v python3 >/dev/null || { echo "finish_save.sh: python3 is required" >&2; exit 1; }
for d in ${DELAYS:-500 0}; do
    w=$(mktemp -d /tmp/ks-finish-save-XXXXXX)
    printf 'store:\n  enabled: true\n  cache_dir: %s/disk\n  shm_dir: %s/shm\n  finish_save_delay_ms: %s\n' "$w" "$w" "$d" >"$w/c.yaml"
    "$BIN" serve -m "$MODEL" --port 0 --threads "$THREADS" --slots 1 --ctx 16384 --config "$w/c.yaml" --log info \
        2>"$w/serve.log" &
    pid=$!
    port=
    for _ in $(seq 600); do
        port=$(sed -n 's/^kvstash: port=\([0-9]*\)$/\1/p' "$w/serve.log")
        [ -n "$port" ] && break
        sleep 0.2
    done
    [ -n "$port" ] || { echo "finish_save.sh: the server did not start (log: $w/serve.log)" >&2; kill "$pid"; exit 1; }
    python3 "$ROOT/bench/gpu/clients.py" behind "http://127.0.0.1:$port" --name "kvstash finish_save_delay_ms $d" \
        --turns "${TURNS:-11}" --sys-words "${SYS_WORDS:-5000}" --msg-words "${MSG_WORDS:-20}" \
        --max-tokens "${MAX_TOKENS:-16}" --pause-s "${PAUSE_S:-2}" --out "$OUT/finish_save-$d"
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^kvstash_(snapshot_seconds_total|store_finish_saves_superseded_total|store_save_requests_total\{reason="finish"\})' \
        | tee -a "$OUT/finish_save-$d.md"
    kill -TERM "$pid"
    wait "$pid" || true
    rm -rf "$w"
done
