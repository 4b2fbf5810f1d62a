"""Which keys a dict passed as `**name` can hold: proven from the code that builds it, or unknown.

`torch.optim.Adam(params, lr=lr, **extra_args)` may already choose an implementation through
`extra_args`. The keys are read from the function's own code (dict literals, `dict(...)`,
`d[key] = ...`, `d.update(...)`, `d.setdefault(key, ...)`, `{**other}` and `dict(**other)`
forwarding, both arms of a conditional expression) and, where the dict is the function's own
`**kwargs` parameter, from every call of the function in the scanned package (the keywords each
call passes beyond the named parameters, and the keys of each `**d` it forwards, read the same way
in the caller, a bounded number of levels up). The answer is a superset of the keys the dict can
hold at the call (every key any path adds), or unknown with what is unknown: a dict built by a
call, passed in, passed to a function that could fill it, a key that is not a constant, a method
of a class (whose callers cannot all be found), a function called from no file of the package or
referred to other than by calling it.

The package's callers are all the callers there are only for code run from inside the package:
that is the world a scan sees (engine/extract/package.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from engine.extract.package import MAX_HOPS, PackageIndex

MAX_DEPTH = 4  # `**kwargs` forwarding levels followed up through callers
MAX_CALLS = 64  # call sites read in all
_READING_METHODS = frozenset({"get", "items", "keys", "values", "copy", "pop", "popitem", "__contains__"})
_Func = ast.FunctionDef | ast.AsyncFunctionDef


class Unknown(Exception):
    """The keys cannot be proven; the message says what is unknown."""


@dataclass
class _Search:
    package: PackageIndex | None
    trees: dict[str, ast.Module]  # file -> parse, the scanned file's own first
    calls_read: int = 0
    seen: set[tuple[str, int, str]] = field(default_factory=set)

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self.trees:
            found = self.package.source(rel) if self.package is not None else None
            if found is None:
                return None
            self.trees[rel] = found[1]
        return self.trees[rel]


def dict_keys(tree: ast.Module, rel: str, fn: _Func, name: str, package: PackageIndex | None) -> dict[str, str]:
    """Each key the dict `name` of function `fn` (in file `rel`, parsed as `tree`) may hold, with
    where it is added (`file:line`); raises Unknown where that cannot be proven."""
    search = _Search(package, {rel: tree})
    keys: dict[str, str] = {}
    _name_keys(search, rel, fn, name, 0, keys)
    return keys


def _parents(fn: _Func) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)}


def _name_keys(search: _Search, rel: str, fn: _Func, name: str, depth: int, keys: dict[str, str]) -> None:
    """The keys every binding and every change of `name` in `fn` adds, and for `fn`'s `**`
    parameter those its callers pass."""
    marker = (rel, fn.lineno, name)
    if marker in search.seen:
        return
    search.seen.add(marker)
    args = fn.args
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs] + ([args.vararg] if args.vararg else [])
    if any(a.arg == name for a in named):
        raise Unknown(f"`{name}` is a parameter of `{fn.name}`, passed in by its callers")
    parents = _parents(fn)
    bound = False
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Name) and node.id == name):
            continue
        parent = parents.get(node)
        if isinstance(node.ctx, ast.Store):
            bound = True
            if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is not None \
                    and (not isinstance(parent, ast.Assign) or parent.targets == [node]):
                _value_keys(search, rel, fn, parent.value, depth, keys)
                continue
            raise Unknown(f"`{name}` is assigned at line {node.lineno} other than by a dict")
        if isinstance(node.ctx, ast.Del):
            raise Unknown(f"`{name}` is deleted at line {node.lineno}")
        _use(search, rel, fn, node, parent, parents, depth, keys)
    is_kwargs = args.kwarg is not None and args.kwarg.arg == name
    if is_kwargs:
        _caller_keys(search, rel, fn, depth, keys)
    elif not bound:
        raise Unknown(f"`{name}` is not assigned in `{fn.name}`")


def _use(search: _Search, rel: str, fn: _Func, node: ast.Name, parent: ast.AST | None,
         parents: dict[ast.AST, ast.AST], depth: int, keys: dict[str, str]) -> None:
    """A read of the dict: one that adds keys adds them; one that could add unknown keys raises."""
    where = f"{rel}:{node.lineno}"
    if isinstance(parent, ast.keyword) and parent.arg is None:
        return  # `**name` at a call: read
    if isinstance(parent, ast.Dict) and node in parent.values and parent.keys[parent.values.index(node)] is None:
        return  # `{**name}`: copied
    if isinstance(parent, ast.Subscript) and parent.value is node:
        if isinstance(parent.ctx, ast.Load) or isinstance(parent.ctx, ast.Del):
            return
        key = parent.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            keys.setdefault(key.value, where)
            return
        raise Unknown(f"`{node.id}[{ast.unparse(key)}]` at line {node.lineno} sets a key that is not a constant")
    if isinstance(parent, ast.Attribute) and parent.value is node:
        call = parents.get(parent)
        if not (isinstance(call, ast.Call) and call.func is parent):
            raise Unknown(f"`{node.id}.{parent.attr}` at line {node.lineno} is not a call of a dict method")
        if parent.attr in _READING_METHODS:
            return
        if parent.attr == "setdefault" and call.args and isinstance(call.args[0], ast.Constant) \
                and isinstance(call.args[0].value, str):
            keys.setdefault(call.args[0].value, where)
            return
        if parent.attr == "update" and len(call.args) <= 1:
            _call_keys(search, rel, fn, call, depth, keys, where)
            return
        raise Unknown(f"`{node.id}.{parent.attr}(...)` at line {node.lineno} may add keys")
    if isinstance(parent, (ast.Compare, ast.comprehension, ast.For, ast.If, ast.JoinedStr, ast.FormattedValue,
                           ast.UnaryOp)):
        return  # compared, iterated, tested: read (`name or {}` is not: it is the dict itself)
    if isinstance(parent, ast.Call) and node in parent.args and isinstance(parent.func, ast.Name) \
            and parent.func.id in ("len", "bool", "list", "sorted", "dict", "str", "repr") and len(parent.args) == 1:
        return  # read or copied
    raise Unknown(f"`{node.id}` is used at line {node.lineno} (`{ast.unparse(parent) if parent else node.id}`), "
                  "which could add keys")


def _call_keys(search: _Search, rel: str, fn: _Func | None, call: ast.Call, depth: int, keys: dict[str, str],
               where: str) -> None:
    """The keys `dict(...)` or `d.update(...)` gives: those of its one positional dict and its keywords."""
    for arg in call.args:
        _value_keys(search, rel, fn, arg, depth, keys)
    for kw in call.keywords:
        if kw.arg is None:
            _value_keys(search, rel, fn, kw.value, depth, keys)
        else:
            keys.setdefault(kw.arg, where)


def _value_keys(search: _Search, rel: str, fn: _Func | None, value: ast.expr, depth: int,
                keys: dict[str, str]) -> None:
    """The keys of a dict expression: a literal, `dict(...)` of keywords, or a name of `fn`."""
    where = f"{rel}:{value.lineno}"
    if isinstance(value, ast.Dict):
        for key, item in zip(value.keys, value.values, strict=True):
            if key is None:
                _value_keys(search, rel, fn, item, depth, keys)
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                keys.setdefault(key.value, where)
            else:
                raise Unknown(f"the dict at line {value.lineno} has the key `{ast.unparse(key)}`, not a constant")
        return
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict" \
            and len(value.args) <= 1:
        _call_keys(search, rel, fn, value, depth, keys, where)
        return
    if isinstance(value, ast.IfExp):  # either dict, by the condition
        _value_keys(search, rel, fn, value.body, depth, keys)
        _value_keys(search, rel, fn, value.orelse, depth, keys)
        return
    if isinstance(value, ast.Name) and fn is not None:
        _name_keys(search, rel, fn, value.id, depth, keys)
        return
    raise Unknown(f"the dict `{ast.unparse(value)}` at line {value.lineno} is not built where its keys can be read")


# -- callers -------------------------------------------------------------------------------------


def _caller_keys(search: _Search, rel: str, fn: _Func, depth: int, keys: dict[str, str]) -> None:
    """The keys the calls of `fn` pass into its `**` parameter: keywords beyond its named
    parameters, and the keys of each dict they forward with `**`."""
    tree = search.tree(rel)
    if tree is None or fn not in tree.body:
        raise Unknown(f"`{fn.name}` is not a function of its module: its callers cannot all be found")
    if fn.decorator_list:
        raise Unknown(f"`{fn.name}` is decorated: what calls it with which keys is not read here")
    if depth >= MAX_DEPTH:
        raise Unknown(f"`**{fn.args.kwarg.arg if fn.args.kwarg else ''}` is forwarded through more than "
                      f"{MAX_DEPTH} functions")
    named = {a.arg for a in (*fn.args.args, *fn.args.kwonlyargs)}
    calls = _calls_of(search, rel, fn)
    if not calls:
        raise Unknown(f"no file of the package calls `{fn.name}`")
    for caller_rel, caller, call in calls:
        search.calls_read += 1
        if search.calls_read > MAX_CALLS:
            raise Unknown(f"more than {MAX_CALLS} calls pass keys to `{fn.name}`")
        for kw in call.keywords:
            if kw.arg is None:
                _value_keys(search, caller_rel, caller, kw.value, depth + 1, keys)
            elif kw.arg not in named:
                keys.setdefault(kw.arg, f"{caller_rel}:{call.lineno}")


def _calls_of(search: _Search, rel: str, fn: _Func) -> list[tuple[str, _Func | None, ast.Call]]:
    """Every call of the module function `fn` of file `rel` in the package: by its name in its own
    file, and through imports of it (or of its module) in other files, re-exports followed. Raises
    Unknown where the function is named other than as the callee of a call."""
    tree = search.tree(rel)
    assert tree is not None
    if _binds(tree, fn.name) != 1:
        raise Unknown(f"`{fn.name}` is bound more than once in its module")
    # the names standing for the function in each file: (file, name) and (file, module alias)
    direct: dict[str, set[str]] = {rel: {fn.name}}
    through: dict[str, set[str]] = {}
    targets = {(rel, fn.name)}
    files = sorted(search.package.files) if search.package is not None else [rel]
    mentioning = {rel}  # the files whose text names the function (or a name standing for it)
    changed, rounds = True, 0
    while changed:
        changed, rounds = False, rounds + 1
        if rounds > MAX_HOPS:
            raise Unknown(f"`{fn.name}` is re-exported through more than {MAX_HOPS} modules")
        words = {name for _, name in targets}
        for other in files:
            if other == rel or search.package is None or not search.package.mentions(other, words):
                continue
            found = search.package.source(other)
            if found is None:
                continue
            mentioning.add(other)
            for stmt in ast.walk(found[1]):
                if not isinstance(stmt, (ast.Import, ast.ImportFrom)):
                    continue
                for alias in stmt.names:
                    changed |= _import_binds(search.package, other, stmt, alias, targets, direct, through)
    calls: list[tuple[str, _Func | None, ast.Call]] = []
    attributes = {name for _, name in targets}
    for other in sorted(mentioning):
        other_tree = search.tree(other)
        if other_tree is None:
            continue
        calls.extend(_named_calls(other, other_tree, direct.get(other, set()), through.get(other, set()), attributes))
    return calls


def _import_binds(package: PackageIndex | None, rel: str, stmt: ast.Import | ast.ImportFrom, alias: ast.alias,
                  targets: set[tuple[str, str]], direct: dict[str, set[str]], through: dict[str, set[str]]) -> bool:
    """Record what the import binds in file `rel` where it stands for a target; whether it is new."""
    if package is None:
        return False
    if isinstance(stmt, ast.ImportFrom):
        source = package.module_file(rel, stmt.level, stmt.module or "")
        if alias.name == "*" and source is not None and any(source == t for t, _ in targets):
            raise Unknown(f"{rel} imports everything from the module of the function (`import *`)")
        if source is not None and (source, alias.name) in targets:
            bound = alias.asname or alias.name
            if (rel, bound) in targets:
                return False
            targets.add((rel, bound))
            direct.setdefault(rel, set()).add(bound)
            return True
        prefix = [stmt.module] if stmt.module else []
        module = package.module_file(rel, stmt.level, ".".join([*prefix, alias.name]))
        names = {name for t, name in targets if t == module}
        if module is not None and names:
            bound = alias.asname or alias.name
            new = {f"{bound}.{name}" for name in names} - through.get(rel, set())
            through.setdefault(rel, set()).update(new)
            return bool(new)
        return False
    module = package.module_file(rel, 0, alias.name)
    names = {name for t, name in targets if t == module}
    if module is None or not names:
        return False
    bound = alias.asname or alias.name
    new = {f"{bound}.{name}" for name in names} - through.get(rel, set())
    through.setdefault(rel, set()).update(new)
    return bool(new)


def _binds(tree: ast.Module, name: str) -> int:
    """How many statements of the module's top level bind `name` (definitions, imports, assignments)."""
    count = 0
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            count += 1
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            count += sum((a.asname or a.name.partition(".")[0]) == name for a in stmt.names)
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            count += sum(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
                         for n in ast.walk(stmt))
    return count


