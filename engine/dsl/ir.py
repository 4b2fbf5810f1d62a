"""The intermediate representation of a model's structure.

A file holds classes; a class holds its ``__init__`` layer table and, per method, a sequence of DL
nodes in source order. Each node is either a layer call (``kind == "layer"``: the call of a module
built in ``__init__``, with its fully qualified type) or a tensor operation (``kind == "op"``: a
canonical operation name such as ``matmul`` or ``softmax``, see ``engine.dsl.canonical``).

Data flow is explicit: values are SSA variables. Every assignment of a Python name creates a new
``Var`` (``x``, ``x.1``, ``x.2`` ...), so a node input names exactly the definition it reads. Where
control flow merges, a ``phi`` node selects between the definitions of the branches; a single path
(see ``paths``) resolves every ``phi`` to the definition that is live on it.

Control flow: a node carries the guard it sits under, a tuple of ``Cond`` (an ``if`` test and the
branch taken). A path is one consistent choice of branch for every condition; ``paths`` enumerates
them up to a bound.

Everything here is plain frozen data so that ``parse(print(x)) == x`` can be checked by ``==``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

# ---------------------------------------------------------------------------------------------
# Operands


@dataclass(frozen=True, slots=True)
class Var:
    """A data value: an SSA name of a method parameter or of a node output."""

    name: str


@dataclass(frozen=True, slots=True)
class Const:
    """A Python literal: int, float, str, bool, None, Ellipsis, or a tuple of those."""

    value: object


@dataclass(frozen=True, slots=True)
class Sym:
    """An expression that carries no tracked data: ``config.hidden_size``, ``self.scale``,
    ``math.sqrt(self.head_dim)``. Kept as normalized source text."""

    text: str


@dataclass(frozen=True, slots=True)
class Seq:
    """A list or tuple display whose items include data (``torch.cat([a, b])``)."""

    items: tuple[Operand, ...]
    kind: str = "tuple"  # "tuple" or "list"


Operand = Union[Var, Const, Sym, Seq]


# ---------------------------------------------------------------------------------------------
# Positions, guards


@dataclass(frozen=True, slots=True)
class Pos:
    """Source position: 1-based lines, 0-based columns, as ``ast`` reports them."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int


@dataclass(frozen=True, slots=True)
class Cond:
    """One branch decision: the condition's id within the method, its source text, and the
    branch taken (True for the ``if`` body, False for ``else``). A condition of an inlined helper
    is written in its caller's terms, or starts with HELPER_CONDITION where it has none."""

    id: int
    text: str
    taken: bool


# marks an inlined helper's condition that has no text in its caller's terms (it reads a local of the
# helper): no guard at the call can state it
HELPER_CONDITION = "<helper> "


# ---------------------------------------------------------------------------------------------
# Nodes


@dataclass(frozen=True, slots=True)
class Node:
    """One DL node.

    kind      "layer" for a call of a module attribute, "op" for a tensor operation, "phi" for a
              control-flow merge, "return" / "store" / "yield" for values leaving the method.
    op        layer: the fully qualified layer type (``torch.nn.Linear``); op: the canonical
              operation name (``matmul``, ``softmax``, ``add``, ``.masked_fill``, ``torch.cat``).
    target    layer: the attribute path called (``self.query``, ``self.layers[0]``);
              store: the attribute written (``self.cache``); otherwise None.
    inputs    positional operands.
    kwargs    keyword operands, in source order.
    outputs   SSA names defined (several for tuple unpacking; empty for return/store).
    guard     the branch decisions this node sits under, outermost first.
    pos       where the node's expression is in the source.
    via       call sites through which this node was inlined, outermost first.
    """

    kind: str
    op: str
    inputs: tuple[Operand, ...] = ()
    kwargs: tuple[tuple[str, Operand], ...] = ()
    outputs: tuple[str, ...] = ()
    target: str | None = None
    guard: tuple[Cond, ...] = ()
    pos: Pos | None = None
    via: tuple[Pos, ...] = ()

    def kwarg(self, name: str, default: Operand | None = None) -> Operand | None:
        for key, value in self.kwargs:
            if key == name:
                return value
        return default

    @property
    def data_inputs(self) -> tuple[str, ...]:
        """SSA names this node reads, including those nested in sequences and keywords."""
        names: list[str] = []
        for operand in (*self.inputs, *(v for _, v in self.kwargs)):
            _collect_vars(operand, names)
        return tuple(names)


