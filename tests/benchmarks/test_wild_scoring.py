"""The wild corpus's scoring (no download): labels pair with findings one to one by rule, file and
line; applied findings without a `fire` label are false positives; the labels file itself is checked too."""

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


def test_the_labels_file_reads_and_every_row_says_why():
    from benchmarks import wild_corpus as W

    labels = W.read_labels()
    names = {p.name for p in W.PACKAGES}
    assert {lb.package for lb in labels} <= names
    assert all(lb.reason.strip() for lb in labels)
    # a fallback beside an existing fused path is reported and left alone, never a rewrite target
    assert all(lb.expected == "no" for lb in labels if lb.reason.startswith("already-fused"))
    # each package belongs to one set, and the sets split the labels without overlap
    assert W.SETS == ("wild1", "wild2", "wild3", "wild4", "wild5", "wild6", "wild7", "wild8", "wild9")
    parts = [W.set_labels(labels, s) for s in W.SETS]
    assert sum(map(len, parts)) == len(labels) and all(parts)


def test_scores_split_by_set():
    from benchmarks import wild_corpus as W

    one = next(p for p in W.PACKAGES if p.set == "wild1").name
    two = next(p for p in W.PACKAGES if p.set == "wild2").name
    labels = [Label(one, "m.py", "A.forward", 10, "sdpa-attention", "fire", ""),
              Label(two, "m.py", "A.forward", 10, "sdpa-attention", "fire", "")]
    sites = [Site(one, "m.py", "sdpa-attention", "rewritten", 10, 13, frozenset({10, 13}), "A.forward", None)]
    first = score(W.set_labels(labels, "wild1"), W.set_sites(sites, "wild1"))
    second = score(W.set_labels(labels, "wild2"), W.set_sites(sites, "wild2"))
    assert (len(first.tp), len(first.fn)) == (1, 0) and (len(second.tp), len(second.fn)) == (0, 1)


def test_a_finding_below_its_label_in_the_same_function_answers_it():
    # the pattern's first statement (a scale of q) stays in place: the finding starts below the label
    labels = [_label(10), _label(40), _label(60, "no")]
    result = score(labels, [_site(20), _site(70)])
    assert [(lb.line, s.line) for lb, s in result.tp] == [(10, 20)]
    # 70 lies below the `no` label at 60, not below 40: a false positive, and 40 stays unanswered
    assert [s.line for s, _ in result.fp] == [70] and [lb.line for lb, _ in result.fn] == [40]
    other_scope = Site("pkg", "m.py", "sdpa-attention", "rewritten", 20, 23, frozenset({20, 23}), "B.forward", None)
    assert score([_label(10)], [other_scope]).tp == []
