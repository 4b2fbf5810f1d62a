"""Attention computed in a helper, rewritten where the helper is called.

GPT-2's `_attn(query, key, value, attention_mask, head_mask)` returns `(attn_output, attn_weights)`;
only its caller knows whether the weights are needed (`output_attentions`). The extractor inlines the
helper into its caller, so the match is found there, with the guard in the caller's terms. The
rewrite replaces the call statement `attn_output, attn_weights = self._attn(...)` by the kernel call,
the other returned values None, under that guard; the helper itself stays as it is (the guarded
path and any other caller still use it).

The template's operands are written in the helper's terms; `Translation` restates a helper
expression in the caller's: a parameter becomes the argument passed for it (or its default), a local
of the helper the expression that assigned it (recursively), a global stays when the caller does not
shadow it. What cannot be restated that way is refused with the reason: a value chosen by a branch
of the helper, a parameter rebound in a loop, an argument that is itself an expression the kernel
call would evaluate twice, a helper that also stores state or changes a tensor in place.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from keyword import iskeyword

from engine.dsl.ir import Pos

_SIMPLE = (ast.Name, ast.Attribute, ast.Constant)
_ROOT = "__adopter_root__"  # the attention's result while a value the helper derives from it is restated


def _with_root(text: str, kernel: str) -> str:
    """`text` with the attention's result written as `kernel` (parenthesized unless a call or a name)."""
    return text.replace(_ROOT, kernel if re.fullmatch(r"[\w.]+(\(.*\))?", kernel, re.S) else f"({kernel})")


def _meta(i: int) -> str:
    """The placeholder of the helper's `i`-th read of the scores' metadata while it is restated."""
    return f"__adopter_meta_{i}__"


class CallSiteError(Exception):
    """The helper's match cannot be written at its call; the message says why."""


_Place = tuple  # ((block, index), ...): a statement of the helper, from its body into `if` blocks


@dataclass
class _Binding:
    place: _Place  # the statement that binds the name
    value: ast.expr | None  # the expression bound (None: bound in a way that has no expression)
    stmt: ast.stmt


def _is_shape(value: ast.expr) -> bool:
    """`x.shape` or `x.size()`: a tuple of sizes that indexing reads one by one."""
    if isinstance(value, ast.Attribute):
        return value.attr == "shape"
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "size" \
        and not value.args and not value.keywords


def _function_at(lines: list[str], def_line: int) -> tuple[ast.AST | None, str, int]:
    """The function whose `def` is at file line `def_line` (1-based), its dedented source and indent:
    the first end at a dedent where it parses."""
    first = lines[def_line - 1]
    indent = len(first) - len(first.lstrip())
    source = ""
    for end in range(def_line, len(lines) + 1):
        nxt = lines[end] if end < len(lines) else ""
        if end < len(lines) and (not nxt.strip() or len(nxt) - len(nxt.lstrip()) > indent):
            continue
        source = textwrap.dedent("".join(lines[def_line - 1:end]))
        try:
            return ast.parse(source).body[0], source, indent
        except (SyntaxError, IndexError):
            continue
    return None, source, indent


