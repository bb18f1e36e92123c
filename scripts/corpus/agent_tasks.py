"""Agent conversations for the corpus: `fathom agent` with Fathom's own files and shell plugins.

Each conversation is what `fathom agent` sends the server for a one-step task: its system prompt
(naming the workspace), the plugins' tool definitions exactly as `fathom agent tools --json` prints
them (`openai_tools`; build.sh dumps them from the real plugins), the user's task, the call, the
tool's result as the plugin words it (simulated here on a made-up workspace; tests/data/
agent_tasks_test.py checks every kind against the real plugins) and a short answer drawn from the
result. Task kinds keep their last HELDOUT_TEMPLATES phrasings out of training: the held-out agent
set (heldout_agent.jsonl, scored by scripts/eval_agent.py through `fathom agent`) uses only those,
bare; training requests get the greetings and thanks of chat_pools.decorate.
Standard library only; deterministic for a random.Random.
"""
import copy
import json
import os

from chat_pools import decorate

HELDOUT_TEMPLATES = 2

WORKSPACES = ["/tmp/ws", "/tmp/work", "/home/ana/project", "/home/kofi/code/site", "/srv/app", "/root/repo",
              "/work/notes", "/home/lena/src/tool", "/opt/service", "/data/project", "/home/user/workspace",
              "/tmp/agent-ws"]
SYSTEM = ("You are an agent working in the directory {}. Use the tools to act; tool results that start with "
          "'Error:' explain what went wrong. When the task is done, answer without calling tools.")

DIRS = ["src", "docs", "data", "scripts", "tests", "notes", "config", "lib", "app", "web", "reports", "assets"]
# (name, kind): kind picks the content generator
FILES = [("README.md", "md"), ("notes.txt", "txt"), ("todo.md", "md"), ("main.c", "c"), ("util.py", "py"),
         ("app.py", "py"), ("server.js", "js"), ("index.html", "html"), ("config.toml", "toml"),
         ("settings.json", "json"), ("users.csv", "csv"), ("report.md", "md"), ("build.sh", "sh"),
         ("Makefile", "make"), ("test_main.py", "py"), ("style.css", "css"), ("guide.md", "md"),
         ("changelog.md", "md"), ("hello.txt", "txt"), ("data.json", "json"), ("ideas.txt", "txt"),
         ("plan.md", "md"), ("log.txt", "txt"), ("budget.csv", "csv"), ("main.py", "py"), ("lib.rs", "rs")]
EXTS = {"txt": ".txt", "md": ".md", "py": ".py", "c": ".c", "js": ".js", "toml": ".toml", "json": ".json",
        "csv": ".csv", "sh": ".sh", "css": ".css", "html": ".html", "rs": ".rs"}
WORDS = ["amber", "falcon", "river", "stone", "maple", "orbit", "cedar", "harbor", "violet", "copper", "meadow",
         "lantern", "pixel", "tundra", "quartz", "willow", "ember", "summit", "delta", "nimbus", "garnet", "juniper",
         "sparrow", "basalt", "cobalt", "saffron", "tidal", "zephyr", "marble", "onyx"]
PROSE = ["buy milk and eggs", "call the plumber on Monday", "the release is planned for June",
         "remember to back up the database", "meeting notes from the design review", "fix the login bug",
         "the server runs on port 8080", "ask Dara about the budget", "write the quarterly report",
         "move old logs to the archive", "update the dependencies", "the demo went well",
         "check the test coverage", "rename the config file", "water the plants", "draft the blog post",
         "deploy to staging first", "the API returns JSON", "clean up the tmp folder", "review the pull request"]
# The recipe's knobs (gen_chat.py --agent-fresh X sets both to X): the share of workspace file names
# that are made up (pseudo-words) and of write tasks whose path and text are (random word strings)
# rather than drawn from the pools above. A pooled name can be recalled; a made-up one can only be
# copied from the request. At the defaults (0.3, 0) the draws are those of the committed stage 3.
RECIPE = {"fresh": 0.3, "fresh_writes": 0.0}
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"


def pseudo_word(r):
    return "".join(r.choice(CONSONANTS) + r.choice(VOWELS) for _ in range(r.randint(2, 3)))