def _named_calls(rel: str, tree: ast.Module, names: set[str], dotted: set[str], attributes: set[str]
                 ) -> list[tuple[str, _Func | None, ast.Call]]:
    """The calls in `tree` whose callee is one of `names` (a plain name) or `dotted` (`module.name`),
    each with the function holding it; a mention that is not a callee raises Unknown, and so does
    any other attribute named as the function (`attributes`): `pkg.utils.f(...)` through a module
    imported another way may call it too."""
    found: list[tuple[str, _Func | None, ast.Call]] = []

    def visit(node: ast.AST, holder: _Func | None, parent: ast.AST | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            holder = node
        mention = (isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load)) or (
            isinstance(node, ast.Attribute) and ast.unparse(node) in dotted)
        if mention:
            if isinstance(parent, ast.Call) and parent.func is node:
                found.append((rel, holder, parent))
            else:
                raise Unknown(f"`{ast.unparse(node)}` at {rel}:{node.lineno} is referred to other than by calling it")
            return
        if isinstance(node, ast.Attribute) and node.attr in attributes:
            raise Unknown(f"`{ast.unparse(node)}` at {rel}:{node.lineno} may be the function, reached another way")
        for child in ast.iter_child_nodes(node):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            visit(child, holder, node)

    visit(tree, None, None)
    return found
