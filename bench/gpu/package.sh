#!/usr/bin/env bash
# bench/gpu/package.sh — builds the carry folder for the GPU benchmark
# (bench/gpu/run.sh), on a CPU machine of the project: everything the run
# needs that the GPU machine lacks, compressed, in build/gpu-carry/ (git-ignored,
# at most 64 MiB in all — the device tool's carry limit):
#   payload.tar.zst   (zstd -19) holding
#     bin/kvstash                  stripped
#     bin/cuda_invariance          tests/gpu/cuda_invariance.c: lone rows against prefills on the GPU
#     bin/jq                       for tests/gpu/test_*.sh (run.sh's gputests step)
#     lib/libkvstash.so*           the library (for completeness; kvstash links it statically)
#     llama/lib/                   the prebuilt libllama, libggml, libggml-base (no prebuilt
#                                  CPU variants: the patched module is used), and setup's
#                                  CUDA module libks-ggml-cuda.so (stripped) with its .id
#     llama/cpu/{zen4,cooperlake,haswell}/   the patched CPU module for three x86
#                                  levels (KS_CPU_VARIANT): run.sh picks one by /proc/cpuinfo
#                                  (the GPU machine's Xeon has AVX-512 VNNI and BF16; zen4
#                                  adds VBMI, which not every Xeon has)
#     debs/                        the Debian 12 libraries kvstash and llama-server need
#                                  beyond glibc, libstdc++ and libgcc (ldd)
#     peer/                        llama-server of the same source (PEER_GPU=cuda
#                                  bench/peer.sh: haswell CPU, loadable backends) and its
#                                  libraries, stripped; run.sh links the CUDA module above
#                                  in as libggml-cuda.so, so both servers run the same kernels
#     MANIFEST                     what is in it, with sizes and the builds' ids
#   zstd/                          the zstd binary and its libraries, for a machine without zstd
# Builds what is missing first (each step is a no-op when done): kvstash
# (make build), the CUDA module (KS_GPU=cuda KS_CUDA_ARCHS=$ARCHS scripts/setup.sh,
# which adopts build/deps/cuda when it holds a finished build of the same
# source and flags), the CPU variants (KS_CPU_VARIANT), the peer.
#
# usage: bench/gpu/package.sh      (environment: ARCHS [90a], JOBS [2])
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DEPS=$ROOT/build/deps
LIB=$DEPS/llama/lib
DEST=$ROOT/build/gpu-carry
ARCHS=${ARCHS:-90a}
JOBS=${JOBS:-2}
LIMIT=$((64 * 1024 * 1024))
say() { echo "package: $*" >&2; }
t0=$(date +%s)

# --- what to carry, built when missing ---------------------------------------
command -v zstd >/dev/null || { say "zstd is required (apt-get install zstd)"; exit 1; }
[ -x "$ROOT/build/kvstash" ] || make -C "$ROOT" build JOBS="$JOBS"
if [ ! -f "$LIB/libks-ggml-cuda.so" ]; then
    say "no CUDA module in $LIB: KS_GPU=cuda KS_CUDA_ARCHS=$ARCHS scripts/setup.sh (adopts build/deps/cuda; ~35 min if it has to build)"
    KS_GPU=cuda KS_CUDA_ARCHS=$ARCHS bash "$ROOT/scripts/setup.sh" "$DEPS"
fi
[ -f "$LIB/libks-ggml-cuda.so" ] || { say "the CUDA module is still missing (a CUDA build running? see build/deps/cuda/build.log)"; exit 1; }
KS_CPU_VARIANT=cooperlake,haswell bash "$ROOT/scripts/setup.sh" "$DEPS"
PEER_GPU=cuda bash "$ROOT/bench/peer.sh" build >/dev/null
PEERBIN=$ROOT/build/peer-cuda/build/bin

