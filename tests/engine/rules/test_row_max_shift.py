"""The scores' row maximum over the key axis subtracted the other way round, `rowmax(s) - s`
(DANet's channel attention, `torch.max(energy, -1, keepdim=True)[0].expand_as(energy) - energy`):
a per-row constant plus the negated scores, so the softmax sees `-s`, and the kernel gets the query
negated (`q.neg()`). A maximum over the query axis, or one taken after a mask (the mask would be
negated too), is no such constant.

Each rewrite is run against the original in float64, forward and backward."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

CAM = """
import torch
import torch.nn.functional as F
from torch import nn


class CAM(nn.Module):
    def forward(self, x):
        batch_size, channels, height, width = x.size()
        proj_query = x.view(batch_size, channels, -1)
        proj_key = x.view(batch_size, channels, -1).permute(0, 2, 1)
        energy = torch.bmm(proj_query, proj_key)
        energy_new = {shift}
        attention = F.softmax(energy_new, dim=-1)
        proj_value = x.view(batch_size, channels, -1)
        out = torch.bmm(attention, proj_value)
        return out.view(batch_size, channels, height, width)
"""

HEADS = """
import torch
from torch import nn


class Heads(nn.Module):
    def forward(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(-2, -1))
        s = {shift}
        s = s * 0.25 + mask
        return torch.matmul(s.softmax(dim=-1), v)
"""

SHIFTS = [
    "torch.max(energy, -1, keepdim=True)[0].expand_as(energy) - energy",
    "energy.max(dim=-1, keepdim=True)[0].detach() - energy",
    "energy.amax(dim=-1, keepdim=True) - energy",
]


def _same(original: str, rewritten: str, cls: str, inputs: list) -> None:
    first, second = namespace(original)[cls](), namespace(rewritten)[cls]()
    grads = []
    outs = []
    for module in (first, second):
        args = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        out = module(*args)
        out.sum().backward()
        outs.append(out)
        grads.append([a.grad for a in args if a.requires_grad])
    torch.testing.assert_close(outs[1], outs[0])
    for a, b in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize("shift", SHIFTS)
def test_danet_channel_attention_gets_the_negated_query(shift):
    source = CAM.format(shift=shift)
    new = rewrite(source)
    assert "scaled_dot_product_attention(" in new and "proj_query.neg()" in new
    torch.manual_seed(0)
    _same(source, new, "CAM", [torch.randn(2, 5, 3, 4, dtype=torch.float64) * 3])


def test_a_shift_before_a_scale_and_a_mask_negates_the_product_only():
    source = HEADS.format(shift="s.amax(dim=-1, keepdim=True) - s")
    new = rewrite(source)
    assert "q.neg()" in new and "attn_mask=mask" in new
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.randn(2, 1, 5, 5, dtype=torch.float64)
    _same(source, new, "Heads", [q, k, v, mask])


@pytest.mark.parametrize(("shift", "reason"), [
    # the maximum over the query axis is constant along the key axis only per column
    ("torch.max(energy, 1, keepdim=True)[0].expand_as(energy) - energy", "over dim=1, not provably the key axis"),
    ("energy.amax(dim=-2, keepdim=True) - energy", "over dim=-2, not provably the key axis"),
])
def test_a_maximum_over_the_query_axis_does_not_fold(shift, reason):
    found, new = statuses(CAM.format(shift=shift))
    assert "scaled_dot_product_attention" not in new
    assert any(status == "near-miss" and reason in (why or "") for status, why in found), found


@pytest.mark.parametrize("shift", [
    "torch.max(x.view(batch_size, channels, -1), -1, keepdim=True)[0] - energy",  # another tensor's maximum
    "energy.amax(dim=-1, keepdim=True) - energy * 2",  # not the scores themselves
])
def test_another_term_subtracted_is_not_dropped(shift):
    _, new = statuses(CAM.format(shift=shift))
    assert "scaled_dot_product_attention" not in new


def test_a_maximum_taken_after_the_mask_is_not_dropped():
    """`rowmax(s + m) - (s + m)` negates the mask too: the query alone cannot carry that."""
    source = HEADS.format(shift="s").replace(
        "s = s * 0.25 + mask\n", "s = s * 0.25 + mask\n        s = s.amax(dim=-1, keepdim=True) - s\n")
    _, new = statuses(source)
    assert "scaled_dot_product_attention" not in new
