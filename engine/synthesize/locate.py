"""Where each statement of a parsed region is, without libcst's position metadata.

libcst computes positions by generating the code of the whole tree again, node by node, in
Python: for a function of a hundred lines that is most of what synthesis costs. The region's
`ast` parse (C, a fraction of that) gives every statement's lines and columns; its statements are
paired with libcst's block by block (one libcst simple-statement line holds as many ast statements
as it has parts). Expressions are located only inside the one statement that needs it, by
libcst's metadata over that statement alone.
"""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider


class AlignmentError(Exception):
    """The ast and libcst parses of a region do not pair up (an unusual construct)."""


def _char_col(line_text: str, byte_col: int) -> int:
    if line_text.isascii():
        return byte_col
    return len(line_text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


class StatementIndex:
    def __init__(self, module: cst.Module, text: str) -> None:
        self.lines = text.splitlines(keepends=True)
        self.statements: list[tuple[cst.CSTNode, CodeRange]] = []
        self.ranges: dict[int, CodeRange] = {}  # id(libcst statement or if-test) -> its range
        self.parents: dict[int, cst.CSTNode] = {}
        self._keep: list[cst.CSTNode] = []  # holds every indexed node, so no id is reused
        self._block(module, list(module.body), ast.parse(text).body)

    def _range(self, first: ast.AST, last: ast.AST) -> CodeRange:
        line, end_line = first.lineno, last.end_lineno  # type: ignore[attr-defined]
        col = _char_col(self.lines[line - 1], first.col_offset)  # type: ignore[attr-defined]
        end_col = _char_col(self.lines[end_line - 1], last.end_col_offset)  # type: ignore[attr-defined]
        return CodeRange(CodePosition(line, col), CodePosition(end_line, end_col))

    def _record(self, node: cst.CSTNode, where: CodeRange, parent: cst.CSTNode) -> None:
        self.parents[id(node)] = parent
        self.ranges[id(node)] = where
        self.statements.append((node, where))
        self._keep.append(node)

    def _block(self, owner: cst.CSTNode, statements: list, nodes: list[ast.stmt]) -> None:
        i = 0
        for stmt in statements:
            if isinstance(stmt, cst.SimpleStatementLine):
                k = len(stmt.body)
                if i + k > len(nodes):
                    raise AlignmentError("fewer ast statements than libcst ones")
                self._record(stmt, self._range(nodes[i], nodes[i + k - 1]), owner)
                i += k
                continue
            if i >= len(nodes):
                raise AlignmentError("fewer ast statements than libcst ones")
            self._record(stmt, self._range(nodes[i], nodes[i]), owner)
            self._compound(stmt, nodes[i])
            i += 1
        if i != len(nodes):
            raise AlignmentError("more ast statements than libcst ones")

    def _body(self, owner: cst.CSTNode, body: cst.CSTNode, nodes: list[ast.stmt]) -> None:
        if isinstance(body, cst.IndentedBlock):
            self.parents[id(body)] = owner
            self._keep.append(body)
            self._block(body, list(body.body), nodes)

    def _else(self, owner: cst.CSTNode, orelse: cst.CSTNode | None, nodes: list[ast.stmt]) -> None:
        if orelse is None:
            return
        self.parents[id(orelse)] = owner
        self._keep.append(orelse)
        self._body(orelse, orelse.body, nodes)  # type: ignore[attr-defined]

    def _compound(self, stmt: cst.CSTNode, node: ast.stmt) -> None:
        if isinstance(stmt, cst.If) and isinstance(node, ast.If):
            self.ranges[id(stmt.test)] = self._range(node.test, node.test)
            self._keep.append(stmt.test)
            self._body(stmt, stmt.body, node.body)
            if isinstance(stmt.orelse, cst.If):
                if len(node.orelse) != 1 or not isinstance(node.orelse[0], ast.If):
                    raise AlignmentError("elif without its ast counterpart")
                self.parents[id(stmt.orelse)] = stmt
                self.ranges[id(stmt.orelse)] = self._range(node.orelse[0], node.orelse[0])
                self._keep.append(stmt.orelse)
                self._compound(stmt.orelse, node.orelse[0])
            else:
                self._else(stmt, stmt.orelse, node.orelse)
        elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef, cst.With)):
            self._body(stmt, stmt.body, node.body)  # type: ignore[attr-defined]
        elif isinstance(stmt, (cst.For, cst.While)):
            self._body(stmt, stmt.body, node.body)  # type: ignore[attr-defined]
            self._else(stmt, stmt.orelse, node.orelse)  # type: ignore[attr-defined]
        elif isinstance(stmt, (cst.Try, cst.TryStar)):
            self._body(stmt, stmt.body, node.body)  # type: ignore[attr-defined]
            for handler, ast_handler in zip(stmt.handlers, node.handlers, strict=False):  # type: ignore[attr-defined]
                self.parents[id(handler)] = stmt
                self._keep.append(handler)
                self._body(handler, handler.body, ast_handler.body)
            self._else(stmt, stmt.orelse, node.orelse)  # type: ignore[attr-defined]
            if stmt.finalbody is not None:
                self._else(stmt, stmt.finalbody, node.finalbody)  # type: ignore[attr-defined]
        # match statements and one-line suites are not entered: nothing in them is located


def expressions_in(stmt: cst.SimpleStatementLine, where: CodeRange) -> list[tuple[cst.BaseExpression, CodeRange]]:
    """Every expression of `stmt` with its range in the region, from libcst's metadata over that one
    statement (its continuation lines are shifted by the statement's own indentation)."""
    alone = stmt.with_changes(leading_lines=[])
    wrapper = MetadataWrapper(cst.Module(body=[alone]), unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    line0, col0 = where.start.line, where.start.column
    out = []
    for node, r in positions.items():
        if isinstance(node, cst.BaseExpression):
            out.append((node, CodeRange(CodePosition(r.start.line + line0 - 1, r.start.column + col0),
                                        CodePosition(r.end.line + line0 - 1, r.end.column + col0))))
    return out
