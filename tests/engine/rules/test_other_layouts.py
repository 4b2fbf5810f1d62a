"""Attention in other layouts and under flags: the non-local block's channels-first einsums with
their operands given as one tuple (`torch.einsum('nct,ncp->ntp', (theta, phi))`) and its other
instantiation kept under a guard, and a dropout applied only where a flag holds (`if
self.use_dropout: a = self.dropout(a)`), which is the kernel's dropout where the flag holds and none
elsewhere (no guard).

Each module is run original against rewritten in float64 (any difference is semantic), in eval
mode and in train mode where nothing drops; near-misses must stay as they are."""

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

# pytorchvideo's NonLocal, reduced: (N, C, T) features, channels-first einsums of tuple operands, the
# softmax instantiation scaled by dim_inner ** -0.5, the dot-product one divided by the length.
NONLOCAL = (
    HEADER
    + """
class NonLocal(nn.Module):
    def __init__(self, dim=6, inner=4, instantiation="softmax"):
        super().__init__()
        self.conv_theta = nn.Conv1d(dim, inner, 1)
        self.conv_phi = nn.Conv1d(dim, inner, 1)
        self.conv_g = nn.Conv1d(dim, inner, 1)
        self.instantiation = instantiation

    def forward(self, x):
        dim_inner = self.conv_theta.out_channels
        n = x.shape[0]
        theta = self.conv_theta(x).view(n, dim_inner, -1)
        phi = self.conv_phi(x).view(n, dim_inner, -1)
        g = self.conv_g(x).view(n, dim_inner, -1)
        theta_phi = torch.einsum("nct,ncp->ntp", (theta, phi))
        if self.instantiation == "softmax":
            theta_phi = theta_phi * (dim_inner ** -0.5)
            theta_phi = nn.functional.softmax(theta_phi, dim={dim})
        elif self.instantiation == "dot_product":
            spatial_temporal_dim = theta_phi.shape[2]
            theta_phi = theta_phi / spatial_temporal_dim
        return torch.einsum("ntg,ncg->nct", [theta_phi, g])
"""
)

# A dropout module applied under a flag, a dropout module that may be None, a functional dropout
# under a test of its probability.
FLAGGED = (
    HEADER
    + """
class Flagged(nn.Module):
    def __init__(self, use_dropout=False, p=0.0):
        super().__init__()
        self.use_dropout = use_dropout
        self.dropout = nn.Dropout(p)

    def forward(self, q, k, v):
        a = (q @ k.transpose(-2, -1) * 0.125).softmax(dim=-1)
        if self.use_dropout:
            a = self.dropout(a)
        return a @ v


class MaybeNone(nn.Module):
    def __init__(self, p=None):
        super().__init__()
        if p is not None:
            self.dropout = nn.Dropout(p)
        else:
            self.dropout = None

    def forward(self, q, k, v):
        a = (q @ k.transpose(-2, -1) * 0.125).softmax(dim=-1)
        if self.dropout is not None:
            a = self.dropout(a)
        return a @ v


class Functional(nn.Module):
    def __init__(self, p=0.0):
        super().__init__()
        self.p = p

    def forward(self, q, k, v):
        a = (q @ k.transpose(-2, -1) * 0.125).softmax(dim=-1)
        if self.p > 0:
            a = F.dropout(a, self.p)
        return a @ v
"""
)

# The flag is a test of the data itself: the kernel call could not evaluate it again, so the original
# code stays where it holds.
DATA_FLAG = (
    HEADER
    + """
class DataFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = nn.Dropout(0.0)

    def forward(self, q, k, v):
        a = (q @ k.transpose(-2, -1) * 0.125).softmax(dim=-1)
        if a.shape[-1] > 4:
            a = self.dropout(a)
        return a @ v
"""
)


def _scan(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [(f.status, f.reason) for f in findings], new


def _namespace(source: str, name: str) -> dict:
    namespace: dict = {}
    exec(compile(source, name, "exec"), namespace)  # noqa: S102 - sources written in this file
    return namespace


def _pair(source: str, new: str, name: str, *args):
    torch.manual_seed(0)
    a = _namespace(source, "<original>")[name](*args).double()
    b = _namespace(new, "<rewritten>")[name](*args).double()
    b.load_state_dict(a.state_dict(), strict=True)
    return a, b


def _qkv(n=5):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(2, 3, n, 8, generator=gen, dtype=torch.float64) for _ in range(3)]


def test_nonlocal_block_runs_the_kernel_for_its_softmax_instantiation():
    source = NONLOCAL.replace("{dim}", "2")
    found, new = _scan(source)
    assert found == [("guarded", None)]
    assert 'if self.instantiation != "softmax":' in new and "scaled_dot_product_attention(" in new
    assert "theta.transpose(-2, -1)" in new and "g.transpose(-2, -1)" in new
    x = torch.randn(2, 6, 7, dtype=torch.float64)
    for instantiation in ("softmax", "dot_product"):
        a, b = _pair(source, new, "NonLocal", 6, 4, instantiation)
        for mode in (a.eval, a.train):
            mode()
            b.train(a.training)
            torch.testing.assert_close(b(x), a(x), rtol=1e-10, atol=1e-12)


