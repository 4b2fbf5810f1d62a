"""Reproduce the paper's Table 2: the nine paper rules on the paper's corpus, scored against the
published labels (../shared/benchmarks/adopter-paper/groundtruth.tsv) as the benchmark README says.

    python benchmarks/paper_table2.py [--diff]   # --diff lists every model/rule where counts differ

Per model and rule: TP = min(truth, found), FN = truth - TP, FP = found - TP; summed over models;
precision = TP / (TP + FP), recall = TP / (TP + FN).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.corpus import GROUNDTRUTH, paper_file  # noqa: E402
from engine.extract import extract_file  # noqa: E402
from engine.match import find, load_rules  # noqa: E402
from rules import RULES_DIR  # noqa: E402

PAPER = {  # rule: (truth, Adopter TP, FN, FP) as printed in the paper
    1: (1, 1, 0, 0), 2: (2, 2, 0, 0), 3: (2, 2, 0, 0), 4: (208, 197, 11, 0), 5: (80, 80, 0, 0),
    6: (143, 136, 7, 0), 7: (35, 31, 4, 0), 8: (2, 2, 0, 0), 9: (2, 2, 0, 0),
}


def read_truth(path: Path = GROUNDTRUTH) -> dict[str, list[int]]:
    lines = path.read_text().splitlines()
    truth: dict[str, list[int]] = {}
    for line in lines[1:]:
        cells = line.split("\t")
        truth[cells[0]] = [int(c) for c in cells[1:]]
    return truth


def count_findings(model: str, rules) -> list[int]:
    fm = extract_file(paper_file(model))
    # the labels count locations in the model classes; module-level functions count through the
    # classes that call them (inlined), not on their own
    fm = replace(fm, classes=tuple(c for c in fm.classes if c.name != "__module__"))
    counts = [0] * 9
    for finding in find([fm], rules, near_misses=False):
        if finding.status == "near-miss":
            continue
        counts[int(finding.rule_id.rsplit("_", 1)[1]) - 1] += 1
    return counts


def score(truth: dict[str, list[int]], found: dict[str, list[int]]):
    per_rule = [[0, 0, 0] for _ in range(9)]
    for model, labels in truth.items():
        for r in range(9):
            t, f = labels[r], found[model][r]
            tp = min(t, f)
            per_rule[r][0] += tp
            per_rule[r][1] += t - tp
            per_rule[r][2] += f - tp
    return per_rule


def _pr(tp: int, fn: int, fp: int) -> tuple[str, str]:
    p = f"{tp / (tp + fp):.3f}" if tp + fp else "-"
    r = f"{tp / (tp + fn):.3f}" if tp + fn else "-"
    return p, r


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--diff", action="store_true", help="list every model and rule where counts differ")
    args = parser.parse_args(argv)
    truth = read_truth()
    rules = load_rules(RULES_DIR / "paper")
    start = time.perf_counter()
    found = {model: count_findings(model, rules) for model in truth}
    seconds = time.perf_counter() - start
    per_rule = score(truth, found)
    print(f"{len(truth)} models, 9 rules, {seconds:.1f} s")
    print(f"{'rule':>4} {'truth':>5} | {'ours TP/FN/FP':>14} {'P':>6} {'R':>6} | {'paper TP/FN/FP':>14} {'P':>5} {'R':>6}")
    totals = [0, 0, 0]
    ptotals = [0, 0, 0]
    for r in range(9):
        tp, fn, fp = per_rule[r]
        totals = [a + b for a, b in zip(totals, per_rule[r], strict=True)]
        t, ptp, pfn, pfp = PAPER[r + 1]
        ptotals = [a + b for a, b in zip(ptotals, (ptp, pfn, pfp), strict=True)]
        p, rec = _pr(tp, fn, fp)
        pp, prec = _pr(ptp, pfn, pfp)
        print(f"{r + 1:>4} {tp + fn:>5} | {f'{tp}/{fn}/{fp}':>14} {p:>6} {rec:>6} | {f'{ptp}/{pfn}/{pfp}':>14} {pp:>5} {prec:>6}")
    p, rec = _pr(*totals)
    pp, prec = _pr(*ptotals)
    print(f"{'all':>4} {totals[0] + totals[1]:>5} | {'/'.join(map(str, totals)):>14} {p:>6} {rec:>6} | "
          f"{'/'.join(map(str, ptotals)):>14} {pp:>5} {prec:>6}")
    if args.diff:
        for model, labels in truth.items():
            for r in range(9):
                if labels[r] != found[model][r]:
                    print(f"  {model:35s} rule_{r + 1}: truth {labels[r]} found {found[model][r]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
