#!/usr/bin/env bash
# CLI tests of `kvstash cache ls|stats|verify|gc|rm` on store directories filled
# by real server runs (tiny model): listings match the files, verify names a
# corrupted file and exits 1, gc enforces a budget and cleans up, rm removes,
# bad usage exits 2 with a message (--redis settings included; Redis itself is
# in tests/e2e/redis.test.mjs), a missing directory exits 2 naming it,
# the shm tier is acted on only when --shm-dir names it. Every directory is
# inside our own temp dir (--cache-dir is always given, and without --shm-dir
# only read-only commands run: ~/.cache and /dev/shm are never used).
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?KS_TINY_MODEL not set}

disk=$tmp/disk
shm=$tmp/shm
cfg=$tmp/kvstash.yaml
# Small stride and min_tokens so that short prompts are saved; the default
# reasons put cold saves on disk and finish saves in shm: both tiers get files.
cat >"$cfg" <<EOF
store:
  enabled: true
  cache_dir: $disk
  shm_dir: $shm
  stride: 16
  min_tokens: 32
EOF
# kc SUB ARGS...: `kvstash cache SUB` on our directories.
kc() { local sub=$1; shift; "$BIN" cache "$sub" --cache-dir "$disk" --shm-dir "$shm" "$@"; }

# start_server N: runs `kvstash serve` in the background ($spid), sets $port.
start_server() {
    port=
    "$BIN" serve -m "$MODEL" --port 0 --threads 1 --slots 2 --ctx 512 --log info --config "$cfg" \
        >/dev/null 2>"$tmp/serve$1.err" &
    spid=$!
    for _ in $(seq 600); do
        port=$(sed -n 's/^kvstash: port=\([0-9]*\)$/\1/p' "$tmp/serve$1.err")
        [ -n "$port" ] && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        echo "server $1 did not start:"; cat "$tmp/serve$1.err"; exit 1
    fi
}
# stop_server: SIGTERM, the exit status in $src.
stop_server() {
    kill -TERM "$spid"; wait "$spid"; src=$?; spid=
}
# chat TOPIC: one greedy turn whose system prompt starts with TOPIC (~110 tokens).
chat() {
    local sys="" i
    for i in 1 2 3; do sys+="$1: you are a careful assistant who answers briefly. "; done
    curl -sS -m 60 -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/chat/completions" \
        -d "{\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"Hello there.\"}],\"temperature\":0,\"max_tokens\":8}"
}
nfiles() { find "$1" -maxdepth 1 -name '*.kvs' 2>/dev/null | wc -l; }
dirbytes() { find "$1" -maxdepth 1 -name '*.kvs' -printf '%s\n' 2>/dev/null | awk '{s+=$1} END {print s+0}'; }

# 0. Absent directories are an error naming them, not an empty cache (issue 13,
# finding 9: a mistyped --cache-dir used to exit 0); a file given as a
# directory is "not a directory" (finding 10: verify said "input/output error").
for sub in ls stats verify gc rm; do
    args=(); [ $sub = rm ] && args=(--all)
    kc $sub "${args[@]}" >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "$sub on an absent --cache-dir: exit 2 ($rc)" test $rc -eq 2
    check "$sub on an absent --cache-dir: names it" grep -q -- "--cache-dir $disk: no such directory" "$tmp/e"
    mkdir -p "$disk"
    kc $sub "${args[@]}" >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "$sub on an absent --shm-dir: exit 2 ($rc)" test $rc -eq 2
    check "$sub on an absent --shm-dir: names it" grep -q -- "--shm-dir $shm: no such directory" "$tmp/e"
    rmdir "$disk"
    touch "$tmp/afile"
    "$BIN" cache $sub "${args[@]}" --cache-dir "$tmp/afile" --shm-dir "$shm" >"$tmp/o" 2>"$tmp/e"; rc=$?
    check "$sub on a file as --cache-dir: exit 2 ($rc)" test $rc -eq 2
    check "$sub on a file as --cache-dir: not a directory" grep -q -- "--cache-dir $tmp/afile: not a directory" "$tmp/e"
    check "$sub on a file as --cache-dir: no I/O error" test -z "$(grep -i 'input/output' "$tmp/e")"
done
mkdir -p "$disk" "$shm"
kc ls >"$tmp/o" 2>"$tmp/e"; rc=$?
check "ls on empty dirs: exit 0 ($rc)" test $rc -eq 0
check "ls on empty dirs: says the cache is empty" grep -q "the cache is empty" "$tmp/e"
kc verify >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify on empty dirs: exit 0 ($rc)" test $rc -eq 0
check "verify on empty dirs: 0 files" grep -q "^0 files checked: 0 good, 0 bad$" "$tmp/o"
rmdir "$disk" "$shm"

# 1. Fill the store: three conversations, then a clean shutdown.
start_server 1
for t in Alpha Bravo Charlie; do chat "$t" >"$tmp/r_$t"; done
stop_server
check "server 1 exits 0 ($src)" test $src -eq 0
check "server 1 answered" grep -q '"finish_reason"' "$tmp/r_Alpha"
nd=$(nfiles "$disk"); ns=$(nfiles "$shm")
check "disk tier has files ($nd)" test "$nd" -gt 0
check "shm tier has files ($ns)" test "$ns" -gt 0

# 2. A second run replays a conversation: a store hit, whose count lands in the trailer.
start_server 2
chat Alpha >"$tmp/r2"
stop_server
check "server 2 exits 0 ($src)" test $src -eq 0
check "server 2 restored from the store" grep -q '"mode":"store"' "$tmp/r2"
check "replayed reply equals the first one" test "$(sed 's/.*"content":"\([^"]*\)".*/\1/' "$tmp/r2")" = \
    "$(sed 's/.*"content":"\([^"]*\)".*/\1/' "$tmp/r_Alpha")"
nd=$(nfiles "$disk"); ns=$(nfiles "$shm"); n=$((nd + ns))

# 3. ls
kc ls >"$tmp/ls" 2>"$tmp/e"; rc=$?
check "ls: exit 0 ($rc)" test $rc -eq 0
check "ls: header" grep -Eq '^KEY +TOKENS +BYTES +TIER +REASON +AGE +IDLE +HITS +MODEL +KV$' "$tmp/ls"
check "ls: one row per file ($n)" test "$(tail -n +2 "$tmp/ls" | wc -l)" -eq "$n"
check "ls: disk rows ($nd)" test "$(awk 'NR>1 && $4=="disk"' "$tmp/ls" | wc -l)" -eq "$nd"
check "ls: shm rows ($ns)" test "$(awk 'NR>1 && $4=="shm"' "$tmp/ls" | wc -l)" -eq "$ns"
check "ls: reasons are save reasons" test "$(awk 'NR>1 && $5!~/^(cold|continued|finish|evict|shutdown)$/' "$tmp/ls" | wc -l)" -eq 0
check "ls: one model" test "$(awk 'NR>1 {print $9}' "$tmp/ls" | sort -u | wc -l)" -eq 1
check "ls: the K/V types its server registered (f16/f16)" test "$(awk 'NR>1 {print $10}' "$tmp/ls" | sort -u)" = "f16/f16"
check "ls: a row shows the hit of run 2" test "$(awk 'NR>1 && $8>=1 && $7!="-"' "$tmp/ls" | wc -l)" -ge 1
keys_ok=1
for k in $(awk 'NR>1 {print $1}' "$tmp/ls"); do
    compgen -G "$disk/$k*.kvs" >/dev/null || compgen -G "$shm/$k*.kvs" >/dev/null || keys_ok=0
done
check "ls: every key names a file" test $keys_ok -eq 1
f1=$(find "$disk" -maxdepth 1 -name '*.kvs' | sort | head -1)
k1=$(basename "$f1" .kvs)
kc ls "${k1:0:10}" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "ls KEYPREFIX: exit 0 ($rc)" test $rc -eq 0
check "ls KEYPREFIX: exactly that entry" test "$(tail -n +2 "$tmp/o" | awk '{print $1}')" = "${k1:0:12}"
check "ls KEYPREFIX (upper case) matches too" test "$(kc ls "$(echo "${k1:0:10}" | tr a-f A-F)" | tail -n +2 | wc -l)" -eq 1
nomatch=$(printf '%s' "${k1:0:1}" | tr '0-9a-f' '1-9a-f0')0000000000000
kc ls "$nomatch" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "ls with no match: exit 0, no rows, message ($rc)" \
    test $rc -eq 0 -a "$(tail -n +2 "$tmp/o" | wc -l)" -eq 0 -a -n "$(grep 'no entry matches' "$tmp/e")"

# 3b. Without --shm-dir no shm directory is touched (issue 13, finding 9:
# the default /dev/shm/kvstash-<uid> is shared by every server of the user):
# only the disk tier is listed, and stats says the shm tier is not included.
timeout 60 "$BIN" cache ls --cache-dir "$disk" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "ls without --shm-dir: exit 0 ($rc)" test $rc -eq 0
check "ls without --shm-dir: the disk rows only ($nd)" \
    test "$(tail -n +2 "$tmp/o" | wc -l)" -eq "$nd" -a "$(awk 'NR>1 && $4!="disk"' "$tmp/o" | wc -l)" -eq 0
timeout 60 "$BIN" cache stats --cache-dir "$disk" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "stats without --shm-dir: exit 0 ($rc)" test $rc -eq 0
check "stats without --shm-dir: shm not included" grep -Eq '^shm +- +- +not included \(give --shm-dir DIR\)$' "$tmp/o"
check "stats without --shm-dir: no /dev/shm" test -z "$(grep /dev/shm "$tmp/o" "$tmp/e")"
check "stats without --shm-dir: total is the disk's ($nd)" test "$(awk '$1=="total" {print $2}' "$tmp/o")" = "$nd"
timeout 60 "$BIN" cache verify --cache-dir "$disk" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify without --shm-dir: the disk files only ($nd)" grep -q "^$nd files checked: $nd good, 0 bad$" "$tmp/o"
"$BIN" cache --help >"$tmp/o" 2>&1
check "--help says shm is only acted on with --shm-dir" grep -q "Without it no shm directory is touched" "$tmp/o"

# 4. stats
kc stats >"$tmp/st" 2>"$tmp/e"; rc=$?
check "stats: exit 0 ($rc)" test $rc -eq 0
check "stats: disk entries ($nd)" test "$(awk '$1=="disk" {print $2}' "$tmp/st")" = "$nd"
check "stats: shm entries ($ns)" test "$(awk '$1=="shm" {print $2}' "$tmp/st")" = "$ns"
check "stats: total entries ($n)" test "$(awk '$1=="total" {print $2}' "$tmp/st")" = "$n"
check "stats: no temp or quarantined files" test "$(grep -c 'temp files 0, quarantined 0$' "$tmp/st")" -eq 2
check "stats: hits counted" grep -Eq 'hits [1-9]' "$tmp/st"

# 5. verify: all good, then a flipped payload byte is named.
kc verify >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify: exit 0 ($rc)" test $rc -eq 0
check "verify: all good" grep -q "^$n files checked: $n good, 0 bad$" "$tmp/o"
sz=$(stat -c %s "$f1")
off=$((sz - 32 - 100)) # in the payload: before the 8-byte checksum and the 24-byte trailer
byte=$(od -An -tu1 -j "$off" -N1 "$f1" | tr -d ' ')
printf "\\$(printf '%03o' $(((byte ^ 0x5a) & 255)))" | dd of="$f1" bs=1 seek="$off" conv=notrunc status=none
kc verify >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify with a corrupted file: exit 1 ($rc)" test $rc -eq 1
check "verify names the corrupted file" grep -q "^bad: $f1: ECORRUPT" "$tmp/o"
check "verify names only it" test "$(grep -c '^bad: ' "$tmp/o")" -eq 1
check "verify counts it" grep -q "^$n files checked: $((n - 1)) good, 1 bad$" "$tmp/o"
check "verify changed nothing" test -f "$f1" -a ! -d "$disk/quarantine"

# 6. gc: removes dead writers' temp files, bad files (truncated: a bad header),
# quarantined files, and evicts down to --max-bytes.
f2=$(find "$disk" -maxdepth 1 -name '*.kvs' | sort | sed -n 2p)
truncate -s 100 "$f2"
deadpid=4194300
while kill -0 "$deadpid" 2>/dev/null; do deadpid=$((deadpid - 1)); done
touch "$disk/.0123456789abcdef.$deadpid.1.tmp"
mkdir -p "$shm/quarantine" && echo junk >"$shm/quarantine/0123.kvs.1.1"
kc stats >"$tmp/o" 2>&1
check "stats sees the temp and quarantined files" test "$(grep -c 'temp files 1, quarantined 0$' "$tmp/o")" -eq 1 -a \
    "$(grep -c 'temp files 0, quarantined 1$' "$tmp/o")" -eq 1
kc gc --max-bytes 100000000 >"$tmp/o" 2>"$tmp/e"; rc=$?
check "gc: exit 0 ($rc)" test $rc -eq 0
check "gc: dead temp file removed" test ! -e "$disk/.0123456789abcdef.$deadpid.1.tmp"
check "gc: truncated file gone" test ! -e "$f2"
check "gc: reports the bad file" grep -q '^disk: .* 1 bad files' "$tmp/o"
check "gc: quarantine purged" test ! -e "$shm/quarantine/0123.kvs.1.1"
check "gc: large budget evicts nothing" test "$(grep -c 'evicted 0 entries' "$tmp/o")" -eq 2
budget=60000
kc gc --max-bytes "$budget" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "gc --max-bytes $budget: exit 0 ($rc)" test $rc -eq 0
check "gc: disk within budget ($(dirbytes "$disk"))" test "$(dirbytes "$disk")" -le $budget
check "gc: shm within budget ($(dirbytes "$shm"))" test "$(dirbytes "$shm")" -le $budget
check "gc: evicted something" grep -Eq 'evicted [1-9][0-9]* entries' "$tmp/o"
kc gc --max-bytes 50K >"$tmp/o" 2>"$tmp/e"; rc=$?
check "gc --max-bytes 50K: exit 0 ($rc)" test $rc -eq 0
check "gc: 50K suffix understood" test "$(dirbytes "$disk")" -le 51200 -a "$(dirbytes "$shm")" -le 51200
check "gc: the default pin share" test "$(grep -c 'pins within 50% of it' "$tmp/o")" -eq 2
# Regression (issue 30): gc took the pin share from the defaults, whatever the
# servers were configured with; --config reads their YAML: budgets and share.
cat >"$tmp/gc.yaml" <<EOF
store:
  pin_share: 0.25
  tiers: { shm: { max_bytes: 40960 }, disk: { max_bytes: 40960 } }
EOF
kc gc --config "$tmp/gc.yaml" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "gc --config: exit 0 ($rc)" test $rc -eq 0
check "gc --config: the configured pin share" test "$(grep -c 'pins within 25% of it' "$tmp/o")" -eq 2
check "gc --config: the configured budgets" test "$(grep -c 'budget 40.0K,' "$tmp/o")" -eq 2 -a \
    "$(dirbytes "$disk")" -le 40960 -a "$(dirbytes "$shm")" -le 40960

# 7. rm
kc rm --all >"$tmp/o" 2>"$tmp/e"; rc=$?
check "rm --all: exit 0 ($rc)" test $rc -eq 0
check "rm --all: no files left" test "$(nfiles "$disk")" -eq 0 -a "$(nfiles "$shm")" -eq 0
start_server 3
for t in Delta Echo; do chat "$t" >/dev/null; done
stop_server
check "server 3 exits 0 ($src)" test $src -eq 0
n=$(($(nfiles "$disk") + $(nfiles "$shm")))
k=$(basename "$(find "$disk" "$shm" -maxdepth 1 -name '*.kvs' | sort | head -1)" .kvs)
kc rm "${k:0:16}" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "rm KEYPREFIX: exit 0 ($rc)" test $rc -eq 0
check "rm KEYPREFIX: reports the key" grep -q "^removed $k " "$tmp/o"
check "rm KEYPREFIX: the file is gone" test ! -e "$disk/$k.kvs" -a ! -e "$shm/$k.kvs"
check "rm KEYPREFIX: the others stay" test $(($(nfiles "$disk") + $(nfiles "$shm"))) -eq $((n - 1))
kc rm "${k:0:16}" >"$tmp/o" 2>"$tmp/e"; rc=$?
check "rm of a missing key: exit 1 ($rc)" test $rc -eq 1
check "rm of a missing key: message" grep -q "no entry matches" "$tmp/e"
kc rm --all >"$tmp/o" 2>"$tmp/e"; rc=$?
check "rm --all: reports the count" grep -q "^removed $((n - 1)) entries$" "$tmp/o"
kc ls >"$tmp/o" 2>"$tmp/e"
check "ls after rm --all: empty" grep -q "the cache is empty" "$tmp/e"

# 8. Bad usage: exit 2 with a message on stderr.
usage_case() { # name, expected stderr pattern, args...
    local name=$1 pat=$2; shift 2
    "$BIN" cache "$@" >"$tmp/o" 2>"$tmp/e"; local rc=$?
    check "usage: $name: exit 2 ($rc)" test $rc -eq 2
    check "usage: $name: message" grep -q -- "$pat" "$tmp/e"
}
D=(--cache-dir "$disk" --shm-dir "$shm")
usage_case "no command" "usage: kvstash cache"
usage_case "unknown command" "unknown command 'frob'" frob "${D[@]}"
usage_case "unknown option" "unknown option '--bogus'" ls --bogus "${D[@]}"
usage_case "not a key prefix" "'zz' is not a key prefix" ls zz "${D[@]}"
usage_case "two key prefixes" "unexpected argument 'ab'" rm aa ab "${D[@]}"
usage_case "rm without a target" "give either --all or a KEYPREFIX" rm "${D[@]}"
usage_case "rm with both" "give either --all or a KEYPREFIX" rm --all abc "${D[@]}"
usage_case "ls --all" "--all is for rm" ls --all "${D[@]}"
usage_case "verify with a prefix" "takes no key prefix" verify abc "${D[@]}"
usage_case "stats --all" "takes no key prefix" stats --all "${D[@]}"
usage_case "gc with a prefix" "takes no key prefix" gc abc "${D[@]}"
echo "store: { pin_share: 2 }" >"$tmp/bad.yaml"
usage_case "gc --config out of range" "--config $tmp/bad.yaml: .*pin_share" gc --config "$tmp/bad.yaml" "${D[@]}"
usage_case "bad --max-bytes" "--max-bytes must be a size" gc --max-bytes lots "${D[@]}"
usage_case "--max-bytes nan" "--max-bytes must be a size" gc --max-bytes nan "${D[@]}"
usage_case "--max-bytes beyond 1024T" "--max-bytes must be a size in \[0, 1024T\]" gc --max-bytes 1025T "${D[@]}"
usage_case "missing value" "--cache-dir needs a value" ls --shm-dir "$shm" --cache-dir
usage_case "empty directory" "--cache-dir: invalid directory" ls --cache-dir= --shm-dir "$shm"
# --redis (tests/e2e/redis.test.mjs runs it against a real redis-server): its
# settings are checked before anything is read or connected.
usage_case "--redis-prefix alone" "need --redis URL" ls --redis-prefix p "${D[@]}"
usage_case "--redis-tls-* alone" "need --redis URL" ls --redis-tls-insecure "${D[@]}"
usage_case "bad --redis URL" "expected redis://" ls --redis http://h:1
usage_case "TLS with redis://" "need a rediss:// URL, not redis://u:[*][*][*]@h:1" ls --redis redis://u:pw@h:1 --redis-tls-insecure
usage_case "a missing CA file" "ca_file '$tmp/none.pem'" ls --redis rediss://h:1 --redis-tls-ca "$tmp/none.pem"
usage_case "a prefix with a space" "--redis-prefix" ls --redis redis://h:1 --redis-prefix "a b"
"$BIN" cache stats --redis "unix://$tmp/none.sock" >/dev/null 2>"$tmp/e"; rc=$?
check "an unreachable Redis: exit 1 ($rc)" test $rc -eq 1
check "an unreachable Redis: named" grep -q "redis unix://$tmp/none.sock: connect to" "$tmp/e"
"$BIN" cache --help >"$tmp/o" 2>"$tmp/e"; rc=$?
check "--help: exit 0 with usage on stdout ($rc)" test $rc -eq 0 -a -n "$(grep 'usage: kvstash cache' "$tmp/o")"

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
