"""Norm statistics written with einops (engine/analysis/shapes.py `einops_reduction`,
`einops_flattened_from`, `einops_unit_tail`; engine/match/matcher.py `MethodIndex.einops_view`):
`reduce(x, pattern, 'mean')` whose pattern only reduces axes is the torch mean over them, and a
reduction over the last axis of x's trailing axes flattened into one, given its size-1 axes back,
is the reduction over those axes. DALLE2's weight standardization (a `nn.Conv2d` subclass, whose
inherited `self.weight` is 4-D) is then a layer norm over `weight.shape[1:]`. Each rewrite is
compared in float64 with the original, forward and gradients; einops is stood in for by the torch
computations its patterns name (the test environment lacks it)."""

from __future__ import annotations

import sys
import types

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange, reduce
"""

# DALLE2-pytorch 1.15.6, dalle2_pytorch.py WeightStandardizedConv2d
DALLE2 = HEADER + '''
class Conv(nn.{conv}):
    def forward(self, x):
        eps = 1e-5 if x.dtype == torch.float32 else 1e-3

        weight = self.weight
        flattened_weights = {flatten}

        mean = reduce(weight, '{mean}', 'mean')

        var = torch.var(flattened_weights, dim = -1, unbiased = {unbiased})
        var = rearrange(var, '{tail}')

        weight = (weight - mean) * (var + eps).rsqrt()

        return F.{fn}(x, weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
'''

CONV2D = dict(conv="Conv2d", fn="conv2d", flatten="rearrange(weight, 'o ... -> o (...)')", mean="o ... -> o 1 1 1",
              unbiased="False", tail="o -> o 1 1 1")
CONV1D = dict(conv="Conv1d", fn="conv1d", flatten="weight.flatten(1)", mean="o i k -> o 1 1", unbiased="False",
              tail="o -> o 1 1")

# statistics of an input of unproven rank whose pattern names every axis (einops raises otherwise)
NAMED = HEADER + '''
class Norm(nn.Module):
    def forward(self, x):
        mean = reduce(x, 'b c h w -> b 1 1 1', 'mean')
        var = reduce((x - mean) ** 2, 'b c h w -> b 1 1 1', 'mean')
        return (x - mean) / torch.sqrt(var + 1e-5)
'''

# an einops stand-in: each pattern the sources use, as the torch computation einops makes of it
_REARRANGE = {
    "o ... -> o (...)": lambda t: t.reshape(t.shape[0], -1),
    "o (...) -> o ...": lambda t: t,
    "o -> o 1 1 1": lambda t: t.reshape(t.shape[0], 1, 1, 1),
    "o -> o 1 1": lambda t: t.reshape(t.shape[0], 1, 1),
}
_REDUCE = {
    "o ... -> o 1 1 1": lambda t: t.mean(dim=tuple(range(1, t.dim()))).reshape(t.shape[0], 1, 1, 1),
    "o i k -> o 1 1": lambda t: t.mean(dim=(1, 2), keepdim=True),
    "b c h w -> b 1 1 1": lambda t: t.mean(dim=(1, 2, 3), keepdim=True),
    "o ... -> 1 ...": lambda t: t.mean(dim=0, keepdim=True),
}


def _stand_in():
    def reduce(t, pattern, reduction):
        assert reduction == "mean"
        return _REDUCE[pattern](t)

    return types.SimpleNamespace(rearrange=lambda t, pattern: _REARRANGE[pattern](t), reduce=reduce)


def _scan(source: str):
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    return [(f.status, f.reason) for f in findings], new


def _compare(source: str, new: str, name: str, make, shape) -> None:
    def run(text: str):
        namespace: dict = {}
        exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
        torch.manual_seed(0)
        module = make(namespace[name]).double()
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
        out = module(x)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
        return out.detach(), torch.autograd.grad((out * weights).sum(), (x, *module.parameters()))

    (want, want_grads), (got, got_grads) = run(source), run(new)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m: f"{m}\n{new}")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"grads: {m}\n{new}")


FIRE = {
    # name: (source, class, constructor, input shape, the rewrite's kernel call)
    "DALLE2's Conv2d": (DALLE2.format(**CONV2D), "Conv", lambda c: c(3, 4, 3), (2, 3, 6, 6),
                        "F.layer_norm(weight, weight.shape[1:], eps=eps)"),
    "a Conv1d flattened by .flatten(1)": (DALLE2.format(**CONV1D), "Conv", lambda c: c(3, 4, 3), (2, 3, 7),
                                          "F.layer_norm(weight, weight.shape[1:], eps=eps)"),
    # (its rank unproven: the axes are moved last and back)
    "an input whose axes the pattern names": (NAMED, "Norm", lambda c: c(), (2, 3, 4, 5),
                                              "tuple(map(x.size, (1, 2, 3))), eps=1e-05"),
}


@pytest.mark.parametrize("case", sorted(FIRE))
def test_einops_statistics_over_trailing_axes_are_a_layer_norm_over_them(case, monkeypatch):
    source, name, make, shape, call = FIRE[case]
    found, new = _scan(source)
    assert found == [("rewritten", None)], found
    # (the formatter may break a long call over lines: compared with whitespace collapsed)
    assert call in " ".join(new.split()) and "reduce(" not in new and "var(" not in new, new
    assert ("movedim" in new) == (name == "Norm"), new
    monkeypatch.setitem(sys.modules, "einops", _stand_in())
    _compare(source, new, name, make, shape)


NEAR = {
    # the mean over the output axis, the variance over the others
    "the mean over the first axis": DALLE2.format(**{**CONV2D, "mean": "o ... -> 1 ..."}),
    # torch.var's default: the unbiased variance, not the layer norm's
    "the unbiased variance": DALLE2.format(**{**CONV2D, "unbiased": "True"}),
    # size-1 axes for a 3-D weight given a 4-D one: not the variance over the flattened axes in place
    "a tail of the wrong rank": DALLE2.format(**{**CONV2D, "tail": "o -> o 1 1"}),
    # a Linear subclass: its weight is 2-D, so `...` covers one axis, not three
    "a Linear's weight": DALLE2.format(**{**CONV2D, "conv": "Linear"}),
}


@pytest.mark.parametrize("case", sorted(NEAR))
def test_einops_statistics_that_are_no_layer_norm_are_left(case):
    found, new = _scan(NEAR[case])
    assert new == NEAR[case] and all(status != "rewritten" for status, _ in found), found


def test_a_weight_the_class_sets_itself_has_no_inherited_rank():
    # a subclass that replaces the weight (of any shape) proves nothing about its rank
    source = DALLE2.format(**CONV2D).replace(
        "    def forward(self, x):",
        "    def reset(self, w):\n        self.weight = nn.Parameter(w)\n\n    def forward(self, x):", 1)
    found, new = _scan(source)
    assert new == source and all(status != "rewritten" for status, _ in found), found
