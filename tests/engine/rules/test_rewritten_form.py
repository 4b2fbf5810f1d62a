"""Code already in a rule's rewritten form is not a finding of that rule, not even a near-miss: after
`adopter scan --apply`, scanning again reports nothing about the tool's own edits (which a
near-miss would otherwise flag forever), while the same call with a different choice stays one."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules
from tests.engine.rules.test_rule_examples import _examples


@pytest.mark.parametrize(("rule", "example"), [p for p in _examples("fires") if p.values[1].expect is not None])
def test_a_rules_own_output_is_no_finding_of_it(rule, example):
    findings, _ = scan_source(example.expect, [rule], path="example.py", module="example")
    assert not [f for f in findings if f.rule_id == rule.id], [(f.line, f.status, f.reason) for f in findings]


def test_a_different_choice_in_the_same_argument_is_still_a_near_miss():
    source = """\
import torch


def by_hand(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=False)


def written_by_adopter(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3,
                             fused=all(p.device.type in ("cpu", "cuda") for p in model.parameters()))
"""
    findings, new_text = scan_source(source, select_rules("fused-adamw"))
    assert [(f.line, f.status, f.reason) for f in findings] == [(5, "near-miss", "the call already sets fused=")]
    assert new_text == source
