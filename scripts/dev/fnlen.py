#!/usr/bin/env python3
"""List Rust functions longer than N lines in production code (src/, actors/src, not tests/#[cfg(test)] mods)."""
import re, sys, os
N = int(sys.argv[1]) if len(sys.argv) > 1 else 80
roots = sys.argv[2:] or ['src', 'actors/src', 'bench/src']
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)')
out = []
for root in roots:
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f)
            lines = open(p, encoding='utf-8').read().split('\n')
            # cut at #[cfg(test)] module
            end = len(lines)
            for i, l in enumerate(lines):
                if l.strip() == '#[cfg(test)]' and i + 1 < len(lines) and re.match(r'\s*mod\s+\w+', lines[i+1]):
                    end = i; break
            i = 0
            while i < end:
                m = fn_re.match(lines[i])
                if m:
                    depth = 0; started = False; j = i
                    while j < end:
                        s = re.sub(r'"(\\.|[^"\\])*"', '""', lines[j])
                        s = re.sub(r"'(\\.|[^'\\])'", "''", s)
                        s = s.split('//')[0]
                        for ch in s:
                            if ch == '{': depth += 1; started = True
                            elif ch == '}': depth -= 1
                        if ';' in s and not started and depth == 0: break
                        if started and depth == 0: break
                        j += 1
                    n = j - i + 1
                    if started and n > N: out.append((n, p, i + 1, m.group(6)))
                i += 1
for n, p, l, name in sorted(out, reverse=True): print(f'{n:4d} {p}:{l} {name}')
print(f'# {len(out)} functions over {N} lines')
