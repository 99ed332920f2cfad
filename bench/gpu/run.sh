#!/usr/bin/env bash
# bench/gpu/run.sh — the GPU benchmark of issue 26, run ON THE GPU MACHINE from
# the repository root, with the carry folder bench/gpu/package.sh made
# (build/gpu-carry; bench/gpu/README.md says how to get it there). Prepared on
# the CPU machines; it builds nothing and reaches no network.
#
# What it does, bounded so that the whole run fits in BUDGET seconds (default
# 450: under 8 minutes with the unpacking and the model files):
#   1. unpacks the carry into WORK (default /tmp/kvstash-gpu), picks the patched
#      CPU module for this CPU by /proc/cpuinfo (zen4, cooperlake or haswell),
#      checks that every binary finds its libraries (ldd);
#   2. writes the models there: `kvstash mkmodel --preset bench` (0.5B shape,
#      Q8_0) and `--preset bench-8b-q4k` (8B shape, Q4_K);
#   3. per model, kvstash (`serve -ngl all --slots 2 --ctx 16384`, its defaults
#      otherwise) beside llama-server of the same llama.cpp source with the same
#      CUDA module (`-ngl 99 -np 2 -c 32768`, its defaults otherwise), both
#      running, requests one at a time (bench/gpu/clients.py, ports of the
#      node clients of the CPU benchmarks):
#        turns  the 10-turn chat (300-word system prompt, 60-word messages,
#               32-token replies): TTFT per turn, median over turns 5-10
#        long   the conversation growing to ~10K tokens (2000-word system
#               prompt, 800-word messages, 10 turns): median over turns 3-10
#        decode single-stream decode, 5 rounds of 128 tokens
#        exact  cached == uncached, 3 conversations x 6 turns of 128-token
#               greedy replies, for both servers
#        spec   kvstash's speculation (its default n-gram drafts) against the
#               same requests with "speculative.n_max": 0: decode, same replies
#      and with servers of their own: restart (kvstash, the store, new
#      processes), behind (kvstash with the store: a request right behind a
#      finished one against one after a pause), kvq8 (both with -ctk/-ctv q8_0:
#      decode and exact)
#      each step with a deadline and a hard timeout; a step that runs out of
#      time reports what it measured;
#   4. writes everything to OUT (default bench/out/gpu; the device tool's $OUT
#      when set): results.md (all tables), one .md/.json per step and model,
#      env.txt (GPU, driver, CPU flags, builds), the servers' /props and logs.
#
# usage: bench/gpu/run.sh          (environment: OUT, WORK, CARRY, BUDGET,
#                                   MODELS="bench bench-8b-q4k", STEPS="invariance turns long decode exact subagents spec restart behind kvq8",
#                                   NGL=all, PEER_NGL=99, INV_MASKS="63 31 0" (the invariance step's GGML_CUDA_KS_INVARIANT values) — a dry run on a CPU machine:
#                                   MODELS=tiny NGL=0 PEER_NGL=0 bench/gpu/run.sh)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CARRY=${CARRY:-$ROOT/build/gpu-carry}
OUT=${OUT:-$ROOT/bench/out/gpu}
WORK=${WORK:-/tmp/kvstash-gpu}
BUDGET=${BUDGET:-450}
MODELS=${MODELS:-bench bench-8b-q4k}
STEPS=${STEPS:-invariance turns long decode exact subagents spec restart behind kvq8}
NGL=${NGL:-all} PEER_NGL=${PEER_NGL:-99}
T0=$(date +%s)
mkdir -p "$OUT"
RES=$OUT/results.md
say() { echo "gpu-bench [$(($(date +%s) - T0)) s]: $*" | tee -a "$OUT/run.log" >&2; }
left() { echo $((T0 + BUDGET - $(date +%s))); }
pids=()
cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; }
trap cleanup EXIT

