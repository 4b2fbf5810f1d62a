"""Kernel eligibility: the fused attention kernels take 4-D operands only (a 3-D or 5-D call runs the
math path, which cannot pay), so the rewrite of 3-D `(batch * heads, n, d)` attention (the fairseq
`bmm` style of BART, Whisper, Marian, M2M100) gives the kernel `q.unsqueeze(0)` ... and reads its
result `.squeeze(0)`, a 3-D mask `.unsqueeze(0)` too; 5-D attention whose query, key and value share
their two leading axes gets them flattened (`q.flatten(0, 1)`) and the result unflattened.

Each module is run original against rewritten in float64 (any difference is semantic), and the
rewritten call must succeed with only the FlashAttention backend enabled (the CPU build of torch has
a flash kernel for every floating dtype; with no other backend allowed, a call it refuses raises)."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")
attention = pytest.importorskip("torch.nn.attention")

pytestmark = pytest.mark.torch

HEADER = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

# BART's attention, reduced: projections viewed to (bsz * heads, n, head_dim), `torch.bmm`, an
# optional additive mask of any rank the 3-D scores broadcast with, and the head mask that keeps the
# original path (the rewrite is guarded by `layer_head_mask is not None`).
FAIRSEQ = HEADER + '''
class FlatAttention(nn.Module):
    def __init__(self, dim=16, heads=2, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scaling = self.head_dim ** -0.5
        self.dropout = dropout
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)

    def forward(self, x, attn_mask=None, layer_head_mask=None):
        bsz, n, _ = x.shape
        proj_shape = (bsz * self.heads, -1, self.head_dim)
        q = (self.q_proj(x) * self.scaling).view(bsz, n, self.heads, self.head_dim).transpose(1, 2).reshape(*proj_shape)
        k = self.k_proj(x).view(bsz, n, self.heads, self.head_dim).transpose(1, 2).reshape(*proj_shape)
        v = self.v_proj(x).view(bsz, n, self.heads, self.head_dim).transpose(1, 2).reshape(*proj_shape)
        w = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            w = w + attn_mask
        w = F.softmax(w, dim=-1)
        if layer_head_mask is not None:
            w = layer_head_mask.view(1, -1, 1, 1) * w.view(bsz, self.heads, n, n)
            w = w.view(bsz * self.heads, n, n)
        p = F.dropout(w, p=self.dropout, training=self.training)
        out = torch.bmm(p, v)
        return out.view(bsz, self.heads, n, self.head_dim).transpose(1, 2).reshape(bsz, n, -1)
'''

# The key padding mask built 3-D in the method (its rank proven), as a `masked_fill` of the 3-D
# scores: the kernel's mask gains the leading axis of 1 with the operands.
PADDED = HEADER + '''
class PaddedAttention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x, key_padding_mask):
        bsz, n, _ = x.shape
        q, k, v = self.qkv(x).view(bsz, n, 3 * self.heads, self.head_dim).transpose(1, 2).chunk(3, dim=1)
        q = q.reshape(bsz * self.heads, n, self.head_dim)
        k = k.reshape(bsz * self.heads, n, self.head_dim)
        v = v.reshape(bsz * self.heads, n, self.head_dim)
        pad = key_padding_mask[:, None, None, :].expand(bsz, self.heads, 1, n).reshape(bsz * self.heads, 1, n)
        w = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.head_dim)
        w = w.masked_fill(pad, -1e9)
        w = F.softmax(w, dim=-1)
        return torch.bmm(w, v)
'''

# Attention over groups (windows, frames): (batch, groups, heads, n, d), the query, key and value
# unbound from one tensor, so they share the two leading axes.
GROUPED = HEADER + '''
class GroupedAttention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)

    def forward(self, x):
        B, G, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, G, N, 3, self.heads, C // self.heads).permute(3, 0, 1, 4, 2, 5).unbind(0)
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        out = attn @ v
        return out.transpose(2, 3).reshape(B, G, N, C)
'''

# The same 5-D attention, but the key and value are separate inputs: nothing proves their leading
# axes are the query's (they may broadcast), so no flatten is emitted.
GROUPED_INPUTS = HEADER + '''
class GroupedInputs(nn.Module):
    def forward(self, q, k, v):
        attn = (q @ k.transpose(-2, -1)) * 0.25
        attn = attn.softmax(dim=-1)
        return attn @ v
'''


def _rewrite(source: str) -> str:
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    assert new != source, [(f.status, f.reason) for f in findings]
    return new


def _modules(source: str, new: str, name: str):
    original, rewritten = {}, {}
    exec(compile(source, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    torch.manual_seed(0)
    a = original[name]().double().eval()
    b = rewritten[name]().double().eval()
    b.load_state_dict(a.state_dict(), strict=True)
    return a, b


def _flash_only(module, *inputs):
    with attention.sdpa_kernel([attention.SDPBackend.FLASH_ATTENTION]), torch.no_grad():
        return module(*inputs)


def test_fairseq_3d_attention_gets_4d_views():
    new = _rewrite(FAIRSEQ)
    assert "q.unsqueeze(0)" in new and "k.unsqueeze(0)" in new and "v.unsqueeze(0)" in new
    assert ").squeeze(0)" in new
    assert "attn_mask=attn_mask," in new  # of unproven rank: passed as written (2-D or 3-D alike)
    a, b = _modules(FAIRSEQ, new, "FlatAttention")
    bsz, heads, n = 3, 2, 5
    x = torch.randn(bsz, n, 16, dtype=torch.float64)
    padding = torch.zeros(bsz * heads, n, n, dtype=torch.float64)
    padding[:heads, :, -2:] = torch.finfo(torch.float64).min  # the first sample's last two keys padded
    causal = torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
    head_mask = torch.tensor([1.0, 0.5], dtype=torch.float64)
    for mask, heads_mask in ((None, None), (padding, None), (causal, None), (causal, head_mask)):
        x.grad = None
        expected = a(x, mask, heads_mask)
        got = b(x, mask, heads_mask)
        assert got.dtype == torch.float64 and got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    # gradients too (the kernel path: no head mask)
    xa = x.clone().requires_grad_()
    xb = x.clone().requires_grad_()
    a(xa, causal).sum().backward()
    b(xb, causal).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-10, atol=1e-12)
    # the fused kernel takes the rewritten call (a 2-D mask as it is), the original's 3-D call it refuses
    x32 = x.float()
    b32 = b.float()
    _flash_only(b32, x32, causal.float())
    _flash_only(b32, x32)
    q = torch.randn(bsz * heads, n, 8)
    with pytest.raises(RuntimeError):
        _flash_only(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))


def test_proven_3d_mask_gains_the_leading_axis_too():
    new = _rewrite(PADDED)
    assert ".unsqueeze(0)," in new and "attn_mask=(~pad | pad.all(-1, keepdim=True)).unsqueeze(0)" in new
    a, b = _modules(PADDED, new, "PaddedAttention")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, -2:] = True
    pad[1, :] = True  # a fully padded sample: every row fully masked (the original averages v there)
    torch.testing.assert_close(b(x, pad), a(x, pad), rtol=1e-10, atol=1e-12)
    out = _flash_only(b.float(), x.float(), pad)
    torch.testing.assert_close(out.double(), a(x, pad), rtol=1e-4, atol=1e-5)


def test_5d_attention_is_flattened_where_the_leading_axes_are_shared():
    new = _rewrite(GROUPED)
    assert "q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)" in new and ".unflatten(0, q.shape[:2])" in new
    a, b = _modules(GROUPED, new, "GroupedAttention")
    x = torch.randn(2, 3, 5, 16, dtype=torch.float64)
    got = b(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, a(x), rtol=1e-10, atol=1e-12)
    _flash_only(b.float(), x.float())
    bf16 = _flash_only(b.bfloat16(), x.bfloat16())
    assert bf16.dtype == torch.bfloat16


def test_5d_attention_without_shared_leading_axes_is_not_flattened():
    """A near-miss of the flatten: the rewrite stays (the math path computes it correctly) and
    verification, whose eligibility check the kernel's 5-D call fails, decides."""
    new = _rewrite(GROUPED_INPUTS)
    assert "flatten" not in new and "unsqueeze" not in new


