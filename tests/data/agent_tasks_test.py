#!/usr/bin/env python3
"""The corpus's `fathom agent` conversations (scripts/corpus/agent_tasks.py) against the real
plugins: for random tasks of every kind, the workspace is created on disk, the call is made through
`fathom agent tools --call` with Fathom's files and shell plugins, and the result the plugin returns
must be the one the corpus trains on, byte for byte (writes and edits must leave the file the task
says). The tool definitions in the corpus are the plugins' own (`--json`'s openai_tools, with the
workspace path substituted), and held-out tasks use only held-out phrasings. A plugin change that
rewords a result fails here until the corpus follows it."""
import json
import os
import random
import subprocess
import sys
import tempfile

BIN = os.path.abspath(os.environ["FATHOM_BIN"])
SRC = os.environ["FATHOM_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SRC, "scripts/corpus"))
import agent_tasks  # noqa: E402

ENV = dict(os.environ, LC_ALL="C", FATHOM_LOG="error")


def plugins():
    return ["--plugin", f"files={BIN} mcp files", "--plugin", f"shell={BIN} mcp shell"]


def tools_json(workspace, *extra):
    out = subprocess.run([BIN, "agent", "tools", "--sandbox", "off", "--workspace", workspace, *plugins(), "--json",
                          *extra], env=ENV, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    seed = int(os.environ.get("FATHOM_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (FATHOM_TEST_SEED to repeat)")
    r = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        dump_ws = os.path.join(tmp, "dump")
        os.mkdir(dump_ws)
        dump = {"workspace": dump_ws, "openai_tools": tools_json(dump_ws)["openai_tools"]}
        names = [t["function"]["name"] for t in dump["openai_tools"]]
        for k in agent_tasks.KINDS:
            assert k["tool"] in names, (k["key"], k["tool"], names)
        # The definitions a conversation offers are the plugins', the workspace path swapped.
        docs = agent_tasks.conversation(dump, r, 0)
        offered = docs[0]["tools"]
        ws_path = docs[0]["messages"][0]["content"].split("directory ")[1].split(". ")[0]
        for t in offered:
            assert dump_ws not in json.dumps(t), t
            twin = next(x for x in dump["openai_tools"] if x["function"]["name"] == t["function"]["name"])
            assert json.dumps(twin).replace(dump_ws, ws_path) == json.dumps(t), (twin, t)

        per_kind = {k["key"]: 0 for k in agent_tasks.KINDS}
        n = 0
        while min(per_kind.values()) < 4:
            heldout = n % 2 == 1
            # Every fourth task with the made-up-names recipe (gen_chat.py --agent-fresh 1).
            if n % 4 == 2:
                agent_tasks.RECIPE.update(fresh=1.0, fresh_writes=1.0)
            else:
                agent_tasks.RECIPE.update(fresh=0.3, fresh_writes=0.0)
            kind, ws, text, args, result, _, check = agent_tasks.draw_task(r, heldout)
            per_kind[kind["key"]] += 1
            root = os.path.join(tmp, f"ws{n}")
            os.mkdir(root)
            agent_tasks.materialise(ws, root)
            got = tools_json(root, "--call", kind["tool"], "--args", json.dumps(args))["result"]
            text_got = ("Error: " if got["is_error"] else "") + got["text"]
            assert text_got == result, f"{kind['key']} {args}:\nplugin: {text_got!r}\ncorpus: {result!r}"
            if kind["key"] in ("write", "edit"):
                with open(os.path.join(root, args["path"]), encoding="utf-8") as f:
                    assert f.read() == check, (kind["key"], args)
            templates = kind["templates"]
            side = templates[-agent_tasks.HELDOUT_TEMPLATES:] if heldout else templates[:-agent_tasks.HELDOUT_TEMPLATES]
            assert any(_matches(t, text) for t in side), (heldout, text)
            n += 1
        print(f"{n} calls matched the plugins: {per_kind}")


def _matches(template, text):
    """Whether text is the template with its {slots} filled (prefix and suffix around the slots)."""
    head = template.split("{")[0]
    tail = template.rsplit("}", 1)[-1] if "}" in template else ""
    return text.startswith(head) and text.endswith(tail) and ("{" in template or text == template)


if __name__ == "__main__":
    main()
