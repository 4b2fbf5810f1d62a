"""Already fused: a hand-written site that is the fallback of a fused path beside it.

Model code often carries both forms of one computation: `F.scaled_dot_product_attention` (or a
flash-attention kernel) when a flag or a version check allows it, and the manual attention
otherwise (timm's `fused_attn`, Whisper's `use_sdpa`, MONAI's `use_flash_attention`). Rewriting
the manual branch would turn a deliberate fallback (kept for older torch, for exporters, for
attention-weight outputs) into a second copy of the fused call. Such a match is reported with the
status `already-fused` and never rewritten.

A match is already fused when it and a call of the rule's kernel lie on *exclusive paths* of one
function: the two branches of one `if` (or of a conditional expression), or one of them after an
`if` whose branch holding the other always leaves the function (`if self.fused: return sdpa(...)`).
A call counts as the kernel when it resolves (through the file's imports) to the rule's kernel or
to a library kernel for the same operation, or to a function or method of the same file that
itself calls one (a `self.flash_attn(q, k, v)` wrapper), to a bounded depth. A match inside a
helper counts through the helper's call sites in the same file (timm's `_layer_norm_cf`, called
where `F.layer_norm` is not), unless the match is the body of a public module-level function, which
other modules call as well (timm's `rms_norm`). A kernel that normalizes the trailing axes
(`F.layer_norm`) given the very input that the match normalizes over other axes computes another
norm (HorNet's channels-last branch beside its channels-first one), and is no fused path for it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass

from engine.dsl.ir import FileModel, Var
from engine.extract import extract_source, extract_tree, package
from engine.extract.imports import Imports

# Library kernels that compute what a rule's kernel computes: a call of one of these (a qualified
# name, or a package prefix ending in ".") beside a manual form is a fused path too.
EQUIVALENT_KERNELS: dict[str, tuple[str, ...]] = {
    "torch.nn.functional.scaled_dot_product_attention": (
        "flash_attn.",  # flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func, ...
        "xformers.ops.memory_efficient_attention",
        "xformers.ops.fmha.",
        "torch.nn.attention.flex_attention.flex_attention",
    ),
}
# Kernels that normalize the trailing axes of their input: one of these given the very input that a
# match normalizes over other (constant) axes computes another norm, and is no fused path for it.
TRAILING_NORMS = frozenset({"torch.nn.functional.layer_norm", "torch.nn.functional.rms_norm"})
_WRAPPER_DEPTH = 3  # how many local function layers between a call and the kernel are followed
_CALLER_DEPTH = 2  # how many call-site layers above a helper holding the match are followed

_Func = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class _Step:
    """One step on the way down from a function to a node: into field `field` of `node` (a block
    such as `body`/`orelse`, or an expression slot such as an `IfExp`'s `body`), at `index`."""

    node: ast.AST
    field: str
    index: int


def _kernel_names(kernel: str) -> tuple[str, ...]:
    return (kernel, *EQUIVALENT_KERNELS.get(kernel, ()))


def _spelled(name: str, text: str) -> bool:
    """Whether the last part of a kernel's qualified name (or of a package prefix) is in `text`."""
    return name.rstrip(".").rsplit(".", 1)[-1] in text


def _is_kernel(name: str | None, names: tuple[str, ...]) -> bool:
    if not name:
        return False
    return any(name.startswith(n) if n.endswith(".") else name == n for n in names)


class _File:
    """The parsed file: its functions, who calls whom, and where each node sits. What a check needs
    is computed once per file, on first use: the calls in each function, each function's parent
    links (only for functions a check enters), the kernel calls per kernel."""

    def __init__(self, tree: ast.Module, module: str) -> None:
        self.imports = Imports(tree, module)
        self.functions: list[tuple[str | None, _Func]] = []  # (class name or None, def)
        self.class_of: dict[_Func, str | None] = {}
        self._calls: dict[_Func, list[ast.Call]] = {}
        self._parents: dict[_Func, dict[ast.AST, ast.AST]] = {}
        self._kernel_calls: dict[tuple[str, ...], dict[_Func, list[ast.Call]]] = {}
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions.append((None, stmt))
            elif isinstance(stmt, ast.ClassDef):
                for item in stmt.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        self.functions.append((stmt.name, item))
        for cls, fn in self.functions:
            self.class_of[fn] = cls

    def parents(self, fn: _Func) -> dict[ast.AST, ast.AST]:
        """Each node of `fn` (below it) to the node holding it."""
        found = self._parents.get(fn)
        if found is None:
            found = {child: node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}
            self._parents[fn] = found
        return found

    def callee(self, call: ast.Call, caller_class: str | None) -> _Func | None:
        """The function of this file a call invokes, where that is plain from the call: `name(...)` of
        a module-level function, `self.name(...)` of a method of the caller's class."""
        func = call.func
        if isinstance(func, ast.Name):
            return next((fn for cls, fn in self.functions if cls is None and fn.name == func.id), None)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            return next((fn for cls, fn in self.functions if cls == caller_class and fn.name == func.attr),
                        None)
        return None

    def calls(self, fn: _Func) -> list[ast.Call]:
        found = self._calls.get(fn)
        if found is None:
            found = [node for node in ast.walk(fn) if isinstance(node, ast.Call)]
            self._calls[fn] = found
        return found

    def kernel_calls(self, names: tuple[str, ...]) -> dict[_Func, list[ast.Call]]:
        """Per function: the calls in it that run the kernel, directly or through local wrappers."""
        cached = self._kernel_calls.get(names)
        if cached is None:
            cached = self._kernel_calls[names] = self._find_kernel_calls(names)
        return cached

    def _find_kernel_calls(self, names: tuple[str, ...]) -> dict[_Func, list[ast.Call]]:
        fusing: set[_Func] = set()
        for _ in range(_WRAPPER_DEPTH + 1):
            grew = False
            for cls, fn in self.functions:
                if fn in fusing:
                    continue
                if any(self._runs_kernel(c, cls, names, fusing) for c in self.calls(fn)):
                    fusing.add(fn)
                    grew = True
            if not grew:
                break
        found: dict[_Func, list[ast.Call]] = {}
        for cls, fn in self.functions:
            hits = [c for c in self.calls(fn) if self._runs_kernel(c, cls, names, fusing)]
            if hits:
                found[fn] = hits
        return found

    def _runs_kernel(self, call: ast.Call, cls: str | None, names: tuple[str, ...], fusing: set[_Func]) -> bool:
        if _is_kernel(self.imports.qualify(call.func), names):
            return True
        target = self.callee(call, cls)
        return target is not None and target in fusing

    def steps(self, node: ast.AST, fn: _Func) -> list[_Step]:
        """The path from `fn` down to `node`: which field (and list position) each step takes."""
        path: list[_Step] = []
        child = node
        parents = self.parents(fn)
        while child is not fn and child in parents:
            parent = parents[child]
            for name, value in ast.iter_fields(parent):
                if value is child:
                    path.append(_Step(parent, name, 0))
                    break
                if isinstance(value, list) and any(v is child for v in value):
                    path.append(_Step(parent, name, next(i for i, v in enumerate(value) if v is child)))
                    break
            child = parent
        path.reverse()
        return path


def _leaves(stmt: ast.stmt) -> bool:
    """Whether the statement always leaves the function (returns or raises on every path)."""
    if isinstance(stmt, ast.Return | ast.Raise):
        return True
    if isinstance(stmt, ast.If):
        return bool(stmt.orelse) and _block_leaves(stmt.body) and _block_leaves(stmt.orelse)
    return False


def _block_leaves(block: list[ast.stmt]) -> bool:
    return bool(block) and _leaves(block[-1])


def _exclusive(a: list[_Step], b: list[_Step]) -> bool:
    """Whether two nodes, given by their paths from one function, never run in one call: they sit in
    the two branches of one `if` (or conditional expression), or one sits in a later statement of a
    block than the other, whose `if` branch holding it always leaves the function."""
    for i, (sa, sb) in enumerate(zip(a, b, strict=False)):
        if sa == sb:
            continue
        if isinstance(sa.node, ast.If | ast.IfExp) and {sa.field, sb.field} == {"body", "orelse"}:
            return True
        if sa.field == sb.field and sa.index != sb.index:
            earlier = a if sa.index < sb.index else b
            return _inside_leaving_branch(earlier[i:])
        return False
    return False


def _inside_leaving_branch(path: list[_Step]) -> bool:
    """Whether some `if` branch on this path always leaves the function."""
    return any(isinstance(step.node, ast.If) and step.field in ("body", "orelse")
               and _block_leaves(getattr(step.node, step.field)) for step in path[1:])


def _statement_at(line: int, fn: _Func) -> ast.stmt | None:
    """The innermost statement of `fn` that spans the line."""
    spanning = [node for node in ast.walk(fn) if isinstance(node, ast.stmt) and node is not fn
                and node.lineno <= line <= (node.end_lineno or node.lineno)]
    return max(spanning, key=lambda n: (n.lineno, -(n.end_lineno or n.lineno)), default=None)


def already_fused_reason(tree: ast.Module, module: str, lines: Iterable[int], kernel: str,
                         file: _File | None = None, own: str | None = None,
                         other_axes_of: str | None = None) -> str | None:
    """Why the site at `lines` (its matched lines) is already fused, or None. `own`: the module
    function whose body holds the match, where it is one (not a helper inlined into the match).
    `other_axes_of`: the parameter of the match's function that the match normalizes over axes
    other than the trailing ones, where the kernel normalizes trailing axes (`TRAILING_NORMS`): a
    kernel call given that parameter, as the function received it, computes another norm."""
    file = file or _File(tree, module)
    names = _kernel_names(kernel)
    kernel_sites = file.kernel_calls(names)
    if not kernel_sites:
        return None
    for line in lines:
        fn = next((f for _, f in file.functions if f.lineno <= line <= (f.end_lineno or f.lineno)
                   and _innermost(file, f, line)), None)
        if fn is None:
            continue
        stmt = _statement_at(line, fn)
        if stmt is None:
            continue
        sites = kernel_sites
        if other_axes_of is not None:
            sites = {**kernel_sites,
                     fn: [c for c in kernel_sites.get(fn, ()) if not _given_parameter(c, fn, other_axes_of)]}
        reason = _fused_beside(file, stmt, fn, sites, depth=0, own=own)
        if reason:
            return reason
    return None


def _given_parameter(call: ast.Call, fn: _Func, name: str) -> bool:
    """The call's first argument is `fn`'s parameter `name`, not assigned in `fn` before the call."""
    first = call.args[0] if call.args else None
    if not (isinstance(first, ast.Name) and first.id == name):
        return False
    params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return any(a.arg == name for a in params) and not any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) and n.lineno <= call.lineno
        for n in ast.walk(fn))


