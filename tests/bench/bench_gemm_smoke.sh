#!/usr/bin/env bash
# `fathom bench gemm` end to end at a small size: the JSON carries the measured machine and one
# record per shape with consistent values; --ceiling adds the one-thread run; --ab adds both
# variants' rates and their ratio for the memory and the ceiling runs (no guard in the code, so
# both run the same kernels); --weight-offset starts the weights mid cache line (same values);
# bad options fail with a message naming them.
set -euo pipefail
bin=${FATHOM_BIN:?FATHOM_BIN is not set}
common=(--dtype fp8 --m 3 --n 256 --k 512 --seconds 0.05 --rotate 4M --json)
check_py=$(cat <<'PY'
import json, sys
d = json.loads(sys.argv[1].strip().splitlines()[-1])
mode = sys.argv[2]
assert d["read_gbs"] > 0 and d["peak_gops_used"] > 0 and d["dtype"] == "f8_e4m3", d
(r,) = d["results"]
assert (r["m"], r["n"], r["k"]) == (3, 256, 512), r
assert r["weight_bytes"] == 256 * 512 and r["weight_copies"] >= 2, r
assert r["weight_offset"] == (8 if mode == "offset" else 0), r
assert r["seconds_per_call"] > 0 and abs(r["gbs"] - r["weight_bytes"] / r["seconds_per_call"] * 1e-9) < 1e-6, r
assert abs(r["bandwidth_fraction"] - r["gbs"] / d["read_gbs"]) < 1e-9, r
assert ("ceiling_gbs_per_thread" in r) == (mode != "plain"), r
for key in ("ab", "ab_ceiling"):
    if mode == "ab":
        ab = r[key]
        assert ab["variant0_gbs"] > 0 and ab["variant1_gbs"] > 0, ab
        assert abs(ab["ratio"] - ab["variant1_gbs"] / ab["variant0_gbs"]) < 1e-9, ab
    else:
        assert key not in r, r
PY
)
python3 -c "$check_py" "$("$bin" bench gemm "${common[@]}")" plain
python3 -c "$check_py" "$("$bin" bench gemm "${common[@]}" --ceiling)" ceiling
python3 -c "$check_py" "$("$bin" bench gemm "${common[@]}" --ceiling --ab)" ab
python3 -c "$check_py" "$("$bin" bench gemm "${common[@]}" --ceiling --weight-offset 8)" offset
if err=$("$bin" bench gemm --weight-offset 64 2>&1); then echo "--weight-offset 64 accepted"; exit 1; fi
grep -q -- "--weight-offset 64" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
if err=$("$bin" bench gemm --n 256 2>&1); then echo "--n without --k accepted"; exit 1; fi
grep -q -- "--k" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
if err=$("$bin" bench gemm --dtype fp4 2>&1); then echo "fp4 accepted"; exit 1; fi
grep -q "fp4" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
if err=$("$bin" bench gemm --dtype q8_0 --n 64 --k 100 2>&1); then echo "k = 100 for q8_0 accepted"; exit 1; fi
grep -q -- "--k" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
