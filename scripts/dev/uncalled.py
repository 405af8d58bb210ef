#!/usr/bin/env python3
"""pub fns in src/ and actors/src whose name appears nowhere else in production code (src, actors/src, bench/src),
outside #[cfg(test)] modules. Heuristic: name-based."""
import re, os, sys
roots = ['src', 'actors/src', 'bench/src']
files = {}
for r in roots:
    for dp, _, fs in os.walk(r):
        for f in fs:
            if f.endswith('.rs'):
                p = os.path.join(dp, f); s = open(p).read()
                i = s.find('#[cfg(test)]\nmod ')
                files[p] = s if i < 0 else s[:i]
defs = []
for p, s in files.items():
    if p.startswith('bench/'): continue
    for m in re.finditer(r'^\s*pub(?:\([^)]*\))?\s+(?:async\s+)?(?:const\s+)?fn\s+(\w+)', s, re.M):
        defs.append((p, s[:m.start()].count('\n') + 1, m.group(1)))
allsrc = '\n'.join(files.values())
traits = set(['new','default','fmt','from','try_from','drop','handle','started','stopped','name','deserialize','serialize','into_response','error_response','status_code','main'])
out = []
for p, l, n in defs:
    if n in traits: continue
    cnt = len(re.findall(r'\b' + re.escape(n) + r'\b', allsrc))
    if cnt <= 1: out.append(f'{p}:{l} {n}')
print('\n'.join(out)); print(f'# {len(out)} pub fns named only at their definition (production code)')
