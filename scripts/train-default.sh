#!/usr/bin/env bash
# Rebuilds Fathom's default model (models/fathom-tiny, docs/MODEL.md) from nothing but this
# repository and Debian packages: the corpus and tokenizer, about an hour of training on 2 cores,
# the BF16 export, and the evaluation against a local `fathom serve`.
#   scripts/train-default.sh [WORK_DIR]        (default build/default-model)
# Environment: MINUTES (training time budget, default 46), STEPS (default 2800), OUT (export
# directory, default models/fathom-tiny), FATHOM (the binary, default build/bin/fathom).
# The committed model came from exactly these settings (seed 1); a rerun on another machine gets
# a different number of steps done within the time budget, so its weights differ.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-build/default-model}
fathom=${FATHOM:-build/bin/fathom}
out=${OUT:-models/fathom-tiny}
minutes=${MINUTES:-46}
steps=${STEPS:-2800}
port=${PORT:-8765}
[[ -x "$fathom" ]] || { echo "$0: $fathom is not built (make build)" >&2; exit 1; }
mkdir -p "$work"

FATHOM="$fathom" scripts/corpus/build.sh "$work/data" --seed 1
"$fathom" train --data "$work/data" --preset tiny --layers 4 --mtp --seq-len 512 --batch 4 \
  --steps "$steps" --warmup 100 --lr 3e-3 --min-lr 3e-4 --eval-every 100 --eval-batches 8 \
  --save-every 100 --time-budget "$minutes" --seed 1 --out "$work/run"
rm -rf "$out"
"$fathom" export --run "$work/run" --out "$out" --format hf --dtype bf16
cp "$work/run/loss.svg" docs/model-loss.svg

"$fathom" eval unigram --data "$work/data"
# serve [OPTIONS...]: the exported model on $port, in the background ($server), once it answers.
serve() {
  "$fathom" serve --model "$out" --port "$port" --served-model-name "$(basename "$out")" "$@" &
  server=$!
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
    sleep 1
  done
}
serve
trap 'kill $server 2>/dev/null || true' EXIT
echo "== held-out tool use, names decoded constrained to the offered tools (the server's default)"
"$fathom" eval tools --url "http://127.0.0.1:$port/v1" --set "$work/data/heldout_tools.jsonl"
kill $server
wait $server 2>/dev/null || true
serve --no-tool-name-constraint
echo "== held-out tool use, the model unaided (--no-tool-name-constraint)"
"$fathom" eval tools --url "http://127.0.0.1:$port/v1" --set "$work/data/heldout_tools.jsonl"
