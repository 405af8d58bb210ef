#!/usr/bin/env python3
"""Public fns of the production crates (src/, actors/src/) that no production code names.

Production code is src/ and actors/src/ without their test code: items under `#[cfg(test)]`
(inline `mod tests { … }`, fns, impls) and the files such an item declares (`#[cfg(test)]
mod tests;`, with or without `#[path]`, and the files below them). The tests in tests/ and
the bench in bench/src are not production: a public fn only they call is a test-only path
(issue 32). Heuristic: by name, comments left out, so a name used in production code under
another owner hides it (a list is kept below for the trait methods every type spells).

    python3 scripts/dev/uncalled.py      # one line per fn, then the count; exit 0
"""
import os
import re
import sys

ROOTS = ["src", "actors/src", "bench/src"]
# The crates whose public fns are listed (the bench's are its own business).
LISTED = ("src", "actors/src")
# Trait methods and entry points named by the language or a framework, not by a caller.
TRAITS = {
    "new", "default", "fmt", "from", "try_from", "drop", "handle", "started", "stopped",
    "name", "deserialize", "serialize", "into_response", "error_response", "status_code",
    "main", "from_str", "deref", "as_ref", "eq", "cmp", "partial_cmp", "hash", "clone",
}
# Public fns kept for the tests on purpose, each with why; printed, never counted.
KEPT = {
    "is_fenced": "how a caller tells a fenced write (SQLSTATE MXFEN) from other store errors; "
                 "production stops on the lease check instead (tests/lease_fencing.rs)",
    "load_layered_with_env": "the tests' seam into the very layers `load_layered` loads, with "
                             "their own MSGX_* pairs (the process environment is shared)",
}
CFG_TEST = re.compile(r"#\[cfg\(test\)\]")
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]')


def blank_comments(s):
    """`s` with comments (line, block, doc) blanked, strings and chars kept, offsets kept."""
    out, i, n = list(s), 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith("//", i):
            j = s.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif s.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                depth += s.startswith("/*", j) - s.startswith("*/", j)
                j += 2 if s.startswith(("/*", "*/"), j) else 1
            out[i:j] = [ch if ch == "\n" else " " for ch in s[i:j]]
            i = j
        elif literal_end(s, i) is not None:
            i = literal_end(s, i)
        else:
            i += 1
    return "".join(out)


def literal_end(s, i):
    """The offset just past the string or char literal starting at `i` (`"…"`, `r#"…"#`,
    `'x'`), or None when none starts there (a lifetime is no literal)."""
    c = s[i]
    if c == "r" and re.match(r'r#*"', s[i:i + 8]) and not (s[i - 1:i].isalnum() or s[i - 1:i] == "_"):
        hashes = len(re.match(r"r(#*)", s[i:]).group(1))
        end = s.find('"' + "#" * hashes, i + 2 + hashes)
        return len(s) if end < 0 else end + 1 + hashes
    if c == '"':
        j = i + 1
        while j < len(s) and s[j] != '"':
            j += 2 if s[j] == "\\" else 1
        return j + 1
    if c == "'":
        m = re.match(r"'(\\.|\\u\{[0-9a-fA-F]+\}|[^\\'])'", s[i:i + 12])
        return i + len(m.group(0)) if m else None
    return None


def item_end(code, i):
    """(end offset, declared module or None) of the item starting at `i`: through its
    matching `}`, or through its `;` when that comes first (`mod name;`, `use …;`)."""
    depth, j = 0, i
    while j < len(code):
        c = code[j]
        end = literal_end(code, j)
        if end is not None:
            j = end
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j + 1, None
        elif c == ";" and depth == 0:
            m = re.search(r"\bmod\s+(\w+)\s*$", code[i:j])
            return j + 1, (m.group(1) if m else None)
        j += 1
    return len(code), None


def module_file(path, module, attrs):
    """The file a `mod module;` in `path` names (its `#[path]` if given)."""
    d = os.path.dirname(path)
    explicit = PATH_ATTR.search(attrs)
    if explicit:
        return os.path.normpath(os.path.join(d, explicit.group(1)))
    base = os.path.basename(path)
    own = d if base in ("mod.rs", "lib.rs", "main.rs") else os.path.join(d, base[:-3])
    flat = os.path.join(own, module + ".rs")
    return flat if os.path.exists(flat) else os.path.join(own, module, "mod.rs")


def production(path, text, test_files):
    """`text` without its `#[cfg(test)]` items (blanked, offsets kept); the files its test
    modules declare are added to `test_files`."""
    code = blank_comments(text)
    out = list(code)
    for m in CFG_TEST.finditer(code):
        end, module = item_end(code, m.end())
        if module:
            test_files.add(module_file(path, module, code[m.start():end]))
        out[m.start():end] = [ch if ch == "\n" else " " for ch in code[m.start():end]]
    return "".join(out)


def main():
    texts = {}
    for root in ROOTS:
        for dp, _, fs in os.walk(root):
            for f in fs:
                if f.endswith(".rs"):
                    p = os.path.normpath(os.path.join(dp, f))
                    texts[p] = open(p, encoding="utf-8").read()
    test_files = set()
    prod = {p: production(p, t, test_files) for p, t in texts.items()}
    tests_dirs = tuple(f[:-3] + os.sep for f in test_files if f.endswith(".rs"))
    prod = {p: s for p, s in prod.items() if p not in test_files and not p.startswith(tests_dirs)}
    defs, all_defs = [], {}
    for p, s in sorted(prod.items()):
        for m in re.finditer(r"^[ \t]*(pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)", s, re.M):
            name = m.group(2)
            all_defs[name] = all_defs.get(name, 0) + 1
            if m.group(1) and m.group(1).strip() == "pub" and p.startswith(LISTED):
                defs.append((p, s[:m.start()].count("\n") + 1, name))
    everything = "\n".join(prod.values())
    out, kept = [], []
    for p, line, name in defs:
        if name in TRAITS:
            continue
        if name in KEPT:
            kept.append(f"# kept: {p}:{line} {name}: {KEPT[name]}")
            continue
        named = len(re.findall(r"\b" + re.escape(name) + r"\b", everything))
        if named <= all_defs[name]:
            out.append(f"{p}:{line} {name}")
    print("\n".join(out + kept))
    print(f"# {len(out)} pub fns named only at their definition (production code: "
          f"{len(prod)} files, {len(test_files)} test files left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
