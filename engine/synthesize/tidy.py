"""Write a synthesized expression as a person would: no defensive parentheses, no double `~`, no
metadata read through a cast (`q.to(torch.float32).dtype` is `torch.float32`).

Templates and bindings are filled in as text, so every bound expression arrives parenthesized
(`scale=(1 / (math.sqrt(d)))`); here each pair of parentheses goes unless the precedence of the
operators around it needs it.
"""

from __future__ import annotations

import libcst as cst

# binding strength of an expression's outermost operator (higher binds tighter)
_BINARY = {
    cst.Power: 12, cst.Multiply: 10, cst.Divide: 10, cst.FloorDivide: 10, cst.Modulo: 10, cst.MatrixMultiply: 10,
    cst.Add: 9, cst.Subtract: 9, cst.LeftShift: 8, cst.RightShift: 8, cst.BitAnd: 7, cst.BitXor: 6, cst.BitOr: 5,
}
_ATOM = 13


def _strength(node: cst.BaseExpression) -> int:
    if isinstance(node, cst.BinaryOperation):
        return _BINARY[type(node.operator)]
    if isinstance(node, cst.UnaryOperation):
        return 3 if isinstance(node.operator, cst.Not) else 11
    if isinstance(node, cst.Comparison):
        return 4
    if isinstance(node, cst.BooleanOperation):
        return 2 if isinstance(node.operator, cst.And) else 1
    if isinstance(node, cst.IfExp):
        return 0
    if isinstance(node, (cst.Lambda, cst.NamedExpr, cst.Yield, cst.Await)):
        return -1
    if isinstance(node, (cst.Tuple, cst.GeneratorExp)):
        return -2  # parentheses are part of what they are wherever they stand
    return _ATOM


def _unwrap(node: cst.BaseExpression, needed: int, right_of: type | None = None) -> cst.BaseExpression:
    """Drop the parentheses of `node` where its strength is at least `needed` (strictly more on the
    side where the operator does not associate)."""
    if not node.lpar:
        return node
    strength = _strength(node)
    if strength < needed or strength == -2:
        return node
    if right_of is not None and strength == needed and strength != _ATOM:
        return node  # a - (b - c), a ** (b ** c) reads differently without them
    return node.with_changes(lpar=[], rpar=[])


class _Tidy(cst.CSTTransformer):
    def leave_UnaryOperation(self, original, updated):  # noqa: N802 - libcst's visitor names
        inner = updated.expression
        if isinstance(updated.operator, cst.BitInvert) and isinstance(inner, cst.UnaryOperation) \
                and isinstance(inner.operator, cst.BitInvert):
            # ~~m is m for booleans and integers alike
            kept = inner.expression
            return kept.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar else kept
        need = 11 if not isinstance(updated.operator, cst.Not) else 3
        return updated.with_changes(expression=_unwrap(inner, need + (0 if need == 3 else 1)))

    def leave_BinaryOperation(self, original, updated):  # noqa: N802
        strength = _BINARY[type(updated.operator)]
        if isinstance(updated.operator, cst.Power):
            # the left of ** binds tighter than unary minus; the right may be unary (`d ** -0.5`)
            return updated.with_changes(left=_unwrap(updated.left, _ATOM), right=_unwrap(updated.right, 11))
        return updated.with_changes(left=_unwrap(updated.left, strength),
                                    right=_unwrap(updated.right, strength, right_of=type(updated.operator)))

    def leave_BooleanOperation(self, original, updated):  # noqa: N802
        # `and`/`or` associate: a or (b or c) is a or b or c, evaluated in the same order
        strength = 2 if isinstance(updated.operator, cst.And) else 1
        return updated.with_changes(left=_unwrap(updated.left, strength), right=_unwrap(updated.right, strength))

    def leave_Arg(self, original, updated):  # noqa: N802
        return updated.with_changes(value=_unwrap(updated.value, -1))

    def leave_Element(self, original, updated):  # noqa: N802
        return updated.with_changes(value=_unwrap(updated.value, -1))

    def leave_Attribute(self, original, updated):  # noqa: N802
        updated = updated.with_changes(value=_unwrap(updated.value, _ATOM))
        cast = _dtype_cast(updated.value)
        if cast is None:
            receiver = _moved(updated.value)
            if receiver is not None and updated.attr.value in _KEPT_BY_MOVES:  # `x.to(dtype).shape` is x.shape
                return updated.with_changes(value=receiver)
            return updated
        receiver, dtype = cast
        if updated.attr.value == "dtype":  # `q.to(torch.float32).dtype` is torch.float32
            return dtype.with_changes(lpar=updated.lpar, rpar=updated.rpar) if updated.lpar else dtype
        if updated.attr.value in _KEPT_BY_CASTS:  # a cast keeps the shape and the device
            return updated.with_changes(value=receiver)
        return updated

    def leave_Call(self, original, updated):  # noqa: N802
        return updated.with_changes(func=_unwrap(updated.func, _ATOM))

    def leave_Subscript(self, original, updated):  # noqa: N802
        return updated.with_changes(value=_unwrap(updated.value, _ATOM))

    def leave_IfExp(self, original, updated):  # noqa: N802
        return updated.with_changes(body=_unwrap(updated.body, 1), test=_unwrap(updated.test, 1))


_KEPT_BY_CASTS = {"shape", "size", "device", "ndim", "dim", "numel"}
_KEPT_BY_MOVES = _KEPT_BY_CASTS - {"device"}  # whatever `.to(v)` is given, a dtype or a device
_DTYPES = {"float32", "float", "float16", "half", "bfloat16", "float64", "double"}
_CAST_METHODS = {"float": "float32", "half": "float16", "double": "float64", "bfloat16": "bfloat16"}


def _dtype_cast(node: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
    """(x, the dtype) where `node` is `x.to(torch.<dtype>)`, `x.float()` or the like: a change of
    dtype only."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
        return None
    method = node.func.attr.value
    if method in _CAST_METHODS and not node.args:
        return node.func.value, cst.parse_expression(f"torch.{_CAST_METHODS[method]}")
    if method != "to" or len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
        return None
    arg = node.args[0].value
    if isinstance(arg, cst.Attribute) and isinstance(arg.value, cst.Name) and arg.value.value == "torch" \
            and arg.attr.value in _DTYPES:
        return node.func.value, arg.with_changes(lpar=[], rpar=[])
    return None


def _moved(node: cst.BaseExpression) -> cst.BaseExpression | None:
    """x where `node` is `x.to(v)` with one positional argument: a change of dtype or device only."""
    if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute) or node.func.attr.value != "to":
        return None
    if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
        return None
    return node.func.value


def tidy(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`expr` without redundant parentheses and with `~~m` written `m`."""
    out = expr.visit(_Tidy())
    assert isinstance(out, cst.BaseExpression)
    return _unwrap(out, -1)
