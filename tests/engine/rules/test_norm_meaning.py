"""Norms recognised by what the code means (issue 10): statistics over an axis an attribute holds
(`self.dim`, proven an integer at every construction in the file), a cast of a value to the dtype it
already has (no cast at all). Each rewrite is run beside the original in float64, forward and
gradients (the input's and the parameters'), so any difference is a semantic one."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# imagen-pytorch's LayerNorm: over self.dim (-1, or -3 through the partial), the dtype-dependent eps,
# rsqrt cast to x's own dtype, the weight cast too, an optional division by the detached amax
ATTRIBUTE_AXIS_LAYER_NORM = '''
from functools import partial

import torch
from torch import nn


class LayerNorm(nn.Module):
    def __init__(self, feats, stable=False, dim=-1):
        super().__init__()
        self.stable = stable
        self.dim = dim
        self.g = nn.Parameter(torch.rand(feats, *((1,) * (-dim - 1)), dtype=torch.float64) + 0.5)

    def forward(self, x):
        dtype, dim = x.dtype, self.dim

        if self.stable:
            x = x / x.amax(dim=dim, keepdim=True).detach()

        eps = 1e-5 if x.dtype == torch.float32 else 1e-3
        var = torch.var(x, dim=dim, unbiased=False, keepdim=True)
        mean = torch.mean(x, dim=dim, keepdim=True)

        return (x - mean) * (var + eps).rsqrt().type(dtype) * self.g.type(dtype)


ChanLayerNorm = partial(LayerNorm, dim=-3)
'''

# RMSNorm over self.dim, the same proof of the attribute
ATTRIBUTE_AXIS_RMS_NORM = '''
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, feats, dim=1):
        super().__init__()
        self.dim = dim
        self.g = nn.Parameter(torch.rand(feats, 1, 1, dtype=torch.float64) + 0.5)

    def forward(self, x):
        ms = x.pow(2).mean(self.dim, keepdim=True)
        return x * torch.rsqrt(ms + 1e-6) * self.g


def make(feats):
    return RMSNorm(feats, dim=-3)
'''

# k-diffusion's rms_norm: the scale times rsqrt in the wider dtype, cast back to x's, times x; the
# scale per feature, per head (H, 1, 1) or per sample (B, 1, D)
PRODUCT_THROUGH_CAST_RMS_NORM = '''
import torch
from torch import nn


def rms_norm(x, scale, eps):
    dtype = torch.promote_types(x.dtype, torch.float32)
    mean_sq = torch.mean(x.to(dtype)**2, dim=-1, keepdim=True)
    scale = scale.to(dtype) * torch.rsqrt(mean_sq + eps)
    return x * scale.to(x.dtype)


class Norm(nn.Module):
    def __init__(self, *scale_shape):
        super().__init__()
        self.scale = nn.Parameter(torch.rand(*scale_shape, dtype=torch.float64) + 0.5)

    def forward(self, x):
        return rms_norm(x, self.scale, 1e-6)
'''

_KD = "(scale.to(dtype)*nn.functional.rms_norm(x.to(dtype),x.shape[-1:],eps=eps)).to(x.dtype)"

CASES = {
    # name: (source, class, constructor arguments, input shape, rule, text the rewrite must contain)
    "layer norm over self.dim = -1": (ATTRIBUTE_AXIS_LAYER_NORM, "LayerNorm", (6,), (2, 3, 6), "layer-norm",
                                      "layer_norm(x.movedim(dim,-1),(x.shape[dim],),eps=eps).movedim(-1,dim)"),
    "layer norm over self.dim = -1, stable": (ATTRIBUTE_AXIS_LAYER_NORM, "LayerNorm", (6, True), (2, 3, 6),
                                              "layer-norm", "movedim(-1,dim).contiguous()*self.g.type(dtype)"),
    "channel layer norm over self.dim = -3": (ATTRIBUTE_AXIS_LAYER_NORM, "ChanLayerNorm", (5,), (2, 5, 3, 4),
                                              "layer-norm", "movedim(-1,dim).contiguous()*self.g.type(dtype)"),
    "channel layer norm over self.dim = -3, stable": (ATTRIBUTE_AXIS_LAYER_NORM, "ChanLayerNorm", (5, True),
                                                      (2, 5, 3, 4), "layer-norm", "movedim(-1,dim)"),
    "rms norm through a cast back, per-feature scale": (PRODUCT_THROUGH_CAST_RMS_NORM, "Norm", (6,), (2, 3, 6),
                                                        "rms-norm", _KD),
    "rms norm through a cast back, per-head scale": (PRODUCT_THROUGH_CAST_RMS_NORM, "Norm", (3, 1, 1), (2, 3, 4, 6),
                                                     "rms-norm", _KD),
    "rms norm through a cast back, per-sample scale": (PRODUCT_THROUGH_CAST_RMS_NORM, "Norm", (2, 1, 6), (2, 4, 6),
                                                       "rms-norm", _KD),
    "rms norm over self.dim = 1": (ATTRIBUTE_AXIS_RMS_NORM, "RMSNorm", (5,), (2, 5, 3, 4), "rms-norm",
                                   "self.g*nn.functional.rms_norm(x.movedim(self.dim,-1),(x.shape[self.dim],),"
                                   "eps=1e-06).movedim(-1,self.dim)"),
}


def _run(text: str, name: str, args: tuple, shape: tuple):
    namespace: dict = {}
    exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    torch.manual_seed(0)
    module = namespace[name](*args)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    out = module(x * 3 + 2)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    inputs = (x, *[p for p in module.parameters()])
    return out.detach(), torch.autograd.grad((out * weights).sum(), inputs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_norm_by_meaning_is_rewritten_and_computes_the_same(case):
    source, name, args, shape, rule, expected = CASES[case]
    findings, new = scan_source(source, select_rules("layer-norm,rms-norm"), "case.py", "case")
    applied = [(f.rule_id, f.status) for f in findings if f.status != "near-miss"]
    assert applied == [(rule, "rewritten")], [(f.rule_id, f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert expected in flat, new
    want, want_grads = _run(source, name, args, shape)
    got, got_grads = _run(new, name, args, shape)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11, msg=lambda m: f"{case}: {m}\n{new}")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m: f"{case} grads: {m}\n{new}")


@pytest.mark.parametrize("edit", [
    ("ChanLayerNorm = partial(LayerNorm, dim=-3)", "ChanLayerNorm = partial(LayerNorm, dim=(-2, -1))"),  # two axes
    ("ChanLayerNorm = partial(LayerNorm, dim=-3)", "def make(d, axis):\n    return LayerNorm(d, dim=axis)"),
    ("        self.dim = dim\n", "        self.dim = dim\n        if stable:\n            self.dim = -1\n"),
])
def test_an_attribute_axis_not_proven_an_integer_is_a_near_miss(edit):
    source = ATTRIBUTE_AXIS_LAYER_NORM.replace(*edit)
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert new == source
    assert [f.reason for f in findings] == [
        "the statistics are over `self.dim`, not proven to hold one integer axis (set once in `__init__`, an "
        "integer literal at every construction in the file)"], [(f.status, f.reason) for f in findings]


def test_a_cast_to_another_dtype_is_no_identity():
    # the weight cast to float32 while x may be of another dtype: rsqrt(...).float() is a real cast
    source = ATTRIBUTE_AXIS_LAYER_NORM.replace(".rsqrt().type(dtype)", ".rsqrt().float()")
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert new == source and not [f for f in findings if f.status != "near-miss"], findings


def test_a_product_through_a_cast_back_keeps_the_dtype_of_x():
    findings, new = scan_source(PRODUCT_THROUGH_CAST_RMS_NORM, select_rules("rms-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], findings
    outs = []
    for text in (PRODUCT_THROUGH_CAST_RMS_NORM, new):
        namespace: dict = {}
        exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
        x = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
        scale = torch.rand(8, generator=torch.Generator().manual_seed(2)) + 0.5
        outs.append(namespace["rms_norm"](x, scale, 1e-6))
    want, got = outs
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)  # bfloat16 rounding only


def test_a_product_whose_factor_is_read_elsewhere_is_not_regrouped():
    source = PRODUCT_THROUGH_CAST_RMS_NORM.replace("    return x * scale.to(x.dtype)\n",
                                                   "    return x * scale.to(x.dtype), scale\n")
    findings, new = scan_source(source, select_rules("rms-norm"), "case.py", "case")
    assert new == source and not [f for f in findings if f.status != "near-miss"], findings


# timm's rms_norm: the trailing len(normalized_shape) axes, or under TorchScript the last axis after
# an assert that normalized_shape has one element, mean(v, -1).unsqueeze(-1) for keepdim
BOTH_BRANCHES_RMS_NORM = '''
from typing import List, Optional

import torch


def rms_norm(x: torch.Tensor, normalized_shape: List[int], weight: Optional[torch.Tensor] = None, eps: float = 1e-5):
    norm_ndim = len(normalized_shape)
    v = x.pow(2)
    if torch.jit.is_scripting():
        assert norm_ndim == 1
        v = torch.mean(v, dim=-1).unsqueeze(-1)
    else:
        dims = tuple(range(-1, -norm_ndim - 1, -1))
        v = torch.mean(v, dim=dims, keepdim=True)
    x = x * torch.rsqrt(v + eps)
    if weight is not None:
        x = x * weight
    return x
'''


@pytest.mark.parametrize(("shape", "normalized", "weighted"), [
    ((2, 3, 6), [6], True), ((2, 3, 4, 6), [4, 6], True), ((2, 3, 6), [6], False),
])
def test_a_norm_both_branches_compute_is_rewritten_once_and_computes_the_same(shape, normalized, weighted):
    findings, new = scan_source(BOTH_BRANCHES_RMS_NORM, select_rules("rms-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert "x=torch.nn.functional.rms_norm(x,normalized_shape,eps=eps)" in flat, new
    assert "is_scripting" not in flat and "norm_ndim" not in flat and "dims" not in flat, new  # the `if` goes
    results = []
    for text in (BOTH_BRANCHES_RMS_NORM, new):
        namespace: dict = {}
        exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
        w = (torch.rand(*normalized, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.5
             ).requires_grad_()
        out = namespace["rms_norm"](x, normalized, w if weighted else None, 1e-5)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
        results.append((out.detach(), torch.autograd.grad((out * weights).sum(), (x, w) if weighted else (x,))))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_the_norm_of_both_branches_is_scripted_as_the_original_is(tmp_path, monkeypatch):
    # torch.jit.script reads a function's source from its module's file: each version gets a file
    import importlib

    _, new = scan_source(BOTH_BRANCHES_RMS_NORM, select_rules("rms-norm"), "case.py", "case")
    monkeypatch.syspath_prepend(str(tmp_path))
    x = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    w = torch.rand(6, generator=torch.Generator().manual_seed(2), dtype=torch.float64) + 0.5
    outs = []
    for name, text in (("norm_original", BOTH_BRANCHES_RMS_NORM), ("norm_rewritten", new)):
        (tmp_path / f"{name}.py").write_text(text)
        scripted = torch.jit.script(importlib.import_module(name).rms_norm)
        outs.append(scripted(x, [6], w, 1e-5))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-10, atol=1e-11)


KEEPDIM_BY_UNSQUEEZE = '''
import torch


def rms_norm(x, eps: float = 1e-6):
    v = x.pow(2).mean(-1).unsqueeze({axis})
    return x * torch.rsqrt(v + eps)
'''


def test_a_reduction_unsqueezed_where_it_reduced_is_the_reduction_with_keepdim():
    source = KEEPDIM_BY_UNSQUEEZE.format(axis=-1)
    findings, new = scan_source(source, select_rules("rms-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "unsqueeze" not in new and "rms_norm(x, x.shape[-1:], eps=eps)" in new, new
    namespace: dict = {}
    exec(compile(new, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    x = torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(namespace["rms_norm"](x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    # unsqueezed elsewhere: another shape, no norm
    other = KEEPDIM_BY_UNSQUEEZE.format(axis=-2)
    findings, new = scan_source(other, select_rules("rms-norm"), "case.py", "case")
    assert new == other and not [f for f in findings if f.status != "near-miss"], findings
