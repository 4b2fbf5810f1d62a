"""Which values are Python numbers: facts about factors that are not tensors.

A factor multiplying attention scores can be folded into the query (`(q * s) @ k^T == (q @ k^T) * s`)
when it is constant along the key axis: a Python number is, and so is None in the sense that matters
(`scores * None` and `q * None` both raise). A function parameter is a number where the code says
so, never by its name or its default alone:

  * the function passes it as `scale=` to a fused attention kernel (`F.scaled_dot_product_attention`,
    `flex_attention`), whose `scale` is declared `float | None`: the parameter is that kernel's scale,
    by the function's own contract (as an annotation `float` would say);
  * the function is private to its file (`_name`, not a dunder, and no other file of the repository
    names it) and every use of its name in the file is a plain call (`_helper(...)` of a module
    function, `self._helper(...)` of a method of its own class) that passes a number or None for
    the parameter, or leaves it to a default that is one.

Reading call sites needs the file's source, which the extracted structure does not carry: the scan
makes it known for the duration of matching (`source`), and without it these facts are absent.
"""

from __future__ import annotations

import ast
import itertools
import operator
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache

from engine.extract.imports import Imports

# fused kernels whose `scale` keyword is declared `Optional[float]`
SCALE_FLOAT_KERNELS = frozenset({
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.attention.flex_attention.flex_attention",
})

# `math.<name>` that is a number, or a call that returns one whatever its (valid) argument: not
# `floor`/`ceil`/`prod` (a tensor's `__floor__`, `*` of tensors return tensors)
_MATH_NUMBER = re.compile(r"math\.(sqrt|log|log2|log10|exp|pow|isqrt|pi|e|inf|tau)(\(.*\))?")
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)

_SOURCE: ContextVar[tuple[str, str, Callable[[], ast.Module | None] | None] | None] = ContextVar(
    "adopter_source", default=None)


@contextmanager
def source(path: str, text: str, parsed: Callable[[], ast.Module | None] | None = None) -> Iterator[None]:
    """Make the source text of the file at `path` known to the facts while matching it. `parsed`:
    the caller's parse of `text` (made on first call, None where it does not parse), so that the
    facts read the same tree instead of parsing the file again."""
    token = _SOURCE.set((path, text, parsed))
    try:
        yield
    finally:
        _SOURCE.reset(token)


def tree_of(path: str) -> ast.Module | None:
    """The parsed source of `path` where the scan made it known, else None."""
    known = _SOURCE.get()
    if known is None or known[0] != path:
        return None
    return known[2]() if known[2] is not None else _parse(known[1])


def text_of(path: str) -> str | None:
    """The source text of `path` where the scan made it known, else None."""
    known = _SOURCE.get()
    return known[1] if known is not None and known[0] == path else None


@lru_cache(maxsize=8)
def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def math_number_text(text: str) -> bool:
    """`math.sqrt(d)`, `math.pi`: the math module's value is a number (or the call raises)."""
    return _MATH_NUMBER.fullmatch(text.replace(" ", "")) is not None