def content_for(kind, r):
    """A few lines of plausible text for a file kind; always ends with a newline."""
    n = r.randint(1, 5)
    w = lambda: r.choice(WORDS)  # noqa: E731
    if kind in ("txt", "md"):
        lines = [r.choice(PROSE) for _ in range(n)]
        if kind == "md":
            lines = ["# " + w().capitalize()] + ["- " + x for x in lines[1:]] if n > 1 else ["# " + w().capitalize()]
    elif kind == "py":
        lines = [f"def {w()}():", f"    return {r.randint(0, 99)}"] + [f"{w()} = {r.randint(0, 999)}" for _ in range(n - 1)]
    elif kind == "c":
        lines = ["#include <stdio.h>", "int main(void) {", f'  printf("{w()}\\n");', "  return 0;", "}"][:max(n, 2)]
    elif kind == "js":
        lines = [f"const {w()} = {r.randint(0, 99)};" for _ in range(n)]
    elif kind == "toml":
        lines = [f"{w()} = {r.choice(['true', 'false', str(r.randint(1, 9000)), json.dumps(w())])}" for _ in range(n)]
    elif kind == "json":
        lines = ["{" + ", ".join(f'"{w()}": {r.randint(0, 99)}' for _ in range(n)) + "}"]
    elif kind == "csv":
        lines = ["name,count"] + [f"{w()},{r.randint(0, 500)}" for _ in range(n - 1)]
    elif kind == "sh":
        lines = ["#!/bin/sh", f"echo {w()}"][:max(n, 1)]
    elif kind == "make":
        lines = ["all:", f"\techo {w()}"]
    elif kind == "css":
        lines = [f".{w()} {{ color: {r.choice(['red', 'blue', 'green'])}; }}" for _ in range(n)]
    elif kind == "html":
        lines = ["<html>", f"<p>{r.choice(PROSE)}</p>", "</html>"]
    else:  # rs
        lines = [f"fn {w()}() -> u32 {{ {r.randint(0, 99)} }}" for _ in range(n)]
    return "\n".join(lines) + "\n"


def make_workspace(r):
    """{relative path: content}: 2-7 top-level files (some with made-up names) and 1-3 directories
    of 1-4 files each."""
    ws = {}

    def add_files(prefix, count):
        for _ in range(count):
            if r.random() < RECIPE["fresh"]:
                kind = r.choice(sorted(EXTS))
                name = pseudo_word(r) + EXTS[kind]
            else:
                name, kind = r.choice(FILES)
            ws.setdefault(prefix + name, content_for(kind, r))

    add_files("", r.randint(2, 7))
    for d in r.sample(DIRS, r.randint(1, 3)):
        add_files(d + "/", r.randint(1, 4))
    return ws


def materialise(ws, root):
    """Writes a workspace ({relative path: content}) under the directory root."""
    for path, content in ws.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(content)


def dirs_of(ws):
    return sorted({p.rsplit("/", 1)[0] for p in ws if "/" in p})


def list_dir(ws, path):
    """files__list_directory (non-recursive): sorted entries, 'dir/' or 'file  (N bytes)'."""
    prefix = "" if path in (".", "") else path.rstrip("/") + "/"
    entries = {}
    for p, c in ws.items():
        if not p.startswith(prefix):
            continue
        rest = p[len(prefix):]
        head = rest.split("/", 1)[0]
        full = prefix + head
        entries[full] = None if "/" in rest else len(c.encode())
    if not entries and prefix:
        return None
    out = "".join(f"{p}/\n" if n is None else f"{p}  ({n} bytes)\n" for p, n in sorted(entries.items()))
    return out or "(empty directory)\n"


def count_lines(s):
    n = s.count("\n")
    return n + 1 if s and not s.endswith("\n") else n


def read_file(ws, path, first=None, last=None):
    text = ws[path]
    lines = text.splitlines(keepends=True)
    total = count_lines(text)
    first = first or 1
    last = total if last is None else last
    body = "".join(lines[first - 1:last])
    return f"{path} (lines {first}-{min(last, total)} of {total})\n{body}"


def search(ws, pattern, path="."):
    prefix = "" if path in (".", "") else path.rstrip("/") + "/"
    out = []
    for p in walk_order(ws):
        if not p.startswith(prefix):
            continue
        for i, line in enumerate(ws[p].split("\n")[:count_lines(ws[p])], 1):
            if pattern in line:
                out.append(f"{p}:{i}: {line}")
    return "\n".join(out) + "\n" if out else "no matches\n"


