"""Synthesis: turn rewritable findings into edits of one parsed region, with libcst (never string
surgery).

A `Synthesizer` holds one libcst parse of a region of a file (the function that holds the findings,
see `region.py`); `edit(finding)` computes a finding's edit against that parse without changing it,
and `apply(edits)` makes all of them in one pass. For a finding the edit
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

import ast
import itertools
import re
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.helpers import get_full_name_for_node
from libcst.metadata import CodeRange

from engine.dsl.ir import Const, Node, Operand, Pos, Seq, Sym, Var
from engine.match.matcher import Finding, Match
from engine.synthesize import callsite, layout
from engine.synthesize.context import FileContext
from engine.synthesize.locate import AlignmentError, StatementIndex, expressions_in
from engine.synthesize.strings import split_long_strings
from engine.synthesize.template import TemplateError, render_template
from engine.synthesize.tidy import tidy

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


def _contains(outer: CodeRange, line: int, col: int, end_line: int, end_col: int) -> bool:
    start_ok = (outer.start.line, outer.start.column) <= (line, col)
    end_ok = (outer.end.line, outer.end.column) >= (end_line, end_col)
    return start_ok and end_ok


def _size(r: CodeRange) -> tuple[int, int]:
    return (r.end.line - r.start.line, (r.end.column - r.start.column) if r.end.line == r.start.line else 10**6)


_KEYS: dict[int, tuple[cst.CSTNode, str]] = {}  # id(node) -> (node, its key): the same tests are asked often
_KEYS_HELD = 4096


def _key(node: cst.CSTNode) -> str:
    """A condition's text with its layout removed: the key under which its truth is known."""
    known = _KEYS.get(id(node))
    if known is not None and known[0] is node:  # nodes are immutable: one node, one key
        return known[1]
    bare = node.with_changes(lpar=[], rpar=[]) if isinstance(node, cst.BaseExpression) and (node.lpar or node.rpar) \
        else node
    key = " ".join(cst.Module([]).code_for_node(bare).split())
    if len(_KEYS) >= _KEYS_HELD:
        _KEYS.clear()
    _KEYS[id(node)] = (node, key)  # the node is held with its key, so its id is not reused meanwhile
    return key


class _Rewriter(cst.CSTTransformer):
    """Replaces expressions and statements, removes statements and splices runs of statements
    (the edits of several findings at once), and folds every `if` whose test `facts` decide.
    A removed statement's comments go with it: they describe code that is gone; those that trail
    the kept statement above it stay (`_trailing_comments`)."""

    def __init__(self, replace: dict[cst.CSTNode, cst.CSTNode], remove: set[cst.CSTNode],
                 splices: dict[cst.CSTNode, tuple[cst.CSTNode, list[cst.CSTNode]]] | None = None,
                 facts: dict[str, bool] | None = None) -> None:
        self.replace = replace
        self.remove = remove
        self.splices = splices or {}  # first statement of a run -> (its replacement, the rest of the run)
        self.spliced = {id(n) for _, rest in self.splices.values() for n in rest}
        self.facts = facts or {}
        # updated statements to take out of their block, by id; the nodes are held here so that no
        # other node can be given the same id while the rewrite runs
        self.dropped: dict[int, cst.CSTNode] = {}
        # with `on_path` (the ids of the targets' ancestors), only those are entered; without it,
        # every statement is (folding needs the `if`s) but no expression, as every edit is of whole
        # statements: most of a tree's nodes are never visited
        self.on_path: set[int] | None = None
        self.deep = False  # enter expressions too (to replace one)

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.deep:
            return True
        if self.on_path is not None:
            return id(node) in self.on_path
        return not isinstance(node, (cst.BaseExpression, cst.SimpleStatementLine)) \
            and node not in self.replace and node not in self.splices

    def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode):  # type: ignore[override]
        if original in self.replace:
            return self.replace[original]
        if original in self.splices:
            return self.splices[original][0]
        if id(original) in self.spliced:
            return cst.RemoveFromParent()
        if original in self.remove:
            return self._drop(updated)
        if isinstance(updated, (cst.IndentedBlock, cst.Module)):
            return updated.with_changes(body=self._filter(updated.body))
        if isinstance(updated, cst.If):
            return self._fold_if(updated)
        if isinstance(updated, cst.Else) and isinstance(original.body, cst.IndentedBlock) \
                and len(original.body.body) == 1 and original.body.body[0] in self.splices:
            # an `else:` whose only statement became a guarded rewrite's `if`: that `if` is an `elif`
            inner = updated.body.body if isinstance(updated.body, cst.IndentedBlock) else ()
            if len(inner) == 1 and isinstance(inner[0], cst.If) and not inner[0].leading_lines \
                    and not updated.leading_lines and updated.body.header.comment is None:  # type: ignore[union-attr]
                return inner[0]
        body = getattr(updated, "body", None)
        if isinstance(body, cst.IndentedBlock) and not body.body and not isinstance(updated, cst.Else):
            return updated.with_changes(body=body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])]))
        return updated

    def _drop(self, updated: cst.CSTNode) -> cst.CSTNode:
        self.dropped[id(updated)] = updated
        return updated

    def _fold_if(self, node: cst.If):
        """An `if` whose test is known becomes the branch that runs; an empty branch goes (never
        `else: pass`); an empty body with an `else` becomes `if not test:`."""
        known = evaluate(node.test, self.facts)
        orelse = node.orelse
        if known is True:
            return self._inline(node, node.body.body if isinstance(node.body, cst.IndentedBlock) else ())
        if known is False:
            if orelse is None:
                return self._drop(node)
            if isinstance(orelse, cst.If):
                return orelse.with_changes(leading_lines=node.leading_lines)
            return self._inline(node, orelse.body.body if isinstance(orelse.body, cst.IndentedBlock) else ())
        if isinstance(orelse, cst.Else) and isinstance(orelse.body, cst.IndentedBlock) and not orelse.body.body:
            node = node.with_changes(orelse=None)
            orelse = None
        body = node.body
        if isinstance(body, cst.IndentedBlock) and not body.body:
            if orelse is None:
                return self._drop(node)
            if isinstance(orelse, cst.Else):
                return node.with_changes(test=negate(node.test), body=orelse.body, orelse=None)
            return node.with_changes(body=body.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])]))
        return node

    def _inline(self, node: cst.If, body) -> cst.CSTNode:
        statements = list(body)
        if not statements:
            return self._drop(node)
        comments = [ln for ln in node.leading_lines]
        first = statements[0]
        statements[0] = first.with_changes(leading_lines=[*comments, *getattr(first, "leading_lines", ())])
        return cst.FlattenSentinel(statements)

    def _filter(self, body) -> list:
        kept = []
        trailing: list = []  # comment lines that follow a kept statement, above removed ones
        for i, stmt in enumerate(body):
            if id(stmt) in self.dropped:
                if i and id(body[i - 1]) not in self.dropped:
                    trailing = _trailing_comments(getattr(stmt, "leading_lines", ()))
                continue
            if trailing and hasattr(stmt, "leading_lines"):
                own = list(stmt.leading_lines)
                if own and own[0].comment is None:  # one blank line between, not two
                    trailing = list(itertools.dropwhile(lambda ln: ln.comment is None, trailing[::-1]))[::-1]
                stmt = stmt.with_changes(leading_lines=[*trailing, *own])
            trailing = []
            kept.append(stmt)
        if kept and len(kept) < len(body) and id(kept[0]) != id(body[0]) and hasattr(kept[0], "leading_lines"):
            # the block now starts with what was in its middle: no blank line opens a block
            lines = list(kept[0].leading_lines)
            while lines and lines[0].comment is None:
                lines.pop(0)
            kept[0] = kept[0].with_changes(leading_lines=lines)
        return kept


def _with_replaced(stmt: cst.CSTNode, exprs: dict[cst.CSTNode, cst.CSTNode]) -> cst.CSTNode:
    """`stmt` with each of `exprs`' expressions replaced wherever it sits in it (nested too)."""
    rewriter = _Rewriter(exprs, set())
    rewriter.deep = True
    return stmt.visit(rewriter)


# -- what a condition's known truth decides ----------------------------------------------------------


_FLIP = {cst.Is: cst.IsNot, cst.IsNot: cst.Is, cst.Equal: cst.NotEqual, cst.NotEqual: cst.Equal,
         cst.In: cst.NotIn, cst.NotIn: cst.In}


def _bare(node: cst.BaseExpression) -> cst.BaseExpression:
    return node.with_changes(lpar=[], rpar=[]) if node.lpar else node


def negate(test: cst.BaseExpression) -> cst.BaseExpression:
    """`not test`, written plainly: `not x` -> `x`, `a is None` -> `a is not None`."""
    bare = _bare(test)
    if isinstance(bare, cst.UnaryOperation) and isinstance(bare.operator, cst.Not):
        return _bare(bare.expression)
    if isinstance(bare, cst.Comparison) and len(bare.comparisons) == 1:
        target = bare.comparisons[0]
        flipped = _FLIP.get(type(target.operator))
        if flipped is not None:
            op = target.operator
            new_op = flipped(whitespace_before=op.whitespace_before, whitespace_after=op.whitespace_after) \
                if flipped in (cst.Equal, cst.NotEqual, cst.In) else flipped()
            return bare.with_changes(comparisons=[target.with_changes(operator=new_op)])
    operand = bare
    if isinstance(bare, (cst.BooleanOperation, cst.IfExp, cst.Lambda, cst.NamedExpr)):
        operand = bare.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.UnaryOperation(operator=cst.Not(), expression=operand)


def plain(test: cst.BaseExpression) -> cst.BaseExpression:
    """A condition without double negations: `not (m is not None)` -> `m is None`."""
    bare = _bare(test)
    if isinstance(bare, cst.UnaryOperation) and isinstance(bare.operator, cst.Not):
        inner = plain(bare.expression)
        return negate(inner)
    if isinstance(bare, cst.BooleanOperation):
        left, right = plain(bare.left), plain(bare.right)
        return tidy(bare.with_changes(left=_keep_parens(bare.left, left), right=_keep_parens(bare.right, right)))
    return tidy(bare) if bare is not test else bare


def _keep_parens(before: cst.BaseExpression, after: cst.BaseExpression) -> cst.BaseExpression:
    """`after` parenthesized as `before` was (tidy drops the ones its operators do not need)."""
    if before.lpar and not after.lpar:
        return after.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return after


def evaluate(test: cst.BaseExpression, facts: dict[str, bool]) -> bool | None:
    """The truth of `test` where the conditions in `facts` are known (three-valued: None when it
    does not follow)."""
    bare = _bare(test)
    if isinstance(bare, cst.Name) and bare.value in ("True", "False"):
        return bare.value == "True"
    if not facts:
        return None
    key = _key(bare)
    if key in facts:
        return facts[key]
    if isinstance(bare, cst.Name) and bare.value in ("True", "False"):
        return bare.value == "True"
    if isinstance(bare, cst.UnaryOperation) and isinstance(bare.operator, cst.Not):
        inner = evaluate(bare.expression, facts)
        return None if inner is None else not inner
    if isinstance(bare, cst.Comparison) and len(bare.comparisons) == 1 and type(bare.comparisons[0].operator) in _FLIP:
        flipped = _key(negate(bare))
        if flipped in facts:
            return not facts[flipped]
    if isinstance(bare, cst.BooleanOperation):
        left, right = evaluate(bare.left, facts), evaluate(bare.right, facts)
        if isinstance(bare.operator, cst.And):
            if left is False or right is False:
                return False
            return True if left is True and right is True else None
        if left is True or right is True:
            return True
        return False if left is False and right is False else None
    return None


