#!/usr/bin/env bash
# `fathom bench decode` end to end on a tiny synthetic FP8 checkpoint, mapped and with --no-mmap:
# the JSON line holds the documented raw figures next to the ratios, the ratios follow from them,
# the roofline bandwidth comes from the samples taken between decode steps (or, with
# --probe-every 0, is the higher of the two measurements around the run), and the prefill's peak is
# the mean of the two measured around it.
set -euo pipefail
bin=${FATHOM_BIN:?FATHOM_BIN is not set}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$bin" synth --preset tiny --dtype fp8 --format hf --out "$dir/hf" --seed 5 >/dev/null
check_py=$(cat <<'PY'
import json, sys
d = json.loads(sys.argv[1].strip().splitlines()[-1])
every = int(sys.argv[2])
for f in ["prefill_seconds", "prefill_tokens_per_s", "prefill_flops", "decode_seconds", "decode_tokens_per_s",
          "decode_bytes_per_token", "bandwidth_gbs", "bandwidth_before_gbs", "bandwidth_after_gbs",
          "peak_gflops", "decode_roofline_fraction", "prefill_roofline_fraction", "checkpoint_bytes"]:
    assert f in d, f"missing {f}"
assert d["prompt_tokens"] == 24 and d["gen_tokens"] == 6, d
assert d["weights_dtype"] == "f8_e4m3", d
samples = d["bandwidth_samples_gbs"]
if every == 0:
    assert samples == [], d
    assert d["bandwidth_gbs"] == max(d["bandwidth_before_gbs"], d["bandwidth_after_gbs"]) > 0, d
else:
    assert len(samples) == 1 + (6 + every - 1) // every and min(samples) > 0, d
    assert min(samples) * (1 - 1e-9) <= d["bandwidth_gbs"] <= max(samples) * (1 + 1e-9), d
peaks = (d["peak_before_prefill_gflops"], d["peak_after_prefill_gflops"])
assert min(peaks) > 0 and abs(d["peak_gflops"] - sum(peaks) / 2) <= 1e-9 * d["peak_gflops"], d
assert abs(d["decode_tokens_per_s"] * d["decode_seconds"] - 6) < 1e-6, d
want = d["decode_bytes_per_token"] / (d["bandwidth_gbs"] * 1e9) * d["decode_tokens_per_s"]
assert abs(d["decode_roofline_fraction"] - want) <= 1e-9 * max(1.0, want), (d["decode_roofline_fraction"], want)
assert 0 < d["prefill_roofline_fraction"] and d["decode_bytes_per_token"] > 0, d
PY
)
for run in "8" "0" "4 --no-mmap"; do
  set -- $run
  out=$("$bin" bench decode --model "$dir/hf" --prompt-tokens 24 --gen-tokens 6 --json --probe-every "$@")
  python3 -c "$check_py" "$out" "$1"
done
if "$bin" bench decode --model "$dir/hf" --gen-tokens 0 >/dev/null 2>&1; then echo "--gen-tokens 0 accepted"; exit 1; fi
if "$bin" bench decode --model "$dir/hf" --probe-every -1 >/dev/null 2>&1; then echo "--probe-every -1 accepted"; exit 1; fi
echo "bench decode: ok"
