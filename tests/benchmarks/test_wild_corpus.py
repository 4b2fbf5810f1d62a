"""The default rules on model code from outside the transformers corpus (benchmarks/wild_corpus.py):
nine libraries at pinned versions, scored against hand-read labels. The figures must not drop
below those reached so far (the remaining misses are listed in the issue notes), and every
rewritten file must compile and be left alone by a second scan."""

from __future__ import annotations

import pytest

from benchmarks import wild_corpus as W

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scanned():
    rules, scans = W.run("default")  # fetches and unpacks the packages on first use
    return rules, scans


@pytest.fixture(scope="module")
def labels():
    return W.read_labels()


def test_labels_name_real_lines(scanned, labels):
    _, scans = scanned
    files = {(s.package.name, rel): path for s in scans for rel, path in W.package_files(s.package)}
    assert {lb.package for lb in labels} == {p.name for p in W.PACKAGES}
    for lb in labels:
        path = files.get((lb.package, lb.path))
        assert path is not None, f"{lb.package}/{lb.path}: no such file in the unpacked package"
        lines = path.read_text(encoding="utf-8").splitlines()
        assert 0 < lb.line <= len(lines) and lines[lb.line - 1].strip(), f"{lb.package}/{lb.path}:{lb.line} is blank"
    assert sum(lb.expected == "fire" for lb in labels) >= 80
    assert sum(lb.expected == "no" for lb in labels) >= 60


def test_precision_and_recall_against_the_labels(scanned, labels):
    _, scans = scanned
    sites = [s for scan in scans for s in scan.sites]
    total = W.score(labels, sites)
    assert total.precision >= 0.98, [(s.package, s.path, s.line, s.rule) for s, _ in total.fp]
    assert total.recall >= 0.93, [(lb.package, lb.path, lb.line, lb.rule) for lb, _ in total.fn]
    sdpa = W.score([lb for lb in labels if lb.rule == "sdpa-attention"], [s for s in sites if s.rule == "sdpa-attention"])
    assert len(sdpa.tp) >= 78 and sdpa.precision >= 0.98 and sdpa.recall >= 0.93
    # every package whose labels ask for rewrites gets some, and no look-alike is rewritten
    for scan in scans:
        own = [lb for lb in labels if lb.package == scan.package.name]
        result = W.score(own, scan.sites)
        if any(lb.expected == "fire" for lb in own):
            assert result.tp, scan.package.name
        assert not [s for s, label in result.fp if label is not None], scan.package.name


def test_rewrites_compile_and_a_second_scan_changes_nothing(scanned):
    rules, scans = scanned
    assert sum(len(s.rewritten) for s in scans) >= 40
    assert W.check_rewrites(scans, rules) == []
