#!/usr/bin/env bash
# Regression test for issue 28, "settings that cannot silently do nothing":
# a tier that another setting turns off is not opened, and the start-up says
# so in one warning line naming both settings (docs/SERVER.md "Settings that
# turn a tier off") — before, --cache-redis with --cache-ram 0 or
# --no-cache-prompt was silently ignored. A setting that means nothing
# without its tier (Redis TLS files without a Redis URL) stays an error
# (exit 2). The Redis URL points at a closed port: the tier is never reached.
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?KS_TINY_MODEL not set}
REDIS=redis://127.0.0.1:1

# serve NAME ARGS...: starts `kvstash serve`, waits until it listens, stops it;
# its stderr in $tmp/NAME.err.
serve() {
    local name=$1 port=; shift
    "$BIN" serve -m "$MODEL" --port 0 --threads 1 --slots 1 --ctx 256 --log info "$@" >/dev/null 2>"$tmp/$name.err" &
    spid=$!
    for _ in $(seq 600); do
        port=$(sed -n 's/^kvstash: port=\([0-9]*\)$/\1/p' "$tmp/$name.err")
        [ -n "$port" ] && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] || { echo "server $name did not start:"; cat "$tmp/$name.err"; }
    kill -TERM "$spid" 2>/dev/null; wait "$spid"; spid=
}
cat >"$tmp/full.yaml" <<EOF
store:
  enabled: true
  cache_dir: $tmp/disk
  shm_dir: $tmp/shm
  tiers: { redis: { max_bytes: 0 } }
EOF

serve ram0 --cache-redis "$REDIS" --cache-ram 0
check "--cache-redis with --cache-ram 0: one warning naming both" \
    grep -q "W serve  the redis tier (--cache-redis, store.tiers.redis.url) is not used: --cache-ram 0" "$tmp/ram0.err"
check "... and the store is off" grep -q "store off" "$tmp/ram0.err"

serve nocache --cache-redis "$REDIS" --no-cache-prompt
check "--cache-redis with --no-cache-prompt: one warning naming both" \
    grep -q "W serve  the redis tier (--cache-redis, store.tiers.redis.url) is not used: --no-cache-prompt" \
    "$tmp/nocache.err"

serve budget0 --config "$tmp/full.yaml" --cache-redis "$REDIS"
check "--cache-redis with store.tiers.redis.max_bytes 0: a warning" \
    grep -q "W serve  the redis tier (--cache-redis, store.tiers.redis.url) is not used: store.tiers.redis.max_bytes is 0" \
    "$tmp/budget0.err"

serve dir_nocache --config "$tmp/full.yaml" --no-cache-prompt
check "a full store with --no-cache-prompt: a warning naming both" \
    grep -q "W serve  prompt caching is off: the KV store ($tmp/disk) is not opened: --no-cache-prompt" \
    "$tmp/dir_nocache.err"

printf 'a deployment secret, 32 bytes..\n' >"$tmp/secret"; chmod 600 "$tmp/secret"
serve secret_off --cache-secret-file "$tmp/secret" --cache-ram 0
check "a cache secret with no store: a warning" \
    grep -q "W serve  the cache secret (the cache secret file) is not used: no KV store is opened" "$tmp/secret_off.err"

# The RAM-only store shares nothing: no shm line, no secret warning.
serve ramonly
check "RAM-only store: no shm line" test -z "$(grep 'shm tier' "$tmp/ramonly.err")"
check "RAM-only store: no secret warning" test -z "$(grep 'no cache secret' "$tmp/ramonly.err")"

timeout 20 "$BIN" serve -m "$MODEL" --cache-redis-tls-ca "$tmp/none.pem" >/dev/null 2>"$tmp/e"; rc=$?
check "Redis TLS settings without a Redis URL: still exit 2 ($rc)" test $rc -eq 2

[ "$fails" -eq 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
