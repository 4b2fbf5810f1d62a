"""Norms over an axis other than the last (channels-first LayerNorm and RMSNorm, NCHW and NCTHW):
the rewrite normalizes the input with that axis moved last and moves the result back, and the
weight and bias apply as written. Compared in float64 with the original, forward and gradients
(the input's and the parameters'), so any difference is a semantic one."""

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

LAYER_NORM = HEADER + '''
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.g = nn.Parameter(torch.rand({g}, dtype=torch.float64) + 0.5)
        self.b = nn.Parameter(torch.randn({g}, dtype=torch.float64))
        self.eps = 1e-5

    def forward(self, x):
        var = torch.var(x, dim={dim}, unbiased=False, keepdim=True)
        mean = torch.mean(x, dim={dim}, keepdim=True)
        return (x - mean) / (var + self.eps).sqrt() * self.g + self.b
'''

RMS_NORM = HEADER + '''
class Norm(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.g = nn.Parameter(torch.rand({g}, dtype=torch.float64) + 0.5)

    def forward(self, x):
        v = torch.mean(x.pow(2), dim={dim}, keepdim=True)
        return x * torch.rsqrt(v + 1e-6) * self.g
'''

CASES = {
    # name: (source, dim, parameter shape, input shape)
    "layer norm NCHW dim=1": (LAYER_NORM, "1", "1, c, 1, 1", (2, 5, 3, 4)),
    "layer norm NCTHW dim=1": (LAYER_NORM, "1", "1, c, 1, 1, 1", (2, 5, 2, 3, 4)),
    "layer norm dim=-3": (LAYER_NORM, "-3", "c, 1, 1", (2, 5, 3, 4)),
    "rms norm NCHW dim=1": (RMS_NORM, "1", "1, c, 1, 1", (2, 5, 3, 4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_norm_over_another_axis_is_the_kernel_over_that_axis_moved_last(case):
    template, dim, g, shape = CASES[case]
    source = template.format(dim=dim, g=g)
    findings, new = scan_source(source, select_rules("layer-norm,rms-norm"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    flat = "".join(new.split())
    assert f"movedim({dim},-1)" in flat and f"movedim(-1,{dim})" in flat and "self.g" in flat, new
    results = []
    for text in (source, new):
        namespace: dict = {}
        exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
        torch.manual_seed(0)
        module = namespace["Norm"](shape[1])
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64,
                        requires_grad=True)
        out = module(x)
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)
        grads = torch.autograd.grad((out * weights).sum(), (x, *module.parameters()))
        results.append((out.detach(), grads))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case}: {m}\n{new}")
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{case} grads: {m}\n{new}")


def test_statistics_over_two_axes_or_a_runtime_axis_are_not_rewritten():
    two = LAYER_NORM.format(dim="1", g="1, c, 1, 1").replace("torch.var(x, dim=1", "torch.var(x, dim=2")
    findings, new = scan_source(two, select_rules("layer-norm"), "case.py", "case")
    assert new == two and [f.reason for f in findings] == ["the mean and the variance are taken over different axes"]
    runtime = LAYER_NORM.format(dim="self.axis", g="1, c, 1, 1")
    findings, new = scan_source(runtime, select_rules("layer-norm"), "case.py", "case")
    assert new == runtime and all(f.status == "near-miss" for f in findings) and findings, findings
