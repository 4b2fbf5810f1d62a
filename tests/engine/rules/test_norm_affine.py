"""The weight and bias of a LayerNorm over the last axis go into `layer_norm` only where their shape
is proven the kernel's (N,); any other shape ((1, 1, N), (3, 1) broadcasting against another axis,
unknown) is applied after the kernel as the code wrote it, the bias after it too where the weight
goes out. Each rewrite is run beside the original in float64, forward and gradients (the input's
and the parameters'), so a weight passed into the kernel that it cannot take (it raises) or that
broadcasts otherwise shows."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

NORM = '''
import torch
import torch.nn as nn


class Norm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.rand({w}, dtype=torch.float64) + 0.5)
        self.bias = nn.Parameter(torch.randn({b}, dtype=torch.float64))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        x = (x - mean) / torch.sqrt(var + self.eps)
        return self.weight * x + self.bias
'''

# the weight applied before the division (Conv-TasNet's spelling), over the last axis
WEIGHT_FIRST = '''
import torch
import torch.nn as nn


class Norm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.gamma = nn.Parameter(torch.rand({w}, dtype=torch.float64) + 0.5)
        self.beta = nn.Parameter(torch.randn({b}, dtype=torch.float64))
        self.eps = eps

    def forward(self, y):
        mean = torch.mean(y, dim=-1, keepdim=True)
        var = torch.var(y, dim=-1, keepdim=True, unbiased=False)
        return self.gamma * (y - mean) / torch.sqrt(var + self.eps) + self.beta
'''

# a helper given the parameters: their shape is what the module passes, unknown to a public function
FUNCTIONAL = '''
import torch
import torch.nn as nn


def layer_norm(x, weight, bias, eps: float = 1e-5):
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


class Norm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.rand({w}, dtype=torch.float64) + 0.5)
        self.bias = nn.Parameter(torch.randn({b}, dtype=torch.float64))

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias)
'''

N = 6
SHAPE = (2, 3, N)

CASES = {
    # name: (source, weight shape, bias shape, text the rewrite must contain, text it must not)
    "(N,) weight and bias: in the kernel": (NORM, "d", "d", "layer_norm(x,x.shape[-1:],self.weight,self.bias,self.eps)",
                                            None),
    "(1, 1, N) weight and bias: after the kernel": (NORM, "1, 1, d", "1, 1, d",
                                                    "layer_norm(x,x.shape[-1:],eps=self.eps)*self.weight+self.bias",
                                                    "self.weight,"),
    "(3, 1) weight, broadcast over another axis": (NORM, "3, 1", "d",
                                                   "layer_norm(x,x.shape[-1:],eps=self.eps)*self.weight+self.bias",
                                                   "self.weight,"),
    "(N,) weight, (1, 1, N) bias: the bias after the kernel": (
        NORM, "d", "1, 1, d", "layer_norm(x,x.shape[-1:],self.weight,None,self.eps)+self.bias", "self.bias,"),
    "(1,) weight: a scalar gain": (NORM, "1", "d", "*self.weight+self.bias", "self.weight,"),
    "weight first, (1, 1, N)": (WEIGHT_FIRST, "1, 1, d", "1, 1, d", "*self.gamma+self.beta", "self.gamma,"),
    "weight first, (N,)": (WEIGHT_FIRST, "d", "d", "self.gamma,self.beta,self.eps", None),
    "helper of a public function, (1, 1, N)": (FUNCTIONAL, "1, 1, d", "1, 1, d", "eps=eps)*weight+bias", "],weight"),
    "helper of a public function, (N,)": (FUNCTIONAL, "d", "d", "eps=eps)*weight+bias", "],weight"),
}


def _run(text: str):
    namespace: dict = {}
    exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    torch.manual_seed(0)
    module = namespace["Norm"](N)
    x = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    out = module(x)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    return out.detach(), torch.autograd.grad((out * weights).sum(), (x, *module.parameters()))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_affine_goes_into_the_kernel_only_where_its_shape_is_the_kernels(case):
    template, w, b, expected, absent = CASES[case]
    source = template.format(w=w, b=b)
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert expected in flat, new
    assert absent is None or absent not in flat, new
    want, want_grads = _run(source)
    got, got_grads = _run(new)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11, msg=lambda m: f"{case}: {m}\n{new}")
    for a, c in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-9, atol=1e-10, msg=lambda m: f"{case} grads: {m}\n{new}")
    again, twice = scan_source(new, select_rules("layer-norm"), "case.py", "case")
    assert twice == new, [(f.status, f.reason) for f in again]  # the rewritten code is not rewritten again


def test_an_input_cast_to_another_dtype_than_the_parameters_keeps_them_after_the_kernel():
    """`x = x.float()` before the statistics, float64 parameters: the code's product promotes to
    float64, where the kernel given a float64 weight beside a float32 input raises."""
    source = NORM.format(w="d", b="d").replace("    def forward(self, x):\n",
                                                "    def forward(self, x):\n        x = x.float()\n")
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "layer_norm(x,x.shape[-1:],eps=self.eps)*self.weight+self.bias" in "".join(new.split()), new
    (want, want_grads), (got, got_grads) = _run(source), _run(new)
    assert got.dtype == want.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{m}\n{new}")
    for a, c in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5, msg=lambda m: f"grads: {m}\n{new}")
