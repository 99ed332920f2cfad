# shellcheck shell=bash
# setup_cpu.sh — stage 4 of scripts/setup.sh, sourced by it (uses its say,
# pinned_source, $top, $DEPS and $LLAMA).
#
# Builds ggml's CPU backend from the pinned llama.cpp source with one small
# patch, scripts/patches/ggml-cpu-batch-invariant.patch, and installs it next
# to the prebuilt libraries as
#   $LLAMA/lib/libks-ggml-cpu.so
# The engine loads it instead of the prebuilt CPU variants (src/engine/engine.c,
# backend_init). Why: the prebuilt sums a one-row product of F16 (and F32)
# matrices in another order than a product of two or more rows (ggml's vec_dot
# against llamafile's tinyBLAS), so a token decoded alone gets K/V and logits
# that differ in the last bits from the same token inside a prefill. The patch
# makes the one-row product sum in tinyBLAS's order (Q8_0 products already
# agree), and flash attention run every query row through its tiled kernel
# (the stock one switches between three kernels by row count and KV length).
# docs/LLAMA_FACTS.md has the measurements.
#
# The module is built for this CPU as ggml's own variant list would pick it
# (zen4, icelake, haswell, ... — the same feature sets as the prebuilt
# variants), against the prebuilt libggml-base.so (same source, same ABI). The
# name does not match ggml's "libggml-cpu-*.so" search pattern, so the prebuilt
# loader never picks it up by accident. Takes about a minute on two cores.
# KS_CPU_VARIANT builds the module for other CPUs too, for packaging (below).
# Idempotent: with the stamp present it does nothing and prints nothing.

CPU_PATCH=$top/scripts/patches/ggml-cpu-batch-invariant.patch
CPU_REV=5 # the patch's revision: 1 matrix products, 2 also flash attention, 3 its decode
          # grouped by K/V head, 4 repacked Q4_K weights (gemv in the gemm's order),
          # 5 flash attention over quantized K/V (q8_0, q4_0, ...) and mixed types
CPU_STAMP=$LLAMA/.ok-cpu-r$CPU_REV # a new revision rebuilds

# ggml's x86 CPU variants (ggml/src/CMakeLists.txt, GGML_CPU_ALL_VARIANTS), best
# first: name, then the GGML_* features it is compiled with.
CPU_VARIANTS="sapphirerapids:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX512,AVX512_VBMI,AVX512_VNNI,AVX512_BF16,AMX_TILE,AMX_INT8
zen4:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX512,AVX512_VBMI,AVX512_VNNI,AVX512_BF16
cooperlake:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX512,AVX512_VNNI,AVX512_BF16
icelake:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX512,AVX512_VBMI,AVX512_VNNI
cascadelake:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX512,AVX512_VNNI
cannonlake:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX512,AVX512_VBMI
skylakex:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX512
alderlake:SSE42,AVX,F16C,FMA,AVX2,BMI2,AVX_VNNI
haswell:SSE42,AVX,F16C,FMA,AVX2,BMI2
piledriver:SSE42,AVX,F16C,FMA
ivybridge:SSE42,AVX,F16C
sandybridge:SSE42,AVX
sse42:SSE42
x64:"

cpu_has() { # $1 = a GGML_* feature name; true when /proc/cpuinfo lists it
    local flags=$2
    case $1 in
    SSE42) set -- sse4_2 ;;
    AVX) set -- avx ;;
    F16C) set -- f16c ;;
    FMA) set -- fma ;;
    AVX2) set -- avx2 ;;
    BMI2) set -- bmi2 ;;
    AVX512) set -- avx512f avx512cd avx512vl avx512dq avx512bw ;;
    AVX512_VBMI) set -- avx512vbmi ;;
    AVX512_VNNI) set -- avx512_vnni ;;
    AVX512_BF16) set -- avx512_bf16 ;;
    AVX_VNNI) set -- avx_vnni ;;
    AMX_TILE) set -- amx_tile ;;
    AMX_INT8) set -- amx_int8 ;;
    *) return 1 ;;
    esac
    for f in "$@"; do
        case " $flags " in *" $f "*) ;; *) return 1 ;; esac
    done
}