def ast_number(e: ast.expr, none_ok: bool = False) -> bool:
    """The expression is provably a Python number (None too where `none_ok`): literals, arithmetic of
    such (an operand that is None raises, so the result is never None), `math.sqrt(...)` and kin."""
    if isinstance(e, ast.Constant):
        return (isinstance(e.value, (int, float, complex)) and not isinstance(e.value, str)) \
            or (none_ok and e.value is None)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        return ast_number(e.operand, True)
    if isinstance(e, ast.BinOp) and isinstance(e.op, _ARITHMETIC):
        return ast_number(e.left, True) and ast_number(e.right, True)
    if isinstance(e, ast.Call | ast.Attribute):
        return math_number_text(ast.unparse(e))
    return False


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _function(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    """The one definition of `name`: a module-level function (`cls` "__module__") or a method of the
    module-level class `cls`; None where there is not exactly one."""
    if cls == "__module__":
        body = tree.body
    else:
        classes = [s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == cls]
        if len(classes) != 1:
            return None
        body = classes[0].body
    defs = [s for s in body if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == name]
    return defs[0] if len(defs) == 1 and isinstance(defs[0], ast.FunctionDef) else None


def call_site_values(tree: ast.Module, cls: str, name: str, param: str) -> list[ast.expr] | None:
    """What every call of the private function `name` (of class `cls`, or of the module) in the file
    passes for `param` (its default where a call leaves it out). None where the function is not
    private, is decorated, is never called, or its name is used otherwise than in such calls (passed
    as a value, called on another object, called with `*args`/`**kwargs`), or in another file of the
    repository (`call_sites`)."""
    sites = call_sites(tree, cls, name, param)
    return None if sites is None else [value for value, _ in sites]


def call_sites(tree: ast.Module, cls: str, name: str, param: str,
               public: bool = False) -> list[tuple[ast.expr, str | None]] | None:
    """Each call of the function `name` (of class `cls`, or of the module) in the file, as what it
    passes for `param` (its default where the call leaves it out) and the module-level class whose
    method makes the call (None outside one). These are all the calls there are only where the
    function is private (`_name`, not a dunder), undecorated, its name used in the file in plain
    calls alone and in no other file of the repository the scan knows (engine/extract/package.py:
    a private helper imported elsewhere has callers there); None otherwise. `public`: the calls of
    a function with a public name in the file all the same (the callers the package shows; code
    outside it may call the function with anything), where its name is otherwise used as above."""
    if not _private(name) and not public:
        return None
    fn = _function(tree, cls, name)
    if fn is None or fn.decorator_list:
        return None
    positional = [*fn.args.posonlyargs, *fn.args.args]
    if cls != "__module__":
        positional = positional[1:]  # self
    names = [a.arg for a in positional]
    defaults = dict(zip(names[len(names) - len(fn.args.defaults):], fn.args.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True) if d is not None})
    index = names.index(param) if param in names else None
    if index is None and param not in {a.arg for a in fn.args.kwonlyargs}:
        return None
    owner = next((s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == cls), None)
    calls: list[ast.Call] = []
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if isinstance(child, ast.Name) and child.id == name:
                if cls != "__module__" or not (isinstance(parent, ast.Call) and parent.func is child):
                    return None
                calls.append(parent)
            elif isinstance(child, ast.Attribute) and child.attr == name:
                if cls == "__module__" or not (isinstance(parent, ast.Call) and parent.func is child
                                               and isinstance(child.value, ast.Name) and child.value.id == "self"):
                    return None
                calls.append(parent)
    if cls != "__module__":
        inside = {id(n) for n in ast.walk(owner)} if owner is not None else set()
        if any(id(c) not in inside for c in calls):
            return None  # `self._helper(...)` in another class: another object's method
    if not calls or (not public and _used_elsewhere(name)):
        return None
    classes = _method_calls(tree)
    values: list[tuple[ast.expr, str | None]] = []
    for call in calls:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return None
        given = next((k.value for k in call.keywords if k.arg == param), None)
        if given is None and index is not None and index < len(call.args):
            given = call.args[index]
        if given is None:
            given = defaults.get(param)
        if given is None:
            continue  # the call raises (a required argument missing): it computes nothing
        values.append((given, classes.get(id(call))))
    return values


def _method_calls(tree: ast.Module) -> dict[int, str]:
    """id of each call made in a method (first parameter `self`, never rebound) of a module-level
    class -> the class's name; a call in a class nested inside one is its own class's business."""
    found: dict[int, str] = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or not fn.args.args or fn.args.args[0].arg != "self" \
                    or fn.decorator_list or any(isinstance(n, ast.Name) and n.id == "self"
                                                and not isinstance(n.ctx, ast.Load) for n in ast.walk(fn)):
                continue  # `self` is not the instance throughout
            todo: list[ast.AST] = list(fn.body)
            while todo:
                node = todo.pop()
                if isinstance(node, ast.ClassDef) or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) \
                        and "self" in {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}:
                    continue  # another `self`
                if isinstance(node, ast.Call):
                    found[id(node)] = cls.name
                todo.extend(ast.iter_child_nodes(node))
    return found


