#!/usr/bin/env bash
# The GPU offload settings of `kvstash serve` and `kvstash chat` (issue 26):
# llama-server's flags and spellings (-ngl/--gpu-layers N|auto|all, --device,
# --split-mode, --tensor-split, --main-gpu, --no-kv-offload, --no-op-offload)
# and their YAML keys are accepted; a value that does not parse is refused
# before a model is looked for; a setting that cannot be honoured on this
# machine or this model — more layers than the model has, an unknown device,
# a tensor split that does not match the devices in use or does not add up,
# GPU layers with no GPU — is refused with exit 2 and a message saying why,
# before anything is served. Run on the CPU (KS_GPU_MODULES=none, from CTest)
# and, where setup's Vulkan module and Mesa's software device are present,
# again with one Vulkan device.
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?}

# refused WHAT NEEDLE CMD...: exit 2 and NEEDLE (fixed string) in stderr.
refused() {
    local what=$1 needle=$2
    shift 2
    timeout 60 "$@" </dev/null >/dev/null 2>"$tmp/e"
    local rc=$?
    check "$what refused naming '$needle' (rc $rc: $(grep -v '^[0-9:. ]* [DIW] ' "$tmp/e" | head -1))" \
        test $rc -eq 2 -a -n "$(grep -F -- "$needle" "$tmp/e")"
}
# parsed WHAT ARGS...: the flags parse, and the command stops at the missing model.
parsed() {
    local what=$1
    shift
    timeout 20 "$@" </dev/null >/dev/null 2>"$tmp/e"
    local rc=$?
    check "$what accepted (rc $rc: $(head -1 "$tmp/e"))" test $rc -eq 2 -a -n "$(grep 'no model' "$tmp/e")"
}

# --- parsing ----------------------------------------------------------------
for cmd in serve chat; do
    for args in "-ngl 5" "-ngl auto" "-ngl all" "--gpu-layers=0" "--n-gpu-layers 7" "--device none" \
        "-dev CUDA0,CUDA1" "--split-mode row" "-sm none" "--tensor-split 3,1" "-ts 1/1" "-mg 1" \
        "--main-gpu=0" "-nkvo" "--no-kv-offload" "--no-op-offload"; do
        # shellcheck disable=SC2086 # args is a list of words
        parsed "$cmd $args" "$BIN" $cmd $args
    done
    refused "$cmd -ngl abc" "--gpu-layers must be a layer count" "$BIN" $cmd -ngl abc
    refused "$cmd -ngl -1" "--gpu-layers must be a layer count" "$BIN" $cmd -ngl -1
    refused "$cmd --split-mode tensor" "--split-mode must be none, layer or row" "$BIN" $cmd --split-mode tensor
    refused "$cmd --tensor-split 1,x" "--tensor-split must be numbers >= 0" "$BIN" $cmd --tensor-split 1,x
    refused "$cmd --tensor-split 0,0" "--tensor-split does not add up" "$BIN" $cmd --tensor-split 0,0
    refused "$cmd --tensor-split 1,-1" "--tensor-split must be numbers >= 0" "$BIN" $cmd --tensor-split 1,-1
    refused "$cmd --device CUDA0,,x" "--device must be device names" "$BIN" $cmd --device CUDA0,,x
    refused "$cmd --main-gpu 16" "--main-gpu must be an integer in [0, 15]" "$BIN" $cmd --main-gpu 16
done

yaml() { printf '%s\n' "$1" >"$tmp/c.yaml"; }
for y in "gpu_layers: all" "gpu_layers: 12" "devices: none" "devices: CUDA0,CUDA1" "split_mode: row" \
    "tensor_split: [3, 1]" "tensor_split: 3,1" "main_gpu: 1" "kv_offload: false" "op_offload: false"; do
    yaml "$y"
    parsed "yaml '$y'" "$BIN" serve --config "$tmp/c.yaml"
