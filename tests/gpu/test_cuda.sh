#!/usr/bin/env bash
# The device paths on a real NVIDIA GPU (label gpu): setup's CUDA module
# (KS_GPU=cuda) with every layer and the KV of the tiny model on CUDA0.
# /props and the listening line name the device and say that exact mode is
# unavailable (the tiny model's F16 weights take CUDA products the batch-
# invariance patch does not cover); a chat reuses its
# slot; n=2 copies a prompt between slots on the device; a takeover on one
# slot restores from the RAM store; -ngl 0 keeps the model on the CPU,
# exact. Exit 77 (skipped, CTest SKIP_RETURN_CODE) with the reason where
# there is no CUDA module or no NVIDIA GPU — CI.
. "$(dirname "$0")/../cli/lib.sh"
MODEL=${KS_TINY_MODEL:?}
CUDA=${KS_CUDA_MODULE:-}

if [ -z "$CUDA" ] || [ ! -f "$CUDA" ]; then
    echo "SKIP: no CUDA module at ${CUDA:-KS_CUDA_MODULE unset} (scripts/setup.sh builds it with KS_GPU=cuda)"
    exit 77
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "SKIP: no NVIDIA GPU here (nvidia-smi lists none)"
    exit 77
fi
export KS_GPU_MODULES=$CUDA

# serve ARGS...: starts a server in the background; sets $port, $spid.
serve() {
    "$BIN" serve -m "$MODEL" --port 0 --ctx 1024 --threads 2 --log info "$@" 2>"$tmp/s.err" &
    spid=$!
    port=
    for _ in $(seq 600); do
        port=$(sed -n 's/^kvstash: port=\([0-9]*\)$/\1/p' "$tmp/s.err")
        [ -n "$port" ] && break
        kill -0 $spid 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] || { cat "$tmp/s.err"; echo "FAIL - the server did not start"; exit 1; }
}
stop() { kill -TERM "$spid"; wait "$spid"; local rc=$?; spid=; return $rc; }
post() { curl -s -H 'Content-Type: application/json' -d "$2" "http://127.0.0.1:$port$1"; }
msgs() { # system topic, then user/assistant contents alternating
    local out="[{\"role\":\"system\",\"content\":\"$1: you answer briefly and check every fact twice. you answer briefly.\"}" r=user
    shift
    for m in "$@"; do out="$out,{\"role\":\"$r\",\"content\":$(jq -Rn --arg m "$m" '$m')}"; [ $r = user ] && r=assistant || r=user; done
    echo "$out]"
}
ask() { post /v1/chat/completions "{\"messages\":$1,\"max_tokens\":${2:-12},\"temperature\":0}"; }

serve -ngl all --slots 2
check "listening line: 3/3 layers on CUDA0, exact unavailable" \
    grep -q 'ctx 1024, 3/3 layers on CUDA0, KV on CUDA0, exact: unavailable (CUDA0 kernels are not batch-invariant' "$tmp/s.err"
curl -s "http://127.0.0.1:$port/props" >"$tmp/props"
check "/props: CUDA0 holds 3 layers and the KV" \
    test "$(jq -r '.kvstash.offload | "\(.devices[0].name) \(.devices[0].layers) \(.kv) \(.gpu_layers)/\(.layers)"' "$tmp/props")" = "CUDA0 3 CUDA0 3/3"
check "/props: exact_mode unavailable" test "$(jq -r .kvstash.exact_mode "$tmp/props")" = unavailable
check "/props: the CUDA build is named" test "$(jq -r '.kvstash.gpu_backends[0] | test("cuda")' "$tmp/props")" = true
t1=$(ask "$(msgs Rivers 'What is a river delta?')")
r1=$(jq -r '.choices[0].message.content' <<<"$t1")
t2=$(ask "$(msgs Rivers 'What is a river delta?' "$r1" 'And an estuary?')")
p1=$(jq .usage.prompt_tokens <<<"$t1")
c2=$(jq .usage.prompt_tokens_details.cached_tokens <<<"$t2")
check "same slot: turn 2 reuses turn 1's prompt ($c2 >= $p1)" test "$c2" -ge "$p1"
n2=$(post /v1/chat/completions "{\"messages\":$(msgs Gardens 'Name a flower.'),\"n\":2,\"max_tokens\":8,\"temperature\":0}")
check "n=2: two choices" test "$(jq '.choices | length' <<<"$n2")" -eq 2
curl -s "http://127.0.0.1:$port/metrics" >"$tmp/m"
check "n=2: one slot copy" grep -q '^kvstash_cache_decisions_total{decision="copy"} 1$' "$tmp/m"
stop
check "the server stopped cleanly" test $? -eq 0

printf 'store:\n  enabled: false\n  min_tokens: 16\n  stride: 16\n' >"$tmp/ram.yaml"
serve -ngl all --slots 1 --config "$tmp/ram.yaml"
a1=$(ask "$(msgs Astronomy 'What is a comet?')" 8)
sleep 1
ask "$(msgs Gardening 'When do I plant tulips?')" 8 >/dev/null
sleep 1
a2=$(ask "$(msgs Astronomy 'What is a comet?' "$(jq -r '.choices[0].message.content' <<<"$a1")" 'And a meteor?')" 8)
check "takeover: restored from the ram tier ($(jq -c .cache <<<"$a2"))" \
    test "$(jq -r '"\(.cache.mode) \(.cache.tier)"' <<<"$a2")" = "store ram"
stop

serve -ngl 0 --slots 1
check "-ngl 0: the CPU alone, exact" grep -q 'ctx 1024, CPU, exact: batch-invariant)' "$tmp/s.err"
stop

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
