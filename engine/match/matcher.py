"""Data-flow matching of rule patterns against extracted methods, with scope analysis.

Matching starts at every node that can be the pattern's root and walks the data flow backwards:
an argument that names another pattern statement's output must be produced by a node matching
that statement. Paths are explored on demand: where a value comes from a `phi` (a merge after
`if`/`else`), each branch is tried, and the branch decisions a match relies on are collected. A
match is therefore valid under a set of conditions; the conditions beyond those of its root node
are the ones a rewrite has to guard. Some values are read by meaning: a cast to the dtype a value
already has is that value, `r(v, dim=d).unsqueeze(d)` is the reduction with `keepdim=True`, and a
product through a cast back is regrouped (`MethodIndex.views`). Bindings are consistent: a `$variable` bound twice must be the
same value.

Scope analysis then decides what may be done with a match:
  * every intermediate value (an output of a matched node other than the root) must be used only
    by matched nodes. A use that happens only under some condition (`if output_attentions:`) can be
    guarded when the rule allows it; a use on every path makes the match a near-miss; a decision
    whose other branch computes the same rewrite (a sibling match) needs no guard: both go;
  * constants must equal the rule's (a second, relaxed pass finds structures that differ only in a
    constant, e.g. `softmax(dim=1)`, and reports them as near-misses naming the constant);
  * the rule's named constraints (engine.match.constraints) must hold;
  * for rewriting rules, all matched nodes must come from one function body (not split between a
    method and a helper it calls).
"""

from __future__ import annotations

import ast
import itertools
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache

from engine.analysis.contraction import ONE_ROW, ONE_ROW_OF_COLUMN, squeezed_product, summed_product
from engine.analysis.shapes import (
    CASTS,
    ShapeFacts,
    einops_flattened_from,
    einops_reduction,
    einops_unit_tail,
)
from engine.dsl import canonical as C
from engine.dsl.ir import (
    ClassModel,
    Cond,
    Const,
    FileModel,
    LayerDef,
    Method,
    Node,
    Operand,
    Pos,
    Seq,
    Sym,
    Var,
    _collect_vars,
)
from engine.match.rule import OpAlt, PArg, Pattern, PStmt, Rule

MAX_ATTEMPTS_PER_ROOT = 2000  # bound on backtracking per root node (a near-miss where hit: scope `_search_bounds`)
# reductions whose `keepdim=True` keeps the reduced axis as size 1 (`MethodIndex.keepdim_view`)
_KEEPDIM_REDUCTIONS = {"mean", ".mean", "sum", ".sum", "var", ".var", ".amax", ".amin", "torch.amax", "torch.amin"}
# keys of matched nodes that no pattern statement names (they start with "~"): an identity cast the
# match passed through (`_Matcher.producers`), and the nodes a regrouped product stands for
# (`MethodIndex.views`)
CAST_KEY = "~cast:"
VIEW_KEY = "~view:"
# methods whose result holds their tensor's values in its shape, dtype and device (a copy, or the
# tensor itself): the match passes through them as through an identity cast (`_Matcher.producers`)
_SAME_VALUES = {".contiguous", ".clone"}
# the ops of a node that `_Matcher.producers` may read as another (a cast, a copy, the views of
# `MethodIndex`: keepdim_view, max_view, einops_view, shifted_softmax_view, product_view, transposed_view)
_SEEN_THROUGH = frozenset({*CASTS, *_SAME_VALUES, ".unsqueeze", "torch.unsqueeze", "getitem", ".squeeze", "transpose",
                           "einops.reduce", "einops.rearrange", "softmax"})
# einops `reduce`'s reductions as the torch reductions of the same values (`MethodIndex.einops_view`)
_EINOPS_REDUCTIONS = {"mean": "mean", "sum": "sum", "max": ".amax", "min": ".amin"}
# ops whose result is a tensor made from their first operand, a tensor (a method that None lacks, an
# operator that None does not take): a test of such a value against None is decided
_TENSOR_RESULTS = {".contiguous", ".clone", ".permute", ".transpose", "transpose", ".view", ".reshape", ".unsqueeze",
                   ".squeeze", ".flatten", ".unflatten", ".expand", ".repeat", ".to", ".float", ".half", ".bfloat16",
                   ".type_as", ".masked_fill", "masked_fill", "matmul", "softmax", "dropout"}
# the ops of the views `MethodIndex.views` holds: a regrouped product's cast back, a product's matmul
_VIEW_ROOTS = frozenset({*CASTS, "matmul"})
# the target of the product of a view of scores laid out key-major (`MethodIndex.transposed_view`):
# its left operand is the query the code holds transposed, (..., feature, query)
KEY_MAJOR = "key-major product"


# ---------------------------------------------------------------------------------------------
# Results


@dataclass
class Match:
    rule: Rule
    file: FileModel
    cls: ClassModel
    method: Method
    root: Node
    nodes: dict[str, Node]  # pattern statement key -> matched node
    bindings: dict[str, Operand]  # $variable -> operand (statement outputs: Var of the node output)
    conditions: dict[int, bool]  # branch decisions the match relies on (cond id -> taken)
    cond_text: dict[int, str]
    skipped: tuple[str, ...] = ()  # optional statements absent in this match
    relaxed: tuple[str, ...] = ()  # constants that differ (relaxed pass only)
    pattern: Pattern | None = None  # the match block that matched
    # bindings that are None on some path the rewrite covers (the kernel takes them as None there)
    optional: set[str] = field(default_factory=set)
    # of those, the ones bound to a value computed from the variable that is None there (a mask
    # cast to the scores' device, `mask.to(x.device)`): binding -> that variable's text, so the
    # kernel gets `<value> if <variable> is not None else None`
    optional_through: dict[str, str] = field(default_factory=dict)
    # score factors applied on one branch only: binding -> (the condition's text, the branch taken)
    conditional: dict[str, tuple[str, bool]] = field(default_factory=dict)
    # masks held in the layout of permuted scores: binding -> the method call that moves its axes to
    # the kernel's layout (`.permute(0, 3, 1, 2)`)
    relayout: dict[str, str] = field(default_factory=dict)
    # unmatched nodes a constraint found computing only arguments the rewrite drops (a tuple of axes
    # the kernel is told as a shape): removed with the match where nothing else reads them
    companions: list[Node] = field(default_factory=list)
    # statements outside the data flow that only served the matched code (a constant cached on the
    # function for it alone): removed with an unguarded rewrite
    dead: list[Pos] = field(default_factory=list)
    # tests of module settings under which the original code must run: a constraint the match meets
    # only where a setting holds one value (a softmax over `self.dim`, the key axis where
    # `self.dim == 2`: the original is kept when `self.dim != 2`)
    setting_guards: set[str] = field(default_factory=set)
    # tests, at run time, of a fact the kernel needs that the code cannot prove (statistics over a
    # list of axes passed in: `dims != list(range(x.dim() - len(dims), x.dim()))`): the original is
    # kept where one holds, also for a rule that has no guarded form for its paths
    runtime_checks: set[str] = field(default_factory=set)
    # the variable a mask added through the scores' split views is assigned to, folded into their
    # layout, on the branch where it is set (scope `_optional_fold`): the kernel takes that variable
    fold_into: str | None = None
    # the variable a fill's mask is computed from on the branch that fills, where the other branch
    # fills nothing (scope `_both_branches`): the kernel after the merge tests it for None
    fill_through: str | None = None
    # scope `_fullness` of the match, with the part of `optional` it was computed under
    fullness: tuple | None = field(default=None, repr=False, compare=False)

    @property
    def matched_nodes(self) -> list[Node]:
        order = _node_order(self.method)
        return sorted(self.nodes.values(), key=lambda n: order.get(id(n), 0))

    @property
    def location_key(self) -> frozenset:
        """Identity of the matched source locations (positions without the inlining chain: the
        same helper inlined into two methods is one location)."""
        return frozenset(self._where(n) for n in self.nodes.values() if n.pos is not None)

    def _where(self, node: Node) -> tuple:
        # A layer inside an nn.Sequential runs where the Sequential is called, but it is written
        # (and rewritten) where the Sequential is built: two calls of one Sequential are one place.
        if node.kind == "layer" and node.target and node.target.endswith("]"):
            for layer in self.cls.layers:
                for item in layer.items:
                    if item.attr == node.target and item.pos is not None:
                        return (item.pos, node.target)
        return (node.pos, node.target)

    @property
    def extra_conditions(self) -> dict[int, bool]:
        """Branch decisions beyond those under which the root node runs."""
        root_conds = {c.id for c in self.root.guard}
        return {cid: taken for cid, taken in self.conditions.items() if cid not in root_conds}


# the method last asked for and its nodes' positions (a method's matches are analysed together);
# one tuple, replaced whole (threads), holding the method: the ids stay its nodes' while it is held
_ORDER: list[tuple[Method, dict[int, int]] | None] = [None]


def _node_order(method: Method) -> dict[int, int]:
    """id(node) -> its index in `method.nodes`."""
    cached = _ORDER[0]
    if cached is None or cached[0] is not method:
        cached = _ORDER[0] = (method, {id(n): i for i, n in enumerate(method.nodes)})
    return cached[1]


@dataclass
class Finding:
    rule_id: str
    # "rewritten" (rewritable), "guarded" (rewritable behind a guard), "near-miss", "detected",
    # "already-fused" (the fallback of a fused path beside it; engine.match.fused)
    status: str
    file: str
    cls: str
    method: str
    line: int
    end_line: int
    message: str
    reason: str | None = None
    locations: list[Pos] = field(default_factory=list)  # every matched node, as written
    related: list[Pos] = field(default_factory=list)  # call sites through which helpers were inlined
    guard_text: str | None = None  # Python condition under which the original code must run
    # that condition as a disjunction of conjunctions of (condition text, taken) (`scope.analyse`)
    guard_terms: list = field(default_factory=list, repr=False, compare=False)
    checks: list[Pos] = field(default_factory=list)  # shape validations of intermediates the rewrite removes
    dead: list[Pos] = field(default_factory=list)  # statements only the matched code needed (Match.dead)
    # unmatched nodes that only compute arguments the rewrite drops (`mask_value = -finfo(s.dtype).max`)
    companions: list[Node] = field(default_factory=list, repr=False, compare=False)
    # metadata reads of the removed scores in kept code, with the axes they read (`("key",)` for
    # `s.shape[-1]`, `("device",)`): synthesis states them on the query and the key
    restated: list[tuple[Node, tuple[str, ...]]] = field(default_factory=list, repr=False, compare=False)
    match: Match | None = field(default=None, repr=False, compare=False)
    # other matches of the same root, fullest first, each with what analysing it needs: tried in
    # turn when synthesis cannot write this one (engine/match/scope.py `fallback`)
    fallbacks: list = field(default_factory=list, repr=False, compare=False)
    # a helper's intermediate it returns to its callers escapes: the match may be rewritten at a call
    hands_off: bool = field(default=False, repr=False, compare=False)
    # the finding of a match on the other branch of an `if` that shares this one's leading statements:
    # written together with it (engine/match/scope.py `_partner`)
    partner: Finding | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return {
            "rule": self.rule_id,
            "status": self.status,
            "file": self.file,
            "class": self.cls,
            "method": self.method,
            "line": self.line,
            "end_line": self.end_line,
            "message": self.message,
            "reason": self.reason,
            "guard": self.guard_text,
            "locations": [[p.file, p.line, p.col, p.end_line, p.end_col] for p in self.locations],
            "related": [[p.file, p.line, p.col, p.end_line, p.end_col] for p in self.related],
        }


