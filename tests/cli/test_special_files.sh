#!/usr/bin/env bash
# Regression test for issue 13, finding 2: a FIFO named like a store file
# hung the server (at start it never became ready; created at run time, the
# rescan on the inference thread stopped every generation while /health said
# 200) and `kvstash cache ls|stats|verify`. Now every name that is not a
# regular file (FIFO, directory, socket, symlink) is skipped without a
# blocking open: the server starts and serves, the cache commands finish.
# Every wait is bounded (curl -m, timeout), so a hang fails the test instead
# of hanging CI. Directories are inside our own temp dir.
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?KS_TINY_MODEL not set}

disk=$tmp/disk
shm=$tmp/shm
mkdir -p "$disk" "$shm"
cat >"$tmp/kvstash.yaml" <<EOF
store:
  enabled: true
  cache_dir: $disk
  shm_dir: $shm
  stride: 16
  min_tokens: 32
EOF
# name N: a valid store file name (64 hex digits + .kvs), distinct per N.
name() { printf '%064x.kvs' "$1"; }
# special DIR N: a FIFO, a directory and a symlink (to a file outside) under
# store file names N, N+1, N+2; a Unix socket under N+3 when python3 can bind one.
special() {
    mkfifo "$1/$(name "$2")"
    mkdir "$1/$(name $(($2 + 1)))"
    echo not-a-kvfile >"$tmp/target"
    ln -s "$tmp/target" "$1/$(name $(($2 + 2)))"
    if command -v python3 >/dev/null; then
        python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' "$1/$(name $(($2 + 3)))" \
            2>/dev/null || true
    fi
}

# start_server N: `kvstash serve` in the background ($spid), $port once it
# listens; fails the test (and stops) when it does not within 60 s.
start_server() {
    port=
    "$BIN" serve -m "$MODEL" --port 0 --threads 1 --slots 2 --ctx 512 --log info --config "$tmp/kvstash.yaml" \
        >/dev/null 2>"$tmp/serve$1.err" &
    spid=$!
    for _ in $(seq 600); do
        port=$(sed -n 's/^kvstash: port=\([0-9]*\)$/\1/p' "$tmp/serve$1.err")
        [ -n "$port" ] && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    check "server $1 starts" test -n "$port"
    if [ -z "$port" ]; then
        tail -5 "$tmp/serve$1.err"
        echo "$((fails)) check(s) failed"; exit 1
    fi
}
# stop_server N: SIGTERM, at most 30 s, exit status checked.
stop_server() {
    kill -TERM "$spid"
    for _ in $(seq 300); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$spid" 2>/dev/null; then
        check "server $1 stops on SIGTERM" false
        return
    fi
    wait "$spid"; local rc=$?; spid=
    check "server $1 exits 0 ($rc)" test $rc -eq 0
}
# chat TOPIC: one greedy turn whose system prompt starts with TOPIC (~110
# tokens: longer than min_tokens, so it is saved and looked up).
chat() {
    local sys="" i
    for i in 1 2 3; do sys+="$1: you are a careful assistant who answers briefly. "; done
    curl -sS -m 30 -H 'Content-Type: application/json' "http://127.0.0.1:$port/v1/chat/completions" \
        -d "{\"messages\":[{\"role\":\"system\",\"content\":\"$sys\"},{\"role\":\"user\",\"content\":\"Hello there.\"}],\"temperature\":0,\"max_tokens\":8}"
}
answers() { # topic, server
    chat "$1" >"$tmp/r_$1" 2>&1
    check "server $2 answers '$1'" grep -q '"finish_reason"' "$tmp/r_$1"
}
# kc SUB ARGS...: a `kvstash cache` command on our directories, at most 30 s.
kc() { local sub=$1; shift; timeout 30 "$BIN" cache "$sub" --cache-dir "$disk" --shm-dir "$shm" "$@"; }

# 1. Created at run time: the rescans before lookups meet them.
start_server 1
answers Alpha 1
answers Bravo 1
special "$disk" 100
special "$shm" 200
sleep 0.2 # past the 100 ms in which a directory's mtime is not trusted
for t in Charlie Alpha Delta Bravo; do answers $t 1; done
check "server 1: /health" test "$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200
check "server 1 logs the skipped names" grep -q "skipping $disk/$(name 100): not a regular file" "$tmp/serve1.err"
# each name counted once, however often the directories were scanned
nspecial=$(find "$disk" "$shm" -maxdepth 1 -name '*.kvs' ! -type f | wc -l)
curl -s -m 10 "http://127.0.0.1:$port/metrics" >"$tmp/m1"
check "server 1 counts them ($nspecial)" grep -q "^kvstash_store_skipped_files_total $nspecial$" "$tmp/m1"
stop_server 1

# 2. Present at start: the server becomes ready and serves from the store.
special "$disk" 300
special "$shm" 400
start_server 2
answers Alpha 2
check "server 2 restored from the store" grep -q '"mode":"store"' "$tmp/r_Alpha"
answers Echo 2
check "server 2 logs the skipped names at start" grep -q "skipping $shm/$(name 400): not a regular file" "$tmp/serve2.err"

# 3. The cache commands finish next to it, and never read the special files.
# The server's writer may still be saving Echo's state (at idle priority): the
# listing must fall between the kvfiles before and after it.
nkv() { find "$disk" "$shm" -maxdepth 1 -type f -name '*.kvs' | wc -l; }
n0=$(nkv)
kc ls >"$tmp/o" 2>"$tmp/e"; rc=$?
n1=$(nkv)
nls=$(tail -n +2 "$tmp/o" | wc -l)
check "ls: exit 0 ($rc)" test $rc -eq 0
check "ls: lists the kvfiles only ($n0 <= $nls <= $n1)" test "$nls" -ge "$n0" -a "$nls" -le "$n1"
kc stats >"$tmp/o" 2>"$tmp/e"; rc=$?
check "stats: exit 0 ($rc)" test $rc -eq 0
nspecial=$(find "$disk" -maxdepth 1 -name '*.kvs' ! -type f | wc -l)
check "stats: counts the disk's skipped names ($nspecial)" \
    grep -q "skipped $nspecial (not regular files)" "$tmp/o"
kc verify >"$tmp/o" 2>"$tmp/e"; rc=$?
check "verify: exit 0 ($rc)" test $rc -eq 0
check "verify: names each skipped file" \
    test "$(grep -c ': not a regular file$' "$tmp/o")" -eq "$(find "$disk" "$shm" -maxdepth 1 -name '*.kvs' ! -type f | wc -l)"
check "verify: no bad file" grep -Eq '^[0-9]+ files checked: [0-9]+ good, 0 bad; [0-9]+ skipped' "$tmp/o"
kc gc >"$tmp/o" 2>"$tmp/e"; rc=$?
check "gc: exit 0 ($rc)" test $rc -eq 0
kc rm --all >"$tmp/o" 2>"$tmp/e"; rc=$?
check "rm --all: exit 0 ($rc)" test $rc -eq 0
check "the special files are left alone" test -p "$disk/$(name 100)" -a -p "$shm/$(name 400)" -a \
    -d "$disk/$(name 301)" -a -L "$shm/$(name 202)" -a "$(cat "$tmp/target")" = not-a-kvfile
check "nothing was quarantined" test ! -e "$disk/quarantine" -a ! -e "$shm/quarantine"
answers Foxtrot 2
stop_server 2

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
