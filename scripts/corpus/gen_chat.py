#!/usr/bin/env python3
"""Deterministic generator of chat and tool-use conversations (OpenAI request shapes).

Writes, for a seed and a count:
  OUT/chat.jsonl          one conversation per line: {"messages": [...], "tools": [...]}
                          (rendered later by `fathom corpus render` with the server's template)
  OUT/heldout_tools.jsonl held-out requests: {"messages", "tools", "expected_tool"}; their tool
                          names and request templates never occur in chat.jsonl
  OUT/heldout_agent.jsonl with --agent-tools: held-out `fathom agent` tasks (agent_tasks.py), for
                          scripts/eval_agent.py
  OUT/split.json          the tool names and template ids of each side (for tests and docs)
Standard library only; the same seed and count give the same bytes.
"""
import argparse
import hashlib
import json
import random
import re
import sys

from tool_concepts import CONCEPTS, HELDOUT_TEMPLATES
import agent_tasks
from chat_pools import SLOTS, SYSTEM_PROMPTS, decorate, plain_chat, no_tool_request


def stable_hash(s):
    return int.from_bytes(hashlib.sha256(s.encode()).digest()[:8], "little")


def join_style(parts, style):
    if style == "snake":
        return "_".join(parts)
    if style == "camel":
        return parts[0] + "".join(p.capitalize() for p in parts[1:])
    return "-".join(parts)  # kebab


def style_name(verb, noun, style):
    return join_style([verb] + noun.split("_"), style)


def build_names():
    """{concept key: (train names, heldout names)}; a (verb, noun) pair is held out in all styles."""
    out, seen = {}, {}
    for c in CONCEPTS:
        combos = [(v, n) for v in c["verbs"] for n in c["nouns"]]
        held = [vn for vn in combos if stable_hash(c["key"] + ":" + "_".join(vn)) % 6 == 0]
        if not held:
            held = [min(combos, key=lambda vn: stable_hash(c["key"] + "|" + "_".join(vn)))]
        train, heldout = [], []
        for vn in combos:
            for style in ("snake", "camel", "kebab"):
                name = style_name(vn[0], vn[1], style)
                if name in seen:
                    raise SystemExit(f"tool name {name} is built by both {seen[name]} and {c['key']}")
                seen[name] = c["key"]
                (heldout if vn in held else train).append(name)
        out[c["key"]] = (train, heldout)
    return out


def schema(c, r):
    props = {}
    for name, typ, desc, _ in c["params"]:
        props[name] = {"type": typ, "description": desc}
    req = [p[0] for p in c["params"] if p[3]]
    return {"type": "object", "properties": props, "required": req}


def tool_def(c, name, r):
    return {"type": "function", "function": {"name": name, "description": c["desc"], "parameters": schema(c, r)}}


def fill(c, template, r):
    """Fills a template's {slots} in the tool's parameter order; returns (text, args)."""
    slots = set(re.findall(r"\{(\w+)\}", template))
    args = {}
    for p in c["params"]:
        if p[0] in slots:
            args[p[0]] = SLOTS[p[0]](r, args)
    missing = slots - set(args)
    if missing:
        raise SystemExit(f"{c['key']}: template {template!r} has slots that are not parameters: {missing}")
    return template.format(**args), args


def ordered_args(c, args):
    return {p[0]: args[p[0]] for p in c["params"] if p[0] in args}


def derive(result):
    d = {}
    for k, v in result.items():
        if isinstance(v, list):
            if v and isinstance(v[0], dict):
                d["top"] = v[0].get("title", "")
                d["n_results"] = len(v)
                d["summary"] = "; ".join(f"day {x['day']} {x['conditions']} {x['low']} to {x['high']}" for x in v
                                         if "day" in x)
                v = ", ".join(str(x.get("title", x)) for x in v)
            else:
                d["top"] = v[0] if v else "nothing"
                v = ", ".join(v) if v else "nothing"
        d[k] = v
    return d


def answer(c, args, result, r):
    fields = dict(args)
    fields.update(derive(result))
    return r.choice(c["answers"]).format(**fields)


# Concepts a request of one could plausibly mean the other; never offered together.
CONFUSABLE = [{"weather", "forecast"}, {"reminder", "alarm", "timer"}, {"translate", "define"},
              {"send_email", "sms"}, {"flights", "directions"}]


def confusable(a, b):
    return any(a["key"] in g and b["key"] in g for g in CONFUSABLE)


