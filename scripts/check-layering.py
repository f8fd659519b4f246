#!/usr/bin/env python3
"""The layering check: no import cycle between the modules of a crate, and
in the gateway no module using one declared after it in `lib.rs`.

    scripts/check-layering.py              check gateway/src and control-stub/src
    scripts/check-layering.py --self-test  check the checker on planted faults

A module is a file: `src/a.rs` or `src/a/mod.rs` is `crate::a`,
`src/a/b.rs` is `crate::a::b`. A file depends on another when it names a
path into it: a `use` of `crate::`, `super::` or `self::` (use trees
expanded), or such a path written inline in code (`crate::x::f()`). A name
that a `mod.rs` or `lib.rs` re-exports (`pub use b::Name`) is followed to
the file that defines it, so a parent's re-export is not a dependency on
the parent. Comments, strings and `#[cfg(test)]` items are left out: unit
tests may reach anything, the product may not.

Exit status 1 when anything is found, each finding naming the two files
and the names the first takes from the second, as a reviewer would want
to read it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

# (crate source folder, check the declared order of lib.rs too)
CRATES = [("gateway/src", True), ("control-stub/src", False)]


def strip_comments_and_strings(text: str) -> str:
    """The code with every comment, string and char literal blanked out
    (newlines kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 260]) if c in "rb" else None
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find('"' + m.group(1), i + m.end())
            end = n if end < 0 else end + 1 + len(m.group(1))
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i:j + 1]))
            i = j + 1
            continue
        if c == "'":
            # A char literal ('a', '\n', '\u{1F600}'), not a lifetime ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'", text[i:i + 12])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
                continue
        out.append(c)
        i += 1
    return "".join(out)


