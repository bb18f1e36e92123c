#!/usr/bin/env python3
"""Scores a model as `fathom agent` uses it: held-out one-step tasks (heldout_agent.jsonl from
scripts/corpus/build.sh with AGENT_SHARE > 0; phrasings never trained on) run end to end.

For each task a fresh workspace is created with the task's files, and `fathom agent` runs the task
against URL with Fathom's files plugin (and the shell plugin where the task offers it), sandboxed
as the agent runs by default. From the trajectory:
  tool    the first call names the expected tool
  args    ... with exactly the expected arguments
  done    the task's effect holds: the written or edited file has the expected content, or the
          final answer contains the expected text (a listed name, the file's first line, ...)
  answer  the agent finished with an answer (no step limit, no error)

  scripts/eval_agent.py --url http://127.0.0.1:8000/v1 --set DATA/heldout_agent.jsonl [--limit N]
      [--fathom build/bin/fathom] [--model NAME] [--temperature 0] [--json] [--show N]
Prints the four rates and one line per kind; --json prints one JSON object last.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
from agent_tasks import materialise  # noqa: E402


def run_task(t, fathom, url, model, tmp, i, max_steps=3, temperature=0.0):
    """Runs held-out task t (a heldout_agent.jsonl row) through `fathom agent` in a fresh workspace
    under tmp; returns the row's outcome."""
    root = os.path.join(tmp, f"ws{i}")
    os.mkdir(root)
    materialise(t["workspace"], root)
    traj = os.path.join(tmp, f"t{i}.jsonl")
    cmd = [fathom, "agent", "--endpoint", url, "--model", model, "--workspace", root, "--max-steps",
           str(max_steps), "--yes", "--json", "--trajectory", traj, "--plugin", f"files={fathom} mcp files",
           "--temperature", str(temperature)]
    if t["shell"]:
        cmd += ["--plugin", f"shell={fathom} mcp shell"]
    cmd.append(t["task"])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, FATHOM_LOG="error", LC_ALL="C"))
    result = {}
    if p.stdout.strip():
        try:
            result = json.loads(p.stdout.strip().splitlines()[-1])
        except json.JSONDecodeError:
            pass
    first = None
    if os.path.exists(traj):
        with open(traj, encoding="utf-8") as f:
            for line in f:
                e = json.loads(line)
                if e.get("type") == "tool_call":
                    first = e
                    break
    name = first["name"] if first else None
    try:
        args = json.loads(first["arguments"]) if first else None
    except (json.JSONDecodeError, TypeError):
        args = None
    final = result.get("final_text", "") or ""
    if t["kind"] in ("write", "edit"):
        path = os.path.join(root, t["expected_args"]["path"])
        done = False
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                done = f.read() == t["check"]
    else:
        done = t["check"] in final
    return {"kind": t["kind"], "task": t["task"], "tool": name == t["expected_tool"],
            "args": name == t["expected_tool"] and args == t["expected_args"], "done": done,
            "answer": result.get("status") == "final" and bool(final.strip()),
            "called": name, "arguments": args, "final_text": final[:400], "status": result.get("status")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="OpenAI-compatible base URL (…/v1)")
    ap.add_argument("--set", required=True, help="heldout_agent.jsonl")
    ap.add_argument("--fathom", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "../build/bin/fathom"))
    ap.add_argument("--model", default="default")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--temperature", type=float, default=0.0, help="sent with each request (default 0)")
    ap.add_argument("--show", type=int, default=0, help="print the first N failures")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    a.fathom = os.path.abspath(a.fathom)
    if not os.access(a.fathom, os.X_OK):
        sys.exit(f"eval_agent: {a.fathom} is not an executable (--fathom)")
    try:
        with open(a.set, encoding="utf-8") as f:
            tasks = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"eval_agent: --set {a.set}: {e}")
    if a.limit:
        tasks = tasks[:a.limit]
    if not tasks:
        sys.exit(f"eval_agent: {a.set} holds no tasks")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, t in enumerate(tasks):
            rows.append(run_task(t, a.fathom, a.url, a.model, tmp, i, a.max_steps, a.temperature))
            if sys.stderr.isatty():
                print(f"\r{i + 1}/{len(tasks)}", end="", file=sys.stderr, flush=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    keys = ("tool", "args", "done", "answer")
    total = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
    by_kind = defaultdict(list)
    for r in rows:
        by_kind[r["kind"]].append(r)
    print(f"{len(rows)} tasks: tool {total['tool']:.1%}, args {total['args']:.1%}, done {total['done']:.1%}, "
          f"answered {total['answer']:.1%}")
    for kind, rs in sorted(by_kind.items()):
        print(f"  {kind:13s} n={len(rs):3d}  " + "  ".join(f"{k} {sum(r[k] for r in rs) / len(rs):.0%}" for k in keys))
    for r in [r for r in rows if not r["done"]][:a.show]:
        print(json.dumps(r, ensure_ascii=False))
    if a.json:
        print(json.dumps({"tasks": len(rows), **total,
                          "by_kind": {k: {m: sum(r[m] for r in rs) / len(rs) for m in keys} | {"n": len(rs)}
                                      for k, rs in sorted(by_kind.items())}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
