"""How fast extraction (and matching) runs over the whole corpus, relative to `ast.parse` alone.

    python benchmarks/extract_speed.py [--rounds 3] [--jobs N] [--no-match] [--no-rewrite]

Every PyTorch modeling file of the paper's corpus (see benchmarks/corpus.py) is read into memory
first; then, per round, the same texts are (a) parsed with `ast.parse`, (b) extracted (parse
included, every class and method), (c) extracted and matched against every rule of the library
(`find([fm], select_rules("all"))` per file), (d) scanned with rewriting (`scan_source`: extract,
match and synthesize every rewritable finding, as `adopter scan` does). The four measurements are interleaved round by
round, so that a slow phase of a shared machine hits all of them alike, and the median of the
rounds is reported with its ratio to the `ast.parse` median. Targets: extraction <= 2.0x,
extraction + matching <= 2.0x (the shape and layout facts of engine/analysis included: matching asks
for them), the whole rewriting scan <= 5x the `ast.parse` time. The targets are for the installed extractor,
which setup.py compiles with mypyc where it can; the first lines say which one ran
(`ADOPTER_PURE_PYTHON=1` times the interpreted one).

`--jobs N` also times `extract_many` over N processes (wall clock; a separate figure, the
single-process ratio above is the one the target is about).
"""

from __future__ import annotations

import argparse
import ast
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpus import all_files  # noqa: E402
from engine.extract.extractor import extract_source  # noqa: E402
from engine.extract.imports import module_name_for  # noqa: E402

EXTRACT_TARGET = 2.0
MATCH_TARGET = 2.0
REWRITE_TARGET = 5.0


def _timed(fn) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _round(items, rules, find, rewrite=None, rewrite_rules=None) -> dict[str, tuple[float, float]]:
    """One round over every file; per file the phases run back to back (parse, extract, extract +
    match), so that load from other users of the machine falls on all phases alike. The cyclic
    garbage collector is off for every phase, as extraction itself turns it off. Returns phase ->
    (wall seconds, CPU seconds of this process)."""
    wall = {"parse": 0.0, "extract": 0.0, "match": 0.0, "rewrite": 0.0}
    cpu = dict(wall)
    clock, cpu_clock = time.perf_counter, time.process_time
    gc.collect()
    gc.disable()
    try:
        for text, path, module in items:
            w, c = clock(), cpu_clock()
            ast.parse(text, filename=path)
            w2, c2 = clock(), cpu_clock()
            extract_source(text, path, module)
            w3, c3 = clock(), cpu_clock()
            wall["parse"] += w2 - w
            cpu["parse"] += c2 - c
            wall["extract"] += w3 - w2
            cpu["extract"] += c3 - c2
            if rules is not None:
                find([extract_source(text, path, module)], rules)
                wall["match"] += clock() - w3
                cpu["match"] += cpu_clock() - c3
            if rewrite is not None:
                w4, c4 = clock(), cpu_clock()
                rewrite(text, rewrite_rules, path, module)
                wall["rewrite"] += clock() - w4
                cpu["rewrite"] += cpu_clock() - c4
            gc.collect()
    finally:
        gc.enable()
    return {k: (wall[k], cpu[k]) for k in wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per measurement (median reported)")
    parser.add_argument("--jobs", type=int, default=0, help="also time extract_many with this many processes")
    parser.add_argument("--no-match", action="store_true", help="skip the extraction + matching measurement")
    parser.add_argument("--no-rewrite", action="store_true", help="skip the rewriting scan measurement")
    args = parser.parse_args(argv)

    paths = all_files()
    # read every text (and find every module name) before any timing
    items = [(p.read_text(encoding="utf-8"), str(p), module_name_for(p)) for p in paths]
    lines = sum(text.count("\n") for text, _, _ in items)

    rules = find = rewrite = None
    if not args.no_match or not args.no_rewrite:
        from engine.match import find
        from engine.scan import scan_source, select_rules

        rules = select_rules("all")
        rewrite = None if args.no_rewrite else scan_source
    rounds = [_round(items, None if args.no_match else rules, find, rewrite, rules) for _ in range(args.rounds)]

    def median(phase: str, which: int) -> float:
        return statistics.median(r[phase][which] for r in rounds)

    parse = median("parse", 0)
    import engine.extract

    print(f"files {len(items)}, lines {lines}, rounds {args.rounds} (medians; phases interleaved file by file)")
    print(f"extractor: {engine.extract.IMPLEMENTATION}")
    print(f"{'':28}{'wall s':>8} {'ratio':>6}   {'cpu s':>8} {'ratio':>6}")
    ok = True
    phases = [("ast.parse", "parse", None), ("extract", "extract", EXTRACT_TARGET)]
    if not args.no_match and rules is not None:
        phases.append((f"extract + match ({len(rules)} rules)", "match", MATCH_TARGET))
    if rewrite is not None and rules is not None:
        phases.append(("scan with rewriting", "rewrite", REWRITE_TARGET))
    for label, phase, target in phases:
        w, c = median(phase, 0), median(phase, 1)
        ratio_w, ratio_c = w / parse, c / median("parse", 1)
        if target is not None:
            ok &= ratio_w <= target
        note = f"   (target <= {target}x)" if target else ""
        print(f"{label:28}{w:8.3f} {ratio_w:5.2f}x   {c:8.3f} {ratio_c:5.2f}x{note}")
    for phase in ("parse", "extract", "match", "rewrite"):
        if rounds[0][phase][0]:
            print(f"  {phase} rounds (wall s): " + " ".join(f"{r[phase][0]:.3f}" for r in rounds))
    if args.jobs:
        from engine.extract import extract_many

        wall = statistics.median(_timed(lambda: extract_many(paths, jobs=args.jobs)) for _ in range(args.rounds))
        print(f"extract_many jobs={args.jobs} {wall:7.3f} s   {wall / parse:.2f}x of single-process ast.parse "
              "(wall clock, file reading included)")
    print("within targets (wall-clock ratios)" if ok else "OVER TARGET (wall-clock ratios)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
