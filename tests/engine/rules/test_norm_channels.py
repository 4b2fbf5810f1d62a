"""LayerNorm over constant axes other than the last: one axis or several, written out or held by a
local (`stat_dim = (1, 3)`), or an attribute set in `__init__` from integer arithmetic of its
parameters (`dim if dim >= 0 else total_dim + dim`); the root as `pow(v, 0.5)`, the squares as
`torch.square`, the weight applied before the division (Conv-TasNet's cLN and gLN). The kernel
normalizes the input with the axes moved last and the result is moved back; a per-channel weight and
bias apply after it, as written. Each rewrite is compared with the original in float64, forward and
gradients, in training and evaluation mode; near-misses must not fire, and a fused call beside the
match counts as its fused path only where it computes the same norm."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F

EPS = torch.finfo(torch.float64).eps
"""

CHANNELWISE = (
    HEADER
    + """
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(1, c, 1, dtype=torch.float64) + 0.5)
        self.beta = nn.Parameter(torch.randn(1, c, 1, dtype=torch.float64))

    def forward(self, y):
        mean = torch.mean(y, dim=1, keepdim=True)
        var = torch.var(y, dim=1, keepdim=True, unbiased=False)
        return self.gamma * (y - mean) / torch.pow(var + EPS, 0.5) + self.beta
"""
)

GLOBAL = (
    HEADER
    + """
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(1, c, 1, dtype=torch.float64) + 0.5)
        self.beta = nn.Parameter(torch.randn(1, c, 1, dtype=torch.float64))

    def forward(self, y):
        mean = y.mean(dim=(1, 2), keepdim=True)
        var = (torch.pow(y - mean, 2)).mean(dim=(1, 2), keepdim=True)
        return self.gamma * (y - mean) / torch.pow(var + EPS, 0.5) + self.beta
"""
)

# statistics over a local tuple of axes, under a rank check that raises otherwise
LOCAL_AXES = (
    HEADER
    + """
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gamma = nn.Parameter(torch.rand({g}, dtype=torch.float64) + 0.5)
        self.beta = nn.Parameter(torch.randn({g}, dtype=torch.float64))
        self.eps = 1e-5

    def forward(self, x):
        if x.ndim == {rank}:
            stat_dim = {axes}
        else:
            raise ValueError("Expect x to have {rank} dimensions")
        mu_ = x.mean(dim=stat_dim, keepdim=True)
        std_ = torch.sqrt(x.var(dim=stat_dim, unbiased=False, keepdim=True) + self.eps)
        return ((x - mu_) / std_) * self.gamma + self.beta
"""
)

# a 5-D view of a 4-D input whose unpacking rebinds `F`: the kernel is not called through it
HEADS = (
    HEADER
    + """
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.H, self.E = 2, c // 2
        self.gamma = nn.Parameter(torch.rand(1, 2, c // 2, 1, 1, dtype=torch.float64) + 0.5)
        self.beta = nn.Parameter(torch.randn(1, 2, c // 2, 1, 1, dtype=torch.float64))
        self.eps = 1e-5

    def forward(self, x):
        assert x.ndim == 4
        B, _, T, F = x.shape
        x = x.view([B, self.H, self.E, T, F])
        stat_dim = {axes}
        mu_ = x.mean(dim=stat_dim, keepdim=True)
        std_ = torch.sqrt(x.var(dim=stat_dim, unbiased=False, keepdim=True) + self.eps)
        x = ((x - mu_) / std_) * self.gamma + self.beta
        return x
"""
)

