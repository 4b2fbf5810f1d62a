"""Metadata reads of the scores in code the attention rewrite keeps: a causal mask built from
`i, j = sim.shape[-2:]` and `sim.device`, LSA's `torch.eye(dots.shape[-1], device=dots.device)`.
The rewrite removes the scores and writes those reads on the query and the key (the key's length
is its axis -2 as the code holds it, or -1 for a key stored (..., feature, key)). Each module runs
original against rewritten in float64, rows with every key masked (a single key under LSA's
diagonal mask) included, gradients too."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# vit-pytorch's LSA: a learned 0-d temperature, the diagonal masked with -finfo.max
LSA = '''
import torch
from torch import nn


class LSA(nn.Module):
    def __init__(self, dim=16, heads=2, dim_head=8):
        super().__init__()
        self.heads = heads
        self.temperature = nn.Parameter(torch.log(torch.tensor(dim_head ** -0.5)))
        self.attend = nn.Softmax(dim=-1)
        self.to_qkv = nn.Linear(dim, dim_head * heads * 3, bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.temperature.exp()
        mask = torch.eye(dots.shape[-1], device=dots.device, dtype=torch.bool)
        mask_value = -torch.finfo(dots.dtype).max
        dots = dots.masked_fill(mask, mask_value)
        attn = self.attend(dots)
        return torch.matmul(attn, v)
'''

# a key stored transposed, (..., feature, key): its length is its last axis; queries and keys of
# different lengths (the causal mask's offset `j - i + 1`)
CAUSAL = '''
import torch
from torch import nn


class Causal(nn.Module):
    def forward(self, q, kt, v):
        sim = (q @ kt) * 0.5
        i, j = sim.shape[-2:]
        causal = torch.ones((i, j), device=sim.device, dtype=torch.bool).triu(j - i + 1)
        sim = sim.masked_fill(causal, float("-inf"))
        n = sim.size(-1)
        attn = sim.softmax(dim=-1)
        return attn @ v, n
'''

# the whole shape read: no statement on the query and key says it (the batch axes broadcast)
WHOLE = '''
import torch
from torch import nn


class Whole(nn.Module):
    def forward(self, q, k, v):
        sim = q @ k.transpose(-1, -2)
        shape = sim.shape
        attn = sim.softmax(dim=-1)
        return attn @ v, shape
'''


def _scan(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return findings, new


def _load(source: str, name: str):
    namespace: dict = {}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - test code written in this file
    return namespace[name]


def test_lsa_reads_the_keys_length_and_the_querys_device():
    findings, new = _scan(LSA)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "mask = torch.eye(k.shape[-2], device=q.device, dtype=torch.bool)" in new
    assert "dots" not in new and "mask_value" not in new
    torch.manual_seed(0)
    a = _load(LSA, "LSA")().double()
    b = _load(new, "LSA")().double()
    b.load_state_dict(a.state_dict())
    for n in (1, 2, 5):  # n == 1: the only key is masked, the row is fully masked
        x = torch.randn(3, n, 16, dtype=torch.float64, requires_grad=True)
        y = x.detach().clone().requires_grad_()
        expected, got = a(x), b(y)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
        expected.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(y.grad, x.grad, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(b.temperature.grad, a.temperature.grad, rtol=1e-9, atol=1e-12)
        a.zero_grad()
        b.zero_grad()


def test_a_transposed_key_gives_its_last_axis_and_size_calls_stay_size_calls():
    findings, new = _scan(CAUSAL)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "i, j = q.shape[-2], kt.shape[-1]" in new
    assert "n = kt.size(-1)" in new and "device=q.device" in new
    a, b = _load(CAUSAL, "Causal")(), _load(new, "Causal")()
    for lq, lk in ((4, 4), (3, 5)):
        q = torch.randn(2, 2, lq, 8, dtype=torch.float64)
        kt = torch.randn(2, 2, 8, lk, dtype=torch.float64)
        v = torch.randn(2, 2, lk, 8, dtype=torch.float64)
        (expected, n0), (got, n1) = a(q, kt, v), b(q, kt, v)
        assert n0 == n1 == lk
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)


def test_a_read_of_the_whole_shape_still_escapes():
    findings, new = _scan(WHOLE)
    assert new == WHOLE
    assert [f.status for f in findings] == ["near-miss"]
    assert "escapes" in (findings[0].reason or "")


# BLIP's text attention: the optional mask moved to the scores' device before it is added
MOVED_MASK = '''
import torch
from torch import nn


class Moved(nn.Module):
    def forward(self, q, k, v, attention_mask=None):
        scores = torch.matmul(q, k.transpose(-1, -2)) * 0.25
        if attention_mask is not None:
            scores = scores + attention_mask.to(scores.device)
        return torch.matmul(scores.softmax(dim=-1), v)
'''


def test_an_optional_mask_moved_to_the_scores_device_is_passed_not_guarded():
    findings, new = _scan(MOVED_MASK)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    flat = " ".join(new.split())
    assert "attn_mask=attention_mask.to(q.device) if attention_mask is not None else None" in flat, new
    a, b = _load(MOVED_MASK, "Moved")(), _load(new, "Moved")()
    q, k, v = (torch.randn(2, 2, 4, 8, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, 1, 1, 4, dtype=torch.float64)
    mask[0, ..., -1] = torch.finfo(torch.float64).min
    for m in (None, mask):
        torch.testing.assert_close(b(q, k, v, m), a(q, k, v, m), rtol=1e-10, atol=1e-12)


# DALL-E's and tortoise's attention: an optional padding fill in place, then a causal mask built from
# the filled scores' shape; the fill keeps the scores' shape and device, so the read is the query's
# and the key's lengths as before it
FILLED_THEN_READ = '''
import torch
from torch import nn


class Filled(nn.Module):
    def forward(self, q, k, v, mask=None):
        dots = torch.einsum("b h i d, b h j d -> b h i j", q * 0.5, k)
        mask_value = -torch.finfo(dots.dtype).max
        if mask is not None:
            dots.masked_fill_(~mask[:, None, None, :], mask_value)
        i, j = dots.shape[-2:]
        causal = torch.ones(i, j, device=dots.device).triu_(j - i + 1).bool()
        dots.masked_fill_(causal, mask_value)
        attn = torch.softmax(dots, dim=-1)
        return torch.einsum("b h i j, b h j d -> b h i d", attn, v)
'''


def test_a_read_of_the_scores_after_a_fill_is_restated_like_one_before_it():
    findings, new = _scan(FILLED_THEN_READ)
    assert [f.status for f in findings] in (["rewritten"], ["guarded"]), [(f.status, f.reason) for f in findings]
    # the kernel's branch reads the query's and key's lengths and the query's device, and does not
    # compute the fill value only the original's fills read
    assert "i, j = q.shape[-2], k.shape[-2]" in new and "device=q.device" in new
    assert "finfo(q.dtype)" not in new
    a, b = _load(FILLED_THEN_READ, "Filled")(), _load(new, "Filled")()
    torch.manual_seed(0)
    for lq, lk in ((4, 4), (3, 5)):
        q = torch.randn(2, 2, lq, 8, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, 2, lk, 8, dtype=torch.float64)
        v = torch.randn(2, 2, lk, 8, dtype=torch.float64)
        keep = torch.rand(2, lk) > 0.3
        keep[:, 0] = True
        for mask in (None, keep):
            q2 = q.detach().clone().requires_grad_()
            expected, got = a(q, k, v, mask), b(q2, k, v, mask)
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12)
            expected.sum().backward()
            got.sum().backward()
            torch.testing.assert_close(q2.grad, q.grad, rtol=1e-9, atol=1e-12)
            q.grad = None
