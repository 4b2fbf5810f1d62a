"""Helpers for extraction tests: follow data flow through a method's SSA definitions."""

from __future__ import annotations

from engine.dsl.ir import Method, Node, Operand, Var


def producer(method: Method, operand: Operand) -> Node | None:
    """The node that defines `operand` (None for a parameter or a non-variable)."""
    if not isinstance(operand, Var):
        return None
    return method.defs().get(operand.name)


def source_of(method: Method, operand: Operand, *, through: tuple[str, ...] = ("phi", "assign")) -> Node | None:
    """Like `producer`, but looking through plain assignments (and phi nodes: their first input)."""
    node = producer(method, operand)
    while node is not None and (node.kind in through or node.op in through):
        node = producer(method, node.inputs[0])
    return node


def ops(method: Method, op: str, kind: str | None = None) -> list[Node]:
    return [n for n in method.nodes if n.op == op and (kind is None or n.kind == kind)]


def one(method: Method, op: str, kind: str | None = None) -> Node:
    found = ops(method, op, kind)
    assert len(found) == 1, f"expected one {op!r} node in {method.name}, found {len(found)}: {found}"
    return found[0]


def guard_texts(node: Node) -> list[tuple[str, bool]]:
    return [(c.text, c.taken) for c in node.guard]


def sources(method: Method, operand: Operand) -> list[Node]:
    """Every non-phi node whose value can reach `operand` through phi nodes (any branch)."""
    out: list[Node] = []
    todo = [operand]
    seen: set[str] = set()
    while todo:
        current = todo.pop()
        if not isinstance(current, Var) or current.name in seen:
            continue
        seen.add(current.name)
        node = producer(method, current)
        if node is None:
            continue
        if node.kind == "phi":
            todo.extend(node.inputs)
        else:
            out.append(node)
    return out
