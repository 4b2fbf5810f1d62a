"""Norms recognised by facts rather than by one spelling: statistics over a tuple of axes computed at
run time that is provably the trailing len(N) axes (the kernel is told N), the variance written as
E[x^2] - E[x]^2, and a LayerNorm whose centred input an RMSNorm pattern also sees (the LayerNorm is
the rewrite). Each rewrite is run beside the original in float64, forward and gradients (the input's
and the parameters'), so any difference is a semantic one."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

# ESM1LayerNorm's spelling: the axes from the length of the normalized shape, the affine step under a flag
TRAILING_LAYER_NORM = HEADER + '''
class Norm(nn.Module):
    def __init__(self, shape, eps=1e-12, affine=True):
        super().__init__()
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.rand(shape, dtype=torch.float64) + 0.5)
            self.bias = nn.Parameter(torch.randn(shape, dtype=torch.float64))

    def forward(self, x):
        dims = {dims}
        mean = x.mean(dims, keepdim=True)
        xc = x - mean
        var = xc.pow(2).mean(dims, keepdim=True)
        x = xc / torch.sqrt(var + self.eps)
        if self.affine:
            x = self.weight * x + self.bias
        return x
'''

# timm's rms_norm: the axes as a range counting down from -1, the weight optional
TRAILING_RMS_NORM = HEADER + '''
def rms_norm(x, normalized_shape, weight=None, eps: float = 1e-5):
    norm_ndim = len(normalized_shape)
    v = x.pow(2)
    dims = tuple(range(-1, -norm_ndim - 1, -1))
    v = torch.mean(v, dim=dims, keepdim=True)
    x = x * torch.rsqrt(v + eps)
    if weight is not None:
        x = x * weight
    return x


class Norm(nn.Module):
    def __init__(self, shape, affine=True):
        super().__init__()
        self.shape = tuple(shape)
        self.weight = nn.Parameter(torch.rand(shape, dtype=torch.float64) + 0.5) if affine else None

    def forward(self, x):
        return rms_norm(x, self.shape, self.weight)
'''

# timm's _layer_norm_cf_sqm: channels first, the variance as E[x^2] - E[x]^2 clamped at 0
SQUARE_MEAN_LAYER_NORM = HEADER + '''
def layer_norm_cf(x, weight, bias, eps: float):
    u = x.mean(dim=1, keepdim=True)
    s = ((x * x).mean(dim=1, keepdim=True) - (u * u)).clamp(0)
    x = (x - u) * torch.rsqrt(s + eps)
    x = x * weight.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
    return x


class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(c, dtype=torch.float64) + 0.5)
        self.bias = nn.Parameter(torch.randn(c, dtype=torch.float64))

    def forward(self, x):
        return layer_norm_cf(x, self.weight, self.bias, 1e-6)
'''

# a LayerNorm whose centred input is held in a variable: also an RMSNorm of that variable
SHARED_CENTRED_LAYER_NORM = HEADER + '''
class Norm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d, dtype=torch.float64) + 0.5)
        self.bias = nn.Parameter(torch.randn(d, dtype=torch.float64))
        self.eps = eps

    def forward(self, x):
        means = x.mean(-1, keepdim=True)
        xc = x - means
        variances = xc.pow(2).mean(-1, keepdim=True)
        x = xc / torch.sqrt(variances + self.eps)
        return self.weight * x + self.bias
'''

_ESM_DIMS = "tuple(-(i + 1) for i in range(len(self.shape)))"
_LIST_DIMS = "[-i for i in range(1, len(self.shape) + 1)]"

CASES = {
    # name: (source, constructor arguments, input shape, rule, text the rewrite must contain)
    "layer norm, trailing 2 axes (generator)": (TRAILING_LAYER_NORM.format(dims=_ESM_DIMS), ((4, 5),), (2, 3, 4, 5),
                                               "layer-norm", "layer_norm(x,self.shape,None,None,self.eps)"),
    "layer norm, trailing axis of an int shape": (TRAILING_LAYER_NORM.format(dims=_ESM_DIMS), (5,), (2, 3, 5),
                                                  "layer-norm", "layer_norm(x,self.shape,None,None,self.eps)"),
    "layer norm, trailing 2 axes (list), no affine": (TRAILING_LAYER_NORM.format(dims=_LIST_DIMS), ((4, 5), 1e-5, False),
                                                      (2, 3, 4, 5), "layer-norm", "layer_norm(x,self.shape,"),
    "rms norm, trailing 3 axes, weight": (TRAILING_RMS_NORM, ((3, 4, 5),), (2, 3, 4, 5), "rms-norm",
                                          "rms_norm(x,normalized_shape,eps=eps)"),
    "rms norm, trailing 2 axes, no weight": (TRAILING_RMS_NORM, ((4, 5), False), (2, 3, 4, 5), "rms-norm",
                                             "rms_norm(x,normalized_shape,eps=eps)"),
    "layer norm, E[x^2] - E[x]^2, channels first": (SQUARE_MEAN_LAYER_NORM, (5,), (2, 5, 3, 4), "layer-norm",
                                                   "movedim(1,-1)"),
    "layer norm over a shared centred value": (SHARED_CENTRED_LAYER_NORM, (6,), (2, 3, 6), "layer-norm",
                                               "layer_norm(x,x.shape[-1:],self.weight,self.bias,self.eps)"),
}


def _run(text: str, args: tuple, shape: tuple):
    namespace: dict = {}
    exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    torch.manual_seed(0)
    module = namespace["Norm"](*args)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    x = x * 3 + 2  # a mean far from 0: E[x^2] - E[x]^2 differs from the centred variance in rounding only
    out = module(x)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    inputs = (x, *[p for p in module.parameters()])
    return out.detach(), torch.autograd.grad((out * weights).sum(), inputs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_norm_proven_by_facts_is_rewritten_and_computes_the_same(case):
    source, args, shape, rule, expected = CASES[case]
    findings, new = scan_source(source, select_rules("layer-norm,rms-norm"), "case.py", "case")
    applied = [(f.rule_id, f.status) for f in findings if f.status != "near-miss"]
    assert applied == [(rule, "rewritten")], [(f.rule_id, f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert expected in flat, new
    assert "dims=" not in flat and "norm_ndim" not in flat, new  # the tuple of axes goes with the statistics
    want, want_grads = _run(source, args, shape)
    got, got_grads = _run(new, args, shape)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11, msg=lambda m: f"{case}: {m}\n{new}")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m: f"{case} grads: {m}\n{new}")


@pytest.mark.parametrize("dims", [
    "tuple(range(len(self.shape)))",  # the leading axes
    "tuple(-(i + 2) for i in range(len(self.shape)))",  # shifted by one: misses the last axis
    "tuple(-(i + 1) for i in range(len(self.shape)) if i)",  # filtered
    "tuple(-(i + 1) for i in range(len(x.shape)))",  # the length of something else than an attribute
])
def test_a_tuple_of_axes_not_proven_trailing_is_a_near_miss(dims):
    source = TRAILING_LAYER_NORM.format(dims=dims)
    findings, new = scan_source(source, select_rules("layer-norm,rms-norm"), "case.py", "case")
    assert new == source
    assert findings and all(f.status == "near-miss" for f in findings), [(f.rule_id, f.status) for f in findings]
    assert any("not provably the trailing axes" in (f.reason or "") or "nor provably the trailing axes" in (f.reason or "")
               for f in findings), [f.reason for f in findings]


def test_two_trailing_tuples_of_different_lengths_are_different_axes():
    source = TRAILING_LAYER_NORM.format(dims=_ESM_DIMS).replace(
        "var = xc.pow(2).mean(dims, keepdim=True)",
        "var = xc.pow(2).mean(tuple(range(-1, -len(self.eps_shape) - 1, -1)), keepdim=True)")
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert new == source
    assert [f.reason for f in findings] == ["the mean and the variance are taken over different axes"], findings