# ---------------------------------------------------------------------------------------------
# Op matching helpers


@lru_cache(maxsize=4096)
def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile("".join(".*" if ch == "*" else re.escape(ch) for ch in pattern) + r"\Z")


@lru_cache(maxsize=8192)
def _glob_hit(pattern: str, name: str) -> bool:
    return _glob(pattern).match(name) is not None


def _layer_op(layer: LayerDef | None) -> tuple[str, dict[str, Operand]] | None:
    """A layer call seen as its canonical op: nn.Softmax(dim=-1) -> ("softmax", {dim: -1})."""
    if layer is None:
        return None
    spec = C.LAYER_OPS.get(layer.type)
    if spec is None:
        return None
    op, names = spec
    params: dict[str, Operand] = dict(zip(names, layer.args, strict=False))
    params.update(layer.kwargs)
    return op, params


def numeric(operand: Operand) -> float | None:
    """The number an operand stands for, evaluating simple math symbols (`math.sqrt(2 / math.pi)`)."""
    if isinstance(operand, Const):
        value = operand.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        return float(value)
    if isinstance(operand, Sym):
        return _eval_math(operand.text)
    return None


_MATH_SAFE = re.compile(r"^[\d\s.eE+\-*/()]*$")


@lru_cache(maxsize=4096)
def _eval_math(text: str) -> float | None:
    expr = text.replace("math.pi", "3.141592653589793").replace("torch.pi", "3.141592653589793")
    expr = expr.replace("np.pi", "3.141592653589793").replace("numpy.pi", "3.141592653589793")
    for name in ("math.sqrt", "np.sqrt", "numpy.sqrt", "sqrt"):
        expr = expr.replace(name, "S")
    if not _MATH_SAFE.match(expr.replace("S", "")):
        return None
    try:
        value = eval(expr, {"__builtins__": {}}, {"S": math.sqrt})  # noqa: S307 - digits and operators only
    except Exception:
        return None
    return float(value) if isinstance(value, (int, float)) else None


_IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_CONSTANT_WORDS = frozenset({"None", "True", "False", "is", "not", "and", "or"})


@lru_cache(maxsize=4096)  # the same texts come back for every rule and every pattern
def constant_truth(text: str) -> bool | None:
    """The value of a condition made of constants only (`None is not None`: a helper's test of a
    parameter its caller left at its default), else None."""
    if "'" not in text and '"' not in text and any(
            word not in _CONSTANT_WORDS for word in _IDENTIFIER.findall(text)):
        return None  # it names something (no string holds that word): a Name, never a constant
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    allowed = (ast.Expression, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Not, ast.And, ast.Or,
               ast.Is, ast.IsNot, ast.Eq, ast.NotEq)
    if not all(isinstance(n, allowed) for n in ast.walk(tree)):
        return None
    try:
        value = eval(compile(tree, "<condition>", "eval"), {"__builtins__": {}})  # noqa: S307 - constants only
    except Exception:  # noqa: BLE001 - a comparison that raises decides nothing
        return None
    return value if isinstance(value, bool) else None


def _literal_equal(expected: object, operand: Operand) -> bool:
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return isinstance(operand, Const) and operand.value == expected and type(operand.value) is type(expected)
    if isinstance(expected, (int, float)):
        value = numeric(operand)
        if value is None:
            return False
        if expected == 0:
            return value == 0
        return abs(value - expected) <= 1e-6 * abs(expected)
    return False


# steps whose result depends on their operands alone (no state, no randomness, nothing in place)
_DETERMINISTIC = {".view", ".reshape", ".unsqueeze", ".squeeze", ".to", ".bool", ".float", ".long", ".int", ".type_as",
                  ".eq", ".ne", ".lt", ".le", ".gt", ".ge", ".logical_not", ".transpose", ".permute", ".expand",
                  ".contiguous", ".flatten", "getitem", "invert", "add", "sub", "mul", "div", "and_", "or_", "scale"}


def _same(a: Operand, b: Operand) -> bool:
    if isinstance(a, Var) and isinstance(b, Var):
        return a.name == b.name
    if isinstance(a, Seq) and isinstance(b, Seq):
        return a.kind == b.kind and len(a.items) == len(b.items) and all(
            _same(x, y) for x, y in zip(a.items, b.items, strict=True))
    if isinstance(a, (Const, Sym)) and type(a) is type(b):
        return a == b
    return False


def render(operand: Operand) -> str:
    """An operand as a Python expression (Var names map back to source names by the caller)."""
    if isinstance(operand, Var):
        return operand.name
    if isinstance(operand, Const):
        return repr(operand.value)
    if isinstance(operand, Sym):
        return operand.text
    if isinstance(operand, Seq):
        inner = ", ".join(render(i) for i in operand.items)
        return f"[{inner}]" if operand.kind == "list" else f"({inner}{',' if len(operand.items) == 1 else ''})"
    return "?"


# ---------------------------------------------------------------------------------------------
# The matcher


class ClassInfo:
    """Per-class lookups shared by the indexes of its methods: the layer table, and the canonical
    ops its layers stand for (`nn.Softmax` -> `softmax`)."""

    __slots__ = ("cls", "layers", "layer_ops")

    def __init__(self, cls: ClassModel) -> None:
        self.cls = cls
        layers: dict[str, LayerDef] = {}
        for layer in cls.layers:
            layers.setdefault(layer.attr, layer)
            for item in layer.items:
                layers.setdefault(item.attr, item)
        self.layers = layers
        ops = set()
        for layer in layers.values():
            spec = C.LAYER_OPS.get(layer.type)
            if spec is not None:
                ops.add(spec[0])
        self.layer_ops = frozenset(ops)