def test_nonlocal_softmax_over_the_query_axis_is_a_near_miss():
    source = NONLOCAL.replace("{dim}", "1")
    found, new = _scan(source)
    assert new == source
    assert [status for status, _ in found] == ["near-miss"] and "query axis" in found[0][1]


def test_dropout_under_a_flag_is_the_kernels_dropout_where_the_flag_holds():
    found, new = _scan(FLAGGED)
    assert found == [("rewritten", None)] * 3
    assert "if not" not in new and new.count("else:") == FLAGGED.count("else:")
    assert "dropout_p=self.dropout.p if self.use_dropout and self.dropout.training else 0.0" in " ".join(
        new.split()
    )
    q, k, v = _qkv()
    for name, args in (
        ("Flagged", (False, 0.5)),
        ("Flagged", (True, 0.0)),
        ("MaybeNone", (None,)),
        ("MaybeNone", (0.0,)),
        ("Functional", (0.0,)),
    ):
        a, b = _pair(FLAGGED, new, name, *args)
        for mode in (a.eval, a.train):
            mode()
            b.train(a.training)
            torch.testing.assert_close(b(q, k, v), a(q, k, v), rtol=1e-10, atol=1e-12)
    # where the flag holds in training mode both drop (two draws differ); in eval mode neither does
    a, b = _pair(FLAGGED, new, "Flagged", True, 0.5)
    b.train()
    assert not torch.equal(b(q, k, v), b(q, k, v))
    b.eval()
    a.eval()
    torch.testing.assert_close(b(q, k, v), a(q, k, v), rtol=1e-10, atol=1e-12)


def test_dropout_under_a_test_of_the_data_is_no_flag():
    """The kernel call cannot test the probabilities again: no conditional dropout_p is written (the
    original must stay where the test holds, which this statement layout does not allow)."""
    found, new = _scan(DATA_FLAG)
    assert new == DATA_FLAG
    assert [status for status, _ in found] == ["near-miss"]


# LoFTR's FullAttention (kornia), with the out-of-place `masked_fill` (the in-place fill is read as a
# new value elsewhere): heads on the last axis, scores (N, L, S, H), a -inf fill of the query x key
# padding mask, softmax over the key axis (dim=2) of the scaled scores, optional dropout.
LOFTR = (
    HEADER
    + """
class FullAttention(nn.Module):
    def __init__(self, use_dropout=False, attention_dropout=0.1):
        super().__init__()
        self.use_dropout = use_dropout
        self.dropout = nn.Dropout(attention_dropout)

    def forward(self, queries, keys, values, q_mask=None, kv_mask=None):
        QK = torch.einsum("nlhd,nshd->nlsh", queries, keys)
        if kv_mask is not None and q_mask is not None:
            QK = QK.masked_fill(~(q_mask[:, :, None, None] * kv_mask[:, None, :, None]), {fill})
        softmax_temp = {temp}
        A = F.softmax(softmax_temp * QK, dim={dim})
        if self.use_dropout:
            A = self.dropout(A)
        queried_values = torch.einsum("nlsh,nshd->nlhd", A, values)
        return queried_values.contiguous()
"""
)


def _loftr(fill='float("-inf")', temp="1.0 / queries.size(3) ** 0.5", dim="2") -> str:
    return LOFTR.replace("{fill}", fill).replace("{temp}", temp).replace("{dim}", dim)


def test_heads_last_scores_are_permuted_to_the_kernels_layout_and_back():
    source = _loftr()
    found, new = _scan(source)
    assert found == [("guarded", None)]
    assert "queries.transpose(1, 2)" in new and ".movedim(-1, -3)" in new and "scale=softmax_temp" in new
    gen = torch.Generator().manual_seed(2)
    n, length, s, h, d = 2, 5, 6, 3, 4
    q = torch.randn(n, length, h, d, generator=gen, dtype=torch.float64)
    k = torch.randn(n, s, h, d, generator=gen, dtype=torch.float64)
    v = torch.randn(n, s, h, d, generator=gen, dtype=torch.float64)
    q_mask = torch.ones(n, length, dtype=torch.bool)
    kv_mask = torch.ones(n, s, dtype=torch.bool)
    q_mask[0, -2:] = False  # padded queries: fully masked rows (NaN in the original)
    kv_mask[0, -1] = False
    kv_mask[1, :] = False  # a sample with no key at all: every row fully masked
    for args in ((False, 0.5), (True, 0.0)):
        a, b = _pair(source, new, "FullAttention", *args)
        for mode in (a.eval, a.train):
            mode()
            b.train(a.training)
            for masks in ((), (q_mask, kv_mask), (q_mask, torch.ones_like(kv_mask))):
                expected = a(q, k, v, *masks)
                got = b(q, k, v, *masks)
                assert got.shape == expected.shape == (n, length, h, d)
                torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12, equal_nan=True)
            assert torch.isnan(a(q, k, v, q_mask, kv_mask)[1]).all()
    # gradients where no row is fully masked
    a, b = _pair(source, new, "FullAttention")
    qa, qb = q.clone().requires_grad_(), q.clone().requires_grad_()
    kv_some = torch.ones(n, s, dtype=torch.bool)
    kv_some[:, 0] = False
    ones = torch.ones(n, length, dtype=torch.bool)
    a(qa, k, v, ones, kv_some).sum().backward()
    b(qb, k, v, ones, kv_some).sum().backward()
    torch.testing.assert_close(qb.grad, qa.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"dim": "1"}, "query axis"),  # softmax over the queries
        ({"dim": "3"}, "key axis"),  # over the heads: the scores' key axis is not the softmax axis
    ],
)
def test_permuted_scores_near_misses(change, reason):
    source = _loftr(**change).replace(
        "        self.use_dropout = use_dropout\n",
        "        self.use_dropout = use_dropout\n        self.temperature = -1.0\n",
    )
    found, new = _scan(source)
    assert new == source
    assert any(status == "near-miss" and reason in (text or "") for status, text in found), found


