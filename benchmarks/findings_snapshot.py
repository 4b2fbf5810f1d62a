"""Every finding and a hash of every rewritten text over the paper corpus and the wild corpus.

    python benchmarks/findings_snapshot.py --out before.json
    ... change the engine ...
    python benchmarks/findings_snapshot.py --compare before.json

`--compare` prints each file whose findings or rewritten text changed (with the findings that
differ) and exits 1 when anything did: an engine change that should not alter results proves it
did not, and one that should shows exactly where it did, so every changed hunk can be read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _files() -> list[tuple[str, Path, str, str]]:
    """(name in the snapshot, path, module, the name's first folder: the package it belongs to)."""
    from benchmarks import corpus, wild_corpus

    out = []
    for path in corpus.all_files():
        rel = path.relative_to(corpus.CACHE).as_posix()
        out.append((rel, path, corpus_module(path), str(corpus.CACHE / rel.partition("/")[0])))
    for pkg in wild_corpus.PACKAGES:
        for rel, path in wild_corpus.package_files(pkg):
            out.append((f"{pkg.name}/{rel}", path, wild_corpus._module(rel), str(wild_corpus.unpack(pkg))))
    return out


_INDEXES: dict[str, object] = {}  # package folder -> its PackageIndex, once per worker


def _index(name: str, root: str):
    """The package's files, as a scan of its folder resolves base classes in them (named as the
    snapshot names them: the package's folder, then the path inside it)."""
    from engine.extract.package import PackageIndex

    prefix = name.partition("/")[0] + "/"
    if root not in _INDEXES:
        base = Path(root)
        files = [prefix + p.relative_to(base).as_posix() for p in sorted(base.rglob("*.py"))]
        _INDEXES[root] = PackageIndex(base, files, lambda rel: _module_name(rel.removeprefix(prefix)), prefix)
    return _INDEXES[root]


def _module_name(rel: str) -> str:
    return rel[:-3].replace("/", ".").removesuffix(".__init__")


def corpus_module(path: Path) -> str:
    parts = path.with_suffix("").parts
    return ".".join(parts[parts.index("transformers"):]) if "transformers" in parts else path.stem


def _one(item: tuple[str, str, str, str]) -> tuple[str, dict]:
    from engine.scan import scan_source, select_rules

    global _RULES
    if _RULES is None:  # once per worker: the rule files are read at the first file
        _RULES = select_rules("all")
    rel, path, module, root = item
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        findings, new = scan_source(text, _RULES, path=rel, module=module, package=_index(rel, root))
    except Exception as exc:  # a crash is a result too
        return rel, {"error": f"{type(exc).__name__}: {exc}"}
    return rel, {
        "findings": sorted(json.dumps({k: v for k, v in f.to_json().items() if k not in ("fingerprint",)},
                                      sort_keys=True) for f in findings),
        "text": hashlib.sha256(new.encode()).hexdigest() if new != text else None,
    }


_RULES = None


def snapshot(jobs: int = 2, only: list[str] | None = None) -> dict[str, dict]:
    items = [(rel, str(path), module, root) for rel, path, module, root in _files()
             if not only or any(o in rel for o in only)]
    with ProcessPoolExecutor(jobs) as pool:
        return dict(pool.map(_one, items, chunksize=4))


def compare(before: dict, after: dict) -> list[str]:
    lines = []
    for rel in sorted(set(before) | set(after)):
        a, b = before.get(rel), after.get(rel)
        if a == b:
            continue
        lines.append(f"== {rel}" + ("" if (a or {}).get("text") == (b or {}).get("text") else "  (rewritten text changed)"))
        fa, fb = set((a or {}).get("findings", [])), set((b or {}).get("findings", []))
        for f in sorted(fa - fb):
            lines.append(f"  - {_short(f)}")
        for f in sorted(fb - fa):
            lines.append(f"  + {_short(f)}")
        for key in ("error",):
            if (a or {}).get(key) != (b or {}).get(key):
                lines.append(f"  {key}: {(a or {}).get(key)} -> {(b or {}).get(key)}")
    return lines


def _short(f: str) -> str:
    d = json.loads(f)
    return f"{d.get('rule')} {d.get('status')} {d.get('class')}.{d.get('method')}:{d.get('line')} {d.get('reason') or ''}"[:240]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the snapshot here")
    ap.add_argument("--compare", type=Path, help="compare with this earlier snapshot; exit 1 on any difference")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", action="append", help="only files whose path contains this (repeatable)")
    args = ap.parse_args(argv)
    snap = snapshot(args.jobs, args.only)
    n = sum(len(v.get("findings", [])) for v in snap.values())
    print(f"{len(snap)} files, {n} findings, {sum(1 for v in snap.values() if v.get('text'))} rewritten")
    if args.out:
        args.out.write_text(json.dumps(snap, sort_keys=True, indent=0))
    if args.compare:
        before = json.loads(args.compare.read_text())
        if args.only:
            before = {k: v for k, v in before.items() if any(o in k for o in args.only)}
        lines = compare(before, snap)
        print("\n".join(lines) if lines else "no difference")
        return 1 if lines else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
