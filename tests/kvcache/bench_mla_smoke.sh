#!/usr/bin/env bash
# `fathom bench mla` end to end at small shapes: both cache dtypes, 16 and 128 heads, causal
# s_q = 2; the JSON line must hold every documented field, sane values, and the kernel's sequence 0
# must agree with the scalar reference. Bad options must fail with a message naming them.
set -euo pipefail
bin=${FATHOM_BIN:?FATHOM_BIN is not set}
check_py=$(cat <<'PY'
import json, sys
d = json.loads(sys.argv[1].strip().splitlines()[-1])
want_dtype, want_heads = sys.argv[2], int(sys.argv[3])
fields = ["seconds", "bytes", "flops", "bandwidth_gbs", "peak_gflops", "roofline_fraction", "gbs", "gflops",
          "kv_bytes_per_token_per_layer", "mha_bytes_per_token_per_layer", "check_max_abs_diff", "cpu_utilization",
          "peak_kind", "vector_peak_gflops", "memory_roofline_fraction"]
missing = [f for f in fields if f not in d]
assert not missing, f"missing {missing}"
assert d["kv_dtype"] == want_dtype and d["heads"] == want_heads, d
assert d["kv_bytes_per_token_per_layer"] == (1152 if want_dtype == "bf16" else 656), d
assert d["mha_bytes_per_token_per_layer"] == want_heads * (128 + 64 + 128) * 2, d
assert d["seconds"] > 0 and d["flops"] > 0 and d["bytes"] > 0 and d["roofline_fraction"] > 0, d
assert 0 <= d["check_max_abs_diff"] < 0.05, d  # bf16 rounding of q and P against the f32 reference
assert d["working_set_bytes"] >= 2 * 1024 * 1024, d
# The peak is that of the arithmetic used: the tiles' only at the AVX-512 BF16 level.
assert d["peak_kind"] in ("amx_bf16", "vector"), d
assert d["peak_kind"] == "vector" or d["simd_level"] == "avx512bf16", d
assert d["peak_kind"] == "vector" or d["peak_gflops"] > d["vector_peak_gflops"], d
assert 0 < d["memory_roofline_fraction"] <= d["roofline_fraction"] + 1e-12, d
PY
)
check() { python3 -c "$check_py" "$@"; }
common=(--batch 3 --seqlen 200 --working-set 2M --seconds 0.1 --roofline-bytes 32M --json)
check "$("$bin" bench mla "${common[@]}" --kv-dtype bf16 --heads 128)" bf16 128
check "$("$bin" bench mla "${common[@]}" --kv-dtype fp8 --heads 16)" fp8 16
check "$("$bin" bench mla "${common[@]}" --kv-dtype fp8 --heads 16 --s-q 2 --causal)" fp8 16
check "$("$bin" bench mla "${common[@]}" --heads 16 --simd avx2)" bf16 16
check "$("$bin" bench mla "${common[@]}" --heads 16 --simd scalar)" bf16 16
# --ab: both variants timed (no guard in the code, so both run the same kernel) and a ratio
ab_json=$("$bin" bench mla "${common[@]}" --heads 16 --ab)
check "$ab_json" bf16 16
python3 - "$ab_json" <<'PY'
import json, sys
ab = json.loads(sys.argv[1].strip().splitlines()[-1])["ab"]
assert ab["variant0_calls"] > 0 and ab["variant1_calls"] > 0, ab
assert ab["variant0_seconds"] > 0 and ab["variant1_seconds"] > 0, ab
assert abs(ab["ratio"] - ab["variant0_seconds"] / ab["variant1_seconds"]) < 1e-9, ab
PY
if "$bin" bench mla "${common[@]}" --heads 16 | grep -q '"ab"'; then echo "ab without --ab"; exit 1; fi
if err=$("$bin" bench mla --kv-dtype fp4 2>&1); then echo "fp4 accepted"; exit 1; fi
grep -q "fp4" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
if err=$("$bin" bench mla --d-latent 100 2>&1); then echo "d_latent 100 accepted"; exit 1; fi
grep -q "d_latent" <<<"$err" || { echo "unhelpful error: $err"; exit 1; }
echo "bench mla smoke: ok"
