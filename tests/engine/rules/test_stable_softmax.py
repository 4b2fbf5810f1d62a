"""A "stable softmax" helper (DALLE's, DALLE2's and tortoise's `stable_softmax`: the scores divided
by alpha, their detached row maximum subtracted, times alpha again, then the softmax) is the softmax
of the scores (engine/match/matcher.py `MethodIndex.shifted_softmax_view`): the scaled maximum is a
per-row constant, and a power-of-two alpha scales exactly. DALLE2's VQGAN attention, channels-first
on (b, h, c, n) views, with an additive bias and that helper, becomes SDPA on the transposed views.
Each rewrite is run against the original in float64, forward and backward."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# DALLE2-pytorch 1.15.6 vqgan_vae.py: VQGanAttention's core with a learned bias for its position bias
# module, einops' rearrange written as views
VQGAN = """
import torch
from torch import nn, einsum


def stable_softmax(t, dim = -1, alpha = {alpha}):
    t = t / alpha
    t = t - torch.amax(t, dim = {mdim}, keepdim = True){detach}
    return (t * {times}).softmax(dim = dim)


class Attention(nn.Module):
    def __init__(self, heads=2, n=6):
        super().__init__()
        self.scale = 4 ** -0.5
        self.dropout = nn.Dropout(0.0)
        self.bias = nn.Parameter(torch.randn(heads, n, n, dtype=torch.float64))

    def forward(self, q, k, v):
        sim = einsum('b h c i, b h c j -> b h i j', q, k) * self.scale
        sim = sim + self.bias
        attn = stable_softmax(sim, dim = -1)
        attn = self.dropout(attn)
        return einsum('b h i j, b h c j -> b h c i', attn, v)
"""

STABLE = dict(alpha="32 ** 2", mdim="dim", detach=".detach()", times="alpha")


def _same(original: str, rewritten: str) -> None:
    torch.manual_seed(0)
    inputs = [torch.randn(2, 2, 4, 6, dtype=torch.float64) * 3 for _ in range(3)]
    outs, grads = [], []
    for source in (original, rewritten):
        torch.manual_seed(1)
        module = namespace(source)["Attention"]()
        args = [t.clone().requires_grad_(True) for t in inputs]
        out = module(*args)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
        outs.append(out)
        grads.append([a.grad for a in args] + [module.bias.grad])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-12)
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("variant", [
    STABLE,
    {**STABLE, "detach": ""},  # the maximum's gradient sums to zero over the row: none either way
    {**STABLE, "alpha": "0.125", "mdim": "-1"},  # another power of two; the same axis as a constant
])
def test_a_stable_softmax_helper_is_the_softmax_of_the_scores(variant):
    source = VQGAN.format(**variant)
    new = rewrite(source)
    assert "scaled_dot_product_attention(" in new and "attn_mask=self.bias" in new, new
    assert "q.transpose(-2, -1)" in new and "stable_softmax(sim" not in new, new
    _same(source, new)


@pytest.mark.parametrize("variant", [
    {**STABLE, "alpha": "1000"},  # x / 1000 * 1000 need not be x exactly
    {**STABLE, "times": "2 * alpha"},  # the scores doubled: not the softmax of the scores
    {**STABLE, "mdim": "-2"},  # the maximum over the query axis: no constant of the softmax's rows
])
def test_other_scalings_or_shifts_are_not_the_softmax_of_the_scores(variant):
    _, new = statuses(VQGAN.format(**variant))
    assert "scaled_dot_product_attention" not in new


def test_a_shifted_value_read_elsewhere_is_not_dropped():
    source = VQGAN.format(**STABLE).replace(
        "    return (t * alpha).softmax(dim = dim)", "    print(t)\n    return (t * alpha).softmax(dim = dim)")
    _, new = statuses(source)
    assert "scaled_dot_product_attention" not in new
