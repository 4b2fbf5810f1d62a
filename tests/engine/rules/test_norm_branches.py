"""A norm whose statistics are computed before an `if` and whose end differs per branch (funasr's
GlobalLayerNorm: the weight and bias under `if self.elementwise_affine:`, the plain normalization in
the `else`): both branches are rewritten together and the statistics go once nothing reads them.
Under `if x.dim() == 3:` the input has three axes, so statistics over (1, 2) are its trailing axes:
the kernel normalizes `x` as it is, over `x.shape[1:]`. Each rewrite is compared with the original in
float64, forward and gradients; near-misses, where a branch reads the statistics otherwise or its
own end is no norm, must not fire."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

GLOBAL = """
import torch
from torch import nn


class GlobalLayerNorm(nn.Module):
    def __init__(self, dim, shape, eps=1e-8, elementwise_affine=True):
        super().__init__()
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if self.elementwise_affine:
            if shape == 3:
                self.weight = nn.Parameter(torch.rand(dim, 1, dtype=torch.float64) + 0.5)
                self.bias = nn.Parameter(torch.randn(dim, 1, dtype=torch.float64))
            if shape == 4:
                self.weight = nn.Parameter(torch.rand(dim, 1, 1, dtype=torch.float64) + 0.5)
                self.bias = nn.Parameter(torch.randn(dim, 1, 1, dtype=torch.float64))

    def forward(self, x):
        if x.dim() == 3:
            mean = torch.mean(x, (1, 2), keepdim=True)
            var = torch.mean((x - mean) ** 2, (1, 2), keepdim=True)
            if self.elementwise_affine:
                x = self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias
            else:
                x = (x - mean) / torch.sqrt(var + self.eps)
        if x.dim() == 4:
            mean = torch.mean(x, (1, 2, 3), keepdim=True)
            var = torch.mean((x - mean) ** 2, (1, 2, 3), keepdim=True)
            if self.elementwise_affine:
                x = self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias
            else:
                x = (x - mean) / torch.sqrt(var + self.eps)
        return x
"""


def _run(source: str, shape: tuple[int, ...], affine: bool):
    torch.manual_seed(0)
    module = namespace(source)["GlobalLayerNorm"](6, len(shape), elementwise_affine=affine)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    out = module(x)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    grads = torch.autograd.grad((out * weights).sum(), (x, *module.parameters()))
    return out.detach(), grads


@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", [(2, 6, 5), (2, 6, 3, 4)], ids=["3-D", "4-D"])
def test_both_branches_are_rewritten_and_the_statistics_go(shape, affine):
    findings, new = scan(GLOBAL, "layer-norm")
    assert [(f.status, f.line) for f in findings] == [("rewritten", 21), ("rewritten", 28)], [
        (f.status, f.line, f.reason) for f in findings]
    assert "torch.mean(" not in new and "mean" not in new.split("def forward")[1], new
    assert new.count("nn.functional.layer_norm(x, x.shape[1:], eps=self.eps) * self.weight") == 2, new
    assert new.count("x = nn.functional.layer_norm(x, x.shape[1:], eps=self.eps)\n") == 2, new
    (want, want_grads), (got, got_grads) = (_run(text, shape, affine) for text in (GLOBAL, new))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_axes_that_are_not_the_trailing_ones_of_the_tested_rank_are_moved():
    """Under `if x.dim() == 4:` the axes (1, 2) are not the trailing ones: moved last and back."""
    source = GLOBAL.replace("(1, 2, 3), keepdim", "(1, 2), keepdim")
    findings, new = scan(source, "layer-norm")
    assert [f.status for f in findings] == ["rewritten", "rewritten"], [(f.status, f.reason) for f in findings]
    assert new.count("x.movedim((1, 2), (-2, -1))") == 2 and new.count("x.shape[1:]") == 2, new
    for affine in (True, False):
        (want, want_grads), (got, got_grads) = (_run(text, (2, 6, 3, 4), affine) for text in (source, new))
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        for a, b in zip(got_grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


NEAR_MISSES = {
    # the other branch reads the statistics for something that is no norm
    "the plain branch only centres": (
        "x = (x - mean) / torch.sqrt(var + self.eps)\n        if x.dim() == 4:",
        "x = x - mean\n        if x.dim() == 4:",
    ),
    # ... or its end is another function (eps outside the root)
    "eps outside the root on the plain branch": (
        "x = (x - mean) / torch.sqrt(var + self.eps)\n        if x.dim() == 4:",
        "x = (x - mean) / (torch.sqrt(var) + self.eps)\n        if x.dim() == 4:",
    ),
    # the statistics are read after the `if` too
    "the mean kept": (
        "x = (x - mean) / torch.sqrt(var + self.eps)\n        if x.dim() == 4:",
        "x = (x - mean) / torch.sqrt(var + self.eps)\n            self.last_mean = mean\n        if x.dim() == 4:",
    ),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_a_branch_that_reads_the_statistics_otherwise_stops_both(case):
    old, new_text = NEAR_MISSES[case]
    assert GLOBAL.count(old) == 1
    source = GLOBAL.replace(old, new_text)
    findings, new = scan(source, "layer-norm")
    first = [f for f in findings if f.line == 21]
    assert first and all(f.status == "near-miss" for f in first), [(f.status, f.line, f.reason) for f in findings]
    assert "x = self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias\n            else:" in new, new
    assert "torch.mean(x, (1, 2), keepdim=True)" in new, new
