#!/usr/bin/env bash
# `fathom inspect` end to end: a GGUF and a safetensors directory are summarised (text and --json);
# a GGUF whose metadata string is not UTF-8 (GGUF strings are bytes from the file) is still
# printed, not an abort; a truncated GGUF fails with a message naming the file.
set -euo pipefail
bin=${FATHOM_BIN:?FATHOM_BIN is not set}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" synth --preset tiny --dtype q8_0 --format gguf --out "$dir/m.gguf" --seed 3 >/dev/null
"$bin" synth --preset tiny --dtype bf16 --format hf --out "$dir/hf" --seed 3 >/dev/null
for model in "$dir/m.gguf" "$dir/hf"; do
  text=$("$bin" inspect "$model")
  grep -q "tensors" <<<"$text" || { echo "no summary for $model"; exit 1; }
  "$bin" inspect "$model" --json | tail -n 1 | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["n_tensors"] == len(j["tensors"]) > 0, j["n_tensors"]
assert j["config"]["hidden_size"] > 0, j["config"]'
done
# general.name's first byte becomes 0xff: invalid UTF-8 in a metadata string.
python3 - "$dir/m.gguf" "$dir/bad.gguf" <<'PY'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
key = b"general.name"
at = d.index(key) + len(key)
assert struct.unpack_from("<I", d, at)[0] == 8 and struct.unpack_from("<Q", d, at + 4)[0] >= 1  # a string
d[at + 12] = 0xFF
open(sys.argv[2], "wb").write(d)
PY
for flag in "" --json; do
  out=$("$bin" inspect "$dir/bad.gguf" $flag) || { echo "inspect $flag failed on a non-UTF-8 metadata string"; exit 1; }
  grep -q "general.name" <<<"$out" || { echo "inspect $flag lost general.name"; exit 1; }
done
truncate -s 100000 "$dir/m.gguf"
if err=$("$bin" inspect "$dir/m.gguf" 2>&1); then echo "a truncated GGUF was accepted"; exit 1; fi
grep -q "m.gguf" <<<"$err" || { echo "the error does not name the file: $err"; exit 1; }
echo "inspect: ok"
