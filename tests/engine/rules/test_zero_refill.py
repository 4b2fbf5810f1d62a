"""The probabilities filled with 0 after the softmax under the fill's own mask (funasr's
`softmax(s.masked_fill(mask, -inf)).masked_fill(mask, 0.0)`, before the dropout; speechbrain's after
it) are the exact fix-up of the rows whose every key is masked: a masked key's probability is already
0 in a row that keeps one, and a row that keeps none (NaN under a -inf fill, the average of v under a
finite one) becomes 0. The kernel then runs those rows unmasked and its result is filled with 0 there.

Where the fill is made only when the mask is given and each branch has its own softmax (`if mask is
not None: ...; attn = softmax(s).masked_fill(mask, 0.0)` `else: attn = softmax(s)`), one kernel call
after the merge takes the mask where it is set, and the rows' fix-up is a statement under the same
test (`if mask is not None: out = out.masked_fill(...)`); in funasr's layout, where a helper is handed
the scores, the helper's statements choosing the mask are restated at its call. Compared against the
original in float64, forward and backward, with a fully padded sample, with and without the mask."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import math
import torch
import torch.nn as nn
"""

# the re-fill before the dropout, the mask given on every call
BEFORE_DROPOUT = HEADER + '''
class Attention(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, q, k, v, mask):
        attn = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).masked_fill(mask, float("-inf"))
        attn = torch.softmax(attn, dim=-1).masked_fill(mask, 0.0)
        attn = self.dropout(attn)
        return attn @ v
'''

# each branch its own softmax; the fill and its re-fill only where the mask is given
BRANCHES = HEADER + '''
class Attention(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.dropout = nn.Dropout(p)

    def forward(self, q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        if mask is not None:
            mask = mask.unsqueeze(1).eq(0)
            min_value = -float("inf")
            scores = scores.masked_fill(mask, min_value)
            attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)
        out = self.dropout(attn) @ v
        return out.transpose(1, 2)
'''

# funasr's SANM: the caller makes the scores, the helper chooses the mask (an optional chunk mask
# multiplied in), fills, re-fills and goes on to the output projection
HELPER = HEADER + '''
class Attention(nn.Module):
    def __init__(self, n_head=2, d=8, p=0.0):
        super().__init__()
        self.h = n_head
        self.d_k = d // n_head
        self.linear_out = nn.Linear(d, d)
        self.dropout = nn.Dropout(p=p)

    def forward_attention(self, value, scores, mask, mask_att_chunk_encoder=None):
        n_batch = value.size(0)
        if mask is not None:
            if mask_att_chunk_encoder is not None:
                mask = mask * mask_att_chunk_encoder

            mask = mask.unsqueeze(1).eq(0)  # (batch, 1, *, time2)

            min_value = -float("inf")
            scores = scores.masked_fill(mask, min_value)
            attn = torch.softmax(scores, dim=-1).masked_fill(mask, 0.0)
        else:
            attn = torch.softmax(scores, dim=-1)

        p_attn = self.dropout(attn)
        x = torch.matmul(p_attn, value)
        x = x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k)
        return self.linear_out(x)

    def forward(self, q, k, v, mask, mask_att_chunk_encoder=None):
        q = q * self.d_k ** (-0.5)
        scores = torch.matmul(q, k.transpose(-2, -1))
        att_outs = self.forward_attention(v, scores, mask, mask_att_chunk_encoder)
        return att_outs

    def forward_chunk(self, q, k, v):
        q = q * self.d_k ** (-0.5)
        scores = torch.matmul(q, k.transpose(-2, -1))
        return self.forward_attention(v, scores, None), k
'''


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, 2, 5, 4, dtype=torch.float64, generator=g) for _ in range(3)]


def _keep():
    """funasr's mask: 1 where a key is kept, (batch, 1, keys); the second sample fully padded."""
    keep = torch.ones(3, 1, 5, dtype=torch.long)
    keep[0, :, 3:] = 0
    keep[1] = 0
    return keep


def _run(module, *args, method="forward"):
    q, k, v = (t.clone().requires_grad_() for t in _inputs())
    out = getattr(module, method)(q, k, v, *args)
    first = out[0] if isinstance(out, tuple) else out
    weight = torch.randn(first.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (first * weight).sum().backward()
    return first, [t.grad for t in (q, k, v)] + [p.grad for p in module.parameters()]


def _compare(original: str, rewritten: str, *args, method="forward", training=False):
    torch.manual_seed(0)
    a = namespace(original)["Attention"]().double().train(training)
    b = namespace(rewritten)["Attention"]().double().train(training)
    b.load_state_dict(a.state_dict())
    out_a, grads_a = _run(a, *args, method=method)
    out_b, grads_b = _run(b, *args, method=method)
    assert torch.isfinite(out_a).all()  # the re-fill makes the fully padded sample's rows 0
    torch.testing.assert_close(out_b, out_a, rtol=1e-10, atol=1e-12)
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-12)


