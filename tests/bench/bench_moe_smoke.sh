#!/usr/bin/env bash
# `fathom bench moe` end to end at a small size: the JSON carries the measured machine and one
# record per token count with sane values; --ab adds both variants' rates and their ratio (no guard
# in the code, so both run the same kernels); bad options fail with a message naming them.
set -euo pipefail
bin=${FATHOM_BIN:?FATHOM_BIN is not set}
common=(--experts 8 --tokens 1,4 --seconds 0.05 --json)
check_py=$(cat <<'PY'
import json, sys
d = json.loads(sys.argv[1].strip().splitlines()[-1])
want_ab = sys.argv[2] == "ab"
assert d["read_gbs"] > 0 and d["peak_gops_used"] > 0 and d["experts"] == 8, d
rs = d["results"]
assert [r["tokens"] for r in rs] == [1, 4], rs
for r in rs:
    assert r["calls"] >= 3 and r["seconds_per_call"] > 0 and r["gbs"] > 0, r
    # each call reads the experts its tokens were routed to: a token picks 6 distinct ones of the 8
    per_expert = 3 * 1408 * 2048
    lo = 6 * per_expert
    assert (r["weight_bytes_per_call"] == lo) if r["tokens"] == 1 else \
        (lo <= r["weight_bytes_per_call"] <= 8 * per_expert), r
    assert abs(r["bandwidth_fraction"] - r["gbs"] / d["read_gbs"]) < 1e-9, r
    if want_ab:
        ab = r["ab"]
        assert ab["variant0_gbs"] > 0 and ab["variant1_gbs"] > 0, ab
        assert abs(ab["ratio"] - ab["variant1_gbs"] / ab["variant0_gbs"]) < 1e-9, ab
    else:
        assert "ab" not in r, r
PY
)
python3 -c "$check_py" "$("$bin" bench moe "${common[@]}")" plain
python3 -c "$check_py" "$("$bin" bench moe "${common[@]}" --ab)" ab
if err=$("$bin" bench moe --tokens 0 2>&1); then echo "--tokens 0 accepted"; exit 1; fi
grep -q -- "--tokens" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
if err=$("$bin" bench moe --dtype fp4 2>&1); then echo "fp4 accepted"; exit 1; fi
grep -q "fp4" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
