"""Scores scaled after an additive mask: `softmax((q @ k^T + m) * c) == softmax(q @ k^T * c + m * c)`,
so the kernel takes the mask times the factor and the factor as its scale (tsai's ConvTranPlus
relative attention, `(attn + Srel) * self.scale`). Where the mask is added on some paths only, the
kernel runs on those (a guarded rewrite); where a fill sits between the mask and the factor, the
site stays a near-miss.

Each module is run original against rewritten in float64 (any difference is semantic), forward
and backward."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace as _namespace
from tests.engine.rules.harness import statuses as _scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# tsai's Attention_Rel_Vec, reduced: the key laid out (b, h, d, n), a relative bias from q, the sum
# scaled, softmax, @ v
REL_VEC = """
import torch
import torch.nn as nn


class RelVec(nn.Module):
    def __init__(self, dim=8, heads=2, seq_len=5):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.query = nn.Linear(dim, dim)
        self.Er = nn.Parameter(torch.randn(seq_len, dim // heads))

    def forward(self, x):
        b, n, _ = x.shape
        k = self.key(x).reshape(b, n, self.heads, -1).permute(0, 2, 3, 1)
        v = self.value(x).reshape(b, n, self.heads, -1).transpose(1, 2)
        q = self.query(x).reshape(b, n, self.heads, -1).transpose(1, 2)
        rel = torch.matmul(q, self.Er.transpose(0, 1))
        attn = torch.matmul(q, k)
        attn = {scaled}
        attn = nn.functional.softmax(attn, dim=-1)
        return torch.matmul(attn, v)
"""


def _same(source: str, new: str) -> None:
    torch.manual_seed(0)
    a = _namespace(source)["RelVec"]().double()
    b = _namespace(new)["RelVec"]().double()
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    ya, yb = a(x), b(x)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12)
    ga, gb = (torch.autograd.grad(y.square().sum(), x)[0] for y in (ya, yb))
    torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scaled", ["(attn + rel) * self.scale", "self.scale * (attn + rel)"])
def test_a_mask_added_before_the_scale_passes_scaled(scaled):
    source = REL_VEC.replace("{scaled}", scaled)
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert "attn_mask=rel * self.scale" in new and "scale=self.scale" in new and "k.transpose(-2, -1)" in new
    _same(source, new)


def test_a_mask_added_on_some_paths_only_runs_the_kernel_where_it_is_added():
    source = REL_VEC.replace("attn = {scaled}", "if n > 1:\n            attn = attn + rel\n"
                             "        attn = attn * self.scale")
    found, new = _scan(source)
    assert found == [("guarded", None)]
    assert "if not n > 1:" in new and "attn_mask=rel * self.scale" in new
    for n in (5, 1):  # the kernel's path and the original's
        torch.manual_seed(0)
        a = _namespace(source)["RelVec"](seq_len=n).double()
        b = _namespace(new)["RelVec"](seq_len=n).double()
        b.load_state_dict(a.state_dict(), strict=True)
        x = torch.randn(3, n, 8, dtype=torch.float64)
        torch.testing.assert_close(b(x), a(x), rtol=1e-10, atol=1e-12)


def test_a_finite_fill_between_the_mask_and_the_scale_stays():
    source = REL_VEC.replace("attn = {scaled}", "attn = (attn + rel).masked_fill(rel > 0, -1e9) * self.scale")
    found, new = _scan(source)
    assert [status for status, _ in found] == ["near-miss"] and new == source


# timm's HaloAttn, reduced: the bias is scaled with the scores on one branch, added after the scale on
# the other; both are a kernel call, and the one the default settings take is the one rewritten
HALO = """
import torch
import torch.nn as nn


class Halo(nn.Module):
    def __init__(self, dim=8, scale_pos_embed=False):
        super().__init__()
        self.scale = dim ** -0.5
        self.scale_pos_embed = scale_pos_embed
        self.pos_embed = nn.Linear(dim, 5)

    def forward(self, q, k, v):
        if self.scale_pos_embed:
            attn = (q @ k.transpose(-1, -2) + self.pos_embed(q)) * self.scale
        else:
            attn = (q @ k.transpose(-1, -2)) * self.scale + self.pos_embed(q)
        attn = attn.softmax(dim=-1)
        return attn @ v
"""


def test_of_two_branch_readings_the_one_the_defaults_take_is_rewritten(tmp_path):
    from engine.scan import scan_path

    (tmp_path / "halo.py").write_text(HALO)
    result = scan_path(tmp_path, rules="default")
    (finding,) = [f for f in result.findings if f.rule_id == "sdpa-attention"]
    assert (finding.status, finding.guard_text) == ("guarded", "self.scale_pos_embed")
    new = result.files["halo.py"]
    assert "attn_mask=self.pos_embed(q), scale=self.scale" in new.replace("\n", " ").replace("  ", "")
    for flag in (False, True):  # the kernel's path and the original's
        torch.manual_seed(0)
        a = _namespace(HALO)["Halo"](scale_pos_embed=flag).double()
        b = _namespace(new)["Halo"](scale_pos_embed=flag).double()
        b.load_state_dict(a.state_dict(), strict=True)
        q, k, v = (torch.randn(2, 2, 5, 8, dtype=torch.float64) for _ in range(3))
        torch.testing.assert_close(b(q, k, v), a(q, k, v), rtol=1e-10, atol=1e-12)


# stanza's Music-Transformer relative attention, reduced: the sum scaled, then the causal fill
CAUSAL = REL_VEC.replace("        attn = nn.functional.softmax", "        attn = attn.masked_fill({fill})\n"
                         "        attn = nn.functional.softmax")


@pytest.mark.parametrize("scaled", ["(attn + rel) / (q.size(-1) ** 0.5)", "(attn + rel) * self.scale",
                                    "-self.scale * (attn + rel)"])
@pytest.mark.parametrize("fill", ["torch.ones(n, n).tril() == 0, float('-inf')",
                                  "torch.ones(n, n).tril() == 0, -1e9"])
def test_a_mask_scaled_before_the_fill_passes_scaled(scaled, fill):
    # the fill comes after both the mask and the factor: any factor, any fill
    source = CAUSAL.replace("{scaled}", scaled).replace("{fill}", fill)
    found, new = _scan(source)
    assert found == [("rewritten", None)], found
    assert "rel * " in new and "k.transpose(-2, -1)" in new
    _same(source, new)


def test_a_mask_added_on_some_paths_only_before_the_scale_and_fill_runs_the_kernel_where_it_is_added():
    source = CAUSAL.replace("attn = {scaled}", "if n > 1:\n            attn = attn + rel\n"
                            "        attn = attn * self.scale").replace("{fill}", "torch.ones(n, n).tril() == 0, -1e9")
    found, new = _scan(source)
    assert found == [("guarded", None)] and "if not n > 1:" in new and "rel * self.scale" in new
    for n in (5, 1):
        torch.manual_seed(0)
        a = _namespace(source)["RelVec"](seq_len=n).double()
        b = _namespace(new)["RelVec"](seq_len=n).double()
        b.load_state_dict(a.state_dict(), strict=True)
        x = torch.randn(3, n, 8, dtype=torch.float64)
        torch.testing.assert_close(b(x), a(x), rtol=1e-10, atol=1e-12)


# the look-alike of the step above: the same scale with no mask added before it (dalle-pytorch's
# Attention, reduced). It is the product's own scale: read as one after a mask, the fill value the
# helper computes from the scores' dtype would escape the match (the product's dtype is the query's;
# a sum with a mask may have another)
PLAIN = """
import torch
import torch.nn as nn


def max_neg_value(t):
    return -torch.finfo(t.dtype).max


class Plain(nn.Module):
    def forward(self, q, k, v, mask):
        dots = torch.einsum('b h i d, b h j d -> b h i j', q, k) * 0.125
        mask_value = max_neg_value(dots)
        dots.masked_fill_(~mask[:, None, None, :], mask_value)
        attn = dots.softmax(dim=-1)
        return torch.einsum('b h i j, b h j d -> b h i d', attn, v)
"""


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_a_scale_with_no_mask_before_it_is_the_products_own(train):
    from tests.engine.rules.harness import scan

    findings, new = scan(PLAIN)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "s2s" not in findings[0].match.nodes and "factorm" not in findings[0].match.bindings
    assert "max_neg_value(dots)" not in new and "scale=0.125" in new, new  # the call only fed the fill
    results = []
    for text in (PLAIN, new):
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(3, 2, n, 8, generator=gen, dtype=torch.float64, requires_grad=True) for n in (5, 6, 6))
        mask = torch.ones(3, 6, dtype=torch.bool)
        mask[0, -2:] = False
        mask[1] = False  # every key of a sample masked: the original averages v there
        module = _namespace(text)["Plain"]().train(train)
        out = module(q, k, v, mask)
        results.append((out.detach(), *torch.autograd.grad(out.square().sum(), (q, k, v))))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
