"""Elementwise arithmetic read as a polynomial in one tensor.

`x * 0.7978845608 * (1 + 0.044715 * x * x)` and `math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)`
are the same polynomial in `x`; a rule that needs the tanh GELU's argument compares coefficients,
not spellings. The reading follows the extracted data flow (`add`, `sub`, `neg`, `mul`, `scale`,
`pow` by a non-negative integer) from a value back to `x` and to numbers; anything else (another
tensor, a call, a value computed on another branch or in another inlined call) makes it no
polynomial of `x`, and the reader says None.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.dsl.ir import Const, Node, Operand, Sym, Var
from engine.match.matcher import MethodIndex, numeric

Polynomial = dict[int, float]  # degree -> coefficient, zero coefficients left out

_MAX_DEGREE = 8
_MAX_NODES = 32


def _add(a: Polynomial, b: Polynomial, sign: float = 1.0) -> Polynomial:
    out = dict(a)
    for d, c in b.items():
        out[d] = out.get(d, 0.0) + sign * c
    return {d: c for d, c in out.items() if c != 0.0}


def _mul(a: Polynomial, b: Polynomial) -> Polynomial | None:
    out: Polynomial = {}
    for da, ca in a.items():
        for db, cb in b.items():
            if da + db > _MAX_DEGREE:
                return None
            out[da + db] = out.get(da + db, 0.0) + ca * cb
    return {d: c for d, c in out.items() if c != 0.0}


class PolynomialReader:
    """Reads values of one method as polynomials in the variable `x`. `nodes` collects the nodes a
    successful reading went through (the computation a rewrite replaces); `number` turns a symbol
    into the number it provably stands for (beyond `math.sqrt(2 / math.pi)`), or None."""

    def __init__(self, ix: MethodIndex, x: str, anchor: Node,
                 number: Callable[[Sym], float | None] = lambda s: None) -> None:
        self.ix, self.x, self.anchor, self.number = ix, x, anchor, number
        self.nodes: list[Node] = []

    def read(self, operand: Operand) -> Polynomial | None:
        if isinstance(operand, Var) and operand.name == self.x:
            return {1: 1.0}
        if isinstance(operand, (Const, Sym)):
            value = numeric(operand)
            if value is None and isinstance(operand, Sym):
                value = self.number(operand)
            return None if value is None else ({0: value} if value != 0.0 else {})
        if not isinstance(operand, Var):
            return None
        node = self.ix.defs.get(operand.name)
        # the same branch and inlined call as the value read: a definition elsewhere may not be the one
        if node is None or node.kind != "op" or node.guard != self.anchor.guard or node.via != self.anchor.via:
            return None
        if len(self.nodes) >= _MAX_NODES:
            return None
        args = node.inputs
        if node.op in ("add", "sub", "mul", "scale") and len(args) == 2 and not node.kwargs:
            a, b = self.read(args[0]), self.read(args[1])
            if a is None or b is None:
                return None
            out = _mul(a, b) if node.op in ("mul", "scale") else _add(a, b, -1.0 if node.op == "sub" else 1.0)
        elif node.op == "neg" and len(args) == 1 and not node.kwargs:
            a = self.read(args[0])
            out = None if a is None else {d: -c for d, c in a.items()}
        elif node.op == "pow" and len(args) == 1:
            exponent = node.kwarg("exponent")
            e = numeric(exponent) if isinstance(exponent, Const) else None
            if e is None or e != int(e) or not 0 <= e <= _MAX_DEGREE:
                return None
            base = self.read(args[0])
            out = {0: 1.0}
            for _ in range(int(e)):
                out = _mul(out, base) if out is not None and base is not None else None
        else:
            return None
        if out is not None and all(n is not node for n in self.nodes):
            self.nodes.append(node)
        return out
