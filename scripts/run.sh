#!/usr/bin/env bash
# run.sh BIN MODEL — the main job of `make run`: a short scripted multi-turn
# chat that shows the cache at work (turn 2 on reuses the whole history).
set -euo pipefail
bin=$1
model=$2
echo "kvstash: model $model"
echo "kvstash: a 4-turn scripted chat; watch 'cached' grow and TTFT stay flat"
printf '%s\n' \
  "Hello! Please introduce yourself in a few words." \
  "What can you tell me about caching in language model servers?" \
  "Why does the time to first token grow with every turn without a cache?" \
  "Thank you, that is all for now." |
  "$bin" chat -m "$model" --system "You are a helpful assistant that answers briefly." --max-tokens 32