def walk_order(ws):
    """Paths in the plugin's walk order: each directory's entries sorted by name, a directory
    entered where it sorts (so "data/x" comes before "data.json", unlike a plain sort)."""
    return sorted(ws, key=lambda p: p.split("/"))


def no_such(path):
    return f"Error: '{path}': No such file or directory"


def shell_result(status, stdout, stderr=""):
    out = f"exit status {status}\n"
    if stdout:
        out += "--- stdout ---\n" + stdout
    if stderr:
        out += "--- stderr ---\n" + stderr
    return out


def names_of(listing):
    return [line.split("  (")[0] for line in listing.splitlines() if line and not line.startswith("(")]


def join_names(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


# Task kinds. Each builds (slots, call args, result text, answer) for a workspace, or None when the
# workspace does not suit it. Templates' {slots} are filled from `slots`; the last
# HELDOUT_TEMPLATES of each list are held out.
def _list_root(ws, r):
    listing = list_dir(ws, ".")
    names = names_of(listing)
    answer = r.choice([f"The workspace contains {join_names(names)}.", f"Here are the files: {join_names(names)}.",
                       f"There are {len(names)} entries: {join_names(names)}."])
    return {}, {"path": "."}, listing, answer, names[0]


def _list_sub(ws, r):
    d = r.choice(dirs_of(ws))
    listing = list_dir(ws, d)
    names = names_of(listing)
    answer = r.choice([f"{d} contains {join_names(names)}.", f"In {d} there is {join_names(names)}.",
                       f"The {d} directory has {len(names)} entries: {join_names(names)}."])
    return {"dir": d}, {"path": d}, listing, answer, names[0]


def _read(ws, r):
    p = r.choice(sorted(ws))
    text = ws[p]
    result = read_file(ws, p)
    first = text.split("\n")[0]
    if count_lines(text) == 1:
        answer = r.choice([f"{p} contains one line: {first}", f"{p} says: {first}"])
    else:
        answer = r.choice([f"Here is {p}:\n{text.rstrip()}", f"{p} has {count_lines(text)} lines:\n{text.rstrip()}"])
    return {"path": p}, {"path": p}, result, answer, first


def _read_range(ws, r):
    multi = [p for p in sorted(ws) if count_lines(ws[p]) >= 3]
    if not multi:
        return None
    p = r.choice(multi)
    n = count_lines(ws[p])
    a = r.randint(1, n - 1)
    b = r.randint(a + 1, n)
    result = read_file(ws, p, a, b)
    body = result.split("\n", 1)[1].rstrip()
    answer = f"Lines {a}-{b} of {p}:\n{body}"
    return ({"path": p, "a": a, "b": b}, {"path": p, "start_line": a, "end_line": b}, result, answer,
            body.split("\n")[0])


def _read_missing(ws, r):
    kind = r.choice(sorted(EXTS))
    p = r.choice(["", r.choice(DIRS) + "/"]) + r.choice([pseudo_word(r), r.choice(WORDS)]) + EXTS[kind]
    if p in ws:
        return None
    answer = r.choice([f"There is no file {p} in the workspace.", f"{p} does not exist.",
                       f"I could not read {p}: no such file."])
    return {"path": p}, {"path": p}, no_such(p), answer, p


def _search(ws, r):
    if r.random() < 0.25:
        pattern = r.choice(WORDS + ["TODO", "FIXME", "main", "port"])
    else:  # a word that occurs
        words = sorted({w for c in ws.values() for w in c.replace("\n", " ").split()
                        if w.isalpha() and len(w) > 3})
        if not words:
            return None
        pattern = r.choice(words)
    result = search(ws, pattern)
    if result == "no matches\n":
        answer = r.choice([f"No file contains {pattern}.", f"{pattern} does not appear in the workspace."])
        check = "no"
    else:
        hits = [h.split(": ", 1)[0] for h in result.splitlines()]
        where = join_names([f"{h.rsplit(':', 1)[0]} (line {h.rsplit(':', 1)[1]})" for h in hits[:4]])
        answer = r.choice([f"{pattern} appears in {where}.", f"Found {pattern} in {where}."])
        check = hits[0].rsplit(":", 1)[0]
    return {"pattern": pattern}, {"pattern": pattern}, result, answer, check


def _write(ws, r):
    kind = r.choice(["txt", "md", "txt"])
    if RECIPE["fresh_writes"] and r.random() < RECIPE["fresh_writes"]:
        p = r.choice(["", r.choice(DIRS) + "/"]) + pseudo_word(r) + EXTS[kind]
        text = " ".join(r.choice([pseudo_word(r), r.choice(WORDS)]) for _ in range(r.randint(1, 4)))
    else:
        p = (r.choice(["", r.choice(DIRS) + "/"]) +
             r.choice([pseudo_word(r), r.choice(WORDS), "hello", "todo", "notes", "draft"]) + EXTS[kind])
        text = r.choice(PROSE + [r.choice(WORDS) + " " + r.choice(WORDS), "hello world", "hi"])
    content = text + "\n"
    result = f"wrote {len(content.encode())} bytes (1 lines) to {p}"
    answer = r.choice([f"Wrote {p}.", f"Done: {p} now contains \"{text}\".", f"Created {p} with the text {text}."])
    return {"path": p, "text": text}, {"path": p, "content": content}, result, answer, content


def _edit(ws, r):
    cands = []
    for p in sorted(ws):
        for w in sorted(set(ws[p].replace("\n", " ").split())):
            if w.isalpha() and len(w) > 3 and ws[p].count(w) == 1:
                cands.append((p, w))
    if not cands:
        return None
    p, old = r.choice(cands)
    new = r.choice([w for w in WORDS if w != old])
    line = ws[p][:ws[p].index(old)].count("\n") + 1
    result = f"replaced 1 occurrence in {p} (at line {line})"
    answer = r.choice([f"Replaced {old} with {new} in {p} (line {line}).", f"Done: {p} now says {new} instead of {old}."])
    after = ws[p].replace(old, new)
    return {"path": p, "old": old, "new": new}, {"path": p, "old_text": old, "new_text": new}, result, answer, after


def _shell(ws, r):
    files = sorted(ws)
    u = r.random()
    if u < 0.25:
        cmd = "ls"
        top = sorted({p.split("/", 1)[0] for p in ws})
        out = "".join(x + "\n" for x in top)
    elif u < 0.45:
        p = r.choice(files)
        cmd, out = f"cat {p}", ws[p]
    elif u < 0.65:
        p = r.choice(files)
        cmd, out = f"wc -l {p}", f"{ws[p].count(chr(10))} {p}\n"
    elif u < 0.8:
        w = r.choice(WORDS + ["hello", "done", "ok"])
        cmd, out = f"echo {w}", w + "\n"
    else:
        d = r.choice(dirs_of(ws))
        cmd = f"ls {d}"
        out = "".join(x + "\n" for x in sorted({p[len(d) + 1:].split("/", 1)[0] for p in ws if p.startswith(d + "/")}))
    result = shell_result(0, out)
    first = out.split("\n")[0]
    answer = r.choice([f"The command exited with status 0 and printed:\n{out.rstrip()}",
                       f"Exit status 0. Output:\n{out.rstrip()}", f"It printed:\n{out.rstrip()}"])
    return {"cmd": cmd}, {"command": cmd}, result, answer, first


KINDS = [
    dict(key="list_root", tool="files__list_directory", build=_list_root, weight=2,
         templates=["List the files.", "What files are in the workspace?", "Show me the workspace contents.", "ls",
                    "What's in this directory?", "List everything in the workspace.", "Which files are here?",
                    "Show the files in the current directory.", "Show me what's in the workspace.",
                    "What files do I have?", "Can you tell me which files exist here?",
                    "Print the directory listing.", "I'd like to see the list of files.",
                    "Enumerate the files in the workspace.", "What's at the top level of the workspace?",
                    "List the top-level directory.", "Please list the current directory.",
                    "Tell me what this workspace holds.", "Give me a listing of the workspace.",
                    "What do we have in the project folder?"]),
    dict(key="list_sub", tool="files__list_directory", build=_list_sub, weight=2,
         templates=["List the files in {dir}.", "What is in the {dir} directory?", "Show me the contents of {dir}/.",
                    "ls {dir}", "What files does {dir} have?", "List {dir}.", "Show what {dir} holds.",
                    "Tell me the files in {dir}.", "Please list everything in {dir}/.", "List the directory {dir}.",
                    "Enumerate {dir}.", "I want to see the contents of the {dir} directory.",
                    "Which entries does {dir} have?", "Give me the file list of {dir}.", "What's under {dir}/?",
                    "Show the listing of {dir}.", "Which files are under {dir}?",
                    "Can you list the {dir} folder for me?"]),
    dict(key="read", tool="files__read_file", build=_read, weight=3,
         templates=["Read {path}.", "Show me {path}.", "What does {path} say?", "Open {path}.", "cat {path}",
                    "Print the contents of {path}.", "Show the file {path}.", "What is written in {path}?",
                    "Let me see {path}.", "Show the contents of {path}.", "Read the file {path} for me.",
                    "I need to see what {path} says.", "Can you open {path} and show it to me?", "Output {path}.",
                    "Print {path}.", "Tell me what the file {path} says.", "Fetch the contents of {path}.",
                    "What text is in {path}?", "What's inside {path}?", "Display the file {path}."]),
    dict(key="read_range", tool="files__read_file", build=_read_range, weight=1,
         templates=["Show lines {a} to {b} of {path}.", "Read lines {a}-{b} of {path}.",
                    "Print {path} from line {a} to line {b}.", "What are lines {a} through {b} in {path}?",
                    "Lines {a} to {b} of {path}, please.", "Show me {path}, lines {a}-{b}.",
                    "Only lines {a} through {b} of {path}, please.", "Print lines {a}..{b} from {path}.",
                    "I need lines {a} to {b} in {path}.", "Can you show {path} between line {a} and line {b}?",
                    "Extract lines {a} to {b} from {path}.", "Open {path} at lines {a}-{b}.",
                    "Read {path} from line {a} to {b}.", "Give me lines {a}-{b} of the file {path}."]),
    dict(key="read_missing", tool="files__read_file", build=_read_missing, weight=1,
         templates=["Read {path}.", "Show me {path}.", "What does {path} say?", "Open {path}.",
                    "Print the contents of {path}.", "Let me see {path}.", "Show the contents of {path}.",
                    "Read the file {path} for me.", "Can you open {path} and show it to me?", "Print {path}.",
                    "Tell me what the file {path} says.", "cat {path}", "Fetch the contents of {path}.",
                    "What's inside {path}?", "Display the file {path}."]),
    dict(key="search", tool="files__search", build=_search, weight=2,
         templates=["Search for {pattern}.", "Find {pattern} in the workspace.", "Where is {pattern} mentioned?",
                    "grep {pattern}", "Search the files for {pattern}.", "Which file mentions {pattern}?",
                    "Find where {pattern} appears.", "Search the workspace for the word {pattern}.",
                    "Is {pattern} anywhere in the files?", "Grep the workspace for {pattern}.",
                    "Where does {pattern} occur?", "Find every occurrence of {pattern}.",
                    "Do any files mention {pattern}?", "Locate {pattern} in the files.",
                    "Scan the files for {pattern}.", "In which file does {pattern} appear?",
                    "Which files contain {pattern}?", "Look for the text {pattern}."]),
    dict(key="write", tool="files__write_file", build=_write, weight=2,
         templates=["Create {path} with the text {text}.", 'Write "{text}" to {path}.',
                    "Save '{text}' in a file called {path}.", "Create a file {path} containing: {text}",
                    "Write {text} into {path}.", "Write a file {path} that says {text}.",
                    "Create {path} and write {text} in it.", "New file {path}: {text}",
                    "Please create a file named {path} with the content {text}.", 'Store "{text}" in {path}.',
                    "Write the line {text} to a new file {path}.", "Can you create {path}? It should say {text}.",
                    "Add a file {path} with {text} in it.", "Save {text} as {path}.",
                    "Make a new file {path} containing {text}.", 'Put the text "{text}" into {path}.']),
    dict(key="edit", tool="files__edit_file", build=_edit, weight=2,
         templates=["In {path}, replace {old} with {new}.", "Change {old} to {new} in {path}.",
                    "Replace the word {old} with {new} in {path}.", "Edit {path}: {old} -> {new}.",
                    "In the file {path}, change {old} into {new}.", "Replace {old} by {new} in {path}.",
                    "In {path}, change the word {old} to {new}.", "Update {path}: use {new} instead of {old}.",
                    "Rename {old} to {new} inside {path}.", "Fix {path} by replacing {old} with {new}.",
                    "{path}: replace {old} with {new}.", "Modify {path} to say {new} where it says {old}.",
                    "Please turn {old} into {new} in {path}.", "Edit {path} so that {old} becomes {new}.",
                    "Swap {old} for {new} in {path}."]),
    dict(key="shell", tool="shell__run", build=_shell, weight=2, shell=True,
         templates=["Run {cmd}.", "Execute `{cmd}` in the shell.", "Please run: {cmd}",
                    "Use the shell to run {cmd}.", "Run the command {cmd} and tell me the output.", "Run `{cmd}`.",
                    "Execute {cmd}.", "In the shell, run {cmd}.", "What does {cmd} print?",
                    "Run this command: {cmd}", "Please execute {cmd} and show me the result.", "$ {cmd}",
                    "Could you execute the shell command {cmd}?", "Try running {cmd}.",
                    "What is the output of {cmd}?", "Can you run {cmd} for me?", "Start the command {cmd}."]),
]


def with_workspace(tools, workspace, dumped_workspace):
    """The plugins' definitions with the dump's workspace path replaced by this conversation's."""
    out = copy.deepcopy(tools)
    for t in out:
        f = t["function"]
        f["description"] = f["description"].replace(dumped_workspace, workspace)
    return out


def offered(agent_tools, shell, workspace):
    """The tools `fathom agent --plugin files [--plugin shell]` offers, in the plugins' order."""
    tools = [t for t in agent_tools["openai_tools"] if shell or not t["function"]["name"].startswith("shell__")]
    return with_workspace(tools, workspace, agent_tools["workspace"])


def pick_kind(r):
    total = sum(k["weight"] for k in KINDS)
    u = r.random() * total
    for k in KINDS:
        u -= k["weight"]
        if u < 0:
            return k
    return KINDS[-1]


def draw_task(r, heldout):
    """(kind, workspace, text, args, result, answer, check) with a template from the training or the
    held-out side."""
    while True:
        kind = pick_kind(r)
        ws = make_workspace(r)
        built = kind["build"](ws, r)
        if built is None:
            continue
        slots, args, result, answer, check = built
        t = kind["templates"][-HELDOUT_TEMPLATES:] if heldout else kind["templates"][:-HELDOUT_TEMPLATES]
        text = r.choice(t).format(**slots)
        return kind, ws, text, args, result, answer, check


def conversation(agent_tools, r, n):
    """One or two corpus documents for one agent task (as gen_chat.tool_conversation: the call alone
    for half of them, so a model at temperature 0 ends its turn after the call)."""
    kind, ws, text, args, result, answer, _ = draw_task(r, heldout=False)
    text = decorate(text, r)
    shell = kind.get("shell", False) or r.random() < 0.5
    workspace = r.choice(WORKSPACES)
    tools = offered(agent_tools, shell, workspace)
    call_id = f"call_{n}"
    msgs = [{"role": "system", "content": SYSTEM.format(workspace)}, {"role": "user", "content": text},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": kind["tool"], "arguments": json.dumps(args, ensure_ascii=False, separators=(",", ":"))}}]}]
    call = {"messages": msgs, "tools": tools, "render": "tool_call_completion"}
    if r.random() < 0.5:
        return [call]
    msgs = msgs + [{"role": "tool", "tool_call_id": call_id, "content": result},
                   {"role": "assistant", "content": answer}]
    return [call, {"messages": msgs, "tools": tools}]


def heldout_task(r):
    """A held-out task for scripts/eval_agent.py: the workspace to create, the task, what the first
    call should be and what must hold afterwards (`check`: a file's content for writes and edits, a
    string the answer should contain otherwise)."""
    kind, ws, text, args, _, _, check = draw_task(r, heldout=True)
    shell = kind.get("shell", False) or r.random() < 0.5
    return {"kind": kind["key"], "task": text, "workspace": ws, "shell": shell, "expected_tool": kind["tool"],
            "expected_args": args, "check": check}
