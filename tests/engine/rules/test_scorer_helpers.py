"""Attention whose scores come from a scorer helper (`scores = self._score(q, k)`, returning
`a.matmul(b.transpose(-1, -2)) / math.sqrt(a.size(-1))`), the rest in the caller.

The extractor inlines the helper, so the match spans the helper's product and scale and the
caller's mask, softmax, dropout and product with the value; the rewrite is written in the caller.
The scale is a number written in the helper, in the helper's names (`a` is its parameter): the
kernel's `scale=` restates it in the caller's (`1 / math.sqrt(q.size(-1))`), and where it reads a
local of the helper that the caller does not hold, the match stays a near-miss (it used to be
rewritten with the helper's names, unbound in the caller or, worse, bound there to other values).
Original and rewritten run against each other in float64 with a padding mask that masks every key
of a row, eval and train."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SCORER = """
import math
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.dropout = nn.Dropout(p)

    def _score(self, a, b):
        return a.matmul(b.transpose(-1, -2)) / math.sqrt(a.size(-1))

    def forward(self, q, k, v, mask):
        a = v.sum()  # the caller's own `a`: the kernel's scale must not read it
        scores = self._score(q, k)
        scores = scores.masked_fill(mask, -1e9)
        probs = torch.nn.Softmax(dim=-1)(scores)
        probs = self.dropout(probs)
        return torch.matmul(probs, v), a
"""


def _rewrite(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f for f in findings if f.rule_id == "sdpa-attention"], new


def test_the_scale_written_in_the_scorer_is_restated_in_the_callers_names():
    findings, new = _rewrite(SCORER)
    assert [f.status for f in findings] == ["rewritten"]
    kernel = " ".join(new.split("scaled_dot_product_attention", 1)[1].split())
    assert "scale=1 / math.sqrt(q.size(-1))" in kernel and "a.size" not in kernel
    assert _rewrite(new)[1] == new


def test_rewritten_equals_original_with_fully_masked_rows_eval_and_train():
    _, new = _rewrite(SCORER)
    original, rewritten = {}, {}
    exec(compile(SCORER, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    torch.manual_seed(0)
    b, h, n, m, d = 2, 3, 5, 7, 8
    q, k, v = (torch.randn(b, h, length, d, dtype=torch.float64) for length in (n, m, m))
    mask = torch.rand(b, 1, n, m) < 0.3
    mask[0, :, 1] = True  # a query row whose every key is masked: the original averages v there
    mask[1] = True  # a fully masked sample
    for mode in (False, True):  # dropout 0: training changes only the kernel's dropout_p
        a, r = original["Attention"]().train(mode), rewritten["Attention"]().train(mode)
        qa, qb = q.clone().requires_grad_(), q.clone().requires_grad_()
        out_a, extra_a = a(qa, k, v, mask)
        out_b, extra_b = r(qb, k, v, mask)
        torch.testing.assert_close(out_b, out_a, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(extra_b, extra_a)
        weight = torch.randn(out_a.shape, dtype=torch.float64)
        (out_a * weight).sum().backward()
        (out_b * weight).sum().backward()
        torch.testing.assert_close(qb.grad, qa.grad, rtol=1e-10, atol=1e-12)


LOCAL_SCALE = SCORER.replace(
    "        return a.matmul(b.transpose(-1, -2)) / math.sqrt(a.size(-1))\n",
    "        d = a.size(-1)\n        return a.matmul(b.transpose(-1, -2)) / math.sqrt(d)\n",
)


def test_a_scale_reading_a_local_of_the_scorer_is_a_near_miss():
    findings, new = _rewrite(LOCAL_SCALE)
    assert [f.status for f in findings] == ["near-miss"]
    assert "local variables" in findings[0].reason and new == LOCAL_SCALE


def test_a_local_of_the_scorer_named_like_a_variable_of_the_caller_is_restated_as_its_value():
    source = LOCAL_SCALE.replace("a = v.sum()", "d = v.sum()").replace("probs, v), a", "probs, v), d")
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    assert "scale=1 / math.sqrt(q.size(-1))" in " ".join(
        new.split("scaled_dot_product_attention", 1)[1].split()
    )


def test_a_scorer_softmax_over_the_query_axis_is_a_near_miss():
    findings, _ = _rewrite(SCORER.replace("Softmax(dim=-1)", "Softmax(dim=-2)"))
    assert [f.status for f in findings] == ["near-miss"] and "not provably the key axis" in findings[0].reason


def test_an_additive_scorer_is_no_attention_product():
    source = SCORER.replace(
        "return a.matmul(b.transpose(-1, -2)) / math.sqrt(a.size(-1))",
        "return torch.tanh(a.unsqueeze(-2) + b.unsqueeze(-3)).sum(-1)",
    )
    findings, new = _rewrite(source)
    assert all(f.status == "near-miss" for f in findings) and new == source


# A scorer submodule of a class of the file (allennlp's MatrixAttention spelled in one file): a
# stateless forward, reached through `super().forward` for the scaled one, is inlined like a helper.
SUBMODULES = """
import math
import torch
import torch.nn.functional as F
from torch import nn