def _used_elsewhere(name: str) -> bool:
    """Whether a file of the repository other than the one being matched may use `name` (engine/
    extract/package.py `mentions`); without a known repository, the file is all there is."""
    from engine.extract import package

    index, known = package.current(), _SOURCE.get()
    return index is not None and known is not None and index.mentioned_elsewhere(name, besides=known[0])


# ---------------------------------------------------------------------------------------------
# Single-element values of `__init__`: a learned scalar built from a constructor argument
# (vit-pytorch's LSA: `nn.Parameter(torch.log(torch.tensor(dim_head ** -0.5)))`) is folded into q
# only where that argument provably holds one element. Its default (`dim_head = 64`) is no proof: a
# caller may pass anything. What is: `__init__` completed, so every size it handed `nn.Linear` on
# its straight-line path was accepted, and a size is accepted only as an integer scalar (a Python
# or NumPy integer) or a one-element integer tensor (of any rank). An arithmetic result of one
# element has operands of one element each (broadcasting never shrinks a dimension but to 0, and a
# size of no element is no size); a list or string operand makes no size at all. So each name that
# such a size is built from, assigned once, holds one element, and so does every arithmetic of
# those names, `torch.tensor` of it, and elementwise math of that.

_SIZE_LAYERS = {"torch.nn.Linear": ("in_features", "out_features")}
_ELEMENTWISE = {"torch.log", "torch.exp", "torch.sqrt", "torch.abs", "torch.neg"}
_TENSOR_OF = {"torch.tensor", "torch.as_tensor"}


def _class(tree: ast.Module, cls: str) -> ast.ClassDef | None:
    found = [s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == cls]
    return found[0] if len(found) == 1 else None


def _single_names(tree: ast.Module, cls: str) -> tuple[frozenset[str], Imports] | None:
    klass = _class(tree, cls)
    init = _function(tree, cls, "__init__") if klass is not None else None
    if init is None:
        return None
    imports = Imports(tree, "")
    # names bound exactly once in __init__ (a parameter counts as one binding)
    bound: dict[str, list[ast.expr | None]] = {a.arg: [None] for a in [*init.args.posonlyargs, *init.args.args,
                                                                       *init.args.kwonlyargs]}
    for node in ast.walk(init):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.comprehension)):
            targets = [node.target]
        elif isinstance(node, ast.NamedExpr):
            targets = [node.target]
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    value = node.value if isinstance(node, ast.Assign) and target is name else None
                    bound.setdefault(name.id, []).append(value)
    once = {name: values[0] for name, values in bound.items() if len(values) == 1}
    single: set[str] = set()

    def mark(e: ast.expr) -> None:
        if isinstance(e, ast.Name) and e.id in once and e.id not in single:
            single.add(e.id)
            if once[e.id] is not None:
                mark(once[e.id])  # type: ignore[arg-type]
        elif isinstance(e, ast.BinOp) and isinstance(e.op, _ARITHMETIC):
            mark(e.left)
            mark(e.right)
        elif isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            mark(e.operand)

    for stmt in init.body:  # the straight-line path only: a size under a branch may never be handed over
        if isinstance(stmt, (ast.If, ast.For, ast.While, ast.Try, ast.With, ast.FunctionDef, ast.ClassDef)):
            continue
        for call in _always_run(stmt):
            if not isinstance(call, ast.Call):
                continue
            sizes = _SIZE_LAYERS.get(imports.qualify(call.func) or "")
            if sizes is None or any(isinstance(a, ast.Starred) for a in call.args):
                continue
            for arg in call.args[:len(sizes)]:
                mark(arg)
            for keyword in call.keywords:
                if keyword.arg in sizes:
                    mark(keyword.value)
    return frozenset(single), imports


_MAYBE_RUN = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.IfExp, ast.BoolOp)