cpu_variant() { # prints "name:FEATURES" of the best variant this CPU runs
    local flags line feats ok f
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2)
    while read -r line; do
        feats=${line#*:}
        ok=1
        for f in ${feats//,/ }; do cpu_has "$f" "$flags" || { ok=0; break; }; done
        [ $ok = 1 ] && { echo "$line"; return; }
    done <<<"$CPU_VARIANTS"
}

# cpu_build VARIANT_LINE DEST_DIR: builds the patched module for the variant
# ("name:FEATURES" of CPU_VARIANTS) as DEST_DIR/libks-ggml-cpu.so with its .id.
cpu_build() {
    local variant=$1 dest=$2 vname t0 tmp opts="" f log mod
    vname=${variant%%:*}
    t0=$(date +%s)
    say "building ggml's CPU backend ($vname) with the batch-invariant patch (about a minute)"
    tmp=$DEPS/ggml-cpu-$vname.tmp
    rm -rf "$tmp"
    pinned_source "$tmp/src" ggml
    if ! (cd "$tmp/src" && patch -s -p1 <"$CPU_PATCH"); then
        say "the batch-invariant patch does not apply to this llama.cpp source"
        exit 1
    fi

    # Only the standalone build's pkg-config template is missing from
    # llama.cpp's copy of ggml; nothing here is installed, so an empty one does.
    : >"$tmp/src/ggml/ggml.pc.in"
    local feats
    IFS=, read -r -a feats <<<"${variant#*:}"
    for f in "${feats[@]}"; do [ -n "$f" ] && opts="$opts -DGGML_$f=ON"; done
    log=$tmp/build.log
    # The prebuilt's settings: loadable backends, ggml's own thread pool (no
    # OpenMP), llamafile's tinyBLAS and the repacking on; an unversioned SONAME
    # for libggml-base so the module binds to the prebuilt one.
    # shellcheck disable=SC2086 # word splitting of $opts is wanted
    if ! { cmake -S "$tmp/src/ggml" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF \
        -DGGML_LLAMAFILE=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
        -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON -DCMAKE_SKIP_BUILD_RPATH=ON $opts &&
        cmake --build "$tmp/build" --target ggml-cpu -j "$(nproc)"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        say "building ggml's CPU backend failed (log: $log)"
        exit 1
    fi
    mod=$(find "$tmp/build" -name libggml-cpu.so | head -n 1)
    [ -n "$mod" ] || { say "the CPU backend build produced no libggml-cpu.so (log: $log)"; exit 1; }
    mkdir -p "$dest"
    cp "$mod" "$dest/libks-ggml-cpu.so.tmp" && mv "$dest/libks-ggml-cpu.so.tmp" "$dest/libks-ggml-cpu.so"
    # what the engine reports and puts in its cache keys: another build of the
    # kernels may compute other bits, so its states must not be restored here
    echo "kvstash-ggml-cpu-r$CPU_REV-$vname" >"$dest/libks-ggml-cpu.id"
    rm -f "$dest/libks-ggml-cpu.variant"
    rm -rf "$tmp"
    say "batch-invariant CPU backend ($vname) ready in $dest ($(($(date +%s) - t0)) s)"
}

# The stamp, and the module's own id: a tree that built another revision
# since (a later one, then checked out back) has this revision's stamp but not
# its module.
if { [ ! -f "$CPU_STAMP" ] || ! grep -q "^kvstash-ggml-cpu-r$CPU_REV-" "$LLAMA/lib/libks-ggml-cpu.id" 2>/dev/null; } &&
    [ "$(uname -m)" = x86_64 ]; then
    cpu_build "$(cpu_variant)" "$LLAMA/lib"
    touch "$CPU_STAMP"
fi

# KS_CPU_VARIANT=NAME[,NAME...] (e.g. cooperlake,haswell): the module built
# for those variants too, each in $DEPS/cpu-variants/NAME/, for carrying to
# another machine (bench/gpu/package.sh); the engine never loads them from
# there. The machine's own module above is not touched.
if [ -n "${KS_CPU_VARIANT:-}" ] && [ "$(uname -m)" = x86_64 ]; then
    for want in ${KS_CPU_VARIANT//,/ }; do
        line=$(grep "^$want:" <<<"$CPU_VARIANTS" || true)
        [ -n "$line" ] || { say "KS_CPU_VARIANT: unknown variant '$want' (one of: $(cut -d: -f1 <<<"$CPU_VARIANTS" | tr '\n' ' '))"; exit 1; }
        [ "$want" = x64 ] && line="x64:"
        vdir=$DEPS/cpu-variants/$want
        [ -f "$vdir/.ok-r$CPU_REV" ] && continue
        cpu_build "$line" "$vdir"
        touch "$vdir/.ok-r$CPU_REV"
    done
fi