def test_probabilities_not_permuted_back_are_a_near_miss():
    source = _loftr().replace('"nlsh,nshd->nlhd", A, values', '"nslh,nshd->nlhd", A, values')
    found, new = _scan(source)
    assert new == source


def test_a_factor_after_an_additive_mask_is_a_near_miss():
    """`(s + m) * f` scales the mask too; the kernel computes `s * f + m`."""
    source = HEADER + (
        "\n\nclass Attention(nn.Module):\n"
        "    def forward(self, q, k, v, m):\n"
        "        s = (q @ k.transpose(-2, -1) + m).masked_fill(m > 0, float('-inf')) * 0.125\n"
        "        return s.softmax(dim=-1) @ v\n"
    )
    found, new = _scan(source)
    assert new == source
    assert [status for status, _ in found] == ["near-miss"] and "additive mask" in found[0][1]


@pytest.mark.parametrize("change", [{"fill": "-1e9"}, {"temp": "self.temperature"}])
def test_a_fill_scaled_afterwards_keeps_the_original_where_it_fills(change):
    """`-1e9 * temp` may no longer drop the keys, `-inf * temp` of a factor of unknown sign may be
    +inf: the masked path keeps the original code (the kernel runs only where no mask is given)."""
    source = _loftr(**change).replace(
        "        self.use_dropout = use_dropout\n",
        "        self.use_dropout = use_dropout\n        self.temperature = -1.0\n",
    )
    found, new = _scan(source)
    assert found == [("guarded", None)]
    assert "movedim" not in new and "attn_mask" not in new
    assert "if kv_mask is not None and q_mask is not None:" in new and "QK.masked_fill(" in new
    q, k, v = (torch.randn(2, 5, 3, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[0, -1] = False
    a, b = _pair(source, new, "FullAttention")
    a.eval()
    b.eval()
    for masks in ((), (mask, mask)):
        torch.testing.assert_close(
            b(q, k, v, *masks), a(q, k, v, *masks), rtol=1e-10, atol=1e-12, equal_nan=True
        )


# recbole's MCCLK user aggregation, reduced: a 2-D query against a key written `relation_emb.t()`.
STORED_KEY = (
    HEADER
    + """
class Aggregate(nn.Module):
    def forward(self, user_emb, relation_emb, user_agg):
        score = torch.mm(user_emb, relation_emb.t())
        score = torch.softmax(score, dim=-1)
        return user_agg + torch.mm(score, relation_emb) * user_agg
"""
)


def test_a_key_written_transposed_is_passed_as_it_was_stored():
    """The kernel transposes its key itself: `relation_emb.t()` (or `.transpose(-2, -1)`) is handed
    over as `relation_emb`, not as `relation_emb.t().transpose(-2, -1)`. `torch.mm` proves every
    operand 2-D, so the kernel gets them with a batch and a head axis (the layout its fused
    implementations take) and its output is read back without them."""
    findings, text = scan_source(STORED_KEY, select_rules("sdpa-attention"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [f.reason for f in findings]
    assert ("scaled_dot_product_attention(user_emb[None,None],relation_emb[None,None],relation_emb[None,None],"
            "scale=1.0,)[0,0]") in "".join(text.split())
    assert ".t()" not in text
    namespace: dict = {}
    exec(compile(STORED_KEY, "old.py", "exec"), namespace)
    old = namespace["Aggregate"]()
    exec(compile(text, "new.py", "exec"), namespace)
    new = namespace["Aggregate"]()
    u, r, a = (torch.randn(5, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64),
               torch.randn(5, 4, dtype=torch.float64))
    torch.testing.assert_close(new(u, r, a), old(u, r, a))
