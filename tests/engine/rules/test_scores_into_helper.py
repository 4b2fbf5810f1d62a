"""Attention whose scores the caller makes and hands to a helper that ends it (funasr's
`scores = matmul(q, k^T) / sqrt(d_k)` then `self.forward_attention(v, scores, mask)`; a module-level
`attend(scores, v)` the same). The helper's parameters are bound to the caller's arguments, the match
runs through the call, and the rewrite is written at the call: the scores' statements go, the call
becomes the kernel call with what the helper does to its result after the product (transposes, the
output projection) restated around it. The helper stays, for its other callers (it cannot take the
kernel itself: it is handed the scores, never q and k). Original and rewritten are compared in
float64, forward and backward, in eval and train mode (dropout 0), with and without masks."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

METHOD = """
import math
import torch
import torch.nn as nn


class Attn(nn.Module):
    def __init__(self, n_head, d, p=0.0):
        super().__init__()
        self.h = n_head
        self.d_k = d // n_head
        self.qkv = nn.Linear(d, 3 * d)
        self.linear_out = nn.Linear(d, d)
        self.dropout = nn.Dropout(p)

    def forward(self, x, mask=None):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        return self.forward_attention(v, scores, mask)

    def forward_attention(self, value, scores, mask):
        n_batch = value.size(0)
        if mask is not None:
            scores = scores + mask
        attn = torch.softmax(scores, dim=-1)
        p_attn = self.dropout(attn)
        x = torch.matmul(p_attn, value)
        x = x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k)
        return self.linear_out(x)
"""

FUNCTION = """
import torch
import torch.nn as nn
import torch.nn.functional as F


def _attend(scores, value, dropout, training):
    probs = F.dropout(F.softmax(scores, dim=-1), dropout, training=training)
    return torch.matmul(probs, value)


class Attn(nn.Module):
    def __init__(self, n_head, d, p=0.0):
        super().__init__()
        self.h = n_head
        self.d_k = d // n_head
        self.p = p
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4)
        q = q * self.d_k ** -0.5
        scores = q @ k.transpose(-2, -1)
        out = _attend(scores, v, self.p, self.training)
        return self.out(out.transpose(1, 2).reshape(b, t, -1))