# --- staging -------------------------------------------------------------------
st=$DEST.tmp/stage
rm -rf "$DEST.tmp" && mkdir -p "$st"/{bin,lib,llama/lib,debs,peer}
strip -o "$st/bin/kvstash" "$ROOT/build/kvstash"
strip -o "$st/bin/cuda_invariance" "$ROOT/build/cuda_invariance"
# jq for the gpu-labelled tests (run.sh's gputests step); its libraries go with the others
cp /usr/bin/jq "$st/bin/jq"
cp -a "$ROOT"/build/libkvstash.so* "$st/lib/" 2>/dev/null || true
for f in libllama.v0.5.0.so libggml.v0.5.0.so libggml-base.so libks-ggml-cuda.id; do cp "$LIB/$f" "$st/llama/lib/"; done
ln -s libllama.v0.5.0.so "$st/llama/lib/libllama.so"
ln -s libggml.v0.5.0.so "$st/llama/lib/libggml.so"
# setup installs the module stripped already; strip again in case it was not
strip --strip-unneeded -o "$st/llama/lib/libks-ggml-cuda.so" "$LIB/libks-ggml-cuda.so"
# The patched CPU modules: this machine's own (the stamp's variant) and the variants built for packaging.
own=$(sed 's/.*-//' "$LIB/libks-ggml-cpu.id")
for v in zen4 cooperlake haswell; do
    mkdir -p "$st/llama/cpu/$v"
    if [ "$v" = "$own" ]; then src=$LIB; else src=$DEPS/cpu-variants/$v; fi
    [ -f "$src/libks-ggml-cpu.so" ] || { say "no patched CPU module for $v (KS_CPU_VARIANT=$v scripts/setup.sh)"; exit 1; }
    cp "$src/libks-ggml-cpu.so" "$src/libks-ggml-cpu.id" "$st/llama/cpu/$v/"
done
# llama-server and the libraries of its build (libggml-cuda.so is linked in by run.sh)
cp "$PEERBIN/llama-server" "$st/peer/"
for f in "$PEERBIN"/*.so*; do
    case $(basename "$f") in libggml-cuda.so) continue ;; esac
    cp -a "$f" "$st/peer/"
done
for f in "$st"/peer/*; do [ -L "$f" ] || strip --strip-unneeded "$f" 2>/dev/null || true; done
# Debian libraries: what ldd resolves outside the directories carried, less
# the C and C++ runtimes (the GPU machine's own are newer; CUDA needs those).
# The CUDA libraries are the GPU machine's own (the CUDA 13 runtime is installed there).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libllama|libggml|libkvstash|libmtmd|libllama-common|libcu|libnv)'
for b in "$ROOT/build/kvstash" /usr/bin/jq "$PEERBIN/llama-server" "$PEERBIN"/*.so; do
    [ "$(basename "$b")" = libggml-cuda.so ] && continue
    LD_LIBRARY_PATH=$LIB:$PEERBIN ldd "$b" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    cp -L "$path" "$st/debs/$name"
done
{
    echo "kvstash $(git -C "$ROOT" describe --always --dirty 2>/dev/null) built $(date -u +%FT%TZ) on $(uname -n)"
    echo "cuda module: $(cat "$LIB/libks-ggml-cuda.id")"
    echo "cpu modules: $(cat "$st"/llama/cpu/*/libks-ggml-cpu.id | tr '\n' ' ')"
    echo "peer: $("$PEERBIN/llama-server" --version 2>&1 | grep -m1 version)"
    (cd "$st" && find . -type f -printf '%10s %p\n' | sort -k2)
} >"$st/MANIFEST"

# --- compression ----------------------------------------------------------------
mkdir -p "$DEST.tmp/out/zstd"
tar cf - -C "$st" . | zstd -19 -T"$JOBS" -q -o "$DEST.tmp/out/payload.tar.zst"
z=$(command -v zstd)
cp "$z" "$DEST.tmp/out/zstd/zstd"
ldd "$z" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | grep -Ev '/(libc|libm|libpthread|libdl|librt)\.so' |
    while read -r l; do cp -L "$l" "$DEST.tmp/out/zstd/"; done
total=$(du -cb "$DEST.tmp/out"/payload.tar.zst "$DEST.tmp/out"/zstd/* | tail -n 1 | cut -f1)
if [ "$total" -gt "$LIMIT" ]; then
    say "the carry is $((total / 1048576)) MiB, over 64 MiB; nothing replaced"
    exit 1
fi
rm -rf "$DEST" && mv "$DEST.tmp/out" "$DEST" && rm -rf "$DEST.tmp"
say "$DEST: $(du -sh "$DEST/payload.tar.zst" | cut -f1) payload + $(du -sh "$DEST/zstd" | cut -f1) zstd = $((total / 1048576)).$(((total % 1048576) * 10 / 1048576)) MiB ($(($(date +%s) - t0)) s)"