def _collect_vars(operand: Operand, into: list[str]) -> None:
    if isinstance(operand, Var):
        into.append(operand.name)
    elif isinstance(operand, Seq):
        for item in operand.items:
            _collect_vars(item, into)


# ---------------------------------------------------------------------------------------------
# Layer table, methods, classes, files


@dataclass(frozen=True, slots=True)
class LayerDef:
    """A module built in ``__init__``: ``self.query = nn.Linear(config.hidden_size, n)``.

    type      fully qualified type (``torch.nn.Linear``), an activation table entry
              (``transformers.activations.ACT2FN[config.hidden_act]``), or ``?`` when unknown.
    items     for ``nn.Sequential`` / ``nn.ModuleList`` built from a literal list: the element
              layers in order; for a ModuleList built by a comprehension: one element.
    guard     branch decisions of ``__init__`` this construction sits under (config-driven choice).
    """

    attr: str
    type: str
    args: tuple[Operand, ...] = ()
    kwargs: tuple[tuple[str, Operand], ...] = ()
    items: tuple[LayerDef, ...] = ()
    guard: tuple[Cond, ...] = ()
    pos: Pos | None = None

    def kwarg(self, name: str, default: Operand | None = None) -> Operand | None:
        for key, value in self.kwargs:
            if key == name:
                return value
        return default


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    default: Operand | None = None
    kind: str = "normal"  # "normal", "vararg", "kwonly", "varkw"


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    params: tuple[Param, ...]
    nodes: tuple[Node, ...]
    pos: Pos | None = None
    notes: tuple[str, ...] = ()  # diagnostics: path bound hit, constructs not understood

    def defs(self) -> dict[str, Node]:
        """SSA name -> the node defining it."""
        out: dict[str, Node] = {}
        for node in self.nodes:
            for name in node.outputs:
                out[name] = node
        return out


@dataclass(frozen=True, slots=True)
class ClassModel:
    name: str
    bases: tuple[str, ...]  # qualified where resolvable
    layers: tuple[LayerDef, ...]  # in __init__ order; an attr may appear more than once (branches)
    methods: tuple[Method, ...]
    pos: Pos | None = None

    def method(self, name: str) -> Method | None:
        for m in self.methods:
            if m.name == name:
                return m
        return None

    def layer_defs(self, attr: str) -> tuple[LayerDef, ...]:
        return tuple(layer for layer in self.layers if layer.attr == attr)


@dataclass(frozen=True, slots=True)
class Diagnostic:
    file: str
    line: int
    message: str
    severity: str = "warning"  # "error" (e.g. the file does not parse) or "warning"


@dataclass(frozen=True, slots=True)
class FileModel:
    path: str
    module: str  # dotted module name where known ("transformers.models.bert.modeling_bert")
    classes: tuple[ClassModel, ...] = ()
    diagnostics: tuple[Diagnostic, ...] = field(default_factory=tuple)

    def cls(self, name: str) -> ClassModel | None:
        for c in self.classes:
            if c.name == name:
                return c
        return None


# ---------------------------------------------------------------------------------------------
# Paths


DEFAULT_PATH_BOUND = 64


def conditions(method: Method) -> list[int]:
    """Distinct condition ids of a method, in first-seen order."""
    seen: dict[int, None] = {}
    for node in method.nodes:
        for cond in node.guard:
            seen.setdefault(cond.id, None)
    return list(seen)


def on_path(node: Node, choice: dict[int, bool]) -> bool:
    return all(choice.get(c.id, c.taken) == c.taken for c in node.guard)


