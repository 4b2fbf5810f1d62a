"""A manual attention (or norm) beside a fused path of its own is `already-fused`, never rewritten."""

from __future__ import annotations

import textwrap

import pytest

from engine.scan import scan_source, select_rules

RULES = select_rules("default")

HEADER = """
import torch
import torch.nn.functional as F
from torch import nn
"""


def _scan(body: str):
    text = HEADER + textwrap.dedent(body)
    findings, new_text = scan_source(text, RULES, "model.py", "model")
    return [f for f in findings if f.rule_id in ("sdpa-attention", "layer-norm")], new_text, text


def _statuses(body: str) -> list[str]:
    return [f.status for f in _scan(body)[0]]


MANUAL = """
            q = q * self.scale
            attn = q @ k.transpose(-2, -1)
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)
            x = attn @ v
"""


# the same statements one level up, beside an `if` rather than inside it
MANUAL_AFTER = textwrap.indent(textwrap.dedent(MANUAL), " " * 8)


def _attention(forward_body: str, extra_methods: str = "") -> str:
    return f"""
class Attention(nn.Module):
    def __init__(self, dim, heads=8, fused=True):
        super().__init__()
        self.scale = (dim // heads) ** -0.5
        self.fused_attn = fused
        self.attn_drop = nn.Dropout(0.0)

    def forward(self, q, k, v):
{textwrap.indent(textwrap.dedent(forward_body), " " * 8)}
        return x
{extra_methods}
"""


def test_manual_branch_beside_the_kernel_is_already_fused():
    findings, new_text, text = _scan(_attention(f"""
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
        else:
{MANUAL}
    """))
    assert [f.status for f in findings] == ["already-fused"]
    assert "line" in findings[0].reason and "scaled_dot_product_attention" in findings[0].reason
    assert new_text == text  # nothing rewritten


def test_without_the_fused_branch_the_same_code_is_rewritten():
    # the control: the manual form alone is an ordinary rewrite
    assert _statuses(_attention(MANUAL)) == ["rewritten"]


def test_early_return_fused_path_counts_as_exclusive():
    body = f"""
        if self.fused_attn:
            return F.scaled_dot_product_attention(q, k, v)
{MANUAL_AFTER}
    """
    assert _statuses(_attention(body)) == ["already-fused"]


def test_a_kernel_call_that_runs_on_the_same_path_is_not_a_fallback():
    # the kernel runs first, then the manual attention runs too (on other tensors): not exclusive
    body = f"""
        y = F.scaled_dot_product_attention(q, k, v)
        q = q + y
{MANUAL_AFTER}
    """
    assert _statuses(_attention(body)) == ["rewritten"]


def test_a_kernel_under_an_if_that_falls_through_is_not_exclusive():
    body = f"""
        if self.fused_attn:
            q = F.scaled_dot_product_attention(q, k, v)
{MANUAL_AFTER}
    """
    assert _statuses(_attention(body)) == ["rewritten"]


def test_kernel_reached_through_a_wrapper_method():
    wrapper = """
    def flash(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)
"""
    body = f"""
        if self.fused_attn:
            x = self.flash(q, k, v)
        else:
{MANUAL}
    """
    assert _statuses(_attention(body, wrapper)) == ["already-fused"]


@pytest.mark.parametrize("spelling, imports", [
    ("flash_attn_func(q, k, v)", "from flash_attn import flash_attn_func\n"),
    ("xops.memory_efficient_attention(q, k, v)", "import xformers.ops as xops\n"),
    ("torch.nn.functional.scaled_dot_product_attention(q, k, v)", ""),
])
def test_library_kernels_and_spellings_of_the_kernel(spelling, imports):
    body = f"""
        if self.fused_attn:
            x = {spelling}
        else:
{MANUAL}
    """
    findings, _, _ = _scan(imports + _attention(body))
    assert [f.status for f in findings] == ["already-fused"]


def test_a_helper_holding_the_manual_form_counts_through_its_call_site():
    # timm's LayerNorm2d: F.layer_norm on one path, a module-level manual helper on the other
    body = """
def _layer_norm_cf(x, weight, bias, eps: float):
    u = x.mean(dim=-1, keepdim=True)
    s = (x - u).pow(2).mean(dim=-1, keepdim=True)
    x = (x - u) / torch.sqrt(s + eps)
    x = x * weight + bias
    return x


class Norm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = 1e-6

    def forward(self, x):
        if x.is_contiguous():
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        return _layer_norm_cf(x, self.weight, self.bias, self.eps)
"""
    plain = body.replace("if x.is_contiguous():\n            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)\n        ", "")
    fused_statuses = _statuses(body)
    plain_statuses = _statuses(plain)
    assert plain_statuses, "control: the manual layer norm helper alone is a finding"
    assert all(s in ("rewritten", "guarded") for s in plain_statuses)
    assert fused_statuses and all(s == "already-fused" for s in fused_statuses)


def test_a_public_module_function_is_no_fallback_through_its_call_sites_here():
    # timm's rms_norm: fast_rms_norm calls it beside F.rms_norm, and RmsNorm (another module) calls
    # it whenever fast norm is off; a private helper counts through its call sites as before
    body = """
def layer_norm_cf(x, weight, bias, eps: float):
    u = x.mean(dim=-1, keepdim=True)
    s = (x - u).pow(2).mean(dim=-1, keepdim=True)
    x = (x - u) / torch.sqrt(s + eps)
    x = x * weight + bias
    return x


def fast_layer_norm(x, weight, bias, eps: float):
    if x.is_contiguous():
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    return layer_norm_cf(x, weight, bias, eps)
"""
    public = _statuses(body)
    private = _statuses(body.replace("layer_norm_cf", "_layer_norm_cf"))
    assert public and all(s in ("rewritten", "guarded") for s in public), public
    assert private and all(s == "already-fused" for s in private), private