# the axis an attribute holds, set from integer arithmetic of two parameters; the file builds the
# class with integer literals only
ATTRIBUTE = (
    HEADER
    + """
class LayerNormalization(nn.Module):
    def __init__(self, input_dim, dim=1, total_dim=4, eps=1e-5):
        super().__init__()
        self.dim = dim if dim >= 0 else total_dim + dim
        param_size = [1 if ii != self.dim else input_dim for ii in range(total_dim)]
        self.gamma = nn.Parameter(torch.rand(*param_size, dtype=torch.float64) + 0.5)
        self.beta = nn.Parameter(torch.randn(*param_size, dtype=torch.float64))
        self.eps = eps

    def forward(self, x):
        mu_ = x.mean(dim=self.dim, keepdim=True)
        std_ = torch.sqrt(x.var(dim=self.dim, unbiased=False, keepdim=True) + self.eps)
        return ((x - mu_) / std_) * self.gamma + self.beta


def Norm(c):
    return LayerNormalization(c, dim=-{back}, total_dim=5)


def channels_first(c):
    return LayerNormalization(c)
"""
)

# channels first with the variance as the mean of squares of the centred input, affine under a flag
SQUARES = (
    HEADER
    + """
class Norm(nn.LayerNorm):
    def __init__(self, c):
        super().__init__(c, dtype=torch.float64)
        with torch.no_grad():
            self.weight.uniform_(0.5, 1.5)
            self.bias.normal_()

    def forward(self, x):
        out = x - torch.mean(x, dim=1, keepdim=True)
        out = out / torch.sqrt(torch.square(out).mean(dim=1, keepdim=True) + self.eps)
        if self.elementwise_affine:
            out = out * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)
        return out
"""
)

# HorNet: the fused kernel on the channels-last branch normalizes the last axis, another norm than
# the channels-first branch's
TWO_FORMATS = (
    HEADER
    + """
class Norm(nn.Module):
    def __init__(self, c, data_format="channels_first"):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(c, dtype=torch.float64) + 0.5)
        self.bias = nn.Parameter(torch.randn(c, dtype=torch.float64))
        self.eps = 1e-6
        self.data_format = data_format
        self.normalized_shape = (c,)

    def forward(self, x):
        if self.data_format == "channels_last":
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        elif self.data_format == "channels_first":
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            x = self.weight[:, None, None] * x + self.bias[:, None, None]
            return x
"""
)

CASES = {
    # name: (source, input shape, what the rewrite must say)
    "cLN: dim=1, pow(v, 0.5), weight before the division": (CHANNELWISE, (2, 6, 5), "movedim(1,-1)"),
    "gLN: dims (1, 2)": (GLOBAL, (2, 6, 5), "movedim((1,2),(-2,-1))"),
    # the sizes of the axes are read with no name of the rewrite's own that could capture the input's
    "gLN of an input named d": (
        GLOBAL.replace("(self, y)", "(self, d)").replace("y.mean", "d.mean").replace("y - mean", "d - mean"),
        (2, 6, 5),
        "map(d.size,(1,2))",
    ),
    "local (1,) of 4-D": (
        LOCAL_AXES.format(g="1, c, 1, 1", rank=4, axes="(1,)"),
        (2, 6, 3, 4),
        "movedim(1,-1)",
    ),
    "local (1, 3) of 4-D": (
        LOCAL_AXES.format(g="1, c, 1, 4", rank=4, axes="(1, 3)"),
        (2, 6, 3, 4),
        "movedim((1,3),(-2,-1))",
    ),
    "local (3, 1) of 4-D": (
        LOCAL_AXES.format(g="1, c, 1, 4", rank=4, axes="(3, 1)"),
        (2, 6, 3, 4),
        "movedim((1,3),(-2,-1))",
    ),
    "local (2, 4) of a 5-D view": (HEADS.format(axes="(2, 4)"), (2, 6, 3, 4), "movedim((2,4),(-2,-1))"),
    "local (2,) of a 5-D view": (HEADS.format(axes="(2,)"), (2, 6, 3, 4), "movedim(2,-1)"),
    "attribute from dim and total_dim, last axis": (
        ATTRIBUTE.format(back=1),
        (2, 3, 2, 4, 6),
        "movedim(self.dim,-1)",
    ),
    "attribute from dim and total_dim, axis 2": (
        ATTRIBUTE.format(back=3),
        (2, 3, 6, 4, 2),
        "movedim(self.dim,-1)",
    ),
    "channels first, torch.square": (SQUARES, (2, 6, 3, 4), "movedim(1,-1)"),
    "channels first beside a channels-last fused call": (TWO_FORMATS, (2, 6, 3, 4), "movedim(1,-1)"),
}


