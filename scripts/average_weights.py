#!/usr/bin/env python3
"""Averages two Hugging Face checkpoints of one model element-wise (a "model soup": Wortsman et
al. 2022), as the default model's last step does (docs/MODEL.md, "Stage 6 and the average"):

  scripts/average_weights.py A_DIR B_DIR OUT_DIR [--weight W]

OUT = (1 - W) * A + W * B per tensor (W = 0.5 by default), computed in float32 and rounded to
each tensor's stored type (BF16 to nearest even, F32 as is). Both directories must hold the same
single-file safetensors export (`fathom export --format hf`): the same tensor names, types, shapes
and byte offsets, and A's other files (config, tokenizer) are copied to OUT. Pure Python (no
NumPy): about 6 s for the 12.5 M-parameter default model. Averaging only makes sense for
checkpoints that share a training history (one continued from the other, as stage 6 from stage 5),
so their weights lie in one basin.
"""
import argparse
import json
import os
import shutil
import struct
import sys
from array import array

SHARD = "model-00001-of-00001.safetensors"
TYPES = ("BF16", "F32")


def fail(msg):
    raise SystemExit(f"average_weights: {msg}")


def read_safetensors(path):
    """(header bytes, header dict, tensor bytes) of a safetensors file, with its layout checked."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail(f"{path}: {e.strerror}")
    if len(raw) < 8:
        fail(f"{path}: too short for a safetensors header")
    n = struct.unpack("<Q", raw[:8])[0]
    if n > len(raw) - 8:
        fail(f"{path}: the header length {n} runs past the file ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        fail(f"{path}: the header is not JSON ({e})")
    data = raw[8 + n:]
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t.get("dtype") not in TYPES:
            fail(f"{path}: tensor {name} is {t.get('dtype')}; only {', '.join(TYPES)} can be averaged")
        s, e = t["data_offsets"]
        if not 0 <= s <= e <= len(data):
            fail(f"{path}: tensor {name}'s bytes [{s}, {e}) lie outside the file's {len(data)}")
    return raw[8:8 + n], header, data


def bf16_to_f32(b):
    return array("f", array("I", (h << 16 for h in array("H", b))).tobytes())


def f32_to_bf16(x):
    # round to nearest even on the upper 16 bits (no NaNs in trained weights; checked by the caller)
    return array("H", (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
                       for u in array("I", x.tobytes()))).tobytes()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("out")
    ap.add_argument("--weight", type=float, default=0.5, help="B's weight W in [0, 1] (default 0.5)")
    args = ap.parse_args()
    w = args.weight
    if not 0 <= w <= 1:
        fail(f"--weight {w} is outside [0, 1]")
    if os.path.abspath(args.out) in (os.path.abspath(args.a), os.path.abspath(args.b)):
        fail("OUT must be a directory other than A and B")
    raw_header, ha, da = read_safetensors(os.path.join(args.a, SHARD))
    _, hb, db = read_safetensors(os.path.join(args.b, SHARD))
    ta = {k: v for k, v in ha.items() if k != "__metadata__"}
    tb = {k: v for k, v in hb.items() if k != "__metadata__"}
    if ta.keys() != tb.keys():
        fail(f"the checkpoints hold different tensors ({sorted(ta.keys() ^ tb.keys())[:4]} ...)")
    for name in ta:
        if ta[name] != tb[name]:
            fail(f"tensor {name} differs in type, shape or place: {ta[name]} against {tb[name]}")
    out = bytearray(da)
    for name, t in ta.items():
        s, e = t["data_offsets"]
        if t["dtype"] == "BF16":
            x, y = bf16_to_f32(da[s:e]), bf16_to_f32(db[s:e])
        else:
            x, y = array("f", da[s:e]), array("f", db[s:e])
        z = array("f", ((1 - w) * p + w * q for p, q in zip(x, y)))
        if any(v != v for v in z):
            fail(f"tensor {name} holds NaN")
        out[s:e] = f32_to_bf16(z) if t["dtype"] == "BF16" else z.tobytes()
    shutil.copytree(args.a, args.out, dirs_exist_ok=True, ignore=shutil.ignore_patterns(SHARD))
    with open(os.path.join(args.out, SHARD), "wb") as f:  # A's header: the offsets are the same
        f.write(struct.pack("<Q", len(raw_header)))
        f.write(raw_header)
        f.write(out)
    print(f"wrote {args.out}: {len(ta)} tensors, {1 - w:g} x {args.a} + {w:g} x {args.b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