def known_when(test: cst.BaseExpression, value: bool, facts: dict[str, bool] | None = None) -> dict[str, bool]:
    """What holds when `test` has truth `value`: the test itself, and the parts of a conjunction
    that is true or of a disjunction that is false."""
    facts = dict(facts or {})
    bare = _bare(test)
    if isinstance(bare, cst.UnaryOperation) and isinstance(bare.operator, cst.Not):
        return known_when(bare.expression, not value, facts)
    facts[_key(bare)] = value
    if isinstance(bare, cst.BooleanOperation):
        if isinstance(bare.operator, cst.And) and value:
            facts = known_when(bare.right, True, known_when(bare.left, True, facts))
        elif isinstance(bare.operator, cst.Or) and not value:
            facts = known_when(bare.right, False, known_when(bare.left, False, facts))
    return facts


@dataclass
class Edit:
    """One finding's edit of the parsed region, made later together with the others'."""

    replace: dict
    remove: set
    splices: dict
    footprint: list[tuple[int, int]]  # region lines of the statements it touches
    code: str  # the new expression's text (for the imports it needs)

    def overlaps(self, other: Edit) -> bool:
        return any(a <= d and c <= b for a, b in self.footprint for c, d in other.footprint)


def _decided_ifs(stmt: cst.CSTNode, facts: dict[str, bool]) -> bool:
    """Whether `stmt` is or holds (in its blocks) an `if` whose test `facts` decide."""
    if isinstance(stmt, cst.If):
        if evaluate(stmt.test, facts) is not None:
            return True
        inner = list(stmt.body.body) if isinstance(stmt.body, cst.IndentedBlock) else []
        if stmt.orelse is not None:
            inner.append(stmt.orelse if isinstance(stmt.orelse, cst.If) else None)
            if isinstance(stmt.orelse, cst.Else) and isinstance(stmt.orelse.body, cst.IndentedBlock):
                inner.extend(stmt.orelse.body.body)
        return any(_decided_ifs(s, facts) for s in inner if s is not None)
    body = getattr(stmt, "body", None)
    if isinstance(body, cst.IndentedBlock):
        return any(_decided_ifs(s, facts) for s in body.body)
    return False


def _arg_text(arg: cst.Arg) -> str:
    """One argument as written, without the comma and line break after it."""
    keyword = f"{arg.keyword.value}=" if arg.keyword is not None else ""
    return f"{arg.star}{keyword}{cst.Module([]).code_for_node(arg.value)}"


def _magic_comma(original: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """A call its author exploded with a trailing comma (`f(\n    a,\n)`) stays exploded: the new
    call ends with a comma too, which the formatter keeps one argument a line."""
    if isinstance(original, cst.Call) and isinstance(new, cst.Call) and original.args and new.args \
            and isinstance(original.args[-1].comma, cst.Comma):
        last = new.args[-1].with_changes(comma=cst.Comma())
        return new.with_changes(args=[*new.args[:-1], last])
    return new


def _exits_unless_guard(stmt: cst.CSTNode, guard: cst.BaseExpression) -> bool:
    """Whether what follows `stmt` runs only where `guard` holds: `stmt` is `if T: ... return` (or
    raise) without an else, and T false implies the guard."""
    if not isinstance(stmt, cst.If) or stmt.orelse is not None or not isinstance(stmt.body, cst.IndentedBlock):
        return False
    last = stmt.body.body[-1] if stmt.body.body else None
    exits = isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))
    return exits and evaluate(guard, known_when(stmt.test, False)) is True


