"""Attention computed whole in a helper method whose result the caller assigns to one name
(`out = self.reprogramming(q, k, v)`, TimeLLM's reprogramming layer): the key and value carry no batch
axis (`(S, H, E)`, shared by every sample), which the helper's einsum specs prove, so the rewrite is
written in the helper, which forward calls (it is training code though public). Two things used to
stop the rewrite at the call, as it was written before: a call assigned to a single name was refused ("not
assigned to plain names": only tuple targets were read), and a size the helper unpacks from a shape
(`B, L, H, E = q.shape`) was taken for a value chosen by a branch. Rendering `$v` for a dtype cast
that was not needed also emitted the helper's scores and probabilities as dead statements at the
call. Original and rewritten run against each other in float64, eval and train (dropout 0)."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = """
import math
import torch
import torch.nn as nn


class Reprogramming(nn.Module):
    def __init__(self, d_model, n_heads, d_llm, p=0.0):
        super().__init__()
        d_keys = d_model // n_heads
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_llm, d_keys * n_heads)
        self.value_projection = nn.Linear(d_llm, d_keys * n_heads)
        self.n_heads = n_heads
        self.dropout = nn.Dropout(p)

    def forward(self, target, source, value):
        B, L, _ = target.shape
        S, _ = source.shape
        H = self.n_heads
        target = self.query_projection(target).view(B, L, H, -1)
        source = self.key_projection(source).view(S, H, -1)
        value = self.value_projection(value).view(S, H, -1)
        out = self.reprogramming(target, source, value)
        return out.reshape(B, L, -1)

    def reprogramming(self, target, source, value):
        B, L, H, E = target.shape
        scale = 1.0 / math.sqrt(E)
        scores = torch.einsum("blhe,she->bhls", target, source)
        A = self.dropout(torch.softmax(scale * scores, dim=-1))
        return torch.einsum("bhls,she->blhe", A, value)
"""


def _rewrite(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f for f in findings if f.rule_id == "sdpa-attention"], new


def _forward(text: str) -> str:
    return text.split("def forward", 1)[1].split("def reprogramming", 1)[0]


def _helper(text: str) -> str:
    return text.split("def reprogramming", 1)[1]


def test_a_public_helper_the_caller_calls_is_rewritten_where_it_is_written():
    """The helper is training code (forward calls it): the einsums' specs prove the key and value
    carry no batch axis, so the kernel call replaces the helper's body and the caller keeps its call
    (rewriting the inlined copy at the call instead left the helper behind unused)."""
    findings, new = _rewrite(SOURCE)
    assert [(f.status, f.method) for f in findings] == [("rewritten", "reprogramming")]
    assert "out = self.reprogramming(target, source, value)" in _forward(new)
    helper = _helper(new)
    assert "nn.functional.scaled_dot_product_attention(" in helper
    # nothing of the helper's scores or probabilities is left
    assert "einsum" not in helper and "softmax" not in helper
    assert _rewrite(new)[1] == new


@pytest.mark.parametrize("unpack", ["B, L, H, E = target.shape", "*_, E = target.shape"])
def test_rewritten_equals_original_eval_and_train(unpack):
    # a starred unpacking of the query's shape is no obstacle in the helper itself: the einsum's spec
    # proves the ranks
    source = SOURCE.replace("B, L, H, E = target.shape", unpack)
    _, new = _rewrite(source)
    assert new != source
    original, rewritten = {}, {}
    exec(compile(source, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    for mode in (False, True):
        torch.manual_seed(0)
        a = original["Reprogramming"](16, 4, 12).double().train(mode)
        r = rewritten["Reprogramming"](16, 4, 12).double().train(mode)
        r.load_state_dict(a.state_dict())
        target = torch.randn(3, 5, 16, dtype=torch.float64)
        source, value = torch.randn(7, 12, dtype=torch.float64), torch.randn(7, 12, dtype=torch.float64)
        ta, tb = target.clone().requires_grad_(), target.clone().requires_grad_()
        out_a, out_b = a(ta, source, value), r(tb, source, value)
        torch.testing.assert_close(out_b, out_a, rtol=1e-10, atol=1e-12)
        weight = torch.randn(out_a.shape, dtype=torch.float64)
        (out_a * weight).sum().backward()
        (out_b * weight).sum().backward()
        torch.testing.assert_close(tb.grad, ta.grad, rtol=1e-10, atol=1e-12)


# An in-place scale of the scores (`attn_score.mul_(self.scale)`, neuralforecast's TFT) is a new
# value where nothing else holds the tensor: read as `attn_score * self.scale`, the number folds
# into the kernel's scale like the operator's spelling.
IN_PLACE_SCALE = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attn(nn.Module):
    def __init__(self, n_head, d_head):
        super().__init__()
        self.n_head = n_head
        self.d_head = d_head
        self.scale = d_head ** -0.5

    def forward(self, q, k, v):
        bs, t, _ = q.shape
        q = q.view(bs, t, self.n_head, self.d_head)
        k = k.view(bs, t, self.n_head, self.d_head)
        v = v.view(bs, t, self.n_head, self.d_head)
        attn_score = torch.matmul(q.permute((0, 2, 1, 3)), k.permute((0, 2, 3, 1)))
        attn_score.mul_(self.scale)
        attn_prob = F.softmax(attn_score, dim=3)
        return torch.matmul(attn_prob, v.permute(0, 2, 1, 3))
"""


def test_an_in_place_scale_of_fresh_scores_is_folded_into_the_kernel():
    findings, new = _rewrite(IN_PLACE_SCALE)
    assert [f.status for f in findings] == ["rewritten"]
    assert "mul_" not in new and "scale=self.scale" in new
    original, rewritten = {}, {}
    exec(compile(IN_PLACE_SCALE, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    q, k, v = (torch.randn(2, 5, 12, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(rewritten["Attn"](3, 4)(q, k, v), original["Attn"](3, 4)(q, k, v))


def test_an_in_place_scale_of_an_aliased_tensor_stays_in_place():
    source = IN_PLACE_SCALE.replace("        attn_score.mul_(self.scale)\n",
                                    "        kept = attn_score\n        attn_score.mul_(self.scale)\n")
    findings, new = _rewrite(source)
    assert all(f.status == "near-miss" for f in findings) and new == source
