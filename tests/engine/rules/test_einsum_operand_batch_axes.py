"""An einsum whose operands each carry a batch axis the other lacks: enformer's context attention,
every query sequence against every context, `'b h i d, c h j d -> b c h i j'`. The context label `c`,
placed in the output among the labels both operands share, is a batch axis missing from the query
(not a second key axis flattened with `j`), so the scores are (b, c, h, i, j) with the softmax over
the keys `j`; the kernel takes the query, key and value each given the batch axis it lacks and
expanded to the other's size. Each module runs original against rewritten in float64 (fully
masked rows included), forward and gradients. Near-misses: a softmax over the contexts, and a
value product that sums over the contexts too (not one attention per context)."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = """
import torch
import torch.nn.functional as F
from torch import einsum, nn


class ContextAttention(nn.Module):
    def __init__(self, dim_head=4):
        super().__init__()
        self.scale = dim_head ** -0.5

    def forward(self, q, k, v, context_mask=None):
        sim = einsum('b h i d, c h j d -> b c h i j', q, k) * self.scale
        if context_mask is not None:
            context_mask = context_mask[:, None, None, None, :]
            sim = sim.masked_fill(~context_mask, -torch.finfo(sim.dtype).max)
        attn = sim.softmax(dim={softmax})
        return einsum('b c h i j, c h j d -> {out}', attn, v)
"""

ATTENTION = SOURCE.format(softmax=-1, out="b c h i d")


def _run(source: str, mask):
    module = namespace(source)["ContextAttention"]()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)  # (b, h, i, d)
    k, v = (torch.randn(4, 3, 6, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = module(q, k, v, mask)
    out.sum().backward()
    return out, [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("masked", [True, False], ids=["masked", "no-mask"])
def test_every_query_against_every_context_runs_the_kernel(masked):
    new = rewrite(ATTENTION)
    assert "einsum(" not in new and new.count("scaled_dot_product_attention(") == 1
    # each operand gets the batch axis it lacks, expanded to the other's size
    assert "q.unsqueeze(1).expand(-1, k.shape[0], -1, -1, -1)" in new
    assert "k.unsqueeze(0).expand(q.shape[0], -1, -1, -1, -1)" in new
    assert "v.unsqueeze(0).expand(q.shape[0], -1, -1, -1, -1)" in new
    mask = None
    if masked:
        mask = torch.ones(2, 6, dtype=torch.bool)  # (b, j): one mask per query sequence
        mask[0, -2:] = False
        mask[1] = False  # every key masked: the original averages v there
    before, before_grads = _run(ATTENTION, mask)
    after, after_grads = _run(new, mask)
    assert after.shape == (2, 4, 3, 5, 4)
    torch.testing.assert_close(after, before)
    for a, b in zip(after_grads, before_grads, strict=True):
        torch.testing.assert_close(a, b)


NEAR_MISSES = {
    # normalized over the contexts, not the keys
    "a softmax over the contexts": SOURCE.format(softmax=1, out="b c h i d"),
    # the contexts summed out with the keys: one output mixing every context's attention
    "the contexts summed by the value product": SOURCE.format(softmax=-1, out="b h i d"),
}


@pytest.mark.parametrize("source", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_are_not_rewritten(source):
    found, new = statuses(source)
    assert new == source, found
    assert all(status == "near-miss" for status, _ in found), found


# labml's RETRO cross attention: each retrieved neighbour attends to the chunk that retrieved it;
# the keys and values have no neighbour axis `n`, which the kernel's 6-D operands get as a size-1
# axis expanded (a view: the math path that 6-D operands take broadcasts them the same way)
NEIGHBOURS = """
import torch
from torch import nn


class CrossAttention(nn.Module):
    def __init__(self, d_k=4):
        super().__init__()
        self.scale = d_k ** -0.5
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, q, k, v):
        attn = torch.einsum('bcnihd,bcjhd->bcnhij', q, k)
        attn = attn * self.scale
        attn = self.softmax(attn)
        return torch.einsum("bcnhij,bcjhd->bcnihd", attn, v)
"""


def test_neighbours_against_their_chunk():
    new = rewrite(NEIGHBOURS)
    assert "einsum(" not in new and new.count("scaled_dot_product_attention(") == 1
    assert "k.transpose(2, 3).unsqueeze(2).expand(-1, -1, q.shape[2], -1, -1, -1)" in new
    assert "nn.Softmax" not in new  # read by nothing else: no parameters, the state_dict is the same
    outs = []
    for source in (NEIGHBOURS, new):
        g = torch.Generator().manual_seed(0)
        q = torch.randn(2, 3, 2, 5, 3, 4, generator=g, dtype=torch.float64, requires_grad=True)  # (b, c, n, i, h, d)
        k, v = (torch.randn(2, 3, 6, 3, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
        out = namespace(source)["CrossAttention"]()(q, k, v)
        out.sum().backward()
        outs.append([out, q.grad, k.grad, v.grad])
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b)
