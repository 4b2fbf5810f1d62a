"""Score factors that are parameters of a private helper, shaped by what its calls pass (engine/
analysis/shapes.py `param_shape`): Swin V2's cosine attention gets `logit_scale`, which the calling
class builds in `__init__` as a per-head parameter with size-1 query and key axes, so
`clamp(logit_scale).exp()` folds into the query with `scale=1.0` and its gradient still flows.
Where a call passes something else, the helper is public, or another file names it, nothing is
proven. Each rewrite is run against the original in float64, forward and gradients.
"""

from __future__ import annotations

import pytest

from engine.extract.package import PackageIndex
from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# Swin V1/V2 in the shape torchvision writes them: a free function, a V1 class leaving
# `logit_scale` to its default None (the plain branch) and a V2 class passing its parameter
SWIN = '''
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def _window_attention(q, k, v, bias, logit_scale=None):
    if logit_scale is not None:
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        logit_scale = torch.clamp(logit_scale, max=math.log(100.0)).exp()
        attn = attn * logit_scale
    else:
        q = q * q.size(-1) ** -0.5
        attn = q.matmul(k.transpose(-2, -1))
    attn = attn + bias
    attn = F.softmax(attn, dim=-1)
    return attn.matmul(v)


class Attention(nn.Module):
    def __init__(self, heads=2):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(heads, 5, 5))

    def forward(self, q, k, v):
        return _window_attention(q, k, v, self.bias)


class AttentionV2(Attention):
    def __init__(self, heads=2):
        super().__init__(heads)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((heads, 1, 1))))

    def forward(self, q, k, v):
        return _window_attention(q, k, v, self.bias, logit_scale=self.logit_scale)
'''


def _scan(source: str, package: PackageIndex | None = None) -> tuple[str, list]:
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case", package)
    return new, [(f.status, f.reason) for f in findings if f.rule_id == "sdpa-attention"]


def _run(source: str, cls: str):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    torch.manual_seed(0)
    module = namespace[cls]().double()
    if hasattr(module, "logit_scale"):
        with torch.no_grad():
            module.logit_scale.copy_(torch.tensor([0.3, 5.2]).view(2, 1, 1))  # one head over the clamp
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = module(q, k, v)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad, *(p.grad for p in module.parameters())]


def test_the_callers_per_head_logit_scale_is_folded_into_the_query():
    new, findings = _scan(SWIN)
    assert "F.normalize(q, dim=-1) * logit_scale" in new and "scale=1.0" in new, findings
    for cls in ("Attention", "AttentionV2"):
        for a, b in zip(_run(SWIN, cls), _run(new, cls), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("name", "edit"), [
    ("a call passes a tensor varying along the key axis",
     ("torch.log(10 * torch.ones((heads, 1, 1)))", "torch.log(10 * torch.ones((heads, 1, 5)))")),
    ("a call passes a tensor of unproven shape",
     ("logit_scale=self.logit_scale)", "logit_scale=self.logit_scale * q.sum(-1, keepdim=True))")),
    ("the attribute is set again outside `__init__`",
     ("    def forward(self, q, k, v):\n        return _window_attention(q, k, v, self.bias, logit",
      "    def forward(self, q, k, v):\n        self.logit_scale = q\n        return _window_attention(q, k, v, self.bias, logit")),
    ("the helper is passed as a value", ("return _window_attention(q, k, v, self.bias)\n",
                                         "return list(map(_window_attention, [q], [k], [v], [self.bias]))[0]\n")),
])
def test_what_a_call_passes_unproven_is_a_near_miss(name, edit):
    source = SWIN.replace(*edit)
    assert source != SWIN
    new, findings = _scan(source)
    assert "scale=1.0" not in new
    assert any(status == "near-miss" and "score factor" in (reason or "") for status, reason in findings), findings


def test_a_public_helper_is_a_near_miss_naming_what_its_calls_pass():
    """Code outside the repository may call a public function with any `logit_scale` (torchvision
    documents Swin's as `Tensor[out_dim]`, which would vary along the key axis)."""
    source = SWIN.replace("_window_attention", "window_attention")
    new, findings = _scan(source)
    # the helper stays as it is; V1's call leaves `logit_scale` at its default None, which decides
    # the helper's branch there: that call is the plain scaled attention, rewritten where it is made
    assert "def window_attention(q, k, v, bias, logit_scale=None):\n    if logit_scale is not None:" in new
    assert "return window_attention(q, k, v, self.bias, logit_scale=self.logit_scale)" in new
    assert "attn_mask=self.bias, scale=q.size(-1) ** -0.5" in new
    for a, b in zip(_run(source, "Attention"), _run(new, "Attention"), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    assert any("`logit_scale` is a parameter of the public function `window_attention`: its calls in the file "
               "pass `None` or `self.logit_scale`" in (reason or "") for _, reason in findings), findings


def test_a_private_helper_named_in_another_file_is_not_proven(tmp_path):
    (tmp_path / "case.py").write_text(SWIN)
    (tmp_path / "other.py").write_text("from case import _window_attention\n")
    package = PackageIndex(tmp_path, ["case.py", "other.py"])
    new, findings = _scan(SWIN, package)
    assert "scale=1.0" not in new, findings
    (tmp_path / "other.py").write_text("import case\n")
    new, findings = _scan(SWIN, PackageIndex(tmp_path, ["case.py", "other.py"]))
    assert "scale=1.0" in new, findings
