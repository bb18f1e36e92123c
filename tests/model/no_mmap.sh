#!/usr/bin/env bash
# `--no-mmap` end to end: a model read into memory gives the same logits, bit for bit, as the same
# files mapped, for an FP8 safetensors directory and a Q8_0 GGUF; a truncated shard fails with a
# message naming the file in both modes.
set -euo pipefail
bin=${FATHOM_BIN:?FATHOM_BIN is not set}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" synth --preset tiny --dtype fp8 --format hf --out "$dir/hf" --seed 3 >/dev/null
"$bin" synth --preset tiny --dtype q8_0 --format gguf --out "$dir/m.gguf" --seed 3 >/dev/null
for model in "$dir/hf" "$dir/m.gguf"; do
  for mode in prefill decode; do
    a=$("$bin" logits --model "$model" --tokens 5,17,3,99,42 --mode "$mode" --json)
    b=$("$bin" logits --model "$model" --tokens 5,17,3,99,42 --mode "$mode" --json --no-mmap)
    [[ -n "$a" && "$a" == "$b" ]] || { echo "logits differ with --no-mmap: $model $mode"; exit 1; }
  done
done
# a shard cut short: both modes refuse it and name it
shard=$(ls "$dir"/hf/*.safetensors | head -1)
truncate -s $(( $(stat -c %s "$shard") / 2 )) "$shard"
for flag in "" --no-mmap; do
  if err=$("$bin" logits --model "$dir/hf" --tokens 1,2 $flag 2>&1); then
    echo "a truncated shard was accepted ($flag)"; exit 1
  fi
  grep -q "$(basename "$shard")" <<<"$err" || { echo "error does not name the shard ($flag): $err"; exit 1; }
done
echo "no-mmap: ok"
