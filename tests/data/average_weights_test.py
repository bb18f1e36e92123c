#!/usr/bin/env python3
"""scripts/average_weights.py, the default model's last step (docs/MODEL.md): two random-weight
checkpoints of one shape from `fathom synth` are averaged; every value of the result must be the
BF16 rounding (to nearest even) of (1 - W) a + W b recomputed here, for W = 0.25, while W = 0 and
W = 1 give A's and B's bytes exactly; the result must load and generate in `fathom generate`; and
checkpoints of different shapes, a weight outside [0, 1] and a truncated file are refused with an
error naming the problem, leaving no output file."""
import json
import os
import struct
import subprocess
import sys
import tempfile
from array import array

BIN = os.environ["FATHOM_BIN"]
SRC = os.environ["FATHOM_SOURCE_DIR"]
SCRIPT = os.path.join(SRC, "scripts/average_weights.py")
SHARD = "model-00001-of-00001.safetensors"


def synth(out, seed, layers=2):
    subprocess.run([BIN, "synth", "--preset", "tiny", "--layers", str(layers), "--dtype", "bf16", "--format", "hf",
                    "--seed", str(seed), "--out", out], check=True, capture_output=True)


def average(a, b, out, weight):
    return subprocess.run([sys.executable, SCRIPT, a, b, out, "--weight", str(weight)], capture_output=True,
                          text=True)


def tensor_bytes(d):
    with open(os.path.join(d, SHARD), "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw[8 + n:]


def tensors(d):
    """name -> (dtype, bytes)."""
    with open(os.path.join(d, SHARD), "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
    return {k: (t["dtype"], data[t["data_offsets"][0]:t["data_offsets"][1]])
            for k, t in header.items() if k != "__metadata__"}


def bf16_values(b):
    return array("f", array("I", (h << 16 for h in array("H", b))).tobytes())


def round_bf16(x):
    u = array("I", array("f", [x]).tobytes())[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def main():
    with tempfile.TemporaryDirectory() as tmp:
        a, b, c = (os.path.join(tmp, n) for n in ("a", "b", "c"))
        synth(a, 1)
        synth(b, 2)
        synth(c, 3, layers=3)
        ta, tb = tensor_bytes(a), tensor_bytes(b)
        assert ta != tb

        out = os.path.join(tmp, "avg")
        p = average(a, b, out, 0.25)
        assert p.returncode == 0, p.stderr
        sa, sb, so = tensors(a), tensors(b), tensors(out)
        kinds = {"BF16": 0, "F32": 0}
        moved = total = 0
        for name, (dt, got) in so.items():
            kinds[dt] += 1
            if dt == "BF16":
                xa, xb, y = bf16_values(sa[name][1]), bf16_values(sb[name][1]), array("H", got)
                want = [round_bf16(float(array("f", [0.75 * p + 0.25 * q])[0])) for p, q in zip(xa, xb)]
                base = array("H", sa[name][1])
            else:
                xa, xb, y = array("f", sa[name][1]), array("f", sb[name][1]), array("f", got)
                want = list(array("f", [0.75 * p + 0.25 * q for p, q in zip(xa, xb)]))
                base = array("f", sa[name][1])
            wrong = [i for i in range(len(y)) if y[i] != want[i]]
            assert not wrong, f"{name} ({dt}): {len(wrong)} values differ, first at {wrong[0]}"
            moved += sum(1 for i in range(len(y)) if y[i] != base[i])
            total += len(y)
        assert kinds["BF16"] > 0, kinds
        assert moved > total // 2, (moved, total)  # the average is not A
        g = subprocess.run([BIN, "generate", "--model", out, "--prompt", "Hello", "--max-tokens", "4"],
                           capture_output=True, text=True)
        assert g.returncode == 0, g.stderr

        for w, want in ((0, ta), (1, tb)):
            o = os.path.join(tmp, f"w{w}")
            p = average(a, b, o, w)
            assert p.returncode == 0, p.stderr
            assert tensor_bytes(o) == want, f"weight {w} is not the checkpoint itself"

        refused = [
            ((a, c, os.path.join(tmp, "bad1"), 0.5), "differ"),
            ((a, b, os.path.join(tmp, "bad2"), 1.5), "outside [0, 1]"),
            ((a, b, a, 0.5), "other than A and B"),
        ]
        cut = os.path.join(tmp, "cut")
        os.mkdir(cut)
        with open(os.path.join(a, SHARD), "rb") as f:
            head = f.read(200)
        with open(os.path.join(cut, SHARD), "wb") as f:
            f.write(head)
        refused.append(((a, cut, os.path.join(tmp, "bad3"), 0.5), "runs past the file"))
        for args, what in refused:
            p = average(*args)
            assert p.returncode != 0 and what in p.stderr, (args, what, p.stderr)
            if args[2] not in (a, b):
                assert not os.path.exists(os.path.join(args[2], SHARD)), args
        print(f"average_weights: exact averages ({kinds}), W = 0 / 1 exact, 4 bad inputs refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
