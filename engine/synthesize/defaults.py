"""A guard that holds in the model's default configuration: the kernel would never run.

A guarded rewrite keeps the original code under `if <guard>:`. When the guard reads the module's
own settings (`self.window_size is not None`) and those hold by default, every model built with
the defaults takes the original path, and the pull request would add a branch that never runs
(VITS: `window_size` is 4 unless configured otherwise). Such a finding is reported, not rewritten.

A setting's default is read from the class's `__init__`: `self.name = <constant>`, a parameter's
constant default, or `config.<field>` where `config` is annotated with a configuration class whose
own `__init__` gives the field a constant default (the class found through the file's imports, in
the same folder or package). Assignments under an `if` are not defaults; anything else is
unknown, and a guard is decided only when it holds whatever the unknown terms are.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

from engine.extract.imports import name_chain

_UNKNOWN = object()


def _class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)


def _param_defaults(func: ast.FunctionDef) -> dict[str, object]:
    """Parameter -> its constant default (`_UNKNOWN` for one without)."""
    args = func.args
    positional = args.posonlyargs + args.args
    defaults: dict[str, object] = {a.arg: _UNKNOWN for a in [*positional, *args.kwonlyargs]}
    for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True):
        defaults[arg.arg] = _constant(default)
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        if default is not None:
            defaults[arg.arg] = _constant(default)
    return defaults


def _constant(node: ast.expr) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _config_defaults(path: Path, tree: ast.Module, annotation: ast.expr | None,
                     read: Callable[[Path], str | None] | None) -> dict[str, object]:
    """The constant defaults of the configuration class `annotation` names, found through the
    file's relative or same-folder imports (a file of the scanned repository, read by `read`)."""
    if not isinstance(annotation, ast.Name):
        return {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and any((a.asname or a.name) == annotation.id for a in stmt.names):
            name = next(a.name for a in stmt.names if (a.asname or a.name) == annotation.id)
            if not stmt.module or stmt.level > 1:
                return {}
            target = path.parent / (stmt.module.rpartition(".")[2] + ".py") if stmt.level == 1 else None
            source = read(target) if target is not None and read is not None else None
            if source is None:
                return {}
            try:
                config_tree = ast.parse(source)
            except (SyntaxError, ValueError, MemoryError, RecursionError):
                return {}
            cls = _class(config_tree, name)
            init = _init(cls) if cls is not None else None
            return _param_defaults(init) if init is not None else {}
    return {}


def settings(path: Path, text: str, class_name: str,
             read: Callable[[Path], str | None] | None = None,
             passed: dict[str, object] | None = None) -> dict[str, object]:
    """`self.<name>` -> its value under the defaults, for the settings `__init__` fixes. `read`
    gives the text of another file of the repository (a path as `path` is named), None where it
    is not one or cannot be read: without it no configuration class of another file is read.
    `passed`: the arguments of one construction of the class (`constructions`), which replace
    their parameters' defaults."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return {}
    cls = _class(tree, class_name)
    init = _init(cls) if cls is not None else None
    if init is None:
        return {}
    params = {**_param_defaults(init), **(passed or {})}
    annotations = {a.arg: a.annotation for a in init.args.args}
    if "config" in annotations and annotations["config"] is None:
        # an unannotated `config`: the one configuration class the file imports (transformers'
        # `from .configuration_vits import VitsConfig`)
        imported = [a.asname or a.name for stmt in tree.body if isinstance(stmt, ast.ImportFrom) and stmt.level == 1
                    and (stmt.module or "").startswith("configuration_") for a in stmt.names]
        if len(imported) == 1:
            annotations["config"] = ast.Name(imported[0])
    configs: dict[str, dict[str, object]] = {}
    out: dict[str, object] = {}
    for stmt in init.body:  # straight-line statements only: an assignment under an `if` is no default
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        target = stmt.targets[0]
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"):
            continue
        value = stmt.value
        if isinstance(value, ast.Name) and value.id in params:
            out[target.attr] = params[value.id]
        elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id in annotations:
            owner = value.value.id
            if owner not in configs:
                configs[owner] = _config_defaults(path, tree, annotations[owner], read)
            out[target.attr] = configs[owner].get(value.attr, _UNKNOWN)
        else:
            out[target.attr] = _constant(value)
    return {k: v for k, v in out.items() if v is not _UNKNOWN}


def _value(node: ast.expr, known: dict[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return known.get(node.attr, _UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _value(node.operand, known)
        return _UNKNOWN if inner is _UNKNOWN else not inner
    if isinstance(node, ast.BoolOp):
        values = [_value(v, known) for v in node.values]
        if isinstance(node.op, ast.Or):
            if any(v is not _UNKNOWN and v for v in values):
                return True
            return False if all(v is not _UNKNOWN for v in values) else _UNKNOWN
        if any(v is not _UNKNOWN and not v for v in values):
            return False
        return True if all(v is not _UNKNOWN for v in values) else _UNKNOWN
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = _value(node.left, known), _value(node.comparators[0], known)
        if left is _UNKNOWN or right is _UNKNOWN:
            return _UNKNOWN
        op = node.ops[0]
        if isinstance(op, ast.Is):
            return left is right
        if isinstance(op, ast.IsNot):
            return left is not right
        if isinstance(op, ast.Eq):
            return left == right
        if isinstance(op, ast.NotEq):
            return left != right
    return _UNKNOWN


def holds_by_default(guard: str, known: dict[str, object]) -> bool:
    """Whether `guard` holds under the default settings `known`, whatever its other terms are."""
    try:
        tree = ast.parse(guard, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    value = _value(tree.body, known)
    return value is not _UNKNOWN and bool(value)


def default_terms(guard: str, known: dict[str, object]) -> str:
    """The settings the guard reads, with their defaults (`window_size=4`), for the report."""
    try:
        tree = ast.parse(guard, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    names = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                    and n.value.id == "self" and n.attr in known})
    return ", ".join(f"{name}={known[name]!r}" for name in names)


MAX_FORWARDS = 3  # constructors followed back through their own parameters (`keep_attn=keep_attn`)


def constructions(package, rel: str, class_name: str, depth: int = 0) -> list[dict[str, object]]:
    """The arguments of each construction of the class `class_name` of the file `rel` that the
    files of the repository `package` (engine/extract/package.py) hold: `__init__`'s parameter ->
    the constant passed, `_UNKNOWN` where it is not a constant. An argument that is a parameter of
    the constructing class's own `__init__` (`keep_attn=keep_attn`) is the value that parameter has
    by default and in each construction of that class, where they all agree. A construction
    spreading `*args` or `**kwargs` passes every parameter an unknown value."""
    found = package.source(rel) if package is not None else None
    cls = _class(found[1], class_name) if found is not None else None
    init = _init(cls) if cls is not None else None
    if init is None:
        return []
    names = [a.arg for a in init.args.posonlyargs + init.args.args][1:]  # after `self`
    everything = [*names, *(a.arg for a in init.args.kwonlyargs)]
    out: list[dict[str, object]] = []
    for other in sorted(package.files):
        if not package.mentions(other, [class_name]) or (source := package.source(other)) is None:
            continue
        for call, owner in _calls(source[1]):
            if not _constructs(package, other, source[1], call.func, rel, class_name):
                continue
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                out.append(dict.fromkeys(everything, _UNKNOWN))
                continue
            given = [*zip(names, call.args, strict=False), *((k.arg, k.value) for k in call.keywords)]
            out.append({name: _argument(value, package, other, owner, depth) for name, value in given})
    return out


def _constructs(package, other: str, tree: ast.Module, func: ast.expr, rel: str, class_name: str) -> bool:
    """Whether `func`, called in the file `other` (parsed as `tree`), may be the class: it resolves
    to it, or it is a name of that spelling that does not resolve but is imported from the
    repository (a relative import, or one from its top package: a module the scan did not read)."""
    where = package.lookup(other, func.id, 0) if isinstance(func, ast.Name) else package.resolve(other, tree, func)
    if where is not None or (chain := name_chain(func)) is None or chain[-1] != class_name:
        return where == (rel, class_name)
    binding = package.binding(tree, chain[0])
    if isinstance(binding, ast.ImportFrom):
        return binding.level > 0 or (binding.module or "").partition(".")[0] == rel.partition("/")[0]
    return isinstance(binding, ast.Import) and len(chain) > 1 and chain[0] == rel.partition("/")[0]


def _calls(tree: ast.Module):
    """Each call of the module, with the top-level class whose `__init__` makes it (else None)."""
    for node in tree.body:
        init = _init(node) if isinstance(node, ast.ClassDef) else None
        inside = {id(n) for n in ast.walk(init)} if init is not None else set()
        for n in ast.walk(node):
            if isinstance(n, ast.Call):
                yield n, node if id(n) in inside else None


def _argument(value: ast.expr, package, rel: str, owner: ast.ClassDef | None, depth: int) -> object:
    """The value a construction passes: a constant, or a parameter of `owner`'s `__init__` (the
    class that constructs) never assigned there, whose values by default and in `owner`'s own
    constructions agree."""
    constant = _constant(value)
    if constant is not _UNKNOWN or owner is None or not isinstance(value, ast.Name) or depth >= MAX_FORWARDS:
        return constant
    init = _init(owner)
    params = _param_defaults(init)
    if value.id not in params or value.id == "self" or any(
            isinstance(n, ast.Name) and n.id == value.id and not isinstance(n.ctx, ast.Load)
            or isinstance(n, ast.arg) and n.arg == value.id and n not in init.args.posonlyargs + init.args.args + init.args.kwonlyargs
            for n in ast.walk(init)):
        return _UNKNOWN  # not the parameter, or rebound in `__init__` (or by a function inside it)
    values = [params[value.id], *(c.get(value.id, params[value.id])
                                  for c in constructions(package, rel, owner.name, depth + 1))]
    first = values[0]
    if first is _UNKNOWN or any(v is _UNKNOWN or type(v) is not type(first) or v != first for v in values):
        return _UNKNOWN
    return first
