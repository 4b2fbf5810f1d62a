"""Attention whose einsums contract several axes or carry several value axes: the contracted axes,
in the same order on the query and the key, are one feature axis (USES channel attention,
`'bhtcfn,bhtefn->bhce'` sums over t, f and n), and so are a value's trailing axes carried to the
output (SepViT's per-window feature maps, `'b h i j, b h j w d -> b h i w d'`). The kernel gets the
operands permuted and flattened to (batch, heads, rows, features) and its result is unflattened to
the value's sizes and permuted back.

Each module is run original against rewritten in float64 (any difference is semantic), forward and
backward; near-misses must stay as they are."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace as _namespace
from tests.engine.rules.harness import statuses as _scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# espnet2's USES ChannelAttention, reduced: attention across channels C of (B, head, T, C, F, D)
# views, the scores summed over T, F and D, q / T and k / sqrt(F * D), softmax over the key channel.
CHANNEL = """
import torch
import torch.nn as nn


class ChannelAttention(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C, F, N = x.shape
        Q = self.q(x).reshape(B, T, C, F, -1, self.heads).permute(0, 5, 1, 2, 3, 4).contiguous()
        K = self.k(x).reshape(B, T, C, F, -1, self.heads).permute(0, 5, 1, 2, 3, 4).contiguous()
        V = self.v(x).reshape(B, T, C, F, -1, self.heads).permute(0, 5, 1, 2, 3, 4).contiguous()
        emb_dim = V.size(-2) * V.size(-1)
        attn_mat = torch.einsum("bhtcfn,bhtefn->bhce", Q / T, K / emb_dim**0.5)
        attn_mat = nn.functional.softmax(attn_mat, dim={dim})
        V = torch.einsum("bhce,bhtefn->bhtcfn", attn_mat, V)
        return V
"""

# SepViT's window attention, reduced: the window tokens attend to each other and the probabilities
# aggregate each window's (w, d) feature map.
WINDOW = """
import torch
import torch.nn as nn
from einops import einsum


class Window(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.scale = dim ** -0.5
        self.attend = nn.Softmax(dim=-1)

    def forward(self, w_q, w_k, fmaps):
        w_q = w_q * self.scale
        w_dots = einsum(w_q, w_k, 'b h i d, b h j d -> b h i j')
        w_attn = self.attend(w_dots)
        return einsum(w_attn, fmaps, '{value}')
"""


def _einops_einsum(*args):
    """einops.einsum through torch.einsum (einops' names mapped to letters)."""
    *operands, pattern = args
    letters: dict[str, str] = {}

    def spec(side: str) -> str:
        return "".join(letters.setdefault(name, "abcdefghijklmnopqrstuvwxyz"[len(letters)]) for name in side.split())

    lhs, rhs = pattern.split("->")
    return torch.einsum(",".join(spec(p) for p in lhs.split(",")) + "->" + spec(rhs), *operands)


def test_channel_attention_contracting_three_axes_runs_the_kernel_on_flattened_views():
    source = CHANNEL.replace("{dim}", "-1")
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert "(Q / T).transpose(2, 3).flatten(3)" in new and "(K / emb_dim**0.5).transpose(2, 3).flatten(3)" in new
    assert "V.transpose(2, 3).flatten(3)" in new and "scale=1.0" in new
    assert ".unflatten(-1, (V.shape[2], V.shape[4], V.shape[5]))" in new and "einsum" not in new
    torch.manual_seed(0)
    a = _namespace(source)["ChannelAttention"]().double()
    b = _namespace(new)["ChannelAttention"]().double()
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(2, 5, 3, 4, 8, dtype=torch.float64, requires_grad=True)
    ya, yb = a(x), b(x)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12)
    ga, gb = (torch.autograd.grad(y.square().sum(), x)[0] for y in (ya, yb))
    torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-12)


def test_window_attention_over_a_5d_value_flattens_its_feature_axes(monkeypatch):
    source = WINDOW.replace("{value}", "b h i j, b h j w d -> b h i w d")
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert "fmaps.flatten(3)" in new and ".unflatten(-1, fmaps.shape[3:5])" in new and "scale=self.scale" in new
    import sys
    import types
    monkeypatch.setitem(sys.modules, "einops", types.SimpleNamespace(einsum=_einops_einsum))
    a, b = _namespace(source)["Window"](), _namespace(new)["Window"]()
    gen = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    fmaps = torch.randn(2, 3, 5, 7, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    ya, yb = a(q, k, fmaps), b(q, k, fmaps)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12)
    for ga, gb in zip(*(torch.autograd.grad(y.square().sum(), (q, k, fmaps)) for y in (ya, yb)), strict=True):
        torch.testing.assert_close(gb, ga, rtol=1e-10, atol=1e-12)


def test_contracted_axes_in_another_order_on_the_key_are_no_feature_axis():
    # the key's (n, f) against the query's (f, n): flattened they would pair other elements
    source = CHANNEL.replace("{dim}", "-1").replace('"bhtcfn,bhtefn->bhce"', '"bhtcfn,bhtenf->bhce"')
    found, new = _scan(source)
    assert not any(status == "rewritten" for status, _ in found) and new == source


def test_softmax_over_the_query_channel_is_a_near_miss():
    source = CHANNEL.replace("{dim}", "-2")
    found, new = _scan(source)
    assert found == [("near-miss", "softmax dim=-2 of a 4-D tensor is over the query axis, not the key axis")]
    assert new == source


def test_value_axes_not_carried_in_order_are_permuted_back():
    # the output lists the value's (w, d) the other way round: unflattened in the value's order,
    # then the result permuted to the output's
    source = WINDOW.replace("{value}", "b h i j, b h j w d -> b h i d w")
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert ".unflatten(-1,fmaps.shape[3:5]).transpose(3,4)" in "".join(new.split())


def test_a_value_without_a_plain_name_is_not_read_twice():
    # the unflatten's sizes would evaluate the value's expression a second time: not rewritten
    source = CHANNEL.replace("{dim}", "-1").replace("attn_mat, V)", "attn_mat, V.flip(-1))")
    found, new = _scan(source)
    assert found == [("near-miss", "not rewritten: the sizes of the einsum's value axes have no text (the value "
                                   "has no plain name)")]
    assert new == source


def test_a_read_of_the_scores_shape_is_restated_on_the_operand_behind_the_flattened_view():
    # the scores' query axis is the query's axis 3 of 6 (c in bhtcfn), not one of the flattened view
    source = CHANNEL.replace("{dim}", "-1").replace("Q / T, K / emb_dim**0.5", "Q, K").replace(
        "        return V\n", "        n = attn_mat.shape[-2]\n        return V, n\n")
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert "n = Q.shape[-3]" in new
    torch.manual_seed(0)
    a = _namespace(source)["ChannelAttention"]().double()
    b = _namespace(new)["ChannelAttention"]().double()
    b.load_state_dict(a.state_dict(), strict=True)
    x = torch.randn(2, 5, 3, 4, 8, dtype=torch.float64)
    (ya, na), (yb, nb) = a(x), b(x)
    torch.testing.assert_close(yb, ya, rtol=1e-10, atol=1e-12)
    assert na == nb == 3