def _has_effects_beyond(stmt: cst.CSTNode) -> bool:
    """Whether moving `stmt` could change what happens: anything but plain assignments, `if`s of
    them and checks that raise (a call may mutate, a loop or a `with` may do anything)."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return not all(isinstance(s, (cst.Assign, cst.AnnAssign, cst.Raise)) for s in stmt.body)
    if isinstance(stmt, cst.If):
        inner = list(stmt.body.body) if isinstance(stmt.body, cst.IndentedBlock) else [stmt.body]
        if isinstance(stmt.orelse, cst.Else) and isinstance(stmt.orelse.body, cst.IndentedBlock):
            inner += list(stmt.orelse.body.body)
        elif stmt.orelse is not None:
            inner.append(stmt.orelse)
        return any(_has_effects_beyond(s) for s in inner)
    return True


class _ById:
    def __init__(self, ranges: dict[int, CodeRange]) -> None:
        self.ranges = ranges

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        return self.ranges[id(node)]


class _Names(cst.CSTVisitor):
    """Names a piece of code reads and assigns. With `guard`, the reads in branches that run only
    when the guard holds are left out (there the original path ran and assigned them)."""

    def __init__(self, guard: cst.BaseExpression | None = None) -> None:
        self.reads: set[str] = set()
        self.assigned: set[str] = set()
        self.guard = guard

    def _implies_guard(self, test: cst.BaseExpression, value: bool) -> bool:
        return self.guard is not None and evaluate(self.guard, known_when(test, value)) is True

    def visit_If(self, node: cst.If) -> bool:  # noqa: N802 - libcst's visitor names
        node.test.visit(self)
        if not self._implies_guard(node.test, True):
            node.body.visit(self)
        if node.orelse is not None and not self._implies_guard(node.test, False):
            node.orelse.visit(self)
        return False

    def visit_IfExp(self, node: cst.IfExp) -> bool:  # noqa: N802
        node.test.visit(self)
        if not self._implies_guard(node.test, True):
            node.body.visit(self)
        if not self._implies_guard(node.test, False):
            node.orelse.visit(self)
        return False

    def visit_Attribute(self, node: cst.Attribute) -> bool:  # noqa: N802
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:  # noqa: N802
        node.value.visit(self)
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:  # noqa: N802
        self._collect_targets(node.target)
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> bool:  # noqa: N802
        node.value.visit(self)
        node.target.visit(self)
        self._collect_targets(node.target)
        return False

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:  # noqa: N802
        if node.value is not None:
            node.value.visit(self)
        self._collect_targets(node.target)
        return False

    def visit_For(self, node: cst.For) -> bool:  # noqa: N802
        self._collect_targets(node.target)
        return True

    def visit_AsName(self, node: cst.AsName) -> bool:  # noqa: N802
        self._collect_targets(node.name)
        return False

    def visit_Name(self, node: cst.Name) -> bool:  # noqa: N802
        self.reads.add(node.value)
        return False

    def _collect_targets(self, target: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            self.assigned.add(target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._collect_targets(element.value)
        elif isinstance(target, cst.StarredElement):
            self._collect_targets(target.value)
        else:  # self.x = ..., a[i] = ...: reads its base
            target.visit(self)


def _assigned(statements: list) -> set[str]:
    """Names the statements (and the blocks in them) assign, read off the statements alone."""
    names = _Names()
    for stmt in statements:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    for target in small.targets:
                        names._collect_targets(target.target)
                elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
                    names._collect_targets(small.target)
            continue
        if isinstance(stmt, cst.For):
            names._collect_targets(stmt.target)
        if isinstance(stmt, cst.With):
            for item in stmt.items:
                if item.asname is not None:
                    names._collect_targets(item.asname.name)
        for block in (getattr(stmt, "body", None), getattr(getattr(stmt, "orelse", None), "body", None)):
            if isinstance(block, cst.IndentedBlock):
                names.assigned |= _assigned(list(block.body))
        if isinstance(getattr(stmt, "orelse", None), cst.If):
            names.assigned |= _assigned([stmt.orelse])  # type: ignore[attr-defined]
    return names.assigned


def _reads_outside(stmt: cst.CSTNode, guard: cst.BaseExpression) -> set[str]:
    """Names `stmt` reads, leaving out the branches that run only where `guard` holds."""
    names = _Names(guard)
    stmt.visit(names)
    return names.reads


class _Fit(cst.CSTTransformer):
    """Lays out again the statements (and comment lines above them) that no longer fit."""

    def __init__(self, style, column: int, unit: int, widest=lambda node: None, was_over=lambda node: False) -> None:
        self.style = style
        self.column = column
        self.unit = unit
        self.depth = 0
        self.widest = widest  # node -> its longest line where known without generating its code
        # node -> whether a line of it was already over the line length where it stood: the
        # repository lives with that line, and laying it out anew would only add churn to the diff
        self.was_over = was_over

    def on_visit(self, node: cst.CSTNode) -> bool:
        # only blocks and statements are laid out: a simple statement is measured whole
        if isinstance(node, (cst.BaseExpression, cst.SimpleStatementLine)):
            return False
        return super().on_visit(node)

    def _comments(self, lines, width: int) -> list:
        out = []
        for line in lines:
            comment = line.comment.value if line.comment is not None else None
            room = self.style.line_length - width
            was_over = comment is not None and len(comment) > room + self.unit  # already too long one block up
            if comment is None or len(comment) <= room or was_over or " " not in comment[2:room]:
                out.append(line)
                continue
            at = comment.rindex(" ", 2, room)  # a comment too long for its new depth: two lines
            out.append(line.with_changes(comment=cst.Comment(comment[:at])))
            out.append(line.with_changes(comment=cst.Comment("# " + comment[at + 1:])))
        return out

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> bool:  # noqa: N802 - libcst's visitor names
        self.depth += 1
        return True

    def leave_IndentedBlock(self, original, updated):  # noqa: N802
        self.depth -= 1
        return updated

    def leave_SimpleStatementLine(self, original, updated):  # noqa: N802
        width = self.column + self.depth * self.unit
        updated = updated.with_changes(leading_lines=self._comments(updated.leading_lines, width))
        widest = self.widest(original)
        if widest is not None and widest + width <= self.style.line_length or self.was_over(original):
            return updated
        text = cst.Module([]).code_for_node(updated.with_changes(leading_lines=[]))
        if max(len(line) for line in text.splitlines()) + width <= self.style.line_length:
            return updated
        formatted = self.style.format_statement(text, width)
        if max(len(line) for line in formatted.splitlines()) + width > self.style.line_length:
            # still too long: only a string literal can be; split it and lay out again
            try:
                split = split_long_strings(cst.parse_statement(formatted))
                formatted = self.style.format_statement(cst.Module([]).code_for_node(split), width)
            except cst.ParserSyntaxError:
                pass
        if formatted == text:
            return updated
        try:
            return cst.parse_statement(formatted).with_changes(leading_lines=updated.leading_lines)
        except cst.ParserSyntaxError:
            return updated


def _python_name(ssa: str) -> str:
    return ssa.split(".", 1)[0]


def _common_tail(a: str, b: str) -> str:
    """The longest common suffix of `a` and `b`."""
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return a[len(a) - n:]


_AXIS_METHODS = {"squeeze", "unsqueeze", "transpose", "swapaxes", "permute", "movedim"}


def _fixup_after(step: str, tail: str) -> str | None:
    """The fix-up `step` (`.masked_fill(rows, value)` on the kernel's result) restated on the result
    after `tail`, the steps that read the kernel's output back in the original's layout: the row
    mask goes through the same steps. Only steps that move or drop axes by position (squeeze,
    unsqueeze, transpose, permute, movedim; an index of integers, None and full slices) do the same
    to a mask that broadcasts against the output as to the output; None for any other tail."""
    try:
        fill = ast.parse(f"_{step}", mode="eval").body
        chain = ast.parse(f"_{tail}", mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(fill, ast.Call) and isinstance(fill.func, ast.Attribute) and fill.func.attr == "masked_fill"
            and len(fill.args) == 2 and not fill.keywords and isinstance(fill.func.value, ast.Name)):
        return None
    node = chain
    while not (isinstance(node, ast.Name) and node.id == "_"):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _AXIS_METHODS \
                and not node.keywords:
            node = node.func.value
        elif isinstance(node, ast.Subscript) and all(
                isinstance(i, ast.Constant) and (i.value is None or isinstance(i.value, int))
                or isinstance(i, ast.Slice) and i.lower is i.upper is i.step is None
                for i in (node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice])):
            node = node.value
        else:
            return None
    if not tail:
        return step
    rows = ast.unparse(fill.args[0])
    if not isinstance(fill.args[0], (ast.Call, ast.Attribute, ast.Name, ast.Subscript)):
        rows = f"({rows})"
    return f".masked_fill({rows}{tail}, {ast.unparse(fill.args[1])})"


class Synthesizer:
    """One libcst parse of a region of a file. `offset` is what to add to a line of the region to
    get the file's line; `lines` are the file's lines (findings' positions are the file's)."""

    def __init__(self, region_text: str, lines: list[str], offset: int = 0, context: FileContext | None = None) -> None:
        self.lines = lines
        self.offset = offset
        self.path: str | None = None  # the file's path as positions name it, where known
        self.context = context or FileContext()
        self.module = cst.parse_module(region_text)
        try:
            self.index = StatementIndex(self.module, region_text)
        except AlignmentError as exc:
            raise SynthesisError(f"the function could not be indexed for rewriting: {exc}") from exc
        self.positions = _ById(self.index.ranges)
        self.indent_unit = self._indent_unit()
        self._callsite: callsite.Translation | None = None  # set while a match is written at a helper's call
        # while a match's template is filled: metadata reads of its scores and their restatement on
        # the query and key (a kept expression the template copies reads those, not the scores)
        self._restating: list[tuple[Pos, str]] = []
        self._widths: dict[int, int] = {}  # id(indexed simple statement) -> its longest line
        self._over_lines: set[str] | None = None  # the file's lines over its line length, stripped
        lines = region_text.splitlines(keepends=True)
        # the region's lines as ast numbers them (None where another character also breaks a line)
        self._region_lines = lines if len(lines) == region_text.count("\n") else None

    def _indent_unit(self) -> str:
        """The file's own indentation step, for the blocks synthesis creates."""
        for node, _ in self.index.statements:
            body = getattr(node, "body", None)
            if isinstance(node, cst.FunctionDef) and isinstance(body, cst.IndentedBlock):
                return body.indent if body.indent is not None else self.module.default_indent
        return self.module.default_indent

    # -- locating -----------------------------------------------------------------------------

    def _here(self, pos: Pos) -> Pos:
        """`pos`, which must be in this file: a helper inlined from another file (a base class's
        method) is not written at its call (its text is not here)."""
        if self.path is not None and pos.file and pos.file != self.path:
            raise SynthesisError(f"the rewrite would read code of {pos.file} (line {pos.line}) in {self.path}")
        return pos

    def _file_range(self, pos: Pos) -> tuple[int, int, int, int]:
        self._here(pos)  # a step inlined from a method of another file (a base class's): its text is not here
        line_text = self.lines[pos.line - 1] if pos.line - 1 < len(self.lines) else ""
        end_text = self.lines[pos.end_line - 1] if pos.end_line - 1 < len(self.lines) else ""
        return pos.line, _char_col(line_text, pos.col), pos.end_line, _char_col(end_text, pos.end_col)

    def char_range(self, pos: Pos) -> tuple[int, int, int, int]:
        """`pos` in the region's lines and character columns."""
        line, col, end_line, end_col = self._file_range(pos)
        return line - self.offset, col, end_line - self.offset, end_col

    def expression_at(self, pos: Pos) -> cst.BaseExpression:
        line, col, end_line, end_col = self.char_range(pos)
        located = self.statement_at(pos)
        best: _Located | None = None
        for node, where in expressions_in(located.node, located.range):  # type: ignore[arg-type]
            if _contains(where, line, col, end_line, end_col):
                if best is None or _size(where) < _size(best.range):
                    best = _Located(node, where)
        if best is None:
            raise SynthesisError(f"no expression at line {pos.line}")
        node = best.node
        if isinstance(node, cst.BaseExpression) and node.lpar:  # ast's range leaves its parentheses out
            node = node.with_changes(lpar=[], rpar=[])
        found = " ".join(cst.Module([]).code_for_node(node).split())
        if found != " ".join(self.source(pos).split()):  # the columns of an unusual layout: refuse
            raise SynthesisError(f"the expression at line {pos.line} could not be located exactly")
        return best.node  # type: ignore[return-value]

    def statement_at(self, pos: Pos) -> _Located:
        line, col, end_line, end_col = self.char_range(pos)
        best: _Located | None = None
        for node, where in self.index.statements:
            if isinstance(node, cst.SimpleStatementLine) and _contains(where, line, col, end_line, end_col):
                if best is None or _size(where) < _size(best.range):
                    best = _Located(node, where)
        if best is None:
            raise SynthesisError(f"no simple statement at line {pos.line}")
        return best

    def compound_at(self, pos: Pos) -> cst.CSTNode:
        """The statement (simple or compound) that spans exactly the lines of `pos`."""
        line, col, end_line, end_col = self.char_range(pos)
        for node, where in self.index.statements:
            if where.start.line == line and where.end.line == end_line and _contains(where, line, col, end_line, end_col):
                return node
        raise SynthesisError(f"no statement at lines {pos.line}-{pos.end_line}")

    def source(self, pos: Pos) -> str:
        line, col, end_line, end_col = self._file_range(pos)
        if line == end_line:
            return self.lines[line - 1][col:end_col]
        parts = [self.lines[line - 1][col:], *self.lines[line:end_line - 1], self.lines[end_line - 1][:end_col]]
        return "".join(parts)

    def _source_restated(self, pos: Pos) -> str:
        """`source(pos)` with the metadata reads of the scores inside it restated (`_restating`)."""
        line, col, end_line, end_col = self._file_range(pos)
        inner = [(self._file_range(p), text) for p, text in self._restating
                 if (p.line, p.col) >= (pos.line, pos.col) and (p.end_line, p.end_col) <= (pos.end_line, pos.end_col)]
        if not inner:
            return self.source(pos)
        starts = list(itertools.accumulate((len(self.lines[i]) for i in range(line - 1, end_line - 1)), initial=0))
        whole = "".join(self.lines[line - 1:end_line])
        for (a, b, c, d), text in sorted(inner, key=lambda item: item[0], reverse=True):
            start, stop = starts[a - line] + b, starts[c - line] + d
            whole = whole[:start] + (f"({text})" if "," in text else text) + whole[stop:]
        shift = len(whole) - len("".join(self.lines[line - 1:end_line]))
        return whole[col:starts[-1] + end_col + shift]

    def _restatements(self, finding: Finding, removed: set[cst.CSTNode], root: _Located) -> dict[cst.CSTNode, cst.CSTNode]:
        """The kept statements that read the removed scores' metadata, each with those reads
        written on the query and the key (`torch.eye(dots.shape[-1], device=dots.device)` ->
        `torch.eye(k.shape[-2], device=q.device)`); sets `_restating` for the template's operands.
        Refused where an operand has no name holding its value at the read."""
        match = finding.match
        assert match is not None
        self._restating = []
        exprs: dict[cst.CSTNode, dict[cst.CSTNode, cst.BaseExpression]] = {}
        for node, axes in finding.restated:
            assert node.pos is not None
            if axes == ("argument",):
                self._restated_argument(node, match, removed, root, exprs)
                continue
            what = "device" if axes == ("device",) else "shape"
            if node.via:
                raise SynthesisError(f"line {node.pos.line} reads the scores' {what} in a helper")
            text = layout.restated(match, axes, lambda operand, at=node: self._named_at(operand, match, at),
                                   "size" if node.op == ".size" else "shape")
            if text is None:
                raise SynthesisError(f"line {node.pos.line} reads the scores' {what}, and the query or the key has "
                                     "no name that holds it there")
            self._restating.append((node.pos, text))
            located = self.statement_at(node.pos)
            if located.node in removed:
                continue  # the statement goes; an operand the template copies from it is restated
            expr = self.expression_at(node.pos)
            if located.node is root.node:
                outer = match.root.pos
                if outer is None or (node.pos.line, node.pos.col) < (outer.line, outer.col) \
                        or (node.pos.end_line, node.pos.end_col) > (outer.end_line, outer.end_col):
                    raise SynthesisError(f"line {node.pos.line} reads the scores' {what} beside the rewritten value")
                continue  # inside the value the kernel call replaces
            new = cst.parse_expression(text)
            if isinstance(new, cst.Tuple) and not _whole_value(located.node, expr):
                new = new.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            exprs.setdefault(located.node, {})[expr] = new
        out = {}
        for stmt, replace in exprs.items():
            out[stmt] = _with_replaced(stmt, replace)
        return out

    def _restated_argument(self, node: Node, match: Match, removed: set[cst.CSTNode], root: _Located,
                           exprs: dict[cst.CSTNode, dict[cst.CSTNode, cst.BaseExpression]]) -> None:
        """The call of a helper that reads only the scores' dtype or device (scope `_helper_argument`),
        given the query instead: `max_neg_value(dots)` -> `max_neg_value(q)`."""
        site = node.via[0]
        located = self.statement_at(site)
        if located.node in removed:
            return
        if located.node is root.node:
            raise SynthesisError(f"line {site.line} reads the scores' metadata beside the rewritten value")
        call = self.expression_at(site)
        nodes = match.method.nodes
        after = next((i for i, n in enumerate(nodes) if n is node), len(nodes))
        at = next((n for n in nodes[after:] if not n.via), None)
        found = layout.sequence_axis(match, "q")
        query = self._named_at(found[0], match, at) if found is not None and at is not None else None
        scores = _python_name(node.inputs[0].name)  # type: ignore[union-attr]
        if not isinstance(call, cst.Call) or query is None or not re.fullmatch(r"[A-Za-z_]\w*", query):
            raise SynthesisError(f"line {site.line} hands the scores to a helper, and the query has no name there")
        args = [a.with_changes(value=cst.Name(query)) if isinstance(a.value, cst.Name) and a.value.value == scores else a
                for a in call.args]
        if all(a is b for a, b in zip(args, call.args, strict=True)):
            raise SynthesisError(f"line {site.line} hands the scores to a helper other than by name")
        exprs.setdefault(located.node, {})[call] = call.with_changes(args=args)

    def _helper_calls(self, finding: Finding) -> list[cst.CSTNode]:
        """The statements that only assign the result of a helper call restated on the query, or a
        value computed from the scores' dtype alone (`mask_value = -torch.finfo(dots.dtype).max`):
        where only the original's fills read it, the kernel's branch need not compute it."""
        out = []
        for node, axes in finding.restated:
            if axes == ("argument",):
                located = self.statement_at(node.via[0])
                small = located.node.body[0] if len(located.node.body) == 1 else None  # type: ignore[attr-defined]
                if isinstance(small, cst.Assign) and small.value.deep_equals(self.expression_at(node.via[0])):
                    out.append(located.node)
            elif axes == ("dtype",) and not node.via:
                located = self.statement_at(node.pos)  # type: ignore[arg-type]
                small = located.node.body[0] if len(located.node.body) == 1 else None  # type: ignore[attr-defined]
                if isinstance(small, cst.Assign) and _dtype_limits_only(small.value):
                    out.append(located.node)
        return out

    def _named_at(self, operand: Operand, match: Match, at: Node) -> str | None:
        """The name that holds `operand` where `at` runs, or None (a temporary, or a name the code
        assigns again in between)."""
        if isinstance(operand, Sym):
            return operand.text if re.fullmatch(r"[A-Za-z_][\w.]*", operand.text) else None
        if not isinstance(operand, Var) or _TEMP.match(operand.name):
            return None
        name = _python_name(operand.name)
        nodes = [n for n in match.method.nodes if not n.via]
        start = next((i for i, n in enumerate(nodes) if operand.name in n.outputs), -1)
        end = next((i for i, n in enumerate(nodes) if n is at), None)
        if end is None or end < start:
            return None
        if any(_python_name(o) == name and o != operand.name for n in nodes[start + 1:end] for o in n.outputs):
            return None
        return name

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

    def enclosing_facts(self, node: cst.CSTNode) -> dict[str, bool]:
        """The conditions known where `node` runs: the tests of the `if`s around it."""
        facts: dict[str, bool] = {}
        parents = self.index.parents
        child, parent = node, parents.get(id(node))
        while parent is not None and not isinstance(parent, (cst.FunctionDef, cst.Lambda)):
            if isinstance(parent, cst.If) and child is not parent.test:
                facts = known_when(parent.test, child is parent.body, facts)
            elif isinstance(parent, cst.Else):
                grand = parents.get(id(parent))
                if isinstance(grand, cst.If):
                    facts = known_when(grand.test, False, facts)
                    child, parent = grand, parents.get(id(grand))
                    continue
            child, parent = parent, parents.get(id(parent))
        return facts

    def _widest_line(self, node: cst.CSTNode) -> int | None:
        """The longest line of a simple statement of the parse as it stands, read off the region's
        text (libcst round-trips it exactly) instead of generating its code; None for another node."""
        if not isinstance(node, cst.SimpleStatementLine):
            return None
        where = self.index.ranges.get(id(node))  # indexed nodes are held: the id is this node's
        lines = self._region_lines
        if where is None or lines is None:
            return None
        widest = self._widths.get(id(node))
        if widest is None:
            text = "".join([lines[where.start.line - 1][where.start.column:], *lines[where.start.line:where.end.line]])
            widest = self._widths[id(node)] = max(len(line) for line in text.splitlines())
        return widest

    def _was_over(self, node: cst.CSTNode) -> bool:
        """Whether a simple statement has a line that the file already holds over the repository's
        line length (compared by its text: a branch's statements may be copies of the parse's)."""
        if not isinstance(node, cst.SimpleStatementLine):
            return False
        if self._over_lines is None:
            limit = self.context.style.line_length
            self._over_lines = {line.strip() for line in self.lines if len(line.rstrip("\n").expandtabs()) > limit}
        if not self._over_lines:
            return False
        text = cst.Module([]).code_for_node(node.with_changes(leading_lines=[]))
        return any(line.strip() in self._over_lines for line in text.splitlines())

    def _footprint(self, node: cst.CSTNode) -> tuple[int, int]:
        where = self.positions[node]
        return where.start.line, where.end.line

    # -- the rewrite ----------------------------------------------------------------------------

    def edit(self, finding: Finding) -> Edit:
        """The edit that rewrites `finding`, computed against the parse (which it leaves as is). A
        finding with a partner on the other branch of an `if` (`Finding.partner`) is written with it:
        the two edits are made as one, their shared statements removed once."""
        edit = self._edit_one(finding)
        if finding.partner is None:
            return edit
        other = self._edit_one(finding.partner)
        if set(edit.replace) & set(other.replace) or edit.splices or other.splices:
            raise SynthesisError("the rewrites on the two branches touch the same statement")
        return Edit({**edit.replace, **other.replace}, edit.remove | other.remove, {},
                    [*edit.footprint, *other.footprint], edit.code + "\n" + other.code)

    def _edit_one(self, finding: Finding) -> Edit:
        match = finding.match
        if match is None or not match.rule.rewrite:
            raise SynthesisError("the rule has no rewrite")
        root = match.root
        if root.via:
            return self._at_call(finding)
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
        # a statement of its own that only computes an argument the rewrite drops goes with the match
        removed_ids = matched_ids | {id(n) for n in finding.companions}
        for node in [*matched, *finding.companions]:
            if node.pos is None or id(node) in kept_nodes:
                continue
            # a step computed in a helper the code calls (`dots = self.apply_pos_bias(dots)`): the
            # call's statement goes, with the assignment of its result (the helper stays)
            located = self.statement_at(node.via[0] if node.via else node.pos)
            if node.via:
                removed_ids |= {id(n) for n in match.method.nodes if n.pos == node.via[0] and not n.via}
            if located.node is not root_stmt.node:
                others[located.node] = located
        method_nodes = [n for n in match.method.nodes if n.via == root.via and n.pos is not None]
        for located in others.values():
            self._check_removable(located, method_nodes, removed_ids, match)

        folded = self._fold_statement(match, others)
        removed_stmts = set(others) | {self.statement_at(_at_body(n, root)).node for n in finding.companions if n.pos is not None}
        try:
            restated = self._restatements(finding, removed_stmts, root_stmt) if finding.restated else {}
            new_code, fixup = self._kernel_and_fixup(match, root_expr)
        finally:
            self._restating = []
        small = root_stmt.node.body[0] if len(root_stmt.node.body) == 1 else None  # type: ignore[attr-defined]
        if fixup is not None and not (_whole_value(root_stmt.node, root_expr) and isinstance(small, cst.Assign)
                                      and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)):
            raise SynthesisError("the fix-up of fully masked rows needs the kernel's result assigned to a name")
        try:
            new_expr = cst.parse_expression(new_code)
        except cst.ParserSyntaxError as exc:
            raise SynthesisError(f"the rule's template gives invalid Python: {new_code!r}") from exc
        new_expr = _magic_comma(root_expr, tidy(new_expr))
        if not isinstance(new_expr, (cst.Call, cst.Name, cst.Attribute, cst.Subscript)) \
                and not _whole_value(root_stmt.node, root_expr):
            new_expr = new_expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
        self._check_names(match, root)

        removable = list(others)
        companions = [self.statement_at(_at_body(n, root)).node for n in finding.companions if n.pos is not None]
        for check in finding.checks:
            removable.append(self._raising_if(check))
        guard = self._guard(finding, root_stmt.node)
        new_stmt = self._formatted(root_stmt, root_expr, new_expr, extra_indent=guard is not None)
        code = cst.Module([]).code_for_node(new_expr)
        if fixup is not None:
            # `if mask is not None: x = x.masked_fill(...)` after `x = <kernel>`
            name = small.targets[0].target.value  # type: ignore[union-attr]
            text = fixup.replace("{name}", name)
            formatted = self.context.style.format_statement(text, root_stmt.range.start.column)
            try:
                fix_stmt = cst.parse_statement(formatted)
            except cst.ParserSyntaxError:
                fix_stmt = cst.parse_statement(text)
            new_stmt = cst.FlattenSentinel([new_stmt, fix_stmt])  # type: ignore[list-item]
        if folded:
            if guard is not None:
                raise SynthesisError("a mask folded on its branch is not written under a guard")
            removable = [stmt for stmt in removable if stmt not in folded]
            restated = {**restated, **folded}
        listed = self._listed_at(match, root_stmt)
        if listed and guard is not None:
            raise SynthesisError("a value made a list at its literal is not written under a guard")
        dels = self._dels(root_stmt.node, [*removable, *companions], code, postpone=guard is None)
        if guard is not None:
            return self._guarded(finding, guard, root_stmt, new_stmt, removable, code, companions, restated, dels)
        removable.extend(self.compound_at(pos) for pos in finding.dead)
        removable.extend(stmt for stmt, new in dels.items() if new is None)
        changed = {stmt: new for stmt, new in dels.items() if new is not None}
        changed.update(listed)
        new_stmt, spaced = self._keep_separation(root_stmt.node, new_stmt, removable, changed)
        changed.update(spaced)
        footprint = [self._footprint(n) for n in [root_stmt.node, *removable, *restated, *changed]]
        return Edit({root_stmt.node: new_stmt, **restated, **changed}, set(removable), {}, footprint, code)

    def _dels(self, root: cst.CSTNode, removed: list[cst.CSTNode], code: str,
              postpone: bool = True) -> dict[cst.CSTNode, cst.CSTNode | None]:
        """The `del` statements of the function that the rewrite changes, each with its new form (None
        where it goes): a name only the removed statements assign is gone (`del attn, v` after the
        product with the value: `del v`), and a name the kernel call reads is no longer deleted before
        it (`del q, k` right after the scores): it is deleted by the first `del` of the root's block
        after the kernel call instead, where there is one (`del q, k, v`), else left to the function's
        end (under a guard, where the original's path deletes it already, it is left there; from a
        `del` in a block of its own, `if exists(mask): ...; del mask`, too)."""
        if not any(isinstance(small, cst.Del) for stmt, _ in self.index.statements
                   if isinstance(stmt, cst.SimpleStatementLine) for small in stmt.body):
            return {}
        function = self.index.parents.get(id(root))
        while function is not None and not isinstance(function, cst.FunctionDef):
            function = self.index.parents.get(id(function))
        if function is None:
            return {}
        inside = self._statements_in(function)
        gone = _assigned(removed) - _assigned([s for s in inside if s is not function and s not in removed])
        reads = {n.value for n in _names_read(cst.parse_expression(code))}
        anchor, body = self.block_of(root)
        where = self.positions[root].start.line
        first = min([self.positions[s].start.line for s in removed] + [where])
        edits: dict[cst.CSTNode, cst.CSTNode | None] = {}
        postponed: list[cst.Name] = []
        later: cst.SimpleStatementLine | None = None
        for stmt in inside:
            dels = [s for s in stmt.body if isinstance(s, cst.Del)] if isinstance(stmt, cst.SimpleStatementLine) else []
            if not dels:
                continue
            line = self.positions[stmt].start.line
            names = [n for small in dels for n in _del_targets(small)]
            keep = [n for n in names if not (isinstance(n, cst.Name) and n.value in gone and line > first)]
            early = [n for n in keep if isinstance(n, cst.Name) and n.value in reads and first <= line < where]
            if len(stmt.body) > 1 and (early or len(keep) != len(names)):
                raise SynthesisError(f"line {line} deletes a name the rewrite changes beside other statements")
            if stmt in body:
                postponed += early
            keep = [n for n in keep if n not in early]
            if later is None and stmt in body and line > where:
                later = stmt
            if len(keep) != len(names):
                edits[stmt] = _with_targets(stmt, keep)
        if postponed and later is not None and postpone:
            current = edits.get(later, later)
            held = _del_targets(current.body[0]) if current is not None else []  # type: ignore[union-attr]
            edits[later] = _with_targets(later, [*postponed, *held])
        return edits

    def _fold_statement(self, match: Match, others: dict[cst.CSTNode, _Located]) -> dict[cst.CSTNode, cst.CSTNode]:
        """The statement that adds a mask through the scores' split views on one branch, as the
        assignment of that mask folded into the scores' layout (layout.fold_statement), or nothing."""
        try:
            found = layout.fold_statement(match, lambda operand: self.render(operand, match))
        except TemplateError as exc:
            raise SynthesisError(str(exc)) from exc
        if found is None:
            return {}
        add, text = found
        if add.pos is None or add.via:
            raise SynthesisError("the optional mask is added in a helper")
        located = self.statement_at(add.pos)
        if located.node not in others:
            raise SynthesisError("the optional mask is added in a statement that computes more")
        width = located.range.start.column
        text = cst.Module([]).code_for_node(tidy(cst.parse_expression(text.partition(" = ")[2])))
        text = f"{match.fold_into} = {text}"
        formatted = self.context.style.format_statement(text, width)
        try:
            stmt = cst.parse_statement(formatted)
        except cst.ParserSyntaxError:
            stmt = cst.parse_statement(text)
        return {located.node: stmt.with_changes(leading_lines=located.node.leading_lines)}

    def _at_call(self, finding: Finding) -> Edit:
        """The edit of a match inlined from a helper, made at the helper's call (callsite.py): the
        call statement `out, weights = self._attn(...)` becomes the helper's locals the kernel reads,
        `out = <kernel>` and `weights = None`, under the finding's guard (in the caller's terms)
        where the caller may need the weights."""
        match = finding.match
        assert match is not None
        root = match.root
        if len(root.via) != 1 or root.pos is None:
            raise SynthesisError("the match lies in a helper of a helper")
        call_pos = root.via[0]
        if any(node.via != root.via or axes == ("argument",) for node, axes in finding.restated):
            raise SynthesisError("the helper's scores are read for their shape or device: not written at its call")
        call_stmt = self.statement_at(call_pos)
        call_expr = self.expression_at(call_pos)
        small = call_stmt.node.body[0] if len(call_stmt.node.body) == 1 else None  # type: ignore[attr-defined]
        returns = isinstance(small, cst.Return) and small.value is not None
        if not isinstance(call_expr, cst.Call) or not (
                isinstance(small, cst.Assign) and len(small.targets) == 1 or returns):
            raise SynthesisError("the helper's result is not assigned or returned by a statement of its own")
        # the call inside a value of names and constants (`return self.forward_attention(...), cache`):
        # the statement stays, the call replaced by what the helper returns
        within = not small.value.with_changes(lpar=[], rpar=[]).deep_equals(call_expr)  # type: ignore[union-attr]
        if within and not _plain_besides(small.value, call_expr):  # type: ignore[union-attr]
            raise SynthesisError("the helper's result is not assigned or returned by a statement of its own")
        target = small.targets[0].target if isinstance(small, cst.Assign) and not within else None
        names = [e.value for e in target.elements] if isinstance(target, cst.Tuple) else [target]
        if target is not None and not all(isinstance(e, cst.Name) for e in names):
            raise SynthesisError("the helper's result is not assigned to plain names")
        # the caller's statements that made what the helper is handed (`scores = q @ k.T / d`) go
        caller_nodes = [n for n in [*match.matched_nodes, *finding.companions] if not n.via and n.pos is not None]
        removable: dict[cst.CSTNode, _Located] = {}
        for node in caller_nodes:
            located = self.statement_at(node.pos)
            if located.node is not call_stmt.node:
                removable[located.node] = located
        removed_ids = {id(n) for n in [*match.matched_nodes, *finding.companions]} | \
            {id(n) for n in match.method.nodes if n.pos == call_pos and not n.via}
        method_nodes = [n for n in match.method.nodes if not n.via and n.pos is not None]
        for located in removable.values():
            self._check_removable(located, method_nodes, removed_ids, match)
        func = call_expr.func
        bound_self = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
        helper = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        def_line = _def_line(self.lines, self._here(root.pos).line, helper)
        caller_names = {p.name for p in match.method.params} | \
            {_python_name(o) for n in match.method.nodes if not n.via for o in n.outputs if not _TEMP.match(o)}
        fthrough = match.bindings.get("fthrough")
        # a fill's mask taken where it is given (`None if mask is None else ...`): the kernel runs on
        # both sides of that test, which decides nothing here
        known = {match.cond_text[c]: t for c, t in match.conditions.items() if c in match.cond_text
                 and not (isinstance(fthrough, Sym) and match.cond_text[c] in (f"{fthrough.text} is not None",
                                                                               f"{fthrough.text} is None"))}
        if finding.status == "guarded" and finding.guard_text:
            known.update(_false_where_kernel_runs(finding.guard_text))
        try:
            translation = callsite.Translation(self.lines, def_line, helper, self.source(call_pos), bound_self, caller_names,
                                              known)
            caller_def = _def_line(self.lines, call_pos.line, match.method.name)
            fmask = match.bindings.get("fmask")
            if isinstance(fthrough, Sym) and isinstance(fmask, Var):
                # the helper's statements choosing the mask are restated, under the caller's name of it
                translation.merging = {_python_name(fmask.name)}
                translation.free = callsite.free_after(self.lines, caller_def, call_pos.end_line, "")
            # the helper's reads of the scores' metadata (`mask.to(scores.device)`) are the query's
            # and the key's in the caller, as the code holds them after the call
            after = next((n for n in match.method.nodes[match.method.nodes.index(root):] if not n.via), None)
            reads = []
            for node, axes in finding.restated:
                text = layout.restated(match, axes, lambda operand: self._named_at(operand, match, after),
                                       "size" if node.op == ".size" else "shape") if after is not None else None
                if text is None or node.pos is None:
                    raise callsite.CallSiteError(f"line {node.pos.line if node.pos else '?'} reads the scores' metadata, "
                                                 "and the query or the key has no name that holds it at the call")
                reads.append((node.pos, text))
            translation.restate(reads)
            returned = translation.returned()
            if target is None:
                names = [None] * len(returned)
            if len(returned) != len(names) or (len(names) == 1 and isinstance(target, cst.Tuple)) \
                    or within and len(returned) != 1:
                raise callsite.CallSiteError("the call unpacks another number of values than the helper returns")
            position = next((i for i, e in enumerate(returned) if translation.binds_root(e, root.pos)), None)
            self._callsite = translation
            try:
                new_code, fixup = self._kernel_and_fixup(match, call_expr)
            finally:
                self._callsite = None
            try:
                new_code = cst.Module([]).code_for_node(tidy(cst.parse_expression(new_code)))
            except cst.ParserSyntaxError as exc:
                raise SynthesisError(f"the rule's template gives invalid Python: {new_code!r}") from exc
            values = ["None"] * len(returned)
            steps: list[str] = []
            free = callsite.free_after(self.lines, caller_def, call_pos.end_line, self.source(call_pos))
            tail = translation.tail(root.pos, new_code, free) if position is None else None
            if fixup is not None and tail is None:
                raise callsite.CallSiteError("the fix-up of fully masked rows needs the kernel's result assigned to a name")
            if position is not None:
                values[position] = new_code
            elif tail is not None:
                # the helper's statements after the product, kept as statements in the caller's terms
                steps, derived = tail
                if fixup is not None:
                    steps.insert(1, fixup.replace("{name}", steps[0].partition(" = ")[0]))
                found = [i for i, text in enumerate(derived) if text is not None]
                if len(found) != 1:
                    raise callsite.CallSiteError("the helper does not return the attention's result")
                position = found[0]
                values[position] = derived[position]  # type: ignore[assignment]
            else:
                # the helper goes on from the attention's result (`x.transpose(1, 2)...`,
                # `self.linear_out(x)`): that one returned value restated around the kernel call
                derived = [(i, translation.around_root(e, root.pos, new_code)) for i, e in enumerate(returned)]
                derived = [(i, text) for i, text in derived if text is not None]
                if len(derived) != 1:
                    raise callsite.CallSiteError("the helper does not return the attention's result")
                position, values[position] = derived[0]
                new_code = values[position]
        except callsite.CallSiteError as exc:
            raise SynthesisError(f"cannot be written at the call of `{helper}`: {exc}") from exc
        texts = [_tidy_assignment(text) for text in [*translation.preamble(), *steps]]
        if within:
            value = cst.parse_expression(values[0])
            if not isinstance(value, (cst.Call, cst.Name, cst.Attribute, cst.Subscript)):
                value = value.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            texts.append(cst.Module([]).code_for_node(
                _with_replaced(call_stmt.node, {call_expr: value}).with_changes(leading_lines=[])).strip())  # type: ignore[union-attr]
        elif target is None:
            texts.append(f"return {values[0] if len(values) == 1 else ', '.join(values)}")
        for i, name in enumerate(names if target is not None else ()):
            texts.append(f"{name.value} = {values[i]}")
        for text in texts:
            try:
                cst.parse_statement(text)
            except cst.ParserSyntaxError as exc:
                raise SynthesisError(f"the rule's template gives invalid Python: {text!r}") from exc
        guard = self._guard(finding, call_stmt.node)
        width = call_stmt.range.start.column + (len(self.indent_unit.expandtabs()) if guard is not None else 0)
        statements = []
        for text in texts:
            formatted = self.context.style.format_statement(text, width)
            try:
                statements.append(cst.parse_statement(formatted))
            except cst.ParserSyntaxError:
                statements.append(cst.parse_statement(text))
        if guard is None:  # under a guard the comments above the call stay with it, in the original's branch
            statements[0] = statements[0].with_changes(leading_lines=call_stmt.node.leading_lines)  # type: ignore[attr-defined]
        new_stmt = statements[0] if len(statements) == 1 else cst.FlattenSentinel(statements)
        if guard is not None:
            return self._guarded(finding, guard, call_stmt, new_stmt, list(removable), new_code, [])
        if removable:
            new_stmt, _ = self._keep_separation(call_stmt.node, new_stmt, list(removable), {}, below=False)
        footprint = [self._footprint(n) for n in [call_stmt.node, *removable]]
        return Edit({call_stmt.node: new_stmt}, set(removable), {}, footprint, new_code)

    def _listed_at(self, match: Match, root_stmt: _Located) -> dict:
        """The statements whose expressions a constraint asks to be made lists where they are
        written (`$listed_at`: the positions of a group literal's `params` values, fused-adamw's
        `_group_literals`), each with those expressions wrapped in `list(...)`."""
        listed = match.bindings.get("listed_at")
        if not isinstance(listed, Const) or not isinstance(listed.value, tuple) or not listed.value:
            return {}
        file = match.root.pos.file if match.root.pos is not None else ""
        by_stmt: dict[cst.CSTNode, dict] = {}
        for line, col, end_line, end_col in listed.value:
            pos = Pos(file, line, col, end_line, end_col)
            stmt, expr = self.statement_at(pos).node, self.expression_at(pos)
            if stmt is root_stmt.node:
                raise SynthesisError("the value to make a list is in the rewritten statement itself")
            value = expr.with_changes(lpar=[], rpar=[]) if isinstance(expr, cst.GeneratorExp) else expr
            # (`list(p for p in ...)`: a generator's own parentheses go)
            by_stmt.setdefault(stmt, {})[expr] = cst.Call(cst.Name("list"), [cst.Arg(value)])
        return {stmt: _with_replaced(stmt, exprs) for stmt, exprs in by_stmt.items()}

    def _kernel_and_fixup(self, match: Match, expr: cst.BaseExpression) -> tuple[str, str | None]:
        """The kernel's code and, where the fix-up of fully masked rows reads a mask taken only where
        it is given (`$fthrough`), that fix-up as a statement on the result's name (`{name}`), under
        the test: `if mask is not None: x = x.masked_fill(mask.all(-1, keepdim=True), 0.0)`."""
        code = self._kernel_code(match, expr)
        fthrough = match.bindings.get("fthrough")
        if fthrough is None or "nan_rows" not in match.bindings:
            return code, None
        rows = match.bindings.pop("nan_rows")
        try:
            bare = self._kernel_code(match, expr)
        finally:
            match.bindings["nan_rows"] = rows
        common, fix = _common_tail(code, bare), None
        for at in range(len(common) + 1):  # the longest shared tail of whole steps (`.squeeze(-2)`)
            tail = common[at:]
            if tail and tail[0] not in ".[":
                continue
            head = bare[:len(bare) - len(tail)]
            if code.startswith(head) and (fix := _fixup_after(code[len(head):len(code) - len(tail)], tail)):
                break
        if fix is None:
            raise SynthesisError("the fix-up of fully masked rows is not a step on the kernel's result")
        test = self.render(fthrough, match)
        return bare, f"if {test} is not None:\n    {{name}} = {{name}}{fix}"

    def _kernel_code(self, match: Match, expr: cst.BaseExpression) -> str:
        """The rule's template filled with the match's bindings, in the kernel's layout (`expr`: the
        expression the `$callee`/`$args` of a template read)."""
        local = frozenset(name.split(".")[0] for node in match.method.nodes for name in node.outputs)
        template = self.context.localize(match.rule.rewrite, local | {p.name for p in match.method.params})
        code = layout.result(match, render_template(
            template, layout.lookup(match, lambda name: self.lookup(name, match, expr),
                                    lambda operand: self.render(operand, match))),
            lambda operand: self.render(operand, match))
        code = layout.upcast_result(match, code, lambda: self.lookup("v", match, expr))
        return layout.plus_term(match, code, lambda name: self.lookup(name, match, expr))

    def _guard(self, finding: Finding, stmt: cst.CSTNode) -> cst.BaseExpression | None:
        """The guarded finding's condition for keeping the original at `stmt`, or None where the
        original can never run there (a plain rewrite); refused where it always would."""
        if finding.status != "guarded":
            return None
        guard = plain(cst.parse_expression(finding.guard_text or "False"))
        known = evaluate(guard, self.enclosing_facts(stmt))
        if known is True or evaluate(guard, {}) is True:
            raise SynthesisError(f"the guard `{_key(guard)}` always holds here: the kernel would never run")
        return None if known is False else guard

    def _keep_separation(self, root: cst.CSTNode, new_stmt: cst.CSTNode, removable: list[cst.CSTNode],
                         changed: dict[cst.CSTNode, cst.CSTNode],
                         below: bool = True) -> tuple[cst.CSTNode, dict[cst.CSTNode, cst.CSTNode]]:
        """The blank line that set the removed statements off from the code above them stays: the
        first statement after them that stays takes it, the new statement where it comes first (and
        with `below`, a kept statement between the removed ones and it: `bias = ...` between the
        scores and the kernel call); the kept statement as changed, where it is."""
        anchor, body = self.block_of(root)
        positions = {id(stmt): i for i, stmt in enumerate(body)}
        earlier = [stmt for stmt in removable if positions.get(id(stmt), len(body)) < positions[id(anchor)]]
        if not earlier:
            return new_stmt, {}
        first = min(earlier, key=lambda stmt: positions[id(stmt)])
        lines = getattr(first, "leading_lines", ())
        gone = set(removable)
        kept = next(stmt for stmt in body[positions[id(first)]:] if stmt not in gone)
        if kept is not anchor and below:
            # a kept statement between the removed ones (`if exists(bias): ...`): the blank line that
            # set the removed statements right above the new one off from it stays too
            last = max(positions[id(stmt)] for stmt in earlier)
            between = list(itertools.takewhile(lambda stmt: stmt in gone, body[last::-1]))
            spaced = any(getattr(stmt, "leading_lines", ()) and stmt.leading_lines[0].comment is None
                         for stmt in between)
            if spaced and last == positions[id(anchor)] - 1 and hasattr(new_stmt, "leading_lines") \
                    and not new_stmt.leading_lines:
                new_stmt = new_stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False)])
        if not lines or lines[0].comment is not None:
            return new_stmt, {}
        if kept is not anchor and below:
            current = changed.get(kept, kept)
            if any(ln.comment is None for ln in getattr(current, "leading_lines", [None])):
                return new_stmt, {}
            return new_stmt, {kept: current.with_changes(leading_lines=[cst.EmptyLine(indent=False),
                                                                        *current.leading_lines])}
        if not hasattr(new_stmt, "leading_lines") or any(ln.comment is None for ln in new_stmt.leading_lines):
            return new_stmt, {}
        return new_stmt.with_changes(leading_lines=[cst.EmptyLine(indent=False), *new_stmt.leading_lines]), {}

    def _formatted(self, root_stmt: _Located, root_expr: cst.BaseExpression, new_expr: cst.BaseExpression,
                   extra_indent: bool) -> cst.CSTNode:
        """The root statement with the new expression, laid out by the repository's formatter."""
        stmt = _with_replaced(root_stmt.node, {root_expr: new_expr})
        assert isinstance(stmt, cst.SimpleStatementLine)
        leading = stmt.leading_lines
        text = cst.Module([]).code_for_node(stmt.with_changes(leading_lines=[]))
        width = root_stmt.range.start.column + (len(self.indent_unit.expandtabs()) if extra_indent else 0)
        formatted = self.context.style.format_statement(text, width)
        if formatted == text:
            return stmt
        try:
            parsed = cst.parse_statement(formatted)
        except cst.ParserSyntaxError:
            return stmt
        return parsed.with_changes(leading_lines=leading)

    def _guarded(self, finding: Finding, guard: cst.BaseExpression, root_stmt: _Located, new_stmt: cst.CSTNode,
                 removable: list[cst.CSTNode], code: str, companions: list[cst.CSTNode] = (),
                 restated: dict[cst.CSTNode, cst.CSTNode] | None = None,
                 dels: dict[cst.CSTNode, cst.CSTNode | None] | None = None) -> Edit:
        restated = restated or {}
        dels = dels or {}
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
        # on the kernel's path the guard is false and the match's branch decisions hold (an `if`
        # whose test the match needs false is dead there); on the original path the guard is true
        outer = self.enclosing_facts(anchor)
        kernel_facts = known_when(guard, False, outer)
        for cid, text in finding.match.cond_text.items():  # type: ignore[union-attr]
            if finding.match.conditions.get(cid) is False:  # type: ignore[union-attr]
                try:
                    kernel_facts = known_when(cst.parse_expression(text), False, kernel_facts)
                except cst.ParserSyntaxError:
                    continue
        original_facts = known_when(guard, True, outer)
        hoisted, run_inside = self._hoistable(run, anchor, removable, kernel_facts, original_facts)
        # a kept statement that read the scores' metadata reads the query's and key's in the
        # kernel's branch (the original's keeps its own); after the `if` it does on both paths
        in_run = {id(n) for stmt in run for n in self._statements_in(stmt)} if restated or dels else set()
        # the `del`s of the run change in the kernel's branch only (the original's deletes what it made)
        run_dels = {k: v for k, v in dels.items() if id(k) in in_run}
        rewriter = _Rewriter({root_stmt.node: new_stmt, **{k: v for k, v in restated.items() if id(k) in in_run},
                              **{k: v for k, v in run_dels.items() if v is not None}},
                             {*removable, *(k for k, v in run_dels.items() if v is None)}, facts=kernel_facts)
        column = self.positions[anchor].start.column
        kept = self._branch(run_inside, rewriter)
        # a helper call given the query (`mask_value = max_neg_value(q)`) that only the original's
        # fills read: not made on the kernel's path
        calls = [restated[stmt] for stmt in self._helper_calls(finding) if stmt in restated]
        if calls:
            kept = _without_unread(kept, calls, body[body.index(run[-1]) + 1:])
            if kept and hasattr(kept[0], "leading_lines"):
                kept[0] = kept[0].with_changes(leading_lines=_from_first_comment(kept[0].leading_lines))
        if any(_decided_ifs(s, original_facts) for s in run_inside):
            original = self._branch(list(run_inside), _Rewriter({}, set(), facts=original_facts))
        else:  # nothing to fold: the original branch is the run itself (libcst nodes are immutable)
            original = list(run_inside)
            if hasattr(original[0], "leading_lines"):  # its blank lines go above the `if`
                original[0] = original[0].with_changes(leading_lines=_from_first_comment(original[0].leading_lines))
        original = _without_unread(original, companions, body[body.index(run[-1]) + 1:])
        first_line, last_line = self.positions[run[0]].start.line, self.positions[run[-1]].end.line
        widest = max(len(self.lines[i - 1 + self.offset].rstrip("\n").expandtabs())
                     for i in range(first_line, last_line + 1))
        if widest + len(self.indent_unit.expandtabs()) > self.context.style.line_length:
            kept, original = self._fit(kept, column), self._fit(original, column)
        if not kept or not original:
            raise SynthesisError("a branch of the guarded rewrite would be empty")
        first_stmt = run_inside[0]
        # the blank lines above the run stay above the `if`; those between a comment and the
        # statement it heads go into the branch with the comment (not doubled up above the `if`)
        blank = list(itertools.takewhile(lambda ln: ln.comment is None, getattr(first_stmt, "leading_lines", ())))
        new_if = cst.If(
            test=self._formatted_test(guard, column),
            body=cst.IndentedBlock(body=original, indent=self.indent_unit),  # type: ignore[arg-type]
            orelse=cst.Else(body=cst.IndentedBlock(body=kept, indent=self.indent_unit)),  # type: ignore[arg-type]
            leading_lines=blank,
        )
        # what the original assigns where the kernel runs instead (its `if`s decided by the same
        # facts): a name it assigns only on the guard's path is no loss on the kernel's
        on_kernel_path = self._branch(list(run_inside), _Rewriter({}, set(), facts=kernel_facts))
        self._check_reads_after(anchor, body, run, on_kernel_path, kept, guard)
        footprint = [(self._footprint(run[0])[0], self._footprint(run[-1])[1])]
        after = {k: v for k, v in restated.items() if id(k) not in in_run}
        after_dels = {k: v for k, v in dels.items() if id(k) not in in_run}
        after.update({k: v for k, v in after_dels.items() if v is not None})
        footprint += [self._footprint(k) for k in [*after, *after_dels]]
        replacement = cst.FlattenSentinel([*hoisted, new_if]) if hoisted else new_if
        return Edit(after, {k for k, v in after_dels.items() if v is None}, {run[0]: (replacement, run[1:])},
                    footprint, code)

    def _statements_in(self, stmt: cst.CSTNode) -> list[cst.CSTNode]:
        """`stmt` and the simple statements nested in it."""
        found = [stmt]
        for node, _ in self.index.statements:
            parent = self.index.parents.get(id(node))
            while parent is not None and parent is not stmt:
                parent = self.index.parents.get(id(parent))
            if parent is stmt:
                found.append(node)
        return found

    def _hoistable(self, run: list, anchor: cst.CSTNode, removable: list, kernel_facts: dict[str, bool],
                   original_facts: dict[str, bool]) -> tuple[list, list]:
        """The statements of the run that both branches would hold alike and that depend on nothing
        computed before them in the run (and that nothing before them reads or sets): they stay
        above the `if`, once, where they were, instead of being copied into both branches."""
        touched = {id(anchor)}
        positions = {id(stmt): stmt for stmt in run}
        for stmt in removable:
            top = stmt if id(stmt) in positions else self._climb(stmt, {k: 0 for k in positions})
            touched.add(id(top))
        hoisted: list = []
        inside: list = []
        reads: set[str] = set()
        writes: set[str] = set()
        for stmt in run:
            names = _Names()
            stmt.visit(names)
            stmt_writes = _assigned([stmt])
            movable = (id(stmt) not in touched and not (names.reads & writes) and not (stmt_writes & (reads | writes))
                       and not _decided_ifs(stmt, kernel_facts) and not _decided_ifs(stmt, original_facts)
                       and not _has_effects_beyond(stmt))
            if movable:
                hoisted.append(stmt)
            else:
                inside.append(stmt)
                reads |= names.reads
                writes |= stmt_writes
        if not inside or inside[-1] is not run[-1]:
            return [], list(run)
        return hoisted, inside

    def _formatted_test(self, guard: cst.BaseExpression, column: int) -> cst.BaseExpression:
        """The guard, laid out by the formatter when `if <guard>:` is longer than a line."""
        text = "if " + cst.Module([]).code_for_node(guard) + ":"
        if len(text) + column <= self.context.style.line_length:
            return guard
        formatted = self.context.style.format_statement(text + "\n    pass\n", column)
        try:
            parsed = cst.parse_statement(formatted)
        except cst.ParserSyntaxError:
            return guard
        return parsed.test if isinstance(parsed, cst.If) else guard

    def _fit(self, statements: list[cst.CSTNode], column: int) -> list[cst.CSTNode]:
        """`statements`, now one block deeper than at `column`, with each line that no longer fits
        the repository's line length laid out again by the formatter."""
        fit = _Fit(self.context.style, column, len(self.indent_unit.expandtabs()), self._widest_line, self._was_over)
        block = cst.IndentedBlock(body=statements).visit(fit)  # type: ignore[arg-type]
        return list(block.body) if isinstance(block, cst.IndentedBlock) else statements

    @staticmethod
    def _branch(run: list[cst.CSTNode], rewriter: _Rewriter) -> list[cst.CSTNode]:
        """The statements of one branch of a guarded rewrite, pruned by what holds there."""
        block = cst.IndentedBlock(body=run).visit(rewriter)  # type: ignore[arg-type]
        statements = list(block.body) if isinstance(block, cst.IndentedBlock) else []
        if statements and hasattr(statements[0], "leading_lines"):
            statements[0] = statements[0].with_changes(leading_lines=_from_first_comment(statements[0].leading_lines))
        return statements

    def _check_reads_after(self, anchor: cst.CSTNode, body: list, run: list, original: list, kept: list,
                           guard: cst.BaseExpression) -> None:
        """A name the original code assigns where the kernel runs instead (`original`: the run
        pruned by the kernel path's facts) and the kernel branch does not must not be read after
        the `if` where the guard may be false: there it would be unassigned (or stale)."""
        lost = _assigned(original) - _assigned(kept)
        if not lost:
            return
        after = body[body.index(run[-1]) + 1:]
        for stmt in after:
            for name in sorted(_reads_outside(stmt, guard) & lost):
                raise SynthesisError(f"`{name}` would be read after the rewrite where the kernel path "
                                     "does not assign it")
            lost -= _assigned([stmt])
            if not lost or _exits_unless_guard(stmt, guard):
                return

    def _raising_if(self, pos: Pos) -> cst.CSTNode:
        """The `if <test>: raise ...` statement (or the `assert <test>` line) whose test is at `pos`."""
        line, col, end_line, end_col = self.char_range(pos)
        for node, where in self.index.statements:
            if isinstance(node, cst.SimpleStatementLine) and len(node.body) == 1 and isinstance(node.body[0], cst.Assert) \
                    and _contains(where, line, col, end_line, end_col):
                return node
            if isinstance(node, cst.If) and node.orelse is None and _contains(where, line, col, end_line, end_col):
                body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
                if body and all(isinstance(s, cst.SimpleStatementLine) and all(isinstance(x, cst.Raise) for x in s.body)
                                for s in body):
                    if _contains(self.positions[node.test], line, col, end_line, end_col):
                        return node
        raise SynthesisError(f"the shape check at line {pos.line} is not an `if ...: raise` or `assert` statement")

    def apply(self, edits: list[Edit]) -> str:
        """The region's text with every edit made, in one pass."""
        replace: dict = {}
        remove: set = set()
        splices: dict = {}
        for e in edits:
            replace.update(e.replace)
            remove |= e.remove
            splices.update(e.splices)
        rewriter = _Rewriter(replace, remove, splices)
        on_path: set[int] = {id(self.module)}
        for target in [*replace, *remove, *splices]:
            parent = self.index.parents.get(id(target))
            while parent is not None and id(parent) not in on_path:
                on_path.add(id(parent))
                parent = self.index.parents.get(id(parent))
        rewriter.on_path = on_path
        return self.module.visit(rewriter).code

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
        """A bound variable rendered by name must still hold that value at the root; so must a bound
        attribute of the module (`self.state`, which its methods may set) from the first statement
        the rewrite removes on."""
        order = {id(n): i for i, n in enumerate(match.method.nodes)}
        root_index = order.get(id(root), len(match.method.nodes))
        removed = {id(n) for n in match.nodes.values()}
        spans = [order[i] for i in (*removed, *map(id, match.companions)) if i in order]
        first, last = (min(spans), max(spans)) if spans else (root_index, root_index)
        root_path = {c.id: c.taken for c in root.guard}
        for operand in match.bindings.values():
            attr = re.match(r"self\.\w+", operand.text) if isinstance(operand, Sym) else None
            for node in match.method.nodes[first:last] if attr is not None else ():
                if node.kind == "store" and re.match(rf"{re.escape(attr.group())}\b", node.target or "") \
                        and not any(root_path.get(c.id, c.taken) != c.taken for c in node.guard):
                    raise SynthesisError(f"`{attr.group()}` is set between its use in the match and the rewrite")
        outputs = {s.out for s in (match.pattern.stmts if match.pattern else ()) if s.out}
        for var, operand in match.bindings.items():
            if var in outputs or not isinstance(operand, Var) or _TEMP.match(operand.name):
                continue
            if _call_argument(next((n for n in match.method.nodes if operand.name in n.outputs), None), match):
                continue  # rendered as the value the helper's call passes
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
            args = [_arg_text(a) for a in root_expr.args]
            first = match.bindings.get("materialized")
            if isinstance(first, Sym) and args and root_expr.args[0].keyword is None and not root_expr.args[0].star:
                # the first argument materialized once, under the name `$materialized`
                given = root_expr.args[0].value
                if isinstance(given, cst.GeneratorExp):  # `list(p for p in ...)`: its own parentheses go
                    args[0] = cst.Module([]).code_for_node(given.with_changes(lpar=[], rpar=[]))
                as_is = match.bindings.get("materialized_as_is")  # already a new list: `params := [*given]`
                args[0] = f"{first.text} := {args[0]}" if isinstance(as_is, Const) and as_is.value is True \
                    else f"{first.text} := list({args[0]})"
            merged, at = match.bindings.get("merged"), match.bindings.get("chooser_at")
            if isinstance(merged, Sym) and isinstance(at, Const):
                # a `**` dict whose keys are not known: replaced by one merged under it
                unpacked = [i for i, a in enumerate(root_expr.args) if a.star == "**"]
                if not isinstance(at.value, int) or at.value >= len(unpacked):
                    return None
                args[unpacked[at.value]] = merged.text
            return ", ".join(args)
        operand = match.bindings.get(name)
        if operand is None:
            return None
        return self.render(operand, match)

    def _read_where_matched(self, name: str, match: Match) -> str | None:
        """The source text of the operand `name` of a matched node, when it still reads the same
        values at the rewrite (no name in it is assigned again in between)."""
        order = {id(n): i for i, n in enumerate(match.method.nodes)}
        removed = {id(n) for n in match.matched_nodes}
        root_index = order.get(id(match.root), len(match.method.nodes))
        for node in match.matched_nodes:
            if node.pos is None or node.via != match.root.via:
                continue
            index = next((i for i, x in enumerate(node.inputs) if isinstance(x, Var) and x.name == name), None)
            if index is None:
                continue
            try:
                part = _operand_expression(self.expression_at(node.pos), index, len(node.inputs))
            except SynthesisError:
                continue
            if part is None:
                continue
            read = {n.value for n in _names_read(part)}
            for later in match.method.nodes[order.get(id(node), 0) + 1:root_index]:
                if id(later) not in removed and later.via == node.via and \
                        any(_python_name(o) in read for o in later.outputs):
                    raise SynthesisError(f"`{self.module.code_for_node(part)}` reads a name assigned again "
                                         "before the rewrite")
            text = self.module.code_for_node(part)
            return text if text.isidentifier() else f"({' '.join(text.split())})"
        return None

    def render(self, operand: Operand, match: Match) -> str:
        if self._callsite is not None:
            return self._render_at_call(operand, match, self._callsite)
        producer = next((n for n in match.method.nodes if isinstance(operand, Var) and operand.name in n.outputs), None)
        if isinstance(operand, Sym) and not match.root.via:
            # a number written in a helper the caller calls (a scorer's `/ math.sqrt(a.size(-1))`)
            # names the helper's parameters: the matched node that takes it says where it was written
            producer = next((n for n in match.matched_nodes if n.via and any(i is operand for i in n.inputs)), None)
        if producer is not None and producer.via and not match.root.via \
                and any(n.via == producer.via for n in match.nodes.values()):
            # computed in a helper the caller calls (levit's `apply_pos_bias` adds a bias): its
            # expression in the caller's terms, where nothing of the helper needs assigning again
            translation = self._translation_for(match, producer.via)
            self._callsite = translation
            try:
                text = self._render_at_call(operand, match, translation, via=producer.via)
            finally:
                self._callsite = None
            if translation.emitted:
                raise SynthesisError("a value from the helper needs its local variables assigned at the call")
            return text
        given = _call_argument(producer, match)
        if given is not None:
            return self.render(given, match)
        if isinstance(operand, Var):
            if _TEMP.match(operand.name):
                producer = next((n for n in match.method.nodes if operand.name in n.outputs), None)
                if producer is None or producer.pos is None or producer.kind == "phi":
                    # a conditional expression's or an inlined helper's result has no expression of
                    # its own: it is read as written where a matched node takes it
                    text = self._read_where_matched(operand.name, match)
                    if text is None:
                        raise SynthesisError(f"cannot find the expression of {operand.name}")
                    return text
                text = self._source_restated(producer.pos)
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

    def _translation_for(self, match: Match, via: tuple) -> callsite.Translation:
        """The restating of a helper's expressions at the call `via` (one level) of it."""
        if len(via) != 1:
            raise SynthesisError("the match lies in a helper of a helper")
        call_expr = self.expression_at(via[0])
        if not isinstance(call_expr, cst.Call):
            raise SynthesisError("the helper's result is not taken from a plain call")
        func = call_expr.func
        bound_self = isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"
        helper = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None
        if bound_self and any(layer.attr == f"self.{helper}" for layer in match.cls.layers):
            helper = "forward"  # a submodule whose forward extraction inlined (a scorer)
        inside = next(n for n in match.method.nodes if n.via == via and n.pos is not None)
        caller_names = {p.name for p in match.method.params} | \
            {_python_name(o) for n in match.method.nodes if not n.via for o in n.outputs if not _TEMP.match(o)}
        try:
            return callsite.Translation(self.lines, _def_line(self.lines, self._here(inside.pos).line, helper),  # type: ignore[arg-type]
                                        helper,
                                        self.source(via[0]), bound_self, caller_names,
                                        {match.cond_text[c]: t for c, t in match.conditions.items() if c in match.cond_text})
        except callsite.CallSiteError as exc:
            raise SynthesisError(f"cannot be written at the call of `{helper}`: {exc}") from exc

    def _render_at_call(self, operand: Operand, match: Match, translation: callsite.Translation,
                        via: tuple | None = None) -> str:
        """An operand of a match inlined from a helper, in the caller's terms at the call (`via`,
        by default the root's)."""
        root = match.root
        via = root.via if via is None else via
        fmask = match.bindings.get("fmask")
        if translation.merging and isinstance(fmask, Var) and operand in (fmask, match.bindings.get("fthrough")):
            # the fill's mask where it is given, and the name tested for it: the variable the
            # restated `if` of the helper assigns (`Translation._merged`)
            return translation.text(_python_name(fmask.name), root.pos.line)  # type: ignore[union-attr]
        if isinstance(operand, Var):
            producer = next((n for n in match.method.nodes if operand.name in n.outputs), None)
            if producer is not None and producer.via == via:
                if producer.pos is None or producer.kind == "phi":
                    raise callsite.CallSiteError(f"`{_python_name(operand.name)}` is chosen by a branch of the helper")
                if _TEMP.match(operand.name):
                    text = translation.text_at(producer.pos, " ".join(self.source(producer.pos).split()))
                else:  # the helper's variable, read just after the statement that assigns it
                    text = translation.after(_python_name(operand.name), producer.pos.line)
                return text if re.fullmatch(r"[\w.]+", text) else f"({text})"
            if producer is not None and producer.kind == "op" and producer.op == "assign" and producer.pos == via[0]:
                return self._render_at_call(producer.inputs[0], match, translation, via)  # a parameter given a constant
            if producer is not None and _TEMP.match(operand.name):
                raise callsite.CallSiteError("an argument of the call is an expression")
            return _python_name(operand.name)  # the caller's variable passed to the helper
        if isinstance(operand, Sym):
            user = next((n for n in match.matched_nodes if any(i is operand for i in n.inputs) and n.pos is not None
                         and n.via == via), root)
            text = translation.text(operand.text, user.pos.line)  # type: ignore[union-attr]
            return text if re.fullmatch(r"[\w.\[\]]+", text) else f"({text})"
        if isinstance(operand, Seq):
            inner = ", ".join(self._render_at_call(i, match, translation, via) for i in operand.items)
            if operand.kind == "list":
                return f"[{inner}]"
            return f"({inner},)" if len(operand.items) == 1 else f"({inner})"
        if isinstance(operand, Const):
            return repr(operand.value)
        raise SynthesisError(f"cannot render {operand!r}")


