"""Ranks proven by a use that takes no other: `torch.bmm` raises unless both operands are 3-D (and
`torch.mm` unless they are 2-D), so wherever it runs they are, and so are the values they were made
from by rank-keeping ops or an unsqueeze. Absent where the use may not run (another branch, an error
caught), where an in-place method changes the shape on the way, or where an op may broadcast."""

from __future__ import annotations

import pytest

from engine.analysis import numbers
from engine.analysis.shapes import ShapeFacts
from engine.dsl.ir import Var
from engine.extract import extract_source


def _facts(body: str, params: str = "x", init: str = "pass", method: str = "forward"):
    """(the facts, the method) of `body` as the method of a module; the facts read the source (an
    error raised inside a `try` or a `with` may be caught), so questions are asked inside `_known`."""
    text = ("import torch\nfrom torch import nn\n\n\nclass M(nn.Module):\n"
            f"    def __init__(self, rotate=True):\n        super().__init__()\n        {init}\n\n"
            f"    def {method}(self, {params}):\n" + "".join(f"        {line}\n" for line in body.strip().splitlines()))
    fm = extract_source(text, "m.py", "m")
    cls = fm.cls("M")
    return text, ShapeFacts(cls.method(method), cls), cls.method(method)


def _rank(body: str, name: str, params: str = "x, y", init: str = "pass") -> int | None:
    text, facts, method = _facts(body, params, init)
    found = [o for n in method.nodes for o in n.outputs if o == name or o.startswith(name + ".")]
    with numbers.source("m.py", text):
        return facts.rank(Var(found[-1] if found else name))


def test_bmm_operands_are_3d_and_an_unsqueezed_one_2d():
    assert _rank("s = torch.bmm(x.unsqueeze(1), y)", "x") == 2
    assert _rank("s = torch.bmm(x.unsqueeze(1), y)", "y") == 3
    assert _rank("s = x.bmm(y)", "x") == 3  # the method spelling: its receiver too
    assert _rank("s = torch.mm(x, y)", "y") == 2


def test_the_rank_goes_back_through_rank_keeping_ops_and_layers():
    assert _rank("s = torch.bmm(x.float().transpose(1, 2), y)", "x") == 3
    assert _rank("s = torch.bmm(self.proj(x), y)", "x", init="self.proj = nn.Linear(4, 4)") == 3
    assert _rank("s = torch.bmm(self.drop(x).unsqueeze(-1), y)", "x", init="self.drop = nn.Dropout(0.1)") == 2


def test_a_bmm_result_is_3d_whatever_its_operands():
    assert _rank("s = torch.bmm(self.weight, y)\nt = s.squeeze(1)", "s") == 3


@pytest.mark.parametrize(
    ("body", "params", "init"),
    [
        # the product runs on one branch only: elsewhere x may have any rank
        ("if flag:\n    s = torch.bmm(x, y)", "x, y, flag", "pass"),
        # an error it raises may be caught
        ("try:\n    s = torch.bmm(x, y)\nexcept RuntimeError:\n    s = y", "x, y", "pass"),
        # an in-place method changes the shape before the product
        ("x.unsqueeze_(0)\ns = torch.bmm(x, y)", "x, y", "pass"),
        # a broadcasting op between: its result has the larger rank of its operands
        ("s = torch.bmm(x * y, y)", "x, y", "pass"),
        ("s = torch.bmm(x.masked_fill(y, 0.0), y)", "x, y", "pass"),
        # two products demanding two ranks raise on every path: no fact
        ("s = torch.bmm(x, y)\nt = torch.mm(x, y)", "x, y", "pass"),
        # a module built as a Linear only when a flag is set (a lambda otherwise, as parlai's Hop)
        ("s = torch.bmm(self.rotate(x), y)", "x, y",
         "if rotate:\n            self.rotate = nn.Linear(4, 4)\n        else:\n            self.rotate = lambda t: t"),
    ],
)
def test_no_rank_where_the_use_proves_nothing(body, params, init):
    assert _rank(body, "x", params, init) is None


def test_expand_has_one_axis_per_size_and_repeat_proves_nothing_of_an_unknown_input():
    assert _rank("m = x.unsqueeze(1).expand(-1, 4, -1)", "m") == 3
    assert _rank("m = x.repeat(1, 4, 1)", "m") is None


def test_factory_sizes_by_keyword():
    assert _rank("z = torch.zeros(size=(4, 1))", "z") == 2
    # sizes held by names may be tuples to unpack: no rank (before, a 0-d tensor was claimed)
    assert _rank("z = torch.zeros(size=(x, 1))", "z") is None
