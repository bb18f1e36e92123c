#!/usr/bin/env python3
"""How copyable are the agent's argument values, token for token? (docs/MODEL.md)

For each held-out agent task (heldout_agent.jsonl from scripts/corpus/build.sh with
AGENT_SHARE > 0) whose expected arguments repeat text from the request (a file name, a command, a
text to write), renders the request and the expected call with DeepSeek-V3's chat template
(`fathom tokenizer render --ids`), finds each such value's tokens inside the call and checks
whether that token sequence also occurs in the request. A model can copy a value by induction
(find the earlier occurrence, continue it) only where it does; elsewhere it must also map one
spelling of the text onto another, e.g. " hel|lo" in the request onto "hello" after the quote.

  scripts/copy_tokens.py --tokenizer DIR --set DATA/heldout_agent.jsonl [--fathom build/bin/fathom]
Prints one line: values found whole, values found after their first token, request tokens.
"""
import argparse
import json
import os
import subprocess
import sys


def render(fathom, tokenizer, messages):
    r = subprocess.run([fathom, "tokenizer", "render", tokenizer, "--ids"], input=json.dumps({"messages": messages}),
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["ids"]


def call_tokens(fathom, tokenizer, request, prompt_ids, args):
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": json.dumps(args)}}
    ids = render(fathom, tokenizer, request + [{"role": "assistant", "content": None, "tool_calls": [call]}])
    if ids[:len(prompt_ids)] != prompt_ids:
        sys.exit("the rendered call does not extend the rendered request")
    return ids[len(prompt_ids):]


def contains(hay, needle):
    n = len(needle)
    return n > 0 and any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="directory holding tokenizer.json")
    ap.add_argument("--set", required=True, help="heldout_agent.jsonl")
    ap.add_argument("--fathom", default=os.path.join(here, "..", "build", "bin", "fathom"))
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    tasks = [json.loads(line) for line in open(a.set, encoding="utf-8") if line.strip()]
    values = whole = tail = request_tokens = 0
    for t in tasks:
        request = [{"role": "user", "content": t["task"]}]
        prompt = render(a.fathom, a.tokenizer, request)
        request_tokens += len(prompt)
        for key, v in t["expected_args"].items():
            # Only values that repeat the request's text; a trailing newline the request lacks is
            # the writer's convention, not text to copy.
            if not isinstance(v, str) or not v.strip("\n") or v.strip("\n") not in t["task"] or v == ".":
                continue
            with_value = dict(t["expected_args"], **{key: v.rstrip("\n")})
            without = dict(t["expected_args"], **{key: ""})
            c1 = call_tokens(a.fathom, a.tokenizer, request, prompt, with_value)
            c0 = call_tokens(a.fathom, a.tokenizer, request, prompt, without)
            i = 0
            while i < min(len(c1), len(c0)) and c1[i] == c0[i]:
                i += 1
            j = 0
            while j < min(len(c1), len(c0)) - i and c1[-1 - j] == c0[-1 - j]:
                j += 1
            vt = c1[i:len(c1) - j]  # the value's tokens (and any the quote merged with)
            values += 1
            whole += contains(prompt, vt)
            tail += contains(prompt, vt[1:]) if len(vt) > 1 else contains(prompt, vt)
    out = {"tasks": len(tasks), "values": values, "found_whole": whole, "found_after_first_token": tail,
           "request_tokens": request_tokens}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{values} copyable values in {len(tasks)} tasks: {whole} found whole in the request's tokens, "
              f"{tail} after their first token; {request_tokens} request tokens")


if __name__ == "__main__":
    main()
