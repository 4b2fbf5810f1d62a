"""A helper whose own body is a whole rewritable match (Gemma's weight-less `_norm`, its caller
multiplying the weight) is rewritten where it is written, for every caller: not at one call with
the helper left behind as manual code, which a scan after `--apply` found and rewrote again (the
wild corpus's idempotence check caught it on torchtune's and kornia's GemmaRMSNorm)."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

GEMMA = '''
import torch
from torch import nn


class GemmaRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.scale.float())
        return output.type_as(x)
'''


def test_the_helper_is_rewritten_in_place_once():
    findings, new = scan_source(GEMMA, select_rules("default"), "gemma.py", "gemma")
    applied = [f for f in findings if f.status in ("rewritten", "guarded")]
    assert [(f.rule_id, f.method) for f in applied] == [("rms-norm", "_norm")], \
        [(f.rule_id, f.method, f.status, f.reason) for f in findings]
    assert "return nn.functional.rms_norm(x, x.shape[-1:], eps=self.eps)" in new
    assert "output = self._norm(x.float())" in new  # the caller is as it was
    again, newer = scan_source(new, select_rules("default"), "gemma.py", "gemma")
    assert newer == new, [(f.rule_id, f.method, f.status) for f in again]


@pytest.mark.torch
def test_the_rewritten_helper_computes_the_same():
    torch = pytest.importorskip("torch")
    _, new = scan_source(GEMMA, select_rules("default"), "gemma.py", "gemma")
    a_ns: dict = {}
    b_ns: dict = {}
    exec(compile(GEMMA, "<original>", "exec"), a_ns)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), b_ns)  # noqa: S102
    a, b = a_ns["GemmaRMSNorm"](8), b_ns["GemmaRMSNorm"](8)
    with torch.no_grad():
        a.scale.normal_()
    b.load_state_dict(a.state_dict())
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.bfloat16, 1e-2)):
        x = torch.randn(3, 5, 8, dtype=dtype)
        got, expected = b(x), a(x)
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
