"""One-query and key-major attention in the layouts the wild code holds it (the forms of parlai's
memory hop, stanza's tree stack and recbole's RippleNet), read by meaning: a `torch.bmm` operand is
3-D wherever the product runs (so `bmm(q.unsqueeze(1), m).squeeze(1)` is one query's row), a query
reshaped to a column (..., d, 1) is its row transposed, a module's state computed at run time is a
value, and scores laid out key-major, `softmax(k @ qt, dim=1).transpose(1, 2)`, are the kernel's.

Each module is run original against rewritten in float64 (any difference is semantic), forward and
backward, in train and eval mode, with masks that leave some rows with every key masked; the
look-alikes stay untouched."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace as _namespace
from tests.engine.rules.harness import statuses as _scan
from tests.engine.rules.test_one_query import _compare

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# parlai's memory hop: one query against memory keys held (batch, feature, memory), an optional
# padding fill by a bool index assignment, nn.Softmax(dim=1) over the memories
HOP = """
import torch
import torch.nn as nn


class Hop(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax = nn.Softmax(dim={dim})

    def forward(self, query, in_mem, out_mem, pad_mask=None):
        attn = torch.bmm(query.unsqueeze(1), in_mem).squeeze(1)
        if pad_mask is not None:
            attn[pad_mask] = -1e20
        probs = self.softmax(attn)
        return {output}
"""
HOP_OUTPUT = "torch.bmm(probs.unsqueeze(1), out_mem).squeeze(1)"

# stanza's tree stack: the query reshaped to a column per head, the mask filled with -inf
COLUMN = """
import torch
import torch.nn as nn


class Column(nn.Module):
    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.scale = 1 / (dim // heads) ** 0.5

    def forward(self, key, query, value, mask=None):
        b, n, d = key.shape
        query = query.unsqueeze(2).reshape((b, self.heads, -1, {last}))
        key = key.reshape((b, n, self.heads, -1)).transpose(1, 2)
        value = value.reshape((b, n, self.heads, -1)).transpose(1, 2)
        attn = torch.matmul(key, query).squeeze(3) * self.scale
        if mask is not None:
            mask = mask.unsqueeze(1).expand(-1, self.heads, -1)
            attn = attn.masked_fill(mask, float('-inf'))
        attn = torch.softmax(attn, dim=2).unsqueeze(2)
        output = torch.matmul(attn, value).squeeze(2)
        return output.reshape(b, -1)
"""

# recbole's RippleNet: the item embedding is state the forward computes, read in a helper; its
# full-sort variant lays the scores out key-major (the items on the last axis)
MEMORY = """
import torch
import torch.nn as nn


class Memory(nn.Module):
    def __init__(self, n=10, dim=6, memories=5):
        super().__init__()
        self.embed = nn.Embedding(n, dim)
        self.dim, self.memories = dim, memories
        self.softmax = nn.Softmax(dim=1)

    def forward(self, item, heads, tails):
        self.items = self.embed(item)
        self.tails = [tails]
        return self._read(heads)

    def _read(self, heads):
        keys = heads.view(-1, self.memories, self.dim)
        v = self.items.{query}
        probs = {scores}
        probs = self.softmax(probs)
{between}        tail = self.tails[0].view(-1, self.memories, self.dim)
        return {output}
"""
ONE = {"query": "unsqueeze(2)", "scores": "torch.bmm(keys, v).squeeze(2)", "between": "",
       "output": "torch.sum(tail * probs.unsqueeze(2), dim=1)"}
FULL = {"query": "transpose(1, 2)", "scores": "torch.bmm(keys, v)", "between": "",
        "output": "torch.bmm(probs.transpose(1, 2), tail)"}


def _compare_nan_rows(original, rewritten, *inputs) -> None:
    """Outputs agree, NaN rows (every key masked under an infinite fill) included; so do the inputs'
    gradients, except where the original's are NaN: its softmax backward multiplies the zero gradient
    of a NaN row by NaN probabilities, so every gradient of such a sample is NaN (a stated deviation of
    the rewrite of infinite fills, tests/engine/rules/test_mask_semantics.py): the rewrite's are finite."""
    for mode in ("train", "eval"):
        getattr(original, mode)()
        getattr(rewritten, mode)()
        a_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        b_in = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
        a, b = original(*a_in), rewritten(*b_in)
        assert torch.equal(a.isnan(), b.isnan())
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
        weights = torch.randn_like(a)
        (a.nan_to_num() * weights).sum().backward()
        (b.nan_to_num() * weights).sum().backward()
        for x, y in zip(a_in, b_in, strict=True):
            if x.is_floating_point():
                clean = ~x.grad.isnan().flatten(1).any(1)
                assert clean.any() and not y.grad.isnan().any()
                torch.testing.assert_close(x.grad[clean], y.grad[clean], rtol=1e-12, atol=1e-12)


def _double(source: str, name: str, *args):
    return _namespace(source)[name](*args).double()


def _randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def test_memory_hop_with_an_optional_bool_index_fill():
    source = HOP.format(dim=1, output=HOP_OUTPUT)
    found, new = _scan(source)
    # the index assignment is kept (a bool index of the same shape is a masked fill, but neither the
    # mask's dtype nor its rank is known): the kernel runs where no mask is given
    assert found == [("guarded", None)]
    assert "if pad_mask is not None:" in new and "scaled_dot_product_attention(" in new
    assert "query.unsqueeze(-2), in_mem.transpose(-2, -1), out_mem, scale=1.0" in new
    torch.manual_seed(0)
    query, in_mem, out_mem = _randn(3, 4), _randn(3, 4, 5), _randn(3, 5, 6)
    _compare(_double(source, "Hop"), _double(new, "Hop"), query, in_mem, out_mem)
    mask = torch.rand(3, 5) < 0.5
    mask[1] = True
    original, rewritten = _double(source, "Hop"), _double(new, "Hop")
    torch.testing.assert_close(original(query, in_mem, out_mem, mask), rewritten(query, in_mem, out_mem, mask))


def test_a_query_reshaped_to_a_column_with_a_minus_infinity_fill():
    source = COLUMN.format(last=1)
    found, new = _scan(source)
    # the kernel on both paths: the mask, made on its branch, is passed where it is given, and the
    # NaN rows are restored on the output read back through the same squeeze
    assert found == [("rewritten", None)]
    assert "query.transpose(-2, -1)" in new and ".squeeze(-2)" in new
    assert "mask.unsqueeze(-2).all(-1, keepdim=True).squeeze(-2), float('nan')" in new
    assert "torch.softmax" not in new
    torch.manual_seed(1)
    key, query, value = _randn(3, 5, 8), _randn(3, 8), _randn(3, 5, 8)
    mask = torch.rand(3, 5) < 0.4
    mask[2] = True  # every key masked: NaN in the original, and so in the rewrite
    _compare_nan_rows(_double(source, "Column"), _double(new, "Column"), key, query, value, mask)
    _compare(_double(source, "Column"), _double(new, "Column"), key, query, value)
    assert _scan(new)[1] == new


def test_state_computed_in_forward_is_the_query_of_a_helper():
    source = MEMORY.format(**ONE)
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    assert "self.items.unsqueeze(-2), keys, tail, scale=1.0" in new and ".squeeze(-2)" in new
    assert "self.softmax" not in new
    torch.manual_seed(2)
    original, rewritten = _double(source, "Memory"), _double(new, "Memory")
    rewritten.load_state_dict(original.state_dict())
    item, heads, tails = torch.randint(0, 10, (4,)), _randn(4 * 5, 6), _randn(4 * 5, 6)
    _compare(original, rewritten, item, heads, tails)


def test_key_major_scores_turned_back_are_the_kernel_s():
    source = MEMORY.format(**FULL).replace("self.embed(item)", "self.embed(item).unsqueeze(0).expand(4, -1, -1)")
    found, new = _scan(source)
    assert found == [("rewritten", None)]
    # the query the code held transposed, `v = self.items.transpose(1, 2)`, is the state itself
    assert "scaled_dot_product_attention(\n            self.items, keys, tail, scale=1.0\n        )" in new
    assert "v = " not in new
    torch.manual_seed(3)
    original, rewritten = _double(source, "Memory"), _double(new, "Memory")
    rewritten.load_state_dict(original.state_dict())
    item, heads, tails = torch.randint(0, 10, (7,)), _randn(4 * 5, 6), _randn(4 * 5, 6)
    _compare(original, rewritten, item, heads, tails)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        # the softmax over the batch axis (the scores of one query have no query axis; the optional
        # fill's merge loses the axes' identity, so the reason names the key axis it is not)
        (HOP.format(dim=0, output=HOP_OUTPUT), "softmax dim=0 of a 2-D tensor is not provably the key axis"),
        # the probabilities are read after the softmax
        (HOP.format(dim=1, output=f"{HOP_OUTPUT}, probs"), "intermediate `probs` escapes the match"),
        # a fill that is not the lowest value keeps the masked keys
        (COLUMN.format(last=1).replace("float('-inf')", "-1.0"), "masked_fill value -1.0 is not -inf"),
        # the state is set between the scores and the output: the kernel would read the new value
        (MEMORY.format(**{**ONE, "between": "        self.items = self.items * 2\n"}),
         "`self.items` is set between its use in the match and the rewrite"),
        # the state set between the query's transpose and the scores
        (MEMORY.format(**{**FULL, "query": "transpose(1, 2)\n        self.items = self.items + 1"}),
         "`self.items` is set between its use in the match and the rewrite"),
        # key-major probabilities read after the softmax
        (MEMORY.format(**{**FULL, "output": "torch.bmm(probs.transpose(1, 2), tail), probs"}),
         "intermediate `probs` escapes the match"),
    ],
)
def test_look_alikes_are_near_misses(source, reason):
    found, new = _scan(source)
    assert new == source
    assert any(status == "near-miss" and reason in (why or "") for status, why in found), found


@pytest.mark.parametrize(
    "source",
    [
        # key-major scores normalized over the queries (their last axis), not over the keys
        MEMORY.format(**{**FULL, "scores": "torch.bmm(keys, v)"}).replace("nn.Softmax(dim=1)", "nn.Softmax(dim=2)"),
        # a column whose last size is not provably 1 is no query
        COLUMN.format(last="d // 8"),
        # the weights are a gate, not a softmax
        MEMORY.format(**ONE).replace("probs = self.softmax(probs)", "probs = torch.sigmoid(probs)"),
    ],
)
def test_look_alikes_stay(source):
    found, new = _scan(source)
    assert new == source
    assert all(status not in ("rewritten", "guarded") for status, _ in found)
