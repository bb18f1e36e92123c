#!/usr/bin/env python3
"""scripts/corpus/build.sh end to end on a small size: the same seed gives the same bytes, another
seed different ones (also with TOKENIZER reusing a tokenizer); the held-out tool names and request
templates, and the held-out agent tasks' phrasings, never occur in training; the outputs have the
fathom-tokens-v1 layout; a corpus file that is not UTF-8 is refused with its name and byte offset."""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

BIN = os.environ["FATHOM_BIN"]
SRC = os.environ["FATHOM_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SRC, "scripts/corpus"))
BUILD = os.path.join(SRC, "scripts/corpus/build.sh")
# The experimental recipe (drills, parallel calls, word names, loss masks): the default one is the
# same code with those kinds at 0 and is rebuilt byte for byte by scripts/train-default.sh's users.
ENV = dict(os.environ, FATHOM=BIN, CONVERSATIONS="250", DOCS_MB="0.15", VOCAB="1024", HELDOUT="120",
           LOSS_MASK="1", AGENT_SHARE="0.2",
           GEN_ARGS="--fresh-names 0.9 --fresh-words --copy-drills 0.12 --parallel-calls 0.15")
FILES = ["train.bin", "val.bin", "train.mask", "val.mask", "meta.json", "tokenizer.json", "tokenizer_config.json", "heldout_tools.jsonl",
         "heldout_agent.jsonl", "split.json", "sources.tsv"]


def build(out, seed, **env):
    subprocess.run([BUILD, out, "--seed", str(seed)], env=dict(ENV, **env), check=True, stdout=subprocess.DEVNULL)
    return {f: open(os.path.join(out, f), "rb").read() for f in FILES}


def check_layout(out, files):
    meta = json.loads(files["meta.json"])
    assert meta["format"] == "fathom-tokens-v1", meta
    assert meta["vocab_size"] == 1024, meta
    for name, key in (("train.bin", "n_train_tokens"), ("val.bin", "n_val_tokens")):
        data = files[name]
        assert len(data) == 4 * meta[key], (name, len(data), meta[key])
        ids = struct.unpack(f"<{len(data) // 4}I", data)
        assert ids and ids[0] == meta["bos_id"], name
        assert max(ids) < meta["vocab_size"], name
    # Loss masks: one 0/1 byte per token; chats score only the assistant's part, so fewer than all.
    assert meta["loss_mask"] == "uint8", meta
    for name, key, targets in (("train.mask", "n_train_tokens", "n_train_targets"),
                               ("val.mask", "n_val_tokens", "n_val_targets")):
        mask = files[name]
        assert len(mask) == meta[key] and set(mask) <= {0, 1}, name
        assert sum(mask) == meta[targets] and 0 < meta[targets] < meta[key], (name, meta[targets])
    share = meta["n_text_tokens"] / (meta["n_text_tokens"] + meta["n_chat_tokens"])
    print(f"text share {share:.2f}, {meta['n_train_tokens']} train / {meta['n_val_tokens']} val tokens")
    cfg = json.loads(files["tokenizer_config.json"])
    assert "tool▁calls▁begin" in cfg["chat_template"]
    info = json.loads(subprocess.run([BIN, "tokenizer", "info", out, "--json"], capture_output=True, check=True,
                                     text=True).stdout.strip().splitlines()[-1])
    assert info["chat_template"] == "deepseek-v3" and info["bos_id"] == meta["bos_id"], info


def check_heldout_disjoint(out):
    split = json.loads(open(os.path.join(out, "split.json")).read())
    held, train = set(split["heldout_names"]), set(split["train_names"])
    assert held and train and not held & train
    assert not set(split["heldout_templates"]) & set(split["train_templates"])
    # No held-out name occurs as a whole name anywhere in the training conversations or documents.
    text = open(os.path.join(out, "work/chat.jsonl"), encoding="utf-8").read()
    text += open(os.path.join(out, "work/tokenizer_train.txt"), encoding="utf-8").read()
    words = set(re.findall(r"[A-Za-z0-9_-]+", text))
    leaked = held & words
    assert not leaked, f"held-out names in training: {sorted(leaked)[:5]}"
    train_users = set()
    for line in open(os.path.join(out, "work/chat.jsonl"), encoding="utf-8"):
        for m in json.loads(line).get("messages", []):  # copy drills are plain text
            if m["role"] == "user":
                train_users.add(m["content"])
    n = 0
    for line in open(os.path.join(out, "heldout_tools.jsonl"), encoding="utf-8"):
        q = json.loads(line)
        names = [t["function"]["name"] for t in q["tools"]]
        assert q["expected_tool"] in names and set(names) <= held, q
        assert q["template"] in split["heldout_templates"], q
        assert q["messages"][-1]["content"] not in train_users, q
        n += 1
    assert n == 120, n
    print(f"held-out: {n} requests, {len(held)} held-out names vs {len(train)} training names, disjoint")
    import agent_tasks
    agent_users = sum("files__read_file" in line for line in open(os.path.join(out, "work/chat.jsonl"), encoding="utf-8"))
    assert agent_users > 0, "no agent conversations in the corpus"
    n = 0
    for line in open(os.path.join(out, "heldout_agent.jsonl"), encoding="utf-8"):
        t = json.loads(line)
        kind = next(k for k in agent_tasks.KINDS if k["key"] == t["kind"])
        assert t["expected_tool"] == kind["tool"], t
        assert t["task"] not in train_users, t
        n += 1
    assert n == 200, n
    print(f"held-out agent tasks: {n}, none a training user turn ({agent_users} agent documents in training)")


# The words of each concept's held-out phrasings that no training phrasing of that concept uses
# (function words aside), frozen when the training lists were last grown. A training phrasing
# that used one would teach part of a held-out phrasing, and the held-out score would no longer
# measure phrasings never seen in training; growing the lists must keep clear of these words.
HELDOUT_ONLY_WORDS = {
    "weather": "jacket temperature", "forecast": "ahead plan upcoming",
    "air_quality": "clean day good outside wise", "read_file": "print see text",
    "write_file": "like say words", "list_dir": "folder listing", "delete_file": "gone trash",
    "web_search": "dig information results",
    "calculator": "help result sum", "create_event": "block remember", "list_events": "free got planned",
    "send_email": "drop note", "convert_units": "much turn", "stock_price": "latest shares",
    "translate": "render", "timer": "called time", "alarm": "ring sure", "currency": "paying terms",
    "local_time": "call current hour someone", "news": "fetch happening stories", "reminder": "nudge",
    "play_music": "hear queue", "contacts": "card pull", "flights": "check options tickets",
    "restaurants": "dinner good suggest", "define": "across came explain", "sms": "ping via",
    "directions": "fastest navigate way", "package": "delivered news shipment", "lights": "flip",
}


def check_heldout_phrasing_words():
    import tool_concepts

    def words(template):
        return set(re.findall(r"[a-z]+", re.sub(r"\{\w+\}", " ", template.lower())))

    assert sorted(HELDOUT_ONLY_WORDS) == sorted(c["key"] for c in tool_concepts.CONCEPTS)
    n = 0
    for c in tool_concepts.CONCEPTS:
        held = c["templates"][-tool_concepts.HELDOUT_TEMPLATES:]
        frozen = set(HELDOUT_ONLY_WORDS[c["key"]].split())
        assert frozen <= set().union(*map(words, held)), (c["key"], frozen)
        for t in c["templates"][:-tool_concepts.HELDOUT_TEMPLATES]:
            leaked = words(t) & frozen
            assert not leaked, f"{c['key']}: training phrasing {t!r} uses held-out words {leaked}"
            n += 1
    print(f"{n} training phrasings keep clear of the held-out phrasings' own words")


def check_bad_utf8(tmp):
    bad = os.path.join(tmp, "bad.jsonl")
    with open(bad, "wb") as f:
        f.write(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    r = subprocess.run([BIN, "corpus", "tokenize", "--tokenizer", os.path.join(tmp, "a"), "--out", tmp, bad],
                       capture_output=True, text=True)
    assert r.returncode == 1, r
    assert f"{bad}: not valid UTF-8 at byte offset 30" in r.stderr, r.stderr
    r = subprocess.run([BIN, "tokenizer", "train", "--vocab-size", "300", "--out", os.path.join(tmp, "t.json"), bad],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "bad.jsonl" in r.stderr, r.stderr
    print("non-UTF-8 corpus input refused:", r.stderr.strip().splitlines()[-1])


def check_word_noise(tmp):
    """--word-noise (stage 6 of the default model): a noisy template keeps every slot and swaps
    about half of its other words for pseudo-words that are no concept's word; the held-out requests
    are the same bytes with and without it, --word-noise 0 draws exactly the default recipe, and a
    share outside [0, 1] is refused."""
    import random
    sys.path.insert(0, os.path.join(SRC, "scripts/corpus"))
    import gen_chat
    r = random.Random(3)
    swapped = total = 0
    for c in gen_chat.CONCEPTS:
        for t in c["templates"]:
            n = gen_chat.noisy_template(t, r)
            assert re.findall(r"\{\w+\}", n) == re.findall(r"\{\w+\}", t), (t, n)
            old = re.findall(r"[A-Za-z]+", re.sub(r"\{\w+\}", " ", t))
            new = re.findall(r"[A-Za-z]+", re.sub(r"\{\w+\}", " ", n))
            assert len(old) == len(new), (t, n)
            for a, b in zip(old, new):
                total += 1
                if a != b:
                    swapped += 1
                    assert b not in gen_chat.REAL_WORDS, b
    assert 0.4 < swapped / total < 0.6, (swapped, total)
    gen = os.path.join(SRC, "scripts/corpus/gen_chat.py")
    outs = {}
    for tag, extra in (("none", []), ("zero", ["--word-noise", "0"]), ("all", ["--word-noise", "1"])):
        d = os.path.join(tmp, f"noise-{tag}")
        os.makedirs(d)
        subprocess.run([sys.executable, gen, "--out", d, "--seed", "7", "--conversations", "300", "--heldout", "50",
                        *extra], check=True)
        outs[tag] = {f: open(os.path.join(d, f), "rb").read() for f in ("chat.jsonl", "heldout_tools.jsonl")}
    assert outs["zero"] == outs["none"], "--word-noise 0 changed the default recipe's draws"
    assert outs["all"]["heldout_tools.jsonl"] == outs["none"]["heldout_tools.jsonl"]
    assert outs["all"]["chat.jsonl"] != outs["none"]["chat.jsonl"]
    bad = subprocess.run([sys.executable, gen, "--out", tmp, "--word-noise", "1.5"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--word-noise" in bad.stderr, bad.stderr
    print(f"word noise: {swapped} of {total} template words swapped, slots kept, held-out requests unchanged")


def main():
    tmp = tempfile.mkdtemp(prefix="fathom-corpus-test-")
    try:
        a = build(os.path.join(tmp, "a"), 5)
        b_dir = os.path.join(tmp, "b")
        b = build(b_dir, 5)
        for f in FILES:
            assert a[f] == b[f], f"{f} differs between two builds with the same seed"
        for f in FILES:  # idempotent: a rerun over spoiled outputs rewrites every one of them
            with open(os.path.join(b_dir, f), "wb") as out:
                out.write(b"spoiled")
        assert build(b_dir, 5) == a
        gen = os.path.join(SRC, "scripts/corpus/gen_chat.py")
        for seed in (5, 6):
            os.makedirs(os.path.join(tmp, f"g{seed}"))
            subprocess.run([sys.executable, gen, "--out", os.path.join(tmp, f"g{seed}"), "--seed", str(seed),
                            "--conversations", ENV["CONVERSATIONS"], "--heldout", ENV["HELDOUT"],
                            "--agent-tools", os.path.join(tmp, "a/work/agent_tools.json"),
                            "--agent-share", ENV["AGENT_SHARE"], *ENV["GEN_ARGS"].split()], check=True)
        assert open(os.path.join(tmp, "g5/chat.jsonl"), "rb").read() == \
            open(os.path.join(tmp, "a/work/chat.jsonl"), "rb").read()
        assert open(os.path.join(tmp, "g6/chat.jsonl"), "rb").read() != \
            open(os.path.join(tmp, "g5/chat.jsonl"), "rb").read()
        # A reused tokenizer (a later training stage keeps its model's vocabulary) is the trained one.
        assert build(os.path.join(tmp, "c"), 5, TOKENIZER=os.path.join(tmp, "a")) == a
        print("deterministic: same seed -> same bytes (also rebuilt over spoiled outputs, and with the "
              "tokenizer reused); another seed differs")
        check_layout(os.path.join(tmp, "a"), a)
        check_heldout_disjoint(os.path.join(tmp, "a"))
        check_heldout_phrasing_words()
        check_bad_utf8(tmp)
        check_word_noise(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
