"""A mask written out again where it is used a second time is one value: speechbrain's
RelPosMHAXL fills the scores under `key_padding_mask.view(bsz, 1, 1, klen)` and re-fills the
probabilities with 0 under `key_padding_mask.view(bsz, 1, 1, klen)` computed anew, which is the exact
fix-up of the fully padded rows (so the fill attribute, -inf or -65000 by the parameters' dtype, gives
the same result either way). The same deterministic step of the same values binds one variable; a
step of another value does not. A key stored (..., d, n) by a permute of every axis is passed with
the swap taken into that permute. Compared against the original in float64, forward and backward,
with a fully padded sample, where the kernel runs and where the original stays."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = """
import torch
import torch.nn as nn


class RelAttention(nn.Module):
    def __init__(self, d=4, half=False):
        super().__init__()
        self.scale = d ** -0.5
        if half:
            self.attn_fill_value = -65000
        else:
            self.attn_fill_value = -float("inf")
        self.dropout_att = nn.Dropout(0.0)

    def forward(self, query, key, value, bias, key_padding_mask=None, return_attn_weights=True):
        bsz, klen = query.shape[0], key.shape[1]
        attn_score = torch.matmul(query * self.scale, key.permute(0, 2, 3, 1)) + bias
        if key_padding_mask is not None:
            attn_score = attn_score.masked_fill(key_padding_mask.view(bsz, 1, 1, klen), self.attn_fill_value)
        attn_score = attn_score.softmax(dim=-1)
        attn_score = self.dropout_att(attn_score)
        if key_padding_mask is not None:
            attn_score = attn_score.masked_fill(key_padding_mask.view(bsz, 1, 1, klen), 0.0)
        x = torch.matmul(attn_score, value.transpose(1, 2))
        if return_attn_weights:
            return x, attn_score
        return x
"""


def _inputs():
    g = torch.Generator().manual_seed(0)
    query = torch.randn(3, 2, 5, 4, dtype=torch.float64, generator=g)  # (batch, heads, time, d)
    key, value = (torch.randn(3, 5, 2, 4, dtype=torch.float64, generator=g) for _ in range(2))  # (batch, time, heads, d)
    bias = torch.randn(3, 2, 5, 5, dtype=torch.float64, generator=g)  # the relative-position term
    return query, key, value, bias


def _padding():
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True
    pad[1] = True  # a fully padded sample
    return pad


def _run(source: str, half: bool, pad, weights: bool):
    module = namespace(source)["RelAttention"](half=half).double()
    leaves = [t.clone().requires_grad_() for t in _inputs()]
    out = module(*leaves, pad, weights)
    out = out[0] if isinstance(out, tuple) else out
    weight = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (out * weight).sum().backward()
    return out, [t.grad for t in leaves]


def test_the_refill_under_the_mask_written_again_is_the_rows_fix_up():
    new = rewrite(SOURCE)
    found, _ = statuses(SOURCE)
    assert [status for status, _ in found] == ["guarded"], found
    assert "if key_padding_mask is None or return_attn_weights:" in new
    assert "key.permute(0, 2, 1, 3)," in new  # the swap taken into the permute
    assert ".masked_fill(key_padding_mask.view(bsz, 1, 1, klen).all(-1, keepdim=True), 0.0)" in new
    for half in (False, True):  # -inf or a finite fill: the re-fill makes the padded rows 0 either way
        for pad, weights in ((_padding(), False), (_padding(), True), (None, False)):
            before, before_grads = _run(SOURCE, half, pad, weights)
            after, after_grads = _run(new, half, pad, weights)
            assert torch.isfinite(before).all()
            torch.testing.assert_close(after, before, rtol=1e-10, atol=1e-12)
            for a, b in zip(after_grads, before_grads, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("refill", [
    "other_mask.view(bsz, 1, 1, klen)",  # a view of another mask
    "key_padding_mask.roll(1, -1).view(bsz, 1, 1, klen)",  # another step of the same mask
])
def test_a_refill_under_another_value_is_no_rewrite(refill):
    source = SOURCE.replace("return_attn_weights=True):", "return_attn_weights=True, other_mask=None):") \
        .replace("attn_score.masked_fill(key_padding_mask.view(bsz, 1, 1, klen), 0.0)",
                 f"attn_score.masked_fill({refill}, 0.0)")
    assert source != SOURCE
    found, new = statuses(source)
    assert new == source
    assert all(status == "near-miss" for status, _ in found), found