# --- 1. unpack -----------------------------------------------------------------
[ -f "$CARRY/payload.tar.zst" ] || { say "no $CARRY/payload.tar.zst: run bench/gpu/package.sh on the CPU machine"; exit 1; }
ZSTD=$(command -v zstd || true)
ZLD=
if [ -z "$ZSTD" ]; then ZSTD=$CARRY/zstd/zstd; ZLD=$CARRY/zstd; fi
rm -rf "$WORK" && mkdir -p "$WORK"
if ! LD_LIBRARY_PATH=$ZLD "$ZSTD" -dc "$CARRY/payload.tar.zst" | tar x -C "$WORK"; then
    say "unpacking failed"; exit 1
fi
say "unpacked $(du -sh "$WORK" | cut -f1) into $WORK"
export LD_LIBRARY_PATH=$WORK/llama/lib:$WORK/debs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export GGML_NO_BACKTRACE=1
KS=$WORK/bin/kvstash
PEER=$WORK/peer/llama-server
# llama-server loads the very CUDA module kvstash does, from its own directory
ln -sf ../llama/lib/libks-ggml-cuda.so "$WORK/peer/libggml-cuda.so"

# The patched CPU module for this CPU (the features of setup_cpu.sh's variants).
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { local f; for f in "$@"; do case $flags in *" $f "*) ;; *) return 1 ;; esac; done; }
AVX512="avx512f avx512cd avx512vl avx512dq avx512bw"
BASE="sse4_2 avx f16c fma avx2 bmi2"
if has $BASE $AVX512 avx512vbmi avx512_vnni avx512_bf16; then cpu=zen4
elif has $BASE $AVX512 avx512_vnni avx512_bf16; then cpu=cooperlake
else cpu=haswell; fi
cp "$WORK/llama/cpu/$cpu/libks-ggml-cpu.so" "$WORK/llama/cpu/$cpu/libks-ggml-cpu.id" "$WORK/llama/lib/"
say "CPU module: $cpu ($(cat "$WORK/llama/lib/libks-ggml-cpu.id"))"

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -a)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv 2>&1
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) ($(nproc) cores); patched CPU module $cpu"
    echo "cuda runtime: $(ldconfig -p 2>/dev/null | grep -o 'libcudart.so.[0-9]*' | sort -u | tr '\n' ' ')"
    echo "llama-server --list-devices: $("$PEER" --list-devices 2>&1 | grep -A4 'Available devices' | tail -n +2 | tr '\n' ' ')"
    echo "carry: $(cat "$WORK/MANIFEST" 2>/dev/null | head -20)"
} >"$OUT/env.txt" 2>&1
# (libcuda.so.1 is the NVIDIA driver's: missing only where there is no GPU, as on a dry run)
missing=$( (ldd "$KS"; ldd "$PEER"; ldd "$WORK/llama/lib/libks-ggml-cuda.so") 2>&1 | grep 'not found' |
    grep -v 'libcuda\.so\.1' | sort -u)
if [ -n "$missing" ]; then say "libraries not found: $missing"; echo "$missing" >"$OUT/ldd-missing.txt"; exit 1; fi

# --- 2. models -----------------------------------------------------------------
mkdir -p "$WORK/models"
for m in $MODELS; do
    t=$(date +%s)
    "$KS" mkmodel --preset "$m" --seed 1 "$WORK/models/$m.gguf" >>"$OUT/run.log" 2>&1 || { say "mkmodel $m failed"; exit 1; }
    say "model $m written ($(($(date +%s) - t)) s, $(du -h "$WORK/models/$m.gguf" | cut -f1))"
done

