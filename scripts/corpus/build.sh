#!/usr/bin/env bash
# Builds Fathom's training data end to end (docs/MODEL.md), deterministically for a seed:
#   scripts/corpus/build.sh OUT_DIR [--seed N]
# Environment: FATHOM (the binary; default build/bin/fathom), CONVERSATIONS (generated chats,
# default 36000), DOCS_MB (Debian documentation text, default 18), VOCAB (default 8192),
# HELDOUT (held-out tool requests, default 400), GEN_ARGS (extra gen_chat.py options: the
# recipe, e.g. "--fresh-names 0.9 --fresh-words --copy-drills 0.12 --parallel-calls 0.15"),
# LOSS_MASK=1 (also write train.mask / val.mask, docs/MODEL.md), AGENT_SHARE (share of `fathom agent`
# tasks with the real files and shell plugins' tool definitions, scripts/corpus/agent_tasks.py;
# default 0; >0 also writes heldout_agent.jsonl), TOKENIZER (a directory holding tokenizer.json and
# tokenizer_config.json to reuse, e.g. a model's, instead of training one: a later training stage
# keeps its model's vocabulary), PRE (the trained tokenizer's pre-tokenizer, default deepseek-v3;
# fathom-isolated keeps a word the same tokens after a space or a quote, docs/MODEL.md).
# Writes OUT_DIR/{meta.json,train.bin,val.bin,tokenizer.json,tokenizer_config.json,
# heldout_tools.jsonl,sources.tsv,split.json,unigram.json}; intermediate files go to OUT_DIR/work.
# Idempotent: a rerun rewrites every output with the same bytes.
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: $0 OUT_DIR [--seed N]" >&2
  exit 2
fi
out="$1"; shift
seed=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seed) seed="$2"; shift 2 ;;
    *) echo "$0: unknown option $1" >&2; exit 2 ;;
  esac
done
fathom="${FATHOM:-$root/build/bin/fathom}"
conversations="${CONVERSATIONS:-36000}"
docs_mb="${DOCS_MB:-18}"
vocab="${VOCAB:-8192}"
pre="${PRE:-deepseek-v3}"
heldout="${HELDOUT:-400}"
agent_share="${AGENT_SHARE:-0}"
[[ -x "$fathom" ]] || { echo "$0: $fathom is not built (make build, or set FATHOM)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "$0: python3 is required" >&2; exit 1; }
mkdir -p "$out/work"
work="$out/work"
step() { echo "[corpus $(date -u +%H:%M:%S)] $*" >&2; }

agent_args=()
if [[ "$agent_share" != 0 ]]; then
  step "dumping the files and shell plugins' tool definitions (fathom agent tools --json)"
  rm -rf "$work/agent-ws" && mkdir -p "$work/agent-ws"
  ws="$(cd "$work/agent-ws" && pwd)"
  fathom_abs="$(cd "$(dirname "$fathom")" && pwd)/$(basename "$fathom")"
  FATHOM_LOG=error "$fathom" agent tools --sandbox off --workspace "$ws" --plugin "files=$fathom_abs mcp files" \
    --plugin "shell=$fathom_abs mcp shell" --json | tail -n 1 |
    python3 -c 'import json, sys; d = json.load(sys.stdin); assert len(d["openai_tools"]) == 7, d["plugins"]
print(json.dumps({"workspace": sys.argv[1], "openai_tools": d["openai_tools"]}))' "$ws" > "$work/agent_tools.json"
  agent_args=(--agent-tools "$work/agent_tools.json" --agent-share "$agent_share")
fi
step "generating $conversations conversations and $heldout held-out requests (seed $seed)"
# shellcheck disable=SC2086  # GEN_ARGS is a list of options
python3 "$here/gen_chat.py" --out "$work" --seed "$seed" --conversations "$conversations" --heldout "$heldout" \
  "${agent_args[@]}" ${GEN_ARGS:-}
step "gathering ${docs_mb} MB of Debian documentation"
python3 "$here/gather_docs.py" --out "$work/docs.jsonl" --max-mb "$docs_mb"
if [[ -n "${TOKENIZER:-}" ]]; then
  step "reusing the tokenizer of $TOKENIZER"
  cp "$TOKENIZER/tokenizer.json" "$TOKENIZER/tokenizer_config.json" "$out/"
else
  step "rendering text for tokenizer training"
  "$fathom" corpus render --plain --out "$work/tokenizer_train.txt" "$work/docs.jsonl" "$work/chat.jsonl"
  step "training the tokenizer (vocabulary $vocab, pre-tokenizer $pre)"
  "$fathom" tokenizer train --vocab-size "$vocab" --pre "$pre" --out "$out/tokenizer.json" "$work/tokenizer_train.txt"
fi
step "tokenizing into $out/train.bin and val.bin"
mask_flag=()
[[ "${LOSS_MASK:-0}" == 1 ]] && mask_flag=(--loss-mask)
"$fathom" corpus tokenize --tokenizer "$out" --out "$out" --seed "$seed" --val-fraction 0.015 "${mask_flag[@]}" \
  "$work/docs.jsonl" "$work/chat.jsonl"
cp "$work/heldout_tools.jsonl" "$out/heldout_tools.jsonl"
cp "$work/split.json" "$out/split.json"
if [[ -f "$work/heldout_agent.jsonl" && "$agent_share" != 0 ]]; then cp "$work/heldout_agent.jsonl" "$out/"; else rm -f "$out/heldout_agent.jsonl"; fi
cp "$work/docs.jsonl.sources.tsv" "$out/sources.tsv"
"$fathom" eval unigram --data "$out" --json | tail -n 1 > "$out/unigram.json"
step "done: $(cat "$out/meta.json" | tr -d '\n ')"
step "unigram baseline: $(cat "$out/unigram.json")"
