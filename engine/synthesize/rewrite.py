"""Synthesis: turn one rewritable finding into edited source, with libcst (never string surgery).

For a finding the rewrite
  * replaces the root expression (the value the pattern ends in) by the rule's template, filled
    with the match's bindings;
  * removes the statements that only computed intermediates of the match (an `if` left empty goes
    too);
  * for a guarded finding, keeps the original statements under `if <guard>:` and puts the rewrite
    in the `else:` branch;
  * adds the rule's imports where missing.
Comments and formatting outside the edited statements are untouched (libcst round-trips them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider

from engine.dsl.ir import Const, Node, Operand, Pos, Seq, Sym, Var
from engine.match.matcher import Finding, Match
from engine.synthesize import layout
from engine.synthesize.template import TemplateError, render_template

_TEMP = re.compile(r"^_t\d+$|^_if(\.\d+)?$|^_[A-Za-z_]\w*(\.\d+)?$")


class SynthesisError(Exception):
    """A finding that cannot be rewritten safely; the message says why."""


@dataclass
class _Located:
    node: cst.CSTNode
    range: CodeRange


def _char_col(line_text: str, byte_col: int) -> int:
    if line_text.isascii():
        return byte_col
    return len(line_text.encode("utf-8")[:byte_col].decode("utf-8", "replace"))


class _Index(cst.CSTVisitor):
    """Every expression and statement with its position."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, lines: tuple[int, int] | None = None) -> None:
        self.expressions: list[_Located] = []
        self.statements: list[_Located] = []
        self.lines = lines  # only statements overlapping these lines are indexed (big files)
        self.parents: dict[int, cst.CSTNode] = {}  # id(node) -> parent, for the indexed region
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        # libcst calls on_leave for every node on_visit saw, pruned or not: keep the stack in step
        if self._stack:
            self.parents[id(node)] = self._stack[-1]
        self._stack.append(node)
        if isinstance(node, cst.BaseExpression):
            self.expressions.append(_Located(node, self.get_metadata(PositionProvider, node)))
        elif isinstance(node, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            where = self.get_metadata(PositionProvider, node)
            if self.lines is not None and (where.end.line < self.lines[0] or where.start.line > self.lines[1]):
                return False
            self.statements.append(_Located(node, where))
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()


def _contains(outer: CodeRange, line: int, col: int, end_line: int, end_col: int) -> bool:
    start_ok = (outer.start.line, outer.start.column) <= (line, col)
    end_ok = (outer.end.line, outer.end.column) >= (end_line, end_col)
    return start_ok and end_ok


def _size(r: CodeRange) -> tuple[int, int]:
    return (r.end.line - r.start.line, (r.end.column - r.start.column) if r.end.line == r.start.line else 10**6)


class _Rewriter(cst.CSTTransformer):
    """Replaces the root expression and removes statements. A removed statement's comment lines
    move to the next statement that stays, so the code's explanations survive the edit."""

    def __init__(self, replace: dict[cst.CSTNode, cst.CSTNode], remove: set[cst.CSTNode]) -> None:
        self.replace = replace
        self.remove = remove
        # updated statements to take out of their block, by id; the nodes are held here so that no
        # other node can be given the same id while the rewrite runs
        self.dropped: dict[int, cst.CSTNode] = {}

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        if original in self.replace:
            return self.replace[original]
        if original in self.remove:
            self.dropped[id(updated)] = updated
            return updated
        if isinstance(updated, (cst.IndentedBlock, cst.Module)):
            return updated.with_changes(body=self._filter(updated.body))
        if isinstance(updated, cst.If) and isinstance(original, cst.If):
            body = updated.body
            if isinstance(body, cst.IndentedBlock) and not body.body:
                if updated.orelse is None:
                    self.dropped[id(updated)] = updated
                    return updated
                return updated.with_changes(body=body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])]))
        body = getattr(updated, "body", None)
        if isinstance(body, cst.IndentedBlock) and not body.body and not isinstance(updated, cst.If):
            return updated.with_changes(body=body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])]))
        return updated

    def _filter(self, body) -> list:
        kept: list = []
        carried: list[cst.EmptyLine] = []
        for stmt in body:
            lines = list(getattr(stmt, "leading_lines", ()))
            if id(stmt) in self.dropped:
                carried.extend(ln for ln in lines if ln.comment is not None)
                continue
            if carried:
                stmt = stmt.with_changes(leading_lines=[*lines, *carried] if not lines else [*lines[:1], *carried, *lines[1:]])
                carried = []
            kept.append(stmt)
        return kept

