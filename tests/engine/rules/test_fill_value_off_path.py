"""A fill value read from the scores' dtype (`max_neg_value = -torch.finfo(sim.dtype).max`) that also
feeds a fill on a branch the match does not take (imagen-video's causal fill under `if self.causal:`,
the match being the padding fill's): that read is no escape of the scores. The original code runs
under a guard wherever that branch does, read and all; on the kernel's path the read goes with the
fill it feeds. Each module runs original against rewritten in float64 on both sides of the guard,
with and without the padding mask (a fully padded sample included), forward and gradients.
Near-misses: a fill value that is not the lowest value, the scores themselves kept past the match,
and the value read on the kernel's own path by code the rewrite keeps."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
from torch import einsum, nn


def exists(val):
    return val is not None
"""


def _module(body: str, init: str = "") -> str:
    return HEADER + f'''
class Attention(nn.Module):
    def __init__(self, causal=False):
        super().__init__()
        self.causal = causal
        self.scale = nn.Parameter(torch.tensor(8.0, dtype=torch.float64)){init}

    def forward(self, q, k, v, mask=None):
        sim = einsum('b h i d, b h j d -> b h i j', q, k) * self.scale{body}
'''


# imagen-video's Attention: one fill value for a causal fill under a setting and a padding fill
IMAGEN = _module('''
        max_neg_value = -torch.finfo(sim.dtype).max

        if self.causal:
            i, j = sim.shape[-2:]
            causal_mask = torch.ones((i, j), device=q.device, dtype=torch.bool).triu(j - i + 1)
            sim = sim.masked_fill(causal_mask, max_neg_value)

        if exists(mask):
            mask = mask[:, None, None, :]
            sim = sim.masked_fill(~mask, max_neg_value)

        attn = sim.softmax(dim=-1)
        return einsum('b h i j, b h j d -> b h i d', attn, v)''')

# the value computed in the fill of the taken branch's statement, read by the other branch's fill
# through the same name (the read itself on the match's path, the other fill on a path it is not)
DEFINED_IN_BRANCH = _module('''
        if exists(mask):
            max_neg_value = -torch.finfo(sim.dtype).max
            sim = sim.masked_fill(~mask[:, None, None, :], max_neg_value)
            if self.causal:
                n = sim.shape[-1]
                sim = sim.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), max_neg_value)

        attn = sim.softmax(dim=-1)
        return einsum('b h i j, b h j d -> b h i d', attn, v)''')


def _keep(b=2, n=5):
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, -2:] = False
    keep[1] = False  # a fully padded sample: every row of it masks every key
    return keep


def _run(source: str, causal: bool, mask):
    module = namespace(source)["Attention"](causal=causal)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = module(q, k, v, mask)
    out.sum().backward()
    return out, [t.grad for t in (q, k, v, module.scale)]


@pytest.mark.parametrize("source", [IMAGEN, DEFINED_IN_BRANCH], ids=["read-before-both", "read-in-branch"])
@pytest.mark.parametrize("causal", [False, True], ids=["kernel", "original"])
@pytest.mark.parametrize("given", [True, False], ids=["masked", "no-mask"])
def test_fill_value_read_for_an_untaken_branch_is_kept_under_the_guard(source, causal, given):
    found, new = statuses(source)
    assert [status for status, _ in found] == ["guarded"], found
    assert "if self.causal" in new and new.count("scaled_dot_product_attention(") == 1
    mask = _keep() if given else None
    before, before_grads = _run(source, causal, mask)
    after, after_grads = _run(new, causal, mask)
    torch.testing.assert_close(after, before, equal_nan=True)
    for a, b in zip(after_grads, before_grads, strict=True):
        torch.testing.assert_close(a, b, equal_nan=True)


def test_the_read_stays_on_the_original_branch_only():
    new = rewrite(IMAGEN)
    original, kernel = new.split("else:", 1)
    # the original branch computes the value as written and fills with it; the kernel's has no
    # scores to read it from, and no use for it
    assert "max_neg_value = -torch.finfo(sim.dtype).max" in original
    assert "max_neg_value" not in kernel and "sim" not in kernel


NEAR_MISSES = {
    # the smallest positive normal number: filled keys keep a weight
    "a fill value that is not the lowest": _module('''
        fill = torch.finfo(sim.dtype).tiny
        if self.causal:
            sim = sim.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), fill)
        if exists(mask):
            sim = sim.masked_fill(~mask[:, None, None, :], fill)
        attn = sim.softmax(dim=-1)
        return einsum('b h i j, b h j d -> b h i d', attn, v)'''),
    # the scores are returned on the kernel's path too
    "the scores returned": _module('''
        max_neg_value = -torch.finfo(sim.dtype).max
        if self.causal:
            sim = sim.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), max_neg_value)
        if exists(mask):
            sim = sim.masked_fill(~mask[:, None, None, :], max_neg_value)
        attn = sim.softmax(dim=-1)
        return einsum('b h i j, b h j d -> b h i d', attn, v), sim'''),
    # the value is stored on the kernel's path: the read must stay, of scores that are gone (their
    # dtype is not provably the query's: the scale is a tensor)
    "the value read on the kernel's path": _module('''
        max_neg_value = -torch.finfo(sim.dtype).max
        self.last_fill = max_neg_value
        if self.causal:
            sim = sim.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), max_neg_value)
        if exists(mask):
            sim = sim.masked_fill(~mask[:, None, None, :], max_neg_value)
        attn = sim.softmax(dim=-1)
        return einsum('b h i j, b h j d -> b h i d', attn, v)'''),
}


@pytest.mark.parametrize("source", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_are_not_rewritten(source):
    found, new = statuses(source)
    assert new == source, found
    assert found and all(status == "near-miss" for status, _ in found), found
