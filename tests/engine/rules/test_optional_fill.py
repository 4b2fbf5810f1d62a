"""A fill mask applied only when the mask is given (`if mask is not None: s = s.masked_fill(~mask,
fill)`, vit-pytorch's and imagen's `if exists(mask): mask = rearrange(...); ...`): one kernel call
after the merge takes that mask where it is set and none where it is None, instead of the original
attention kept on one branch. Both branches are run against the original, with fully masked rows,
forward and gradients, in train and eval mode; arms that differ in more than the mask keep it."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F


def exists(val):
    return val is not None
"""

PLAIN = HEADER + '''
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 8 ** -0.5
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(0.1)

    def forward(self, q, k, v, mask=None):
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is not None:
            dots = dots.masked_fill(~mask, -torch.finfo(dots.dtype).max)
        attn = self.attend(dots)
        attn = self.dropout(attn)
        return torch.matmul(attn, v)
'''

# the mask reshaped on its branch under a helper's test, and a fill that reads a keep mask `== 0`
REBOUND = HEADER + '''
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 8 ** -0.5
        self.dropout = nn.Dropout(0.1)

    def forward(self, q, k, v, mask=None):
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale

        if exists(mask):
            mask = mask[:, None, None, :]
            mask_value = -torch.finfo(dots.dtype).max
            dots = dots.masked_fill(mask == 0, mask_value)

        attn = dots.softmax(dim=-1)
        attn = self.dropout(attn)
        return attn @ v
'''


def _keep(b=3, n=6):
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, -2:] = False
    keep[1] = False  # a fully padded sample: every row of it masks every key
    return keep


def _run(source: str, mask, training: bool):
    module = namespace(source)["Attention"]()
    module.train(training)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    torch.manual_seed(1)
    out = module(q, k, v, mask)
    out.sum().backward()
    return out, [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("source, mask_of", [
    (PLAIN, lambda keep: keep[:, None, None, :].expand(3, 2, 6, 6)),
    (REBOUND, lambda keep: keep.long()),
], ids=["is-not-None", "exists-rebound"])
@pytest.mark.parametrize("given", [True, False], ids=["masked", "no-mask"])
def test_one_kernel_call_for_both_branches(source, mask_of, given):
    new = rewrite(source)
    assert new.count("scaled_dot_product_attention(") == 1
    assert "torch.matmul(" not in new and "@" not in new  # no attention left on either branch
    assert "if mask is None else" in new
    mask = mask_of(_keep()) if given else None
    before, before_grads = _run(source, mask, training=False)
    after, after_grads = _run(new, mask, training=False)
    torch.testing.assert_close(after, before)
    for a, b in zip(after_grads, before_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_dropout_only_in_training():
    new = rewrite(PLAIN)
    assert "dropout_p=self.dropout.p if self.dropout.training else 0.0" in new
    # in training mode both drop: not the same draws, but the same mode (no dropout in eval above)
    out, _ = _run(new, None, training=True)
    assert torch.isfinite(out).all()


def test_rebound_hunk_keeps_the_reshape_on_its_branch():
    new = rewrite(REBOUND)
    assert "if exists(mask):\n            mask = mask[:, None, None, :]\n" in new
    assert "mask_value" not in new  # the fill's value goes with the fill


MORE_THAN_A_MASK = {
    # the masked branch scales again: the kernel would scale both branches alike
    "another scale on one arm": '''
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is not None:
            dots = dots.masked_fill(~mask, -1e9)
            attn = (dots * 2).softmax(dim=-1)
        else:
            attn = dots.softmax(dim=-1)
        return torch.matmul(attn, v)''',
    # the unmasked branch normalizes over the queries
    "another softmax axis on one arm": '''
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is not None:
            dots = dots.masked_fill(~mask, -1e9)
            attn = dots.softmax(dim=-1)
        else:
            attn = dots.softmax(dim=-2)
        return torch.matmul(attn, v)''',
    # the tested variable is replaced on its branch by something the fill does not read
    "the tested name rebound to another value": '''
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is not None:
            keep = ~mask
            mask = self.other
            dots = dots.masked_fill(keep, -1e9)
        attn = dots.softmax(dim=-1)
        return torch.matmul(attn, v)''',
    # the fill's mask mixes in another value: not None where the tested variable is
    "a fill mask of two values": '''
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is not None:
            dots = dots.masked_fill(mask & self.other, -1e9)
        attn = dots.softmax(dim=-1)
        return torch.matmul(attn, v)''',
}


@pytest.mark.parametrize("body", MORE_THAN_A_MASK.values(), ids=MORE_THAN_A_MASK.keys())
def test_arms_that_differ_in_more_than_a_mask_keep_a_branch(body):
    source = HEADER + f'''
class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 8 ** -0.5
        self.other = None

    def forward(self, q, k, v, mask=None):{body}
'''
    found, new = statuses(source)
    assert found and all(status != "rewritten" for status, _ in found), found
    assert new.count("scaled_dot_product_attention(") <= 1
    if new != source:
        # the original attention stays on the branch the kernel does not cover
        assert "softmax(dim=" in new


OWN_SOFTMAX = HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v, mask=None):
        dots = torch.matmul(q, k.transpose(-1, -2)) * 0.125
        if mask is None:
            attn = dots.softmax(dim=-1)
        else:
            dots = dots.masked_fill(mask == 0, -1e9)
            attn = dots.softmax(dim=-1)
        return torch.matmul(attn, v)
'''


def test_under_a_guard_on_the_mask_the_kernel_takes_it_as_it_is():
    # the unmasked arm normalizes over the queries: no attention, so the original stays where the
    # mask is None, and the kernel (on the other branch) needs no test of it
    source = OWN_SOFTMAX.replace("        if mask is None:\n            attn = dots.softmax(dim=-1)\n",
                                 "        if mask is None:\n            attn = dots.softmax(dim=-2)\n")
    found, new = statuses(source)
    assert [status for status, _ in found] == ["guarded"]
    assert "if mask is None else" not in new
    assert "attn_mask=~(mask == 0) | (mask == 0).all(-1, keepdim=True)" in new


@pytest.mark.parametrize("given", [True, False], ids=["masked", "no-mask"])
def test_a_softmax_on_each_arm_is_one_kernel_call(given):
    # the arms differ only in the fill: one kernel call after the merge takes the mask where it is set
    new = rewrite(OWN_SOFTMAX)
    assert new.count("scaled_dot_product_attention(") == 1 and "softmax" not in new
    assert "attn_mask=None if mask is None else ~(mask == 0) | (mask == 0).all(-1, keepdim=True)" in " ".join(new.split())
    mask = _keep()[:, None, None, :].long() if given else None
    before, before_grads = _run(OWN_SOFTMAX, mask, training=False)
    after, after_grads = _run(new, mask, training=False)
    torch.testing.assert_close(after, before)
    for a, b in zip(after_grads, before_grads, strict=True):
        torch.testing.assert_close(a, b)
