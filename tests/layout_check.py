#!/usr/bin/env python3
"""Layout rules of the tree (DESIGN §12): no include cycle between modules (a .c/.h pair is a
module, and a module's private header, X_impl.h or X_state.h, belongs to module X; including
another module's header is an edge), no two top-level folders that include each other's
headers, and the gateway's side (base, cache, sql, backends, server) never includes the KV
kernels or the worker. Prints the folder edges. Usage: layout_check.py ROOT"""
import os, re, sys

root = sys.argv[1]
SRC = ["base", "hook", "cache", "kv", "sql", "backends", "server", "worker"]
def module(path):
    return re.sub(r"_(impl|state)$", "", os.path.splitext(path)[0])


inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
edges = {}
for top in SRC:
    for d, _, files in os.walk(os.path.join(root, top)):
        for f in files:
            if not f.endswith((".c", ".h")):
                continue
            path = os.path.relpath(os.path.join(d, f), root)
            mod = module(path)
            text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
            for h in inc.findall(text):
                other = module(h)
                if other != mod and os.path.exists(os.path.join(root, h)):
                    edges.setdefault(mod, set()).add(other)
fails = 0
# cycles between modules (Tarjan)
index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]
def strong(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in edges.get(v, ()):
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v: break
        if len(comp) > 1: comps.append(comp)
sys.setrecursionlimit(10000)
for v in list(edges):
    if v not in index: strong(v)
for c in comps:
    print("FAIL: include cycle between modules: " + " <-> ".join(sorted(c))); fails += 1
# top-level folders
top_edges = set()
for a, bs in edges.items():
    for b in bs:
        ta, tb = a.split("/")[0], b.split("/")[0]
        if ta != tb: top_edges.add((ta, tb))
for a, b in sorted(top_edges):
    if (b, a) in top_edges and a < b:
        print(f"FAIL: {a}/ and {b}/ include each other's headers"); fails += 1
# the gateway side never reaches the kernels or the worker
for a, b in sorted(top_edges):
    if a in ("server", "backends", "sql", "cache", "base", "hook") and b in ("kv", "worker"):
        print(f"FAIL: {a}/ includes {b}/ (the gateway must not link the kernels or the worker)"); fails += 1
print(f"{len(edges)} modules with includes, {sum(len(v) for v in edges.values())} edges, "
      f"{len(top_edges)} folder edges: " + ", ".join(f"{a}->{b}" for a, b in sorted(top_edges)))
sys.exit(1 if fails else 0)