class DotProductScorer(nn.Module):
    def forward(self, matrix_1, matrix_2):
        return matrix_1.matmul(matrix_2.transpose(-1, -2))


class ScaledDotProductScorer(DotProductScorer):
    def forward(self, matrix_1, matrix_2):
        return super().forward(matrix_1, matrix_2) / math.sqrt(matrix_1.size(-1))


class CosineScorer(nn.Module):
    def forward(self, a, b):
        return F.normalize(a, dim=-1).matmul(F.normalize(b, dim=-1).transpose(-1, -2))


class BilinearScorer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d, d))

    def forward(self, a, b):
        return a.matmul(self.weight).matmul(b.transpose(-1, -2))


class Attention(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.attn = SCORER()
        self.dropout = nn.Dropout(p)

    def forward(self, q, k, v, mask):
        scores = self.attn(q, k)
        scores = scores.masked_fill(mask, -1e9)
        probs = torch.nn.Softmax(dim=-1)(scores)
        return torch.matmul(self.dropout(probs), v)
"""

KERNEL_ARGS = {
    "DotProductScorer": "q, k, v,",
    "ScaledDotProductScorer": "q, k, v,",
    "CosineScorer": "F.normalize(q, dim=-1), F.normalize(k, dim=-1), v,",
}
SCALES = {
    "DotProductScorer": "scale=1.0",
    "ScaledDotProductScorer": "scale=1 / math.sqrt(q.size(-1))",
    "CosineScorer": "scale=1.0",
}


@pytest.mark.parametrize("scorer", sorted(KERNEL_ARGS))
def test_a_stateless_scorer_submodule_is_inlined_and_rewritten(scorer):
    source = SUBMODULES.replace("SCORER()", f"{scorer}()")
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    kernel = " ".join(new.split("def forward(self, q, k, v, mask):", 1)[1].split())
    assert SCALES[scorer] in kernel and "matrix_1" not in kernel
    assert KERNEL_ARGS[scorer].split(",")[0] in kernel
    assert _rewrite(new)[1] == new
    original, rewritten = {}, {}
    exec(compile(source, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    torch.manual_seed(0)
    b, h, n, m, d = 2, 3, 5, 7, 8
    q, k, v = (torch.randn(b, h, length, d, dtype=torch.float64) for length in (n, m, m))
    mask = torch.rand(b, 1, n, m) < 0.3
    mask[0, :, 1] = True  # a query row whose every key is masked
    mask[1] = True  # a fully masked sample
    for mode in (False, True):
        a, r = original["Attention"]().train(mode), rewritten["Attention"]().train(mode)
        qa, qb = q.clone().requires_grad_(), q.clone().requires_grad_()
        out_a, out_b = a(qa, k, v, mask), r(qb, k, v, mask)
        torch.testing.assert_close(out_b, out_a, rtol=1e-10, atol=1e-12)
        weight = torch.randn(out_a.shape, dtype=torch.float64)
        (out_a * weight).sum().backward()
        (out_b * weight).sum().backward()
        torch.testing.assert_close(qb.grad, qa.grad, rtol=1e-10, atol=1e-12)


def test_a_scorer_reading_its_own_state_is_not_inlined():
    source = SUBMODULES.replace("SCORER()", "BilinearScorer()")
    findings, new = _rewrite(source)
    assert not any(f.status in ("rewritten", "guarded") for f in findings) and new == source


@pytest.mark.parametrize(
    "change",
    [
        # built under a condition: which scorer runs is not known
        ("        self.attn = SCORER()\n", "        if p > 0:\n            self.attn = DotProductScorer()\n"),
        # replaced by another method
        (
            "    def forward(self, q, k, v, mask):\n",
            "    def cosine(self):\n        self.attn = CosineScorer()\n\n"
            "    def forward(self, q, k, v, mask):\n",
        ),
        # its call is its own __call__, not its forward
        (
            "class DotProductScorer(nn.Module):\n",
            "class DotProductScorer(nn.Module):\n    def __call__(self, a, b):\n        return a\n\n",
        ),
        # a base of another module may define what the call runs
        ("class DotProductScorer(nn.Module):\n", "class DotProductScorer(nn.Identity):\n"),
    ],
)
def test_a_scorer_that_may_be_another_is_not_inlined(change):
    assert change[0] in SUBMODULES
    source = SUBMODULES.replace(*change).replace("SCORER()", "DotProductScorer()")
    findings, new = _rewrite(source)
    assert not any(f.status in ("rewritten", "guarded") for f in findings) and new == source


def test_a_scorer_submodule_softmax_over_the_query_axis_is_a_near_miss():
    source = SUBMODULES.replace("SCORER()", "ScaledDotProductScorer()").replace(
        "Softmax(dim=-1)", "Softmax(dim=-2)"
    )
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["near-miss"] and new == source
