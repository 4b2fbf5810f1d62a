"""Unpackings with a star. A starred name takes what the others leave: the names after it are
counted from the end (`s, *rest, t = x.shape`: t is `shape[-1]`, not `shape[2]`) and it is a slice.
A starred item among others (`b, n, h = *x.shape, self.heads`) spreads over as many names as the
other items leave, so a whole shape spread so is unpacked into them (x's rank proven,
engine/analysis/shapes.py); a slice spread so is read by index."""

from __future__ import annotations

from engine.dsl.ir import Const, Sym, Var
from engine.extract.extractor import extract_source

SOURCE = """
import torch
from torch import nn


class M(nn.Module):
    def forward(self, x, k):
        {line}
        return x
"""


def _nodes(line: str) -> list[tuple[str, tuple, tuple[str, ...]]]:
    fm = extract_source(SOURCE.format(line=line), "m.py", "m")
    method = fm.cls("M").method("forward")
    return [(n.op, tuple(i.value if isinstance(i, Const) else i.text if isinstance(i, Sym) else i.name
                         for i in n.inputs if isinstance(i, (Const, Sym, Var))), n.outputs)
            for n in method.nodes if n.op != "return"]


def test_names_after_a_starred_name_count_from_the_end():
    nodes = _nodes("s, *rest, t = x.shape")
    assert [(op, inputs[1:], out) for op, inputs, out in nodes if op == "getitem"] == [
        ("getitem", (0,), ("s",)), ("getitem", ("1:-1",), ("rest",)), ("getitem", (-1,), ("t",))]
    nodes = _nodes("b, n, *_ = x.shape")
    assert [inputs[1:] for op, inputs, _ in nodes if op == "getitem"] == [(0,), (1,), ("2:",)]


def test_a_whole_shape_spread_among_other_items_is_unpacked_into_its_names():
    nodes = _nodes("dev, b, n, d, h = (x.device, *x.shape, self.heads)")
    assert ("getattr", ("x", "shape"), ("b", "n", "d")) in nodes
    assert ("getattr", ("k", "shape"), ("b", "n", "d")) not in nodes


def test_a_slice_spread_among_other_items_is_read_by_index():
    nodes = _nodes("b, n, device = *x.shape[:2], x.device")
    assert [(inputs[1:], out) for op, inputs, out in nodes if op == "getitem" and out != ()][-2:] == [
        ((0,), ("b",)), ((1,), ("n",))]
    assert not any(op == "getattr" and len(out) > 1 for op, _, out in nodes)


def test_a_seq_with_a_star_is_not_zipped_with_as_many_names():
    # `a, b = *x.shape[:1], k` binds a to the shape's first size, not to the slice
    nodes = _nodes("a, b = *x.shape[:1], k")
    assert [(inputs[1:], out) for op, inputs, out in nodes if op == "getitem" and out == ("a",)] == [((0,), ("a",))]