class MethodIndex:
    """Per-method lookups shared by all rules: definitions, uses, layer table. Everything is built
    on first use: most (method, rule) pairs are settled by `may_match` on the set of op names."""

    def __init__(self, file: FileModel, cls: ClassModel, method: Method, info: ClassInfo | None = None) -> None:
        self.file = file
        self.cls = cls
        self.method = method
        # (rule id, root) where `match_pattern` stopped at MAX_ATTEMPTS_PER_ROOT without a match
        self.bounded: list[tuple[str, Node]] = []
        self._info = info
        self._uses: dict[str, list[Node]] | None = None
        self._phis: dict[int, Node] | None = None
        self._candidates: dict[tuple, list[Node]] = {}
        self._names: set[str] | None = None
        self._layer_types: frozenset[str] | None = None
        self._clauses: dict[int, bool] = {}
        self._views: dict[str, list[Node]] | None = None
        self.stands_for: dict[int, tuple[Node, ...]] = {}  # a view -> the nodes it stands for
        self._keepdim: dict[int, Node | None] = {}
        self._products: dict[int, Node | None] = {}
        self._decided: dict[int, bool | None] = {}
        self._transposed: dict[int, Node | None] = {}
        self._possible: dict[int, bool] = {}  # id(a node's guard) -> `possible` of it

    def __getattr__(self, name: str):
        # defs, by_op, by_target: built together on first use; cond_text when a match is made
        if name in ("defs", "by_op", "by_target"):
            self._build()
            return self.__dict__[name]
        if name == "cond_text":
            cond_text: dict[int, str] = {}
            for node in self.method.nodes:
                for cond in node.guard:
                    if cond.id not in cond_text:
                        cond_text[cond.id] = cond.text
            self.cond_text = cond_text
            return cond_text
        raise AttributeError(name)

    def _build(self) -> None:
        defs: dict[str, Node] = {}
        by_op: dict[str, list[Node]] = {}
        by_target: dict[str, list[Node]] = {}
        for node in self.method.nodes:
            for name in node.outputs:
                defs[name] = node
            by_op.setdefault(node.op, []).append(node)
            if node.target is not None and node.kind == "op":
                by_target.setdefault(node.target, []).append(node)
        self.defs = defs
        self.by_op = by_op
        self.by_target = by_target

    @property
    def shapes(self) -> ShapeFacts:
        """The method's shape and layout facts (engine.analysis), derived on first question."""
        facts = self.__dict__.get("_shapes")
        if facts is None:
            facts = self.__dict__["_shapes"] = ShapeFacts(self.method, self.cls, self.defs)
        return facts

    @property
    def info(self) -> ClassInfo:
        if self._info is None:
            self._info = ClassInfo(self.cls)
        return self._info

    @property
    def names(self) -> set[str]:
        """Every op and target name of the method's nodes, and the canonical ops of its class's
        layers: a superset of the names a pattern's op can match here."""
        if self._names is None:
            nodes = self.method.nodes
            names = {n.op for n in nodes}
            names.update([n.target for n in nodes])
            names |= self.info.layer_ops
            _add_view_names(names)
            self._names = names
        return self._names

    def may_match(self, need: Needs) -> bool:
        """False when the method lacks an op that every match of `need`'s pattern(s) contains (a
        cheap, conservative test: True does not mean there is a match)."""
        names = self._names
        if names is None:
            names = self.names
        if not need.names <= names:
            return False
        for key, clause in need.clauses:
            hit = self._clauses.get(key)
            if hit is None:
                hit = self._clauses[key] = self._clause(clause, names)
            if not hit:
                return False
        return True

    def _clause(self, clause: tuple[OpAlt, ...], names: set[str]) -> bool:
        for alt in clause:
            if "*" in alt.name and alt.kind == "layer":
                types = self._layer_types
                if types is None:
                    types = self._layer_types = frozenset(n.op for n in self.method.nodes if n.kind == "layer")
                if any(_glob_hit(alt.name, t) for t in types):
                    return True
            elif alt.name in names:
                return True
        return False

    @property
    def uses(self) -> dict[str, list[Node]]:
        """SSA name -> the nodes reading it (built on first use: only scope analysis needs it)."""
        if self._uses is None:
            uses: dict[str, list[Node]] = {}
            add = uses.setdefault
            for node in self.method.nodes:
                # `node.data_inputs`, in its order, without building the tuple
                for operand in node.inputs:
                    if isinstance(operand, Var):
                        add(operand.name, []).append(node)
                    elif isinstance(operand, Seq):
                        for name in _seq_vars(operand):
                            add(name, []).append(node)
                for _, operand in node.kwargs:
                    if isinstance(operand, Var):
                        add(operand.name, []).append(node)
                    elif isinstance(operand, Seq):
                        for name in _seq_vars(operand):
                            add(name, []).append(node)
            self._uses = uses
        return self._uses

    def phi_of(self, cid: int) -> Node | None:
        """The merge node of branch condition `cid`."""
        if self._phis is None:
            self._phis = {}
            for node in self.method.nodes:
                if node.kind == "phi":
                    marker = node.kwarg("if")
                    if isinstance(marker, Const) and isinstance(marker.value, int):
                        self._phis.setdefault(marker.value, node)
        return self._phis.get(cid)

    def decided(self, cid: int) -> bool | None:
        """The value decision `cid` always takes, where it is known: a test of constants only (`not
        True`, `None is not None`: an inlined helper's test of a parameter its caller passed or left
        at its default), or `V is not None` / `V is None` of a value that is never None (a tensor
        method's result, `bias = self.linear(pair).permute(0, 3, 1, 2)`). None otherwise."""
        if cid in self._decided:
            return self._decided[cid]
        text = self.cond_text.get(cid)
        truth = constant_truth(text) if text else None
        phi = self.phi_of(cid) if truth is None else None
        test = phi.kwarg("test") if phi is not None else None
        compare = self.defs.get(test.name) if isinstance(test, Var) else None
        if compare is not None and compare.op in ("compare:is", "compare:isnot") and len(compare.inputs) == 2 \
                and compare.inputs[1] == _NONE and isinstance(compare.inputs[0], Var) \
                and self._never_none(compare.inputs[0]):
            truth = compare.op == "compare:isnot"
        self._decided[cid] = truth
        return truth

    def possible_guard(self, guard: tuple[Cond, ...]) -> bool:
        """`possible` of a node's guard, once per guard (the nodes of one branch share theirs)."""
        found = self._possible.get(id(guard))
        if found is None:
            found = self._possible[id(guard)] = self.possible(guard)
        return found

    def possible(self, guard) -> bool:
        """No branch decision of `guard` ((cid, taken) pairs or `Cond`s) is one the code never takes."""
        for cond in guard:
            cid, taken = (cond.id, cond.taken) if isinstance(cond, Cond) else cond
            truth = self.decided(cid)
            if truth is not None and truth != taken:
                return False
        return True

    def _never_none(self, value: Var, depth: int = 0) -> bool:
        """`value` holds a tensor on every path: the result of a tensor method or operator that gives
        a tensor (none of them gives None), or a merge of such."""
        node = self.defs.get(value.name)
        if node is None or depth > 8:
            return False
        if node.kind == "phi":
            merged = [v for v in node.inputs if isinstance(v, Var)]
            return len(merged) == len(node.inputs) > 0 and all(self._never_none(v, depth + 1) for v in merged)
        return node.kind == "op" and node.op in _TENSOR_RESULTS and bool(node.inputs) and isinstance(node.inputs[0], Var)

    @property
    def layers(self) -> dict[str, LayerDef]:
        return self.info.layers

    def layer_for(self, node: Node) -> LayerDef | None:
        if node.target is None:
            return None
        found = self.layers.get(node.target)
        if found is None and node.target.endswith("]"):
            base = node.target[: node.target.rfind("[")]
            found = self.layers.get(base + "[*]")
        return found

    @property
    def views(self) -> dict[str, list[Node]]:
        """Products regrouped through a cast back, by the op of their root: `p * c(q1 * q2)`, where
        `c` casts to the dtype `p` provably has (engine.analysis.shapes `dtype`), is `c(p * q1 * q2)`
        up to rounding (the product is taken in the wider dtype and rounded once), with the same
        dtype and broadcast shape; `p * q1` may then be a pattern's step (x * rsqrt(...) of RMSNorm,
        with the weight q2 outside). Each view is three nodes that are in no method body, `c((p * q1)
        * q2)` for either factor as q1, its root in the place of the outer product (the same output
        and source position), read where each intermediate it regroups has no reader but the next.
        A match rooted at a view removes the nodes it stands for (`stands_for`)."""
        if self._views is None:
            self._views = {}
            for node in self.method.nodes:
                self._regroup(node)
                product = self.product_view(node) if node.op in ("sum", ".squeeze") else None
                if product is not None:
                    self._views.setdefault("matmul", []).append(product)
        return self._views

    def _regroup(self, node: Node) -> None:
        if node.kind != "op" or node.op != "mul" or len(node.inputs) != 2 or node.kwargs or not node.outputs:
            return
        facts = self.shapes
        for p, q in ((node.inputs[0], node.inputs[1]), (node.inputs[1], node.inputs[0])):
            cast = self.defs.get(q.name) if isinstance(q, Var) else None
            if cast is None or cast.kind != "op" or cast.op not in CASTS or not cast.inputs or cast.via != node.via \
                    or [u for u in self.uses.get(q.name, ()) if u is not node]:
                continue
            to = facts.cast_dtype(cast)
            if to is None or to != facts.dtype(p):
                continue
            inner = cast.inputs[0]
            product = self.defs.get(inner.name) if isinstance(inner, Var) else None
            if product is None or product.kind != "op" or product.op != "mul" or len(product.inputs) != 2 \
                    or product.kwargs or product.via != node.via or product.guard != node.guard \
                    or [u for u in self.uses.get(inner.name, ()) if u is not cast]:
                continue
            for k, (q1, q2) in enumerate(((product.inputs[0], product.inputs[1]),
                                          (product.inputs[1], product.inputs[0]))):
                name = f"{node.outputs[0]}~{k}"
                left = Node("op", "mul", (p, q1), (), (f"{name}a",), None, product.guard, product.pos, product.via)
                both = Node("op", "mul", (Var(f"{name}a"), q2), (), (f"{name}b",), None, product.guard, product.pos,
                            product.via)
                root = Node("op", cast.op, (Var(f"{name}b"), *cast.inputs[1:]), cast.kwargs, node.outputs, None,
                            node.guard, node.pos, node.via)
                self.defs[f"{name}a"], self.defs[f"{name}b"] = left, both
                self.stands_for[id(root)] = (node, cast, product)
                self._views.setdefault(cast.op, []).append(root)  # type: ignore[union-attr]

    def keepdim_view(self, node: Node) -> Node | None:
        """`r(v, dim=d).unsqueeze(d)` of a reduction `r` that dropped axis d, read only there, seen as
        the reduction with `keepdim=True` (the same axis restored in the same place: for d < 0 the
        reduced value has one axis less, so d counts from the end to that place again); None for
        any other node. The view stands for both nodes."""
        if node.kind != "op" or node.op not in (".unsqueeze", "torch.unsqueeze") or not node.outputs:
            return None
        cached = self._keepdim.get(id(node), False)
        if cached is not False:
            return cached
        view = None
        source = node.inputs[0] if node.inputs else None
        where = node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim")
        reduced = self.defs.get(source.name) if isinstance(source, Var) else None
        if reduced is not None and reduced.kind == "op" and reduced.op in _KEEPDIM_REDUCTIONS and reduced.outputs \
                and reduced.via == node.via and isinstance(where, Const) and type(where.value) is int \
                and reduced.kwarg("dim") == where and reduced.kwarg("keepdim", Const(False)) == Const(False) \
                and len(reduced.inputs) == 1 and [u for u in self.uses.get(source.name, ()) if u is not node] == []:
            kwargs = (*((k, v) for k, v in reduced.kwargs if k != "keepdim"), ("keepdim", Const(True)))
            view = Node(reduced.kind, reduced.op, reduced.inputs, kwargs, node.outputs, reduced.target, node.guard,
                        node.pos, node.via)
            self.stands_for[id(view)] = (reduced, node)
        self._keepdim[id(node)] = view
        return view

    def max_view(self, node: Node) -> Node | None:
        """`x.max(dim=d, keepdim=keep)[0]` (or `torch.max`), the values of a maximum whose indices
        nothing reads, seen as `x.amax(dim=d, keepdim=keep)`: the same values (their gradient goes
        to one of tied maxima rather than spread over them, which nothing the rules match reads:
        the row maximum the softmax is invariant to). None for any other node. The view stands for
        both nodes."""
        if node.kind != "op" or node.op != "getitem" or len(node.inputs) != 2 or node.inputs[1] != Const(0) \
                or not isinstance(node.inputs[0], Var) or not node.outputs:
            return None
        cached = self._keepdim.get(id(node), False)
        if cached is not False:
            return cached
        view = None
        pair = self.defs.get(node.inputs[0].name)
        if pair is not None and pair.kind == "op" and pair.op in (".max", "torch.max") and pair.via == node.via \
                and len(pair.inputs) in (1, 2) and [u for u in self.uses.get(node.inputs[0].name, ()) if u is not node] == []:
            dim = pair.inputs[1] if len(pair.inputs) == 2 else pair.kwarg("dim")
            extra = {k for k, _ in pair.kwargs} - {"dim", "keepdim"}
            if isinstance(dim, Const) and type(dim.value) is int and not extra \
                    and (len(pair.inputs) == 1 or pair.kwarg("dim") is None):
                kwargs = (("dim", dim), ("keepdim", pair.kwarg("keepdim", Const(False))))
                view = Node("op", ".amax", pair.inputs[:1], kwargs, node.outputs, None, node.guard, node.pos, node.via)
                self.stands_for[id(view)] = (pair, node)
        self._keepdim[id(node)] = view
        return view

    def einops_view(self, node: Node) -> Node | None:
        """einops' `reduce(x, pattern, r)` whose pattern only reduces axes of x (`'o ... -> o 1 1 1'`
        of a 4-D x: engine/analysis/shapes.py `einops_reduction`), seen as the torch reduction over
        those axes (`x.mean(dim=(1, 2, 3), keepdim=True)`; `max`/`min` as `amax`/`amin`), kept as
        size 1 in place or dropped as the pattern says; and a reduction over the last axis of x with
        its trailing axes flattened into one (`rearrange(x, 'o ... -> o (...)')`, `x.flatten(k)`),
        its result given size-1 axes in their place again (`rearrange(v, 'o -> o 1 1 1')`), each
        read only by the next, seen as the reduction over those trailing axes of x with
        `keepdim=True` (the same elements reduced: the biased variance of the flattened rows is the
        variance over the axes they hold). x's rank must be proven where `...` or the flatten
        leaves it open. None for any other node. The view stands for the nodes it replaces."""
        if node.kind != "op" or node.op not in ("einops.reduce", "einops.rearrange") or len(node.outputs) != 1 \
                or not node.inputs or not isinstance(node.inputs[0], Var):
            return None
        cached = self._keepdim.get(id(node), False)
        if cached is not False:
            return cached
        view = None
        pattern = node.inputs[1] if len(node.inputs) > 1 else node.kwarg("pattern")
        text = pattern.value if isinstance(pattern, Const) and isinstance(pattern.value, str) else None
        if text is not None and node.op == "einops.reduce":
            how = node.inputs[2] if len(node.inputs) > 2 else node.kwarg("reduction")
            op = _EINOPS_REDUCTIONS.get(how.value) if isinstance(how, Const) and isinstance(how.value, str) else None
            found = einops_reduction(text, self.shapes.rank(node.inputs[0])) if op is not None \
                and len(node.inputs) <= 3 and {k for k, _ in node.kwargs} <= {"pattern", "reduction"} else None
            if found is not None:
                dims, keep = found
                kwargs = (("dim", Const(dims[0] if len(dims) == 1 else dims)), ("keepdim", Const(keep)))
                view = Node("op", op, node.inputs[:1], kwargs, node.outputs, None, node.guard, node.pos,  # type: ignore[arg-type]
                            node.via)
                self.stands_for[id(view)] = (node,)
        elif text is not None and len(node.inputs) == 2 and not node.kwargs:
            view = self._unflattened_reduction(node, text)
        self._keepdim[id(node)] = view
        return view

    def _unflattened_reduction(self, node: Node, pattern: str) -> Node | None:
        """`einops_view`'s second reading: `node` gives a reduction of a flatten size-1 axes."""
        tail = einops_unit_tail(pattern)
        source = node.inputs[0]
        reduced = self.defs.get(source.name) if isinstance(source, Var) else None
        if tail is None or reduced is None or reduced.kind != "op" or reduced.op not in _KEEPDIM_REDUCTIONS \
                or len(reduced.inputs) != 1 or not isinstance(reduced.inputs[0], Var) or len(reduced.outputs) != 1 \
                or reduced.via != node.via or reduced.kwarg("keepdim", Const(False)) != Const(False) \
                or [u for u in self.uses.get(source.name, ()) if u is not node]:
            return None
        flat_name = reduced.inputs[0].name
        flat = self.defs.get(flat_name)
        if flat is None or flat.kind != "op" or flat.via != node.via or not flat.inputs \
                or not isinstance(flat.inputs[0], Var) or [u for u in self.uses.get(flat_name, ()) if u is not reduced]:
            return None
        x = flat.inputs[0]
        rank = self.shapes.rank(x)
        start: int | None = None
        if flat.op == "einops.rearrange" and len(flat.inputs) == 2 and not flat.kwargs \
                and isinstance(flat.inputs[1], Const) and isinstance(flat.inputs[1].value, str):
            start = einops_flattened_from(flat.inputs[1].value, rank)
        elif flat.op in (".flatten", "torch.flatten") and rank is not None and len(flat.inputs) <= 2:
            given = flat.inputs[1] if len(flat.inputs) == 2 else flat.kwarg("start_dim", Const(0))
            end = flat.kwarg("end_dim", Const(-1))
            if {k for k, _ in flat.kwargs} <= {"start_dim", "end_dim"} and isinstance(given, Const) \
                    and type(given.value) is int and end in (Const(-1), Const(rank - 1)):
                start = given.value if given.value >= 0 else given.value + rank
                start = start if 0 < start < rank else None
        if start is None or rank is None or tail != (start, rank - start) \
                or reduced.kwarg("dim") not in (Const(-1), Const(start)):
            return None
        dims = tuple(range(start, rank))
        kwargs = (*((k, v) for k, v in reduced.kwargs if k not in ("dim", "keepdim")),
                  ("dim", Const(dims[0] if len(dims) == 1 else dims)), ("keepdim", Const(True)))
        view = Node("op", reduced.op, (x,), kwargs, node.outputs, reduced.target, node.guard, node.pos, node.via)
        self.stands_for[id(view)] = (flat, reduced, node)
        return view

    def shifted_softmax_view(self, node: Node) -> Node | None:
        """The "stable softmax" of x (DALLE's and DALLE2's helper): `t = x * b`, `t - t.amax(dim=d,
        keepdim=True)` (detached or not), times a, then `softmax(dim=d)`, each step read only by the
        next, seen as `softmax(x, dim=d)`: the row maximum, scaled by a, is constant along d, which
        the softmax is invariant to, and a * b == 1 with a a power of two (proven numbers: constants,
        or locals assigned them once, `alpha = 32 ** 2` with `t / alpha`), so `x * b * a` is x
        exactly. The same axis is the same constant or the same value (`dim=dim` both times). None
        for any other node. The view stands for the nodes it replaces."""
        if node.kind != "op" or node.op != "softmax" or len(node.inputs) != 1 or len(node.outputs) != 1 \
                or {k for k, _ in node.kwargs} != {"dim"} or not isinstance(node.inputs[0], Var):
            return None
        cached = self._keepdim.get(id(node), False)
        if cached is not False:
            return cached
        view = None
        steps = self._shifted_steps(node)
        if steps is not None:
            view = Node("op", "softmax", steps[0].inputs[:1], node.kwargs, node.outputs, node.target, node.guard,
                        node.pos, node.via)
            self.stands_for[id(view)] = (*steps, node)
        self._keepdim[id(node)] = view
        return view

    def _shifted_steps(self, node: Node) -> tuple[Node, ...] | None:
        """`shifted_softmax_view`'s steps before the softmax, the first scale first; None where they
        are not so."""
        def only(operand: Operand, op: str | tuple[str, ...], reader: Node) -> Node | None:
            found = self.defs.get(operand.name) if isinstance(operand, Var) else None
            ops = (op,) if isinstance(op, str) else op
            if found is None or found.kind != "op" or found.op not in ops or found.via != node.via \
                    or len(found.outputs) != 1 or [u for u in self.uses.get(operand.name, ()) if u is not reader]:
                return None
            return found

        dim = node.kwarg("dim")
        after = only(node.inputs[0], "scale", node)
        shifted = only(after.inputs[0], "sub", after) if after is not None and len(after.inputs) == 2 else None
        if shifted is None or len(shifted.inputs) != 2 or shifted.kwargs:
            return None
        t, top = shifted.inputs
        maximum = self.defs.get(top.name) if isinstance(top, Var) else None
        detach = None
        if maximum is not None and maximum.op == ".detach":
            detach = only(top, ".detach", shifted)
            maximum = only(detach.inputs[0], (".amax", "torch.amax"), detach) if detach is not None else None
        else:
            maximum = only(top, (".amax", "torch.amax"), shifted)
        before = self.defs.get(t.name) if isinstance(t, Var) else None
        if maximum is None or before is None or before.kind != "op" or before.op != "scale" or before.via != node.via \
                or len(before.inputs) != 2 or maximum.inputs[:1] != (t,) or len(maximum.inputs) != 1 \
                or {k for k, _ in maximum.kwargs} != {"dim", "keepdim"} or maximum.kwarg("keepdim") != Const(True) \
                or not self._same_axis(maximum.kwarg("dim"), dim) \
                or sorted(id(u) for u in self.uses.get(t.name, ())) != sorted((id(shifted), id(maximum))):
            return None
        a, b = self._number(after.inputs[1]), self._number(before.inputs[1])
        if a is None or b is None or a <= 0 or a * b != 1.0 or math.frexp(a)[0] != 0.5:
            return None
        return tuple(n for n in (before, maximum, detach, shifted, after) if n is not None)

    def _same_axis(self, a: Operand | None, b: Operand | None) -> bool:
        """The same axis: the same operand, or the same integer (`dim=-1` and a local `dim = -1`)."""
        if a is None or b is None:
            return False
        if a == b:
            return True
        x, y = self._number(a), self._number(b)
        return x is not None and x == y and x == int(x)

    def _number(self, operand: Operand, depth: int = 0) -> float | None:
        """The number `operand` is: a constant, a math symbol, a local assigned one once (also inside
        a symbol, `1 / alpha`)."""
        value = numeric(operand)
        if value is not None or depth > 4:
            return value
        if isinstance(operand, Var):
            found = self.defs.get(operand.name)
            if found is not None and found.kind == "op" and found.op == "assign" and len(found.inputs) == 1 \
                    and not found.guard and self._single_version(operand.name):
                return self._number(found.inputs[0], depth + 1)
            return None
        if not isinstance(operand, Sym):
            return None
        text = operand.text
        for name in sorted(set(_IDENTIFIER.findall(text)), key=len, reverse=True):
            if name in ("math", "sqrt"):
                continue
            value = self._number(Var(name), depth + 1) if self._single_version(name) else None
            if value is None:
                return None
            text = re.sub(rf"(?<![\w.]){re.escape(name)}(?!\w)", repr(value), text)
        return _eval_math(text)

    def _single_version(self, name: str) -> bool:
        """The method assigns the local `name` once (no other SSA version of it)."""
        return name in self.defs and not any(other.startswith(name + ".") and other[len(name) + 1:].isdigit()
                                             for other in self.defs)

    def product_view(self, node: Node) -> Node | None:
        """A product written as a multiply and a sum, or as a product with a column squeezed back
        (engine.analysis.contraction), seen as the `matmul` of a vector and a matrix (target
        `ONE_ROW`: its result has no row axis), with the same output and source position; None for
        any other node. The view stands for the nodes it replaces; a key-major product's matrix is
        read through a transpose view (`<output>~kt`)."""
        cached = self._products.get(id(node), False)
        if cached is not False:
            return cached
        view = None
        found = summed_product(node, self.shapes, self.defs, self.uses) if node.op == "sum" else \
            squeezed_product(node, self.shapes, self.defs, self.uses) if node.op == ".squeeze" else None
        if found is not None:
            matrix = found.matrix
            if found.transposed:
                name = f"{node.outputs[0]}~kt"
                product = found.stands_for[1]
                self.defs[name] = Node("op", "transpose", (matrix,), (("dim0", Const(-2)), ("dim1", Const(-1))),
                                       (name,), None, node.guard, product.pos, node.via)
                matrix = Var(name)
            view = Node("op", "matmul", (found.vector, matrix), (), node.outputs,
                        ONE_ROW_OF_COLUMN if found.column else ONE_ROW, node.guard, node.pos, node.via)
            self.stands_for[id(view)] = found.stands_for
        self._products[id(node)] = view
        return view

    def transposed_view(self, node: Node) -> Node | None:
        """Scores laid out key-major and turned back, `softmax(k @ qt, dim=d).transpose(-2, -1)` with
        d the product's axis before its last (its rows: the keys), seen as `softmax(qt.transpose(-2,
        -1) @ k.transpose(-2, -1), dim=-1)`: the transpose of a product is the product of its operands
        transposed, in the other order, and the softmax goes with its axis. The view is the softmax
        (the transpose's output, source position and guard), its product a `matmul` (target
        `KEY_MAJOR`) of the operands' transposes (`<output>~qt`, `<output>~kt`), where both operands
        are provably matrices (a 1-D one is no matrix to transpose); None for any other node. The view
        stands for the three nodes (a match that removes them checks that nothing else reads them)."""
        cached = self._transposed.get(id(node), False)
        if cached is not False:
            return cached
        view = None
        soft = self.defs.get(node.inputs[0].name) if node.kind == "op" and node.op == "transpose" \
            and len(node.outputs) == 1 and node.inputs and isinstance(node.inputs[0], Var) else None
        dim = None
        if soft is not None and soft.kind == "op" and soft.op == "softmax" and {k for k, _ in soft.kwargs} <= {"dim"}:
            dim = soft.kwarg("dim")
        elif soft is not None and soft.kind == "layer" and not soft.kwargs:
            spec = _layer_op(self.layer_for(soft))
            dim = spec[1].get("dim") if spec is not None and spec[0] == "softmax" else None
        scores = soft.inputs[0] if dim is not None and len(soft.inputs) == 1 else None
        product = self.defs.get(scores.name) if isinstance(scores, Var) else None
        facts = self.shapes
        if product is not None and product.kind == "op" and product.op == "matmul" and product.target != KEY_MAJOR \
                and len(product.inputs) == 2 and not product.kwargs and len(product.outputs) == 1 \
                and product.guard == soft.guard == node.guard and product.via == soft.via == node.via \
                and facts.swaps_last_two(node) \
                and all((s := facts.shape(o)) is not None and len(s.axes) >= 2 for o in product.inputs):
            shape, axis = facts.shape(scores), facts.axis(scores, dim)
            if shape is not None and axis is not None and axis.id == shape.axes[-2].id:
                name = node.outputs[0]
                swap = (("dim0", Const(-2)), ("dim1", Const(-1)))
                keys, rows = product.inputs
                for key, operand in (("~qt", rows), ("~kt", keys)):
                    self.defs[name + key] = Node("op", "transpose", (operand,), swap, (name + key,), None,
                                                 product.guard, product.pos, product.via)
                self.defs[name + "~s"] = Node("op", "matmul", (Var(name + "~qt"), Var(name + "~kt")), (),
                                              (name + "~s",), KEY_MAJOR, product.guard, product.pos, product.via)
                view = Node("op", "softmax", (Var(name + "~s"),), (("dim", Const(-1)),), node.outputs, None,
                            node.guard, node.pos, node.via)
                self.stands_for[id(view)] = (product, soft, node)
        self._transposed[id(node)] = view
        return view

    def candidates(self, alts: tuple[OpAlt, ...]) -> list[Node]:
        cached = self._candidates.get(alts)
        if cached is None:
            cached = self._candidates[alts] = self._find_candidates(alts)
        return cached

    def _find_candidates(self, alts: tuple[OpAlt, ...]) -> list[Node]:
        out: list[Node] = []
        for alt in alts:
            if alt.kind == "op":
                out.extend(self.by_op.get(alt.name, ()))
                if alt.name in _VIEW_ROOTS:  # (the views are built where a pattern may start at one)
                    out.extend(self.views.get(alt.name, ()))
                out.extend(self.by_target.get(alt.name, ()))
                for layer_type in _layer_types_of(alt.name):
                    out.extend(self.by_op.get(layer_type, ()))
            else:
                if "*" in alt.name:
                    pattern = _glob(alt.name)
                    for op, nodes in self.by_op.items():
                        if nodes[0].kind == "layer" and pattern.match(op):
                            out.extend(nodes)
                else:
                    out.extend(n for n in self.by_op.get(alt.name, ()) if n.kind == "layer")
        seen: set[int] = set()
        unique = []
        for node in out:
            if id(node) not in seen:
                seen.add(id(node))
                unique.append(node)
        return unique


