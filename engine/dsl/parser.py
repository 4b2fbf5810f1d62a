"""DSL text -> IR (the structure syntax of docs/dsl.md), with lark (LALR, grammar in structure.lark).

Errors are ``DSLSyntaxError`` (a ValueError) carrying 1-based ``line`` and ``column``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

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
from engine.dsl.lexical import DSLSyntaxError, parse_number, parse_pos, unquote_string, unquote_text
from engine.dsl.printer import implied_kind

GRAMMAR_PATH = Path(__file__).with_name("structure.lark")
_STARTS = ["start", "class_def", "method", "node", "layer_def", "operand"]


@lru_cache(maxsize=1)
def grammar() -> Lark:
    """The structure grammar, built once (LALR, contextual lexer)."""
    return Lark(GRAMMAR_PATH.read_text(encoding="utf-8"), parser="lalr", lexer="contextual",
                start=_STARTS, maybe_placeholders=True)


# Human names for terminals in error messages.
_TERMINAL_NAMES = {
    "_NL": "end of line", "$END": "end of input", "WORD": "a name", "TEXT": "a `text`",
    "ETEXT": "an e`text`", "STRING": "a string literal", "NUMBER": "a number", "POS": "a position @...",
    "COND_ID": "a condition id #N", "NOT": "'not'",
}


def _describe(terminal: str) -> str:
    if terminal in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[terminal]
    try:
        pattern = grammar().get_terminal(terminal).pattern
    except KeyError:
        return terminal
    if pattern.type == "str":
        return repr(pattern.value)
    return terminal


def _source_line(text: str, line: int) -> str | None:
    lines = text.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else None


def _syntax_error(err: UnexpectedInput, text: str) -> DSLSyntaxError:
    line, column = err.line, err.column
    if isinstance(err, UnexpectedCharacters):
        message = f"unexpected character {text[err.pos_in_stream]!r}"
    elif isinstance(err, UnexpectedEOF):
        message = "unexpected end of input"
    elif isinstance(err, UnexpectedToken):
        tok = err.token
        if tok.type == "$END":
            message = "unexpected end of input"
            line, column = max(text.count("\n"), 1), 1
        elif tok.type == "_NL":
            message = "unexpected end of line"
        else:
            what = _describe(tok.type)
            message = f"unexpected {str(tok)!r}" + ("" if what.startswith("'") else f" ({what})")
    else:  # pragma: no cover - lark has no other kinds
        message = str(err)
    expected = sorted({_describe(t) for t in (getattr(err, "expected", None) or ())})
    if expected:
        message += "; expected " + ", ".join(expected[:12]) + (" ..." if len(expected) > 12 else "")
    if not isinstance(line, int) or line < 1:
        line, column = 0, 0
    return DSLSyntaxError(message, line, column, _source_line(text, line))


def _error_at(token: Token | None, message: str) -> DSLSyntaxError:
    if isinstance(token, Token) and token.line is not None:
        return DSLSyntaxError(message, token.line, token.column or 0)
    return DSLSyntaxError(message)


class _ToIR(Transformer):
    """Parse tree -> IR. ``path`` is the file of positions written without one."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    # ---- lexical pieces
    def text(self, children):
        (tok,) = children
        try:
            return unquote_text(str(tok))
        except ValueError as exc:
            raise _error_at(tok, str(exc)) from None

    def name(self, children):
        (value,) = children
        return str(value)

    def _string(self, tok: Token) -> str:
        value = unquote_string(str(tok))
        if not isinstance(value, str):
            raise _error_at(tok, "expected a str literal, found bytes")
        return value

    def _pos(self, tok: Token | None) -> Pos | None:
        if tok is None:
            return None
        try:
            file, line, col, end_line, end_col = parse_pos(str(tok), self.path)
        except ValueError as exc:
            raise _error_at(tok, str(exc)) from None
        if col is None or end_col is None:
            raise _error_at(tok, f"position {tok} needs @line:col-end_col or @line:col-end_line:end_col")
        return Pos(file, line, col, end_line, end_col)

    # ---- operands
    def var(self, children):
        return Var(str(children[0]))

    def var_quoted(self, children):
        return Var(children[0])

    def sym(self, children):
        return Sym(children[0])

    def number(self, children):
        return Const(parse_number(str(children[0])))

    def string(self, children):
        return Const(unquote_string(str(children[0])))

    def true(self, _):
        return Const(True)

    def false(self, _):
        return Const(False)

    def none(self, _):
        return Const(None)

    def ellipsis(self, _):
        return Const(Ellipsis)

    @staticmethod
    def _operands(children) -> tuple[Operand, ...]:
        return tuple(c for c in children if c is not None)

    def paren(self, children):
        items = self._operands(children)
        if all(isinstance(i, Const) for i in items):
            return Const(tuple(i.value for i in items))
        return Seq(items, "tuple")

    def seq_tuple(self, children):
        return Seq(self._operands(children), "tuple")

    def seq_list(self, children):
        return Seq(self._operands(children), "list")

    def kwarg(self, children):
        return _Kwarg(children[0], children[1])

    def call_args(self, children):
        inputs = []
        kwargs = []
        for child in children:
            if child is None:
                continue
            if isinstance(child, _Kwarg):
                kwargs.append((child.key, child.value))
            else:
                inputs.append(child)
        return tuple(inputs), tuple(kwargs)

    # ---- guards, positions
    def cond(self, children):
        negation, cid, text = children
        return Cond(int(str(cid)[1:]), text, negation is None)

    def guard(self, children):
        return tuple(children)

    def via(self, children):
        return tuple(self._pos(t) for t in children)

    def outputs(self, children):
        return tuple(children)

    def target(self, children):
        return children[0]

    # ---- nodes
    def op_spec(self, children):
        first, second, target = children
        if second is None:
            return implied_kind(first, target is not None), first, target
        return first, second, target

    def node(self, children):
        (kind, op, target), (inputs, kwargs), outputs, pos, via, guard = children
        return Node(kind=kind, op=op, inputs=inputs, kwargs=kwargs, outputs=outputs or (),
                    target=target, guard=guard or (), pos=self._pos(pos), via=via or ())

    # ---- layers
    def items(self, children):
        return tuple(children)

    def layer_def(self, children):
        attr, type_, call, pos, guard, items = children
        args, kwargs = call if call is not None else ((), ())
        return LayerDef(attr=attr, type=type_, args=args, kwargs=kwargs, items=items or (),
                        guard=guard or (), pos=self._pos(pos))

    def init_block(self, children):
        return _Init(tuple(children))

    # ---- methods
    def param_plain(self, children):
        return ("plain", children[0], children[1], None)

    def param_star(self, children):
        return ("star", children[1], None, children[0])

    def param_varkw(self, children):
        return ("varkw", children[1], None, children[0])

    def note(self, children):
        return _Note(self._string(children[0]))

    def params(self, children):
        return tuple(c for c in children if c is not None)

    def method(self, children):
        name, items, pos_tok, *body = children
        params: list[Param] = []
        mode = "normal"
        varkw_tok = None
        for what, pname, default, tok in items:
            if varkw_tok is not None:
                shown = pname if what == "plain" else "*" + (pname or "")
                raise _error_at(varkw_tok, f"in def {name}: **{params[-1].name} must be the last parameter "
                                           f"({shown} follows it)")
            if what == "plain":
                params.append(Param(pname, default, mode))
            elif what == "star":
                if mode == "kwonly":
                    raise _error_at(tok, f"in def {name}: a second * parameter")
                mode = "kwonly"
                if pname is not None:
                    params.append(Param(pname, None, "vararg"))
            else:
                varkw_tok = tok
                params.append(Param(pname, None, "varkw"))
        notes = tuple(b.text for b in body if isinstance(b, _Note))
        nodes = tuple(b for b in body if isinstance(b, Node))
        return Method(name=name, params=tuple(params), nodes=nodes, pos=self._pos(pos_tok), notes=notes)

    # ---- classes, files
    def bases(self, children):
        return tuple(c for c in children if c is not None)

    def class_def(self, children):
        name, bases, pos, init, *methods = children
        return ClassModel(name=name, bases=bases or (), layers=init.layers if init else (),
                          methods=tuple(methods), pos=self._pos(pos))

    def diag(self, children):
        severity, pos_tok, message = children
        try:
            file, line, col, _, _ = parse_pos(str(pos_tok), self.path)
        except ValueError as exc:
            raise _error_at(pos_tok, str(exc)) from None
        if col is not None:
            raise _error_at(pos_tok, f"a diagnostic's position is @line or @\"file\":line, not {pos_tok}")
        return Diagnostic(file=file, line=line, message=self._string(message), severity=severity)

    def header(self, children):
        return _Header(self._string(children[0]), children[1])

    def start(self, children):
        header, *rest = children
        diags = tuple(r for r in rest if isinstance(r, Diagnostic))
        classes = tuple(r for r in rest if isinstance(r, ClassModel))
        return FileModel(path=header.path, module=header.module, classes=classes, diagnostics=diags)