# Share of training conversations whose tools get fresh made-up names instead of names from the
# concept's verb x noun list (--fresh-names). With only the list, ~40 names per concept each recur
# dozens of times and a small model memorises them and calls a remembered name (measured: 0% right
# on the held-out set at 2.7M tokens, every reply a well-formed call to a training name). A name
# nobody has seen before can only be copied from the tool list in the prompt, which is what
# held-out tools need. docs/MODEL.md has what each recipe measured.
FRESH_NAMES = 0.6
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
REAL_WORDS = {w for c in CONCEPTS for w in c["verbs"] + [p for n in c["nouns"] for p in n.split("_")]}
# English words no concept uses: fresh names made of them look like real names without naming the
# capability, so copying, not recalling, is what produces them.
NEUTRAL_WORDS = """amber falcon river stone maple orbit cedar harbor violet copper meadow lantern
    silver pine comet willow ember granite coral summit breeze canyon aspen quartz delta echo nova
    pixel atlas beacon cobalt drift fable glade hollow iris jade kestrel lumen marble nectar onyx
    prism quill raven sable thistle umber vortex wren yarrow zephyr basalt citrus dune fern grove
    heron indigo juniper kelp lotus mango nimbus olive pebble quiver rustic saffron tundra""".split()
assert not set(NEUTRAL_WORDS) & REAL_WORDS


def pseudo_word(r):
    while True:
        w = "".join(r.choice(CONSONANTS) + r.choice(VOWELS) for _ in range(r.randint(2, 3)))
        if r.random() < 0.3:
            w += r.choice(CONSONANTS)
        if w not in REAL_WORDS:
            return w


def fresh_name(r, taken=frozenset(), words=False):
    """2-3 parts in one of the three styles. Without `words` every part is a pseudo-word (the
    default recipe); with it, a pseudo-word (50%), a neutral English word (35%) or a word of any
    concept (15%, so a concept word in a name is no hint). Never a list name (`taken`), so no
    held-out name can occur in training."""
    while True:
        if not words:
            parts = [pseudo_word(r) for _ in range(r.randint(2, 3))]
        else:
            parts = []
            for _ in range(r.randint(2, 3)):
                u = r.random()
                parts.append(pseudo_word(r) if u < 0.5 else r.choice(NEUTRAL_WORDS) if u < 0.85
                             else r.choice(sorted(REAL_WORDS)))
        name = join_style(parts, r.choice(("snake", "camel", "kebab")))
        if name not in taken:
            return name


# The recipe's knobs (set from the command line in main()).
RECIPE = {"fresh_names": FRESH_NAMES, "fresh_words": False, "word_noise": 0.0}


def noisy_template(template, r):
    """The template with each word outside its {slots} swapped for a pseudo-word half the time: a
    request whose words say little, so the call must follow the values it carries (a tracking
    number, "45 minutes", a file path) and the tool list. Training only (--word-noise)."""
    parts = re.split(r"(\{\w+\})", template)
    swap = lambda m: pseudo_word(r) if r.random() < 0.5 else m.group(0)
    return "".join(p if p.startswith("{") else re.sub(r"[A-Za-z]+", swap, p) for p in parts)


_LIST_NAMES = {}


def all_list_names(names):
    """Every list name, training and held-out (cached per names table)."""
    key = id(names)
    if key not in _LIST_NAMES:
        _LIST_NAMES[key] = frozenset(n for t, h in names.values() for n in t + h)
    return _LIST_NAMES[key]


def pick_tools(c, names, r, n_other, side, fresh=False):
    """The right tool plus n_other distractors from other concepts, shuffled; fresh: made-up names."""
    taken = all_list_names(names)
    pick = ((lambda key: fresh_name(r, taken, RECIPE["fresh_words"])) if fresh
            else (lambda key: r.choice(names[key][side])))
    name = pick(c["key"])
    others = r.sample([o for o in CONCEPTS if o["key"] != c["key"] and not confusable(c, o)], n_other)
    tools = [(c, name)] + [(o, pick(o["key"])) for o in others]
    r.shuffle(tools)
    return name, [tool_def(t, n, r) for t, n in tools]


def user_text(c, r, templates, noise=False):
    t_index = r.randrange(len(templates))
    template = templates[t_index]
    if noise and r.random() < RECIPE["word_noise"]:
        template = noisy_template(template, r)
    text, args = fill(c, template, r)
    return decorate(text, r), ordered_args(c, args), t_index


def system_messages(r):
    s = r.choice(SYSTEM_PROMPTS)
    return [{"role": "system", "content": s}] if s else []


def tool_turn(c, name, r, call_no):
    text, args, _ = user_text(c, r, c["templates"][:-HELDOUT_TEMPLATES], noise=RECIPE["word_noise"] > 0)
    result = c["result"](r, args)
    call_id = f"call_{call_no}"
    return [{"role": "user", "content": text},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {
                "name": name, "arguments": json.dumps(args, ensure_ascii=False, separators=(",", ":"))}}]},
            {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result, ensure_ascii=False)},
            {"role": "assistant", "content": answer(c, args, result, r)}]