def _add_view_names(names: set[str]) -> None:
    """Add to a method's op names those its views may match as (`MethodIndex.einops_view`: an
    einops `reduce` read as a torch reduction)."""
    if "einops.reduce" in names:
        names.update(_EINOPS_REDUCTIONS.values())


def _seq_vars(seq: Seq) -> list[str]:
    names: list[str] = []
    _collect_vars(seq, names)
    return names


@lru_cache(maxsize=8192)
def _output_var(name: str) -> Var:
    """`Var(name)` (a value: one object serves every match that binds it)."""
    return Var(name)


_NONE = Const(None)


@lru_cache(maxsize=1024)
def _layer_types_of(op: str) -> tuple[str, ...]:
    """The layer types that stand for canonical op `op` (`softmax`: `torch.nn.Softmax`), in the
    order of the table."""
    return tuple(layer_type for layer_type, (name, _) in C.LAYER_OPS.items() if name == op)


class _State:
    """What a partial match has decided. A state handed on (an argument, a yielded state) is never
    changed: a step that decides more changes a copy (`copy`, or `shared` with a fresh copy of the
    containers it changes), so states that differ in little share the rest."""

    __slots__ = ("bindings", "nodes", "conds", "skipped", "relaxed", "used")

    def __init__(self) -> None:
        self.bindings: dict[str, Operand] = {}
        self.nodes: dict[str, Node] = {}
        self.conds: dict[int, bool] = {}
        # tuples: most states never add to these, and a copy then shares them
        self.skipped: tuple[str, ...] = ()
        self.relaxed: tuple[str, ...] = ()
        self.used: set[int] = set()

    def copy(self) -> _State:
        other = _new_state(_State)
        other.bindings = self.bindings.copy()
        other.nodes = self.nodes.copy()
        other.conds = self.conds.copy()
        other.skipped = self.skipped
        other.relaxed = self.relaxed
        other.used = self.used.copy()
        return other

    def claiming(self) -> _State:
        """A copy that may take more nodes (its own `nodes` and `used`; the rest shared)."""
        other = self.shared()
        other.nodes = self.nodes.copy()
        other.used = self.used.copy()
        return other

    def shared(self) -> _State:
        """A state holding the very containers of this one (to be replaced, not changed, where it differs)."""
        other = _new_state(_State)
        other.bindings = self.bindings
        other.nodes = self.nodes
        other.conds = self.conds
        other.skipped = self.skipped
        other.relaxed = self.relaxed
        other.used = self.used
        return other