def test_a_refill_before_the_dropout_is_the_rows_fix_up():
    new = rewrite(BEFORE_DROPOUT)
    assert new.count("scaled_dot_product_attention(") == 1
    assert "attn_mask=~mask | mask.all(-1, keepdim=True)" in new
    assert ".masked_fill(mask.all(-1, keepdim=True), 0.0)" in new
    assert "q.masked_fill" not in new  # the rows' output is set: their queries need not be zeroed
    mask = _keep().unsqueeze(1).eq(0).expand(3, 1, 5, 5)
    for training in (False, True):  # dropout p=0 in training: the same path, comparable
        _compare(BEFORE_DROPOUT, new, mask, training=training)


@pytest.mark.parametrize("given", [True, False], ids=["masked", "no-mask"])
def test_one_kernel_call_for_both_branches_with_the_fix_up_under_the_test(given):
    new = rewrite(BRANCHES)
    assert new.count("scaled_dot_product_attention(") == 1 and "softmax" not in new
    assert "attn_mask=None if mask is None else ~mask | mask.all(-1, keepdim=True)" in new
    assert "        if mask is not None:\n            out = out.masked_fill(mask.all(-1, keepdim=True), 0.0)\n" in new
    assert "min_value" not in new  # the fill's value goes with the fill
    assert statuses(new)[1] == new  # idempotent
    _compare(BRANCHES, new, _keep() if given else None)


@pytest.mark.parametrize("chunk", [False, True], ids=["no-chunk", "chunk"])
@pytest.mark.parametrize("given", [True, False], ids=["masked", "no-mask"])
def test_the_helpers_mask_is_restated_at_its_call(given, chunk):
    new = rewrite(HELPER)
    forward = new.split("    def forward(", 1)[1].split("    def forward_chunk", 1)[0]
    assert forward.count("scaled_dot_product_attention(") == 1
    assert ("        if mask is not None:\n"
            "            if mask_att_chunk_encoder is not None:\n"
            "                mask = mask * mask_att_chunk_encoder\n"
            "            mask = mask.unsqueeze(1).eq(0)\n") in forward
    assert "min_value" not in forward and "softmax" not in forward
    assert "        if mask is not None:\n            x = x.masked_fill(mask.all(-1, keepdim=True), 0.0)\n" in forward
    chunk_mask = torch.tril(torch.ones(5, 5, dtype=torch.long)) if chunk else None
    _compare(HELPER, new, _keep() if given else None, chunk_mask)


def test_a_none_passed_for_the_mask_takes_the_unmasked_path_only():
    # `self.forward_attention(v, scores, None)`: the helper's masked branch is never taken there
    new = rewrite(HELPER)
    chunk = new.split("    def forward_chunk", 1)[1]
    assert "scaled_dot_product_attention(" in chunk
    assert "None." not in chunk and "attn_mask" not in chunk and "masked_fill" not in chunk
    _compare(HELPER, new, method="forward_chunk")


def test_a_refill_under_another_mask_is_no_rewrite():
    # rows masked by `mask` but zeroed under `pad`: not the fix-up of the rows the fill empties
    source = BEFORE_DROPOUT.replace("def forward(self, q, k, v, mask):", "def forward(self, q, k, v, mask, pad):") \
        .replace(".masked_fill(mask, 0.0)", ".masked_fill(pad, 0.0)")
    found, new = statuses(source)
    assert new == source
    assert all(status == "near-miss" for status, _ in found), found


def test_a_nonzero_refill_is_no_rewrite():
    source = BEFORE_DROPOUT.replace(".masked_fill(mask, 0.0)", ".masked_fill(mask, 1e-9)")
    found, new = statuses(source)
    assert new == source
    assert found and all(status == "near-miss" for status, _ in found), found


def test_a_result_returned_directly_keeps_the_original_without_the_mask():
    # no name holds the kernel's result: the fix-up under `if mask is not None:` has no statement to
    # go in, so the kernel runs where the mask is given and the original stays where it is None
    source = BRANCHES.replace("        out = self.dropout(attn) @ v\n        return out.transpose(1, 2)\n",
                              "        return (self.dropout(attn) @ v).transpose(1, 2)\n")
    found, new = statuses(source)
    assert [status for status, _ in found] == ["guarded"], found
    for given in (True, False):
        _compare(source, new, _keep() if given else None)
