"""A softmax axis held by a setting of the module (parlai's BasicAttention: `F.softmax(l1,
dim=self.dim)`, `self.dim = dim` in `__init__`) is the key axis where the setting names it: the
original is kept under `if self.dim != 2:` (the key axis of 3-D `bmm` scores; `-1` where the scores'
rank is unproven) and the kernel runs otherwise. An attribute `__init__` computes from something
that is not one of its parameters or an integer, or one written again elsewhere, is no setting: the
match stays a near-miss. A fill that a helper of the file chooses by dtype (parlai's `neginf(dtype)`:
`-65504` for float16, `-1e20` otherwise) is each of its values: finite on every path, so the
rewrite keeps rows whose every key is masked as the original computes them, and the helper's test
of the dtype goes with the call; a helper returning -inf for one dtype and a finite value for
another is a near-miss. Original and rewritten code are compared in float64 with the setting on
each side of the guard, rows whose every key is masked included.
"""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import rewrite as _rewrite
from tests.engine.rules.harness import scan as _scan

BASIC = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


def neginf(dtype):
    if dtype is torch.float16:
        return -65504
    else:
        return -1e20


class Attention(nn.Module):
    def __init__(self, dim: int = 2, get_weights: bool = False):
        super().__init__()
        self.dim = dim
        self.get_weights = get_weights

    def forward(self, xs, ys, mask_ys):
        l1 = torch.bmm(xs, ys.transpose(1, 2))
        l1.masked_fill_(mask_ys, neginf(l1.dtype))
        l2 = F.softmax(l1, dim=self.dim, dtype=torch.float).type_as(l1)
        out = torch.bmm(l2, ys)
        if self.get_weights:
            return out, l2
        return out
'''

# scores of unproven rank: the key axis is named -1
MATMUL = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.125
        return torch.matmul(s.softmax(dim=self.dim), v)
'''


def test_setting_axis_is_guarded_by_its_value():
    findings, new = _scan(BASIC)
    assert [f.status for f in findings] == ["guarded"], [(f.status, f.reason) for f in findings]
    assert findings[0].guard_text == "self.dim != 2 or self.get_weights"
    assert "if self.dim != 2 or self.get_weights:" in new and "scaled_dot_product_attention" in new, new


def test_the_helper_fill_goes_with_its_statement():
    new = _rewrite(BASIC)
    kernel = new[new.rindex("else:"):]
    assert "neginf" not in kernel and "mask_ys.all(-1, keepdim=True)" in kernel, new
    assert "def neginf(dtype):" in new and "if dtype is torch.float16:" in new, new  # the helper stays


def test_a_helper_fill_infinite_for_one_dtype_stays():
    source = BASIC.replace("return -1e20", "return float('-inf')")
    findings, new = _scan(source)
    assert new == source, new
    assert any("`neginf(...)` is -inf on some paths of the helper" in (f.reason or "") for f in findings), \
        [(f.status, f.reason) for f in findings]


def test_a_helper_fill_reading_the_scores_values_stays():
    source = BASIC.replace("def neginf(dtype):\n    if dtype is torch.float16:",
                           "def neginf(t):\n    if t.max() > 0:").replace("neginf(l1.dtype)", "neginf(l1)")
    findings, new = _scan(source)
    assert new == source, new


def test_setting_axis_of_unproven_rank_is_tested_as_the_last():
    new = _rewrite(MATMUL)
    assert "if self.dim != -1:" in new, new


@pytest.mark.parametrize("init", [
    "self.dim = len(shape) - 1",  # computed from something that is not an integer
    "self.dim = shape.dim",  # an attribute of an argument
])
def test_an_attribute_that_is_no_setting_stays(init):
    source = MATMUL.replace("def __init__(self, dim=-1):", "def __init__(self, shape):") \
        .replace("self.dim = dim", init)
    findings, new = _scan(source)
    assert new == source, new
    assert any(f.status == "near-miss" and "does not set `self.dim` from one of its parameters" in (f.reason or "")
               for f in findings), [(f.status, f.reason) for f in findings]


@pytest.mark.parametrize("extra", [
    "    def reset(self, dim):\n        self.dim = dim\n",  # written again by another method
    "    def reset(self):\n        self.dim += 1\n",
])
def test_a_setting_written_elsewhere_stays(extra):
    source = MATMUL + "\n" + extra
    findings, new = _scan(source)
    assert new == source, new
    assert any(f.status == "near-miss" for f in findings), [(f.status, f.reason) for f in findings]


def test_a_rebound_parameter_is_no_setting():
    source = MATMUL.replace("        self.dim = dim\n", "        dim = dim - 1\n        self.dim = dim\n")
    findings, new = _scan(source)
    assert new == source, new


torch = pytest.importorskip("torch")


def _module(source: str, **kwargs):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    return namespace["Attention"](**kwargs)


def _inputs():
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    ys = torch.randn(3, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(3, 5, 7, generator=gen) < 0.4
    mask[0, 1] = True  # a query row whose every key is masked
    mask[2] = True  # a fully masked sample
    return xs, ys, mask


@pytest.mark.parametrize("dim", [2, 1, -1])
def test_both_sides_of_the_guard_agree(dim):
    new = _rewrite(BASIC)
    results = []
    for text in (BASIC, new):
        xs, ys, mask = _inputs()
        out = _module(text, dim=dim)(xs, ys, mask)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
        grads = torch.autograd.grad((out * weights).sum(), (xs, ys))
        results.append((out.detach(), *grads))
    # the original's softmax runs in float32 (`dtype=torch.float`) and is cast back: float32 rounding
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{m}\n{new}")
