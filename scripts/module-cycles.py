#!/usr/bin/env python3
"""Prints the import cycles between the agent's modules (strongly connected components of
the `crate::` / `super::` reference graph at file granularity; test code excluded).
Usage: python3 scripts/module-cycles.py [src]; exit 1 when there is a cycle."""
import os, re, sys

root = sys.argv[1] if len(sys.argv) > 1 else "src"
mods = {}  # module path (tuple) -> file
for d, _, fs in os.walk(root):
    for f in fs:
        if not f.endswith(".rs") or f in ("main.rs",) and d == root:
            continue
        rel = os.path.relpath(os.path.join(d, f), root)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib"):
            rel = rel[:-1]
        if rel and rel[-1] == "tests" or "testing" in rel:
            continue
        mods[tuple(rel)] = os.path.join(d, f)

def strip_tests(src):
    # drop `#[cfg(test)] mod ... { ... }` blocks (brace matching) and comments
    src = re.sub(r"//[^\n]*", "", src)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+\w+\s*\{", src):
        if m.start() < i:
            continue
        out.append(src[i:m.start()])
        depth, j = 1, m.end()
        while j < len(src) and depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        i = j
    out.append(src[i:])
    return "".join(out)

def resolve(path):
    # longest known module prefix of a path
    for n in range(len(path), 0, -1):
        if tuple(path[:n]) in mods:
            return tuple(path[:n])
    return None

edges = {m: set() for m in mods}
for m, f in mods.items():
    src = strip_tests(open(f).read())
    # expand `use crate::{a, b::c}` groups roughly: capture crate::ident(::ident)*
    for g in re.finditer(r"crate::((?:[a-z_0-9]+::)*)\{([^}]*)\}", src):
        base = [p for p in g.group(1).split("::") if p]
        for item in g.group(2).split(","):
            parts = base + [p for p in item.strip().split("::") if p and p != "self"]
            t = resolve(parts)
            if t and t != m:
                edges[m].add(t)
    for r in re.finditer(r"crate::([a-z_0-9]+(?:::[a-z_0-9]+)*)", src):
        t = resolve(r.group(1).split("::"))
        if t and t != m:
            edges[m].add(t)
    for r in re.finditer(r"super::([a-z_0-9]+(?:::[a-z_0-9]+)*)", src):
        parent = list(m[:-1]) if not f.endswith("mod.rs") else list(m[:-1])
        t = resolve(parent + r.group(1).split("::"))
        if t and t != m:
            edges[m].add(t)
# a child module file referencing its parent mod.rs is fine (parent/child); drop child->ancestor
for m in edges:
    edges[m] = {t for t in edges[m] if not (len(t) < len(m) and m[:len(t)] == t)}

# Tarjan
index, low, stack, on, sccs, c = {}, {}, [], set(), [], [0]
sys.setrecursionlimit(10000)
def visit(v):
    index[v] = low[v] = c[0]; c[0] += 1; stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        sccs.append(comp)
for v in sorted(mods):
    if v not in index:
        visit(v)
bad = [s for s in sccs if len(s) > 1]
for s in bad:
    names = sorted("/".join(x) or "lib" for x in s)
    print(f"cycle of {len(s)}: " + ", ".join(names))
    inside = set(s)
    for a in sorted(s):
        for b in sorted(edges[a] & inside):
            print(f"    {'/'.join(a)} -> {'/'.join(b)}")
print(f"{len(bad)} cycle(s) among {len(mods)} modules")
sys.exit(1 if bad else 0)
