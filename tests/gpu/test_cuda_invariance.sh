#!/usr/bin/env bash
# Batch invariance on a real NVIDIA GPU (label gpu, issue 27): with setup's
# CUDA module (which carries scripts/patches/ggml-cuda-batch-invariant.patch)
# and every layer on CUDA0, the engine claims exact mode "batch-invariant" on
# the tiny Q4_K model (all matrix weights quantized) and tokens decoded one
# row at a time leave the sequence state and logits of one prefill, bit for
# bit, across the flash-attention kernel's 256-cell KV chunks and the matrix
# products' tiles (tests/gpu/cuda_invariance.c); with the patch's kernels
# turned off (GGML_CUDA_KS_INVARIANT=0) exact mode is unavailable. Exit 77
# (skipped) without a CUDA module or an NVIDIA GPU — CI.
. "$(dirname "$0")/../cli/lib.sh"
MODEL=${KS_TINY_Q4K_MODEL:?}
CUDA=${KS_CUDA_MODULE:-}
PROBE=${KS_CUDA_INVARIANCE:?}
if [ -z "$CUDA" ] || [ ! -f "$CUDA" ]; then
    echo "SKIP: no CUDA module at ${CUDA:-KS_CUDA_MODULE unset} (scripts/setup.sh builds it with KS_GPU=cuda)"
    exit 77
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    echo "SKIP: no NVIDIA GPU here (nvidia-smi lists none)"
    exit 77
fi
export KS_GPU_MODULES=$CUDA

"$PROBE" "$MODEL" all >"$tmp/inv.out" 2>"$tmp/inv.err"
rc=$?
cat "$tmp/inv.out"
[ $rc -eq 0 ] || { tail -20 "$tmp/inv.err"; echo "FAIL - cuda_invariance exited $rc"; exit 1; }
grep -q 'exact mode batch-invariant' "$tmp/inv.out" || { echo "FAIL - the engine does not claim batch invariance on CUDA"; exit 1; }
grep -q '^0 of ' "$tmp/inv.out" || { echo "FAIL - lone rows differ from the prefill"; exit 1; }

GGML_CUDA_KS_INVARIANT=0 "$PROBE" "$MODEL" all >"$tmp/stock.out" 2>"$tmp/stock.err"
rc=$?
cat "$tmp/stock.out"
[ $rc -eq 0 ] || { echo "FAIL - cuda_invariance (stock kernels) exited $rc"; exit 1; }
grep -q 'exact mode unavailable' "$tmp/stock.out" || { echo "FAIL - exact mode claimed with the stock kernels"; exit 1; }
echo "PASS"
