"""Statistics over axes written as a list or tuple literal (`x.mean(dim=[-1], keepdim=True)`, labml's
GroupNorm and InstanceNorm on their (B, groups, n) view; `dim=(-2, -1)`): a one-item list is its
axis, and axes counted from the end are the trailing ones whatever the rank. The rewrite normalizes
over them in place (no movedim), compared in float64 with the original, forward and gradients."""

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

# labml's GroupNorm: the variance as E[x^2] - E[x]^2 on a (B, groups, n) view, the affine per channel
GROUP_NORM = HEADER + '''
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.groups, self.channels, self.eps = 2, c, 1e-5
        self.scale = nn.Parameter(torch.rand(c, dtype=torch.float64) + 0.5)

    def forward(self, x):
        x_shape = x.shape
        x = x.view(x_shape[0], self.groups, -1)
        mean = x.mean(dim={dim}, keepdim=True)
        mean_x2 = (x ** 2).mean(dim={dim}, keepdim=True)
        var = mean_x2 - mean ** 2
        x_norm = (x - mean) / torch.sqrt(var + self.eps)
        x_norm = x_norm.view(x_shape[0], self.channels, -1)
        return (self.scale.view(1, -1, 1) * x_norm).view(x_shape)
'''

# a parameter of unknown rank: only axes counted from the end are provably its trailing ones
LAYER_NORM = HEADER + '''
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.g = nn.Parameter(torch.rand({g}, dtype=torch.float64) + 0.5)
        self.b = nn.Parameter(torch.randn({g}, dtype=torch.float64))

    def forward(self, x):
        mean = x.mean(dim={dim}, keepdim=True)
        var = x.var(dim={vdim}, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.g + self.b
'''

RMS_NORM = HEADER + '''
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.g = nn.Parameter(torch.rand(c, dtype=torch.float64) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim={dim}, keepdim=True) + 1e-6) * self.g
'''

FIRE = {
    # name: (source, the normalized shape the rewrite reads, input shape)
    "group norm dim=[-1] of the view": (GROUP_NORM.format(dim="[-1]"), "x.shape[-1:]", (2, 4, 3, 5)),
    "group norm dim=[2] of the rank-3 view": (GROUP_NORM.format(dim="[2]"), "x.shape[-1:]", (2, 4, 3, 5)),
    "group norm dim=(-1,)": (GROUP_NORM.format(dim="(-1,)"), "x.shape[-1:]", (2, 4, 3, 5)),
    "layer norm dim=[-1]": (LAYER_NORM.format(dim="[-1]", vdim="[-1]", g="5"), "x.shape[-1:]", (2, 3, 5)),
    "layer norm dim=[-2, -1]": (LAYER_NORM.format(dim="[-2, -1]", vdim="[-1, -2]", g="3, 5"), "x.shape[-2:]",
                                (2, 3, 5)),
    "layer norm dim=(-2, -1)": (LAYER_NORM.format(dim="(-2, -1)", vdim="(-2, -1)", g="3, 5"), "x.shape[-2:]",
                                (4, 2, 3, 5)),
    "rms norm dim=[-1]": (RMS_NORM.format(dim="[-1]"), "x.shape[-1:]", (2, 3, 5)),
}


def _run(source: str, shape: tuple[int, ...]):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    torch.manual_seed(0)
    module = namespace["Norm"](shape[1] if "groups" in source else shape[-1])
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64, requires_grad=True)
    out = module(x)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
    return out.detach(), torch.autograd.grad((out * weights).sum(), (x, *module.parameters()))


@pytest.mark.parametrize("case", sorted(FIRE))
def test_statistics_over_a_literal_list_of_trailing_axes_are_the_kernel_over_them(case):
    source, normalized, shape = FIRE[case]
    findings, new = scan_source(source, select_rules("layer-norm,rms-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert normalized in flat and "movedim" not in flat and ".mean(" not in flat, new
    (want, want_grads), (got, got_grads) = _run(source, shape), _run(new, shape)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case}: {m}\n{new}")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case} grads: {m}\n{new}")


NEAR = {
    # the mean over the last axis, the variance over the last two
    "different axes": (LAYER_NORM.format(dim="[-1]", vdim="[-2, -1]", g="5"),
                       "the mean and the variance are taken over different axes"),
    # an axis twice: not a set of axes (torch rejects it)
    "an axis twice": (LAYER_NORM.format(dim="[-1, -1]", vdim="[-1, -1]", g="5"),
                      "the statistics are over dim=[-1, -1], not axes the kernel can normalize"),
    # an axis known only at run time
    "a variable axis": (LAYER_NORM.format(dim="[-1, self.k]", vdim="[-1, self.k]", g="5"),
                        "the statistics are over dim=[-1, self.k], not axes the kernel can normalize"),
}


@pytest.mark.parametrize("case", sorted(NEAR))
def test_literal_lists_that_are_not_one_set_of_axes_are_near_misses(case):
    source, reason = NEAR[case]
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert new == source and [(f.status, f.reason) for f in findings] == [("near-miss", reason)], findings


def test_a_literal_list_of_a_leading_axis_keeps_the_axis_it_names():
    """`dim=[1]` is the channels-first norm: the kernel over that axis moved last, not over the last axis."""
    source = LAYER_NORM.format(dim="[1]", vdim="[1]", g="1, 3, 1")
    findings, new = scan_source(source, select_rules("layer-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert "movedim(1,-1)" in flat and "movedim(-1,1)" in flat, new
    (want, _), (got, _) = _run(source, (2, 3, 5)), _run(new, (2, 3, 5))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
