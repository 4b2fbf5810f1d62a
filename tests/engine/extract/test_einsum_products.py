"""Einsums and permutes that are spellings of a (transposed) batched matrix product are extracted as
the canonical `matmul` / `transpose` nodes, so attention rules see them; the rest stay calls."""

from __future__ import annotations

import pytest

from engine.dsl.ir import Const
from engine.extract import extract_source
from engine.extract.extractor import _einsum_product, _swaps_last_two


@pytest.mark.parametrize(("equation", "einops", "kind"), [
    ("bhid,bhjd->bhij", False, "a @ b^T"),
    ("b h i d, b h j d -> b h i j", False, "a @ b^T"),   # torch ignores spaces
    ("b h i d, b h j d -> b h i j", True, "a @ b^T"),
    ("batch i d, batch j d -> batch i j", True, "a @ b^T"),  # einops names
    ("...id,...jd->...ij", False, "a @ b^T"),
    ("bhij,bhjd->bhid", False, "a @ b"),
    ("ij,jk->ik", False, "a @ b"),
    ("b h i d, b j d -> b h i j", True, None),   # the key lacks the head axis: broadcasting differs
    ("bhid,bhjd->bhji", False, None),            # transposed output
    ("bnhk,bmk->bnhm", False, None),
    ("bct,bcs->bts", False, None),               # contracts the second-to-last axis
    ("bhid,bhid->bhi", False, None),
    ("bhid,bhjd,bhje->bhie", False, None),
])
def test_einsum_products(equation, einops, kind):
    assert _einsum_product(equation, einops=einops) == kind


def test_permute_that_swaps_the_last_two_dims():
    assert _swaps_last_two((Const(0), Const(1), Const(3), Const(2)))
    assert _swaps_last_two((Const((0, 2, 1)),))
    assert not _swaps_last_two((Const(0), Const(2), Const(1), Const(3)))
    assert not _swaps_last_two((Const(0), Const(2), Const(3), Const(1)))


def test_extracted_nodes():
    source = """
import torch
from torch import nn


class A(nn.Module):
    def forward(self, q, k, v):
        s = torch.einsum('bhid,bhjd->bhij', q, k)
        p = s.softmax(dim=-1)
        t = q @ k.permute(0, 1, 3, 2)
        return torch.einsum('bhij,bhjd->bhid', p, v), torch.einsum('bhid,bhjd->bhji', q, k), t
"""
    fm = extract_source(source, "m.py", "m")
    ops = [(n.op, n.target) for n in fm.classes[0].methods[0].nodes if n.kind == "op"]
    assert ops[0] == ("transpose", "torch.einsum")
    assert ops[1] == ("matmul", "torch.einsum('bhid,bhjd->bhij')")
    assert ("transpose", ".permute") in ops
    assert ("matmul", "torch.einsum('bhij,bhjd->bhid')") in ops
    assert ("torch.einsum", None) in ops  # the transposed output stays an einsum call