def _other_axes_of(finding) -> str | None:
    """The parameter a match of a trailing-axes norm normalizes over other constant axes (its input
    moved: `$axis` and `$axis_end`, or `$axes`, bound), where it is a parameter of the function."""
    match = finding.match
    if match is None or match.rule.kernel not in TRAILING_NORMS:
        return None
    bindings = match.bindings
    if "axes" not in bindings and "axis_end" not in bindings:
        return None
    x = bindings.get("x")
    return x.name if isinstance(x, Var) and any(p.name == x.name for p in match.method.params) else None


def _innermost(file: _File, fn: _Func, line: int) -> bool:
    """`fn` is the innermost of the file's functions holding the line (methods inside classes)."""
    return not any(other is not fn and fn.lineno <= other.lineno and (other.end_lineno or 0) <= (fn.end_lineno or 0)
                   and other.lineno <= line <= (other.end_lineno or other.lineno) for _, other in file.functions)


def _fused_beside(file: _File, node: ast.AST, fn: _Func, kernel_sites: dict[_Func, list[ast.Call]],
                  depth: int, own: str | None = None) -> str | None:
    here = file.steps(node, fn)
    for call in kernel_sites.get(fn, ()):
        if _exclusive(here, file.steps(call, fn)):
            return (f"already-fused: the fused path at line {call.lineno} "
                    f"(`{ast.unparse(call.func)}`) runs instead of this code where it can")
    if depth >= _CALLER_DEPTH:
        return None
    if depth == 0 and fn.name == own and file.class_of.get(fn) is None and not fn.name.startswith("_"):
        # a match in the body of a public module function, which other modules call too (timm's
        # `rms_norm`, which its RmsNorm calls whenever fast norm is off): a fused path beside one
        # call here is not beside those
        return None
    # a helper: look at its call sites in this file
    for cls, caller in file.functions:
        for call in file.calls(caller):
            if file.callee(call, cls) is fn:
                reason = _fused_beside(file, call, caller, kernel_sites, depth + 1)
                if reason:
                    return reason
    return None


