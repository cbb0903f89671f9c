#!/usr/bin/env python3
"""Checks the engine/ layout of docs/architecture.md ("Where things live").

Every quoted #include in the C/CUDA sources is resolved the way the build
resolves it (the including file's own folder first, then the repo root and
kernels/, meson's include_directories), and then:

  1. an engine header is included either by bare name from its own folder or
     as "engine/<folder>/<name>.h" (no other spelling, no "../");
  2. a folder's *_internal.h is included only from inside that folder;
  3. engine folders depend on each other one way only, down the ranks in
     RANKS below (a folder may include only folders of a lower rank; the
     folders of one rank never include each other), so there is no circle;
  4. engine/ never includes server/ or tools/, and kernels/ includes no
     engine header but engine/common/ (error codes and logging);
  5. no header under engine/ or server/ includes a CUDA header, and no
     public engine header (not *_internal.h) includes cJSON: request JSON
     is the server's, the engine takes plain structs or text;
  6. no source file is over MAX_LINES lines (one room per concern: split
     it long before, at ~1,500);
  7. no project file reads test data from beside the clone (a path into
     the team's shared folder): the suite's data is tests/data (or
     $DSQ_TEST_DATA), so a clone alone passes scripts/test.

usage: check_layout.py [REPO_ROOT]   (default: this file's repo)
Prints one line per violation and exits 1 if there is any, else prints the
folder graph and exits 0.
"""
import os
import re
import subprocess
import sys

# Lowest first. A new engine folder must be added here (the check fails
# naming it until it is).
RANKS = [
    ['common'],
    ['backend'],
    ['io'],
    ['text'],
    ['loader', 'kv'],
    ['model'],
    ['serve', 'quantizer'],
]
RANK = {f: i for i, fs in enumerate(RANKS) for f in fs}
SOURCE_DIRS = ['engine', 'server', 'tools', 'tests', 'kernels']
EXTS = ('.c', '.h', '.cu', '.cuh', '.inc')
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>', re.M)
# A hard stop, not the habit: STYLE.md asks for a split at ~1,500 lines.
MAX_LINES = 1800
SIZE_EXTS = EXTS + ('.py', '.sh')
OUTSIDE_DATA = re.compile(r"shared(/|' */ *')data")


def project_files(tops):
    """The project's own files under the folders tops: what git tracks or
    would track (build trees, venvs and other ignored files are not the
    project's); every file below them outside a git checkout."""
    try:
        out = subprocess.run(['git', 'ls-files', '-co', '--exclude-standard', '--'] + tops,
                             capture_output=True, text=True, check=True).stdout
        return sorted(p for p in out.splitlines() if os.path.isfile(p))
    except (OSError, subprocess.CalledProcessError):
        return sorted(os.path.join(d, n) for top in tops for d, _, ns in os.walk(top)
                      for n in ns)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), '..', '..'))
    os.chdir(root)
    errors = []
    edges = {}
    n_files = n_includes = 0
    for path in project_files(SOURCE_DIRS):
        if not path.endswith(EXTS):
            continue
        n_files += 1
        with open(path, encoding='utf-8', errors='replace') as fh:
            text = fh.read()
        for m in INCLUDE.finditer(text):
            n_includes += 1
            check(path, m.group(1), errors, edges)
        check_headers(path, text, errors)
    for path in project_files(SOURCE_DIRS + ['scripts']):
        if not path.endswith(SIZE_EXTS) or path.startswith(os.path.join('tests', 'golden') + os.sep):
            continue
        with open(path, encoding='utf-8', errors='replace') as fh:
            n = sum(1 for _ in fh)
        if n > MAX_LINES:
            errors.append(f'{path}: {n} lines, over the {MAX_LINES}-line stop '
                          f'(split it by concern; STYLE.md asks ~1,500)')
    for path in project_files(SOURCE_DIRS + ['scripts', 'deploy', '.ci', 'meson.build']):
        if path.startswith(os.path.join('tests', 'data') + os.sep):
            continue
        with open(path, encoding='utf-8', errors='replace') as fh:
            for i, line in enumerate(fh, 1):
                if OUTSIDE_DATA.search(line):
                    errors.append(f'{path}:{i}: names test data outside the clone '
                                  f'(use $DSQ_TEST_DATA, default tests/data)')
    engine_dirs = sorted(d for d in os.listdir('engine')
                         if os.path.isdir(os.path.join('engine', d)))
    for d in engine_dirs:
        if d not in RANK:
            errors.append(f'engine/{d}/: folder missing from RANKS in '
                          f'tests/layout/check_layout.py')
    for name in os.listdir('engine'):
        if name.endswith(EXTS):
            errors.append(f'engine/{name}: source file outside a folder')
    for e in errors:
        print(e)
    if errors:
        print(f'layout: {len(errors)} violation(s)')
        return 1
    for (a, b) in sorted(edges):
        print(f'engine/{a} -> engine/{b}  ({edges[(a, b)]} includes)')
    print(f'layout: ok ({n_files} files, {n_includes} quoted includes)')
    return 0


