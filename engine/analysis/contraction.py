"""Products written without a product op, read as the matrix product they are.

Two spellings contract one axis of two tensors and drop it, as `a @ b` does, with a vector on one
side (a single query):

  * a multiply and a sum over an axis, `(v * p.unsqueeze(-1)).sum(-2)`: `p` (..., n) broadcast
    against `v` (..., n, d) along a new last axis and summed over n is `p.unsqueeze(-2) @ v`
    (..., 1, d) without its size-1 axis, `(p.unsqueeze(-2) @ v).squeeze(-2)`;
  * a product with a column, `(k @ u.unsqueeze(-1)).squeeze(-1)`: the key-major scores of one
    query, (..., n), are `(u.unsqueeze(-2) @ k.transpose(-2, -1)).squeeze(-2)`, the query's row
    times the transposed keys; and a product with a row squeezed back, `(u.unsqueeze(-2) @
    m).squeeze(-2)`, is that already. A column made otherwise, c proven (..., d, 1) (a reshape
    to a last size of 1), gives `(k @ c).squeeze(-1) == (c.transpose(-2, -1) @ k.transpose(-2,
    -1)).squeeze(-2)`: its row is its transpose (`column`).

In both the vector (`p`, `u`) is the left operand of a product with one row, the row axis is
absent from the result (it was squeezed), and the leading axes broadcast exactly as they do in the
original (both are right-aligned, and the vector's own leading axes are its batch axes in both). So
`sum(mul(...))` and `squeeze(matmul(...))` are one `matmul` node (`ONE_ROW` its target: its left
operand is a vector, its result has no row axis) that the matcher may see in their place.

Every axis is read from the shape facts (engine/analysis/shapes.py), never from a constant alone:
`p.unsqueeze(2)` adds the last axis only where its result is proven 3-D, `sum(dim=1)` is over the axis
before the last only where the product is proven 3-D. The contracted axis must not be provably of
size 1 on either side (a broadcast size-1 axis is summed as copies, not contracted); a new axis that
is not the unsqueezed vector's last, a sum over any other axis, a multiply by two unsqueezed values
(an outer product) are no contraction of this kind. Known limit, as for an einsum lowered to a
product: contracted axes of different sizes, one of them 1 where the code runs but not provably so,
broadcast in the original and raise in the product.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.analysis.shapes import Shape, ShapeFacts, _int
from engine.dsl.ir import Const, Node, Operand, Var

ONE_ROW = "one-row product"  # the target of a product whose left operand is a vector
ONE_ROW_OF_COLUMN = "one-row product of a column"  # ... whose left operand is a column, (..., d, 1)


def is_one_row(node: Node | None) -> bool:
    """`node` is a product read so: its left operand is a vector or a column, its result has no row axis."""
    return node is not None and node.target in (ONE_ROW, ONE_ROW_OF_COLUMN)


@dataclass(frozen=True)
class Contraction:
    """`stands_for` (the nodes the product replaces, the root last) read as `vector.unsqueeze(-2) @
    matrix` (after `transpose(matrix, -2, -1)` where `transposed`) without its row axis; where
    `column`, the vector is held as a column, (..., d, 1), and its row is `vector.transpose(-2, -1)`."""

    vector: Operand
    matrix: Operand
    transposed: bool
    stands_for: tuple[Node, ...]
    column: bool = False


def _is_unsqueeze(node: Node | None) -> bool:
    return node is not None and node.kind == "op" and node.op in (".unsqueeze", "torch.unsqueeze") \
        and len(node.inputs) >= 1 and len(node.outputs) == 1


def _adds(node: Node, index: int, facts: ShapeFacts) -> bool:
    """`node` (an unsqueeze) adds axis `index` (-1: a new last axis, -2: one before the input's last):
    `dim=index`, or the position it names in the result's proven rank."""
    d = _int(node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim"))
    if d == index:
        return True
    shape = facts.shape(Var(node.outputs[0]))
    return d is not None and d >= 0 and shape is not None and shape.exact and d == len(shape.axes) + index


def _unsqueezed(node: Node, facts: ShapeFacts) -> Shape | None:
    """The shape of what unsqueeze `node` reads: its own, or, for an expression the facts do not
    follow (`self.state.unsqueeze(2)`, of an attribute the module computes), the result's without
    the axis added."""
    shape = facts.shape(node.inputs[0])
    if shape is not None:
        return shape
    out = facts.shape(Var(node.outputs[0]))
    d = _int(node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim"))
    position = out.position(d) if out is not None and d is not None else None
    if out is None or position is None:
        return None
    return Shape(out.axes[:position] + out.axes[position + 1:], out.exact)


def _names_axis(shape: Shape | None, dim: Operand | None, index: int) -> bool:
    """`dim` names axis `index` (negative, from the end) of `shape`."""
    d = _int(dim)
    if d is None or shape is None:
        return False
    position = shape.position(d)
    return position is not None and position == len(shape.axes) + index


def _only_reader(name: str, reader: Node, uses: dict[str, list[Node]]) -> bool:
    return [u for u in uses.get(name, ()) if u is not reader] == []


def summed_product(node: Node, facts: ShapeFacts, defs: dict[str, Node],
                   uses: dict[str, list[Node]]) -> Contraction | None:
    """`sum(mul(v, p.unsqueeze(-1)), dim=-2)` (either factor order; `torch.mul`, `*`, `.sum`,
    `torch.sum`) as `(p.unsqueeze(-2) @ v).squeeze(-2)`, where the shape facts prove the axes."""
    if node.kind != "op" or node.op != "sum" or len(node.inputs) != 1 or len(node.outputs) != 1:
        return None
    if set(dict(node.kwargs)) - {"dim", "keepdim"} or node.kwarg("keepdim", Const(False)) != Const(False):
        return None
    product = node.inputs[0]
    mul = defs.get(product.name) if isinstance(product, Var) else None
    if mul is None or mul.kind != "op" or mul.op != "mul" or len(mul.inputs) != 2 or mul.kwargs \
            or mul.guard != node.guard or mul.via != node.via or not _only_reader(product.name, node, uses):
        return None
    both = facts.shape(product)
    if not _names_axis(both, node.kwarg("dim"), -2):
        return None
    for column, matrix in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
        added = defs.get(column.name) if isinstance(column, Var) else None
        if not _is_unsqueeze(added) or added.guard != node.guard or added.via != node.via \
                or not _only_reader(column.name, mul, uses) or not _adds(added, -1, facts):
            continue
        vector = added.inputs[0]
        v, m = _unsqueezed(added, facts), facts.shape(matrix)
        if v is None or m is None or len(v.axes) < 1 or len(m.axes) < 2:
            continue
        if v.axes[-1].unit or m.axes[-2].unit or m.axes[-1].unit:
            continue  # a broadcast size-1 axis: summed copies, or an outer product, not a contraction
        return Contraction(vector, matrix, False, (added, mul, node))
    return None


def squeezed_product(node: Node, facts: ShapeFacts, defs: dict[str, Node],
                     uses: dict[str, list[Node]]) -> Contraction | None:
    """`matmul(k, u.unsqueeze(-1)).squeeze(-1)` (key-major scores of one query) as
    `(u.unsqueeze(-2) @ k.transpose(-2, -1)).squeeze(-2)`, and `matmul(u.unsqueeze(-2), m).squeeze(-2)`
    as it is, where the shape facts prove the axes."""
    if node.kind != "op" or node.op != ".squeeze" or len(node.inputs) not in (1, 2) or len(node.outputs) != 1:
        return None
    dim = node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim")
    source = node.inputs[0]
    product = defs.get(source.name) if isinstance(source, Var) else None
    if product is None or product.kind != "op" or product.op != "matmul" or len(product.inputs) != 2 \
            or product.kwargs or product.guard != node.guard or product.via != node.via \
            or not _only_reader(source.name, node, uses):
        return None
    for index, (vector_side, matrix) in enumerate(((product.inputs[1], product.inputs[0]),
                                                   (product.inputs[0], product.inputs[1]))):
        if not _names_axis(facts.shape(source), dim, -1 - index):
            continue  # the column's (or the row's) own size-1 axis is the one squeezed
        m = facts.shape(matrix)
        if m is None or len(m.axes) < 2 or m.axes[-1 - index].unit:
            continue
        added = defs.get(vector_side.name) if isinstance(vector_side, Var) else None
        if not _is_unsqueeze(added):
            column = facts.shape(vector_side)
            if index == 0 and column is not None and len(column.axes) >= 2 and column.axes[-1].unit \
                    and not column.axes[-2].unit:
                # a column made otherwise (`u.reshape(b, h, -1, 1)`): its row is its transpose
                return Contraction(vector_side, matrix, True, (product, node), column=True)
            continue
        if added.guard != node.guard or added.via != node.via or not _only_reader(vector_side.name, product, uses) \
                or not _adds(added, -1 - index, facts):
            continue
        v = _unsqueezed(added, facts)
        if v is None or len(v.axes) < 1 or v.axes[-1].unit:
            continue
        return Contraction(added.inputs[0], matrix, index == 0, (added, product, node))
    return None
