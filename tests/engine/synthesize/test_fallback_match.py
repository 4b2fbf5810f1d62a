"""When synthesis cannot write the fullest match of a root, it writes the next match of the same
root that it can: the fullest attention match binds the query before its scale (`q = q * scale`),
but the code reassigns `q` (a rotary embedding) before the product, so that match cannot be
written; the match without the scale step reads the current `q` and is still exact."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, rotary=None):
        super().__init__()
        self.scale = 8 ** -0.5
        self.rotary = rotary

    def forward(self, q, k, v):
        q = q * self.scale
        if self.rotary is not None:
            q = self.rotary(q)
            k = self.rotary(k)
        sim = q @ k.transpose(-2, -1)
        attn = sim.softmax(dim=-1)
        return attn @ v
'''


class _Rotate(torch.nn.Module):
    def forward(self, x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1) + 0.1 * x


def _load(source):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - the source written above
    return namespace["Attention"]


def test_the_next_match_is_written_when_the_fullest_cannot_be():
    findings, new = scan_source(SOURCE, select_rules("sdpa-attention"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "scaled_dot_product_attention(q, k, v, scale=1.0)" in new
    assert "q = q * self.scale" in new  # the scale stays where the code applies it
    finding = findings[0]
    assert finding.match is not None and "qs" in finding.match.skipped  # the reported match is the one written
    original, rewritten = _load(SOURCE), _load(new)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    for rotary in (None, _Rotate()):
        torch.testing.assert_close(rewritten(rotary)(q, k, v), original(rotary)(q, k, v), rtol=1e-12, atol=1e-12)


def test_without_a_writable_match_the_reason_is_the_fullest_match_s():
    # `q` reassigned after the product too: no match of the root can be written
    source = SOURCE.replace("sim = q @ k.transpose(-2, -1)", "sim = q @ k.transpose(-2, -1)\n        q = None")
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    assert new == source
    assert [(f.status, f.reason, f.line) for f in findings] == [
        ("near-miss", "not rewritten: `q` is reassigned between its use in the match and the rewrite", 13)]
