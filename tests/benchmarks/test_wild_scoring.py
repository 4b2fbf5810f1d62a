"""The wild corpus's scoring (no download): labels pair with findings one to one by rule, file and
line; applied findings without a `fire` label are false positives."""

from __future__ import annotations

from benchmarks.wild_corpus import Label, Site, score


def _site(line, rule="sdpa-attention", status="rewritten", path="m.py", end=None):
    end = end or line + 3
    return Site("pkg", path, rule, status, line, end, frozenset({line, end}), "A.forward", None)


def _label(line, expected="fire", rule="sdpa-attention", path="m.py"):
    return Label("pkg", path, "A.forward", line, rule, expected, "")


def test_pairs_by_rule_file_and_line():
    labels = [_label(10), _label(40), _label(70, "no"), _label(90, rule="rms-norm")]
    sites = [_site(11), _site(71), _site(90), _site(200), _site(40, status="near-miss")]
    result = score(labels, sites)
    assert [lb.line for lb, _ in result.tp] == [10]
    assert sorted(s.line for s, _ in result.fp) == [71, 90, 200]  # a look-alike, a wrong rule, an unlabelled site
    assert [(lb.line, near.line if near else None) for lb, near in result.fn] == [(40, 40), (90, None)]
    assert result.precision == 0.25 and result.recall == 1 / 3


def test_one_finding_answers_one_label():
    result = score([_label(10), _label(11)], [_site(10)])
    assert len(result.tp) == 1 and len(result.fn) == 1