"""


def _compare(original: str, rewritten: str, mask: bool) -> None:
    a_ns, b_ns = namespace(original), namespace(rewritten)
    for training in (False, True):
        torch.manual_seed(0)
        a = a_ns["Attn"](4, 16).double().train(training)
        b = b_ns["Attn"](4, 16).double().train(training)
        b.load_state_dict(a.state_dict())
        x = torch.randn(3, 7, 16, dtype=torch.float64)
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        args = ()
        if mask:
            m = torch.zeros(3, 1, 7, 7, dtype=torch.float64)
            m[0, :, :, 4:] = float("-inf")  # padded keys of the first sample
            m[1] = torch.randn(1, 7, 7, dtype=torch.float64)  # an additive bias
            args = (m,)
        out_a, out_b = a(xa, *args), b(xb, *args)
        torch.testing.assert_close(out_b, out_a, rtol=1e-10, atol=1e-12)
        weight = torch.randn(out_a.shape, dtype=torch.float64)
        (out_a * weight).sum().backward()
        (out_b * weight).sum().backward()
        torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-10, atol=1e-12)
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-10, atol=1e-12)


def test_a_method_handed_the_scores_is_written_at_its_call():
    new = rewrite(METHOD)
    forward = new.split("def forward(", 1)[1].split("def forward_attention", 1)[0]
    assert "scaled_dot_product_attention(" in forward
    assert "scores" not in forward  # the caller's scores are gone with the call
    assert "self.linear_out(" in forward and ".view(n_batch, -1, self.h * self.d_k)" in forward
    # the helper stays as written, for any other caller
    assert new.split("def forward_attention", 1)[1] == METHOD.split("def forward_attention", 1)[1]
    assert statuses(new)[1] == new  # idempotent
    _compare(METHOD, new, mask=False)
    _compare(METHOD, new, mask=True)


def test_a_module_function_handed_the_scores_is_written_at_its_call():
    new = rewrite(FUNCTION)
    forward = new.split("def forward(", 1)[1]
    assert "_attend(" not in forward and "scaled_dot_product_attention(" in forward
    assert "def _attend(scores, value, dropout, training):" in new
    _compare(FUNCTION, new, mask=False)


def test_a_helper_that_stores_the_probabilities_is_not_rewritten():
    source = METHOD.replace("        p_attn = self.dropout(attn)\n",
                            "        self.attn = attn\n        p_attn = self.dropout(attn)\n")
    found, new = statuses(source)
    assert new == source
    assert found and all(status == "near-miss" for status, _ in found), found


def test_a_helper_that_changes_shared_state_is_not_rewritten():
    source = METHOD.replace("        n_batch = value.size(0)\n",
                            "        n_batch = value.size(0)\n        self.calls += 1\n")
    found, new = statuses(source)
    assert new == source
    assert found and all(status == "near-miss" for status, _ in found), found


def test_a_helper_returning_the_probabilities_to_a_caller_that_reads_them_is_not_rewritten():
    source = METHOD.replace("        return self.linear_out(x)\n", "        return self.linear_out(x), attn\n") \
        .replace("        return self.forward_attention(v, scores, mask)\n",
                 "        out, attn = self.forward_attention(v, scores, mask)\n        return out, attn.mean(1)\n")
    found, new = statuses(source)
    assert new == source
    assert found and all(status == "near-miss" for status, _ in found), found


# The helper's statements after the product are repeated as statements in the caller, so a value
# read twice is read by its name (one expression would compute the kernel twice).
TWICE = METHOD.replace("        return self.linear_out(x)\n", "        return self.linear_out(x) + x\n")


def test_a_helper_reading_its_result_twice_is_written_as_its_statements():
    new = rewrite(TWICE)
    forward = new.split("def forward(", 1)[1].split("def forward_attention", 1)[0]
    assert forward.count("scaled_dot_product_attention(") == 1
    assert "        x = x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k)\n" in forward
    assert "        return self.linear_out(x) + x\n" in forward
    _compare(TWICE, new, mask=True)


def test_a_name_the_caller_reads_later_is_not_taken_by_the_helpers_statements():
    # the caller reads its own `x` after the call: the helper's `x = ...` cannot be repeated there,
    # and one expression would read the kernel's result twice
    source = TWICE.replace("        return self.forward_attention(v, scores, mask)\n",
                           "        out = self.forward_attention(v, scores, mask)\n        return out + x.sum()\n")
    found, new = statuses(source)
    assert new == source
    assert found and all(status == "near-miss" for status, _ in found), found
    assert any("more than once" in reason for _, reason in found), found


# The helper returns the probabilities too only under a flag of its own (funasr's `ret_attn`): a call
# passing the caller's runtime flag is rewritten under a guard on it; a call leaving the default
# False needs none (the early return is never taken there).
FLAGGED = METHOD.replace("    def forward_attention(self, value, scores, mask):\n",
                         "    def forward_attention(self, value, scores, mask, ret_attn=False):\n") \
    .replace("        return self.linear_out(x)\n",
             "        if ret_attn:\n            return self.linear_out(x), attn\n        return self.linear_out(x)\n")


def test_a_runtime_flag_for_the_probabilities_guards_the_call():
    source = FLAGGED.replace("    def forward(self, x, mask=None):\n", "    def forward(self, x, mask=None, ret_attn=False):\n") \
        .replace("return self.forward_attention(v, scores, mask)", "return self.forward_attention(v, scores, mask, ret_attn)")
    new = rewrite(source)
    forward = new.split("def forward(", 1)[1].split("def forward_attention", 1)[0]
    assert "if ret_attn:" in forward and "scaled_dot_product_attention(" in forward
    _compare(source, new, mask=True)
    a_ns, b_ns = namespace(source), namespace(new)
    torch.manual_seed(0)
    a, b = a_ns["Attn"](4, 16).double().eval(), b_ns["Attn"](4, 16).double().eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    (out_a, attn_a), (out_b, attn_b) = a(x, None, True), b(x, None, True)
    torch.testing.assert_close(out_b, out_a)
    torch.testing.assert_close(attn_b, attn_a)


def test_the_default_flag_needs_no_guard():
    new = rewrite(FLAGGED)
    forward = new.split("def forward(", 1)[1].split("def forward_attention", 1)[0]
    assert "scaled_dot_product_attention(" in forward and "if ret_attn" not in forward and "else:" not in forward
    _compare(FLAGGED, new, mask=True)