def _false_where_kernel_runs(guard: str) -> dict[str, bool]:
    """The conditions a guard `a or not b or ...` decides where the kernel runs (none of its terms
    holds there): `{"a": False, "b": True}`, and the guard itself False."""
    known = {" ".join(guard.split()): False}
    try:
        expr = ast.parse(guard, mode="eval").body
    except SyntaxError:
        return known
    terms = expr.values if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or) else [expr]
    for term in terms:
        if isinstance(term, ast.UnaryOp) and isinstance(term.op, ast.Not):
            known[" ".join(ast.unparse(term.operand).split())] = True
        else:
            known[" ".join(ast.unparse(term).split())] = False
    return known


def _plain_besides(value: cst.BaseExpression, call: cst.Call) -> bool:
    """`value` holds `call` and, besides it, only names, attributes, constants and tuples: moving
    the statements that compute the call's value before the statement changes nothing else."""
    if value is call or value.deep_equals(call):
        return True
    if isinstance(value, cst.Tuple):
        return all(_plain_besides(e.value, call) for e in value.elements) \
            and sum(1 for e in value.elements if call in _nodes(e.value)) == 1
    return isinstance(value, (cst.Name, cst.Attribute, cst.SimpleString, cst.Integer, cst.Float)) \
        and not any(isinstance(n, cst.Call) for n in _nodes(value))