_new_state = object.__new__  # a _State without running __init__ (copies set every slot)


def _stmt_key(stmt: PStmt, index: int) -> str:
    return stmt.out or f"#{index}"


class _Matcher:
    def __init__(self, rule: Rule, pattern: Pattern, index: MethodIndex, relaxed: bool) -> None:
        self.rule = rule
        self.pattern = pattern
        self.ix = index
        self.relaxed = relaxed
        self.definer = pattern.definers
        self.chains = _skip_chains(pattern)
        self.attempts = 0

    # -- statements ------------------------------------------------------------------------

    def match_stmt(self, index: int, stmt: PStmt, node: Node, state: _State):
        """The states in which `node` matches `stmt` (and everything upstream of it), as an
        iterator. The checks that need no search run when called (every caller iterates at once):
        most attempts end there, without a generator."""
        self.attempts += 1
        if self.attempts > MAX_ATTEMPTS_PER_ROOT:
            return ()
        if id(node) in state.used:
            return ()
        alternatives = stmt.alternatives
        if len(alternatives) == 1:
            params = self.op_params(alternatives[0], node)
            return () if params is None else self.match_call(index, stmt, alternatives[0], node, state, params)
        calls = [(alt, params) for alt in alternatives if (params := self.op_params(alt, node)) is not None]
        if not calls:
            return ()
        return self._match_calls(index, stmt, calls, node, state)

    def _match_calls(self, index: int, stmt: PStmt, calls: list, node: Node, state: _State):
        for alt, params in calls:
            yield from self.match_call(index, stmt, alt, node, state, params)

    def match_call(self, index: int, stmt: PStmt, call: PStmt, node: Node, state: _State,
                   params: tuple[tuple[Operand, ...], dict[str, Operand]]):
        """`match_stmt` for one alternative call of the statement, whose `op_params` are `params`. As
        `match_stmt`, the checks run when called and the search when iterated: one generator per
        matched statement (that of `resolve`), not one per step of the call's arguments."""
        inputs, kwargs = params
        if not self._may_bind(call, node, inputs, kwargs, state):
            return ()  # settled without copying the state: most attempts end here
        guard = node.guard
        conds = state.conds
        if guard:
            # the node's branch decisions join the state's (copied only where the node adds one)
            if not self.ix.possible_guard(guard):
                return ()  # a node on a branch the code never takes
            for cond in guard:
                have = conds.get(cond.id)
                if have is None:
                    if conds is state.conds:
                        conds = conds.copy()
                    conds[cond.id] = cond.taken
                elif have != cond.taken:
                    return ()
        base = _new_state(_State)
        base.bindings = state.bindings.copy()
        base.nodes = state.nodes.copy()
        base.conds = conds
        base.skipped = state.skipped
        base.relaxed = state.relaxed
        base.used = state.used.copy()
        base.used.add(id(node))
        key = _stmt_key(stmt, index)
        base.nodes[key] = node
        if stmt.out:
            base.bindings[stmt.out] = _output_var(node.outputs[0]) if node.outputs else _NONE
        # keywords first (cheap, no backtracking)
        for name, parg in call.kwargs:
            value = kwargs.get(name)
            if value is None:
                if self.relaxed and parg.kind == "lit":
                    base.relaxed += (f"{name} not given",)
                    continue
                if parg.kind == "any":
                    continue
                return ()
            if parg.kind == "lit" and not _literal_equal(parg.value, value):
                if self.relaxed:
                    base.relaxed += (f"{name}={render(value)} (rule: {parg.value!r})",)
                    continue
                return ()
            if parg.kind == "var":
                if node.kind == "layer" and node.target and name not in dict(node.kwargs):
                    # a parameter given to the layer's constructor: at the call site it is the
                    # module's attribute (`self.dropout.p`), not the constructor's expression
                    value = Sym(f"{node.target}.{name}")
                if not self.bind_free(base, parg.value, value):  # type: ignore[arg-type]
                    return ()
        if kwargs and not call.open_kwargs:
            allowed = {name for name, _ in call.kwargs}
            extra = [k for k in kwargs if k not in allowed and not _ignorable_kwarg(node, k)]
            if extra:
                if not self.relaxed:
                    return ()
                base.relaxed += ("unexpected " + ", ".join(f"{k}=" for k in extra),)
        n = len(call.args)
        swap = node.op in ("add", "mul") and len(inputs) == 2 and n == 2 and not self.rule.ordered
        if call.open_kwargs and len(inputs) > n:
            inputs = inputs[:n]  # `...`: further arguments are free
        if len(inputs) != n:
            return ()
        if swap:
            return self._both_orders(call.args, inputs, base)
        return self.match_args(call.args, inputs, 0, base)

    def _both_orders(self, pargs: tuple[PArg, ...], inputs: tuple[Operand, ...], state: _State):
        """The operands of a commutative `add`/`mul` in the written order, then swapped."""
        yield from self.match_args(pargs, inputs, 0, state)
        yield from self.match_args(pargs, (inputs[1], inputs[0]), 0, state)

    def _may_bind(self, call: PStmt, node: Node, inputs: tuple[Operand, ...], kwargs: dict[str, Operand],
                  state: _State) -> bool:
        """False where `match_call` would yield nothing for a reason that its state copy is not
        needed to see: a branch decision of `node` against the state's, no argument count that
        fits, and (not relaxed) a keyword missing or of another constant or an unexpected keyword.
        A cheap conservative test run before the copy; True decides nothing."""
        n = len(call.args)
        if len(inputs) != n and not (call.open_kwargs and len(inputs) > n):
            return False
        conds = state.conds
        for cond in node.guard:
            have = conds.get(cond.id)
            if have is not None and have != cond.taken:
                return False
        if self.relaxed:
            return True
        for name, parg in call.kwargs:
            value = kwargs.get(name)
            if value is None:
                if parg.kind != "any":
                    return False
            elif parg.kind == "lit" and not _literal_equal(parg.value, value):
                return False
        if not call.open_kwargs and len(kwargs) > len(call.kwargs):
            allowed = {name for name, _ in call.kwargs}
            if any(k not in allowed and not _ignorable_kwarg(node, k) for k in kwargs):
                return False
        return True

    def op_params(self, stmt: PStmt, node: Node) -> tuple[tuple[Operand, ...], dict[str, Operand]] | None:
        for alt in stmt.ops:
            if alt.kind == "layer":
                if node.kind != "layer":
                    continue
                if ("*" in alt.name and _glob(alt.name).match(node.op)) or node.op == alt.name:
                    return node.inputs, dict(node.kwargs)
            else:
                if node.kind == "op" and (node.op == alt.name or node.target == alt.name):
                    return node.inputs, dict(node.kwargs)
                if node.kind == "layer":
                    as_op = _layer_op(self.ix.layer_for(node))
                    if as_op is not None and as_op[0] == alt.name:
                        params = dict(as_op[1])
                        params.update(node.kwargs)
                        return node.inputs, params
        return None

    def match_args(self, pargs: tuple[PArg, ...], operands: tuple[Operand, ...], i: int, state: _State):
        """The states in which `operands[i:]` match `pargs[i:]`, as an iterable (a generator only
        where two arguments or more bind: the last argument's states are `resolve`'s own)."""
        n = len(pargs)
        while i < n:  # arguments that bind nothing, in place (no generator for each)
            parg = pargs[i]
            if parg.kind == "any":
                i += 1
            elif parg.kind == "lit":
                if not _literal_equal(parg.value, operands[i]):
                    if self.relaxed:
                        s = state.copy()
                        s.relaxed += (f"{render(operands[i])} (rule: {parg.value!r})",)
                        return self.match_args(pargs, operands, i + 1, s)
                    return ()
                i += 1
            else:
                break
        if i == n:
            return (state,)
        if i == n - 1:  # the last argument: its states are the call's
            return self.resolve(pargs[i].value, operands[i], state)  # type: ignore[arg-type]
        return self._match_rest(pargs, operands, i, state)

    def _match_rest(self, pargs: tuple[PArg, ...], operands: tuple[Operand, ...], i: int, state: _State):
        for s in self.resolve(pargs[i].value, operands[i], state):  # type: ignore[arg-type]
            yield from self.match_args(pargs, operands, i + 1, s)

    def bind_free(self, state: _State, var: str, operand: Operand) -> bool:
        have = state.bindings.get(var)
        if have is None:
            state.bindings[var] = operand
            return True
        return _same(have, self.through_assign(operand)) or _same(self.through_assign(have), self.through_assign(operand)) \
            or self.recomputed(self.through_assign(have), self.through_assign(operand))

    def recomputed(self, a: Operand, b: Operand, depth: int = 0) -> bool:
        """`a` and `b` are one value computed twice: the same deterministic step (a view, a cast, a
        comparison, an index, arithmetic) of the same values (speechbrain fills and re-fills under
        `key_padding_mask.view(bsz, 1, 1, klen)`, written out at each)."""
        if _same(a, b):
            return True
        if not isinstance(a, Var) or not isinstance(b, Var) or depth > 4:
            return False
        x, y = self.ix.defs.get(a.name), self.ix.defs.get(b.name)
        if x is None or y is None or x.kind != "op" or y.kind != "op" or x.op != y.op or x.op not in _DETERMINISTIC \
                and not x.op.startswith("compare:") or len(x.inputs) != len(y.inputs) or len(x.kwargs) != len(y.kwargs):
            return False
        return all(self.recomputed(i, j, depth + 1) for i, j in zip(x.inputs, y.inputs, strict=True)) \
            and all(k == m and self.recomputed(i, j, depth + 1) for (k, i), (m, j) in zip(x.kwargs, y.kwargs, strict=True))

    def through_assign(self, operand: Operand) -> Operand:
        seen = 0
        while isinstance(operand, Var) and seen < 20:
            node = self.ix.defs.get(operand.name)
            if node is None or node.op != "assign" or node.kind != "op" or len(node.inputs) != 1:
                break
            operand = node.inputs[0]
            seen += 1
        return operand

    def resolve(self, var: str, operand: Operand, state: _State):
        """The states where `operand` is the value of pattern variable `var`, as an iterable: a
        free variable's at once (bound, or compared), a statement's output's from a search."""
        entry = self.definer.get(var)
        if entry is None:
            have = state.bindings.get(var)
            if have is None:
                s = state.shared()
                s.bindings = {**state.bindings, var: operand}
                return (s,)
            if self.bind_free(state, var, operand):  # bound already: only compared, nothing changes
                return (state,)
            return ()
        return self._resolve_statement(var, entry, operand, state)

    def _resolve_statement(self, var: str, entry: tuple[int, PStmt], operand: Operand, state: _State):
        index, stmt = entry
        key = _stmt_key(stmt, index)
        if key in state.nodes:
            # reached again (its output is read twice): it must be the very same node
            for producer, s in self.producers(operand, state):
                if producer is state.nodes[key]:
                    yield s
            if stmt.optional and key in state.skipped:
                yield from self.resolve(stmt.data_args[0], operand, state)
            return
        if not stmt.optional:
            for producer, s in self.producers(operand, state):
                yield from self.match_stmt(index, stmt, producer, s)
            return
        # An optional statement: its output is the node's if it matches here, else (the statement
        # absent) its first data input, resolved in turn. The run of optional statements that follow
        # one another so is walked in one loop, in the order the nested resolution takes them (each
        # statement's matches, then those with it absent), trying only the statements whose op the
        # producer has (`_SkipStep.takes`); a statement it lacks is counted as the attempt that
        # `match_stmt` would count and refuse. The producers are the operand's at every step (the
        # steps differ only in the statements absent).
        steps, terminal = self.chains[var]
        nodes = state.nodes
        found = self.producers(operand, state)
        before = state.skipped
        absent: tuple[str, ...] = ()
        for step in steps:
            if step.key in nodes:
                # reached again: resolved as that statement's own variable (the checks above)
                s = state.shared()
                s.skipped = before + absent
                yield from self.resolve(step.var, operand, s)
                return
            ops = step.ops
            for producer, s in found:
                if producer.kind == "op" and (producer.op in ops or producer.target in ops) \
                        or producer.kind == "layer" and step.takes(producer, self.ix):
                    if absent:
                        s = s.shared()
                        s.skipped = before + absent
                    yield from self.match_stmt(step.index, step.stmt, producer, s)
                else:
                    self.attempts += 1  # `match_stmt`'s count of a node whose op the statement lacks
            absent += (step.key,)
        s = state.shared()
        s.skipped = before + absent
        yield from self.resolve(terminal, operand, s)

    def producers(self, operand: Operand, state: _State) -> list | tuple:
        """The nodes that may produce `operand`, following assignments and, through `phi` merges,
        each branch (recording the branch decision), with the state for each: (node, state) pairs,
        made at once (most operands have one producer, and a generator per operand costs more)."""
        if not isinstance(operand, Var):
            return ()
        node = self.ix.defs.get(operand.name)
        depth = 0
        while node is not None and node.kind == "op" and node.op == "assign" and len(node.inputs) == 1 \
                and isinstance(node.inputs[0], Var) and depth < 20:
            node = self.ix.defs.get(node.inputs[0].name)
            depth += 1
        if node is None:
            return ()
        if node.kind == "op" and node.op not in _SEEN_THROUGH:
            return ((node, state),)  # most nodes: none of the readings below applies
        if node.kind == "op" and node.op in CASTS and id(node) not in state.used and self.ix.shapes.identity_cast(node):
            # a cast to the dtype the value has already (`rsqrt(var + eps).type(x.dtype)` of x's own
            # statistics) is the value itself: it goes with the match
            s = state.claiming()
            s.nodes[f"{CAST_KEY}{node.outputs[0]}"] = node
            s.used.add(id(node))
            return self.producers(node.inputs[0], s)
        if node.kind == "op" and node.op in _SAME_VALUES and len(node.inputs) == 1 and id(node) not in state.used:
            # `s.contiguous()`, `s.clone()`: the same values in the same shape, dtype and device
            s = state.claiming()
            s.nodes[f"{CAST_KEY}{node.outputs[0]}"] = node
            s.used.add(id(node))
            return self.producers(node.inputs[0], s)
        found: list = []
        kept = self.ix.keepdim_view(node) or self.ix.max_view(node) or self.ix.einops_view(node) \
            or self.ix.shifted_softmax_view(node)
        if kept is not None and not {id(n) for n in self.ix.stands_for[id(kept)]} & state.used:
            # `mean(v, dim=d).unsqueeze(d)` is `mean(v, dim=d, keepdim=True)`
            s = state.claiming()
            for real in self.ix.stands_for[id(kept)]:
                s.nodes[f"{VIEW_KEY}{real.outputs[0]}"] = real
                s.used.add(id(real))
            found.append((kept, s))
        elif kept is not None and any(n is kept for n in state.nodes.values()):
            found.append((kept, state))  # the view matched already: its output is read twice
        product = self.ix.product_view(node) if node.op == ".squeeze" else \
            self.ix.transposed_view(node) if node.op == "transpose" else None
        if product is not None and not {id(n) for n in self.ix.stands_for[id(product)]} & state.used:
            # `(k @ u.unsqueeze(-1)).squeeze(-1)` is `(u.unsqueeze(-2) @ k.transpose(-2, -1)).squeeze(-2)`;
            # `softmax(k @ qt, dim=-2).transpose(-2, -1)` is `softmax(qt.transpose(-2, -1) @ k.transpose(-2, -1))`
            s = state.claiming()
            for real in self.ix.stands_for[id(product)]:
                s.nodes[f"{VIEW_KEY}{real.outputs[0]}"] = real
                s.used.add(id(real))
            found.append((product, s))
        if node.kind == "phi":
            out: list = found
            cid_operand = node.kwarg("if")
            decides = isinstance(cid_operand, Const) and isinstance(cid_operand.value, int) and len(node.inputs) == 2
            for position, branch in enumerate(node.inputs):
                if decides:
                    cid = cid_operand.value  # type: ignore[union-attr]
                    taken = position == 0
                    if state.conds.get(cid, taken) != taken or not self.ix.possible(((cid, taken),)):
                        continue  # the state took the other branch, or the code never takes this one
                    s = state.shared()
                    s.conds = {**state.conds, cid: taken}
                else:
                    s = state
                out.extend(self.producers(branch, s))
            return out
        if found:
            found.append((node, state))
            return found
        return ((node, state),)