def paths(method: Method, bound: int = DEFAULT_PATH_BOUND) -> tuple[list[list[Node]], bool]:
    """Enumerate control-flow paths: each a list of nodes with every ``phi`` resolved away.

    Conditions nest, so only the conditions reachable under earlier choices split a path; the
    enumeration walks the decision tree and stops at ``bound`` paths. Returns (paths, truncated).
    Uses of a ``phi`` output on a path are rewritten to the branch definition live on that path.
    """
    conds = conditions(method)
    if not conds:
        return [_resolve_phis(list(method.nodes), set())], False
    # Which conditions only matter under which outer decisions: a condition is relevant on a path
    # when some node guarded by it is itself reachable under the choices made so far.
    guarded: dict[int, list[tuple[Cond, ...]]] = {}
    for node in method.nodes:
        for i, cond in enumerate(node.guard):
            guarded.setdefault(cond.id, []).append(node.guard[:i])
    results: list[list[Node]] = []
    truncated = False
    produced = {name for node in method.nodes for name in node.outputs}

    def relevant(cid: int, choice: dict[int, bool]) -> bool:
        return any(all(choice.get(c.id) == c.taken for c in outer) for outer in guarded[cid])

    def walk(index: int, choice: dict[int, bool]) -> None:
        nonlocal truncated
        if len(results) >= bound:
            truncated = True
            return
        while index < len(conds) and not relevant(conds[index], choice):
            index += 1
        if index == len(conds):
            results.append(_resolve_phis([n for n in method.nodes if _on(n, choice)], produced, choice))
            return
        cid = conds[index]
        for taken in (True, False):
            choice[cid] = taken
            walk(index + 1, choice)
            del choice[cid]

    walk(0, {})
    return results, truncated


def _on(node: Node, choice: dict[int, bool]) -> bool:
    return all(choice.get(c.id) == c.taken for c in node.guard)


def _resolve_phis(nodes: list[Node], produced: set[str], choice: dict[int, bool] | None = None) -> list[Node]:
    """Drop phi nodes, renaming their outputs to the input defined on this path. A phi of a branch
    (`if=` its condition, inputs: taken, not taken) follows the path's choice for that condition;
    otherwise a name that no node of the method produces (a parameter) is defined on every path."""
    defined: set[str] = set()
    alias: dict[str, str] = {}
    out: list[Node] = []
    for node in nodes:
        if node.kind == "phi":
            cond = node.kwarg("if")
            if choice and isinstance(cond, Const) and cond.value in choice and len(node.inputs) == 2:
                picked = node.inputs[0 if choice[cond.value] else 1]  # type: ignore[index]
                if isinstance(picked, Var):
                    alias[node.outputs[0]] = _canon(picked.name, alias)
                    continue
            live = [v.name for v in node.inputs if isinstance(v, Var)
                    and (_canon(v.name, alias) in defined or _canon(v.name, alias) not in produced)]
            # the last live definition wins (a branch that ran redefines the value)
            if live:
                alias[node.outputs[0]] = _canon(live[-1], alias)
            continue
        if alias and any(name in alias for name in node.data_inputs):
            node = _rename_inputs(node, alias)
        defined.update(node.outputs)
        out.append(node)
    return out


def _canon(name: str, alias: dict[str, str]) -> str:
    while name in alias:
        name = alias[name]
    return name


def _rename_operand(operand: Operand, alias: dict[str, str]) -> Operand:
    if isinstance(operand, Var) and operand.name in alias:
        return Var(_canon(operand.name, alias))
    if isinstance(operand, Seq):
        return Seq(tuple(_rename_operand(i, alias) for i in operand.items), operand.kind)
    return operand


def _rename_inputs(node: Node, alias: dict[str, str]) -> Node:
    from dataclasses import replace

    return replace(
        node,
        inputs=tuple(_rename_operand(o, alias) for o in node.inputs),
        kwargs=tuple((k, _rename_operand(v, alias)) for k, v in node.kwargs),
    )
