"""A near-miss's reason names operands as the source spells them: a variable by its name (not the
SSA `dim.1` nor a `Var(...)` repr), a computed value by what computed it and its line."""

from __future__ import annotations

from engine.scan import scan_source, select_rules

SOFTMAX_DIM = """
import torch
from torch import nn


class Scores(nn.Module):
    def forward(self, q, k, v, dim=-1):
        if q.shape[0] > 1:
            dim = -1
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.125
        return torch.matmul(s.softmax(dim=dim), v)
"""

FILL_CALL = """
import torch
from torch import nn


def lowest(dtype):
    return -1e4 if dtype == torch.float16 else -1e20


class Filled(nn.Module):
    def forward(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.125
        s = s.masked_fill(mask, lowest(s.dtype))
        return torch.matmul(s.softmax(dim=-1), v)
"""


def _reasons(source: str) -> list[str]:
    findings, _ = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f.reason for f in findings if f.rule_id == "sdpa-attention" and f.status == "near-miss"]


def test_a_variable_dim_is_named_as_written():
    reasons = _reasons(SOFTMAX_DIM)
    assert reasons and all("Var(" not in r and "dim.1" not in r for r in reasons), reasons
    assert any("dim=dim is not a constant" in r for r in reasons), reasons


def test_a_computed_fill_is_named_by_its_call_and_line():
    reasons = _reasons(FILL_CALL)
    assert reasons and all("Var(" not in r and "_t" not in r and "_if" not in r for r in reasons), reasons
    assert any("conditional expression" in r for r in reasons), reasons