def tool_conversation(names, r, n):
    """One or two documents: the call as the model should emit it (the server's prompt, then the calls
    closed and EOS), and the whole exchange as the template renders it (the prompt the server builds
    once the tool result is back, then the answer). DeepSeek-V3's template renders a second tool
    round irregularly (docs/tokenizer.md), so follow-ups are plain chat only."""
    c = r.choice(CONCEPTS)
    name, tools = pick_tools(c, names, r, r.randint(0, 3), 0, fresh=r.random() < RECIPE["fresh_names"])
    msgs = system_messages(r) + tool_turn(c, name, r, n)
    call = {"messages": msgs[:-2], "tools": tools, "render": "tool_call_completion"}
    # Both documents continue the same prefix after <｜tool▁call▁end｜>: (a) with the calls closed,
    # (b) with the template's <｜tool▁outputs▁begin｜>. Writing (b) for half the conversations makes
    # closing the call the likelier continuation (2:1), so a model at temperature 0 ends its turn
    # there instead of inventing a tool result.
    if r.random() >= 0.5:
        return [call]
    if r.random() < 0.15:
        msgs += no_tool_request(r)
    return [call, {"messages": msgs, "tools": tools}]


def multi_call_conversation(names, r, n):
    """Parallel calls: 2-4 tools offered, the user asks for two or three of them in one turn, and the
    reply is one call per request in the order asked (the call document only). Each call is another
    pick-and-copy of an offered name at the cost of one prompt."""
    fresh = r.random() < RECIPE["fresh_names"]
    taken = all_list_names(names)
    picked = []
    for c in r.sample(CONCEPTS, len(CONCEPTS)):
        if all(not confusable(c, o) and c["key"] != o["key"] for o in picked):
            picked.append(c)
        if len(picked) == 4:
            break
    n_tools = r.randint(2, 4)
    offered = picked[:n_tools]
    tool_names = [fresh_name(r, taken, RECIPE["fresh_words"]) if fresh else r.choice(names[c["key"]][0]) for c in offered]
    order = r.sample(range(n_tools), r.randint(2, min(3, n_tools)))
    texts, calls = [], []
    for k, i in enumerate(order):
        c = offered[i]
        text, args, _ = user_text(c, r, c["templates"][:-HELDOUT_TEMPLATES])
        if k:
            text = r.choice(["Also, ", "And ", "Then ", "Plus, "]) + text[0].lower() + text[1:]
        texts.append(text)
        calls.append({"id": f"call_{n}_{k}", "type": "function", "function": {
            "name": tool_names[i], "arguments": json.dumps(args, ensure_ascii=False, separators=(",", ":"))}})
    tools = [tool_def(c, name, r) for c, name in zip(offered, tool_names)]
    perm = list(range(n_tools))
    r.shuffle(perm)
    msgs = system_messages(r) + [{"role": "user", "content": " ".join(texts)},
                                 {"role": "assistant", "content": None, "tool_calls": calls}]
    return {"messages": msgs, "tools": [tools[i] for i in perm], "render": "tool_call_completion"}


# Plain-text copy drills: a random sequence of names and words, then the same sequence again. Every
# token of the repeat is predictable only by finding its earlier occurrence and copying what
# followed it — the induction circuit a model needs to copy a tool's name out of the tool list.
# Small transformers form it quickly on repeated random sequences and slowly on natural text; the
# tool-call documents alone give it a handful of targets per 250 tokens.
def copy_drill(names, r):
    taken = all_list_names(names)
    items = []
    for _ in range(r.randint(12, 40)):
        u = r.random()
        items.append(fresh_name(r, taken, True) if u < 0.5 else r.choice(NEUTRAL_WORDS) if u < 0.7
                     else pseudo_word(r) if u < 0.9 else str(r.randint(0, 9999)))
    line = " ".join(items)
    return {"text": line + "\n" + line + "\n"}


def no_tool_conversation(names, r):
    c = r.choice(CONCEPTS)
    _, tools = pick_tools(c, names, r, r.randint(0, 2), 0, fresh=r.random() < RECIPE["fresh_names"])
    return {"messages": system_messages(r) + no_tool_request(r), "tools": tools}