# --- 3. the servers and the steps ----------------------------------------------------
P_KS=18180 P_PEER=18181
wait_health() { # port, pid, name: 0 when /health answers 200 within 180 s
    local i
    for i in $(seq 1800); do
        kill -0 "$2" 2>/dev/null || { say "$3 exited before it answered"; return 1; }
        python3 - "$1" <<'EOF' 2>/dev/null && return 0
import sys, urllib.request
urllib.request.urlopen(f'http://127.0.0.1:{sys.argv[1]}/health', timeout=2).read()
EOF
        sleep 0.1
    done
    say "$3 did not answer /health in 180 s"
    return 1
}
stop() { # pid: SIGTERM, then SIGKILL after 15 s
    kill -TERM "$1" 2>/dev/null
    for _ in $(seq 150); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$1" 2>/dev/null
}
# step NAME MAX_S ARGS...: clients.py with a deadline of min(MAX_S, what is left - 20 s)
step() {
    local name=$1 max=$2 l
    shift 2
    l=$(($(left) - 20))
    [ "$l" -gt "$max" ] && l=$max
    if [ "$l" -lt 15 ]; then say "$name: skipped, the budget is spent"; echo "_$name: skipped (time budget)_" >>"$RES"; return; fi
    say "$name (up to $l s)"
    echo "### $name" >>"$RES"
    timeout $((l + 30)) python3 "$ROOT/bench/gpu/clients.py" "$@" --deadline $(($(date +%s) + l)) \
        --out "$OUT/$name" >"$OUT/$name.stdout" 2>"$OUT/$name.stderr"
    local rc=$?
    cat "$OUT/$name.stdout" >>"$RES"
    [ $rc -ne 0 ] && { echo "(exit $rc; stderr: $(tail -3 "$OUT/$name.stderr"))" >>"$RES"; say "$name: exit $rc"; }
    echo >>"$RES"
}

# gputests: the gpu-labelled tests (tests/gpu/test_*.sh) against the carried build, on the
# tiny models (they report PASS, FAIL or SKIP)
case " $STEPS " in *" gputests "*)
    for m in tiny tiny-q4k; do
        [ -f "$WORK/models/$m.gguf" ] || "$KS" mkmodel --preset "$m" --seed 1 "$WORK/models/$m.gguf" >>"$OUT/run.log" 2>&1
    done
    : >"$OUT/gputests.md"
    for t in "$ROOT"/tests/gpu/test_*.sh; do
        n=$(basename "$t" .sh)
        PATH=$WORK/bin:$PATH KS_BIN=$KS KS_TINY_MODEL=$WORK/models/tiny.gguf KS_TINY_Q4K_MODEL=$WORK/models/tiny-q4k.gguf \
            KS_CUDA_MODULE=$WORK/llama/lib/libks-ggml-cuda.so KS_CUDA_INVARIANCE=$WORK/bin/cuda_invariance \
            timeout 300 bash "$t" >"$OUT/gputest-$n.log" 2>&1
        rc=$?
        r=PASS; [ $rc = 77 ] && r=SKIP; [ $rc != 0 ] && [ $rc != 77 ] && r="FAIL (exit $rc)"
        echo "- $n: $r" >>"$OUT/gputests.md"
        say "gpu test $n: $r"
    done ;;
esac

