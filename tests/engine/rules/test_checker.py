"""The example checker itself: a wrong example must fail it (else the rule tests prove nothing)."""

from __future__ import annotations

import pytest

from engine.match import parse_rule
from tests.engine.rules.test_rule_examples import check_both_kinds, check_fires, check_near_miss

CODE_LAST = '''
import torch.nn.functional as F
from torch import nn

class Attn(nn.Module):
    def forward(self, scores):
        return F.softmax(scores, dim=-1)
'''
CODE_OTHER_DIM = CODE_LAST.replace("dim=-1", "dim=1")
CODE_NONE = CODE_LAST.replace("F.softmax(scores, dim=-1)", "scores")


def _rule(examples: str):
    return parse_rule(f"""
rule test/softmax
summary "a last-dim softmax"
kernel "k"
detect-only
where last_dim
match {{
  $out = softmax($x, dim=$dim, ...)
}}
{examples}
""", "test.rule")


def _example(rule, kind="fires"):
    return next(e for e in rule.examples if e.kind == kind)


def test_correct_examples_pass():
    rule = _rule(f'example fires """{CODE_LAST}"""\nexample near-miss """{CODE_OTHER_DIM}""" reason "dim=1"')
    check_both_kinds(rule)
    check_fires(rule, _example(rule))
    check_near_miss(rule, _example(rule, "near-miss"))


def test_missing_near_miss_fails():
    rule = _rule(f'example fires """{CODE_LAST}"""')
    with pytest.raises(AssertionError, match="near-miss"):
        check_both_kinds(rule)


def test_missing_fires_fails():
    rule = _rule(f'example near-miss """{CODE_OTHER_DIM}"""')
    with pytest.raises(AssertionError, match="fires"):
        check_both_kinds(rule)


def test_wrong_fires_count_fails():
    rule = _rule(f'example fires """{CODE_LAST}""" count 2')
    with pytest.raises(AssertionError, match="expected 2 finding"):
        check_fires(rule, _example(rule))


def test_fires_example_that_does_not_fire_fails():
    rule = _rule(f'example fires """{CODE_NONE}"""')
    with pytest.raises(AssertionError, match="got 0"):
        check_fires(rule, _example(rule))


def test_near_miss_that_matches_fails():
    rule = _rule(f'example near-miss """{CODE_LAST}"""')
    with pytest.raises(AssertionError, match="near-miss example matched"):
        check_near_miss(rule, _example(rule, "near-miss"))


def test_near_miss_count_zero_with_a_near_miss_fails():
    rule = _rule(f'example near-miss """{CODE_OTHER_DIM}""" count 0')
    with pytest.raises(AssertionError, match="count 0"):
        check_near_miss(rule, _example(rule, "near-miss"))


def test_near_miss_without_the_expected_near_miss_fails():
    rule = _rule(f'example near-miss """{CODE_NONE}"""')  # count defaults to 1
    with pytest.raises(AssertionError, match="expected 1 near-miss"):
        check_near_miss(rule, _example(rule, "near-miss"))


def test_wrong_reason_fails():
    rule = _rule(f'example near-miss """{CODE_OTHER_DIM}""" reason "escapes"')
    with pytest.raises(AssertionError, match="no near-miss reason contains"):
        check_near_miss(rule, _example(rule, "near-miss"))