def _run(text: str, shape: tuple[int, ...], train: bool):
    namespace: dict = {}
    exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    torch.manual_seed(0)
    module = namespace["Norm"](6)  # every case's channel axis has 6 entries
    module.train(train)
    x = torch.randn(
        *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True
    )
    out = module(x)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    grads = torch.autograd.grad((out * weights).sum(), (x, *module.parameters()))
    return out.detach(), grads


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_norm_over_other_constant_axes_is_the_kernel_over_them_moved_last(case, train):
    source, shape, moved = CASES[case]
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert moved in flat and "layer_norm(" in flat and "mu_" not in flat and "stat_dim" not in flat, new
    (want, want_grads), (got, got_grads) = (_run(text, shape, train) for text in (source, new))
    assert got.is_contiguous() == want.is_contiguous(), new  # the axes moved back, then laid out as they were
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case}: {m}\n{new}")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case} grads: {m}\n{new}")


def test_the_kernel_is_not_called_through_an_alias_the_function_rebinds():
    _, new = scan_source(HEADS.format(axes="(2, 4)"), select_rules("layer-norm"), "case.py", "case")
    assert "nn.functional.layer_norm(" in new and "F.layer_norm(" not in new, new


def test_the_weight_and_bias_apply_after_the_kernel_in_the_original_layout():
    _, new = scan_source(CHANNELWISE, select_rules("layer-norm"), "case.py", "case")
    flat = "".join(new.split())
    assert "eps=EPS).movedim(-1,1).contiguous()*self.gamma+self.beta" in flat, new


