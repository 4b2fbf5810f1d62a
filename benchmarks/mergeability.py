"""How mergeable Adopter's rewrites are as they stand, over the wild corpus and the transformers
corpus: the mergeability check (engine/synthesize/mergeable.py) on every rewritten file.

    python benchmarks/mergeability.py [--wild-only | --transformers-only] [--show N]

Per corpus it prints the files rewritten, the findings applied, the new ruff findings (E501 at the
line length the synthesizer wrote to, F401, F841), new dead branches and repeated guards, files
that do not compile or that a second scan rewrites again, findings refused because the rule's
template gave invalid Python, and the rewritten optimizer calls written over several lines.
`--show N` prints the first N problems. The wild corpus uses the default rules (as
benchmarks/wild_corpus.py does), the transformers corpus every rule (as the corpus tests do).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engine.scan import scan_source, select_rules  # noqa: E402
from engine.synthesize.mergeable import check  # noqa: E402
from engine.synthesize.style import Style  # noqa: E402


def _fused_multiline_calls(text: str) -> int:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return 0
    return sum(1 for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr in ("Adam", "AdamW") and any(k.arg == "fused" for k in node.keywords)
               and node.end_lineno != node.lineno)


def _multiline_optimizer_calls(old: str, new: str) -> int:
    """Optimizer constructions over several lines that the rewrite gave `fused=`."""
    return max(0, _fused_multiline_calls(new) - _fused_multiline_calls(old))


def measure(items, rules) -> tuple[Counter, list[str]]:
    """items: (name, text, path, module). Returns the counts and the problems found."""
    counts: Counter = Counter()
    problems: list[str] = []
    for name, text, path, module in items:
        findings, new = scan_source(text, rules, path, module)
        counts["files"] += 1
        counts["applied"] += sum(f.status in ("rewritten", "guarded") for f in findings)
        counts["guarded"] += sum(f.status == "guarded" for f in findings)
        for f in findings:
            if f.reason and "invalid Python" in f.reason:
                counts["invalid templates"] += 1
                problems.append(f"{name}:{f.line}: {f.reason[:200]}")
            elif f.reason and f.reason.startswith("not rewritten"):
                counts["refused by synthesis"] += 1
        if new == text:
            continue
        counts["files rewritten"] += 1
        counts["multi-line optimizer calls rewritten"] += _multiline_optimizer_calls(text, new)
        verdict = check(text, new, Style().for_text(text).line_length)
        if not verdict.compiles:
            counts["do not compile"] += 1
            problems.append(f"{name}: does not compile")
            continue
        for item in verdict.new_lint:
            counts[f"new {item.split(':')[0]}"] += 1
            problems.append(f"{name}: new lint {item[:160]}")
        counts["dead branches"] += len(verdict.dead_branches)
        counts["repeated guards"] += len(verdict.repeated_guards)
        problems += [f"{name}: {x}" for x in verdict.dead_branches + verdict.repeated_guards]
        _, again = scan_source(new, rules, path, module)
        if again != new:
            counts["not idempotent"] += 1
            problems.append(f"{name}: a second scan rewrites it again")
    return counts, problems


def wild_items():
    from benchmarks.wild_corpus import PACKAGES, _module, package_files

    for pkg in PACKAGES:
        for rel, path in package_files(pkg):
            text = path.read_text(encoding="utf-8")
            if "torch" in text:
                yield f"{pkg.name}/{rel}", text, rel, _module(rel)


def transformers_items():
    from benchmarks.corpus import all_files
    from engine.extract.imports import module_name_for

    for path in all_files():
        yield f"{path.parent.name}/{path.name}", path.read_text(encoding="utf-8"), str(path), module_name_for(path)


KEYS = ("files", "files rewritten", "applied", "guarded", "refused by synthesis", "new E501", "new F401", "new F841",
        "dead branches", "repeated guards", "invalid templates", "do not compile", "not idempotent",
        "multi-line optimizer calls rewritten")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--wild-only", action="store_true")
    group.add_argument("--transformers-only", action="store_true")
    parser.add_argument("--show", type=int, default=10, help="print this many problems per corpus")
    args = parser.parse_args(argv)
    corpora = []
    if not args.transformers_only:
        corpora.append(("wild", wild_items, select_rules("default")))
    if not args.wild_only:
        corpora.append(("transformers", transformers_items, select_rules("all")))
    results = {}
    for name, items, rules in corpora:
        results[name] = measure(items(), rules)
    print(f"{'':40}" + "".join(f"{name:>14}" for name in results))
    for key in KEYS:
        print(f"{key:40}" + "".join(f"{results[name][0].get(key, 0):>14}" for name in results))
    bad = 0
    for name, (counts, problems) in results.items():
        bad += sum(counts.get(k, 0) for k in KEYS[5:13])
        for line in problems[:args.show]:
            print(f"  {name}: {line}")
    print("mergeable: no problem found" if not bad else f"{bad} problem(s)")
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
