#!/usr/bin/env bash
# Runs every Fathom benchmark once, alone on the machine, and keeps each one's JSON line.
#   bench/run-all.sh OUT_DIR [V2LITE_FP8_HF_DIR] [V2LITE_Q8_0_GGUF]
# The model benches need the V2-Lite-shaped checkpoints (about 16 GB each; make them outside the
# repository and delete them afterwards):
#   fathom synth --preset v2-lite --dtype fp8  --format hf   --out /big/v2lite-fp8 --seed 1 --mtp
#   fathom synth --preset v2-lite --dtype q8_0 --format gguf --out /big/v2lite-q8_0.gguf --seed 1
# Nothing else may run meanwhile: every figure is a ratio to what the bench measured in the same
# run, but two cores shared with anything else give noise. ONLY=name,name runs a subset.
set -uo pipefail
OUT=${1:?usage: bench/run-all.sh OUT_DIR [FP8_HF_DIR] [Q8_0_GGUF]}
FP8=${2:-}
Q8=${3:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${FATHOM_BIN:-$ROOT/build/bin/fathom}
mkdir -p "$OUT"
export FATHOM_NO_PROGRESS=1 OMPI_MCA_mpi_yield_when_idle=1
MPI=(mpirun --allow-run-as-root -np 2 --bind-to none)
want() { [[ -z "${ONLY:-}" || ",$ONLY," == *",$1,"* ]]; }
run() {  # run NAME CMD...: the text report to NAME.txt, the last (JSON) line to NAME.json
  local name=$1; shift
  want "$name" || return 0
  echo "== $name: $*" | tee "$OUT/$name.txt"
  if "$@" >>"$OUT/$name.txt" 2>&1; then tail -1 "$OUT/$name.txt" >"$OUT/$name.json"; else echo "   FAILED (see $OUT/$name.txt)"; fi
  grep -v '^{' "$OUT/$name.txt" | tail -n +2 | tail -12
}
{ date -u; uname -r; lscpu | grep -E 'Model name|^CPU\(s\)'; git -C "$ROOT" rev-parse --short HEAD; } >"$OUT/machine.txt"

run roofline "$BIN" bench roofline --json
run gemm_bf16 "$BIN" bench gemm --dtype bf16 --json
run gemm_fp8 "$BIN" bench gemm --dtype fp8 --json
run gemm_q8_0 "$BIN" bench gemm --dtype q8_0 --json
run moe_fp8 "$BIN" bench moe --dtype fp8 --json
for h in 16 128; do
  for d in bf16 fp8; do
    run mla_${d}_h$h "$BIN" bench mla --batch 32 --seqlen 4096 --heads $h --kv-dtype $d --json
  done
done
run tokenize "$BIN" bench tokenize --json
run agent "$BIN" bench agent --json
run store "$BIN" bench store --json
run ep_normal "${MPI[@]}" "$BIN" bench ep --mode normal --json
run ep_low_latency "${MPI[@]}" "$BIN" bench ep --mode low-latency --json
run pipeline "${MPI[@]}" "$BIN" bench pipeline --svg-dir "$OUT" --json
if [[ -n "$FP8" ]]; then
  run decode_fp8 "$BIN" bench decode --model "$FP8" --prompt-tokens 512 --gen-tokens 64 --json
  run serve_fp8 "$BIN" bench serve --model "$FP8" --concurrency 1,8,16,32 --json
fi
if [[ -n "$Q8" ]]; then
  run decode_q8_0 "$BIN" bench decode --model "$Q8" --prompt-tokens 512 --gen-tokens 64 --json
fi
echo "results in $OUT"