def drop_test_items(code: str) -> str:
    """`code` without the items under `#[cfg(test)]`: a `mod … { … }`
    block, a `use …;`, or any other item up to its end."""
    out = code
    for m in reversed(list(re.finditer(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]", code))):
        start = m.start()
        j = m.end()
        # The item: up to its first `;` at depth 0, or its braced body.
        depth = 0
        while j < len(out):
            ch = out[j]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif ch == ";" and depth == 0:
                j += 1
                break
            j += 1
        out = out[:start] + re.sub(r"[^\n]", " ", out[start:j]) + out[j:]
    return out


def expand_use_tree(tree: str) -> list[list[str]]:
    """`a::{b, c::{d, e as f}, self}` → [[a,b], [a,c,d], [a,c,e], [a]]."""
    tree = re.sub(r"\s*(::|\{|\}|,)\s*", r"\1", tree.strip())
    paths: list[list[str]] = []

    def walk(prefix: list[str], s: str) -> None:
        # split s at top-level commas
        depth, part, parts = 0, "", []
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(part)
                part = ""
            else:
                part += ch
        if part:
            parts.append(part)
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = [x for x in p[:brace].split("::") if x]
                walk(prefix + head, p[brace + 1:p.rfind("}")])
            else:
                segs = [x for x in re.split(r"\s+as\s+", p)[0].split("::") if x]
                if segs == ["self"]:
                    paths.append(list(prefix))
                else:
                    paths.append(prefix + segs)

    walk([], tree)
    return paths


@dataclass
class Module:
    path: tuple[str, ...]  # () is the crate root
    file: str
    is_dir: bool  # mod.rs / lib.rs: its children are path + (child,)
    code: str = ""
    reexports: dict[str, list[str]] = field(default_factory=dict)


class Crate:
    def __init__(self, src: str):
        self.src = src
        self.modules: dict[tuple[str, ...], Module] = {}
        for root, _dirs, files in os.walk(src):
            for f in files:
                if not f.endswith(".rs"):
                    continue
                full = os.path.join(root, f)
                rel = os.path.relpath(full, src)
                parts = rel[:-3].split(os.sep)
                if parts == ["lib"]:
                    key, is_dir = (), True
                elif parts == ["main"] or parts[0] == "bin":
                    continue  # a binary is a crate of its own over the library
                elif parts[-1] == "mod":
                    key, is_dir = tuple(parts[:-1]), True
                else:
                    key, is_dir = tuple(parts), False
                with open(full, encoding="utf-8") as fh:
                    code = drop_test_items(strip_comments_and_strings(fh.read()))
                self.modules[key] = Module(key, full, is_dir, code)
        for m in self.modules.values():
            m.reexports = self._reexports(m)

    def _uses(self, m: Module) -> list[tuple[list[str], int]]:
        """Every `use` path of `m`, absolute from the crate, with its line."""
        found = []
        for u in re.finditer(r"\b(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", m.code):
            line = m.code.count("\n", 0, u.start()) + 1
            for p in expand_use_tree(u.group(1)):
                ab = self.absolute(m, p)
                if ab is not None:
                    found.append((ab, line))
        return found

    def _reexports(self, m: Module) -> dict[str, list[str]]:
        out = {}
        for u in re.finditer(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]+);", m.code):
            for p in expand_use_tree(u.group(1)):
                ab = self.absolute(m, p)
                if ab:
                    out[ab[-1]] = ab
        return out

    def absolute(self, m: Module, p: list[str]) -> list[str] | None:
        """`p` as written in `m`, from the crate root; None for paths into
        other crates (std, a dependency)."""
        if not p:
            return None
        here = list(m.path) if m.is_dir else list(m.path[:-1])
        if p[0] == "crate":
            return p[1:]
        if p[0] == "self":
            return list(m.path) + p[1:] if m.is_dir else list(m.path) + p[1:]
        if p[0] == "super":
            base = list(m.path) if not m.is_dir else list(m.path)
            base = base[:-1]
            rest = p[1:]
            while rest and rest[0] == "super":
                base, rest = base[:-1], rest[1:]
            return base + rest
        # A bare path naming a child module of this one (2018 edition: a
        # `use child::x` in a mod.rs or lib.rs).
        if m.is_dir and tuple(here + [p[0]]) in self.modules:
            return here + p
        return None

    def resolve(self, path: list[str], depth: int = 0) -> tuple[Module, str] | None:
        """The file `path` leads into and the name taken there."""
        k = len(path)
        while k >= 0 and tuple(path[:k]) not in self.modules:
            k -= 1
        if k < 0:
            return None
        mod = self.modules[tuple(path[:k])]
        name = path[k] if k < len(path) else "self"
        if depth < 8 and name in mod.reexports and mod.reexports[name] != path:
            target = mod.reexports[name] + path[k + 1:]
            r = self.resolve(target, depth + 1)
            if r is not None:
                return r
        return mod, name

    def edges(self) -> dict[str, dict[str, set[str]]]:
        """file → file → names taken."""
        graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for m in self.modules.values():
            paths = [p for p, _ in self._uses(m)]
            for inline in re.finditer(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:::" + IDENT + r")+)", m.code):
                ab = self.absolute(m, inline.group(1).split("::"))
                if ab is not None:
                    paths.append(ab)
            # A bare inline path into a child module, in a mod.rs
            # (`child::f()`): the child is in scope by its `mod`, and no
            # other name can be (rustc refuses a `use` of the same name).
            if m.is_dir:
                children = {k[-1] for k in self.modules if len(k) == len(m.path) + 1 and k[:-1] == m.path}
                if children:
                    bare = r"(?<![A-Za-z0-9_:])((?:" + "|".join(sorted(children)) + r")(?:::" + IDENT + r")+)"
                    for inline in re.finditer(bare, m.code):
                        ab = self.absolute(m, inline.group(1).split("::"))
                        if ab is not None:
                            paths.append(ab)
            for p in paths:
                r = self.resolve(p)
                if r is None:
                    continue
                target, name = r
                if target.file == m.file or target.path == ():
                    continue
                # A parent reaching its own child through `mod` is not a
                # use; a re-export is followed above.
                graph[m.file][target.file].add(name)
        return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    nodes = set(graph) | {t for e in graph.values() for t in e}

    def strong(v: str) -> None:
        work = [(v, iter(sorted(graph.get(v, {}))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                    advanced = True
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return out


def shortest_cycle(graph, comp: list[str]) -> list[str]:
    """A shortest circle through the component's first file."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        nxt = []
        for v in queue:
            for w in sorted(graph.get(v, {})):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        queue = nxt
    return comp


def declared_order(crate: Crate) -> list[str]:
    root = crate.modules[()]
    return re.findall(r"\bpub\s+mod\s+(" + IDENT + r")\s*;", root.code) or re.findall(
        r"\bmod\s+(" + IDENT + r")\s*;", root.code
    )


def check(src: str, order: bool, shown: str | None = None) -> list[str]:
    crate = Crate(src)
    graph = crate.edges()
    shown = shown or src
    rel = lambda f: os.path.join(shown, os.path.relpath(f, src))  # noqa: E731
    names = lambda a, b: ", ".join(sorted(graph[a][b]))  # noqa: E731
    problems = []
    for comp in cycles(graph):
        circle = shortest_cycle(graph, comp)
        lines = [f"import cycle among {len(comp)} files of {shown}: " + ", ".join(rel(f) for f in comp)]
        lines.append("  one circle through them:")
        for a, b in zip(circle, circle[1:]):
            lines.append(f"    {rel(a)} -> {rel(b)}: {names(a, b)}")
        inside = [(a, b) for a in comp for b in sorted(graph.get(a, {})) if b in comp]
        if len(inside) > len(circle) - 1:
            lines.append(f"  every arrow among them ({len(inside)}):")
            for a, b in inside:
                lines.append(f"    {rel(a)} -> {rel(b)}: {names(a, b)}")
        problems.append("\n".join(lines))
    if order:
        declared = declared_order(crate)
        rank = {name: i for i, name in enumerate(declared)}
        by_file = {m.file: m for m in crate.modules.values()}
        for a in sorted(graph):
            ma = by_file[a]
            if not ma.path or ma.path[0] not in rank:
                continue
            for b in sorted(graph[a]):
                mb = by_file[b]
                if not mb.path or mb.path[0] not in rank:
                    continue
                if rank[mb.path[0]] > rank[ma.path[0]]:
                    problems.append(
                        f"{rel(a)} uses {rel(b)} ({names(a, b)}), but `{mb.path[0]}` is declared after "
                        f"`{ma.path[0]}` in {os.path.join(shown, 'lib.rs')}: a module may use only those above it"
                    )
    return problems


def self_test() -> int:
    """Plant each fault the check must find in a crate of its own, and check
    that a clean crate passes."""
    files = {
        "lib.rs": "pub mod low;\npub mod mid;\npub mod high;\n",
        "low.rs": "//! uses crate::high only in a comment\npub fn f() {}\n"
        'const S: &str = "crate::high::g";\n#[cfg(test)]\nmod tests { use crate::high::g; }\n',
        "mid/mod.rs": "pub mod a;\npub mod b;\npub use a::Thing;\n",
        "mid/a.rs": "use crate::low;\npub struct Thing;\n",
        "mid/b.rs": "use super::Thing;\npub fn h() { crate::low::f(); }\n",
        "high.rs": "use crate::mid::{self, a::Thing};\npub fn g() { crate::mid::b::h(); }\n",
    }

    def run(extra: dict[str, str]) -> list[str]:
        with tempfile.TemporaryDirectory() as d:
            for name, text in {**files, **extra}.items():
                os.makedirs(os.path.dirname(os.path.join(d, name)), exist_ok=True)
                with open(os.path.join(d, name), "w") as fh:
                    fh.write(text)
            return check(d, True, "src")

    failures = []
    clean = run({})
    if clean:
        failures.append("a clean crate was refused:\n" + "\n".join(clean))
    up = run({"low.rs": "pub fn f() { crate::high::g(); }\n"})
    if not any("src/low.rs uses src/high.rs (g)" in p for p in up):
        failures.append("a use of a later module was not found: " + repr(up))
    circle = run({"mid/a.rs": "use crate::low;\nuse super::b::h;\npub struct Thing;\n"})
    if not any("import cycle among 2 files" in p and "src/mid/a.rs -> src/mid/b.rs: h" in p for p in circle):
        failures.append("a cycle through a re-export was not found: " + repr(circle))
    bare = run({"mid/mod.rs": "pub mod a;\npub mod b;\npub use a::Thing;\npub struct Shared;\npub fn g() { b::h(); }\n",
                "mid/b.rs": "use super::Shared;\npub fn h() { crate::low::f(); }\n"})
    if not any("import cycle among 2 files" in p and "src/mid/mod.rs -> src/mid/b.rs: h" in p for p in bare):
        failures.append("a cycle through a mod.rs's bare path into its child was not found: " + repr(bare))
    tree = expand_use_tree("a::{b, c::{d, e as f}, self}")
    if tree != [["a", "b"], ["a", "c", "d"], ["a", "c", "e"], ["a"]]:
        failures.append(f"use tree expanded wrongly: {tree}")
    for f in failures:
        print("self-test: " + f, file=sys.stderr)
    print("self-test: " + ("failed" if failures else "passed"))
    return 1 if failures else 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = []
    for src, order in CRATES:
        problems += check(os.path.join(top, src), order, src)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"layering: {len(problems)} finding(s)", file=sys.stderr)
        return 1
    print("layering: no import cycle; every gateway module uses only those declared above it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