class _Splice(cst.CSTTransformer):
    """Replace a contiguous run of statements of one block by one new statement."""

    def __init__(self, first: cst.CSTNode, run: list[cst.CSTNode], new: cst.BaseStatement) -> None:
        self.first = first
        self.run = set(run)
        self.new = new

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        if original is self.first:
            return self.new
        if original in self.run:
            return cst.RemoveFromParent()
        return updated


def _python_name(ssa: str) -> str:
    return ssa.split(".", 1)[0]


class Synthesizer:
    def __init__(self, text: str, lines: tuple[int, int] | None = None) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.module = cst.parse_module(text)
        self.wrapper = MetadataWrapper(self.module, unsafe_skip_copy=True)
        self.index = _Index(lines)
        self.wrapper.visit(self.index)

    # -- locating -----------------------------------------------------------------------------

    def char_range(self, pos: Pos) -> tuple[int, int, int, int]:
        line_text = self.lines[pos.line - 1] if pos.line - 1 < len(self.lines) else ""
        end_text = self.lines[pos.end_line - 1] if pos.end_line - 1 < len(self.lines) else ""
        return pos.line, _char_col(line_text, pos.col), pos.end_line, _char_col(end_text, pos.end_col)

    def expression_at(self, pos: Pos) -> cst.BaseExpression:
        line, col, end_line, end_col = self.char_range(pos)
        best: _Located | None = None
        for item in self.index.expressions:
            if _contains(item.range, line, col, end_line, end_col):
                if best is None or _size(item.range) < _size(best.range):
                    best = item
        if best is None:
            raise SynthesisError(f"no expression at line {pos.line}")
        return best.node  # type: ignore[return-value]

    def statement_at(self, pos: Pos) -> _Located:
        line, col, end_line, end_col = self.char_range(pos)
        best: _Located | None = None
        for item in self.index.statements:
            if isinstance(item.node, cst.SimpleStatementLine) and _contains(item.range, line, col, end_line, end_col):
                if best is None or _size(item.range) < _size(best.range):
                    best = item
        if best is None:
            raise SynthesisError(f"no simple statement at line {pos.line}")
        return best

    def source(self, pos: Pos) -> str:
        line, col, end_line, end_col = self.char_range(pos)
        if line == end_line:
            return self.lines[line - 1][col:end_col]
        parts = [self.lines[line - 1][col:], *self.lines[line:end_line - 1], self.lines[end_line - 1][:end_col]]
        return "".join(parts)

    def block_of(self, node: cst.CSTNode) -> tuple[cst.CSTNode, list[cst.CSTNode]]:
        """The statement list (module or indented block) that holds `node` directly."""
        parents = self.index.parents
        current = node
        while True:
            parent = parents.get(id(current))
            if parent is None:
                raise SynthesisError("statement has no enclosing block")
            if isinstance(parent, (cst.IndentedBlock, cst.Module)):
                return current, list(parent.body)
            current = parent

    # -- the rewrite ----------------------------------------------------------------------------

    def rewrite(self, finding: Finding) -> str:
        match = finding.match
        if match is None or not match.rule.rewrite:
            raise SynthesisError("the rule has no rewrite")
        root = match.root
        if root.via:
            raise SynthesisError("the match lies inside a helper inlined into its caller")
        if root.pos is None:
            raise SynthesisError("the root has no source position")
        matched = match.matched_nodes
        matched_ids = {id(n) for n in matched}
        root_stmt = self.statement_at(root.pos)
        root_expr = self.expression_at(root.pos)

        # statements of the other matched nodes: removable when they only compute intermediates.
        # A matched value the template names, and that the code holds in a variable of its own
        # (`h = h.to(torch.float32)`), stays: the rewrite reads that variable.
        named = set(re.findall(r"\$([A-Za-z_]\w*)", match.rule.rewrite))
        kept_nodes = {id(n) for key, n in match.nodes.items()
                      if key in named and n.outputs and not _TEMP.match(n.outputs[0])}
        others: dict[cst.CSTNode, _Located] = {}
        for node in matched:
            if node.pos is None or id(node) in kept_nodes:
                continue
            located = self.statement_at(node.pos)
            if located.node is not root_stmt.node:
                others[located.node] = located
        method_nodes = [n for n in match.method.nodes if n.via == root.via and n.pos is not None]
        for located in others.values():
            self._check_removable(located, method_nodes, matched_ids, match)

        new_code = layout.result(match, render_template(
            match.rule.rewrite, layout.lookup(match, lambda name: self.lookup(name, match, root_expr),
                                              lambda operand: self.render(operand, match))))
        try:
            new_expr = cst.parse_expression(new_code)
        except cst.ParserSyntaxError as exc:
            raise SynthesisError(f"the rule's template gives invalid Python: {new_code!r}") from exc
        if not isinstance(new_expr, (cst.Call, cst.Name, cst.Attribute, cst.Subscript)):
            new_expr = new_expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        self._check_names(match, root)

        for check in finding.checks:
            others[self._raising_if(check)] = None  # type: ignore[assignment]
        if finding.status == "guarded":
            return self._guarded(finding, root_stmt, root_expr, new_expr, list(others))
        updated = self.wrapper.module.visit(_Rewriter({root_expr: new_expr}, set(others)))
        return updated.code

    def _guarded(self, finding: Finding, root_stmt: _Located, root_expr: cst.BaseExpression,
                 new_expr: cst.BaseExpression, removable: list[cst.CSTNode]) -> str:
        anchor, body = self.block_of(root_stmt.node)
        positions = {id(s): i for i, s in enumerate(body)}
        indices = [positions[id(anchor)]]
        for stmt in removable:
            # a statement nested in an `if` of this block counts as that block-level statement
            top = stmt if id(stmt) in positions else self._climb(stmt, positions)
            indices.append(positions[id(top)])
        first, last = min(indices), max(indices)
        if last != positions[id(anchor)]:
            raise SynthesisError("an intermediate is computed after the rewritten value")
        run = body[first:last + 1]
        rewriter = _Rewriter({root_expr: new_expr}, set(removable))
        rewritten_run = rewriter._filter([s.visit(rewriter) for s in run])
        # on the kernel's path the match's branch decisions hold: an `if` whose test the match
        # needs false is dead there
        dead_tests = {" ".join(text.split()) for cid, text in finding.match.cond_text.items()  # type: ignore[union-attr]
                      if finding.match.conditions.get(cid) is False}  # type: ignore[union-attr]
        kept = [s for s in rewritten_run if not isinstance(s, cst.RemovalSentinel)
                and not (isinstance(s, cst.If) and s.orelse is None
                         and " ".join(self.module.code_for_node(s.test).split()) in dead_tests)]
        if kept and hasattr(kept[0], "leading_lines"):
            kept[0] = kept[0].with_changes(leading_lines=[ln for ln in kept[0].leading_lines if ln.comment])
        guard = cst.parse_expression(finding.guard_text or "False")
        original_first = run[0]
        blank = [ln for ln in getattr(original_first, "leading_lines", ()) if ln.comment is None]
        clones = [s.deep_clone() for s in run]
        if hasattr(clones[0], "leading_lines"):
            clones[0] = clones[0].with_changes(leading_lines=[ln for ln in clones[0].leading_lines if ln.comment])
        new_if = cst.If(
            test=guard,
            body=cst.IndentedBlock(body=clones),  # type: ignore[arg-type]
            orelse=cst.Else(body=cst.IndentedBlock(body=kept or [cst.SimpleStatementLine([cst.Pass()])])),  # type: ignore[arg-type]
            leading_lines=blank,
        )
        updated = self.wrapper.module.visit(_Splice(run[0], run[1:], new_if))
        return updated.code

    def _raising_if(self, pos: Pos) -> cst.CSTNode:
        """The `if <test>: raise ...` statement whose test is at `pos`."""
        line, col, end_line, end_col = self.char_range(pos)
        for item in self.index.statements:
            node = item.node
            if isinstance(node, cst.If) and node.orelse is None and _contains(item.range, line, col, end_line, end_col):
                body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
                if body and all(isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.Raise) for x in s.body)
                                for s in body):
                    test_range = self.wrapper.resolve(PositionProvider)[node.test]
                    if _contains(test_range, line, col, end_line, end_col):
                        return node
        raise SynthesisError(f"the shape check at line {pos.line} is not an `if ...: raise` statement")

    def _climb(self, node: cst.CSTNode, positions: dict[int, int]) -> cst.CSTNode:
        parents = self.index.parents
        current = parents.get(id(node))
        while current is not None and id(current) not in positions:
            current = parents.get(id(current))
        if current is None:
            raise SynthesisError("the match spans blocks that cannot be guarded together")
        return current

    def _check_removable(self, located: _Located, method_nodes: list[Node], matched_ids: set[int], match: Match) -> None:
        r = located.range
        for node in method_nodes:
            assert node.pos is not None
            line, col, end_line, end_col = self.char_range(node.pos)
            if not _contains(r, line, col, end_line, end_col) or id(node) in matched_ids or node.kind == "phi":
                continue
            named = [o for o in node.outputs if not _TEMP.match(o)]
            if named or node.kind in ("return", "store", "yield"):
                what = ", ".join(_python_name(o) for o in named) or node.kind
                raise SynthesisError(f"line {node.pos.line} also computes {what}, which the rewrite would lose")

    def _check_names(self, match: Match, root: Node) -> None:
        """A bound variable rendered by name must still hold that value at the root."""
        order = {id(n): i for i, n in enumerate(match.method.nodes)}
        root_index = order.get(id(root), len(match.method.nodes))
        removed = {id(n) for n in match.nodes.values()}
        outputs = {s.out for s in (match.pattern.stmts if match.pattern else ()) if s.out}
        for var, operand in match.bindings.items():
            if var in outputs or not isinstance(operand, Var) or _TEMP.match(operand.name):
                continue
            base = _python_name(operand.name)
            latest = None
            root_path = {c.id: c.taken for c in root.guard}
            for node in match.method.nodes[:root_index]:
                if id(node) in removed:
                    continue
                if node.via != root.via and operand.name not in node.outputs:
                    continue  # a helper's own variables (its return value is the bound one itself)
                if any(root_path.get(c.id, c.taken) != c.taken for c in node.guard):
                    continue  # on the other branch of an `if` the root is under: not on its path
                if any(_python_name(o) == base for o in node.outputs):
                    latest = node
            if latest is None:
                continue
            if operand.name in latest.outputs:
                continue
            if latest.kind == "phi" and any(isinstance(i, Var) and i.name == operand.name for i in latest.inputs):
                continue
            raise SynthesisError(f"`{base}` is reassigned between its use in the match and the rewrite")

    def lookup(self, name: str, match: Match, root_expr: cst.BaseExpression) -> str | None:
        if name in ("callee", "args"):
            if not isinstance(root_expr, cst.Call):
                return None
            if name == "callee":
                return self.module.code_for_node(root_expr.func)
            return ", ".join(self.module.code_for_node(a).rstrip(", ").rstrip(",") for a in root_expr.args)
        operand = match.bindings.get(name)
        if operand is None:
            return None
        return self.render(operand, match)

    def render(self, operand: Operand, match: Match) -> str:
        if isinstance(operand, Var):
            if _TEMP.match(operand.name):
                producer = next((n for n in match.method.nodes if operand.name in n.outputs), None)
                if producer is None or producer.pos is None:
                    raise SynthesisError(f"cannot find the expression of {operand.name}")
                if producer.kind == "phi":
                    raise SynthesisError("a bound value is chosen by a conditional expression")
                text = self.source(producer.pos)
                return text if text.isidentifier() else f"({' '.join(text.split())})"
            return _python_name(operand.name)
        if isinstance(operand, Const):
            return repr(operand.value)
        if isinstance(operand, Sym):
            text = operand.text
            return text if re.fullmatch(r"[\w.\[\]]+", text) else f"({text})"
        if isinstance(operand, Seq):
            inner = ", ".join(self.render(i, match) for i in operand.items)
            if operand.kind == "list":
                return f"[{inner}]"
            return f"({inner},)" if len(operand.items) == 1 else f"({inner})"
        raise SynthesisError(f"cannot render {operand!r}")


