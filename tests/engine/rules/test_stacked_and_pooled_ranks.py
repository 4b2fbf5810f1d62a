"""Ranks proven through stacked heads and through branches decided by a rank (engine/analysis/shapes.py).

Heads split off the feature axis and stacked on a new leading axis (coqui-tts's GST attention:
`torch.stack(torch.split(x, d, dim=2), dim=0)`, (h, N, T, d)) are 4-D where the inputs are proven
3-D, so `transpose(2, 3)` and `softmax(dim=3)` are the kernel's. A pooling module whose helpers add an
axis to a 3-D input and take it away again (torchvision's MViT `Pool`: `if x.dim() == target - 1:
x = x.unsqueeze(1)`) returns a 4-D key for a 4-D one: the branches are decided by the rank the call
passes. Each rewrite runs original against rewritten in float64, forward and backward."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

STACKED = """
import torch
import torch.nn.functional as F
from torch import nn


class StyleAttention(nn.Module):
    def __init__(self, dim=12, heads=3):
        super().__init__()
        self.key_dim = dim // heads
        self.W_query = nn.Linear(dim, dim, bias=False)
        self.W_key = nn.Linear(dim, dim, bias=False)
        self.W_value = nn.Linear(dim, dim, bias=False)

    def forward(self, query, key):
        n, s, _ = query.shape
        n, t, _ = key.shape
        queries = torch.stack(torch.split(self.W_query(query), self.key_dim, dim=2), dim=0)
        keys = torch.stack(torch.split(self.W_key(key), self.key_dim, dim=2), dim=0)
        values = torch.stack(torch.split(self.W_value(key), self.key_dim, dim=2), dim=0)
        scores = torch.matmul(queries, keys.transpose(2, 3)) / self.key_dim**0.5
        scores = F.softmax(scores, dim=3)
        out = torch.matmul(scores, values)
        return torch.cat(torch.split(out, 1, dim=0), dim=3).squeeze(0)
"""

POOLED = """
import torch
from torch import nn


def _unsqueeze(x, target_dim, expand_dim):
    tensor_dim = x.dim()
    if tensor_dim == target_dim - 1:
        x = x.unsqueeze(expand_dim)
    elif tensor_dim != target_dim:
        raise ValueError("Unsupported input dimension")
    return x, tensor_dim


def _squeeze(x, target_dim, expand_dim, tensor_dim):
    if tensor_dim == target_dim - 1:
        x = x.squeeze(expand_dim)
    return x


class Pool(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x, tensor_dim = _unsqueeze(x, TARGET, 1)
        x = self.norm(x[..., ::2, :])
        return _squeeze(x, TARGET, 1, tensor_dim)


class PooledAttention(nn.Module):
    def __init__(self, dim=12, heads=3):
        super().__init__()
        self.heads = heads
        self.scaler = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.pool_k = Pool(dim // heads)
        self.pool_v = Pool(dim // heads)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, -1).transpose(1, 3).unbind(dim=2)
        k = self.pool_k(k)
        v = self.pool_v(v)
        attn = torch.matmul(self.scaler * q, k.transpose(2, 3))
        attn = attn.softmax(dim=-1)
        x = torch.matmul(attn, v)
        return x.transpose(1, 2).reshape(B, -1, C)
"""


def _same(source: str, new: str, cls: str, *shapes: tuple[int, ...]) -> None:
    """Original and rewritten `cls`, same weights, float64: outputs and every gradient agree."""
    torch.manual_seed(0)
    a = namespace(source)[cls]().double()
    b = namespace(new)[cls]().double()
    b.load_state_dict(a.state_dict())
    inputs = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shapes]
    twins = [t.detach().clone().requires_grad_() for t in inputs]
    out_a, out_b = a(*inputs), b(*twins)
    torch.testing.assert_close(out_b, out_a)
    out_a.pow(2).sum().backward()
    out_b.pow(2).sum().backward()
    for x, y in zip(inputs, twins, strict=True):
        torch.testing.assert_close(y.grad, x.grad)
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, msg=name)


def test_stacked_heads_of_3d_inputs_are_rewritten_and_agree():
    new = rewrite(STACKED)
    assert "F.scaled_dot_product_attention(queries, keys, values, scale=1 / self.key_dim**0.5)" in new
    _same(STACKED, new, "StyleAttention", (2, 5, 12), (2, 7, 12))


def test_stacked_heads_of_inputs_of_unproven_rank_are_tested_at_run_time():
    # `transpose(2, 3)` and `softmax(dim=3)` state rank 4, which nothing proves: the original stays
    # where a run-time test says otherwise (tests/engine/rules/test_rank_tested_at_run_time.py)
    source = STACKED.replace("        n, s, _ = query.shape\n        n, t, _ = key.shape\n", "")
    found, new = statuses(source)
    assert found == [("guarded", None)]
    assert "if keys.dim() != 4 or queries.dim() != 4:" in new
    _same(source, new, "StyleAttention", (2, 5, 12), (2, 7, 12))


@pytest.mark.parametrize("target", [4, 5])  # 4: neither branch runs; 5: an axis added and taken away
def test_a_pooled_key_whose_rank_helpers_are_decided_is_rewritten_and_agrees(target):
    source = POOLED.replace("TARGET", str(target))
    new = rewrite(source)
    assert "scaled_dot_product_attention(q, k, v, scale=self.scaler)" in new
    _same(source, new, "PooledAttention", (2, 6, 12))


def test_a_pool_that_keeps_the_added_axis_gives_a_5d_key():
    source = POOLED.replace("TARGET", "5").replace("        return _squeeze(x, 5, 1, tensor_dim)\n", "        return x\n")
    found, new = statuses(source)
    assert new == source
    assert found == [("near-miss", "transpose(2, 3) of a 5-D tensor is not provably a swap of the last two dimensions")]
