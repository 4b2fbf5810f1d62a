"""Attention with a single query written without its query axis, the products spelled without a
product op (engine/analysis/contraction.py): key-major scores `(k @ u.unsqueeze(2)).squeeze(-1)`
or a row `(u.unsqueeze(1) @ k.transpose(1, 2)).squeeze(1)`, and the output as a multiply and a sum
over the key axis, `(v * p.unsqueeze(2)).sum(dim=1)`. The kernel gets the query with its axis back
(`u.unsqueeze(-2)`), each mask too, and its result is squeezed.

Each module is run original against rewritten in float64 (any difference is semantic), forward and
backward, with masks that leave some rows with every key masked; look-alikes must stay untouched."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace as _namespace
from tests.engine.rules.harness import scan as _findings
from tests.engine.rules.harness import statuses as _scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# recbole's SHAN pooling, with the ranks the code proves (its shapes unpacked): the user embedding
# is the one query, relu(W x + b) the keys, x itself the values.
POOL = """
import torch
import torch.nn as nn


class Pool(nn.Module):
    def __init__(self, dim=6):
        super().__init__()
        self.key = nn.Linear(dim, dim)

    def forward(self, x, user, mask):
        batch, length, dim = x.shape
        batch, dim = user.shape
        batch, length = mask.shape
        keys = torch.relu(self.key(x))
        scores = torch.matmul(keys, user.unsqueeze(2)).squeeze(-1)
        scores = scores.masked_fill(mask, -1e9)
        weights = {softmax}(scores)
        return {output}
"""

SOFTMAX = "nn.Softmax(dim=-1)"
SUMMED = "torch.mul(x, weights.unsqueeze(2)).sum(dim=1)"

# the scores as a row times the transposed keys, the output summed over the key axis counted from the end
ROW = """
import torch
import torch.nn as nn


class Row(nn.Module):
    def __init__(self, dim=6):
        super().__init__()
        self.scale = dim ** -0.5

    def forward(self, q, k, v):
        b, h, d = q.shape
        b, h, n, d = k.shape
        b, h, n, e = v.shape
        s = (q.unsqueeze(2) @ k.transpose(2, 3)).squeeze(2) * self.scale
        p = s.softmax(dim=-1)
        return (v * p.unsqueeze(-1)).sum(-2)
"""


def _pool(source: str):
    return _namespace(source)["Pool"]().double()


def _compare(original, rewritten, *inputs, nan_rows: bool = False) -> None:
    for mode in ("train", "eval"):
        getattr(original, mode)()
        getattr(rewritten, mode)()
        a_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        b_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        a, b = original(*a_in), rewritten(*b_in)
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=nan_rows)
        weights = torch.randn_like(a)
        (a.nan_to_num() * weights).sum().backward()
        (b.nan_to_num() * weights).sum().backward()
        for x, y in zip(a_in, b_in, strict=True):
            if x.is_floating_point():
                torch.testing.assert_close(x.grad, y.grad, rtol=1e-12, atol=1e-12)
        for (name, p), (_, r) in zip(original.named_parameters(), rewritten.named_parameters(), strict=True):
            torch.testing.assert_close(p.grad, r.grad, rtol=1e-12, atol=1e-12, msg=name)
        original.zero_grad()
        rewritten.zero_grad()


def test_key_major_scores_and_summed_output_are_one_query_attention():
    source = POOL.format(softmax=SOFTMAX, output=SUMMED)
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert "scaled_dot_product_attention(" in new and "user.unsqueeze(-2)" in new and ").squeeze(-2)" in new
    assert ".sum(" not in new and "torch.mul" not in new
    torch.manual_seed(0)
    original = _pool(source)
    rewritten = _pool(new)
    rewritten.load_state_dict(original.state_dict())
    x, user = torch.randn(4, 5, 6, dtype=torch.float64), torch.randn(4, 6, dtype=torch.float64)
    mask = torch.rand(4, 5) < 0.4
    mask[1] = True  # a sample whose every key is masked: the original averages x there
    mask[2] = False
    _compare(original, rewritten, x, user, mask)
    assert _findings(new)[1] == new  # the rewrite is stable: scanning it again changes nothing


def test_row_scores_and_output_summed_from_the_end():
    found, new = _scan(ROW)
    assert found == [("rewritten", None)]
    model = _namespace(ROW)["Row"]().double()
    rewritten = _namespace(new)["Row"]().double()
    torch.manual_seed(1)
    q = torch.randn(2, 3, 4, dtype=torch.float64)
    k, v = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 5, 7, dtype=torch.float64)
    _compare(model, rewritten, q, k, v)


@pytest.mark.parametrize(
    ("softmax", "output"),
    [
        # a gate, not a softmax: a weighted sum that is no attention
        ("torch.sigmoid", SUMMED),
        # the softmax over the batch axis (of the single query's scores there is no query axis)
        ("nn.Softmax(dim=0)", SUMMED),
        # summed over the feature axis, not the key axis: the size-1 axis is summed, nothing is contracted
        (SOFTMAX, "torch.mul(x, weights.unsqueeze(2)).sum(dim=2)"),
        # the weights unsqueezed before the key axis: an outer product summed over the keys of x
        (SOFTMAX, "torch.mul(x, weights.unsqueeze(1)).sum(dim=1)"),
    ],
)
def test_look_alikes_stay(softmax, output):
    source = POOL.format(softmax=softmax, output=output)
    found, new = _scan(source)
    assert new == source
    assert all(status != "rewritten" for status, _ in found)


def test_mask_of_unproven_rank_is_a_near_miss():
    source = POOL.format(softmax=SOFTMAX, output=SUMMED).replace("        batch, length = mask.shape\n", "")
    found, new = _scan(source)
    assert new == source
    assert found == [("near-miss", "the mask `mask` of a single query's scores is not proven to have an axis to "
                                   "add the query's before")]


def test_output_as_a_row_product_squeezed_back():
    # the weights given their query axis by hand, the product's row squeezed back: one query too
    source = POOL.format(softmax=SOFTMAX, output="torch.matmul(weights.unsqueeze(1), x).squeeze(1)")
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    torch.manual_seed(2)
    original = _pool(source)
    rewritten = _pool(new)
    rewritten.load_state_dict(original.state_dict())
    mask = torch.rand(3, 5) < 0.5
    mask[0] = True
    _compare(original, rewritten, torch.randn(3, 5, 6, dtype=torch.float64), torch.randn(3, 6, dtype=torch.float64),
             mask)