def free_after(lines: list[str], def_line: int, call_end: int, arguments: str) -> Callable[[str], bool]:
    """Whether the caller (its `def` at file line `def_line`) may bind a name in place of its call of
    a helper ending at file line `call_end`: the caller reads the name nowhere after the call (and
    nowhere at all where it does not bind it itself, since binding it would make a global local),
    the call is in no loop, no nested function or comprehension reads it, and the call's arguments
    (`arguments`, which the statements replacing the call read) do not name it."""
    fn, _, _ = _function_at(lines, def_line)
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return lambda name: False
    row = call_end - def_line + 1
    loops = [n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))
             and n.lineno <= row <= (n.end_lineno or n.lineno)]
    nested = {id(m) for n in ast.walk(fn) if n is not fn and isinstance(
        n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.comprehension)) for m in ast.walk(n)}
    params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    stored = params | {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    said = {n.id for n in ast.walk(ast.parse(arguments)) if isinstance(n, ast.Name)} if arguments else set()

    def free(name: str) -> bool:
        if loops or name in said:
            return False
        loads = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
        return not any(id(n) in nested or n.lineno > row or name not in stored for n in loads)

    return free


class Translation:
    """A helper's expressions in its caller's terms, for one call of it.

    `lines` are the file's lines; `def_line` is the `def` line (1-based) of the helper named `helper`; `call` the call's
    source text; `bound_self` whether it is called as a method (`self._attn(...)`); `caller_names`
    the names the caller binds (its parameters and assignments)."""

    def __init__(self, lines: list[str], def_line: int, helper: str | None, call: str, bound_self: bool,
                 caller_names: set[str], known: dict[str, bool] | None = None) -> None:
        fn, source, self.indent = _function_at(lines, def_line)
        if not isinstance(fn, ast.FunctionDef) or fn.name != helper:
            raise CallSiteError("the helper could not be read")
        self.def_line = def_line
        self.source = source
        self.fn = fn
        self.caller_names = caller_names
        self.emitted: dict[tuple, str] = {}  # helper statement (its path) -> its text in the caller's terms
        self.known = known or {}  # conditions the match decides (in the caller's terms) -> the branch taken
        self._root: Pos | None = None  # the attention's result, while a value derived from it is restated
        self._hit = False  # whether that restating met the root
        self._kept: range = range(0)  # the body's statements the caller repeats as they are: their names stay
        self.meta: list[tuple[Pos, str]] = []  # reads of the scores' metadata, in the caller's terms (`restate`)
        # helper variables chosen by an `if` that the kernel's branch restates (`_merged`): the mask a
        # fill reads where it is given, which the kernel tests after the merge
        self.merging: set[str] = set()
        self.free: Callable[[str], bool] = lambda name: False  # names the caller may assign at the call
        self._renamed: dict[str, str] = {}  # while an `if` is restated: its variable, the caller's name
        self._slicing: list[_Place] = []  # the `if` statements being restated
        self.params = self._arguments(call, bound_self)
        self._check_effects()

    # -- the helper -------------------------------------------------------------------------------

    def _check_effects(self) -> None:
        body = self.fn.body
        # an early return under a test the kernel's branch decides false (`if ret_attn: return out,
        # attn` where the call passes False, or where the rewrite is guarded on the caller's flag)
        skipped = [st for i, st in enumerate(body) if isinstance(st, ast.If)
                   and self._decided(st.test, ((body, i),)) is False]
        returns = [n for n in ast.walk(self.fn) if isinstance(n, (ast.Return, ast.Yield, ast.YieldFrom))
                   and not any(n in set(ast.walk(st.test)) | {m for b in st.body for m in ast.walk(b)} for st in skipped)]
        if len(returns) != 1 or not isinstance(body[-1], ast.Return) or returns[0] is not body[-1]:
            raise CallSiteError(f"the helper `{self.fn.name}` does not end in its only return")
        for node in ast.walk(self.fn):
            if isinstance(node, (ast.Global, ast.Nonlocal, ast.Delete, ast.With, ast.AsyncWith, ast.Try,
                                 ast.FunctionDef, ast.Lambda, ast.ClassDef)) and node is not self.fn:
                raise CallSiteError(f"the helper `{self.fn.name}` does more than compute values (line "
                                    f"{self.def_line + node.lineno - 1})")
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For)) else []
            for target in targets:
                if any(isinstance(t, (ast.Attribute, ast.Subscript, ast.Starred)) for t in ast.walk(target)):
                    raise CallSiteError(f"the helper `{self.fn.name}` stores state (line {self.def_line + node.lineno - 1})")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.endswith("_") \
                    and not node.func.attr.startswith("__"):
                raise CallSiteError(f"the helper `{self.fn.name}` changes a tensor in place (`{node.func.attr}`)")
            if isinstance(node, ast.Expr) and not (isinstance(node.value, ast.Constant) and node is body[0]):
                raise CallSiteError(f"the helper `{self.fn.name}` has a statement whose effect the kernel path would "
                                    f"skip (line {self.def_line + node.lineno - 1})")

    def _decided(self, test: ast.expr, place: _Place) -> bool | None:
        """The value of the helper's `if` test at this call where it is known: a constant the call
        passes (or the default), or a condition the match decides."""
        segment = " ".join((ast.get_source_segment(self.source, test) or ast.unparse(test)).split())
        try:
            text = self._text(segment, place, 0)
        except CallSiteError:
            return None
        if text in self.known:
            return self.known[text]
        try:
            return bool(ast.literal_eval(text))
        except (ValueError, SyntaxError):
            return None

    def _arguments(self, call: str, bound_self: bool) -> dict[str, str]:
        call = call.strip()
        try:
            expr = ast.parse(call, mode="eval").body
        except SyntaxError as exc:
            raise CallSiteError("the call could not be read") from exc
        if not isinstance(expr, ast.Call):
            raise CallSiteError("the helper's result is not taken from a plain call")
        args = self.fn.args
        if args.vararg or args.kwarg or any(isinstance(a, ast.Starred) for a in expr.args) \
                or any(k.arg is None for k in expr.keywords):
            raise CallSiteError("the helper takes variable arguments")
        params = [*args.posonlyargs, *args.args]
        if bound_self:
            params = params[1:]
        out: dict[str, str] = {}
        for param, value in zip(params, expr.args, strict=False):
            out[param.arg] = self._argument(value, call)
        for keyword in expr.keywords:
            out[keyword.arg] = self._argument(keyword.value, call)  # type: ignore[index]
        defaults = dict(zip([p.arg for p in params][len(params) - len(args.defaults):], args.defaults, strict=True))
        defaults.update({p.arg: d for p, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None})
        for name, default in defaults.items():
            if name not in out:
                out[name] = self._argument(default, None)
        return out

    def _argument(self, value: ast.expr, call: str | None) -> str:
        if not all(isinstance(n, (*_SIMPLE, ast.Load, ast.UnaryOp, ast.USub)) for n in ast.walk(value)):
            raise CallSiteError(f"the argument `{ast.unparse(value)}` is an expression the kernel call would repeat")
        if call is None:  # a default: evaluated where the helper is defined
            for n in ast.walk(value):
                if isinstance(n, ast.Name) and n.id in self.caller_names:
                    raise CallSiteError(f"the default `{ast.unparse(value)}` names a variable of the caller")
        return ast.get_source_segment(call, value) if call is not None else ast.unparse(value)  # type: ignore[return-value]

    # -- restating ----------------------------------------------------------------------------------

    def _stores(self, name: str) -> int:
        return sum(1 for n in ast.walk(self.fn) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)) \
            + sum(1 for a in self.fn.args.args + self.fn.args.posonlyargs + self.fn.args.kwonlyargs if a.arg == name)

    def preamble(self) -> list[str]:
        """The helper's statements the kernel's branch repeats (in the caller's terms), in order."""
        return [self.final(self.emitted[i]) for i in sorted(self.emitted)]

    def _place(self, line: int) -> _Place:
        """The helper's statement holding the file line `line`, as a path of (block, index) frames
        from the function's body into the `if` blocks around it."""
        row = line - self.def_line + 1
        frames: list[tuple[list[ast.stmt], int]] = []
        body = self.fn.body
        while True:
            index = next((i for i, st in enumerate(body) if st.lineno <= row <= (st.end_lineno or st.lineno)), None)
            if index is None:
                raise CallSiteError(f"line {line} is not in the helper")
            frames.append((body, index))
            stmt = body[index]
            inner = [b for b in ((stmt.body, stmt.orelse) if isinstance(stmt, ast.If) else ())
                     if any(st.lineno <= row <= (st.end_lineno or st.lineno) for st in b)]
            if not inner:
                return tuple(frames)
            body = inner[0]

    def returned(self) -> list[ast.expr]:
        value = self.fn.body[-1].value  # type: ignore[attr-defined]
        if value is None:
            raise CallSiteError("the helper returns nothing")
        return list(value.elts) if isinstance(value, ast.Tuple) else [value]

    def binds_root(self, element: ast.expr, root: Pos) -> bool:
        """Whether the returned `element` is the root's value (the root itself, or a name the root's
        statement assigned and nothing rebinds)."""
        if self._at(element, root):
            return True
        if isinstance(element, ast.Name):
            binding = self._binding(element.id, ((self.fn.body, len(self.fn.body) - 1),))
            return binding is not None and binding.value is not None and self._at(binding.value, root)
        return False

    def around_root(self, element: ast.expr, root: Pos, kernel: str) -> str | None:
        """The returned `element` in the caller's terms with the root's value (the attention's
        result) written as `kernel`; None where the element does not derive from the root."""
        self._root = root
        self._hit = False
        try:
            end = ((self.fn.body, len(self.fn.body) - 1),)
            text = self._text(self._segment(element), end, 0)
        finally:
            self._root = None
        if not self._hit:
            return None
        if text.count(_ROOT) != 1:
            raise CallSiteError("the helper reads the attention's result more than once")
        return _with_root(self.final(text), kernel)

    def tail(self, root: Pos, kernel: str, free: Callable[[str], bool]) -> tuple[list[str], list[str | None]] | None:
        """The helper's statements from the one computing the attention's result to its return, in
        the caller's terms, the result written as `kernel` (`x = torch.matmul(p_attn, value)`, `x =
        x.transpose(1, 2)...`, each kept as a statement of its own, as the helper has them), and each
        returned value in those terms (None for one that does not derive from the result). Each is an
        assignment of one plain name the caller may bind there (`free`: it holds nothing the caller
        reads later); an `if` the call decides false (`if ret_attn: return out, attn`) is skipped.
        None where the statements are not such: the result is then restated in one expression."""
        body = self.fn.body
        place = self._place(root.line)
        first = place[0][1]
        if len(place) != 1 or first == len(body) - 1:
            return None  # the result computed in a branch, or in the return itself
        steps = [(i, st) for i, st in enumerate(body[first:-1], start=first)
                 if not (isinstance(st, ast.If) and self._decided(st.test, ((body, i),)) is False)]
        if not all(isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
                   and free(st.targets[0].id) for _, st in steps):
            return None
        self._kept = range(first, len(body) - 1)
        texts: list[str] = []
        try:
            for i, st in steps:
                self._root = root if i == first else None
                self._hit = False
                text = self._text(self._segment(st.value), ((body, i),), 0)  # type: ignore[attr-defined]
                if i == first and text.count(_ROOT) != 1:
                    return None
                texts.append(f"{st.targets[0].id} = {_with_root(self.final(text), kernel)}")  # type: ignore[attr-defined]
            self._root = None
            end = ((body, len(body) - 1),)
            values: list[str | None] = []
            for element in self.returned():
                self._hit = False
                text = self._text(self._segment(element), end, 0)
                values.append(self.final(text) if self._hit else None)
        finally:
            self._root = None
            self._kept = range(0)
        return texts, values

    def _segment(self, value: ast.expr) -> str:
        """The source of the helper's expression `value`, the root's expression in it (while one is
        being restated) written as a placeholder, and each read of the scores' metadata (`restate`)
        as one too (`final` writes it back in the caller's terms)."""
        text = ast.get_source_segment(self.source, value) or ast.unparse(value)
        root = self._root
        spans = [(n, _ROOT) for n in ast.walk(value) if isinstance(n, ast.expr) and root is not None and self._spans(n, root)][:1]
        spans += [(n, _meta(i)) for i, (pos, _) in enumerate(self.meta) for n in ast.walk(value)
                  if isinstance(n, ast.expr) and self._spans(n, pos)]
        if spans:
            lines = self.source.splitlines(keepends=True)
            offset = [0]
            for row in lines:
                offset.append(offset[-1] + len(row.encode()))
            data = self.source.encode()
            begin = offset[value.lineno - 1] + value.col_offset
            raw = data[begin:offset[value.end_lineno - 1] + value.end_col_offset]  # type: ignore[operator]
            for inner, name in sorted(spans, key=lambda span: (span[0].lineno, span[0].col_offset), reverse=True):
                start = offset[inner.lineno - 1] + inner.col_offset - begin
                stop = offset[inner.end_lineno - 1] + inner.end_col_offset - begin  # type: ignore[operator]
                raw = raw[:start] + name.encode() + raw[stop:]
            text = raw.decode()
            self._hit = self._hit or any(name == _ROOT for _, name in spans)
        return " ".join(text.split())

    def restate(self, reads: list[tuple[Pos, str]]) -> None:
        """The helper's reads of the scores' metadata (`scores.device`) and their restatement in the
        caller's terms (`q.device`): the scores are gone where the kernel runs."""
        self.meta = list(reads)

    def final(self, text: str) -> str:
        """A restated text with the metadata reads written in the caller's terms."""
        for i, (_, caller) in enumerate(self.meta):
            text = re.sub(rf"\b{_meta(i)}\b", caller if re.fullmatch(r"[\w.]+(\[[^\]]*\])?", caller) else f"({caller})", text)
        return text

    def text_at(self, pos: Pos, source: str) -> str:
        """The helper's expression `source` at `pos`, read at its statement, in the caller's terms."""
        node = next((n for n in ast.walk(self.fn) if isinstance(n, ast.expr) and self._spans(n, pos)), None)
        return self.final(self._text(self._segment(node) if node is not None else source, self._place(pos.line), 0))

    def _spans(self, node: ast.expr, pos: Pos) -> bool:
        return self._at(node, pos) and node.end_lineno is not None and node.end_col_offset is not None \
            and (self.def_line + node.end_lineno - 1, node.end_col_offset + self.indent) == (pos.end_line, pos.end_col)

    def _at(self, node: ast.expr, pos: Pos) -> bool:
        return (self.def_line + node.lineno - 1, node.col_offset + self.indent) == (pos.line, pos.col)

    def _binding(self, name: str, place: _Place) -> _Binding | None:
        """What `name` holds just before the statement at `place`: its assignment in the same block
        or an enclosing one, looking into an earlier `if` whose branch the match decides (`known`)."""
        for depth in range(len(place) - 1, -1, -1):
            body, before = place[depth]
            outer = place[:depth]
            for i in range(before - 1, -1, -1):
                found = self._bound_in(name, body, i, (*outer, (body, i)))
                if found is not None:
                    return found
        return None

    def _bound_in(self, name: str, body: list[ast.stmt], i: int, place: _Place) -> _Binding | None:
        stmt = body[i]
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
            if isinstance(target, ast.Name) and target.id == name:
                return _Binding(place, value, stmt)
            if isinstance(target, ast.Tuple) and any(isinstance(t, ast.Name) and t.id == name for t in target.elts):
                k = next(j for j, t in enumerate(target.elts) if isinstance(t, ast.Name) and t.id == name)
                if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
                    return _Binding(place, value.elts[k], stmt)
                if _is_shape(value) and not any(isinstance(t, ast.Starred) for t in target.elts):
                    # `B, L, H, E = x.shape`: `E` is `x.shape[3]` (the unpacking proves the length)
                    return _Binding(place, ast.Subscript(value, ast.Constant(k), ast.Load()), stmt)
                return _Binding(place, None, stmt)
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name:
            return _Binding(place, stmt.value, stmt)
        if not any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(stmt)):
            return None
        if isinstance(stmt, ast.If):
            test = " ".join((ast.get_source_segment(self.source, stmt.test) or "").split())
            taken = self.known.get(self._text(test, place, 0)) if test else None
            branch = stmt.body if taken else stmt.orelse if taken is False else None
            if branch is not None:
                for j in range(len(branch) - 1, -1, -1):
                    inner = self._bound_in(name, branch, j, (*place, (branch, j)))
                    if inner is not None:
                        return inner
                return None  # the branch the match takes leaves it as it was
        return _Binding(place, None, stmt)  # assigned in a branch, a loop or an augmented assignment

    def _merged(self, name: str, binding: _Binding, depth: int) -> str:
        """`name` chosen by the helper's `if` statement (`if mask is not None: mask = mask.unsqueeze(1).eq(0)`):
        that statement, sliced to its assignments of `name`, goes in the preamble in the caller's
        terms, under the caller's name of the variable (the argument passed for a parameter, which the
        caller reads no more after the call: `free`), and that name is read after it."""
        target = self.params.get(name, name)
        if not target.isidentifier() or iskeyword(target) or not self.free(target) or name not in self.params and target in self.caller_names:
            raise CallSiteError(f"`{name}` is chosen by a branch of the helper `{self.fn.name}`, and the caller "
                                f"cannot assign `{target}` there")
        key = tuple(i for _, i in binding.place)
        if key not in self.emitted:
            self._renamed[name] = target
            try:
                self.emitted[key] = self._sliced(binding.stmt, name, binding.place, depth)  # type: ignore[arg-type]
            finally:
                del self._renamed[name]
        return target

    def _sliced(self, stmt: ast.If, name: str, place: _Place, depth: int) -> str:
        """The `if` statement at `place` in the caller's terms, holding only its assignments of `name`
        (and the `if`s holding those); what else it computes (the fill the kernel replaces) is left out."""
        self._slicing.append(place)
        try:
            test = self._text(self._segment(stmt.test), place, depth + 1)
            body = self._slice_block(stmt.body, name, place, depth)
            orelse = self._slice_block(stmt.orelse, name, place, depth)
        finally:
            self._slicing.pop()
        if not body:
            body, orelse, test = orelse, [], f"not ({test})"
        lines = [f"if {test}:", *(f"    {line}" for line in body)]
        if orelse:
            lines += ["else:", *(f"    {line}" for line in orelse)]
        return "\n".join(lines)

    def _slice_block(self, block: list[ast.stmt], name: str, outer: _Place, depth: int) -> list[str]:
        lines: list[str] = []
        for j, st in enumerate(block):
            place = (*outer, (block, j))
            stores = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(st))
            if not stores:
                continue
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                lines.append(f"{self._renamed[name]} = {self._text(self._segment(st.value), place, depth + 1)}")
            elif isinstance(st, ast.If):
                lines.extend(self._sliced(st, name, place, depth).split("\n"))
            else:
                raise CallSiteError(f"`{name}` is assigned otherwise than by `=` in a branch of the helper `{self.fn.name}`")
        return lines

    def text(self, source: str, line: int, depth: int = 0) -> str:
        """`source`, an expression of the helper read at its statement holding `line`, in the
        caller's terms."""
        return self.final(self._text(source, self._place(line), depth))

    def after(self, name: str, line: int) -> str:
        """The helper's variable `name` just after the statement holding `line` assigned it."""
        place = self._place(line)
        body, index = place[-1]
        return self.final(self._text(name, (*place[:-1], (body, index + 1)), 0))

    def _text(self, source: str, index: _Place, depth: int) -> str:
        if depth > 16:
            raise CallSiteError("the helper's values nest too deeply to restate")
        try:
            tree = ast.parse(f"({source})", mode="eval").body
        except SyntaxError as exc:
            raise CallSiteError(f"`{source}` could not be read") from exc
        edits: list[tuple[int, int, str]] = []
        rows = f"({source})".split("\n")
        starts = [0]
        for row in rows[:-1]:
            starts.append(starts[-1] + len(row) + 1)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Lambda, ast.comprehension, ast.NamedExpr)):
                raise CallSiteError(f"`{source}` binds names of its own")
            if not isinstance(node, ast.Name) or node.id == "self":
                continue
            new = self._name(node.id, index, depth)
            if new != node.id:
                begin = starts[node.lineno - 1] + node.col_offset - 1
                edits.append((begin, begin + len(node.id), new))
        out = source
        for begin, end, new in sorted(edits, reverse=True):
            out = out[:begin] + new + out[end:]
        return out

    def _name(self, name: str, place: _Place, depth: int) -> str:
        binding = self._binding(name, place)
        if binding is not None and len(binding.place) == 1 and binding.place[0][1] in self._kept:
            self._hit = True  # a statement the caller repeats (`tail`): read by its name
            return name
        if name in self._renamed:
            return self._renamed[name]  # assigned by the `if` statement being restated (`_merged`)
        if binding is not None and any(binding.place[:len(frame)] == frame for frame in self._slicing):
            raise CallSiteError(f"`{name}` is computed in the branch of the helper `{self.fn.name}` that chooses "
                                "the mask, beside it")
        if binding is not None:
            if binding.value is None and isinstance(binding.stmt, ast.If) and name in self.merging:
                return self._merged(name, binding, depth)
            if binding.value is None:
                raise CallSiteError(f"`{name}` is chosen by a branch or a loop of the helper `{self.fn.name}`")
            stmt = binding.stmt
            targets = [n.id for n in ast.walk(stmt.targets[0])  # type: ignore[attr-defined]
                       if isinstance(n, ast.Name)] if isinstance(stmt, ast.Assign) else []
            root = self._root
            holds_root = root is not None and binding.value is not None \
                and any(isinstance(n, ast.expr) and self._spans(n, root) for n in ast.walk(binding.value))
            if targets and not holds_root and not any(t in self.caller_names or self._stores(t) != 1 for t in targets):
                # a local of the helper assigned once, under a name the caller does not use: the
                # kernel's branch assigns it the same way, and the template reads it by name
                key = tuple(i for _, i in binding.place)
                if key not in self.emitted:
                    value = self._segment(stmt.value)  # type: ignore[union-attr]
                    lhs = " ".join((ast.get_source_segment(self.source, stmt.targets[0]) or "").split())
                    text = self._text(value, binding.place, depth + 1)
                    if _ROOT not in text:
                        self.emitted[key] = f"{lhs} = {text}"
                    elif isinstance(stmt.targets[0], ast.Name):  # computed from the result: read in place
                        return f"({text})"
                    else:
                        raise CallSiteError(f"`{lhs}` is unpacked from the attention's result")
                return name
            segment = self._segment(binding.value)
            inner = self._text(segment, binding.place, depth + 1)
            return inner if isinstance(binding.value, (*_SIMPLE, ast.Call, ast.Subscript)) else f"({inner})"
        if name in self.params:
            return self.params[name]
        if name in self.caller_names:
            raise CallSiteError(f"the helper's global `{name}` is a variable of its caller")
        return name