def _ignorable_kwarg(node: Node, name: str) -> bool:
    # `inplace=` of an activation/dropout changes no value a rewrite depends on
    return name in ("inplace",)


# ---------------------------------------------------------------------------------------------
# Driving: all rules over all methods


class _SkipStep:
    """One optional statement of a run (`_skip_chains`): its variable, index, statement and key, and
    the op names of its alternatives that are not layer types."""

    __slots__ = ("var", "index", "stmt", "key", "ops", "layers")

    def __init__(self, var: str, index: int, stmt: PStmt) -> None:
        self.var, self.index, self.stmt, self.key = var, index, stmt, _stmt_key(stmt, index)
        self.ops = frozenset(a.name for a in stmt.all_ops if a.kind == "op")
        self.layers = any(a.kind == "layer" for a in stmt.all_ops)

    def takes(self, node: Node, ix: MethodIndex) -> bool:
        """Whether `_Matcher.op_params` accepts `node` for one of the statement's alternatives (the
        node's op is one the statement names), the same test without building the parameters."""
        if node.kind == "op":
            return node.op in self.ops or node.target in self.ops
        if node.kind != "layer":
            return False
        if self.layers:
            return True  # (a layer alternative's glob: `match_stmt` decides)
        as_op = _layer_op(ix.layer_for(node))
        return as_op is not None and as_op[0] in self.ops


