#!/usr/bin/env bash
# Regression test for issue 28, "stored states are checked, not
# authenticated": a state written without the cache secret (here by a
# kvstash server without one, as anyone who can write the store directories
# could) is refused by a server that has the secret — 0 cached tokens,
# counted in kvstash_store_corrupt_files_total — while its own, tagged,
# states restore after a restart; `kvstash cache verify` authenticates with
# the secret (file or $KVSTASH_CACHE_SECRET) and says it cannot without it;
# a secret file readable by others or a short secret stops the server
# (exit 2); the start-up lines say whom the shm tier is shared with and warn
# when a shared tier runs without a secret. A forged state with a recomputed
# checksum is tests/unit/test_kvmac.c's. Every directory is in our temp dir.
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?KS_TINY_MODEL not set}

disk=$tmp/disk
shm=$tmp/shm
secret=$tmp/secret
printf 'a deployment secret, 32 bytes..\n' >"$secret"
chmod 600 "$secret"
store_cfg() { # file, extra line
    cat >"$1" <<EOF
store:
  enabled: true
  cache_dir: $disk
  shm_dir: $shm
  stride: 16
  min_tokens: 32
$2
EOF
}
store_cfg "$tmp/plain.yaml" ""
store_cfg "$tmp/secret.yaml" "  secret_file: $secret"
kc() { local sub=$1; shift; "$BIN" cache "$sub" --cache-dir "$disk" --shm-dir "$shm" "$@"; }

start_server() { # name, config
    port=
    "$BIN" serve -m "$MODEL" --port 0 --threads 1 --slots 2 --ctx 512 --log info --config "$2" \
        >/dev/null 2>"$tmp/$1.err" &
    spid=$!
    for _ in $(seq 600); do
        port=$(sed -n 's/^kvstash: port=\([0-9]*\)$/\1/p' "$tmp/$1.err")
        [ -n "$port" ] && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$port" ]; then echo "server $1 did not start:"; cat "$tmp/$1.err"; exit 1; fi
}
stop_server() { kill -TERM "$spid"; wait "$spid"; spid=; }
chat() { # topic: one greedy turn (~110 prompt tokens); prints cached_tokens
    local sys="" i
    for i in 1 2 3; do sys+="$1: you are a careful assistant who answers briefly. "; done
    curl -sS -m 60 -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/chat/completions" \
        -d "{\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"Hello there.\"}],\"temperature\":0,\"max_tokens\":8}" |
        sed -n 's/.*"cached_tokens":\([0-9]*\).*/\1/p'
}
corrupt() { curl -sS -m 10 "http://127.0.0.1:$port/metrics" | sed -n 's/^kvstash_store_corrupt_files_total \([0-9.e+]*\)$/\1/p'; }
nfiles() { find "$1" -maxdepth 1 -name '*.kvs' 2>/dev/null | wc -l; }

# 1. Without a secret: states are written untagged; the start-up warns.
start_server plain "$tmp/plain.yaml"
chat alpha >/dev/null
sleep 1
stop_server
n=$(( $(nfiles "$disk") + $(nfiles "$shm") ))
check "the unauthenticated server saved states ($n)" test "$n" -gt 0
check "start-up warns: no cache secret, naming the shm directory" \
    grep -q "W serve  store: no cache secret: whoever can write $shm controls this server's output" "$tmp/plain.err"
check "start-up says whom the shm tier is shared with" grep -q "store: shm tier $shm is shared with every kvstash process of uid" "$tmp/plain.err"

# 2. verify: checksums only without the secret (and says so), bad with it.
kc verify >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify without a secret: exit 0 ($rc)" test $rc -eq 0
check "verify without a secret says it cannot authenticate" grep -q "^not authenticated: no cache secret" "$tmp/o"
kc verify --secret-file "$secret" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify with the secret: untagged files are bad, exit 1 ($rc)" test $rc -eq 1
check "verify with the secret: every file bad" grep -q "^$n files checked: 0 good, $n bad$" "$tmp/o"
check "verify with the secret says it authenticated" grep -q "^authenticated: " "$tmp/o"

# 3. A server with the secret refuses them (a miss, counted) and saves its own.
start_server s1 "$tmp/secret.yaml"
c=$(chat alpha)
check "the secret server restores no untagged state (cached_tokens '$c')" test "$c" = 0
k=$(corrupt)
check "the refused states are counted as corrupt ('$k')" test -n "$k" -a "${k%%.*}" != 0 -a "${k%%.*}" != ""
check "start-up says states are authenticated" grep -q "I serve  store: stored states are authenticated" "$tmp/s1.err"
sleep 1
stop_server
start_server s2 "$tmp/secret.yaml"
c=$(chat alpha)
check "its own tagged states restore after a restart (cached_tokens '$c')" test -n "$c" -a "$c" != 0
stop_server

# 4. The secret from the environment works like the file; tagged files verify.
rm -rf "$disk/quarantine" "$shm/quarantine"
find "$disk" "$shm" -maxdepth 1 -name '*.kvs' -newer "$tmp/s1.err" -prune -o -name '*.kvs' -print | xargs -r rm -f
KVSTASH_CACHE_SECRET='a deployment secret, 32 bytes..' kc verify >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify with \$KVSTASH_CACHE_SECRET: the tagged files are good, exit 0 ($rc)" test $rc -eq 0
check "verify with \$KVSTASH_CACHE_SECRET authenticated" grep -q "^authenticated: " "$tmp/o"
KVSTASH_CACHE_SECRET='another secret of 32 bytes.....' kc verify >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify with another secret: exit 1 ($rc)" test $rc -eq 1

# 5. A secret that cannot be used stops the server before the model loads.
chmod 644 "$secret"
timeout 20 "$BIN" serve -m "$MODEL" --cache-secret-file "$secret" >/dev/null 2>"$tmp/e"; rc=$?
check "a secret file readable by others: exit 2 ($rc)" test $rc -eq 2
check "... naming the file, not its content" grep -q "cache secret file $secret: readable or writable by others" "$tmp/e"
check "... never the secret" test -z "$(grep 'deployment secret' "$tmp/e")"
KVSTASH_CACHE_SECRET=short timeout 20 "$BIN" serve -m "$MODEL" >/dev/null 2>"$tmp/e"; rc=$?
check "a short \$KVSTASH_CACHE_SECRET: exit 2 ($rc)" test $rc -eq 2
timeout 20 "$BIN" serve -m "$MODEL" --cache-secret-file "$tmp/none" >/dev/null 2>"$tmp/e"; rc=$?
check "a missing secret file: exit 2 ($rc)" test $rc -eq 2

[ "$fails" -eq 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
