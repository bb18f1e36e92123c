#!/usr/bin/env python3
"""`fathom eval tools` against a real `fathom serve` (a random-weight synthetic model whose replies
are forced with --test-outputs, in order): right calls, wrong tools, unparsable arguments and
plain answers must be counted exactly, so a scorer that is wrong fails here. The held-out set
comes from the corpus generator (scripts/corpus/gen_chat.py)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BIN = os.environ["FATHOM_BIN"]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402
SRC = os.environ["FATHOM_SOURCE_DIR"]


def call(name, args_text, lead=""):
    return (f"{lead}<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args_text}\n```"
            "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")


def forced_outputs(requests):
    """One output per request and the outcome the scorer must report for it."""
    outs, want = [], []
    for i, q in enumerate(requests):
        names = [t["function"]["name"] for t in q["tools"]]
        other = next((n for n in names if n != q["expected_tool"]), "no_such_tool")
        kind = i % 6
        if kind == 0:
            outs.append(call(q["expected_tool"], '{"city":"Oslo"}')); want.append("correct")
        elif kind == 1:  # content before the call, then two calls: the first decides
            outs.append(call(q["expected_tool"], "{}", lead="Let me check. ").replace(
                "<｜tool▁calls▁end｜>", f"\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>{other}\n```json\n{{}}\n```"
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>")); want.append("correct")
        elif kind == 2:
            outs.append(call(other, '{"x":1}')); want.append("wrong_tool")
        elif kind == 3:  # Fathom's server turns a call whose arguments are not a JSON object into text
            outs.append(call(q["expected_tool"], '{"city": "Oslo"')); want.append("no_tool_call")
        elif kind == 4:
            outs.append("I can't help with that."); want.append("no_tool_call")
        else:
            outs.append(call(q["expected_tool"], '["not", "an", "object"]')); want.append("no_tool_call")
    return outs, want


def corpus_replies(tmp):
    """Tool-call documents of the generated corpus, rendered by `fathom corpus render`: the request
    (as a held-out-style set) and the reply the model is trained to give, to force on the server."""
    calls = [line for line in open(os.path.join(tmp, "chat.jsonl"), encoding="utf-8")
             if json.loads(line).get("render") == "tool_call_completion"][:6]
    assert calls
    src, rendered = os.path.join(tmp, "calls.jsonl"), os.path.join(tmp, "calls.rendered.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        f.writelines(calls)
    subprocess.run([BIN, "corpus", "render", "--out", rendered, src], check=True, stderr=subprocess.DEVNULL)
    texts = [json.loads(line)["text"] for line in open(rendered, encoding="utf-8")]
    assistant, eos = "<｜Assistant｜>", "<｜end▁of▁sentence｜>"
    outs, set_path = [], os.path.join(tmp, "corpus_set.jsonl")
    with open(set_path, "w", encoding="utf-8") as f:
        for line, text in zip(calls, texts):
            conv = json.loads(line)
            assert text.endswith(eos), text[-80:]
            outs.append(text[text.rindex(assistant) + len(assistant):-len(eos)])
            req = {"messages": conv["messages"][:-1], "tools": conv["tools"],
                   "expected_tool": conv["messages"][-1]["tool_calls"][0]["function"]["name"]}
            f.write(json.dumps(req, ensure_ascii=False) + "\n")
    return set_path, outs


def start_server(model_dir, outputs_file):
    return serve_util.start_server(BIN, model_dir, "--test-outputs", outputs_file)


def eval_tools(url, heldout, *extra):
    r = subprocess.run([BIN, "eval", "tools", "--url", f"{url}/v1", "--set", heldout, "--json", *extra],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    tmp = tempfile.mkdtemp(prefix="fathom-eval-test-")
    server = None
    try:
        subprocess.run([sys.executable, os.path.join(SRC, "scripts/corpus/gen_chat.py"), "--out", tmp,
                        "--conversations", "40", "--heldout", "12", "--seed", "3"], check=True)
        heldout = os.path.join(tmp, "heldout_tools.jsonl")
        requests = [json.loads(line) for line in open(heldout, encoding="utf-8")]
        outs, want = forced_outputs(requests)
        outs += outs[:4]  # for the --limit run
        corpus_set, corpus_outs = corpus_replies(tmp)
        outs += corpus_outs
        with open(os.path.join(tmp, "outputs.json"), "w", encoding="utf-8") as f:
            json.dump(outs, f, ensure_ascii=False)
        model = os.path.join(tmp, "tiny")
        subprocess.run([BIN, "synth", "--preset", "tiny", "--dtype", "bf16", "--format", "hf", "--out", model,
                        "--seed", "11"], check=True, stdout=subprocess.DEVNULL)
        server, url = start_server(model, os.path.join(tmp, "outputs.json"))
        got = eval_tools(url, heldout, "--examples", "100")
        n = len(requests)
        count = {k: want.count(k) for k in ("correct", "wrong_tool", "bad_arguments", "no_tool_call")}
        assert got["n"] == n, got
        assert got["correct"] == count["correct"], (got, count)
        assert got["wrong_tool"] == count["wrong_tool"], (got, count)
        assert got["bad_arguments"] == 0, got  # (unit-tested: this server never returns such a call)
        assert got["no_tool_call"] == count["no_tool_call"], (got, count)
        assert got["any_tool_call"] == n - count["no_tool_call"], got
        assert abs(got["correct_fraction"] - count["correct"] / n) < 1e-12, got
        assert got["request_errors"] == 0, got
        failures = [(e["index"], e["outcome"]) for e in got["examples"]]
        assert failures == [(i, w) for i, w in enumerate(want) if w != "correct"], failures
        for e in got["examples"]:
            if e["index"] % 6 == 3:
                assert '{"city": "Oslo"' in e["detail"], e
        print(f"scored {n} forced replies exactly: {count}")
        limited = eval_tools(url, heldout, "--limit", "4")
        assert limited["n"] == 4 and limited["correct"] == want[:4].count("correct"), limited
        print("--limit 4:", limited["correct"], "correct")
        # Replies exactly as the corpus teaches them are calls the server parses and the scorer accepts.
        got = eval_tools(url, corpus_set)
        assert got["n"] == len(corpus_outs) and got["correct"] == got["n"], got
        print(f"{got['n']} training-format replies: all parsed by the server and scored correct")
    finally:
        if server:
            server.terminate()
            server.wait(timeout=30)
    # An unreachable endpoint: every request fails and is counted as a failure, not a crash.
    try:
        r = subprocess.run([BIN, "eval", "tools", "--url", "http://127.0.0.1:9/v1", "--set", heldout, "--limit", "1",
                            "--json"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout.strip().splitlines()[-1])
        assert res["n"] == 1 and res["request_errors"] == 1 and res["correct"] == 0, res
        r = subprocess.run([BIN, "eval", "tools", "--url", "http://127.0.0.1:9/v1", "--set", heldout + ".missing"],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "heldout_tools.jsonl.missing" in r.stderr, r.stderr
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