def _always_run(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a statement evaluated whenever it runs: not inside a lambda, a comprehension, a
    conditional expression or a short-circuit `and`/`or`."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, _MAYBE_RUN):
            yield from _always_run(child)


def _single_value(e: ast.expr, names: frozenset[str]) -> bool:
    """A number, or a value of one element (`names` hold one each), under arithmetic."""
    if isinstance(e, ast.Name):
        return e.id in names
    if isinstance(e, ast.BinOp) and isinstance(e.op, _ARITHMETIC):
        return _single_value(e.left, names) and _single_value(e.right, names)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        return _single_value(e.operand, names)
    return ast_number(e)


def constructor_single_element(tree: ast.Module, cls: str, text: str) -> bool:
    """The value `text` builds in `cls.__init__` (a parameter's initial value) holds one element:
    `torch.tensor` of a single-element value, under elementwise math."""
    found = _single_names(tree, cls)
    if found is None:
        return False
    names, imports = found
    try:
        e = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    while isinstance(e, ast.Call) and imports.qualify(e.func) in _ELEMENTWISE and len(e.args) == 1 and not e.keywords:
        e = e.args[0]
    if not (isinstance(e, ast.Call) and imports.qualify(e.func) in _TENSOR_OF and len(e.args) == 1):
        return False
    if any(k.arg not in ("dtype", "device", "requires_grad") for k in e.keywords):
        return False
    return _single_value(e.args[0], names)


# ---------------------------------------------------------------------------------------------
# Integer attributes: `self.dim`, set once in `__init__` from integer arithmetic of constants and
# parameters (`dim if dim >= 0 else total_dim + dim`), holds an integer where each parameter's
# default and what every construction of the class in the file passes for it are integer literals
# (every combination of those values is evaluated). A construction is a call of the class, or of a
# `functools.partial` of it bound to a module-level name (`ChanLayerNorm = partial(LayerNorm,
# dim=-3)`), whose own calls may pass the parameter again. Any other use of those names (a subclass,
# the class passed as a value, `*args` / `**kwargs` at a call) leaves the value unproven.


def _int_literal(e: ast.expr | None) -> int | None:
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        inner = _int_literal(e.operand)
        return None if inner is None else (-inner if isinstance(e.op, ast.USub) else inner)
    if isinstance(e, ast.Constant) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    return None


def _given(call: ast.Call, param: str, index: int | None) -> tuple[bool, ast.expr | None]:
    """(whether the call can be read, what it passes for `param`: None where it leaves it out)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return False, None
    given = next((k.value for k in call.keywords if k.arg == param), None)
    if given is None and index is not None and index < len(call.args):
        given = call.args[index]
    return True, given


def attribute_int_values(tree: ast.Module, cls: str, attr: str) -> frozenset[int] | None:
    """The integers `self.<attr>` of class `cls` can hold, where it provably holds an integer
    (see above); None where that is not proven."""
    klass = _class(tree, cls)
    init = _function(tree, cls, "__init__") if klass is not None else None
    if init is None or klass is None:
        return None
    sets: list[tuple[ast.AST, ast.expr | None]] = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and t.attr == attr:
                    if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                        return None  # `obj.dim = ...`: set from outside
                    sets.append((node, node.value if isinstance(node, ast.Assign) and target is t else None))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and name.value != attr):
                return None  # `setattr(obj, "dim", ...)`, or of a name not written out
    inside = {id(n) for n in ast.walk(klass)}
    own = [(node, value) for node, value in sets if id(node) in inside]
    if len(own) != 1 or own[0][0] not in init.body:
        return None  # set more than once, or not on `__init__`'s straight-line path
    value = own[0][1]
    if value is None:
        return None
    positional = [a.arg for a in [*init.args.posonlyargs, *init.args.args]][1:]
    defaults = dict(zip(positional[len(positional) - len(init.args.defaults):], init.args.defaults, strict=True))
    defaults.update({a.arg: d for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True)
                     if d is not None})
    params: dict[str, frozenset[int]] = {}  # the parameters the value reads, and the integers each can be
    for name in sorted({n.id for n in ast.walk(value) if isinstance(n, ast.Name)}):
        if name not in positional and name not in {a.arg for a in init.args.kwonlyargs}:
            return None
        if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
               for n in ast.walk(init)):
            return None  # the parameter is rebound before or after
        index = positional.index(name) if name in positional else None
        found = _construction_values(tree, cls, name, index, defaults.get(name))
        if found is None:
            return None
        params[name] = found
    names = list(params)
    combinations = list(itertools.islice(itertools.product(*(sorted(params[n]) for n in names)),
                                         _COMBINATIONS + 1))
    if len(combinations) > _COMBINATIONS:
        return None
    values = {_int_value(value, dict(zip(names, c, strict=True))) for c in combinations}
    return None if None in values else frozenset(values)  # type: ignore[arg-type]


_COMBINATIONS = 64  # at most this many combinations of the parameters' values are evaluated
_INT_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_COMPARISONS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
                ast.Eq: operator.eq, ast.NotEq: operator.ne}


def _int_value(e: ast.expr, env: dict[str, int]) -> int | None:
    """What integer arithmetic of parameters (`dim if dim >= 0 else total_dim + dim`: `+`, `-`, `*`,
    comparisons, conditional expressions) gives for the parameters' values `env`; None for
    anything else, or a value that is no integer."""
    if isinstance(e, ast.Name):
        return env.get(e.id)
    if isinstance(e, ast.Constant):
        return _int_literal(e)
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        inner = _int_value(e.operand, env)
        return None if inner is None else (-inner if isinstance(e.op, ast.USub) else inner)
    if isinstance(e, ast.BinOp) and type(e.op) in _INT_OPS:
        left, right = _int_value(e.left, env), _int_value(e.right, env)
        return None if left is None or right is None else _INT_OPS[type(e.op)](left, right)
    if isinstance(e, ast.IfExp) and isinstance(e.test, ast.Compare) and len(e.test.ops) == 1 \
            and type(e.test.ops[0]) in _COMPARISONS:
        left, right = _int_value(e.test.left, env), _int_value(e.test.comparators[0], env)
        if left is None or right is None:
            return None
        return _int_value(e.body if _COMPARISONS[type(e.test.ops[0])](left, right) else e.orelse, env)
    return None


def _assigned_on_every_path(body: list[ast.stmt], attr: str, values: list[ast.expr]) -> bool:
    """Whether running `body` always assigns `self.<attr>`: a plain assignment among its statements,
    or an `if` both of whose branches always do. The values of those assignments go to `values`."""
    always = False
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _is_attribute(stmt.targets[0], "self", attr):
            values.append(stmt.value)
            always = True
        elif isinstance(stmt, ast.If):
            taken = _assigned_on_every_path(stmt.body, attr, values)
            always = _assigned_on_every_path(stmt.orelse, attr, values) and taken or always
    return always


def attribute_values(tree: ast.Module, cls: str, attr: str) -> list[ast.expr] | None:
    """The expressions `self.<attr>` of class `cls` is assigned from, where it holds one of them
    whenever a method reads it: `__init__` assigns it on every path through its `if`s (`if half:
    self.fill = -65000` `else: self.fill = -float("inf")`; a conditional expression gives both its
    arms), and nothing else in the file writes an attribute of that name (another method, a
    subclass, code outside the class, `setattr`, an augmented assignment; an unrelated class may set
    its own). None otherwise."""
    init = _function(tree, cls, "__init__") if _class(tree, cls) is not None else None
    if init is None:
        return None
    values: list[ast.expr] = []
    if not _assigned_on_every_path(init.body, attr, values):
        return None
    # another class's own `self.<attr>` is its business, unless it derives from `cls`
    elsewhere = {id(n) for c in tree.body if isinstance(c, ast.ClassDef) and c.name != cls
                 and not any(ast.unparse(b).rpartition(".")[2] == cls for b in c.bases) for n in ast.walk(c)}
    writes = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == attr and not isinstance(node.ctx, ast.Load):
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                return None  # `obj.fill = ...`: set from outside
            writes += id(node) not in elsewhere
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and name.value != attr):
                return None  # `setattr(obj, "fill", ...)`, or of a name not written out
    if writes != len(values):
        return None  # written somewhere else too
    arms: list[ast.expr] = []
    while values:
        value = values.pop()
        if isinstance(value, ast.IfExp):
            values.extend((value.body, value.orelse))
        else:
            arms.append(value)
    return arms


def attribute_is_setting(tree: ast.Module, cls: str, attr: str) -> bool:
    """Whether `self.<attr>` of class `cls` is a setting of the module: `__init__` assigns it on every
    path (`attribute_values`) an integer literal or one of its own parameters,
    never rebound, and nothing else writes it. Its value is then fixed when the module is built, so
    a test of it (`self.dim != 2`) decides once for every call which code runs."""
    init = _function(tree, cls, "__init__") if _class(tree, cls) is not None else None
    arms = attribute_values(tree, cls, attr) if init is not None else None
    if init is None or not arms:
        return False
    params = {a.arg for a in [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs]} - {"self"}
    rebound = {n.id for n in ast.walk(init) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return all(_int_literal(arm) is not None or isinstance(arm, ast.Name) and arm.id in params - rebound
               for arm in arms)


def attribute_parameter(tree: ast.Module, cls: str, attr: str) -> str | None:
    """The parameter of `__init__` of class `cls` that `self.<attr>` holds, where `__init__` assigns
    it from that parameter alone, never rebound, and nothing else writes it (`attribute_values`):
    what the code constructing the module passes. None otherwise."""
    init = _function(tree, cls, "__init__") if _class(tree, cls) is not None else None
    arms = attribute_values(tree, cls, attr) if init is not None else None
    if init is None or not arms or len(arms) != 1 or not isinstance(arms[0], ast.Name):
        return None
    params = {a.arg for a in [*init.args.posonlyargs, *init.args.args, *init.args.kwonlyargs]} - {"self"}
    rebound = {n.id for n in ast.walk(init) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return arms[0].id if arms[0].id in params - rebound else None


def _construction_values(tree: ast.Module, cls: str, param: str, index: int | None,
                         default: ast.expr | None) -> frozenset[int] | None:
    imports = Imports(tree, "")
    # names that construct the class: the class itself (default as declared), and module-level
    # partials of it (their own keyword for the parameter as the default)
    makers: dict[str, tuple[int | None, ast.expr | None]] = {cls: (index, default)}
    partials: set[int] = set()
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and isinstance(stmt.value, ast.Call) and imports.qualify(stmt.value.func) == "functools.partial" \
                and stmt.value.args and isinstance(stmt.value.args[0], ast.Name) and stmt.value.args[0].id == cls:
            call = stmt.value
            if len(call.args) > 1 or any(k.arg is None for k in call.keywords):
                return None
            bound = next((k.value for k in call.keywords if k.arg == param), default)
            makers[stmt.targets[0].id] = (index, bound)
            partials.add(id(call.args[0]))
    values: set[int] = set()
    for _, fallback in makers.values():  # what a construction that leaves the parameter out gives
        if fallback is not None:
            number = _int_literal(fallback)
            if number is None:
                return None
            values.add(number)
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if not (isinstance(child, ast.Name) and child.id in makers) or id(child) in partials:
                continue
            if isinstance(child.ctx, ast.Store) and child.id != cls:
                continue  # the partial's own binding
            if not (isinstance(parent, ast.Call) and parent.func is child):
                return None  # a subclass, or the class passed as a value: constructed out of sight
            readable, given = _given(parent, param, makers[child.id][0])
            if not readable:
                return None
            if given is not None:
                number = _int_literal(given)
                if number is None:
                    return None
                values.add(number)
            elif makers[child.id][1] is None:
                continue  # a required argument missing: the call raises
    return frozenset(values) if values else None


_FUNCTION_ATTRIBUTE = re.compile(r"([A-Za-z_]\w*)\.([A-Za-z_]\w*)")


def _is_attribute(e: ast.expr, name: str, attr: str) -> bool:
    return isinstance(e, ast.Attribute) and e.attr == attr and isinstance(e.value, ast.Name) and e.value.id == name


def function_attribute_value(path: str, text: str, line: int) -> ast.expr | None:
    """The constant expression `_cached_function_attribute` proves the attribute holds, or None."""
    cached = _cached_function_attribute(path, text, line)
    return cached[0] if cached is not None else None


def function_attribute_cache(path: str, text: str, line: int) -> ast.stmt | None:
    """The statement caching the function attribute `text` read at `line` (its `if not hasattr`
    block, or the assignment) where that read is the only read of the attribute in the file: code
    that no longer reads it leaves the cache dead. None otherwise."""
    cached = _cached_function_attribute(path, text, line)
    return cached[1] if cached is not None and cached[2] == 1 else None


def _cached_function_attribute(path: str, text: str, line: int) -> tuple[ast.expr, ast.stmt, int] | None:
    """What the function attribute `text` (`gelu_accurate._a`), read at `line`, holds there: the
    constant expression it is cached from inside the reading function, before the read
    (`if not hasattr(f, "_a"): f._a = math.sqrt(2 / math.pi)`, or the assignment on its own).
    `f` must be the file's one module-level function of that name, never rebound, and every write
    of the attribute anywhere in the file that assignment of a number (no `setattr`, `del`,
    augmented assignment or `f.__dict__`), so that the attribute holds it whenever it is read. None
    otherwise, or where the source is not known. Also the caching statement and how many times the
    file reads the attribute (`getattr` or `hasattr` of it elsewhere count as many reads: unknown)."""
    m = _FUNCTION_ATTRIBUTE.fullmatch(text.replace(" ", ""))
    tree = tree_of(path)
    if m is None or tree is None:
        return None
    name, attr = m.groups()
    function = _function(tree, "__module__", name)
    if function is None:
        return None
    writes, assigns, reads = [], [], 0
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name and n is not function:
            return None
        if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
            return None
        if isinstance(n, ast.alias) and (n.asname or n.name).split(".")[0] == name:
            return None
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "delattr", "vars") \
                and any(isinstance(a, ast.Name) and a.id == name for a in n.args):
            return None
        if _is_attribute(n, name, "__dict__") or _is_attribute(n, name, attr) and not isinstance(n.ctx, ast.Load):
            writes.append(n)
        elif _is_attribute(n, name, attr):
            reads += 1
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr") \
                and any(isinstance(a, ast.Name) and a.id == name for a in n.args):
            reads += 2  # a read by name: the cache may matter to code other than the reading function's
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and _is_attribute(n.targets[0], name, attr):
            assigns.append(n)
    # every write is one of the assignments, all of the same number
    if not assigns or len(writes) != len(assigns) or not all(ast_number(a.value) for a in assigns) \
            or len({ast.dump(a.value) for a in assigns}) != 1:
        return None
    # the reading function caches it before the read: a statement of its body, or under `if not hasattr(...)`
    if not function.lineno <= line <= (function.end_lineno or function.lineno):
        return None
    for stmt in function.body:
        if stmt.lineno >= line:
            break
        cache = isinstance(stmt, ast.If) and not stmt.orelse and _not_hasattr(stmt.test, name, attr)
        if any(s is a for s in (stmt.body if cache else [stmt]) for a in assigns):  # type: ignore[attr-defined]
            return assigns[0].value, stmt, reads - 2 if cache else reads  # less the cache's own test
    return None


def _not_hasattr(test: ast.expr, name: str, attr: str) -> bool:
    """`not hasattr(name, "attr")`."""
    return isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call) \
        and isinstance(test.operand.func, ast.Name) and test.operand.func.id == "hasattr" \
        and len(test.operand.args) == 2 and isinstance(test.operand.args[0], ast.Name) \
        and test.operand.args[0].id == name and isinstance(test.operand.args[1], ast.Constant) \
        and test.operand.args[1].value == attr
