#!/usr/bin/env python3
"""Module-level import cycles among a crate's files: edges from `use crate::a::b` / `super::` paths (test modules excluded)."""
import re, os, sys
def crate_mods(root, crate_prefix):
    mods = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f)
            rel = os.path.relpath(p, root)[:-3].split(os.sep)
            if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
            mods['::'.join(rel)] = p
    return mods
def strip_tests(src):
    i = src.find('#[cfg(test)]\nmod ')
    return src if i < 0 else src[:i]
def resolve(mods, path):
    parts = path.split('::')
    while parts:
        k = '::'.join(parts)
        if k in mods: return k
        parts = parts[:-1]
    return ''
def graph(root):
    mods = crate_mods(root, 'crate')
    g = {m: set() for m in mods}
    for m, p in mods.items():
        src = strip_tests(open(p).read())
        # join multiline use statements
        for u in re.findall(r'\buse\s+([^;]+);', src) + re.findall(r'\b(crate::[\w:]+)', src) + re.findall(r'\b(super::[\w:]+)', src):
            u = re.sub(r'\s+', '', u)
            heads = []
            # expand braces shallowly: crate::a::{b, c::d}
            mm = re.match(r'^((?:crate|super|self)(?:::\w+)*)::\{(.*)\}$', u)
            if mm:
                base = mm.group(1)
                for part in re.split(r',(?![^{]*\})', mm.group(2)):
                    part = part.split('::{')[0]
                    heads.append(base + '::' + part)
            else: heads.append(u)
            for h in heads:
                segs = h.split('::')
                if segs[0] == 'crate': target = segs[1:]
                elif segs[0] == 'super':
                    base = m.split('::') if m else []
                    is_modfile = p.endswith('mod.rs') or p.endswith('lib.rs')
                    base = base if is_modfile else base[:-1]
                    while segs and segs[0] == 'super':
                        segs = segs[1:]
                        if segs and segs[0]=='super' or True: pass
                    # one super handled approx
                    target = base[:-0 or None] + segs if is_modfile else base + segs
                    target = (m.split('::')[:-1] if not is_modfile else m.split('::')[:-1]) + segs
                else: continue
                t = resolve(mods, '::'.join(x for x in target if x))
                if t != m and t != '' and not m.startswith(t + '::') and not t.startswith(m + '::') if m else False:
                    g[m].add(t)
    return g
def sccs(g):
    idx = {}; low = {}; st = []; on = set(); out = []; c = [0]
    import sys; sys.setrecursionlimit(10000)
    def sc(v):
        idx[v] = low[v] = c[0]; c[0] += 1; st.append(v); on.add(v)
        for w in g[v]:
            if w not in idx: sc(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in g:
        if v not in idx: sc(v)
    return out
for root in sys.argv[1:] or ['src', 'actors/src']:
    for comp in sccs(graph(root)): print(root, ' <-> '.join(comp))