class LazyParse:
    """`text`'s `ast` parse, made when first asked for (None where it does not parse); `made` says
    whether it was."""

    def __init__(self, text: str, path: str = "<unknown>") -> None:
        self.text = text
        self.path = path
        self.made = False
        self._tree: ast.Module | None = None

    def __call__(self) -> ast.Module | None:
        if not self.made:
            self.made = True
            try:
                self._tree = ast.parse(self.text, filename=self.path)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                self._tree = None
        return self._tree


def extract_parsed(text: str, path: str, module: str) -> tuple[FileModel, LazyParse]:
    """The file's structure and its `ast` parse, made once for both: extraction reads the parse
    that the steps after matching (the already-fused check, synthesis) share. A text that does not
    parse is extracted as `extract_source` does (its diagnostic). Base classes from the repository's
    other files are resolved where the scan made them known (engine.extract.package.using)."""
    parsed = LazyParse(text, path)
    tree = parsed()
    if tree is None:
        return extract_source(text, path, module), parsed
    return extract_tree(tree, text, path, module, package.current()), parsed


def mark_already_fused(text: str, module: str, findings: list, kernels: dict[str, str],
                       parsed: LazyParse | None = None) -> None:
    """Turn applicable findings whose site is a fallback of a fused path into `already-fused`.

    `kernels` maps a rule id to its kernel's qualified name; findings of other rules are left alone.
    `parsed`: the caller's `ast` parse of `text` (None where it does not parse), made on first use
    and shared with the other steps that need one.
    """
    todo = [f for f in findings if f.status in ("rewritten", "guarded") and kernels.get(f.rule_id)]
    # A kernel call is written with the kernel's own name somewhere in the file (the call, or the
    # import that aliases it): a file that never spells one has no fused path to find.
    todo = [f for f in todo if any(_spelled(name, text) for name in _kernel_names(kernels[f.rule_id]))]
    if not todo:
        return
    tree = (parsed or LazyParse(text))()
    if tree is None:
        return  # extraction already reported the file; nothing here to rewrite either
    file = _File(tree, module)
    for finding in todo:
        lines = sorted({p.line for p in finding.locations} or {finding.line})
        own = finding.method if finding.cls == "__module__" and not finding.related else None
        reason = already_fused_reason(tree, module, lines[:1], kernels[finding.rule_id], file, own,
                                      _other_axes_of(finding))
        if reason:
            finding.status = "already-fused"
            finding.reason = reason