def _nodes(node: cst.CSTNode) -> list[cst.CSTNode]:
    out = [node]
    for child in node.children:
        out.extend(_nodes(child))
    return out


def _tidy_assignment(text: str) -> str:
    """`name = value` with the value tidied (see tidy.py)."""
    try:
        stmt = cst.parse_statement(text)
    except cst.ParserSyntaxError:
        return text
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if not isinstance(small, cst.Assign):
        return text
    return cst.Module([]).code_for_node(stmt.with_changes(body=[small.with_changes(value=tidy(small.value))])).strip()


def _def_line(lines: list[str], line: int, name: str | None) -> int:
    """The `def` line of the function named `name` that holds file line `line` (the nearest `def` or
    `class` above it, less indented, must be that one)."""
    text = lines[line - 1]
    indent = len(text) - len(text.lstrip())
    for i in range(line - 1, 0, -1):
        row = lines[i - 1]
        stripped = row.lstrip()
        if not stripped or len(row) - len(stripped) >= indent:
            continue
        if name and re.match(rf"(async\s+)?def\s+{re.escape(name)}\b", stripped):
            return i
        if re.match(r"(async\s+)?def\s|class\s", stripped):
            break
    raise SynthesisError(f"the helper `{name}` could not be found above line {line}")


def _whole_value(stmt: cst.CSTNode, expr: cst.BaseExpression) -> bool:
    """`expr` is all a `return` or an assignment's value holds (a new expression there needs no
    parentheses of its own)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    value = small.value if isinstance(small, (cst.Return, cst.Assign, cst.AnnAssign)) else None
    return value is not None and value.with_changes(lpar=[], rpar=[]).deep_equals(expr)


def _at_body(node: Node, root: Node) -> Pos:
    """Where `node` is written in the body that holds `root`: its own position, or the call there of
    the helper it was inlined from (`mask_value = max_neg_value(s)`)."""
    return node.via[len(root.via)] if len(node.via) > len(root.via) else node.pos  # type: ignore[return-value]


def _trailing_comments(lines) -> list:
    """The leading lines of a removed statement that belong to the statement above it: comment
    lines right below that statement (no blank line between) and set off from the removed one by a
    blank line (stanza's `Srel = self.skew(QEr)` then `# Srel.shape = ...`), with the blank lines
    after them. They stay where the removed statement's own comments go with it."""
    lines = list(lines)
    comments = list(itertools.takewhile(lambda ln: ln.comment is not None, lines))
    blanks = list(itertools.takewhile(lambda ln: ln.comment is None, lines[len(comments):]))
    return [*comments, *blanks] if comments and blanks else []


def _from_first_comment(lines) -> list:
    """A statement's leading lines from its first comment on (the blank lines above it go above the
    `if` that now holds it)."""
    return list(itertools.dropwhile(lambda ln: ln.comment is None, lines))


def _dtype_limits_only(value: cst.BaseExpression) -> bool:
    """`value` computes nothing but a dtype's limits (`-torch.finfo(x.dtype).max`): no call other
    than `torch.finfo`/`torch.iinfo`, so leaving it out changes nothing but that name."""
    calls = m.findall(value, m.Call())
    return bool(calls) and all(get_full_name_for_node(c.func) in ("torch.finfo", "torch.iinfo")  # type: ignore[attr-defined]
                               for c in calls)


def _without_unread(statements: list, companions: list, after: list) -> list:
    """The original branch without the statements that only computed an argument of a call the
    branch no longer makes (`max_neg_value = ...` where folding the guard removed the masked fill)."""
    out = list(statements)
    for companion in companions:
        bare = companion.with_changes(leading_lines=[]) if hasattr(companion, "leading_lines") else companion
        for i, stmt in enumerate(out):
            if not hasattr(stmt, "leading_lines") or not stmt.with_changes(leading_lines=[]).deep_equals(bare):
                continue
            reads: set[str] = set()
            for other in [*out[:i], *out[i + 1:], *after]:
                names = _Names()
                other.visit(names)
                reads |= names.reads
            assigned = _assigned([stmt])
            if assigned and not assigned & reads:
                del out[i]
            break
    return out


def _operand_expression(expr: cst.BaseExpression, index: int, count: int) -> cst.BaseExpression | None:
    """The sub-expression of `expr` that is operand `index` of its node (of `count` operands)."""
    if isinstance(expr, cst.BinaryOperation) and count == 2:
        return (expr.left, expr.right)[index]
    if isinstance(expr, cst.Call) and all(a.keyword is None and not a.star for a in expr.args):
        args = [a.value for a in expr.args]
        if isinstance(expr.func, cst.Attribute) and count == len(args) + 1:
            return [expr.func.value, *args][index]
        if count == len(args):
            return args[index]
    return None


def _names_read(expr: cst.CSTNode) -> list[cst.Name]:
    """The variables an expression reads (not attribute or keyword names; conservatively, a
    comprehension's or lambda's own names too)."""
    found: list[cst.Name] = []

    class Reads(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.append(node)

    expr.visit(Reads())
    return found


__all__ = ["Edit", "SynthesisError", "Synthesizer", "TemplateError"]


def _call_argument(producer: Node | None, match: Match) -> Operand | None:
    """Where `producer` gives a parameter of a helper the match reaches into the constant or attribute
    its call passes (`softmax_dropout(s, self.dropout, self.training)`), that value; else None."""
    if producer is None or producer.kind != "op" or producer.op != "assign" or len(producer.inputs) != 1 \
            or not isinstance(producer.inputs[0], (Sym, Const)) or producer.via \
            or not any(n.via[:1] == (producer.pos,) for n in match.nodes.values()):
        return None
    return producer.inputs[0]


def _del_targets(small: cst.Del) -> list[cst.BaseExpression]:
    target = small.target.with_changes(lpar=[], rpar=[]) if isinstance(small.target, cst.Tuple) else small.target
    return [e.value for e in target.elements] if isinstance(target, cst.Tuple) else [target]


def _with_targets(stmt: cst.SimpleStatementLine, targets: list[cst.BaseExpression]) -> cst.SimpleStatementLine | None:
    """The `del` statement `stmt` deleting `targets` instead, or None where there are none."""
    if not targets:
        return None
    target = targets[0] if len(targets) == 1 else cst.Tuple(
        [cst.Element(t, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if i < len(targets) - 1
                     else cst.MaybeSentinel.DEFAULT) for i, t in enumerate(targets)], lpar=[], rpar=[])
    return stmt.with_changes(body=[stmt.body[0].with_changes(target=target)])
