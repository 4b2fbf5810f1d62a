"""IR -> DSL text (the structure syntax of docs/dsl.md). Deterministic: equal IR, equal text.

``engine.dsl.parser`` reads the text back: ``parse_file(print_file(fm)) == fm``.

Positions whose file equals the enclosing file's path (``path``) are written without the file.
"""

from __future__ import annotations

from engine.dsl.ir import (
    ClassModel,
    Cond,
    Const,
    Diagnostic,
    FileModel,
    LayerDef,
    Method,
    Node,
    Operand,
    Param,
    Pos,
    Seq,
    Sym,
    Var,
)
from engine.dsl.lexical import (
    format_line_pos,
    format_number,
    format_pos,
    is_bare,
    quote_name,
    quote_string,
    quote_text,
)

INDENT = "  "

# Node kinds that the op name alone implies when it equals the kind: ``phi(a, b) -> c``.
SPECIAL_KINDS = ("phi", "return", "store", "yield")


def implied_kind(op: str, has_target: bool) -> str:
    """The kind a node line without an explicit kind word has."""
    if op in SPECIAL_KINDS:
        return op
    return "layer" if has_target else "op"


# ---------------------------------------------------------------------------------------------
# Operands


def print_const(value: object) -> str:
    if value is None:
        return "None"
    if value is True:
        return "True"
    if value is False:
        return "False"
    if value is Ellipsis:
        return "..."
    if isinstance(value, int | float) and type(value) in (int, float):
        return format_number(value)
    if type(value) is str:
        return quote_string(value)
    if type(value) is bytes:
        return repr(value)
    if type(value) is tuple:
        if len(value) == 1:
            return "(" + print_const(value[0]) + ",)"
        return "(" + ", ".join(print_const(v) for v in value) + ")"
    raise ValueError(f"cannot print a constant of type {type(value).__name__}: {value!r} "
                     "(constants are int, float, str, bytes, bool, None, Ellipsis or tuples of those)")


def _items(items: tuple[Operand, ...], one_comma: bool) -> str:
    body = ", ".join(print_operand(i) for i in items)
    return body + "," if one_comma and len(items) == 1 else body


def print_operand(operand: Operand) -> str:
    if isinstance(operand, Var):
        return operand.name if is_bare(operand.name) else "%" + quote_text(operand.name)
    if isinstance(operand, Sym):
        return quote_text(operand.text)
    if isinstance(operand, Const):
        return print_const(operand.value)
    if isinstance(operand, Seq):
        if operand.kind == "list":
            return "[" + _items(operand.items, False) + "]"
        if operand.kind == "tuple":
            # A parenthesized group of constants only reads back as a Const tuple: mark it.
            marker = "" if any(not isinstance(i, Const) for i in operand.items) else "%"
            return marker + "(" + _items(operand.items, True) + ")"
        raise ValueError(f"cannot print a Seq of kind {operand.kind!r} (only 'tuple' and 'list')")
    raise ValueError(f"not an operand: {operand!r}")


def _args(inputs: tuple[Operand, ...], kwargs: tuple[tuple[str, Operand], ...]) -> str:
    parts = [print_operand(o) for o in inputs]
    parts += [f"{quote_name(k)}={print_operand(v)}" for k, v in kwargs]
    return "(" + ", ".join(parts) + ")"


def _guard(guard: tuple[Cond, ...]) -> str:
    conds = []
    for cond in guard:
        if not isinstance(cond.id, int) or isinstance(cond.id, bool):
            raise ValueError(f"a condition id must be an int: {cond!r}")
        conds.append(("" if cond.taken else "not ") + f"#{cond.id} " + quote_text(cond.text))
    return "if " + " and ".join(conds)


def _tail(pos: Pos | None, via: tuple[Pos, ...], guard: tuple[Cond, ...], path: str) -> str:
    parts = []
    if pos is not None:
        parts.append(format_pos(pos, path))
    if via:
        parts.append("via " + " ".join(format_pos(p, path) for p in via))
    if guard:
        parts.append(_guard(guard))
    return "".join(" " + p for p in parts)


# ---------------------------------------------------------------------------------------------
# Nodes, layers, methods, classes, files