def _skip_chains(pattern: Pattern) -> dict[str, tuple[tuple[_SkipStep, ...], str]]:
    """For each variable an optional statement defines: the run of optional statements that resolving
    it walks while each is absent (the statement, then the one defining its first data input, and so
    on), and the variable after the run (a required statement's output or a free variable). Computed
    once per pattern."""
    cached = _CHAINS.get(id(pattern))
    if cached is not None and cached[0] is pattern:
        return cached[1]
    chains: dict[str, tuple[tuple[_SkipStep, ...], str]] = {}
    for var, (index, stmt) in pattern.definers.items():
        if not stmt.optional:
            continue
        steps = []
        while True:
            steps.append(_SkipStep(var, index, stmt))
            var = stmt.data_args[0]
            entry = pattern.definers.get(var)
            if entry is None or not entry[1].optional or len(steps) > len(pattern.stmts):
                break
            index, stmt = entry
        chains[steps[0].var] = (tuple(steps), var)
    _CHAINS[id(pattern)] = (pattern, chains)  # holding the pattern keeps its id from being reused
    return chains


_CHAINS: dict[int, tuple[Pattern, dict[str, tuple[tuple[_SkipStep, ...], str]]]] = {}


def sinks(pattern: Pattern) -> list[tuple[int, PStmt]]:
    """Statements whose output no later statement reads: the root (last) and any others. Each other
    sink is matched on its own, sharing the bindings (a pattern may end in several values, like
    three projections)."""
    cached = _SINKS.get(id(pattern))
    if cached is not None and cached[0] is pattern:
        return cached[1]
    consumed = {v for s in pattern.stmts for v in s.data_args}
    found = [(i, s) for i, s in enumerate(pattern.stmts) if not s.out or s.out not in consumed]
    _SINKS[id(pattern)] = (pattern, found)  # holding the pattern keeps its id from being reused
    return found


_SINKS: dict[int, tuple[Pattern, list[tuple[int, PStmt]]]] = {}  # per pattern: computed once, read per method


class Needs:
    """Op names that every match contains: `names` each present, and of each clause in `clauses`
    (a statement's alternatives that are not one plain name) one present."""

    __slots__ = ("names", "clauses")

    def __init__(self, names: frozenset[str], clauses: tuple[tuple[int, tuple[OpAlt, ...]], ...] = ()) -> None:
        self.names = names
        self.clauses = clauses


def _required_statements(pattern: Pattern) -> set[int]:
    """Indexes of the statements every match of `pattern` contains: the sinks, and what a matched
    statement's arguments must resolve to (in every alternative call; through an optional
    statement only what is needed both when it is present and when it is skipped). Each statement's
    set is computed once (a statement read by several later ones would otherwise be walked once per
    path to it, exponentially many in a long pattern); the sets are shared, never changed."""
    stmts = pattern.stmts
    known: dict[int, set[int]] = {}

    def after(i: int) -> set[int]:
        found = known.get(i)
        if found is not None:
            return found
        needed: set[int] | None = None
        for call in stmts[i].alternatives:
            here: set[int] = set()
            for arg in call.args:
                if arg.kind == "var":
                    here |= of_var(arg.value)  # type: ignore[arg-type]
            needed = here if needed is None else needed & here
        found = known[i] = needed or set()
        return found

    def of_var(var: str) -> set[int]:
        entry = pattern.definers.get(var)
        if entry is None:
            return set()  # a free variable: binds anything
        i, stmt = entry
        present = {i} | after(i)
        if stmt.optional:
            return present & of_var(stmt.data_args[0])
        return present

    required: set[int] = set()
    for i, _ in sinks(pattern):
        required |= {i} | after(i)
    return required


def needs(rule: Rule) -> tuple[Needs, list[tuple[Pattern, Needs]]]:
    """The rule's prefilter (what every pattern needs) and each pattern's; computed once per rule."""
    cached = _NEEDS.get(id(rule))
    if cached is not None and cached[0] is rule:
        return cached[1]
    per_pattern = []
    for pattern in rule.patterns:
        names: set[str] = set()
        clauses: list[tuple[OpAlt, ...]] = []
        for i in sorted(_required_statements(pattern)):
            alts = pattern.stmts[i].all_ops
            plain = {a.name for a in alts if not (a.kind == "layer" and "*" in a.name)}
            if len(plain) == 1 and len(alts) == len([a for a in alts if a.name in plain]):
                names |= plain
            elif alts not in clauses:
                clauses.append(alts)
        # each clause with an int key: the per-method cache of clause results then hashes no dataclasses
        keyed = tuple((_CLAUSE_KEYS.setdefault(c, next(_CLAUSE_COUNT)), c) for c in clauses)
        per_pattern.append((pattern, Needs(frozenset(names), keyed)))
    if len(per_pattern) == 1:
        common = per_pattern[0][1]
    else:
        common = Needs(frozenset.intersection(*(n.names for _, n in per_pattern)) if per_pattern else frozenset())
    result = (common, per_pattern)
    _NEEDS[id(rule)] = (rule, result)  # holding the rule keeps its id from being reused
    return result


_CLAUSE_KEYS: dict[tuple[OpAlt, ...], int] = {}
_CLAUSE_COUNT = itertools.count()  # fresh keys (unique even when threads add clauses at once)
_NEEDS: dict[int, tuple[Rule, tuple[Needs, list[tuple[Pattern, Needs]]]]] = {}


def match_method(rule: Rule, index: MethodIndex, relaxed: bool = False) -> list[Match]:
    """All matches of `rule` in one method. With `relaxed`, structures that differ from a pattern
    only in constants are returned too (their `relaxed` lists the differences), in the same search.
    Patterns whose ops the method lacks are skipped without a search."""
    common, per_pattern = needs(rule)
    if len(per_pattern) > 1 and not index.may_match(common):
        return []
    out: list[Match] = []
    for pattern, need in per_pattern:
        if index.may_match(need):
            out.extend(match_pattern(rule, pattern, index, relaxed))
    return out


def _introducing_statements(pattern: Pattern) -> list[tuple[str, tuple[str, ...]]]:
    """For each free variable that an optional statement reads first and later optional statements
    read too: (that statement's key, the later ones' keys). The first introduces the value the later
    ones refer to (`$pz = masked_fill($p2, mask=$fmask, value=0)?` refills under the mask that
    `$s3 = masked_fill(..., mask=$fmask, ...)?` applied), so a match without it matches none of them
    (a required statement reading the variable binds it on its own: `mul($x, $r)` where the optional
    `$xf = .float($x)?` is absent). Computed once per pattern."""
    cached = _INTRODUCING.get(id(pattern))
    if cached is not None and cached[0] is pattern:
        return cached[1]
    readers: dict[str, list[tuple[str, bool]]] = {}
    for i, stmt in enumerate(pattern.stmts):
        for alt in stmt.alternatives:
            for arg in (*alt.args, *(a for _, a in alt.kwargs)):
                if arg.kind == "var" and arg.value not in pattern.definers:
                    keys = readers.setdefault(arg.value, [])  # type: ignore[arg-type]
                    if _stmt_key(stmt, i) not in (k for k, _ in keys):
                        keys.append((_stmt_key(stmt, i), stmt.optional))
    found = [(keys[0][0], later) for keys in readers.values() if keys[0][1]
             and (later := tuple(k for k, optional in keys[1:] if optional))]
    _INTRODUCING[id(pattern)] = (pattern, found)  # holding the pattern keeps its id from being reused
    return found


