"""Products of one query read where the shape facts prove the axes (engine/analysis/contraction.py):
a column made by a reshape to a last size of 1 is the query's row transposed; an operand of
`torch.bmm` unsqueezed is a column by the rank the product demands of it."""

from __future__ import annotations

from engine.analysis import numbers
from engine.analysis.contraction import squeezed_product
from engine.dsl.ir import Var
from tests.engine.analysis.test_demanded_ranks import _facts


def _squeezed(body: str, params: str = "k, q"):
    text, facts, method = _facts(body, params)
    defs = method.defs()
    uses: dict = {}
    for node in method.nodes:
        for name in node.data_inputs:
            uses.setdefault(name, []).append(node)
    with numbers.source("m.py", text):
        return [c for n in method.nodes if n.op == ".squeeze" and (c := squeezed_product(n, facts, defs, uses))]


def test_a_column_made_by_a_reshape_to_a_last_size_of_1_is_a_query_row():
    found = _squeezed("c = q.reshape(b, h, -1, 1)\nkk = k.reshape(b, n, h, -1).transpose(1, 2)\n"
                      "s = torch.matmul(kk, c).squeeze(3)", "k, q, b, h, n")
    assert len(found) == 1 and found[0].column and found[0].transposed and found[0].vector == Var("c")


def test_a_column_whose_last_size_is_not_provably_1_is_no_query_row():
    assert _squeezed("c = q.reshape(b, h, -1, w)\nkk = k.reshape(b, n, h, -1).transpose(1, 2)\n"
                     "s = torch.matmul(kk, c).squeeze(3)", "k, q, b, h, n, w") == []


def test_an_unsqueezed_operand_of_bmm_is_a_column_by_its_demanded_rank():
    found = _squeezed("s = torch.bmm(k, q.unsqueeze(2)).squeeze(2)")
    assert len(found) == 1 and found[0].vector == Var("q") and not found[0].column
    # the squeeze of another axis than the column's: no product of one query
    assert _squeezed("s = torch.bmm(k, q.unsqueeze(1)).squeeze(1)") == []
