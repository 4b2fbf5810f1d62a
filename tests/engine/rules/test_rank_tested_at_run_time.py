"""Attention that reads the axes of values of unproven rank by non-negative indices that state one rank
twice: coqui-tts's GST attention (`keys.transpose(2, 3)` and `softmax(dim=3)` of heads stacked from a
public module's inputs). Those indices are the last axes where the query and key are 4-D: the rewrite
tests that at run time and keeps the original code where it fails (`if keys.dim() != 4 or
queries.dim() != 4:`). Each tested value must be held by a name from before the rewritten statements
to the kernel call. Original against rewritten in float64, forward and gradients, the kernel required
to run; near-misses stay as they are (torchvision's MViT, `k.transpose(2, 3)` of a key pooled by a
submodule of any type with `softmax(dim=-1)`, which holds for any rank: the transpose alone states
none)."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

# coqui-tts's GST MultiHeadAttention: heads stacked on a new leading axis
GST = HEADER + '''
class MultiHeadAttention(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.key_dim = dim
        self.W_key = nn.Linear(dim, dim, bias=False)

    def forward(self, query, key):
        split_size = query.size(-1) // self.heads
        keys = self.W_key(key)
        queries = torch.stack(torch.split(query, split_size, dim=2), dim=0)
        keys = torch.stack(torch.split(keys, split_size, dim=2), dim=0)
        values = torch.stack(torch.split(key, split_size, dim=2), dim=0)
        scores = torch.matmul(queries, {keys}.transpose(2, 3))
        scores = scores / (self.key_dim**0.5){between}
        scores = F.softmax(scores, dim={dim})
        out = torch.matmul(scores, values)
        return torch.cat(torch.split(out, 1, dim=0), dim=3).squeeze(0)
'''

# torchvision's MViT: the key through a submodule the constructor is given (any module)
MVIT = HEADER + '''
class MultiscaleAttention(nn.Module):
    def __init__(self, pool_k):
        super().__init__()
        self.scaler = 0.5
        self.pool_k = pool_k

    def forward(self, q, k, v):
        k = self.pool_k(k)
        attn = torch.matmul(self.scaler * q, k.transpose(2, 3))
        attn = attn.softmax(dim={dim})
        return torch.matmul(attn, v)
'''


def _counting(monkeypatch) -> list:
    calls: list = []
    kernel = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)
    return calls


def _compare(source: str, new: str, name: str, build, inputs) -> None:
    outs, grads = [], []
    for text in (source, new):
        torch.manual_seed(0)  # the same weights
        module = build(namespace(text)[name]).double()
        xs = [x.detach().clone().requires_grad_(True) for x in inputs]
        out = module(*xs)
        out.sum().backward()
        outs.append(out)
        grads.append([x.grad for x in xs])
    torch.testing.assert_close(outs[1], outs[0])
    for a, b in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(a, b)


def test_gst_attention_runs_the_kernel_where_query_and_key_are_4d(monkeypatch):
    source = GST.format(keys="keys", between="", dim=3)
    found, new = statuses(source)
    assert found == [("guarded", None)], found
    assert "if keys.dim() != 4 or queries.dim() != 4:" in new
    assert "queries, keys, values, scale=1 / self.key_dim**0.5" in " ".join(new.split())
    calls = _counting(monkeypatch)
    g = torch.Generator().manual_seed(0)
    query = torch.randn(3, 1, 8, generator=g, dtype=torch.float64)
    key = torch.randn(3, 5, 8, generator=g, dtype=torch.float64)
    _compare(source, new, "MultiHeadAttention", lambda cls: cls(), [query, key])
    assert calls, "the kernel did not run"


def test_a_softmax_over_the_stated_last_axis_tests_the_pooled_keys_rank(monkeypatch):
    source = MVIT.format(dim=3)
    found, new = statuses(source)
    assert found == [("guarded", None)], found
    assert "if k.dim() != 4 or q.dim() != 4:" in new
    calls = _counting(monkeypatch)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    _compare(source, new, "MultiscaleAttention", lambda cls: cls(torch.nn.Identity()), [q, k, v])
    assert calls, "the kernel did not run"


NEAR_MISSES = {
    # `softmax(dim=-1)` holds for any rank: nothing but the transpose says the key is 4-D
    "a transpose alone stating the rank": MVIT.format(dim=-1),
    # the transposed key has no name a test could read (a submodule's result in the product)
    "a key of no name": GST.format(keys="self.W_key(keys)", between="", dim=3),
    # with a 4-D query and key, axis 2 of the scores is the query axis
    "a softmax over the query axis": GST.format(keys="keys", between="", dim=2),
    # a bias of unknown rank added before the softmax may broadcast the scores to more axes: dim=3
    # is then not provably their last
    "a bias that may add axes": GST.format(keys="keys", between="\n        scores = scores + self.bias", dim=3)
    .replace("        self.W_key = ", "        self.bias = nn.Parameter(torch.zeros(1, 1, 1, 1, 1))\n        self.W_key = "),
}


@pytest.mark.parametrize("source", NEAR_MISSES.values(), ids=NEAR_MISSES.keys())
def test_near_misses_are_not_rewritten(source):
    found, new = statuses(source)
    assert new == source, found
    assert found and all(status == "near-miss" for status, _ in found), found