NEAR_MISSES = {
    # name: (source, a part of the near-miss reason)
    "unbiased variance over a local tuple": (
        LOCAL_AXES.format(g="1, c, 1, 4", rank=4, axes="(1, 3)").replace("unbiased=False, ", ""),
        "unbiased",
    ),
    "eps outside the root": (
        CHANNELWISE.replace(
            "self.gamma * (y - mean) / torch.pow(var + EPS, 0.5)",
            "(y - mean) / (torch.pow(var, 0.5) + EPS) * self.gamma",
        ),
        "outside the square root",
    ),
    "mean and variance over different tuples": (
        GLOBAL.replace(
            "(torch.pow(y - mean, 2)).mean(dim=(1, 2)", "(torch.pow(y - mean, 2)).mean(dim=(0, 2)"
        ),
        "different axes",
    ),
    "an axis held by a local set on two branches": (
        LOCAL_AXES.format(g="1, c, 1, 4", rank=4, axes="(1, 3)").replace(
            'raise ValueError("Expect x to have 4 dimensions")', "stat_dim = (1,)"
        ),
        "stat_dim",
    ),
    "an axis named twice": (LOCAL_AXES.format(g="1, c, 1, 4", rank=4, axes="(1, 1)"), "stat_dim"),
    "a construction passes a non-literal dim": (
        ATTRIBUTE.format(back=1).replace("LayerNormalization(c)", "LayerNormalization(c, dim=c - 1)"),
        "not proven to hold one integer axis",
    ),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_near_misses_are_not_rewritten(case):
    source, reason = NEAR_MISSES[case]
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert new == source, new
    assert findings and all(f.status == "near-miss" for f in findings), [
        (f.status, f.reason) for f in findings
    ]
    assert any(reason in (f.reason or "") for f in findings), [f.reason for f in findings]


def test_a_fused_call_on_the_same_norm_keeps_the_manual_branch():
    # the fused branch normalizes the channels moved last: it may compute the same norm, and the
    # manual branch is its fallback
    same = TWO_FORMATS.replace(
        "F.layer_norm(x, self.normalized_shape", "F.layer_norm(x.movedim(1, -1), self.normalized_shape"
    )
    findings, new = scan_source(same, select_rules("layer-norm"), "case.py", "case")
    assert new == same and [f.status for f in findings] == ["already-fused"], [
        (f.status, f.reason) for f in findings
    ]
    # and a manual norm over the last axis beside F.layer_norm of the same input is its fallback
    last = (
        TWO_FORMATS.replace("x.mean(1,", "x.mean(-1,")
        .replace(".mean(1,", ".mean(-1,")
        .replace("self.weight[:, None, None] * x + self.bias[:, None, None]", "self.weight * x + self.bias")
    )
    findings, new = scan_source(last, select_rules("layer-norm"), "case.py", "case")
    assert new == last and [f.status for f in findings] == ["already-fused"], [
        (f.status, f.reason) for f in findings
    ]


RMS_NORM = (
    HEADER
    + """
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.g = nn.Parameter(torch.rand({g}, dtype=torch.float64) + 0.5)

    def forward(self, x):
        stat_dim = {axes}
        v = torch.mean(x.pow(2), dim=stat_dim, keepdim=True)
        return x * torch.rsqrt(v + 1e-6) * self.g
"""
)


def test_an_rms_norm_over_one_axis_a_local_holds_is_rewritten_and_over_several_is_a_near_miss():
    one = RMS_NORM.format(g="1, c, 1, 1", axes="(1,)")
    findings, new = scan_source(one, select_rules("rms-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"] and "stat_dim" not in new, new
    (want, want_grads), (got, got_grads) = (_run(text, (2, 6, 3, 4), True) for text in (one, new))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # the rms-norm rule's rewrite has no form for several axes: not the kernel over the last one
    several = RMS_NORM.format(g="1, c, 1, 4", axes="(1, 3)")
    findings, new = scan_source(several, select_rules("rms-norm"), "case.py", "case")
    assert new == several and [f.status for f in findings] == ["near-miss"], [
        (f.status, f.reason) for f in findings
    ]
    assert "no form for" in findings[0].reason


# the normalized channels-first value flattened by `.view`, which needs a contiguous tensor: the
# kernel's result moved back is not one until it is laid out again
VIEWED = (
    HEADER
    + """
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(c, dtype=torch.float64) + 0.5)
        self.bias = nn.Parameter(torch.randn(c, dtype=torch.float64))

    def forward(self, x):
        {body}
        return y.view(y.shape[0], -1) + self.bias.sum()
"""
)

VIEWED_BODIES = {
    "layer-norm, affine": (
        "layer-norm",
        "u = x.mean(1, keepdim=True)\n        s = (x - u).pow(2).mean(1, keepdim=True)\n"
        "        y = (x - u) / torch.sqrt(s + 1e-6) * self.weight[:, None, None] + self.bias[:, None, None]",
    ),
    "layer-norm, plain": (
        "layer-norm",
        "u = x.mean(1, keepdim=True)\n        s = (x - u).pow(2).mean(1, keepdim=True)\n"
        "        y = (x - u) / torch.sqrt(s + 1e-6) * self.weight.sum()",
    ),
    "layer-norm, two axes": (
        "layer-norm",
        "u = x.mean((1, 2), keepdim=True)\n        s = (x - u).pow(2).mean((1, 2), keepdim=True)\n"
        "        y = (x - u) / torch.sqrt(s + 1e-6) * self.weight.sum()",
    ),
    "rms-norm": (
        "rms-norm",
        "v = x.pow(2).mean(1, keepdim=True)\n        y = x * torch.rsqrt(v + 1e-6) * self.weight[:, None, None]",
    ),
}


@pytest.mark.parametrize("case", sorted(VIEWED_BODIES))
def test_a_channels_first_norm_can_still_be_viewed(case):
    rule, body = VIEWED_BODIES[case]
    source = VIEWED.format(body=body)
    findings, new = scan_source(source, select_rules(rule), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert ".contiguous()" in new, new
    (want, want_grads), (got, got_grads) = (_run(text, (2, 6, 3, 4), True) for text in (source, new))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case}: {m}\n{new}")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case} grads: {m}\n{new}")
