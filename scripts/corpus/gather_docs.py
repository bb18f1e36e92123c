#!/usr/bin/env python3
"""Deterministic plain-text documents from Debian-packaged documentation on this machine.

Sources, in this order, each up to its share of --max-mb (docs/MODEL.md lists them):
  licenses    /usr/share/common-licenses/*                       (all; identical texts once)
  copyright   /usr/share/doc/*/copyright                         (paragraphs seen before dropped)
  readme      /usr/share/doc/*/README*  (plain or .gz)           (first 64 KiB of each)
  changelog   /usr/share/doc/*/changelog.Debian.gz               (first 12 KiB of each: newest entries)
  man         /usr/share/man/man{1,5,8}/*.gz rendered by groff -mandoc -Tutf8 (80 columns)
Only files an installed Debian package ships (dpkg's file lists) are used; files that are
not UTF-8 are skipped (and listed). Packages, and so paths, are visited in a fixed
order: sorted, man pages by a SHA-256 of their name. Long texts are cut into documents of at most
8 KiB at paragraph breaks. Writes OUT (JSONL of {"text"}) and OUT.sources.tsv (what was used).
Standard library only.
"""
import argparse
import concurrent.futures
import glob
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys

SHARES = {"licenses": 0.06, "copyright": 0.2, "readme": 0.3, "changelog": 0.2, "man": 0.24}
DOC_MAX = 8192
CTRL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def read_text(path, limit):
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            data = f.read(limit)
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(data) - 3 and len(data) == limit:  # cut inside a character at the limit
            text = data[:e.start].decode("utf-8")
        else:
            return None
    except (OSError, EOFError):
        return None
    return CTRL.sub("", text.replace("\r\n", "\n"))


def chunks(text):
    text = text.strip()
    out, cur = [], ""
    for para in re.split(r"\n\s*\n", text):
        if cur and len(cur) + len(para) + 2 > DOC_MAX:
            out.append(cur)
            cur = ""
        cur = (cur + "\n\n" + para) if cur else para
        while len(cur.encode()) > DOC_MAX:
            cut = cur.rfind("\n", 0, DOC_MAX // 2) if "\n" in cur[:DOC_MAX // 2] else DOC_MAX // 2
            out.append(cur[:cut])
            cur = cur[cut:].lstrip("\n")
    if cur.strip():
        out.append(cur)
    return out


def render_man(path):
    """groff directly (what `man -l` runs, without man-db's lookups): plain UTF-8, 80 columns."""
    try:
        with gzip.open(path, "rb") as f:
            src = f.read(1 << 20)
        p = subprocess.run(["groff", "-mandoc", "-Tutf8", "-t", "-P-cbou", "-rLL=80n", "-rcR=1", "-rHY=0", "-dAD=l"], input=src,
                           capture_output=True, env=dict(os.environ, LC_ALL="C.UTF-8"), timeout=30)
    except (OSError, EOFError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    try:
        text = p.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return CTRL.sub("", re.sub(r".\x08", "", text))


def debian_packages():
    """Package names in the Debian archive's package lists apt holds (the files it fetched from a
    debian.org host, decompressed by apt-helper); None when there are none. Packages installed from
    other repositories (vendor SDKs) are not in them."""
    lists = sorted(glob.glob("/var/lib/apt/lists/*debian.org*_Packages*"))
    names = set()
    for f in lists:
        try:
            p = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", f], capture_output=True, timeout=300, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        names.update(m.decode() for m in re.findall(rb"^Package: (\S+)$", p.stdout, re.M))
    return names or None


def dpkg_owned():
    """Every path an installed package from the Debian archive ships (/var/lib/dpkg/info/*.list)
    mapped to its package; packages from other repositories (vendor SDKs) are left out. Without apt
    lists (no `apt-get update` yet) every installed package counts."""
    lists = sorted(glob.glob("/var/lib/dpkg/info/*.list"))
    archive = debian_packages()
    owner = {}
    for lst in lists:
        pkg = os.path.basename(lst)[:-5].split(":")[0]
        if archive is not None and pkg not in archive:
            continue
        with open(lst, encoding="utf-8", errors="replace") as f:
            for line in f:
                owner.setdefault(line.rstrip("\n"), pkg)
    return owner


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-mb", type=float, default=16.0)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    budget = {k: int(v * a.max_mb * 1e6) for k, v in SHARES.items()}
    used = {k: 0 for k in SHARES}
    seen = set()
    docs, sources, skipped = [], [], []
    owner = dpkg_owned()

    def full(kind):
        return used[kind] >= budget[kind] * 0.98

    def add(kind, path, text):
        if path not in owner:  # only what Debian packages ship (not pip/npm/vendor installs)
            return
        if text is None:
            skipped.append(path)
            return
        if kind == "copyright":
            paras = []
            for p in re.split(r"\n\s*\n", text):
                h = hashlib.sha256(p.strip().encode()).digest()
                if h not in seen:
                    seen.add(h)
                    paras.append(p)
            text = "\n\n".join(paras)
        else:
            h = hashlib.sha256(text.encode()).digest()
            if h in seen:
                return
            seen.add(h)
        n = len(text.encode())
        if n < 200 or used[kind] + n > budget[kind]:
            return
        used[kind] += n
        docs.extend(chunks(text))
        sources.append((kind, owner[path], path, n, hashlib.sha256(text.encode()).hexdigest()[:16]))

    for p in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(p):
            add("licenses", p, read_text(p, 1 << 20))
    pkgs = sorted(glob.glob("/usr/share/doc/*/"))
    for d in pkgs:
        if not full("copyright") and d + "copyright" in owner:
            add("copyright", d + "copyright", read_text(d + "copyright", 1 << 18))
    for d in pkgs:
        for p in sorted(glob.glob(d + "README*")):
            if not full("readme") and p in owner and not p.endswith((".html", ".html.gz", ".pdf")):
                add("readme", p, read_text(p, 64 << 10))
    for d in pkgs:
        p = d + "changelog.Debian.gz"
        if not full("changelog") and p in owner:
            add("changelog", p, read_text(p, 12 << 10))
    pages = [p for s in ("1", "5", "8") for p in glob.glob(f"/usr/share/man/man{s}/*.gz")
             if p in owner and os.path.isfile(p) and not os.path.islink(p)]
    pages.sort(key=lambda p: hashlib.sha256(os.path.basename(p).encode()).hexdigest())
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as ex:
        for i in range(0, len(pages), 8):
            if used["man"] >= budget["man"] * 0.98:
                break
            batch = pages[i:i + 8]
            for p, text in zip(batch, ex.map(render_man, batch)):
                add("man", p, text)
    with open(a.out, "w", encoding="utf-8") as f:
        for t in docs:
            f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    with open(a.out + ".sources.tsv", "w", encoding="utf-8") as f:
        f.write("kind\tpackage\tpath\tbytes\tsha256_16\n")
        for s in sources:
            f.write("\t".join(map(str, s)) + "\n")
        for p in skipped:
            f.write(f"skipped\t{owner.get(p, '')}\t{p}\t0\t(not UTF-8 or unreadable)\n")
    print(json.dumps({"documents": len(docs), "bytes": used, "files": len(sources), "skipped": len(skipped)}),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
