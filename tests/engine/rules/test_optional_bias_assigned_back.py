"""An additive bias that the code makes from the tested variable and assigns back to its name on the
branch where it is given (local-attention's cached decoding step: `if exists(attn_bias): attn_bias =
attn_bias[..., -1:, -k_len:]; sim = sim + attn_bias`): after the `if` the name holds the bias where
it was given and None elsewhere, so one kernel call after the `if` takes `attn_mask=attn_bias`, with
the branch's own statements kept, instead of a second kernel call without the mask under a guard.
Both paths are run against the original (forward and gradients); a name assigned again between the
`if` and the kernel, a bias made under the other branch, or a merge that is not the tested name's
keep two calls or the original."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
import torch.nn as nn


def exists(val):
    return val is not None
"""

CACHED = HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v, attn_bias=None):
        q = q * q.shape[-1] ** -0.5

        sim = torch.einsum('b h i d, b h j d -> b h i j', q, k)

        if exists(attn_bias):
            k_len = k.shape[-2]
            attn_bias = attn_bias[..., -1:, -k_len:]
            assert attn_bias.shape[-1] == sim.shape[-1]
            sim = sim + attn_bias

        attn = sim.softmax(dim = -1)
        out = torch.einsum('b h i j, b h j d -> b h i d', attn, v)
        return out
'''

EXPECTED = '''    def forward(self, q, k, v, attn_bias=None):
        if exists(attn_bias):
            k_len = k.shape[-2]
            attn_bias = attn_bias[..., -1:, -k_len:]
            assert attn_bias.shape[-1] == k.shape[-2]

        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_bias, scale=q.shape[-1] ** -0.5
        )
        return out
'''


def _run(source: str, bias):
    module = namespace(source)["Attention"]()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 1, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 3, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = module(q, k, v, bias)
    out.sum().backward()
    return out, [t.grad for t in (q, k, v)]


def test_one_kernel_call_after_the_branch():
    found, new = statuses(CACHED)
    assert [status for status, _ in found] == ["rewritten"]
    assert EXPECTED in new
    assert new.count("scaled_dot_product_attention(") == 1


@pytest.mark.parametrize("given", [True, False], ids=["bias", "no-bias"])
def test_both_paths_match_the_original(given):
    new = rewrite(CACHED)
    bias = torch.randn(3, 4, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64) if given else None
    before, before_grads = _run(CACHED, bias)
    after, after_grads = _run(new, bias)
    torch.testing.assert_close(after, before)
    for a, b in zip(after_grads, before_grads, strict=True):
        torch.testing.assert_close(a, b)


NOT_THE_MERGE = {
    # the name is assigned again after the `if`: the kernel would read that value, not the bias
    "assigned again after the if": CACHED.replace(
        "        attn = sim.softmax(dim = -1)\n",
        "        attn_bias = self.other\n        attn = sim.softmax(dim = -1)\n"),
    # the bias is kept under another name: after the `if` the tested name is the bias untouched
    "kept under another name": CACHED.replace(
        "            attn_bias = attn_bias[..., -1:, -k_len:]\n"
        "            assert attn_bias.shape[-1] == sim.shape[-1]\n"
        "            sim = sim + attn_bias\n",
        "            bias = attn_bias[..., -1:, -k_len:]\n"
        "            assert bias.shape[-1] == sim.shape[-1]\n"
        "            sim = sim + bias\n"),
}


@pytest.mark.parametrize("source", NOT_THE_MERGE.values(), ids=NOT_THE_MERGE.keys())
def test_no_kernel_reads_a_name_that_is_not_the_merge(source):
    found, new = statuses(source)
    assert found and all(status != "rewritten" for status, _ in found), found
    assert "attn_mask=attn_bias, scale" not in new.replace("\n", "")


# local-attention's windowed step: the bias repeated over the batch on its branch, then a padding fill
FILLED = HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v, pad_mask, attn_bias=None):
        b = q.shape[0]
        sim = torch.einsum('b h i e, b h j e -> b h i j', q, k) * q.shape[-1] ** -0.5

        if exists(attn_bias):
            heads = attn_bias.shape[0]
            attn_bias = attn_bias.repeat(b // heads, 1, 1, 1)
            sim = sim + attn_bias

        sim = sim.masked_fill(pad_mask, -torch.finfo(sim.dtype).max)
        attn = sim.softmax(dim = -1)
        return torch.einsum('b h i j, b h j e -> b h i e', attn, v)
'''


@pytest.mark.parametrize("given", [True, False], ids=["bias", "no-bias"])
def test_with_a_fill_the_bias_is_tested_once(given):
    found, new = statuses(FILLED)
    assert [status for status, _ in found] == ["rewritten"]
    assert "if exists(attn_bias):\n            heads = attn_bias.shape[0]\n" in new
    assert "attn_bias if attn_bias is not None else 0.0" in new
    assert new.count("scaled_dot_product_attention(") == 1
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, 2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pad = torch.zeros(4, 2, 5, 5, dtype=torch.bool)
    pad[0, :, :, -2:] = True
    pad[1, 0] = True  # every key masked: the original averages the values, so must the rewrite
    bias = torch.randn(2, 2, 5, 5, generator=g, dtype=torch.float64) if given else None
    results = []
    for source in (FILLED, new):
        out = namespace(source)["Attention"]()(q, k, v, pad, bias)
        grads = torch.autograd.grad(out.sum(), (q, k, v))
        results.append([out, *grads])
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b)
