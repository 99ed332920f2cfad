#!/usr/bin/env bash
# Regression test for issue 13, findings 7 and 10: every numeric setting of
# `kvstash serve` that is both a flag and a YAML key accepts the same range
# in both (config.h holds one constant for each), and a size too large for
# the server's arithmetic is refused with a message naming the flag or key.
#
# No model is loaded: without -m, an accepted value gets as far as "no model"
# (exit 2), a refused one stops at its range error (exit 2, another message).
. "$(dirname "$0")/lib.sh"

# run KIND ARG: `kvstash serve` with the flag ARG (KIND flag, "--x=V") or
# with a --config file holding ARG (KIND yaml); its stderr in $tmp/e.
run() { # kind, arg
    if [ "$1" = flag ]; then
        timeout 20 "$BIN" serve "$2" >/dev/null 2>"$tmp/e"
    else
        printf '%s\n' "$2" >"$tmp/c.yaml"
        timeout 20 "$BIN" serve --config "$tmp/c.yaml" >/dev/null 2>"$tmp/e"
    fi
}
accepted() { # kind, arg
    run "$1" "$2"; local rc=$? a=${2//$'\n'/ | }
    check "$1 '$a' accepted (rc $rc: $(head -c 160 "$tmp/e" | head -1))" grep -q "no model" "$tmp/e"
}
refused() { # kind, arg, what the message must name
    run "$1" "$2"; local rc=$? a=${2//$'\n'/ | }
    check "$1 '$a' refused naming $3 (rc $rc: $(head -1 "$tmp/e"))" \
        test $rc -eq 2 -a -n "$(grep -F -- "$3" "$tmp/e")" -a -z "$(grep 'no model' "$tmp/e")"
}

# flag, YAML key, lowest, highest: both must take exactly [lo, hi].
while read -r flag key lo hi; do
    accepted flag "--$flag=$lo"
    accepted flag "--$flag=$hi"
    refused flag "--$flag=$((lo - 1))" "--$flag"
    refused flag "--$flag=$((hi + 1))" "--$flag"
    accepted yaml "$key: $lo"
    accepted yaml "$key: $hi"
    refused yaml "$key: $((lo - 1))" "'$key'"
    refused yaml "$key: $((hi + 1))" "'$key'"
done <<'EOF'
port port 0 65535
slots slots 1 256
ctx ctx 64 16777216
batch batch 1 1048576
threads threads 0 4096
max-queue max_queue 1 1000000
max-body-bytes max_body_bytes 1024 1099511627776
ctx-checkpoints ctx_checkpoints 0 32
checkpoint-every checkpoint_every 0 1048576
checkpoint-bytes checkpoint_bytes 0 1125899906842624
EOF

# --swa-checkpoints is llama-server's other name of --ctx-checkpoints.
accepted flag "--swa-checkpoints=32"
refused flag "--swa-checkpoints=33" "--ctx-checkpoints"
# Checkpoint budgets take sizes, in both.
accepted flag "--checkpoint-bytes=64M"
accepted yaml "checkpoint_bytes: 64MiB"
refused flag "--checkpoint-bytes=lots" "--checkpoint-bytes"

# models.<name>.slots: the --slots range too.
accepted yaml $'models:\n  default: { slots: 256 }'
refused yaml $'models:\n  default: { slots: 257 }' "'models.default.slots'"

# --cache-ram is in MiB, store.tiers.ram.max_bytes in bytes: the same bytes.
accepted flag "--cache-ram=1073741824"
refused flag "--cache-ram=1073741825" "--cache-ram"
accepted yaml $'store:\n  enabled: false\n  tiers: { ram: { max_bytes: 1024TiB } }'
refused yaml $'store:\n  enabled: false\n  tiers: { ram: { max_bytes: 1025TiB } }' "'store.tiers.ram.max_bytes'"

# --warm-slots N|all and store.warm_slots: the slots range, from 0.
accepted flag "--warm-slots=0"
accepted flag "--warm-slots=256"
accepted flag "--warm-slots=all"
refused flag "--warm-slots=-1" "--warm-slots"
refused flag "--warm-slots=257" "--warm-slots"
refused flag "--warm-slots=some" "--warm-slots"
accepted yaml $'store:\n  warm_slots: 256'
refused yaml $'store:\n  warm_slots: -1' "'store.warm_slots'"
refused yaml $'store:\n  warm_slots: all' "'store.warm_slots'"

# Sizes far beyond any range: a config error naming the key, not an overflow.
refused yaml "max_body_bytes: 9223372036854775807" "'max_body_bytes'"
refused yaml "max_body_bytes: 8EiB" "'max_body_bytes'"
refused flag "--max-body-bytes=9223372036854775807" "--max-body-bytes"
refused yaml $'store:\n  tiers: { disk: { max_bytes: 9223372036854775807 } }' "'store.tiers.disk.max_bytes'"

# The redis tier's TLS settings (cache/redis_conn.h ks_redis_cfg_prepare): a
# combination that cannot work is refused before the model loads (exit 2,
# the problem named), whether it comes from flags or from the file; the
# checks that need real certificates are in tests/e2e/redis.test.mjs.
run_args() { timeout 20 "$BIN" serve "$@" >/dev/null 2>"$tmp/e"; }
refused_args() { # what the message must name, args...
    local want=$1; shift
    run_args "$@"; local rc=$?
    check "'$*' refused naming '$want' (rc $rc: $(head -1 "$tmp/e"))" \
        test $rc -eq 2 -a -n "$(grep -F -- "$want" "$tmp/e")" -a -z "$(grep 'no model' "$tmp/e")"
}
accepted_args() {
    run_args "$@"; local rc=$?
    check "'$*' accepted (rc $rc: $(head -1 "$tmp/e"))" grep -q "no model" "$tmp/e"
}
: >"$tmp/empty.pem"
tls=rediss://127.0.0.1:1
refused_args "ca_file '$tmp/missing.pem': No such file" --cache-redis $tls --cache-redis-tls-ca "$tmp/missing.pem"
refused_args "ca_dir '$tmp/empty.pem': not a directory" --cache-redis $tls --cache-redis-tls-ca-dir "$tmp/empty.pem"
refused_args "cannot load the CA certificates of ca_file" --cache-redis $tls --cache-redis-tls-ca "$tmp/empty.pem"
refused_args "and its key (key_file) go together" --cache-redis $tls --cache-redis-tls-cert "$tmp/empty.pem"
refused_args "and its key (key_file) go together" --cache-redis $tls --cache-redis-tls-key "$tmp/empty.pem"
refused_args "need a rediss:// URL, not redis://127.0.0.1:1" --cache-redis redis://127.0.0.1:1 --cache-redis-tls-insecure
refused_args "need a rediss:// URL, not unix:///x.sock" --cache-redis unix:///x.sock --cache-redis-tls-server-name r.example
refused_args "without a Redis URL" --cache-redis-tls-ca "$tmp/empty.pem"
# The password stays out of the message.
refused_args "need a rediss:// URL, not redis://u:***@h:1" --cache-redis redis://u:pw-hidden@h:1 --cache-redis-tls-insecure
check "the password is not in the message" test -z "$(grep pw-hidden "$tmp/e")"
# The same from the YAML file, and a flag's URL meeting the file's TLS settings.
printf 'store:\n  tiers:\n    redis:\n      url: redis://127.0.0.1:1\n      tls: { verify: false }\n' >"$tmp/t.yaml"
refused_args "need a rediss:// URL" --config "$tmp/t.yaml"
refused_args "need a rediss:// URL" --config "$tmp/t.yaml" --cache-redis unix:///x.sock
accepted_args --config "$tmp/t.yaml" --cache-redis $tls
printf 'store:\n  tiers:\n    redis:\n      tls: { ca_file: %s }\n' "$tmp/missing.pem" >"$tmp/t.yaml"
refused_args "ca_file '$tmp/missing.pem'" --config "$tmp/t.yaml" --cache-redis $tls
refused yaml $'store:\n  tiers:\n    redis:\n      tls: { colour: red }' "'store.tiers.redis.tls.colour'"
refused yaml $'store:\n  tiers:\n    redis:\n      tls: { verify: maybe }' "'store.tiers.redis.tls.verify'"
# Without a file or name, rediss:// uses the system's CA certificates.
accepted_args --cache-redis $tls
accepted_args --cache-redis $tls --cache-redis-tls-insecure

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