def add_imports(text: str, imports: list[str]) -> str:
    """Add each import statement unless the module already binds what it imports."""
    if not imports:
        return text
    module = cst.parse_module(text)
    import ast

    tree = ast.parse(text)
    bound: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            bound.update(a.asname or a.name.partition(".")[0] for a in stmt.names)
            bound.update(a.name for a in stmt.names if not a.asname)
        elif isinstance(stmt, ast.ImportFrom):
            bound.update(a.asname or a.name for a in stmt.names)
    missing = []
    for line in imports:
        parsed = ast.parse(line).body[0]
        names = ([a.asname or a.name for a in parsed.names] if isinstance(parsed, (ast.Import, ast.ImportFrom)) else [])
        if isinstance(parsed, ast.Import):
            names = [a.asname or a.name for a in parsed.names]
        if not all(n in bound for n in names):
            missing.append(line)
    if not missing:
        return text
    body = list(module.body)
    insert_at = 0
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.SimpleStatementLine) and all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            insert_at = i + 1
        elif i == 0 and isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) \
                and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)):
            insert_at = 1  # after the module docstring
    new = [cst.parse_statement(line) for line in missing]
    body[insert_at:insert_at] = new
    return module.with_changes(body=body).code


__all__ = ["SynthesisError", "Synthesizer", "TemplateError", "add_imports"]
