"""Einsums and permutes that are spellings of a (transposed) batched matrix product are extracted as
the canonical `matmul` / `transpose` nodes, so attention rules see them; the rest stay calls."""

from __future__ import annotations

import pytest

from engine.dsl.ir import Const
from engine.extract import extract_source
from engine.extract.extractor import _einsum_lowering, _einsum_product, _swaps_last_two

AB_T = (False, True, True)  # (transpose the first operand, transpose the second, first on the left)
AB = (False, False, True)


@pytest.mark.parametrize(("equation", "einops", "kind"), [
    ("bhid,bhjd->bhij", False, AB_T),
    ("b h i d, b h j d -> b h i j", False, AB_T),   # torch ignores spaces
    ("b h i d, b h j d -> b h i j", True, AB_T),
    ("batch i d, batch j d -> batch i j", True, AB_T),  # einops names
    ("...id,...jd->...ij", False, AB_T),
    ("bhij,bhjd->bhid", False, AB),
    ("ij,jk->ik", False, AB),
    ("b h i d, b j d -> b h i j", True, None),   # the key lacks the head axis: broadcasting differs
    ("bhid,bhjd->bhji", False, (True, False, False)),  # output transposed: b @ a^T
    ("bhdi,bhdj->bhij", False, (True, False, True)),   # channels-first operands: a^T @ b
    ("b h i j, b h j d -> b h d i", True, (True, True, False)),  # read back channels-first: b^T @ a^T
    ("bhij,bhdj->bhdi", False, (True, False, False)),  # value stored (d, j): b @ a^T
    ("bnhk,bmk->bnhm", False, None),
    ("bct,bcs->bts", False, (True, False, True)),   # contracts the second-to-last axis: a^T @ b
    ("bij,bij->bij", False, None),               # no contracted label
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
    # the transposed output is the product the other way round: matmul(k, transpose(q))
    assert ops[-2:] == [("transpose", "torch.einsum"), ("matmul", "torch.einsum('bhid,bhjd->bhji')")]
    nodes = [n for n in fm.classes[0].methods[0].nodes if n.kind == "op"]
    assert nodes[-1].inputs[0].name == "k" and nodes[-2].inputs[0].name == "q"


@pytest.mark.parametrize(("equation", "einops", "lowering"), [
    # heads after the sequence: both operands permuted to (b, h, ., d), the output as the equation has it
    ("bihd,bjhd->bhij", False, (((0, 2, 1, 3), (), (), False), ((0, 2, 1, 3), (), (), True), (), None)),
    # and read back heads-after: the result of the (b, h, i, d) product is permuted back
    ("bhij,bjhd->bihd", False, (((0, 1, 2, 3), (), (), False), ((0, 2, 1, 3), (), (), False), (), (0, 2, 1, 3))),
    # multi-query: the key has no head axis, it gets a size-1 one at position 1
    ("b h i d, b j d -> b h i j", True, (((0, 1, 2, 3), (), (), False), ((0, 1, 2), (1,), (), True), (), None)),
    ("b h i j, b j d -> b h i d", True, (((0, 1, 2, 3), (), (), False), ((0, 1, 2), (1,), (), False), (), None)),
    # two row candidates (n, h): the one next to the key's label in the output is the row
    ("bnhk,bmk->bnhm", False, (((0, 1, 2, 3), (), (), False), ((0, 1, 2), (1,), (), True), (), None)),
    # several contracted labels (t, f, n), in the same order on both operands: each operand permuted to
    # bring them after its row (c, e) and flattened into one feature axis
    ("bhtcfn,bhtefn->bhce", False, (((0, 1, 3, 2, 4, 5), (), ((3, 5),), False),
                                    ((0, 1, 3, 2, 4, 5), (), ((3, 5),), True), (), None)),
    ("b h t c f d, b h t e f d -> b h c e", True, (((0, 1, 3, 2, 4, 5), (), ((3, 5),), False),
                                                   ((0, 1, 3, 2, 4, 5), (), ((3, 5),), True), (), None)),
    # already together after the row: flattened in place (the identity permute proves the rank)
    ("bhiwd,bhjwd->bhij", False, (((0, 1, 2, 3, 4), (), ((3, 4),), False),
                                  ((0, 1, 2, 3, 4), (), ((3, 4),), True), (), None)),
    # the value's row labels (t, f, n) are one feature axis: flattened, unflattened to the sizes the
    # value has at its axes 2, 4, 5, and the result permuted to the output's order
    ("bhce,bhtefn->bhtcfn", False, (((0, 1, 2, 3), (), (), False), ((0, 1, 3, 2, 4, 5), (), ((3, 5),), False),
                                    (2, 4, 5), (0, 1, 3, 2, 4, 5))),
    # a 5-D per-window value (b h j w d): (w d) is its feature axis
    ("b h i j, b h j w d -> b h i w d", True, (((0, 1, 2, 3), (), (), False),
                                               ((0, 1, 2, 3, 4), (), ((3, 4),), False), (3, 4), None)),
    # a label of each operand alone (b on the query, c on the key), the key's placed among the shared
    # batch labels: both batch axes, each operand given a size-1 axis for the one it lacks
    ("b h i d, c h j d -> b c h i j", True, (((0, 1, 2, 3), (1,), (), False), ((0, 1, 2, 3), (0,), (), True), (), None)),
    # placed after the shared batch labels, it is a row of the key, flattened with j (as the value's t above)
    ("b h i d, b h c j d -> b h i c j", True, (((0, 1, 2, 3), (), (), False), ((0, 1, 2, 3, 4), (), ((2, 3),), True),
                                              (2, 3), None)),
    ("bhtcfn,bhtenf->bhce", False, None),   # contracted in another order on the key: not one axis
    ("bhtcfn,bhtef->bhce", False, None),    # n summed out of the query alone
    ("bij,bij->bij", False, None),          # nothing contracted
    ("bhid,bhid->bhi", False, None),        # contracted label on both, no row of the second operand
    ("bhid,bjd->bhi", False, None),         # j summed out of one operand
    # h summed out with d: (h d) is one feature axis, brought after the row
    ("bhid,bhjd->bij", False, (((0, 2, 1, 3), (), ((2, 3),), False), ((0, 2, 1, 3), (), ((2, 3),), True), (), None)),
    ("...id,...jd->...ij", False, None),    # `...` is `_einsum_product`'s
    ("bhid,bhjd,bhje->bhie", False, None),
])
def test_einsum_lowerings(equation, einops, lowering):
    assert _einsum_lowering(equation, einops=einops) == lowering


def test_lowered_einsum_nodes_carry_the_einsum():
    source = """
import torch
from torch import nn


class A(nn.Module):
    def forward(self, q, k):
        return torch.einsum('bhid,bjd->bhij', q, k)
"""
    fm = extract_source(source, "m.py", "m")
    nodes = [n for n in fm.classes[0].methods[0].nodes if n.kind == "op"]
    assert [(n.op, n.target) for n in nodes] == [
        (".permute", "torch.einsum"), (".unsqueeze", "torch.einsum"), ("transpose", "torch.einsum"),
        ("matmul", "torch.einsum('bhid,bjd->bhij')")]
    assert nodes[1].inputs[1] == Const(1)


def test_several_contracted_axes_are_flattened_and_a_values_unflattened():
    source = """
import torch
from torch import nn


class A(nn.Module):
    def forward(self, q, k, v):
        a = torch.einsum('bhtcfn,bhtefn->bhce', q, k).softmax(dim=-1)
        return torch.einsum('bhce,bhtefn->bhtcfn', a, v)
"""
    fm = extract_source(source, "m.py", "m")
    nodes = [n for n in fm.classes[0].methods[0].nodes if n.kind == "op"]
    assert [n.op for n in nodes] == [
        ".permute", ".flatten", ".permute", ".flatten", "transpose", "matmul", "softmax",
        ".permute", ".flatten", "matmul", ".size", ".size", ".size", ".unflatten", ".permute"]
    assert nodes[1].inputs[1:] == (Const(3), Const(5))
    assert [n.inputs for n in nodes[10:13]] == [(nodes[7].inputs[0], Const(d)) for d in (2, 4, 5)]