done
for y in "gpu_layers: lots:gpu_layers" "split_mode: rows:split_mode" "tensor_split: [0, 0]:does not add up" \
    "tensor_split: [a]:tensor_split" "main_gpu: 16:main_gpu" "devices: ',':devices" "kv_offload: maybe:kv_offload"; do
    yaml "${y%:*}"
    refused "yaml '${y%:*}'" "${y##*:}" "$BIN" serve --config "$tmp/c.yaml"
done

# --- settings that cannot be honoured: the CPU alone --------------------------
for cmd in "serve --port 0" chat; do
    refused "$cmd -ngl 4 (the tiny model has 3)" "the model has 2 layers and an output layer, 3 in all; give 0..3, or all" \
        "$BIN" $cmd -m "$MODEL" -ngl 4
    refused "$cmd -ngl 99" "the model has 2 layers and an output layer" "$BIN" $cmd -m "$MODEL" -ngl 99
    refused "$cmd -ngl 1 without a GPU" "GPU layers 1 (-ngl) asked for, but no GPU backend is installed" \
        "$BIN" $cmd -m "$MODEL" -ngl 1
    refused "$cmd -ngl all without a GPU" "GPU layers all (-ngl) asked for, but no GPU backend" \
        "$BIN" $cmd -m "$MODEL" -ngl all
    refused "$cmd --device CUDA0 without a GPU" "unknown device 'CUDA0' (--device): no GPU device was found" \
        "$BIN" $cmd -m "$MODEL" --device CUDA0
    refused "$cmd --tensor-split 1,1 without a GPU" "the tensor split (--tensor-split) has 2 entries for 0 devices" \
        "$BIN" $cmd -m "$MODEL" --tensor-split 1,1
    refused "$cmd -ngl 2 --device none" "GPU layers 2 (-ngl) with --device none" \
        "$BIN" $cmd -m "$MODEL" -ngl 2 --device none
done
for args in "-ngl 0" "-ngl auto" "--device none" ""; do
    # shellcheck disable=SC2086
    timeout 60 "$BIN" chat -m "$MODEL" $args </dev/null >/dev/null 2>"$tmp/e"; rc=$?
    check "chat $args on the CPU runs (rc $rc: $(head -1 "$tmp/e"))" test $rc -eq 0
done

# --- one Vulkan device (setup's module on Mesa's llvmpipe) --------------------
VK=${KS_VULKAN_MODULE:-}
if [ -n "$VK" ] && [ -f "$VK" ] && ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1; then
    export KS_GPU_MODULES=$VK GGML_VK_VISIBLE_DEVICES=0
    refused "Vulkan: -ngl 4" "the model has 2 layers and an output layer, 3 in all" "$BIN" serve -m "$MODEL" --port 0 -ngl 4
    refused "Vulkan: --device Vulkan7" "unknown device 'Vulkan7' (--device): the GPU devices found are Vulkan0" \
        "$BIN" serve -m "$MODEL" --port 0 --device Vulkan7
    refused "Vulkan: --tensor-split 1,1" "the tensor split (--tensor-split) has 2 entries for 1 device in use (Vulkan0)" \
        "$BIN" serve -m "$MODEL" --port 0 -ngl all --tensor-split 1,1
    refused "Vulkan: --main-gpu 1" "main GPU 1 (--main-gpu): the devices in use are Vulkan0 (1)" \
        "$BIN" serve -m "$MODEL" --port 0 --main-gpu 1
    refused "Vulkan: --device Vulkan0,Vulkan0" "device 'Vulkan0' is named twice" \
        "$BIN" serve -m "$MODEL" --port 0 --device Vulkan0,Vulkan0
    # the module loaded, but llvmpipe not named: no device
    refused "Vulkan without a device: -ngl 2" "found no device (a CPU-type Vulkan device such as Mesa's llvmpipe" \
        env -u GGML_VK_VISIBLE_DEVICES "$BIN" serve -m "$MODEL" --port 0 -ngl 2
else
    echo "skip - the Vulkan checks: no Vulkan module or no Mesa lavapipe (scripts/setup.sh installs both unless KS_GPU=none)"
fi

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