class _Kwarg:
    __slots__ = ("key", "value")

    def __init__(self, key: str, value: Operand):
        self.key, self.value = key, value


class _Note:
    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


class _Init:
    __slots__ = ("layers",)

    def __init__(self, layers: tuple[LayerDef, ...]):
        self.layers = layers


class _Header:
    __slots__ = ("path", "module")

    def __init__(self, path: str, module: str):
        self.path, self.module = path, module


def _parse(text: str, start: str, path: str | None):
    if start != "operand" and not text.endswith("\n"):
        text += "\n"
    try:
        tree = grammar().parse(text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err, text) from None
    if path is None:  # a whole file: positions default to the header's path
        header = tree.children[0]
        assert isinstance(header, Tree) and header.data == "header"
        path = str(unquote_string(str(header.children[0])))
    try:
        return _ToIR(path).transform(tree)
    except VisitError as err:
        exc = err.orig_exc
        if isinstance(exc, DSLSyntaxError):
            if exc.line and exc.source_line is None:
                raise DSLSyntaxError(exc.message, exc.line, exc.column, _source_line(text, exc.line)) from None
            raise exc from None
        raise DSLSyntaxError(f"{type(exc).__name__}: {exc}") from None


def parse_file(text: str) -> FileModel:
    """Parse the text of a whole file model (``print_file``'s output)."""
    return _parse(text, "start", None)


def parse_class(text: str, path: str = "") -> ClassModel:
    return _parse(text, "class_def", path)


def parse_method(text: str, path: str = "") -> Method:
    return _parse(text, "method", path)


def parse_node(text: str, path: str = "") -> Node:
    """One node line; positions written without a file are in ``path``."""
    return _parse(text, "node", path)


def parse_layer(text: str, path: str = "") -> LayerDef:
    return _parse(text, "layer_def", path)


def parse_operand(text: str) -> Operand:
    return _parse(text, "operand", "")