echo "# GPU benchmark: kvstash vs llama-server (CUDA, same llama.cpp source and CUDA module)" >"$RES"
echo '```' >>"$RES"; cat "$OUT/env.txt" >>"$RES"; echo '```' >>"$RES"
for m in $MODELS; do
    [ "$(left)" -lt 60 ] && { say "no time left for $m"; echo "_$m: not run (time budget)_" >>"$RES"; continue; }
    model=$WORK/models/$m.gguf
    # invariance: lone rows against prefills on the GPU (tests/gpu/cuda_invariance.c), with the
    # patch's kernels (as kvstash's exact mode sets them) and with the stock ones
    case " $STEPS " in *" invariance "*)
        for inv in ${INV_MASKS:-63 31 0}; do
            echo "### $m-invariance (GGML_CUDA_KS_INVARIANT=$inv)" >>"$RES"
            GGML_CUDA_KS_INVARIANT=$inv timeout 120 "$WORK/bin/cuda_invariance" "$model" "$NGL" \
                >"$OUT/$m-invariance-$inv.md" 2>"$OUT/$m-invariance-$inv.log"
            echo "(exit $?)" >>"$OUT/$m-invariance-$inv.md"
            cat "$OUT/$m-invariance-$inv.md" >>"$RES"
            echo >>"$RES"
        done
        say "$m invariance done" ;;
    esac
    "$KS" serve -m "$model" --port $P_KS -ngl "$NGL" --slots 2 --ctx 16384 --log info >"$OUT/$m-kvstash.log" 2>&1 &
    ks=$!
    pids+=("$ks")
    env -u GGML_CUDA_KS_INVARIANT "$PEER" -m "$model" --host 127.0.0.1 --port $P_PEER -ngl "$PEER_NGL" -np 2 -c 32768 --no-webui >"$OUT/$m-llama-server.log" 2>&1 &
    peer=$!
    pids+=("$peer")
    up=1
    wait_health $P_KS "$ks" "kvstash ($m)" || up=0
    wait_health $P_PEER "$peer" "llama-server ($m)" || up=0
    echo "## $m" >>"$RES"
    grep -m1 'kvstash: listening' "$OUT/$m-kvstash.log" >>"$RES"
    grep -m3 -E 'offloaded|using device' "$OUT/$m-llama-server.log" | sed 's/^/    llama-server: /' >>"$RES"
    echo >>"$RES"
    if [ $up = 0 ]; then
        say "$m: a server did not start (logs in $OUT)"
        echo "_$m: a server did not start; see $m-kvstash.log, $m-llama-server.log_" >>"$RES"
        stop "$ks"; stop "$peer"
        continue
    fi
    python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$P_KS/props').read().decode())" \
        >"$OUT/$m-kvstash-props.json" 2>/dev/null
    U=(http://127.0.0.1:$P_KS http://127.0.0.1:$P_PEER --name kvstash --name llama-server)
    for s in $STEPS; do
        case $s in
        turns) step "$m-turns" 60 turns "${U[@]}" --turns 10 --sys-words 300 --msg-words 60 --max-tokens 32 --summary-from 5 ;;
        long) step "$m-long" 90 turns "${U[@]}" --turns 10 --sys-words 2000 --msg-words 800 --max-tokens 32 --summary-from 3 ;;
        decode) step "$m-decode" 60 decode "${U[@]}" --rounds 5 --max-tokens 128 ;;
        exact) step "$m-exact" 150 exact "${U[@]}" --convs 3 --turns 6 --max-tokens 128 ;;
        subagents) step "$m-subagents" 120 subagents "${U[@]}" --agents 6 --rounds 3 --sys-words 1000 \
            --msg-words 100 --max-tokens 32 ;;
        spec) step "$m-spec" 120 spec http://127.0.0.1:$P_KS --name kvstash --prompts 6 --max-tokens 256 ;;
        esac
    done
    stop "$ks"
    stop "$peer"
    # restart: kvstash alone; turn 6 of a long conversation in a process that
    # ran turns 1-6 (no store), and in a new process after another one ran
    # turns 1-5 on --cache-dir (clients.py restart)
    case " $STEPS " in *" restart "*)
        rs=$WORK/restart-$m
        rm -rf "$rs" && mkdir -p "$rs"
        ok=1
        # The store's directories, shm too, under $rs (a copy for the second
        # resumed process, so that both start from what prep left).
        shm=/dev/shm/kvstash-bench-restart-$m
        rm -rf "$shm" "$shm"2
        for v in "" 2; do
            mkdir -p "$shm$v"
            printf 'store:\n  enabled: true\n  cache_dir: %s\n  shm_dir: %s\n' "$rs/disk$v" "$shm$v" >"$rs/store$v.yaml"
        done
        for phase in warm prep resume resume-warm; do
            store=(--config "$rs/store.yaml")
            [ $phase = warm ] && store=()
            [ $phase = resume ] && { cp -a "$rs/disk" "$rs/disk2"; cp -a "$shm/." "$shm"2/; }
            [ $phase = resume-warm ] && store=(--config "$rs/store2.yaml" --warm-slots all)
            "$KS" serve -m "$model" --port $P_KS -ngl "$NGL" --slots 2 --ctx 16384 "${store[@]}" --log info \
                >"$OUT/$m-restart-$phase.log" 2>&1 &
            ks=$!
            pids+=("$ks")
            wait_health $P_KS "$ks" "kvstash ($m, restart $phase)" || { ok=0; stop "$ks"; break; }
            l=$(($(left) - 20))
            [ "$l" -gt 120 ] && l=120
            [ "$l" -lt 15 ] && { ok=0; stop "$ks"; break; }
            timeout $((l + 30)) python3 "$ROOT/bench/gpu/clients.py" restart http://127.0.0.1:$P_KS --phase $phase \
                --state "$rs/state.json" --turns 6 --sys-words 2000 --msg-words 800 --max-tokens 32 \
                --deadline $(($(date +%s) + l)) --out "$OUT/$m-restart" >"$OUT/$m-restart-$phase.stdout" \
                2>"$OUT/$m-restart-$phase.stderr" || ok=0
            stop "$ks"
        done
        rm -rf "$shm" "$shm"2
        echo "### $m-restart" >>"$RES"
        if [ $ok = 1 ]; then cat "$OUT/$m-restart.md" >>"$RES"; else echo "_not completed (logs in $OUT)_" >>"$RES"; fi
        echo >>"$RES"
        ;;
    esac
    # behind: kvstash alone with the persistent store (finish saves to shm): a
    # request right behind a finished one against one sent after a pause
    case " $STEPS " in *" behind "*)
        bs=$WORK/behind-$m shm=/dev/shm/kvstash-bench-behind-$m
        rm -rf "$bs" "$shm" && mkdir -p "$bs" "$shm"
        printf 'store:\n  enabled: true\n  cache_dir: %s\n  shm_dir: %s\n' "$bs/disk" "$shm" >"$bs/store.yaml"
        "$KS" serve -m "$model" --port $P_KS -ngl "$NGL" --slots 2 --ctx 16384 --config "$bs/store.yaml" --log info \
            >"$OUT/$m-behind.log" 2>&1 &
        ks=$!
        pids+=("$ks")
        if wait_health $P_KS "$ks" "kvstash ($m, behind)"; then
            step "$m-behind" 120 behind http://127.0.0.1:$P_KS --name kvstash --turns 9 --sys-words 2000 --msg-words 800 \
                --max-tokens 32 --pause-s 3
        fi
        stop "$ks"
        rm -rf "$shm" ;;
    esac
    # kvq8: both servers with -ctk q8_0 -ctv q8_0 (issue 38): decode and cached == uncached
    case " $STEPS " in *" kvq8 "*)
        if [ "$(left)" -gt 90 ]; then
            "$KS" serve -m "$model" --port $P_KS -ngl "$NGL" --slots 2 --ctx 16384 -ctk q8_0 -ctv q8_0 --log info \
                >"$OUT/$m-kvq8-kvstash.log" 2>&1 &
            ks=$!
            pids+=("$ks")
            env -u GGML_CUDA_KS_INVARIANT "$PEER" -m "$model" --host 127.0.0.1 --port $P_PEER -ngl "$PEER_NGL" -np 2 -c 32768 \
                -ctk q8_0 -ctv q8_0 -fa on --no-webui >"$OUT/$m-kvq8-llama-server.log" 2>&1 &
            peer=$!
            pids+=("$peer")
            if wait_health $P_KS "$ks" "kvstash ($m, q8_0 K/V)" && wait_health $P_PEER "$peer" "llama-server ($m, q8_0 K/V)"; then
                grep -m1 'kvstash: listening' "$OUT/$m-kvq8-kvstash.log" >>"$RES"
                step "$m-kvq8-decode" 60 decode "${U[@]}" --rounds 5 --max-tokens 128
                step "$m-kvq8-exact" 120 exact "${U[@]}" --convs 3 --turns 6 --max-tokens 128
            fi
            stop "$ks"
            stop "$peer"
        else
            say "$m kvq8: skipped, the budget is spent"; echo "_$m-kvq8: skipped (time budget)_" >>"$RES"
        fi ;;
    esac
    say "$m done"
done
[ -f "$OUT/gputests.md" ] && { echo "### gpu-labelled tests"; cat "$OUT/gputests.md"; } >>"$RES"
say "done in $(($(date +%s) - T0)) s: $RES"
cat "$RES"
