# shellcheck shell=bash
# peer_lib.sh — starts and stops the servers of the benchmarks that put
# `kvstash serve` beside llama.cpp's own `llama-server` (bench/decode_peer.sh,
# bench/turns_peer.sh): every server on its own free port of 127.0.0.1, its
# log in bench/out, all of them stopped when the script exits. Sourced, not
# run (bench/run_all.sh skips it).
# Usage (after bench_prepare of bench/lib.sh, which sets BIN MODEL THREADS OUT):
#   . "$ROOT/bench/peer_lib.sh"
#   peer_start_servers NAME.sh PREFIX
# starts each server of $SERVERS in order, waits for its /health, and sets
#   urls=(http://127.0.0.1:PORT ...)   one per server
#   names=(--name LABEL ...)           the arguments that label them in the
#                                      measuring scripts (decode_peer.mjs, turns_peer.mjs)
#   keys=(kvstash llama-server ...)    the $SERVERS entries, in the same order
# Logs: $OUT/PREFIX-SERVER.log. Reads (defaults in brackets):
#   SERVERS [kvstash,llama-server]  kvstash (default flags), kvstash-no-exact
#            (--no-exact), kvstash-prebuilt (KS_GGML_CPU=prebuilt: the npm CPU
#            variants, so exactness by pair decoding), kvstash-fa-off (--flash-attn
#            off), kvstash-no-ckpt (--ctx-checkpoints 0: hybrid models rebuild),
#            kvstash-no-repack (--no-repack), kvstash-no-tokcache (KS_TOKCACHE=0: every
#            prompt tokenized whole), llama-server (its defaults: flash attention
#            auto = on for the CPU, as kvstash's default), llama-server-fa-off
#            (--flash-attn off), llama-server-no-repack (--no-repack),
#            kvstash-no-spec (--spec-type none), kvstash-spec ($KS_SPEC_ARGS),
#            llama-server-spec ($PEER_SPEC_ARGS; both default to kvstash's default drafter,
#            --spec-type ngram-simple with a 3-token lookup drafting up to 8)
#   THREADS [2]  SLOTS [2]  CTX [4096] (context per slot; llama-server gets
#            -c SLOTS*CTX with -np SLOTS, i.e. CTX per slot too: bench/peer.sh)
#   KS_ARGS []  more `kvstash serve` flags    PEER_ARGS []  more llama-server flags

pids=()
peer_cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap peer_cleanup EXIT

peer_wait_health() { # $1 = script name, $2 = base URL, $3 = pid, $4 = log
    for _ in $(seq 1 1200); do
        kill -0 "$3" 2>/dev/null || { tail -n 20 "$4" >&2; echo "$1: server died (log: $4)" >&2; exit 1; }
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$2/health" || true)" = 200 ] && return
        sleep 0.1
    done
    echo "$1: $2/health never answered (log: $4)" >&2
    exit 1
}

peer_free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

peer_start_servers() { # $1 = script name (for messages), $2 = log prefix
    local me=$1 prefix=$2 s log args envs port peer_args want
    SERVERS=${SERVERS:-kvstash,llama-server}
    THREADS=${THREADS:-2} SLOTS=${SLOTS:-2} CTX=${CTX:-4096}
    KS_ARGS=${KS_ARGS:-} PEER_ARGS=${PEER_ARGS:-}
    urls=() names=() keys=()
    IFS=, read -r -a want <<<"$SERVERS"
    for s in "${want[@]}"; do
        log=$OUT/$prefix-$s.log
        case $s in
        kvstash | kvstash-no-exact | kvstash-prebuilt | kvstash-fa-off | kvstash-no-ckpt | kvstash-no-repack | kvstash-no-tokcache | kvstash-no-spec | kvstash-spec)
            args=$KS_ARGS envs=()
            [ "$s" = kvstash-no-spec ] && args="${args:+$args }--spec-type none"
            [ "$s" = kvstash-spec ] && args="${args:+$args }${KS_SPEC_ARGS:---spec-type ngram-simple}"
            [ "$s" = kvstash-no-repack ] && args="${args:+$args }--no-repack"
            [ "$s" = kvstash-no-exact ] && args="${args:+$args }--no-exact"
            [ "$s" = kvstash-fa-off ] && args="${args:+$args }--flash-attn off"
            # hybrid models without checkpoints: every trim rebuilds (the old behaviour)
            [ "$s" = kvstash-no-ckpt ] && args="${args:+$args }--ctx-checkpoints 0"
            # the npm prebuilt CPU variants: not batch-invariant, so exact means pairs
            [ "$s" = kvstash-prebuilt ] && envs=(KS_GGML_CPU=prebuilt)
            # every prompt tokenized whole, as before the tokenization cache
            [ "$s" = kvstash-no-tokcache ] && envs=(KS_TOKCACHE=0)
            # shellcheck disable=SC2086 # args is a list of flags
            env "${envs[@]}" "$BIN" serve -m "$MODEL" --port 0 --threads "$THREADS" --slots "$SLOTS" --ctx "$CTX" $args 2>"$log" &
            pids+=($!)
            port=
            for _ in $(seq 1 1200); do
                port=$(sed -n 's/.*kvstash: port=\([0-9]*\).*/\1/p' "$log" | head -n 1)
                [ -n "$port" ] && break
                kill -0 "${pids[-1]}" 2>/dev/null || break
                sleep 0.1
            done
            [ -n "$port" ] || { tail -n 20 "$log" >&2; echo "$me: kvstash did not start (log: $log)" >&2; exit 1; }
            names+=(--name "$s$(sed -n 's/.*, exact: \([a-z-]*\)[ )].*/ (exact: \1)/p' "$log" | head -n 1)${args:+ $args}")
            ;;
        llama-server | llama-server-fa-off | llama-server-no-repack | llama-server-spec)
            peer_args=$PEER_ARGS
            [ "$s" = llama-server-spec ] && peer_args="${peer_args:+$peer_args }${PEER_SPEC_ARGS:---spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8}"
            [ "$s" = llama-server-fa-off ] && peer_args="${peer_args:+$peer_args }--flash-attn off"
            [ "$s" = llama-server-no-repack ] && peer_args="${peer_args:+$peer_args }--no-repack"
            "$ROOT/bench/peer.sh" path >/dev/null # build it first (not inside the timed wait)
            port=$(peer_free_port)
            # shellcheck disable=SC2086 # peer_args is a list of flags
            THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX "$ROOT/bench/peer.sh" serve "$MODEL" "$port" $peer_args >"$log" 2>&1 &
            pids+=($!)
            names+=(--name "llama-server $("$ROOT/bench/peer.sh" version | sed -n 's/.*build \([0-9]*\), commit \([0-9a-f]*\).*/b\1-\2/p')${peer_args:+ $peer_args}")
            ;;
        *) echo "$me: unknown server '$s' (kvstash, kvstash-no-exact, kvstash-prebuilt, kvstash-fa-off, kvstash-no-ckpt, kvstash-no-repack, kvstash-no-tokcache, kvstash-no-spec, kvstash-spec, llama-server, llama-server-fa-off, llama-server-no-repack, llama-server-spec)" >&2; exit 2 ;;
        esac
        keys+=("$s")
        urls+=("http://127.0.0.1:$port")
        peer_wait_health "$me" "${urls[-1]}" "${pids[-1]}" "$log"
        echo "$me: $s on ${urls[-1]} (log: $log)" >&2
    done
}
