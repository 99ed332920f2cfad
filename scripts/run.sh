#!/usr/bin/env bash
# run.sh BIN MODEL — the main job of `make run`: start the OpenAI-compatible
# server with every cache on (same-slot reuse, IMC, SPC, the persistent store
# under build/cache), show two turns of a conversation hitting the cache, print
# the URL and a curl example, then serve until Ctrl-C.
#   PORT=8080 (default)   SLOTS=2   CTX=8192   THREADS=(all CPUs)
set -euo pipefail
bin=$1
model=$2
port=${PORT:-8080}
top=$(cd "$(dirname "$0")/.." && pwd)
cache_dir=$top/build/cache
mkdir -p "$cache_dir"

args=(serve -m "$model" --port "$port" --slots "${SLOTS:-2}" --ctx "${CTX:-8192}"
      --imc --spc --cache-dir "$cache_dir")
[ -n "${THREADS:-}" ] && args+=(--threads "$THREADS")
log=$(mktemp)
"$bin" "${args[@]}" 2> >(tee "$log" >&2) &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT INT TERM

for _ in $(seq 1 600); do
    grep -q "port=" "$log" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "make run: the server did not start" >&2; exit 1; }
    sleep 0.1
done
url="http://127.0.0.1:$port"

echo
echo "== kvstash is serving $model at $url"
echo "== a two-turn conversation: the second turn reuses the first turn's KV"
sys="You are a helpful assistant. Answer in one or two sentences."
ask() { # $1 = messages JSON
    curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' \
        -d "{\"messages\": $1, \"max_tokens\": 24, \"temperature\": 0}"
}
m1="[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"What does a prompt cache do?\"}]"
r1=$(ask "$m1")
a1=$(printf '%s' "$r1" | jq -r '.choices[0].message.content')
printf 'turn 1: %s\n' "$(printf '%s' "$r1" | jq -c '{prompt_tokens: .usage.prompt_tokens, cached_tokens: .usage.prompt_tokens_details.cached_tokens, ttft_ms: .timings.prompt_ms, cache: .cache}')"
m2=$(jq -cn --argjson m "$m1" --arg a "$a1" '$m + [{role:"assistant",content:$a},{role:"user",content:"And why does that make the first token come sooner?"}]')
r2=$(ask "$m2")
printf 'turn 2: %s\n' "$(printf '%s' "$r2" | jq -c '{prompt_tokens: .usage.prompt_tokens, cached_tokens: .usage.prompt_tokens_details.cached_tokens, ttft_ms: .timings.prompt_ms, cache: .cache}')"
cat <<EOT

== try it:
curl $url/v1/chat/completions -H 'Content-Type: application/json' \\
  -d '{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":32,"stream":true}'

   metrics: $url/metrics    slots: $url/slots    store: $bin cache ls --cache-dir $cache_dir
== serving until Ctrl-C
EOT
wait $pid