def print_node(node: Node, path: str = "") -> str:
    """One line, no indentation, no newline."""
    head = quote_name(node.op)
    if implied_kind(node.op, node.target is not None) != node.kind:
        head = quote_name(node.kind) + " " + head
    if node.target is not None:
        head += "<" + quote_name(node.target) + ">"
    out = head + _args(node.inputs, node.kwargs)
    if node.outputs:
        out += " -> " + ", ".join(quote_name(o) for o in node.outputs)
    return out + _tail(node.pos, node.via, node.guard, path)


def _layer_lines(layer: LayerDef, path: str, indent: str) -> list[str]:
    line = f"{indent}{quote_name(layer.attr)} = {quote_name(layer.type)}"
    if layer.args or layer.kwargs:
        line += _args(layer.args, layer.kwargs)
    line += _tail(layer.pos, (), layer.guard, path)
    if not layer.items:
        return [line]
    lines = [line + " ["]
    for item in layer.items:
        lines += _layer_lines(item, path, indent + INDENT)
    return lines + [indent + "]"]


def print_layer(layer: LayerDef, path: str = "") -> str:
    """A layer table entry: one line, or several when it has items."""
    return "\n".join(_layer_lines(layer, path, ""))


def _params(params: tuple[Param, ...]) -> str:
    # Python order: normal* [*vararg | *] kwonly* [**varkw]
    order = {"normal": 0, "vararg": 1, "kwonly": 2, "varkw": 3}
    parts: list[str] = []
    stage = 0
    for param in params:
        rank = order.get(param.kind)
        if rank is None:
            raise ValueError(f"unknown parameter kind {param.kind!r}")
        if rank < stage or (rank == stage and rank in (1, 3)) or stage == 3:
            raise ValueError(f"parameters are not in Python signature order at {param!r}")
        if rank == 2 and stage < 1:
            parts.append("*")
        stage = max(stage, rank) if rank != 1 else 2
        if param.kind in ("vararg", "varkw") and param.default is not None:
            raise ValueError(f"a {param.kind} parameter has no default: {param!r}")
        prefix = {"vararg": "*", "varkw": "**"}.get(param.kind, "")
        text = prefix + quote_name(param.name)
        if param.default is not None:
            text += "=" + print_operand(param.default)
        parts.append(text)
    return "(" + ", ".join(parts) + ")"


def _method_lines(method: Method, path: str, indent: str) -> list[str]:
    head = f"{indent}def {quote_name(method.name)}{_params(method.params)}:"
    if method.pos is not None:
        head += " " + format_pos(method.pos, path)
    lines = [head]
    lines += [f"{indent}{INDENT}note {quote_string(n)}" for n in method.notes]
    lines += [indent + INDENT + print_node(n, path) for n in method.nodes]
    return lines


def print_method(method: Method, path: str = "") -> str:
    return "\n".join(_method_lines(method, path, ""))


def _class_lines(cls: ClassModel, path: str) -> list[str]:
    head = "class " + quote_name(cls.name)
    if cls.bases:
        head += "(" + ", ".join(quote_name(b) for b in cls.bases) + ")"
    head += ":"
    if cls.pos is not None:
        head += " " + format_pos(cls.pos, path)
    lines = [head]
    if cls.layers:
        lines.append(INDENT + "init:")
        for layer in cls.layers:
            lines += _layer_lines(layer, path, INDENT * 2)
    for method in cls.methods:
        lines += _method_lines(method, path, INDENT)
    return lines


def print_class(cls: ClassModel, path: str = "") -> str:
    return "\n".join(_class_lines(cls, path))


def print_diagnostic(diag: Diagnostic, path: str = "") -> str:
    return (f"diag {quote_name(diag.severity)} {format_line_pos(diag.file, diag.line, path)} "
            f"{quote_string(diag.message)}")


def print_file(fm: FileModel) -> str:
    """The whole file model, newline-terminated."""
    lines = [f"file {quote_string(fm.path)} module {quote_name(fm.module)}"]
    lines += [print_diagnostic(d, fm.path) for d in fm.diagnostics]
    for cls in fm.classes:
        lines.append("")
        lines += _class_lines(cls, fm.path)
    return "\n".join(lines) + "\n"