def heldout_request(names, r):
    c = r.choice(CONCEPTS)
    name, tools = pick_tools(c, names, r, r.randint(0, 3), 1)
    text, _, t_index = user_text(c, r, c["templates"][-HELDOUT_TEMPLATES:])
    return {"messages": system_messages(r) + [{"role": "user", "content": text}], "tools": tools,
            "expected_tool": name, "template": f"{c['key']}#{len(c['templates']) - HELDOUT_TEMPLATES + t_index}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--conversations", type=int, default=60000)
    ap.add_argument("--heldout", type=int, default=400)
    ap.add_argument("--fresh-names", type=float, default=FRESH_NAMES,
                    help="share of tool conversations whose tools get made-up names")
    ap.add_argument("--fresh-words", action="store_true",
                    help="made-up names mix English words into the pseudo-words")
    ap.add_argument("--word-noise", type=float, default=0.0,
                    help="share of tool requests whose non-slot words are half swapped for pseudo-words")
    ap.add_argument("--copy-drills", type=float, default=0.0, help="share of lines that are copy drills")
    ap.add_argument("--parallel-calls", type=float, default=0.0,
                    help="share of lines that are parallel-call requests")
    ap.add_argument("--agent-tools", help="`fathom agent tools --json` output of the files and shell plugins, "
                    "with the dump's workspace as \"workspace\" (build.sh writes it); needed for --agent-share")
    ap.add_argument("--agent-share", type=float, default=0.0,
                    help="share of lines that are `fathom agent` tasks (agent_tasks.py)")
    ap.add_argument("--agent-fresh", type=float, default=None,
                    help="share of agent tasks' file names and written texts that are made up "
                    "(default: 0.3 of file names, no written texts)")
    ap.add_argument("--heldout-agent", type=int, default=200, help="held-out agent tasks (with --agent-tools)")
    ap.add_argument("--no-tool-share", type=float, default=0.15, help="share of tools-offered, no-call chats")
    ap.add_argument("--plain-share", type=float, default=0.13, help="share of chats without tools")
    a = ap.parse_args()
    RECIPE["fresh_names"], RECIPE["fresh_words"] = a.fresh_names, a.fresh_words
    if not 0 <= a.word_noise <= 1:
        raise SystemExit(f"--word-noise must be in [0, 1], not {a.word_noise}")
    RECIPE["word_noise"] = a.word_noise
    if a.agent_fresh is not None:
        agent_tasks.RECIPE["fresh"] = agent_tasks.RECIPE["fresh_writes"] = a.agent_fresh
    tool_share = 1.0 - a.copy_drills - a.parallel_calls - a.no_tool_share - a.plain_share - a.agent_share
    if not 0 < tool_share <= 1 or min(a.copy_drills, a.parallel_calls, a.no_tool_share, a.plain_share,
                                      a.agent_share) < 0:
        raise SystemExit(f"shares must be non-negative and leave a positive tool-use share, not {tool_share:.3f}")
    agent_tools = None
    if a.agent_tools:
        with open(a.agent_tools, encoding="utf-8") as f:
            agent_tools = json.load(f)
    elif a.agent_share > 0:
        raise SystemExit("--agent-share needs --agent-tools")
    names = build_names()
    r = random.Random(a.seed)
    with open(f"{a.out}/chat.jsonl", "w", encoding="utf-8") as f:
        for i in range(a.conversations):
            u = r.random()
            # tool use, no tool needed, plain chat, then the optional kinds: with the optional
            # kinds at 0 the draws are those of the default recipe.
            if u < tool_share:
                docs = tool_conversation(names, r, i)
            elif u < tool_share + a.no_tool_share:
                docs = [no_tool_conversation(names, r)]
            elif u < tool_share + a.no_tool_share + a.plain_share:
                docs = [{"messages": system_messages(r) + plain_chat(r)}]
            elif u < tool_share + a.no_tool_share + a.plain_share + a.copy_drills:
                docs = [copy_drill(names, r)]
            elif u < tool_share + a.no_tool_share + a.plain_share + a.copy_drills + a.agent_share:
                docs = agent_tasks.conversation(agent_tools, r, i)
            else:
                docs = [multi_call_conversation(names, r, i)]
            for d in docs:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")
    hr = random.Random(a.seed * 7919 + 17)
    with open(f"{a.out}/heldout_tools.jsonl", "w", encoding="utf-8") as f:
        for _ in range(a.heldout):
            f.write(json.dumps(heldout_request(names, hr), ensure_ascii=False) + "\n")
    if agent_tools:
        ar = random.Random(a.seed * 104729 + 31)
        with open(f"{a.out}/heldout_agent.jsonl", "w", encoding="utf-8") as f:
            for _ in range(a.heldout_agent):
                f.write(json.dumps(agent_tasks.heldout_task(ar), ensure_ascii=False) + "\n")
    split = {"train_names": sorted(n for t, _ in names.values() for n in t),
             "heldout_names": sorted(n for _, h in names.values() for n in h),
             "train_templates": sorted(f"{c['key']}#{i}" for c in CONCEPTS
                                       for i in range(len(c["templates"]) - HELDOUT_TEMPLATES)),
             "heldout_templates": sorted(f"{c['key']}#{i}" for c in CONCEPTS
                                         for i in range(len(c["templates"]) - HELDOUT_TEMPLATES, len(c["templates"])))}
    with open(f"{a.out}/split.json", "w", encoding="utf-8") as f:
        json.dump(split, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
