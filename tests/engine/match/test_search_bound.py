"""The matcher's bound on backtracking per root (engine/match/matcher.py `MAX_ATTEMPTS_PER_ROOT`):
a search stopped there without a match is reported as a near-miss at that statement, never
dropped in silence."""

from __future__ import annotations

import textwrap

from engine.match import matcher
from engine.scan import scan_source, select_rules

SOURCE = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    class Attention(nn.Module):
        def forward(self, q, k, v):
            scores = torch.matmul(q, k.transpose(-2, -1)) * 0.125
            probs = scores.softmax(dim=-1)
            return torch.matmul(probs, v)
    ''')

REASON = "not searched to the end"


def _attention_findings():
    findings, _ = scan_source(SOURCE, select_rules("default"), "model.py", "model")
    return [f for f in findings if f.rule_id == "sdpa-attention"]


def test_attention_found_within_the_bound():
    found = _attention_findings()
    assert [f.status for f in found] == ["rewritten"]
    assert not any(REASON in (f.reason or "") for f in found)


def test_search_stopped_at_the_bound_is_a_near_miss_naming_it(monkeypatch):
    monkeypatch.setattr(matcher, "MAX_ATTEMPTS_PER_ROOT", 1)
    found = _attention_findings()
    assert found, "a search cut short must still say where it stopped"
    assert all(f.status == "near-miss" for f in found)
    bounded = [f for f in found if REASON in (f.reason or "")]
    assert bounded and "after 1 attempts" in bounded[0].reason
    assert {f.line for f in bounded} <= {7, 8, 9}