_INTRODUCING: dict[int, tuple[Pattern, list[tuple[str, tuple[str, ...]]]]] = {}


def match_pattern(rule: Rule, pattern: Pattern, index: MethodIndex, relaxed: bool = False) -> list[Match]:
    roots = index.candidates(pattern.root.all_ops)
    if not roots:
        return []
    matcher = _Matcher(rule, pattern, index, relaxed)
    root_index = len(pattern.stmts) - 1
    root = pattern.root
    extra = [(i, s) for i, s in sinks(pattern) if i != root_index][::-1]
    introduced = _introducing_statements(pattern)
    out: list[Match] = []

    def complete(state: _State, k: int):
        if k == len(extra):
            yield state
            return
        i, stmt = extra[k]
        for node in index.candidates(stmt.all_ops):
            for s in matcher.match_stmt(i, stmt, node, state):
                yield from complete(s, k + 1)

    for node in roots:
        matcher.attempts = 0
        before = len(out)
        for first in matcher.match_stmt(root_index, root, node, _State()):
            for state in complete(first, 0):
                if any(first_key in state.skipped and any(k in state.nodes for k in later)
                       for first_key, later in introduced):
                    continue  # a free variable bound only by a later reader: the value it names is absent
                # the match's own containers: states share theirs, and constraints change a match's bindings
                nodes = state.nodes.copy()
                for real in index.stands_for.get(id(node), ()):
                    nodes[f"{VIEW_KEY}{real.outputs[0]}"] = real
                out.append(Match(rule, index.file, index.cls, index.method, node, nodes, state.bindings.copy(),
                                 state.conds.copy(), index.cond_text, state.skipped, state.relaxed, pattern))
                if extra and not state.relaxed:
                    break  # one exact completion per root is enough
        if matcher.attempts > MAX_ATTEMPTS_PER_ROOT and len(out) == before:
            # the search stopped before it was done and found nothing here: a match may have been
            # missed, which `engine.match.scope` reports as a near-miss at this root
            index.bounded.append((rule.id, node))
    return out


def computes_output(name: str) -> bool:
    """Methods whose code runs in the model's training step: `forward` (and `forward_*`) and private
    helpers (`_attn`, `_split_heads`). Public methods such as `generate`, `prune_heads` or
    `resize_token_embeddings` do not, and rewriting them gains nothing."""
    return name.startswith(("forward", "_")) and not (name.startswith("__") and name.endswith("__") and name != "__call__")


def training_methods(cls: ClassModel) -> list[Method]:
    """The methods that run in the training step: those named by `computes_output` (every method of a
    module that has no `forward`), any method a
    training method calls (a public `self.gelu(x)`, `self.compute_attention(q, k, v)`: the
    extractor inlines the call, and the inlined nodes sit in the callee's body), any method it
    hands on by reference (`apply_chunking_to_forward(self.ff_chunk, ...)`, or inside an expression:
    a table of bound methods `{"gelu": self.gelu, ...}`), and the method that built a module it calls
    (`self.act_fn = self.get_hidden_act(name)` in `__init__`: what that method returns, maybe one of
    its own bound methods from such a table, runs in the step)."""
    if cls.name == "__module__":
        return list(cls.methods)  # module-level functions and top-level code: all of them
    by_name = {m.name: m for m in cls.methods}
    chosen = [m for m in cls.methods if computes_output(m.name)]
    if cls.bases == ("torch.nn.Module",) and "forward" not in by_name:
        # a module with no `forward`, its own or inherited: the model holding it calls its public
        # methods instead (stanza's TransformerTreeStack.push_states), each a step of the training
        chosen = [m for m in cls.methods if not m.name.startswith("__")]
    names = {m.name for m in chosen}
    todo = list(chosen)
    while todo and not names >= by_name.keys():
        method = todo.pop()
        inlined = {n.pos.line for n in method.nodes if n.via and n.pos is not None}
        if inlined:
            for other in cls.methods:
                where = other.pos
                if other.name not in names and where is not None \
                        and any(where.line <= line <= where.end_line for line in inlined):
                    names.add(other.name)
                    chosen.append(other)
                    todo.append(other)
        # which `self.<name>` symbols the method mentions, in bulk; the ordered walk below (which
        # fixes the order methods are added in) runs only where one may name a method not yet chosen
        texts = {o.text for n in method.nodes for o in n.inputs if o.__class__ is Sym}
        texts.update([o.text for n in method.nodes for _, o in n.kwargs if o.__class__ is Sym])
        texts.update([n.op for n in method.nodes if n.kind == "layer"])
        if not any(name in by_name and name not in names for t in texts for name in _methods_named(t)):
            continue
        for node in method.nodes:
            symbols = [o.text for o in (*node.inputs, *(v for _, v in node.kwargs)) if isinstance(o, Sym)]
            if node.kind == "layer":
                symbols.insert(0, node.op)  # the module's type: `self.<method>` where a method built it
            for text in symbols:
                for name in _methods_named(text):
                    if name in by_name and name not in names:
                        names.add(name)
                        chosen.append(by_name[name])
                        todo.append(by_name[name])
    return chosen


class _Names:
    """Op names joined over several methods (and the types of their layer calls, made when a glob
    asks), asked as `MethodIndex.may_match` asks one method's: a `Needs` that one of the methods
    meets, the union meets."""

    __slots__ = ("names", "methods", "_layer_types", "_clauses")

    def __init__(self, names: set[str], methods: list[Method]) -> None:
        self.names = names
        self.methods = methods
        self._layer_types: frozenset[str] | None = None
        self._clauses: dict[int, bool] = {}

    def may_match(self, need: Needs) -> bool:
        if not need.names <= self.names:
            return False
        for key, clause in need.clauses:
            hit = self._clauses.get(key)
            if hit is None:
                hit = self._clauses[key] = any(self._has(alt) for alt in clause)
            if not hit:
                return False
        return True

    def _has(self, alt: OpAlt) -> bool:
        if "*" in alt.name and alt.kind == "layer":  # as MethodIndex._clause
            if self._layer_types is None:
                self._layer_types = frozenset(n.op for m in self.methods for n in m.nodes if n.kind == "layer")
            return any(_glob_hit(alt.name, t) for t in self._layer_types)
        return alt.name in self.names


@lru_cache(maxsize=4096)
def _methods_named(text: str) -> tuple[str, ...]:
    """The attributes of `self` an expression's text names without calling them (`self.gelu`, and
    those in `{"gelu": self.gelu, "relu": F.relu}`), in order: bound methods handed on, where they
    are methods. A text that does not parse names none."""
    if "self." not in text:
        return ()
    if text.startswith("self.") and text[5:].isidentifier():
        return (text[5:],)
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return tuple(n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and id(n) not in called
                 and isinstance(n.value, ast.Name) and n.value.id == "self")


class FileIndexes:
    """The method indexes of one file: those of the training methods, and (built when a rule that
    matches `anywhere` first asks) those of every method, sharing the former's objects."""

    def __init__(self, file: FileModel) -> None:
        self.file = file
        self.training = list(iter_indexes(file))
        self._every: list[MethodIndex] | None = None
        self._whole: dict[bool, _Names] = {}  # anywhere -> the names of the methods looked at, joined

    @property
    def every(self) -> list[MethodIndex]:
        if self._every is None:
            known = {id(ix.method): ix for ix in self.training}
            every = []
            for cls in self.file.classes:
                info = None
                for method in cls.methods:
                    ix = known.get(id(method))
                    if ix is None or ix.cls is not cls:
                        if info is None:
                            info = next((k.info for k in self.training if k.cls is cls), None) or ClassInfo(cls)
                        ix = MethodIndex(self.file, cls, method, info)
                    every.append(ix)
            self._every = every
        return self._every

    def indexes(self, anywhere: bool) -> list[MethodIndex]:
        return self.every if anywhere else self.training

    def candidates(self, rule: Rule) -> list[MethodIndex]:
        """The indexes of the methods where `rule` may match (see `needs`). The file as a whole is
        asked first: where no pattern of the rule has every op it needs in the methods looked at
        (their names joined), no method has, and none of their indexes is made."""
        common, per_pattern = needs(rule)
        whole = self._whole.get(rule.anywhere)
        if whole is None:
            whole = self._whole[rule.anywhere] = self._file_names(rule.anywhere)
        if not any(whole.may_match(need) for _, need in per_pattern):
            return []
        need = common.names
        return [ix for ix in self.indexes(rule.anywhere) if need <= ix.names and ix.may_match(common)]

    def _file_names(self, anywhere: bool) -> _Names:
        """The op and target names of every method looked at (`indexes(anywhere)`) and of its
        class's layers, joined: what `MethodIndex.names` holds for one method. The methods that are
        not training methods are read from their nodes, without an index each (most files have no
        optimizer, which is what the rules that look at every method ask for)."""
        training = self.training
        if not anywhere:
            return _Names(set().union(*(ix.names for ix in training)), [ix.method for ix in training])
        known = self._whole.get(False)
        if known is None:
            known = self._whole[False] = self._file_names(False)
        names = set(known.names)
        methods = list(known.methods)
        seen = {id(m) for m in methods}
        for cls in self.file.classes:
            for layer in cls.layers:
                for item in (layer, *layer.items):
                    spec = C.LAYER_OPS.get(item.type)
                    if spec is not None:
                        names.add(spec[0])
            for method in cls.methods:
                if id(method) not in seen:
                    methods.append(method)
                    nodes = method.nodes
                    names.update([n.op for n in nodes])
                    names.update([n.target for n in nodes])  # None too, as in MethodIndex.names
        _add_view_names(names)
        return _Names(names, methods)


def iter_indexes(file: FileModel, everywhere: bool = False):
    for cls in file.classes:
        info = None
        for method in (cls.methods if everywhere else training_methods(cls)):
            if info is None:
                info = ClassInfo(cls)
            yield MethodIndex(file, cls, method, info)