# BART's mask add: the 3-D scores viewed (bsz, heads, tgt, src), the 4-D mask added, viewed back;
# the mask only when given (the kernel takes it as None otherwise)
BART_MASKED = HEADER + '''
class BartLike(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.num_heads = heads
        self.head_dim = dim // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)

    def forward(self, x, attention_mask=None):
        bsz, tgt_len, _ = x.shape
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        q = (self.q_proj(x) * self.scaling).view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2)
        q = q.reshape(*proj_shape)
        k = self.k_proj(x).view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2).reshape(*proj_shape)
        v = self.v_proj(x).view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2).reshape(*proj_shape)
        src_len = k.size(1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attention_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_weights = F.softmax(attn_weights, dim=-1)
        out = torch.bmm(attn_weights, v)
        return out.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2).reshape(bsz, tgt_len, -1)
'''


def test_a_mask_added_through_a_view_round_trip_gives_the_kernel_4d_views():
    findings, new = scan_source(BART_MASKED, select_rules("sdpa-attention"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "q.unflatten(0, (bsz, self.num_heads))" in new and "attn_mask=attention_mask" in new
    assert ").flatten(0, 1)" in new and "attn_weights" not in new
    a, b = _modules(BART_MASKED, new, "BartLike")
    bsz, n = 3, 5
    x = torch.randn(bsz, n, 16, dtype=torch.float64)
    lowest = torch.finfo(torch.float64).min
    padding = torch.zeros(bsz, 1, n, n, dtype=torch.float64)
    padding[0, :, :, -2:] = lowest
    padding[1] = lowest  # a sample with every key masked: both average v
    causal = torch.full((n, n), lowest, dtype=torch.float64).triu(1)[None, None].expand(bsz, 1, n, n)
    for mask in (None, padding, causal + padding):
        torch.testing.assert_close(b(x, mask), a(x, mask), rtol=1e-10, atol=1e-12)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a(xa, causal).sum().backward()
    b(xb, causal).sum().backward()
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-10, atol=1e-12)
    _flash_only(b.float(), x.float(), causal.float())
    _flash_only(b.float(), x.float())


def test_a_view_that_does_not_merge_back_keeps_the_original_where_the_mask_is_added():
    broken = BART_MASKED.replace("attn_weights.view(bsz * self.num_heads, tgt_len, src_len)",
                                 "attn_weights.view(bsz, self.num_heads * tgt_len, src_len)")
    findings, new = scan_source(broken, select_rules("sdpa-attention"), "case.py", "case")
    # the views are no round trip: the match without them runs the kernel only where no mask is added
    assert [(f.status, f.guard_text) for f in findings] == [("guarded", "attention_mask is not None")]
    assert "unflatten" not in new


# recbole's MCCLK-style attention: 2-D (items, feature) queries and keys, the key stored as is and
# transposed with `.t()` (an additive mask of unproven rank would leave the scores' rank unproven)
TWO_D = HEADER + '''

class ItemAttention(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)

    def forward(self, x, y):
        q = self.q(x.view(-1, 16))
        k = self.k(y.view(-1, 16))
        scores = torch.matmul(q, k.t()) / math.sqrt(16)
        attn = torch.softmax(scores, dim=-1)
        return torch.matmul(attn, y.view(-1, 16))
'''


def test_2d_attention_gets_a_batch_and_a_head_axis():
    new = _rewrite(TWO_D)
    assert "q[None, None]" in new and "k[None, None]" in new and ")[0, 0]" in new
    a, b = _modules(TWO_D, new, "ItemAttention")
    x = torch.randn(5, 16, dtype=torch.float64, requires_grad=True)
    y = torch.randn(7, 16, dtype=torch.float64, requires_grad=True)
    expected, got = a(x, y), b(x, y)
    assert got.shape == expected.shape == (5, 16)
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
    ga = torch.autograd.grad(expected.sum(), (x, y))
    gb = torch.autograd.grad(got.sum(), (x, y))
    for left, right in zip(gb, ga, strict=True):
        torch.testing.assert_close(left, right, rtol=1e-10, atol=1e-12)
    _flash_only(b.float(), x.detach().float(), y.detach().float())
