"""A shape check of the scores that the attention rewrite removes is moot where it compares them
with what the query and key fix (`if attn.size() != (b * h, n, m): raise`): the kernel's output has
that shape. It is not moot where it also reads the shape of a bias or mask the kernel is handed as
it is (local-attention's cached decoding step, `assert attn_bias.shape[-1] == sim.shape[-1]`): the
kernel broadcasts a mask, so a bias with one key column, which the assert refuses, would pass it
silently. That check stays, the scores' shape read restated on the key."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

GIVEN = '''
import torch
from torch import nn


class Cached(nn.Module):
    def forward(self, q, k, v, attn_bias):
        q = q * (q.shape[-1] ** -0.5)
        sim = torch.einsum('b h i d, b h j d -> b h i j', q, k)
        k_len = k.shape[-2]
        attn_bias = attn_bias[..., -1:, -k_len:]
        assert attn_bias.shape[-1] == sim.shape[-1]
        sim = sim + attn_bias
        attn = sim.softmax(dim=-1)
        return torch.einsum('b h i j, b h j d -> b h i d', attn, v)
'''

# the same check against the key's own length: the kernel's scores always have it
MOOT = '''
import torch
from torch import nn


class Checked(nn.Module):
    def forward(self, q, k, v, attn_bias):
        sim = torch.einsum('b h i d, b h j d -> b h i j', q, k) * 0.5
        if sim.shape[-1] != k.shape[-2]:
            raise ValueError("scores of the wrong length")
        sim = sim + attn_bias
        attn = sim.softmax(dim=-1)
        return torch.einsum('b h i j, b h j d -> b h i d', attn, v)
'''


def test_a_check_of_the_bias_stays_restated_on_the_key():
    findings, new = scan(GIVEN)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "assert attn_bias.shape[-1] == k.shape[-2]" in new
    assert "sim" not in new and "scaled_dot_product_attention" in new
    old_module, new_module = namespace(GIVEN)["Cached"](), namespace(new)["Cached"]()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 1, 4, dtype=torch.float64) for _ in range(3))
    k, v = torch.randn(2, 3, 5, 4, dtype=torch.float64), torch.randn(2, 3, 5, 4, dtype=torch.float64)
    bias = torch.randn(3, 6, 7, dtype=torch.float64)
    torch.testing.assert_close(new_module(q, k, v, bias), old_module(q, k, v, bias))
    # a bias with one key column: the original refuses it, and so does the rewrite (the kernel alone
    # would broadcast it)
    for module in (old_module, new_module):
        with pytest.raises(AssertionError):
            module(q, k, v, bias[..., :1])


def test_a_check_of_the_scores_against_the_key_goes():
    findings, new = scan(MOOT)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "raise ValueError" not in new and "scaled_dot_product_attention" in new