def check_headers(path, text, errors):
    """Rule 5: what headers under engine/ and server/ may pull in."""
    top, _ = folder_of(path)
    if top not in ('engine', 'server') or not path.endswith(('.h', '.inc')):
        return
    for m in SYSTEM_INCLUDE.finditer(text):
        inc = m.group(1)
        if inc.startswith(('cuda', 'cublas', 'cuda_runtime')):
            errors.append(f'{path}: #include <{inc}>: no CUDA header under {top}/ '
                          f'(kernels/cuda owns CUDA; kernels.h is plain C)')
        if (top == 'engine' and inc == 'cjson/cJSON.h'
                and not path.endswith('_internal.h')):
            errors.append(f'{path}: #include <{inc}>: a public engine header takes '
                          f'plain structs or JSON text, not cJSON')


def folder_of(path):
    """'engine/io/gguf.c' -> ('engine', 'io'); 'server/x.c' -> ('server', None)."""
    parts = path.split('/')
    if parts[0] == 'engine' and len(parts) > 2:
        return 'engine', parts[1]
    return parts[0], None


def resolve(path, inc):
    here = os.path.join(os.path.dirname(path), inc)
    if os.path.isfile(here):
        return os.path.normpath(here), 'local'
    for base in ('.', 'kernels'):
        cand = os.path.join(base, inc)
        if os.path.isfile(cand):
            return os.path.normpath(cand), 'path'
    return None, None


def check(path, inc, errors, edges):
    target, how = resolve(path, inc)
    if target is None:
        return  # generated (dsq_config.h) or system-like; the build checks it
    src_top, src_f = folder_of(path)
    dst_top, dst_f = folder_of(target)
    where = f'{path}: #include "{inc}"'
    if '..' in inc.split('/'):
        errors.append(f'{where}: no "../" includes')
    if dst_top == 'engine':
        if dst_f is None:
            errors.append(f'{where}: header outside an engine folder')
            return
        same = src_top == 'engine' and src_f == dst_f
        if same and how != 'local':
            errors.append(f'{where}: same folder, include it by bare name')
        if not same and inc != target:
            errors.append(f'{where}: spell it "{target}"')
        if not same and os.path.basename(target).endswith('_internal.h'):
            errors.append(f'{where}: engine/{dst_f}/ internal header used '
                          f'outside its folder')
        if src_top == 'kernels' and dst_f != 'common':
            errors.append(f'{where}: kernels/ may include only engine/common/')
        if src_top == 'engine' and not same:
            if src_f in RANK and dst_f in RANK and RANK[dst_f] >= RANK[src_f]:
                errors.append(f'{where}: engine/{src_f} may not depend on '
                              f'engine/{dst_f} (see RANKS)')
            edges[(src_f, dst_f)] = edges.get((src_f, dst_f), 0) + 1
    if src_top == 'engine' and dst_top in ('server', 'tools'):
        errors.append(f'{where}: engine/ never includes {dst_top}/')


if __name__ == '__main__':
    sys.exit(main())
