"""A term added to the probabilities before the product with the value distributes over it:
`(softmax(s) + B) @ v == softmax(s) @ v + B @ v` (tsai's ConvTranPlus Attention_Rel_Scl, a relative
bias added after the softmax). The kernel's result plus `B @ v`, with B expanded to the value's
length on its last axis where that axis may be a broadcast size 1; a B computed from the
probabilities, or one that is no tensor, stays.

Each module is run original against rewritten in float64, forward and backward, also with a padding
mask whose fully masked rows are NaN in both."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace as _namespace
from tests.engine.rules.harness import statuses as _scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

REL_SCL = """
import torch
from torch import nn


class RelScl(nn.Module):
    def __init__(self, d_model=8, seq_len=5, n_heads=2):
        super().__init__()
        self.seq_len = seq_len
        self.n_heads = n_heads
        self.scale = d_model ** -0.5
        self.key = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Linear(d_model, d_model, bias=False)
        self.query = nn.Linear(d_model, d_model, bias=False)
        self.table = nn.Parameter(torch.randn(seq_len * seq_len, n_heads))

    def forward(self, x, pad):
        b, n, _ = x.shape
        k = self.key(x).reshape(b, n, self.n_heads, -1).permute(0, 2, 3, 1)
        v = self.value(x).reshape(b, n, self.n_heads, -1).transpose(1, 2)
        q = self.query(x).reshape(b, n, self.n_heads, -1).transpose(1, 2)
        attn = torch.matmul(q, k) * self.scale
        attn = nn.functional.softmax(attn, dim=-1)
        bias = self.table.reshape(self.seq_len, self.seq_len, -1).permute(2, 0, 1).unsqueeze(0)
        attn = attn + bias
        return torch.matmul(attn, v)
"""


def _same(source: str, new: str, seq_len: int = 5, n: int = 5, pad: bool = False) -> None:
    torch.manual_seed(0)
    a = _namespace(source)["RelScl"](seq_len=seq_len).double()
    b = _namespace(new)["RelScl"](seq_len=seq_len).double()
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(3, n, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 1, n, n, dtype=torch.bool)
    if pad:
        mask[1, :, 1] = True  # one query of one sample sees no key
        mask[2, :, :, -1] = True  # one key of another is padding
    ya, yb = a(x, mask), b(x, mask)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12, equal_nan=True)
    if not pad:
        params = [x, *a.parameters()]
        ga = torch.autograd.grad(ya.square().sum(), params, allow_unused=True, materialize_grads=True)
        gb = torch.autograd.grad(yb.square().sum(), [x, *b.parameters()], allow_unused=True, materialize_grads=True)
        for g1, g2 in zip(ga, gb, strict=True):
            torch.testing.assert_close(g2, g1, rtol=1e-10, atol=1e-12)


def test_a_bias_added_after_the_softmax_is_distributed():
    found, new = _scan(REL_SCL)
    assert found == [("rewritten", None)]
    assert "scale=self.scale" in new and "+ bias.expand(*bias.shape[:-1], v.shape[-2]) @ v" in new
    _same(REL_SCL, new)
    # a table of one position broadcasts over every key: the expand contracts the same sum
    _same(REL_SCL, new, seq_len=1, n=4)


def test_a_bias_over_the_key_axis_needs_no_expand_and_masked_rows_stay_nan():
    source = REL_SCL.replace("attn = nn.functional.softmax(attn, dim=-1)",
                             "attn = attn.masked_fill(pad, float('-inf'))\n"
                             "        attn = nn.functional.softmax(attn, dim=-1)") \
        .replace("bias = self.table", "bias = torch.matmul(q, k).sigmoid() * 0.5\n        table = self.table")
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert "+ bias @ v" in new and "expand" not in new
    _same(source, new, pad=True)
    _same(source, new)


@pytest.mark.parametrize(("term", "reason"), [
    ("attn.mean(-1, keepdim=True)", "computed from the scores or the probabilities"),  # B depends on p
    ("(attn.detach() * 2 + bias).sigmoid()", "computed from the scores or the probabilities"),  # through steps
    ("0.1", "not provably a tensor"),
])
def test_a_term_that_does_not_distribute_stays(term, reason):
    source = REL_SCL.replace("attn = attn + bias", f"attn = attn + {term}")
    found, new = _scan(source)
    assert [status for status, _ in found] == ["near-miss"] and reason in found[0][1] and new == source
