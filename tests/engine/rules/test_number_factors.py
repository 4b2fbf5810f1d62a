"""Score factors that are function parameters (engine.analysis.numbers): folded into the query with
`scale=1.0` where the code proves them Python numbers (or None, where both forms raise), and left
alone where it does not. Each rewrite is run against the original in float64, forward and gradients.
"""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

# the function passes its `scale` to the fused kernel on another path (the kernel's `scale` is
# declared `float | None`): the parameter is a number by the function's own contract
KERNEL_SCALE = HEADER + '''
def attend(q, k, v, use_kernel=False, scale=None):
    if use_kernel:
        try:
            return F.scaled_dot_product_attention(q, k, v, scale=scale)
        except RuntimeError:
            pass
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    return torch.matmul(scores.softmax(dim=-1), v)


class Attention(nn.Module):
    def __init__(self, dim_head=8):
        super().__init__()
        self.scale = dim_head ** -0.5

    def forward(self, q, k, v):
        return attend(q, k, v, scale=self.scale)
'''

# SDPA's reference copied by hand as a private method: its one call leaves `scale` to its default,
# so the factor is `1 / math.sqrt(d)`
PRIVATE_DEFAULT = HEADER + '''
class Attention(nn.Module):
    def _sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, scale=None):
        L, S = query.size(-2), key.size(-2)
        scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
        attn_bias = torch.zeros(L, S, dtype=query.dtype, device=query.device)
        if attn_mask is not None:
            attn_bias = attn_mask + attn_bias
        attn_weight = query @ key.transpose(-2, -1) * scale_factor
        attn_weight += attn_bias
        attn_weight = torch.softmax(attn_weight, dim=-1)
        attn_weight = torch.dropout(attn_weight, dropout_p, train=True)
        return attn_weight @ value

    def forward(self, q, k, v):
        return self._sdpa(q, k, v)
'''

# a private module helper whose every call passes a number, positionally or by keyword
PRIVATE_NUMBERS = HEADER + '''
def _attend(q, k, v, scale):
    scores = (q @ k.transpose(-2, -1)) / scale
    return scores.softmax(dim=-1) @ v


class Attention(nn.Module):
    def forward(self, q, k, v):
        a = _attend(q, k, v, math.sqrt(8))
        b = _attend(q, k, v, scale=2 ** 0.5 * 2)
        return a + b
'''


def _rewrite(source: str) -> tuple[str, list]:
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return new, findings


def _run(source: str):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    module = namespace["Attention"]()
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 8, generator=gen, dtype=torch.float64, requires_grad=True) for n in (5, 6, 6))
    out = module(q, k, v)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("source", [KERNEL_SCALE, PRIVATE_DEFAULT, PRIVATE_NUMBERS],
                         ids=["kernel-scale", "private-default", "private-numbers"])
def test_a_number_factor_is_folded_into_the_query(source):
    new, findings = _rewrite(source)
    assert new != source, [(f.status, f.reason) for f in findings]
    assert "scale=1.0" in new
    expected, expected_grads = _run(source)
    got, grads = _run(new)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    for a, b in zip(expected_grads, grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_the_folded_factor_raises_where_the_original_raises():
    """`scale=None` reaching the manual path: `scores * None` raises, and so must the rewrite (passing
    `scale=None` to the kernel instead would quietly scale by 1/sqrt(d))."""
    new, _ = _rewrite(KERNEL_SCALE)
    for source in (KERNEL_SCALE, new):
        namespace: dict = {}
        exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102
        q = torch.randn(1, 1, 3, 4)
        with pytest.raises(TypeError):
            namespace["attend"](q, q, q)


@pytest.mark.parametrize(("name", "source"), [
    # a public function: callers elsewhere may pass anything
    ("public helper", PRIVATE_NUMBERS.replace("_attend", "attend")),
    # one call passes a tensor: it may vary along the key axis
    ("a call passes a tensor", PRIVATE_NUMBERS.replace("scale=2 ** 0.5 * 2", "scale=torch.rand(6) + 1")),
    # the helper's name is used as a value: calls through it are not seen
    ("helper passed as a value", PRIVATE_NUMBERS.replace("return a + b", "c = list(map(_attend, [q]))\n        return a + b")),
    # the kernel is handed another value than the factor
    ("kernel scale is another value", KERNEL_SCALE.replace("scale=scale)", "scale=None)")),
])
def test_an_unproven_factor_is_a_near_miss(name, source):
    new, findings = _rewrite(source)
    assert new == source
    reasons = [f.reason or "" for f in findings if f.rule_id == "sdpa-attention"]
    assert any("not provably constant" in r for r in reasons), reasons


# vit-pytorch's LSA: a learned temperature built from a constructor argument that `__init__` also
# hands `nn.Linear` as part of a size, so it holds one element (a size is an integer scalar or a
# one-element integer tensor), whatever the caller passed
LSA = HEADER + '''
class Attention(nn.Module):
    def __init__(self, dim=16, heads=2, dim_head=8):
        super().__init__()
        inner_dim = dim_head * heads
        self.temperature = nn.Parameter(torch.log(torch.tensor(dim_head ** -0.5)))
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)

    def forward(self, q, k, v):
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.temperature.exp()
        return torch.matmul(dots.softmax(dim=-1), v)
'''


def test_a_single_element_temperature_is_folded_and_keeps_its_gradient():
    new, findings = _rewrite(LSA)
    assert "q * self.temperature.exp()" in new and "scale=1.0" in new, [(f.status, f.reason) for f in findings]
    runs = []
    for source in (LSA, new):
        namespace: dict = {}
        exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102
        module = namespace["Attention"]().double()
        with torch.no_grad():
            module.temperature.fill_(0.7)  # away from its initial value
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(2, 2, n, 8, generator=gen, dtype=torch.float64, requires_grad=True) for n in (5, 6, 6))
        out = module(q, k, v)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
        runs.append((out.detach(), q.grad, k.grad, v.grad, module.temperature.grad))
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    # and a one-element tensor argument of any rank is folded the same way
    namespace = {}
    exec(compile(new, "<case>", "exec"), namespace)  # noqa: S102
    odd = namespace["Attention"](dim=16, heads=2, dim_head=torch.tensor([[8]]))
    assert odd.temperature.numel() == 1


@pytest.mark.parametrize(("name", "edit"), [
    ("the size does not involve the argument", ("nn.Linear(dim, inner_dim * 3", "nn.Linear(dim, dim * 3")),
    ("the size is handed over on one branch only",
     ("        self.to_qkv = nn.Linear", "        if dim:\n            self.to_qkv = nn.Linear")),
    ("the argument is rebound", ("        inner_dim = dim_head * heads", "        inner_dim = dim_head * heads\n        dim_head = dim_head + 0")),
    ("the size is handed over under a conditional expression",
     ("nn.Linear(dim, inner_dim * 3, bias=False)", "nn.Linear(dim, inner_dim * 3, bias=False) if dim else nn.Identity()")),
    ("the size is handed over in a comprehension",
     ("        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)",
      "        self.to_qkv = nn.ModuleList([nn.Linear(dim, inner_dim * 3) for _ in range(dim)])")),
])
def test_a_temperature_not_proven_single_is_a_near_miss(name, edit):
    source = LSA.replace(*edit)
    assert source != LSA
    new, findings = _rewrite(source)
    assert new == source
    reasons = [f.reason or "" for f in findings if f.rule_id == "sdpa-attention"]
    assert any("not provably constant" in r for r in reasons), reasons
