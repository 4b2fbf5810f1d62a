"""Attention whose softmax chooses its own dtype (imagen-pytorch: `sim.softmax(dim=-1,
dtype=torch.float32)`, cast back to the scores' dtype or not). The kernel computes its softmax in
float32 whatever the inputs' dtype and returns the inputs' dtype, so: in float32 the rewrite is the
original's computation; in half precision with the cast back (`attn.to(sim.dtype)`) both round the
float32 probabilities to the inputs' dtype before the product, and agree to that precision; without
the cast back the original multiplies float32 probabilities by a half-precision value, which raises,
so that path computes nothing a rewrite could change."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = '''
import torch
from torch import nn, einsum


class Attention(nn.Module):
    def __init__(self, dim_head=8):
        super().__init__()
        self.scale = dim_head ** -0.5

    def forward(self, q, k, v):
        sim = einsum('b h i d, b h j d -> b h i j', q, k) * self.scale
        attn = sim.softmax(dim=-1, dtype=torch.float32)
        {cast}
        return einsum('b h i j, b h j d -> b h i d', attn, v)
'''

CASTS = {"cast back": "attn = attn.to(sim.dtype)", "no cast back": "pass"}


def _rewritten(cast: str) -> tuple[str, str]:
    source = SOURCE.format(cast=CASTS[cast])
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "scaled_dot_product_attention(" in new, new
    return source, new


def _attention(text: str):
    namespace: dict = {}
    exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    return namespace["Attention"]()


def _qkv(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 3, 5, 8, generator=g).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("cast", sorted(CASTS))
def test_in_float32_the_kernel_computes_the_original(cast):
    source, new = _rewritten(cast)
    q, k, v = _qkv(torch.float32)
    want, got = _attention(source)(q, k, v), _attention(new)(q, k, v)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_in_bfloat16_with_the_cast_back_both_agree_to_its_precision():
    source, new = _rewritten("cast back")
    q, k, v = _qkv(torch.bfloat16)
    want, got = _attention(source)(q, k, v), _attention(new)(q, k, v)
    assert got.dtype == want.dtype == torch.bfloat16
    reference = _attention(source)(*(t.double() for t in (q, k, v)))  # float32 probabilities, then float64
    assert (got.double() - reference).abs().max() <= (want.double() - reference).abs().max() + 2 ** -7


def test_in_bfloat16_without_the_cast_back_the_original_raises():
    source, _ = _rewritten("no cast back")
    q, k, v = _qkv(torch.bfloat16)
    with pytest.raises(RuntimeError):
        _attention(source)(q, k, v)
