#!/usr/bin/env python3
"""List Rust functions longer than N lines in production code (src/, actors/src, not tests/#[cfg(test)] mods)."""
import re, sys, os
N = int(sys.argv[1]) if len(sys.argv) > 1 else 80
roots = sys.argv[2:] or ['src', 'actors/src', 'bench/src']
fn_re = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(async\s+)?(const\s+)?(unsafe\s+)?fn\s+(\w+)')


def blank_literals(text):
    """`text` with the insides of string literals (also raw and multi-line ones) and comments
    blanked, newlines kept: braces in them must not count, and a literal may span lines."""
    out, i, n = [], 0, len(text)
    keep = lambda c: '\n' if c == '\n' else ' '
    while i < n:
        c = text[i]
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        elif text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append(''.join(keep(ch) for ch in text[i:j])); i = j
        elif c == 'r' and re.match(r'r#*"', text[i:i + 8]) and not (i and (text[i-1].isalnum() or text[i-1] == '_')):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            start = i + 2 + len(hashes)
            j = text.find('"' + hashes, start)
            j = n if j < 0 else j + 1 + len(hashes)
            out.append('""' + ''.join(keep(ch) for ch in text[start:j - 1 - len(hashes)])); i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            out.append('""' + ''.join(keep(ch) for ch in text[i + 1:j])); i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^'\\])'", text[i:i + 4]):
            j = text.index("'", i + 2 if text[i + 1] != '\\' else i + 3) + 1
            out.append("''"); i = j
        else:
            out.append(c); i += 1
    return ''.join(out)


out = []
for root in roots:
    for dp, _, fs in os.walk(root):
        for f in fs:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f)
            raw = open(p, encoding='utf-8').read()
            lines = raw.split('\n')
            code = blank_literals(raw).split('\n')
            assert len(code) == len(lines), p
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
                        s = code[j]
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
