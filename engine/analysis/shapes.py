"""Shape and layout facts over one extracted method: for a tensor value, what the code proves about
its axes.

A value's `Shape` lists its trailing axes, right-aligned (broadcasting aligns from the right, so the
last axes of an elementwise result are the last axes of its operands even when an operand's rank is
unknown), each an `Axis` with an identity that survives transposes, permutes, elementwise ops,
softmax, dropout and casts. `exact` says the list is every axis (the rank is proven). Identities
answer the questions matching asks by meaning: "is this softmax over the key axis?" is "does the
softmax's dimension name the axis that the score product took from its right operand?", whatever
constant spells it (`dim=-1`, `dim=3` of a rank-4 value, `dim=2` after `bmm`).

Facts are proven or absent: an op this module does not understand gives no shape (None), never a
guess. The analysis runs on demand, per value, memoized per method (a match asks about a handful of
values; most methods are never asked).
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass, replace
from functools import lru_cache

from engine.analysis import numbers
from engine.dsl import canonical as C
from engine.dsl.ir import ClassModel, Cond, Const, Method, Node, Operand, Seq, Sym, Var
from engine.extract import package
from engine.extract.imports import Imports

_IDS = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Axis:
    """One axis. `id` is its identity (same id: the same axis, moved); `unit` it is provably size 1."""

    id: int
    unit: bool = False


def fresh(unit: bool = False) -> Axis:
    return Axis(next(_IDS), unit)


@dataclass(frozen=True, slots=True)
class Shape:
    """The trailing axes of a value, left to right; `exact`: they are all of its axes."""

    axes: tuple[Axis, ...]
    exact: bool

    @property
    def rank(self) -> int | None:
        return len(self.axes) if self.exact else None

    def position(self, dim: int) -> int | None:
        """Index into `axes` of dimension `dim` (negative counts from the end), where provable."""
        n = len(self.axes)
        if dim < 0:
            return n + dim if -dim <= n else None
        if not self.exact:
            return None
        return dim if dim < n else None

    def axis(self, dim: int) -> Axis | None:
        i = self.position(dim)
        return None if i is None else self.axes[i]

    def is_last(self, dim: int) -> bool:
        i = self.position(dim)
        return i is not None and i == len(self.axes) - 1


def _int(operand: Operand | None) -> int | None:
    if isinstance(operand, Const) and isinstance(operand.value, int) and not isinstance(operand.value, bool):
        return operand.value
    if isinstance(operand, Sym):
        try:
            value = ast.literal_eval(operand.text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def _axis_items(dim: Operand) -> tuple[Operand, ...]:
    """The axes a reduction's `dim` names, each as an operand: the items of a tuple or list display
    (`(1, 3)`, or `[-1]`, which the extractor keeps as source text where every item is a literal),
    or `dim` itself where it is one axis. A one-item sequence names the same axis as its item."""
    if isinstance(dim, Seq):
        return dim.items
    if isinstance(dim, Const) and isinstance(dim.value, tuple):
        return tuple(Const(v) for v in dim.value)
    if isinstance(dim, Sym) and dim.text.lstrip().startswith(("[", "(")):
        try:
            value = ast.literal_eval(dim.text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return (dim,)
        if isinstance(value, (list, tuple)):
            return tuple(Const(v) for v in value)
    return (dim,)


# ops that keep their (first) input's shape exactly
_SAME_SHAPE = {
    "softmax", "log_softmax", "dropout", "neg", "exp", "sqrt", "rsqrt", "pow", "erf", "gelu", "relu", "silu",
    "tanh", "sigmoid", "scale", "assign", ".to", ".float", ".half", ".bfloat16", ".double", ".type_as", ".type",
    ".contiguous", ".clone", ".detach", ".masked_fill", ".masked_fill_", "masked_fill", ".softmax", ".clamp",
    "torch.clamp", ".abs", "torch.abs", ".exp", "torch.log", ".log", ".sigmoid", "torch.nn.functional.normalize",
    ".requires_grad_", ".float32", ".nan_to_num", "torch.nan_to_num", ".mul_", ".add_", ".div_", ".sub_",
    ".clamp_", ".clamp_min", ".clamp_max", "torch.nn.functional.dropout",
    # norms and activations: the input's shape, axis for axis
    "layer_norm", "rms_norm", "torch.nn.functional.group_norm", "torch.nn.functional.batch_norm",
    "torch.nn.functional.instance_norm", "torch.nn.functional.leaky_relu", "torch.nn.functional.elu",
    "torch.nn.functional.mish", "torch.nn.functional.softplus", "torch.nn.functional.hardswish",
    "torch.nn.functional.relu6", "torch.nn.functional.selu", "torch.nn.functional.hardtanh", ".relu", ".tanh",
    # select, gather, roll or flip along an axis: the same axes (the selected one changes its size)
    ".index_select", "torch.index_select", ".gather", "torch.gather", ".roll", "torch.roll", ".flip", "torch.flip",
}
_NUMBER_ARITHMETIC = {"add", "sub", "mul", "div", "floordiv", "mod", "pow", "neg", "pos"}
# dtype facts: casts, the dtype each named cast gives, and ops that keep a floating-point input's dtype
_NAMED_CASTS = {".float": "torch.float32", ".double": "torch.float64", ".half": "torch.float16",
                ".bfloat16": "torch.bfloat16"}
CASTS = {".to", ".type", ".type_as", *_NAMED_CASTS}
_DTYPE_NAMES = {"torch.float32": "torch.float32", "torch.float": "torch.float32", "torch.float64": "torch.float64",
                "torch.double": "torch.float64", "torch.float16": "torch.float16", "torch.half": "torch.float16",
                "torch.bfloat16": "torch.bfloat16"}
_DTYPE_KEEPING = {"assign", "neg", "exp", "sqrt", "rsqrt", "torch.rsqrt", "torch.sqrt", ".rsqrt", ".sqrt", ".exp",
                  ".detach", ".contiguous", ".clone", ".abs", "mean", ".mean", "var", ".var", ".amax", ".amin",
                  "torch.amax", "torch.amin"}
# shape-keeping ops that give None back (every other raises on None, a method of it too)
_PASSES_NONE = {"assign", "scale"}
# elementwise with broadcasting: every tensor operand aligned from the right
_BROADCAST = {"add", "sub", "mul", "div", "torch.where", "torch.maximum", "torch.minimum", "masked_fill"}
# layers that keep their input's shape, axis for axis (elementwise, or normalizing over some axes)
_SAME_SHAPE_LAYERS = {
    "torch.nn.Dropout", "torch.nn.Dropout1d", "torch.nn.Dropout2d", "torch.nn.Dropout3d", "torch.nn.AlphaDropout",
    "torch.nn.Softmax", "torch.nn.LogSoftmax", "torch.nn.Identity", "torch.nn.GELU", "torch.nn.ReLU", "torch.nn.ReLU6",
    "torch.nn.LeakyReLU", "torch.nn.PReLU", "torch.nn.ELU", "torch.nn.SELU", "torch.nn.CELU", "torch.nn.Mish",
    "torch.nn.Hardswish", "torch.nn.Hardsigmoid", "torch.nn.Hardtanh", "torch.nn.Softplus", "torch.nn.Softsign",
    "torch.nn.SiLU", "torch.nn.Tanh", "torch.nn.Sigmoid", "torch.nn.LayerNorm", "torch.nn.RMSNorm",
    "torch.nn.GroupNorm", "torch.nn.BatchNorm1d", "torch.nn.BatchNorm2d", "torch.nn.BatchNorm3d",
    "torch.nn.InstanceNorm1d", "torch.nn.InstanceNorm2d", "torch.nn.InstanceNorm3d",
}
# transformers' table of activations by name: every entry is an elementwise activation module
_ACTIVATION_TABLES = ("transformers.activations.ACT2FN[",)
MAX_CALL_DEPTH = 3  # calls of the repository's modules followed into, one inside another
# layers that replace the last axis only
_LAST_AXIS_LAYERS = {"torch.nn.Linear", "torch.nn.LazyLinear", "transformers.pytorch_utils.Conv1D"}
_FACTORIES = {"torch.ones", "torch.zeros", "torch.randn", "torch.rand", "torch.empty", "torch.full", "torch.tensor"}
_PARAM_WRAPPERS = {"torch.nn.Parameter", "torch.nn.parameter.Parameter"}
# the rank of `self.weight` that the constructor of a base class makes (`ShapeFacts._inherited_weight`)
_INHERITED_WEIGHT_RANK = {
    **{f"torch.nn.{kind}{n}d": n + 2 for kind in ("Conv", "ConvTranspose", "LazyConv", "LazyConvTranspose")
       for n in (1, 2, 3)},
    "torch.nn.Linear": 2,
}


# reductions over constant dimensions: the input's axes less those reduced, or kept as size 1
_REDUCTIONS = {".amax", ".amin", "torch.amax", ".sum", "sum", "mean", ".mean", ".logsumexp", "torch.logsumexp",
               ".max", ".min", ".norm", "var", ".var", ".std"}
# ops whose result's rank follows from their tensor inputs' (where those are proven): a rank lost
# before one of them is lost at an earlier node
_RANK_FOLLOWS = {
    "transpose", "matmul", ".permute", "torch.permute", ".unsqueeze", "torch.unsqueeze", ".squeeze", "torch.squeeze",
    ".flatten", "torch.flatten", ".unbind", "torch.unbind", ".chunk", ".split", "torch.chunk", "torch.split",
    ".tensor_split", "getitem", ".expand", ".expand_as", ".repeat", "torch.cat", "cat", "torch.concat",
    "torch.concatenate", "torch.stack", *_REDUCTIONS,
}
# ops whose outputs are a tuple of tensors of their own (each output's shape is derived for it; one
# output naming the whole tuple has the shape every item has)
_TUPLE_OPS = {".unbind", "torch.unbind", ".chunk", ".split", "torch.chunk", "torch.split", ".tensor_split",
              "torch.tensor_split"}
_CATS = {"torch.cat", "cat", "torch.concat", "torch.concatenate"}
# in-place methods that change their receiver's shape, and methods that may return their receiver itself
_RESHAPE_IN_PLACE = {".unsqueeze_", ".squeeze_", ".transpose_", ".t_", ".swapdims_", ".swapaxes_", ".resize_",
                     ".resize_as_", ".as_strided_", ".set_"}
_MAY_RETURN_RECEIVER = {"assign", ".contiguous", ".to", ".type", ".type_as", ".float", ".half", ".double",
                        ".bfloat16", ".cuda", ".cpu"}

# products that take operands of one rank only (any other raises): the batched product's are 3-D, the
# plain matrix product's 2-D; the spelling is the node's target (its op is `matmul`)
_OPERAND_RANKS = {"torch.bmm": 3, ".bmm": 3, "torch.mm": 2, ".mm": 2}
# ops whose result has their first input's rank whatever else they are given (no broadcasting
# operand: not `masked_fill`, `clamp` or `scale`, whose other operand may add axes)
_RANK_KEEPING = {
    "assign", ".to", ".float", ".half", ".bfloat16", ".double", ".type_as", ".type", ".contiguous", ".clone",
    ".detach", "softmax", "log_softmax", ".softmax", "dropout", "torch.nn.functional.dropout", "transpose", ".t",
    "torch.t", "neg", "exp", "sqrt", "rsqrt", "erf", "gelu", "relu", "silu", "tanh", "sigmoid", ".exp", ".sigmoid",
    ".relu", ".tanh", ".abs", "torch.abs", ".requires_grad_",
}
# in-place methods that change their tensor's shape: after one, the same name holds another rank
_RESHAPED_IN_PLACE = {".unsqueeze_", ".squeeze_", ".t_", ".transpose_", ".swapaxes_", ".swapdims_", ".resize_",
                      ".resize_as_", ".set_", ".as_strided_"}


_BODIES = ("body", "orelse", "finalbody", "handlers", "cases")


@lru_cache(maxsize=8)
def _shielded_lines(tree: ast.Module) -> tuple[tuple[int, int], ...]:
    """The line ranges of `tree`'s `with` bodies and of `try` bodies with handlers (where an error
    raised could be caught), found once per parsed file for all its methods' facts. Only statement
    bodies are visited: a `with` or `try` is a statement, never inside an expression."""
    ranges = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.With, ast.AsyncWith)) or isinstance(node, (ast.Try, ast.TryStar)) and node.handlers:
            ranges.append((node.body[0].lineno, node.body[-1].end_lineno or node.body[-1].lineno))
        for field in _BODIES:
            block = getattr(node, field, None)
            if isinstance(block, list):
                todo.extend(block)
    return tuple(ranges)


_IN_PLACE_ARITHMETIC = {"add", "sub", "mul", "div"}
_AUGMENTED_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)


@lru_cache(maxsize=8)
def _augmented_statements(tree: ast.Module) -> frozenset[tuple[int, int, int, int]]:
    """Where each `a += b` (`-=`, `*=`, `/=`) statement of `tree` is, found once per parsed file."""
    return frozenset((a.lineno, a.col_offset, a.end_lineno or a.lineno, a.end_col_offset or 0) for a in ast.walk(tree)
                     if isinstance(a, ast.AugAssign) and isinstance(a.op, _AUGMENTED_OPS))


@lru_cache(maxsize=8)
def _assert_tests(tree: ast.Module) -> frozenset[tuple[int, int]]:
    """Where (line, column) the test of each `assert` of `tree` begins, found once per parsed file."""
    return frozenset((a.test.lineno, a.test.col_offset) for a in ast.walk(tree) if isinstance(a, ast.Assert))


class ShapeFacts:
    """The shape facts of one method (and its class's `__init__` for parameters)."""

    def __init__(self, method: Method, cls: ClassModel | None = None, defs: dict[str, Node] | None = None,
                 params: dict[str, Shape] | None = None, calls: tuple[str, ...] = ()) -> None:
        """`params`: the shapes of parameters where a caller's call binds them (a module's `forward`
        analysed for what it returns); `calls`: the module types being followed into, outermost first."""
        self.method = method
        self.cls = cls
        self.defs = defs if defs is not None else method.defs()
        self.params = params or {}
        self.calls = calls
        self._returns: dict[int, Shape | tuple[Shape | None, ...] | None] = {}  # id(layer node) -> its value
        # id(layer node) -> the callee's facts, its `return` operands and the call's operand per parameter
        self._callees: dict[int, tuple[ShapeFacts, list[Operand], dict[str, Operand]]] = {}
        # id(layer node) -> where the proof of the rank its callee returns ends (`rank_lost_at`'s findings)
        self.lost_inside: dict[int, tuple[ShapeFacts, list[Node | Var]]] = {}
        self._memo: dict[str, Shape | None] = {}
        self._attrs: dict[str, Shape | None] | None = None
        self._params: dict[str, Shape | None] = {}  # parameter (and whether None may be passed) -> its shape
        self._unpacks: dict[str, list[Node]] | None = None  # value -> nodes unpacking its whole shape
        self._readers: dict[str, list[Node]] | None = None  # value -> the nodes of the method reading it
        self._demands: dict[str, int | None] = {}  # value -> the rank its uses prove
        self._in_place: dict[str, list[Node]] | None = None  # value -> the in-place calls that may reshape it
        self.contractions: dict[str, tuple[Axis | None, Axis | None]] = {}  # matmul output -> contracted axes

    # -- public questions --------------------------------------------------------------------

    def shape(self, operand: Operand | None) -> Shape | None:
        if isinstance(operand, Var):
            name = operand.name
            if name in self._memo:
                return self._memo[name]
            self._memo[name] = None  # a cycle proves nothing
            if name in self._reshaped_in_place():
                return None
            found = self._demanded(name, self._unpacked(name, self._derive(name)))
            self._memo[name] = found
            return found
        if isinstance(operand, Sym):
            if operand.text.startswith("self."):
                return self.attribute_shape(operand.text)
            return _constructor_shape(operand.text)  # a factory written with constant sizes
        return None

    def _reshaped_in_place(self) -> dict[str, list[Node]]:
        """The values whose shape an in-place method changes somewhere in the method (`k.unsqueeze_(0)`),
        with every value that may be the same tensor object (an assignment, a merge, a method that may
        return its receiver), each with the calls that reshape it: one name holds several shapes, so
        none is proven for any of them."""
        if self._in_place is None:
            self._in_place = {}
            calls = [n for n in self.method.nodes
                     if n.kind == "op" and n.op in _RESHAPE_IN_PLACE and n.inputs and isinstance(n.inputs[0], Var)]
            links: dict[str, set[str]] = {}
            for n in self.method.nodes if calls else ():
                same = n.kind == "phi" or n.kind == "op" and (n.op in _MAY_RETURN_RECEIVER or n.op.endswith("_"))
                reads = [i.name for i in (n.inputs if n.kind == "phi" else n.inputs[:1]) if isinstance(i, Var)]
                for a in reads if same else ():
                    for b in n.outputs:
                        links.setdefault(a, set()).add(b)
                        links.setdefault(b, set()).add(a)
            for call in calls:
                todo, group = [call.inputs[0].name], set()  # type: ignore[union-attr]
                while todo:
                    name = todo.pop()
                    if name not in group:
                        group.add(name)
                        todo += links.get(name, ())
                for name in group:
                    self._in_place.setdefault(name, []).append(call)
        return self._in_place

    def rank(self, operand: Operand | None) -> int | None:
        shape = self.shape(operand)
        return None if shape is None else shape.rank

    def rank_where(self, operand: Operand | None, guard: tuple[Cond, ...]) -> int | None:
        """The rank of `operand` where the branch decisions `guard` hold: its proven rank, else the
        one a decision tests (`if x.dim() == 3:`, `x.ndim == 4`, `len(x.shape) == 3` taken, or the
        `!=` of one not taken) of that very value."""
        rank = self.rank(operand)
        if rank is not None or not isinstance(operand, Var):
            return rank
        taken = {c.id: c.taken for c in guard}
        for node in self.method.nodes:
            cid, test = node.kwarg("if"), node.kwarg("test")
            if node.kind != "phi" or not isinstance(cid, Const) or cid.value not in taken or not isinstance(test, Var):
                continue
            compare = self.defs.get(test.name)
            if compare is None or len(compare.inputs) != 2 or (compare.op, taken[cid.value]) not in (
                    ("compare:eq", True), ("compare:noteq", False)):
                continue
            for counted, number in (compare.inputs, compare.inputs[::-1]):
                if type(_int(number)) is int and self._rank_read(counted) == operand.name:
                    return _int(number)
        return None

    def _rank_read(self, value: Operand) -> str | None:
        """The value whose rank `value` is: `x.dim()`, `x.ndim`, `len(x.shape)`, `len(x.size())`."""
        node = self.defs.get(value.name) if isinstance(value, Var) else None
        if node is None or node.kind != "op" or not node.inputs or not isinstance(node.inputs[0], Var):
            return None
        if node.op == ".dim" and len(node.inputs) == 1 or node.op == "getattr" and node.inputs[1:] == (Const("ndim"),):
            return node.inputs[0].name
        if node.op == "len" and len(node.inputs) == 1:
            inner = self.defs.get(node.inputs[0].name)
            if inner is not None and inner.kind == "op" and inner.inputs and isinstance(inner.inputs[0], Var) and (
                    inner.op == "getattr" and inner.inputs[1:] == (Const("shape"),)
                    or inner.op == ".size" and len(inner.inputs) == 1 and not inner.kwargs):
                return inner.inputs[0].name
        return None

    def axis(self, operand: Operand | None, dim: Operand | None) -> Axis | None:
        """The axis that dimension argument `dim` of `operand` names, where provable."""
        d = _int(dim)
        shape = self.shape(operand)
        if d is None or shape is None:
            return None
        return shape.axis(d)

    def is_last(self, operand: Operand | None, dim: Operand | None) -> bool:
        d = _int(dim)
        if d == -1:
            return True
        shape = self.shape(operand)
        return d is not None and shape is not None and shape.is_last(d)

    def leading_split(self, split: Node, merge: Node) -> tuple[Operand, Operand] | None:
        """The sizes `(a, b)` where view `split` splits the leading axis of its input, of proven rank
        r, in two and keeps the r - 1 others (`x.view(a, b, *rest)`), and view `merge` of what is
        computed from that (`.view(-1, *rest)` or `.view(a * b, *rest)`) merges the two back: a
        round trip that gives x's own axes. A term added between the two is then, in x's layout,
        that term broadcast to (a, b, ...) and its two leading axes flattened (row i of the leading
        axis is (i // b, i % b)); None where the views are not such a pair."""
        rank = self.rank(split.inputs[0] if split.inputs else None)
        outer, inner = self._sizes(split), self._sizes(merge)
        if rank is None or outer is None or inner is None or len(outer) != rank + 1 or len(inner) != rank:
            return None
        if not all(_same_size(a, b) for a, b in zip(outer[2:], inner[1:], strict=True)):
            return None
        first, (a, b) = inner[0], outer[:2]
        if _int(a) == -1 or _int(b) == -1:
            return None  # a size left to infer: the term's broadcast over it has no size to name
        if _int(first) == -1:
            return a, b
        if isinstance(first, Sym) and isinstance(a, Sym) and isinstance(b, Sym):
            product = first.text.replace(" ", "")
            return (a, b) if product in (f"{a.text}*{b.text}".replace(" ", ""), f"{b.text}*{a.text}".replace(" ", "")) \
                else None
        node = self.defs.get(first.name) if isinstance(first, Var) else None
        if node is not None and node.op in ("mul", "scale") and len(node.inputs) == 2 \
                and sorted(map(str, node.inputs)) == sorted(map(str, (a, b))):
            return a, b
        return None

    def swaps_last_two(self, node: Node) -> bool:
        """A transpose node that swaps the last two axes of its input."""
        d0, d1 = _int(node.kwarg("dim0")), _int(node.kwarg("dim1"))
        if d0 is None or d1 is None:
            return False
        if sorted((d0, d1)) == [-2, -1]:
            return True
        shape = self.shape(node.inputs[0]) if node.inputs else None
        if shape is None and node.outputs:
            shape = self.shape(Var(node.outputs[0]))  # (a transpose keeps the rank: its result's, where a use proves it)
        if shape is None:
            return False
        p = sorted(x for x in (shape.position(d0), shape.position(d1)) if x is not None)
        n = len(shape.axes)
        return p == [n - 2, n - 1]

    def rank_lost_at(self, operand: Operand | None) -> list[Node | Var]:
        """Where the proof of `operand`'s rank ends, for a reason to name: following the values its
        rank would come from (every path into a merge, and the inputs of ops whose result's rank
        follows from theirs) back to each node whose result no fact gives a rank (a call of a module
        of unknown type, an attribute read, an op not followed) or parameter of the method (its rank
        is the caller's). Empty where the rank is proven or the operand is no value of this method."""
        found: list[Node | Var] = []
        self._lost(operand, set(), found)
        return found

    def _lost(self, operand: Operand | None, seen: set[str], found: list[Node | Var]) -> None:
        if not isinstance(operand, Var) or operand.name in seen or self.rank(operand) is not None:
            return
        seen.add(operand.name)
        reshaped = self._reshaped_in_place().get(operand.name)
        if reshaped is not None:
            found += [n for n in reshaped if n not in found]
            return
        node = self.defs.get(operand.name)
        if node is None:
            found.append(operand)  # a parameter
            return
        follows = node.kind == "phi" or node.kind == "layer" and node.op in _SAME_SHAPE_LAYERS | _LAST_AXIS_LAYERS \
            or node.kind == "op" and node.op in _RANK_FOLLOWS | _SAME_SHAPE | _BROADCAST
        if not follows:
            inside = self._lost_in_callee(node, operand.name)
            if inside is not None and inside[1] and all(isinstance(x, Var) for x in inside[1]):
                # the callee's result has a rank wherever the arguments it comes from have one: the
                # proof ends before the call
                args = self._callees[id(node)][2]
                if all(x.name in args for x in inside[1]):  # type: ignore[union-attr]
                    for x in inside[1]:
                        self._lost(args[x.name], seen, found)  # type: ignore[union-attr]
                    return
            if inside is not None and inside[1]:
                self.lost_inside[id(node)] = inside
            found.append(node)
            return
        inputs = node.inputs
        if node.kind == "phi" and (picked := self._decided(node)) is not None:
            inputs = (picked,)  # the branch the ranks decide is the only one taken
        elif node.kind == "op" and node.op in _CATS | {"torch.stack"} and inputs and isinstance(inputs[0], Seq):
            inputs = inputs[0].items  # the pieces (one of proven rank would prove the whole's)
        elif node.kind != "phi" and node.op not in _BROADCAST and node.op != "matmul":
            inputs = inputs[:1]  # the tensor the op reads; the rest are dimensions and sizes
        unproven = [i for i in inputs if isinstance(i, Var) and self.rank(i) is None]
        if not unproven:
            found.append(node)  # its inputs' ranks are proven: the op itself leaves the rank unproven
        for i in unproven:
            self._lost(i, seen, found)

    def _lost_in_callee(self, node: Node, output: str) -> tuple[ShapeFacts, list[Node | Var]] | None:
        """Where the proof of the rank ends inside the `forward` of the repository's module that
        `node` calls, for the value `output` names (an item of a returned tuple where the call is
        unpacked); None where the call was not followed into."""
        if node.kind != "layer":
            return None
        self.returned(node)
        if id(node) not in self._callees:
            return None
        inner, values, _ = self._callees[id(node)]
        item = node.outputs.index(output) if len(node.outputs) > 1 else None
        lost: list[Node | Var] = []
        for value in values:
            if isinstance(value, Seq):
                picked = [value.items[item]] if item is not None and item < len(value.items) else list(value.items)
            else:
                picked = [value]
            for x in (x for v in picked for x in inner.rank_lost_at(v)):
                if x not in lost:
                    lost.append(x)
        return inner, lost

    def given_to_constructor(self, node: Node) -> str | None:
        """The parameter of `__init__` that the module `node` calls (or whose method or attribute it
        reads) is, where `__init__` assigns the attribute from that parameter alone (`self.k_norm =
        k_norm`): its type is whatever the code constructing the module passes."""
        target = node.target or node.op  # a call of a module of unknown type is an op named by its attribute
        if node.op == "assign" and node.inputs and isinstance(node.inputs[0], Sym):
            target = node.inputs[0].text  # `self.kv_cache.k_cache`
        attr = target[5:].partition(".")[0] if target is not None and target.startswith("self.") else None
        tree = numbers.tree_of(self.method.pos.file) if self.method.pos is not None else None
        if not attr or not attr.isidentifier() or tree is None or self.cls is None:
            return None
        return numbers.attribute_parameter(tree, self.cls.name, attr)

    def trailing_units(self, operand: Operand | None, count: int) -> bool:
        """The last `count` axes of `operand` are provably size 1 and its rank is proven (so it
        broadcasts as a per-head or per-batch factor, constant along those axes)."""
        shape = self.shape(operand)
        if shape is None or not shape.exact or len(shape.axes) < count:
            return False
        return all(a.unit for a in shape.axes[len(shape.axes) - count:])

    def number(self, operand: Operand | None, none_ok: bool = False, depth: int = 0) -> bool:
        """`operand` is provably a Python number (None too where `none_ok`): a literal, arithmetic of
        numbers, `math.sqrt(...)`, a merge of numbers, or a parameter that engine.analysis.numbers
        proves one (a fused kernel's `scale`, or what every call of a private helper passes)."""
        if isinstance(operand, Const):
            value = operand.value
            return isinstance(value, (int, float, complex)) or (none_ok and value is None)
        if isinstance(operand, Sym):
            return _is_number_text(operand.text) or numbers.math_number_text(operand.text)
        if not isinstance(operand, Var) or depth > 8:
            return False
        node = self.defs.get(operand.name)
        if node is None:
            return self._number_param(operand.name, none_ok)
        if node.kind == "phi":
            return all(self.number(i, none_ok, depth + 1) for i in node.inputs if isinstance(i, Var))
        if node.kind != "op":
            return False
        if node.op == "assign":
            return bool(node.inputs) and self.number(node.inputs[0], none_ok, depth + 1)
        if node.op in _NUMBER_ARITHMETIC:
            # an operand that is None raises: the result is a number wherever there is one
            operands = [*node.inputs, *(v for _, v in node.kwargs)]
            return bool(operands) and all(self.number(o, True, depth + 1) for o in operands)
        return numbers.math_number_text(node.op + "()")

    def single_element(self, operand: Operand | None, depth: int = 0) -> bool:
        """`operand` holds exactly one element, whatever its rank: a parameter `__init__` builds as
        `torch.tensor` of a value proven to have one element (engine.analysis.numbers), under
        shape-keeping methods (`self.temperature.exp()`). Such a factor broadcasts as a constant
        over every axis."""
        if isinstance(operand, Sym):
            return self._attribute_single(operand.text)
        if not isinstance(operand, Var) or depth > 8:
            return False
        node = self.defs.get(operand.name)
        if node is None:
            return False
        if node.op == "?" and node.target and node.target.startswith("self.") and not node.inputs:
            base, _, method = node.target.rpartition(".")
            return ("." + method in _SAME_SHAPE or method in _SAME_SHAPE) and self._attribute_single(base)
        if node.kind == "op" and node.op in _SAME_SHAPE and node.inputs:
            return self.single_element(node.inputs[0], depth + 1)
        return False

    def _attribute_single(self, text: str) -> bool:
        if self.cls is None or self.method.pos is None:
            return False
        defs = [d for d in self.cls.layers if d.attr == text]
        if len(defs) != 1 or defs[0].type not in _PARAM_WRAPPERS or not defs[0].args or defs[0].guard \
                or not isinstance(defs[0].args[0], Sym):
            return False
        tree = numbers.tree_of(self.method.pos.file)
        return tree is not None and numbers.constructor_single_element(tree, self.cls.name, defs[0].args[0].text)

    def _number_param(self, name: str, none_ok: bool) -> bool:
        method = self.method
        if not any(p.name == name and p.kind in ("normal", "kwonly") for p in method.params):
            return False
        if none_ok and any((n.op in numbers.SCALE_FLOAT_KERNELS or n.target in numbers.SCALE_FLOAT_KERNELS)
                           and n.kwarg("scale") == Var(name) for n in method.nodes):
            return True  # the fused kernel's own scale: `float | None`
        tree = numbers.tree_of(method.pos.file) if method.pos is not None and self.cls is not None else None
        if tree is None or self.cls is None:
            return False
        values = numbers.call_site_values(tree, self.cls.name, method.name, name)
        return bool(values) and all(numbers.ast_number(v, none_ok) for v in values)  # type: ignore[union-attr]

    def trailing_axes(self, dim: Operand | None) -> tuple[Operand, tuple[Node, ...]] | None:
        """The sequence N where `dim` is a tuple of axes computed at run time that is provably the
        last len(N) axes, in any order and each once (`tuple(range(-1, -len(N) - 1, -1))`,
        `tuple(-(i + 1) for i in range(len(N)))`): the normalized shape of a norm over them. The
        tuple's value depends on len(N) alone, and is checked as the axes -len(N) .. -1 for every
        length from 1 to 8 (its bounds are affine in the length, so agreeing there is agreeing for
        every length). With N come the nodes that compute the tuple. None where that is not proven."""
        if not isinstance(dim, (Var, Sym)):
            return None
        lens: list[Operand] = []
        for k in range(1, 9):
            evaluation = _Lengths(self.defs, k, lens)
            try:
                value = evaluation.value(dim)
            except _NotProven:
                return None
            if not isinstance(value, (tuple, list)) or sorted(value) != list(range(-k, 0)):
                return None
        names = {_operand_key(n) for n in lens}
        return (lens[0], tuple(evaluation.nodes.values())) if len(names) == 1 else None

    def constant_axes(self, dim: Operand | None) -> tuple[tuple[int, ...], tuple[Node, ...]] | None:
        """(the axes, the assignments that hold them) where `dim` is an integer constant or a tuple
        or list of them (`(1, 3)`, `[-1]`), written out or held by a local variable (`stat_dim =
        (1, 3)`), each axis once; None where it is not that."""
        held: list[Node] = []
        while isinstance(dim, Var) and len(held) < 20:
            node = self.defs.get(dim.name)
            if node is None or node.kind != "op" or node.op != "assign" or len(node.inputs) != 1:
                return None
            held.append(node)
            dim = node.inputs[0]
        if dim is None or isinstance(dim, Var):
            return None
        items = _axis_items(dim)
        if not all(isinstance(i, Const) for i in items):
            return None
        values = tuple(i.value for i in items)  # type: ignore[union-attr]
        if not values or any(not isinstance(v, int) or isinstance(v, bool) for v in values) \
                or len(set(values)) != len(values):
            return None
        return values, tuple(held)

    def int_attribute(self, operand: Operand | None) -> frozenset[int] | None:
        """The integers `operand` can be where it is an attribute of the module (`self.dim`, or a
        variable assigned from it) that engine.analysis.numbers proves holds an integer: set once in
        `__init__` from integer arithmetic of constants and parameters that every construction in
        the file passes integer literals for (or leaves to integer defaults). None where that is not
        proven."""
        text = self.attribute_of(operand)
        if text is None or self.cls is None or self.method.pos is None:
            return None
        tree = numbers.tree_of(self.method.pos.file)
        return numbers.attribute_int_values(tree, self.cls.name, text[5:]) if tree is not None else None

    def asserted_single(self, node: Node) -> tuple[Operand, tuple[Node, ...]] | None:
        """(N, the assert's nodes) where an `assert len(N) == 1` (or of a variable holding len(N)),
        earlier in the method on a path that `node`'s path lies on, proves that N has one element
        wherever `node` runs; None where there is none."""
        tree = numbers.tree_of(self.method.pos.file) if self.method.pos is not None else None
        if tree is None or node.pos is None:
            return None
        tests = _assert_tests(tree)
        here = {(c.id, c.taken) for c in node.guard}
        for other in self.method.nodes:
            if other.op != "compare:eq" or other.pos is None or other.via != node.via or len(other.inputs) != 2 \
                    or (other.pos.line, other.pos.col) not in tests or not {(c.id, c.taken) for c in other.guard} <= here \
                    or (other.pos.line, other.pos.col) >= (node.pos.line, node.pos.col):
                continue
            length, one = other.inputs
            if one != Const(1):
                length, one = one, length
            counted = self.defs.get(length.name) if isinstance(length, Var) else None
            if one == Const(1) and counted is not None and counted.op == "len" and len(counted.inputs) == 1:
                return counted.inputs[0], (counted, other)
        return None

    def attribute_of(self, operand: Operand | None) -> str | None:
        """`self.<name>` where `operand` is that attribute, or a variable assigned from it."""
        depth = 0
        while isinstance(operand, Var) and depth < 20:
            node = self.defs.get(operand.name)
            if node is None or node.kind != "op" or node.op != "assign" or len(node.inputs) != 1:
                return None
            operand = node.inputs[0]
            depth += 1
        if not isinstance(operand, Sym) or not operand.text.startswith("self."):
            return None
        return operand.text if operand.text[5:].isidentifier() else None

    # -- dtype facts -------------------------------------------------------------------------

    def dtype(self, operand: Operand | None, depth: int = 0) -> str | None:
        """What the dtype of floating-point tensor `operand` provably is, as a key: `@x` for the dtype
        of `x`, a value whose dtype is not derived here (a parameter), or the dtype's own name
        (`torch.float32`) after a cast to it. Elementwise math with Python numbers, on tensors of one
        dtype, and reductions keep a floating-point dtype. None where it is not proven."""
        if not isinstance(operand, Var) or depth > 24:
            return None
        node = self.defs.get(operand.name)
        if node is None:
            return f"@{operand.name}" if any(p.name == operand.name for p in self.method.params) else None
        first = node.inputs[0] if node.inputs else None
        if node.kind == "phi":
            keys = {self.dtype(i, depth + 1) for i in node.inputs}
            return keys.pop() if len(keys) == 1 else None
        if node.kind != "op":
            return None
        op = node.op
        if op in CASTS:
            return self.cast_dtype(node)
        if op in _DTYPE_KEEPING or (op == "pow" and self.number(node.inputs[1] if len(node.inputs) > 1
                                                                    else node.kwarg("exponent"))):
            return self.dtype(first, depth + 1)
        if op in ("add", "sub", "mul", "div"):
            tensors = [i for i in node.inputs if not self.number(i)]
            keys = {self.dtype(i, depth + 1) for i in tensors}
            return keys.pop() if len(keys) == 1 and tensors else None
        return None

    def cast_dtype(self, node: Node) -> str | None:
        """The dtype a cast node (`.to(dtype)`, `.type(dtype)`, `.type_as(y)`, `.float()`) casts to."""
        if node.op in _NAMED_CASTS:
            return _NAMED_CASTS[node.op] if len(node.inputs) == 1 and not node.kwargs else None
        if len(node.inputs) != 2 or node.kwargs:
            return None
        target = node.inputs[1]
        if node.op == ".type_as":
            return self.dtype(target)
        if isinstance(target, Sym):
            return _DTYPE_NAMES.get(target.text)
        producer = self.defs.get(target.name) if isinstance(target, Var) else None
        if producer is not None and producer.op == "getattr" and producer.inputs[1:] == (Const("dtype"),):
            return self.dtype(producer.inputs[0])
        return None

    def identity_cast(self, node: Node) -> bool:
        """`node` casts a value to the dtype it provably has already: it changes nothing."""
        if node.kind != "op" or node.op not in CASTS or not node.inputs:
            return False
        to = self.cast_dtype(node)
        return to is not None and to == self.dtype(node.inputs[0])

    # -- derivation ------------------------------------------------------------------------

    def _derive(self, name: str) -> Shape | None:
        node = self.defs.get(name)
        if node is not None and node.kind == "layer" and len(node.outputs) > 1:
            # `k, k_thw = self.pool_k(k, thw)`: the items of the tuple the module's forward returns
            items = self.returned(node)
            if not isinstance(items, tuple) or len(items) != len(node.outputs):
                return None
            return items[node.outputs.index(name)]
        shape = self._derive_value(name)
        if shape is None or node is None or len(node.outputs) < 2 or node.op in _TUPLE_OPS or node.kind == "phi":
            return shape
        # `q, k, v = x.permute(2, 0, 3, 1, 4)`: unpacking a tensor iterates over its first axis (the
        # trailing axes known of a value of unknown rank stay as they are)
        if not shape.exact:
            return shape
        return Shape(shape.axes[1:], True) if shape.axes else None

    def _demanded(self, name: str, shape: Shape | None) -> Shape | None:
        """`shape`, its rank proven where a use of the value raises on any other rank (`demanded_rank`;
        with more axes than the use takes, the use raises wherever the code runs)."""
        if shape is not None and shape.exact:
            return shape
        rank = self.demanded_rank(name)
        return shape if rank is None else _with_rank(shape, rank)

    def demanded_rank(self, name: str) -> int | None:
        """The rank that the uses of value `name` prove it has: `torch.bmm` raises unless given 3-D
        operands (`torch.mm` 2-D), so wherever a `bmm` of the value runs the value is 3-D; through ops
        that keep their input's rank (casts, softmax, dropout, transposes, shape-keeping and linear
        layers) the rank demanded of their result is their input's, and `x.unsqueeze(d)` demanded of
        rank r proves x of rank r - 1 (`torch.bmm(q.unsqueeze(1), m)`: q is 2-D). Like an unpacking
        of the shape (`_unpacked`) this holds wherever the value is defined only where each use on the
        way runs on every path that defines the value (its branch decisions are among the
        definition's) outside any `try` with handlers or `with` block, and no in-place method changes
        a shape on the way (`x.unsqueeze_(0)`). A value demanded of two ranks raises on every path:
        no fact."""
        if name in self._demands:
            return self._demands[name]
        self._demands[name] = None  # a cycle proves nothing
        definition = self.defs.get(name)
        decided = frozenset((c.id, c.taken) for c in definition.guard) if definition is not None else frozenset()
        found = self._rank_of_uses(name, decided, 0)
        self._demands[name] = found
        return found

    def _rank_of_uses(self, name: str, decided: frozenset[tuple[int, bool]], depth: int) -> int | None:
        if depth > 12:
            return None
        readers = self._readers_of(name)
        if any(u.op in _RESHAPED_IN_PLACE for u in readers):
            return None
        ranks: set[int] = set()
        for use in readers:
            if not {(c.id, c.taken) for c in use.guard} <= decided or not self._raises_uncaught(use):
                continue
            if use.kind == "op" and use.op == "matmul" and use.target in _OPERAND_RANKS \
                    and Var(name) in use.inputs[:2]:
                ranks.add(_OPERAND_RANKS[use.target])
                continue
            if len(use.outputs) != 1 or not use.inputs or use.inputs[0] != Var(name):
                continue
            keeps = use.kind == "op" and use.op in _RANK_KEEPING or use.kind == "layer" and len(use.inputs) == 1 \
                and not use.kwargs and (use.op in _SAME_SHAPE_LAYERS | _LAST_AXIS_LAYERS) and self._one_type(use)
            added = use.kind == "op" and use.op in (".unsqueeze", "torch.unsqueeze")
            if not keeps and not added:
                continue
            rank = self._rank_of_uses(use.outputs[0], decided, depth + 1)
            if rank is not None:
                ranks.add(rank - 1 if added else rank)
        return ranks.pop() if len(ranks) == 1 else None

    def _readers_of(self, name: str) -> list[Node]:
        if self._readers is None:
            self._readers = {}
            for node in self.method.nodes:
                for read in dict.fromkeys(node.data_inputs):
                    self._readers.setdefault(read, []).append(node)
        return self._readers.get(name, [])

    def _raises_uncaught(self, node: Node) -> bool:
        """An error `node` raises reaches the method's caller: the node (and each call it was inlined
        through) is in the method's file, outside any `try` with handlers and any `with` block."""
        tree = numbers.tree_of(self.method.pos.file) if self.method.pos is not None else None
        if tree is None or node.pos is None or any(p.file != self.method.pos.file for p in (node.pos, *node.via)):
            return False
        shielded = _shielded_lines(tree)
        return not any(a <= p.line <= b for a, b in shielded for p in (node.pos, *node.via))

    def _augmented(self, node: Node) -> bool:
        """`node` is the arithmetic of an augmented assignment (`scores += bias`) of the method's file."""
        pos = node.pos
        if pos is None or self.method.pos is None or pos.file != self.method.pos.file:
            return False
        tree = numbers.tree_of(pos.file)
        return tree is not None and (pos.line, pos.col, pos.end_line, pos.end_col) in _augmented_statements(tree)

    def _one_type(self, node: Node) -> bool:
        """The module a layer node calls is built as its type, and as no other, on every path of
        `__init__` (a construction under a condition may leave another module there: `self.rotate =
        nn.Linear(...)` if a flag is set, a lambda otherwise)."""
        defs = self.cls.layer_defs(node.target) if self.cls is not None and node.target is not None else ()
        return bool(defs) and all(d.type == node.op for d in defs) and any(not d.guard for d in defs)

    def _decided(self, phi: Node) -> Operand | None:
        """The input a branch merge takes where its test is decided by proven ranks (`if x.dim() ==
        3: x = x.unsqueeze(1)` of an x proven 4-D merges x as it was); None where it is not."""
        test, cond = phi.kwarg("test"), phi.kwarg("if")
        if not isinstance(test, Var) or cond is None or len(phi.inputs) != 2:
            return None
        truth = self._truth(test, 0)
        return None if truth is None else phi.inputs[0 if truth else 1]

    def _truth(self, operand: Operand, depth: int) -> bool | None:
        """The value of a branch test that compares ranks and integer constants, where proven."""
        node = self.defs.get(operand.name) if isinstance(operand, Var) else None
        if node is None or node.kind != "op" or node.kwargs or depth > 12:
            return None
        if node.op == "not" and len(node.inputs) == 1:
            truth = self._truth(node.inputs[0], depth + 1)
            return None if truth is None else not truth
        if node.op in ("and", "or") and node.inputs:
            values = [self._truth(i, depth + 1) for i in node.inputs]
            decisive = node.op == "or"  # a True decides `or`, a False decides `and`
            if decisive in values:
                return decisive
            return None if None in values else not decisive
        compare = _COMPARISONS.get(node.op)
        if compare is None or len(node.inputs) != 2:
            return None
        a, b = (self._static_int(i, depth + 1) for i in node.inputs)
        return None if a is None or b is None else compare(a, b)

    def _dim(self, operand: Operand | None) -> int | None:
        """A dimension argument's value: a literal, or a value the code provably computes (an inlined
        helper's parameter bound to one, `x.dim() - 1`)."""
        return None if operand is None else self._static_int(operand, 0)

    def _static_int(self, operand: Operand, depth: int) -> int | None:
        """An integer that `operand` provably is: a literal, integer arithmetic of such, or the rank of
        a tensor read as `x.dim()`, `x.ndim`, `x.ndimension()` or `len(x.shape)` where it is proven."""
        if isinstance(operand, (Const, Sym)):
            return _int(operand)
        node = self.defs.get(operand.name) if isinstance(operand, Var) else None
        if node is None or node.kind != "op" or node.kwargs or depth > 12:
            return None
        args = node.inputs
        if node.op in (".dim", ".ndimension") and len(args) == 1:
            return self.rank(args[0])
        if node.op == "getattr" and args[1:] == (Const("ndim"),):
            return self.rank(args[0])
        if node.op == "len" and len(args) == 1 and isinstance(args[0], Var):
            read = self.defs.get(args[0].name)
            whole = read is not None and (read.op == "getattr" and read.inputs[1:] == (Const("shape"),)
                                          or read.op == ".size" and len(read.inputs) == 1 and not read.kwargs)
            return self.rank(read.inputs[0]) if whole else None  # type: ignore[union-attr]
        values = [self._static_int(a, depth + 1) for a in args]
        if None in values:
            return None
        if node.op == "assign" and len(values) == 1:
            return values[0]
        if node.op == "neg" and len(values) == 1:
            return -values[0]  # type: ignore[operator]
        if node.op in _INT_OPS and len(values) == 2:
            return _INT_OPS[node.op](*values)
        return None

    def _unpacked(self, name: str, shape: Shape | None) -> Shape | None:
        """`shape`, its rank proven where the code unpacks the value's shape into names (`b, h, n, d
        = x.shape`, `length, batch, size = x.size()`): that raises unless the value has exactly that
        many axes, so it has them wherever the unpacking runs on every path that defines the value
        (its branch decisions are among the definition's: no early return nor branch skips it), and
        outside any `try` with handlers or `with` block (which could catch the error)."""
        if shape is not None and shape.exact:
            return shape
        if self._unpacks is None:
            self._unpacks = {}
            tree = numbers.tree_of(self.method.pos.file) if self.method.pos is not None else None
            shielded = [] if tree is None else _shielded_lines(tree)
            for node in self.method.nodes:
                whole = (node.op == "getattr" and node.inputs[1:] == (Const("shape"),)) or (
                    node.op == ".size" and len(node.inputs) == 1 and not node.kwargs)
                sites = [p.line for p in (node.pos, *node.via) if p is not None]
                if tree is None or node.kind != "op" or not whole or len(node.outputs) < 2 or node.pos is None \
                        or any(p.file != self.method.pos.file for p in (node.pos, *node.via)) \
                        or not isinstance(node.inputs[0], Var) or any(a <= line <= b for a, b in shielded for line in sites):
                    continue
                self._unpacks.setdefault(node.inputs[0].name, []).append(node)
        definition = self.defs.get(name)
        decided = {(c.id, c.taken) for c in definition.guard} if definition is not None else set()
        ranks = {len(u.outputs) for u in self._unpacks.get(name, ()) if {(c.id, c.taken) for c in u.guard} <= decided}
        if len(ranks) != 1:
            return shape
        rank = ranks.pop()
        if shape is None:
            return Shape(tuple(fresh() for _ in range(rank)), True)
        if len(shape.axes) > rank:
            return shape  # the unpacking raises wherever the code runs
        return Shape(tuple(fresh() for _ in range(rank - len(shape.axes))) + shape.axes, True)

    def _derive_value(self, name: str) -> Shape | None:
        node = self.defs.get(name)
        if node is None:
            # a parameter: the shape the caller being followed passes (`returned`), else the one
            # every call of a private helper passes
            return self.params[name] if name in self.params else self.param_shape(name)
        if node.kind == "phi":
            picked = self._decided(node)
            if picked is not None:
                return self.shape(picked)
            return _join([self.shape(i) for i in node.inputs if isinstance(i, Var)])
        if node.op == "?" and node.target and node.target.startswith("self.") and not node.inputs:
            # `self.temperature.exp()` (an unknown callee to the extractor): a shape-keeping method of
            # a parameter built in `__init__`
            base, _, method = node.target.rpartition(".")
            return self.attribute_shape(base) if "." + method in _SAME_SHAPE or method in _SAME_SHAPE else None
        if node.kind == "layer":
            return self._layer(node)
        if node.kind != "op":
            return None
        op = node.op
        first = node.inputs[0] if node.inputs else None
        if op == "assign" and isinstance(first, Const) and isinstance(first.value, (int, float)) \
                and not isinstance(first.value, bool):
            return Shape((), True)  # a Python number: broadcasts as a 0-d value
        if op == "transpose":
            return self._transpose(node)
        if op in (".t", "torch.t") and len(node.inputs) == 1:
            # `.t()` takes at most 2-D values: a 2-D one's axes swapped, a 0-d or 1-D one as it is
            shape = self.shape(first)
            if shape is None or not shape.exact or len(shape.axes) > 2:
                return None
            return Shape(tuple(reversed(shape.axes)), True)
        if op in _SAME_SHAPE:
            if op not in _PASSES_NONE and isinstance(first, Var) and first.name not in self.defs \
                    and first.name not in self.params:
                return self.param_shape(first.name, none_ok=True)  # on None it raises: it computes nothing
            return self.shape(first)
        if op in _IN_PLACE_ARITHMETIC and self._augmented(node):
            # `scores += bias` writes into `scores`: its shape stays, whatever the right side's rank
            # (one that does not broadcast to it raises)
            left = self.shape(first)
            if left is not None and left.exact and left.axes:
                return left
        if op in _BROADCAST:
            return self._broadcast(node)
        if op == "matmul":
            return self._matmul(node, name)
        if op in (".permute", "torch.permute"):
            return self._permute(node)
        if op in (".view", ".reshape", "torch.reshape"):
            return self._reshape(node)
        if op in (".unsqueeze", "torch.unsqueeze"):
            return self._unsqueeze(node)
        if op in (".squeeze", "torch.squeeze"):
            return self._squeeze(node)
        if op in (".flatten", "torch.flatten"):
            return self._flatten(node)
        if op == ".unflatten":
            return self._unflatten(node)
        if op in (".unbind", "torch.unbind"):
            return self._unbind(node)
        if op in (".chunk", ".split", "torch.chunk", "torch.split", ".tensor_split", "torch.tensor_split"):
            return self._chunk(node)
        if op in _REDUCTIONS:
            return self._reduce(node, name)
        if op == "getitem":
            return self._getitem(node)
        if op == "getattr" and len(node.inputs) == 2 and node.inputs[1] in (Const("values"), Const("indices")):
            return self.shape(first)  # `x.max(dim, keepdim).values`
        if op in (".expand", ".expand_as", ".repeat"):
            return self._expand(node)
        if op in _CATS:
            return self._cat(node)
        if op == "torch.stack":
            return self._stack(node)
        if op in C.EINSUM_FUNCTIONS:
            return self._einsum(node)
        if op in ("einops.rearrange", "einops.repeat"):
            return self._rearrange(node)
        if op == "torch.full":  # torch.full(size, fill_value): only the first argument is the size
            return _factory_shape(node.inputs[:1], node.kwargs)
        if op == "torch.tensor":  # the data's shape: a number is 0-d; anything else is not followed
            data = node.inputs[0] if node.inputs else None
            number = isinstance(data, Const) and isinstance(data.value, (int, float)) and not isinstance(data.value, bool)
            return Shape((), True) if number or isinstance(data, Sym) and _is_number_text(data.text) else None
        if op in _FACTORIES:
            return _factory_shape(node.inputs, node.kwargs)
        return None

    def _layer(self, node: Node) -> Shape | None:
        first = node.inputs[0] if node.inputs else None
        if self.cls is not None and node.target is not None \
                and any(d.type != node.op for d in self.cls.layer_defs(node.target)):
            return None  # `__init__` builds the attribute as modules of other types on other paths
        if node.op in _SAME_SHAPE_LAYERS or node.op.startswith(_ACTIVATION_TABLES):
            return None if len(node.inputs) != 1 or node.kwargs else self.shape(first)
        if node.op in _LAST_AXIS_LAYERS:
            shape = self.shape(first)
            if shape is None or not shape.axes:
                return None
            return Shape(shape.axes[:-1] + (fresh(),), shape.exact)
        value = self.returned(node)
        if value is None and self.method.pos is not None and "." in node.op and node.op not in self.calls:
            # `self.act = get_activation(name)`: a function of the repository returning modules of
            # these types, each of which keeps the shape (or whose forward proves it)
            types = getter_types(self.method.pos.file, node.op)
            if types:
                value = _join([self.shape(first) if t in _SAME_SHAPE_LAYERS and len(node.inputs) == 1 and not node.kwargs
                               else self.returned(replace(node, op=t)) for t in types])
        return value if isinstance(value, Shape) else None

    def returned(self, node: Node) -> Shape | tuple[Shape | None, ...] | None:
        """What a call of a module whose class the repository defines returns (a tensor's shape, or
        the shapes of the items of a tuple), from its `forward` analysed with the shapes of the
        call's arguments bound to its parameters: every `return` agreeing. None where the class is
        not found, defines `__call__`, or the call binds arguments that are not followed (`*args`)."""
        key = id(node)
        if key in self._returns:
            return self._returns[key]
        self._returns[key] = None  # a call reached again while being analysed proves nothing
        found = self._returned(node)
        self._returns[key] = found
        return found

    def _returned(self, node: Node) -> Shape | tuple[Shape | None, ...] | None:
        if len(self.calls) >= MAX_CALL_DEPTH or node.op in self.calls or self.method.pos is None or "." not in node.op:
            return None
        callee = callee_class(self.method.pos.file, node.op)
        forward = callee.method("forward") if callee is not None else None
        if callee is None or forward is None or callee.method("__call__") is not None \
                or any(n.kind == "yield" for n in forward.nodes):
            return None
        positional = [p for p in forward.params if p.kind == "normal"]
        named = {p.name: p for p in forward.params if p.kind in ("normal", "kwonly")}
        operands = [*zip(positional, node.inputs, strict=False)]
        if len(node.inputs) > len(positional) or any(k not in named for k, _ in node.kwargs):
            return None
        operands += [(named[k], v) for k, v in node.kwargs]
        if any(isinstance(o, Sym) and o.text.startswith("*") or isinstance(o, Var) and (d := self.defs.get(o.name))
               is not None and d.op == "starred" for _, o in operands):
            return None
        seeds = {p.name: s for p, o in operands if (s := self.shape(o)) is not None}
        inner = ShapeFacts(forward, callee, params=seeds, calls=(*self.calls, node.op))
        values = [n.inputs[0] if n.inputs else Const(None) for n in forward.nodes if n.kind == "return"]
        self._callees[id(node)] = (inner, values, {p.name: o for p, o in operands})
        if not values:
            return None
        if all(isinstance(v, Seq) for v in values):
            widths = {len(v.items) for v in values}  # type: ignore[union-attr]
            if len(widths) != 1:
                return None
            return tuple(_join([inner.shape(v.items[i]) for v in values])  # type: ignore[union-attr]
                         for i in range(widths.pop()))
        if all(isinstance(v, Var) for v in values):
            return _join([inner.shape(v) for v in values])
        return None

    def _transpose(self, node: Node) -> Shape | None:
        d0, d1 = self._dim(node.kwarg("dim0")), self._dim(node.kwarg("dim1"))
        if d0 is None or d1 is None:
            return None
        shape = self.shape(node.inputs[0]) if node.inputs else None
        if shape is None:
            if d0 < 0 and d1 < 0:
                # transpose(-a, -b) proves at least max(a, b) axes
                shape = Shape(tuple(fresh() for _ in range(max(-d0, -d1))), False)
            else:
                return None
        i, j = shape.position(d0), shape.position(d1)
        if i is None or j is None:
            if d0 < 0 and d1 < 0:
                pad = max(-d0, -d1) - len(shape.axes)
                shape = Shape(tuple(fresh() for _ in range(pad)) + shape.axes, False)
                i, j = shape.position(d0), shape.position(d1)
            if i is None or j is None:
                return None
        axes = list(shape.axes)
        axes[i], axes[j] = axes[j], axes[i]
        return Shape(tuple(axes), shape.exact)

    def _broadcast(self, node: Node) -> Shape | None:
        operands = [o for o in node.inputs if not isinstance(o, Const)]
        if node.op == "torch.where":
            operands = operands[1:] + operands[:1]  # the values first: their axes name the result's
        shapes: list[Shape | None] = []
        for o in operands:
            if isinstance(o, Sym) and _is_number_text(o.text):
                continue
            shapes.append(self.shape(o))
        known = [s for s in shapes if s is not None]
        if not known:
            return None
        exact = len(known) == len(shapes) and all(s.exact for s in known)
        width = max(len(s.axes) for s in known)
        if not exact and len(known) == len(shapes):
            exact = self._broadcast_rank_proven([o for o in operands if not (isinstance(o, Sym) and _is_number_text(o.text))])
        axes: list[Axis] = []
        for k in range(width, 0, -1):  # trailing position k (1 = last)
            here = [s.axes[len(s.axes) - k] for s in known if len(s.axes) >= k]
            non_unit = [a for a in here if not a.unit]
            if not non_unit:
                # every operand known here is size 1; a missing (unknown) operand could be larger
                axes.append(here[0] if exact else Axis(here[0].id, False))
            else:
                axes.append(non_unit[0])
        return Shape(tuple(axes), exact)

    def _broadcast_rank_proven(self, operands: list[Operand]) -> bool:
        """The result's rank is proven even though an operand is one of several values (`ef = 0` on
        one branch, a 4-D einsum on the other): every alternative is exact and one operand has the
        largest rank on every path."""
        alternatives: list[list[Shape | None]] = []
        for o in operands:
            node = self.defs.get(o.name) if isinstance(o, Var) else None
            if node is not None and node.kind == "phi" and self._decided(node) is None:
                alternatives.append([self.shape(i) for i in node.inputs if isinstance(i, Var)])
            else:
                alternatives.append([self.shape(o)])
        if any(s is None or not s.exact for alts in alternatives for s in alts):
            return False
        top = max(len(s.axes) for alts in alternatives for s in alts)  # type: ignore[union-attr]
        return any(all(len(s.axes) == top for s in alts) for alts in alternatives)  # type: ignore[union-attr]

    def _matmul(self, node: Node, name: str) -> Shape | None:
        if len(node.inputs) < 2:
            return None
        left, right = self.shape(node.inputs[0]), self.shape(node.inputs[1])
        rank = _OPERAND_RANKS.get(node.target or "")
        if rank is not None:  # `torch.bmm` raises unless both operands are 3-D: where it runs they are
            left, right = _with_rank(left, rank), _with_rank(right, rank)
        if right is None:
            spec = _einsum_rank(node, Shape((), False))  # an einsum's spec alone proves the rank
            return spec if spec.exact else None
        if len(right.axes) < 2:
            return None  # a 1-D right operand contracts away the last axis: nothing proven
        col = right.axes[-1]
        if left is None or len(left.axes) < 2:
            if left is not None and left.exact and len(left.axes) == 1:
                return None
            # the left operand may be 1-D (then the result has no row axis): only the last axis is proven
            self.contractions[name] = (left.axes[-1] if left else None, right.axes[-2])
            return _einsum_rank(node, Shape((col,), False))
        self.contractions[name] = (left.axes[-1], right.axes[-2])
        return _einsum_rank(node, self._matmul_axes(left, right))

    def _matmul_axes(self, left: Shape, right: Shape) -> Shape:
        batch_l, batch_r = left.axes[:-2], right.axes[:-2]
        width = max(len(batch_l), len(batch_r))
        batch: list[Axis] = []
        for k in range(width, 0, -1):
            a = batch_l[len(batch_l) - k] if len(batch_l) >= k else None
            b = batch_r[len(batch_r) - k] if len(batch_r) >= k else None
            pick = a if a is not None and not (a.unit and b is not None) else b
            batch.append(pick if pick is not None else fresh())
        return Shape((*batch, left.axes[-2], right.axes[-1]), left.exact and right.exact)

    def _sizes(self, node: Node) -> tuple[Operand, ...] | None:
        args = node.inputs[1:]
        if node.op == "torch.reshape" and len(args) == 1:
            pass
        if len(args) == 1 and isinstance(args[0], Seq):
            return self._one_each(args[0].items)
        if len(args) == 1 and isinstance(args[0], Const) and isinstance(args[0].value, tuple):
            return tuple(Const(v) for v in args[0].value)
        if len(args) == 1 and isinstance(args[0], Var):
            shape = self.defs.get(args[0].name)
            if shape is not None and shape.op == "assign" and shape.inputs and isinstance(shape.inputs[0], Seq):
                return self._one_each(shape.inputs[0].items)  # `shape = (a, b, c)` just before `.view(shape)`
            return None
        if len(args) == 1 and isinstance(args[0], Sym):
            return _sym_sequence(args[0].text)
        if not args or any(isinstance(a, Seq) for a in args):
            return None
        if any(isinstance(a, Var) and (d := self.defs.get(a.name)) is not None and d.op in ("add", "starred")
               for a in args):
            return None  # `x.view(x.size()[:-1] + (h, d))`, `x.view(*x.shape[:2], -1)`: one argument may be several sizes
        if len(args) == 1 and not isinstance(args[0], Const):
            return None  # `.view(shape)` of a size object, or `*shape`
        return args

    def _one_each(self, items: tuple[Operand, ...]) -> tuple[Operand, ...] | None:
        """The items of a listed shape, None where one spreads several (`(*x.shape[:2], h, d)`)."""
        if any(isinstance(a, Var) and (d := self.defs.get(a.name)) is not None and d.op == "starred" for a in items):
            return None
        return items

    def _permute(self, node: Node) -> Shape | None:
        dims = self._sizes(node)
        if dims is None:
            return None
        order = [_int(d) for d in dims]
        if any(d is None for d in order):
            return None
        n = len(order)
        norm = [d + n if d < 0 else d for d in order]  # type: ignore[operator]
        if sorted(norm) != list(range(n)):
            return None
        shape = self.shape(node.inputs[0])
        if shape is None or not shape.exact or len(shape.axes) != n:
            if shape is not None and shape.exact and len(shape.axes) != n:
                return None
            base = shape.axes if shape is not None and len(shape.axes) == n else tuple(fresh() for _ in range(n))
            if shape is not None and not shape.exact and len(shape.axes) <= n:
                base = tuple(fresh() for _ in range(n - len(shape.axes))) + shape.axes
            return Shape(tuple(base[d] for d in norm), True)
        return Shape(tuple(shape.axes[d] for d in norm), True)

    def _reshape(self, node: Node) -> Shape | None:
        sizes = self._sizes(node)
        if sizes is None:
            return None
        if any(isinstance(s, Sym) and s.text.startswith("*") for s in sizes):
            return None
        # new axes (a size read from the input's own shape could keep that axis; not tracked), size-1 known
        axes = [fresh(unit=_int(size) == 1) for size in sizes]
        return Shape(tuple(axes), True)

    def _unsqueeze(self, node: Node) -> Shape | None:
        d = self._dim(node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim"))
        shape = self.shape(node.inputs[0])
        demanded = self.demanded_rank(node.outputs[0]) if shape is None and node.outputs else None
        if demanded is not None and demanded >= 1:
            # an expression not followed (`self.state.unsqueeze(2)`) of a result whose rank a use proves
            shape = Shape(tuple(fresh() for _ in range(demanded - 1)), True)
        if d is None or shape is None:
            return None
        return _inserted(shape, d, fresh(unit=True))

    def _squeeze(self, node: Node) -> Shape | None:
        d = self._dim(node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim"))
        shape = self.shape(node.inputs[0])
        if d is None or shape is None:
            return None
        i = shape.position(d)
        if i is None or not shape.axes[i].unit:
            return None  # squeeze of an axis not known to be 1 may do nothing
        return Shape(shape.axes[:i] + shape.axes[i + 1:], shape.exact)

    def _flatten(self, node: Node) -> Shape | None:
        start = self._dim(node.inputs[1] if len(node.inputs) > 1 else node.kwarg("start_dim", Const(0)))
        end = self._dim(node.inputs[2] if len(node.inputs) > 2 else node.kwarg("end_dim", Const(-1)))
        shape = self.shape(node.inputs[0])
        if start is not None and start >= 0 and end == -1 and (shape is None or not shape.exact):
            # `x.flatten(start_dim=2)`: the axes from `start` on become one, whatever the rank was,
            # so the result has start + 1 axes (those before `start` known only where the input's are)
            return Shape(tuple(fresh() for _ in range(start)) + (fresh(),), True)
        if start is None or end is None or shape is None:
            return None
        i, j = shape.position(start), shape.position(end)
        if i is None or j is None or j < i:
            return None
        return Shape(shape.axes[:i] + (fresh(),) + shape.axes[j + 1:], shape.exact)

    def _unflatten(self, node: Node) -> Shape | None:
        """`x.unflatten(dim, sizes)`: axis `dim` split into one axis per size; a size read from a
        tensor's shape (`v.size(3)`, as an einsum's lowering unflattens a value's trailing axes) is
        that tensor's axis, a literal 1 a unit axis, any other a new axis."""
        shape = self.shape(node.inputs[0]) if node.inputs else None
        dim = self._dim(node.inputs[1]) if len(node.inputs) > 1 else None
        sizes = node.inputs[2] if len(node.inputs) > 2 else None
        if shape is None or dim is None or not isinstance(sizes, Seq) or not sizes.items:
            return None
        i = shape.position(dim)
        if i is None:
            return None
        axes: list[Axis] = []
        for size in sizes.items:
            read = self.defs.get(size.name) if isinstance(size, Var) else None
            if read is not None and read.op == ".size" and len(read.inputs) == 2 and not read.kwargs:
                axis = self.axis(read.inputs[0], read.inputs[1])
                if axis is not None:
                    axes.append(axis)
                    continue
            axes.append(fresh(unit=_int(size) == 1))
        return Shape(shape.axes[:i] + tuple(axes) + shape.axes[i + 1:], shape.exact)

    def _unbind(self, node: Node) -> Shape | None:
        d = self._dim(node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim", Const(0)))
        shape = self.shape(node.inputs[0])
        if d is None or shape is None:
            return None
        i = shape.position(d)
        if i is None:
            return None
        return Shape(shape.axes[:i] + shape.axes[i + 1:], shape.exact)  # every output alike

    def _chunk(self, node: Node) -> Shape | None:
        dim = node.inputs[2] if len(node.inputs) > 2 else node.kwarg("dim", Const(0))
        shape = self.shape(node.inputs[0])
        d = self._dim(dim)
        if d is None or shape is None or shape.position(d) is None:
            return None
        i = shape.position(d)
        assert i is not None
        axes = list(shape.axes)
        axes[i] = fresh()
        return Shape(tuple(axes), shape.exact)

    def _reduce(self, node: Node, name: str) -> Shape | None:
        shape = self.shape(node.inputs[0]) if node.inputs else None
        dim = node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim")
        keep = node.kwarg("keepdim", node.inputs[2] if len(node.inputs) > 2 else Const(False))
        if shape is None or dim is None:
            return None
        positions = []
        for d in _axis_items(dim):
            p = shape.position(self._dim(d)) if self._dim(d) is not None else None  # type: ignore[arg-type]
            if p is None:
                return None
            positions.append(p)
        if node.op in (".max", ".min") and len(node.outputs) > 1:
            pass  # values, indices: both of the reduced shape
        if isinstance(keep, Const) and keep.value is True:
            axes = tuple(fresh(unit=True) if k in positions else a for k, a in enumerate(shape.axes))
            return Shape(axes, shape.exact)
        if isinstance(keep, Const) and keep.value is False:
            return Shape(tuple(a for k, a in enumerate(shape.axes) if k not in positions), shape.exact)
        return None

    def _getitem(self, node: Node) -> Shape | None:
        if len(node.inputs) != 2:
            return None
        index = node.inputs[1]
        source = self.defs.get(node.inputs[0].name) if isinstance(node.inputs[0], Var) else None
        if source is not None and source.op in (".max", ".min") and _int(index) == 0:
            return self.shape(node.inputs[0])  # `x.max(dim, keepdim=True)[0]`: the values
        if self._pieces(node.inputs[0]) is not None:
            # an item of a tuple of pieces (`x.split(n, -1)[0]`), or some of them (`[1:]`)
            return self._pieces(node.inputs[0]) if _index_parts(_index_text(index)) in (["I"], ["S"]) else None
        if source is not None and source.kind == "layer" and len(source.outputs) == 1 \
                and isinstance(index, Const) and isinstance(index.value, int) and not isinstance(index.value, bool):
            items = self.returned(source)  # `self.pool(v, thw)[0]`: an item of the tuple a module returns
            if not isinstance(items, tuple):
                return None
            return items[index.value] if -len(items) <= index.value < len(items) else None
        if isinstance(index, Const) and isinstance(index.value, int):
            parts: list[str] | None = ["I"]
        elif isinstance(index, Sym):
            parts = _index_parts(index.text)
        else:
            return None
        if parts is None:
            return None
        shape = self.shape(node.inputs[0])
        if shape is None:
            return None
        if "E" in parts:
            k = parts.index("E")
            head, tail = parts[:k], parts[k + 1:]
        else:
            head, tail = parts, []
        consumed_head = sum(1 for p in head if p != "N")
        consumed_tail = sum(1 for p in tail if p != "N")
        if not shape.exact and head and consumed_head:
            return None
        if not shape.exact and "E" not in parts and head:
            return None
        if len(shape.axes) < consumed_head + consumed_tail:
            return None
        axes = list(shape.axes)
        out_head: list[Axis] = []
        i = 0
        for p in head:
            if p == "N":
                out_head.append(fresh(unit=True))
            elif p == "S":
                out_head.append(axes[i])
                i += 1
            else:
                i += 1
        out_tail: list[Axis] = []
        j = len(axes) - consumed_tail
        middle = axes[i:j]
        for p in tail:
            if p == "N":
                out_tail.append(fresh(unit=True))
            elif p == "S":
                out_tail.append(axes[j])
                j += 1
            else:
                j += 1
        return Shape(tuple(out_head + middle + out_tail), shape.exact)

    def _expand(self, node: Node) -> Shape | None:
        shape = self.shape(node.inputs[0]) if node.inputs else None
        if node.op == ".expand_as":
            other = self.shape(node.inputs[1]) if len(node.inputs) > 1 else None
            return other
        sizes = self._sizes(node)
        if sizes is None:
            return None
        if node.op == ".repeat":
            if shape is not None and shape.exact and len(sizes) == len(shape.axes):
                return Shape(tuple(a if _int(s) == 1 else fresh() for a, s in zip(shape.axes, sizes, strict=True)), True)
            return None
        # the result has one axis per size (the input's, aligned from the right, and new ones before)
        n = len(sizes)
        known = shape.axes if shape is not None else ()
        pad = n - len(known)
        if pad < 0:
            return None
        base = tuple(fresh() for _ in range(pad)) + known
        axes = tuple(a if _int(s) == -1 else (Axis(a.id, False) if _int(s) != 1 else a) for a, s in zip(base, sizes, strict=True))
        return Shape(axes, True)

    def _cat(self, node: Node) -> Shape | None:
        """torch.cat raises unless its pieces have one rank: the result has the rank of any piece
        whose rank is proven (written out, or the items of a tuple a split returns)."""
        if not node.inputs:
            return None
        if isinstance(node.inputs[0], Seq):
            ranks = {self.rank(i) for i in node.inputs[0].items} - {None}
        else:
            piece = self._pieces(node.inputs[0])
            ranks = {piece.rank} - {None} if piece is not None else set()
        if len(ranks) != 1:
            return None
        return Shape(tuple(fresh() for _ in range(ranks.pop())), True)  # type: ignore[arg-type]

    def _stack(self, node: Node) -> Shape | None:
        """torch.stack raises unless its pieces have one shape: the result is that shape with a new
        axis at `dim` (counted in the result, as unsqueeze counts it), its size the number of pieces."""
        items = node.inputs[0] if node.inputs else None
        d = self._dim(node.inputs[1] if len(node.inputs) > 1 else node.kwarg("dim", Const(0)))
        if d is None or items is None:
            return None
        if isinstance(items, Seq):
            shapes = [self.shape(i) for i in items.items]
            exact = {s for s in shapes if s is not None and s.exact}
            ranks = {s.rank for s in exact}
            if len(ranks) > 1 or not shapes:
                return None
            if len(exact) == 1 and all(s in exact for s in shapes):
                piece: Shape | None = exact.pop()
            elif ranks:
                piece = Shape(tuple(fresh() for _ in range(ranks.pop())), True)  # type: ignore[arg-type]
            else:
                piece = _join(shapes)
        else:
            piece = self._pieces(items)
        return None if piece is None else _inserted(piece, d, fresh())

    def _pieces(self, operand: Operand) -> Shape | None:
        """The shape of every tensor of `operand`, a tuple that a split, chunk or unbind returns (an
        output naming the whole tuple); None for any other value (a list built item by item)."""
        node = self.defs.get(operand.name) if isinstance(operand, Var) else None
        if node is None or node.kind != "op" or len(node.outputs) != 1:
            return None
        if node.op in _TUPLE_OPS:
            return self.shape(operand)
        if node.op == "getitem" and len(node.inputs) == 2 and _index_parts(_index_text(node.inputs[1])) == ["S"]:
            return self._pieces(node.inputs[0])  # `pieces[1:]`: a tuple of some of them
        return None

    def _einsum(self, node: Node) -> Shape | None:
        einops = node.op == "einops.einsum"
        spec_arg = node.inputs[-1] if einops else (node.inputs[0] if node.inputs else None)
        if not isinstance(spec_arg, Const) or not isinstance(spec_arg.value, str) or "->" not in spec_arg.value:
            return None
        lhs, _, rhs = spec_arg.value.partition("->")
        out = C.einsum_axes(rhs, einops)
        if out is None or "..." in out:
            return None
        operands = node.inputs[:-1] if einops else node.inputs[1:]
        specs = lhs.split(",")
        labels: dict[str, Axis] = {}
        for spec, operand in zip(specs, operands, strict=False):
            axes = C.einsum_axes(spec, einops)
            shape = self.shape(operand)
            if axes is None or shape is None or not shape.exact or len(shape.axes) != len(axes):
                continue
            for label, axis in zip(axes, shape.axes, strict=True):
                if label not in labels or labels[label].unit:
                    labels[label] = axis
        return Shape(tuple(labels.get(a) or fresh() for a in out), True)

    def _rearrange(self, node: Node) -> Shape | None:
        pattern = node.inputs[1] if len(node.inputs) > 1 else node.kwarg("pattern")
        if not isinstance(pattern, Const) or not isinstance(pattern.value, str) or "->" not in pattern.value:
            return None
        lhs, _, rhs = pattern.value.partition("->")
        left, right = _einops_groups(lhs), _einops_groups(rhs)
        if left is None or right is None or "..." in right or "..." in left:
            return None
        shape = self.shape(node.inputs[0])
        named: dict[str, Axis] = {}
        if shape is not None and shape.exact and len(shape.axes) == len(left):
            for group, axis in zip(left, shape.axes, strict=True):
                if group and " " not in group and not group.startswith("("):
                    named[group] = axis
        return Shape(tuple(named.get(g) or fresh(unit=g == "1") for g in right), True)

    # -- facts from call sites ---------------------------------------------------------------

    def param_shape(self, name: str, none_ok: bool = False) -> Shape | None:
        """The shape of the parameter `name` where every call of the function is known (engine/
        analysis/numbers.py `call_sites`: a private function whose name no other file uses) and
        each passes a value of proven shape: a parameter or buffer `__init__` of the calling
        class builds (`self.logit_scale`, `nn.Parameter(torch.log(10 * torch.ones(h, 1, 1)))`),
        or a factory written with constant sizes; the axes all calls agree on. `none_ok`: a call
        passing None (or leaving it to a default None) gives no shape, for a use that raises on
        None (`torch.clamp(None)`, `None.exp()`) and so computes nothing there."""
        key = f"{name}\0{none_ok}"
        if key in self._params:
            return self._params[key]
        found = None
        sites = self._call_sites(name, public=False)
        if sites is not None:
            found = _join(self._site_shapes(sites, none_ok)) if sites else None
        self._params[key] = found
        return found

    def public_callers(self, operand: Operand | None) -> str | None:
        """Where `operand` is a parameter of a public function (through shape-keeping ops) and the
        calls the file shows would prove its shape (`param_shape`'s proof, but for the function
        being callable from outside the repository with anything): a note naming the function and
        what those calls pass. None otherwise."""
        while isinstance(operand, Var) and operand.name in self.defs:
            node = self.defs[operand.name]
            if node.kind != "op" or node.op not in _SAME_SHAPE or node.op in _PASSES_NONE or not node.inputs:
                return None
            operand = node.inputs[0]
        if not isinstance(operand, Var):
            return None
        sites = self._call_sites(operand.name, public=True)
        if not sites or None in self._site_shapes(sites, True) or not any(
                not (isinstance(v, ast.Constant) and v.value is None) for v, _ in sites):
            return None
        passed = sorted({ast.unparse(v) for v, _ in sites})
        return (f"`{operand.name}` is a parameter of the public function `{self.method.name}`: its calls in "
                f"the file pass {' or '.join(f'`{p}`' for p in passed)}, but a caller outside the repository "
                "may pass any tensor")

    def _call_sites(self, name: str, public: bool) -> list[tuple[ast.expr, str | None]] | None:
        method = self.method
        if self.cls is None or method.pos is None or not any(
                p.name == name and p.kind in ("normal", "kwonly") for p in method.params):
            return None
        tree = numbers.tree_of(method.pos.file)
        return None if tree is None else numbers.call_sites(tree, self.cls.name, method.name, name, public)

    def _site_shapes(self, sites: list[tuple[ast.expr, str | None]], none_ok: bool) -> list[Shape | None]:
        """The shape of each value the calls pass (None for one unproven), the Nones left out where
        `none_ok`."""
        tree = numbers.tree_of(self.method.pos.file) if self.method.pos is not None else None
        shapes: list[Shape | None] = []
        for value, caller in sites:
            if isinstance(value, ast.Constant) and value.value is None:
                if not none_ok:
                    shapes.append(None)
                continue
            built: list[ast.expr] | None = [value]
            if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self":
                # the calling class's parameter or buffer: what its `__init__` assigns on every path
                built = numbers.attribute_values(tree, caller, value.attr) if tree is not None and caller else None
            for e in built or [None]:
                if isinstance(e, ast.Call) and ast.unparse(e.func).rpartition(".")[2] == "Parameter" and e.args:
                    e = e.args[0]
                shape = _ast_shape(e) if e is not None else None
                shapes.append(None if shape is None else Shape(tuple(fresh(a.unit) for a in shape.axes), shape.exact))
        return shapes

    # -- constructor facts -----------------------------------------------------------------

    def attribute_shape(self, text: str) -> Shape | None:
        """The shape of `self.<attr>` where `__init__` builds it as a parameter or buffer of known
        shape (`nn.Parameter(torch.ones(heads, 1, 1))`)."""
        if self.cls is None or not text.startswith("self."):
            return None
        if self._attrs is None:
            self._attrs = {}
        if text in self._attrs:
            return self._attrs[text]
        found: Shape | None = None
        defs = [d for d in self.cls.layers if d.attr == text]
        if len(defs) == 1 and defs[0].type in _PARAM_WRAPPERS and defs[0].args:
            arg = defs[0].args[0]
            if isinstance(arg, Sym):
                found = _constructor_shape(arg.text)
        elif not defs and text == "self.weight":
            found = self._inherited_weight()
        self._attrs[text] = found
        return found

    def _inherited_weight(self) -> Shape | None:
        """The shape of `self.weight` of a class derived directly from a torch convolution or
        `nn.Linear` (a weight-standardized `nn.Conv2d`): the base's constructor makes it, of rank
        2 + the number of spatial dims for a convolution ((out, in / groups, *kernel); transposed:
        (in, out / groups, *kernel)) and 2 for a linear layer, whatever the arguments. None where the
        class assigns, deletes or registers `weight` itself anywhere (or its source is unreadable)."""
        assert self.cls is not None
        ranks = {_INHERITED_WEIGHT_RANK[b] for b in self.cls.bases if b in _INHERITED_WEIGHT_RANK}
        if len(ranks) != 1 or len(self.cls.bases) != 1 or self.cls.pos is None:
            return None
        tree = numbers.tree_of(self.cls.pos.file)
        node = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == self.cls.name
                     and n.lineno == self.cls.pos.line), None) if tree is not None else None
        if node is None:
            return None
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr == "weight" and isinstance(sub.ctx, (ast.Store, ast.Del)):
                return None
            if isinstance(sub, ast.Constant) and sub.value == "weight":
                return None  # `register_parameter("weight", ...)`, `setattr(self, "weight", ...)`
        return Shape(tuple(fresh() for _ in range(ranks.pop())), True)


def callee_class(file: str, qualified: str) -> ClassModel | None:
    """The extracted class that the layer type `qualified` names in the file `file`: a class of that
    file (while it is being matched: its name bound once, by the class, and the type's module no name
    the file imports), or of another file of the repository the scan made known (engine.extract.package)."""
    module, _, name = qualified.rpartition(".")
    index = package.current()
    tree = numbers.tree_of(file)
    if tree is not None and module:
        bindings = _bindings(tree)
        own = bindings.get(name, ()) if bindings is not None else ()
        if len(own) == 1 and isinstance(own[0], ast.ClassDef) and module.partition(".")[0] not in bindings:  # type: ignore[operator]
            text = numbers.text_of(file)
            return _file_class(tree, text, file, module, name, index) if text is not None else None
    if index is None:
        return None
    where = index.type_class(file, qualified)
    return index.class_model(*where) if where is not None else None


def getter_types(file: str, qualified: str) -> tuple[str, ...] | None:
    """The module types that the function `qualified` (a layer's type: the function `__init__` called
    to build it) of the file `file` or of another file of the repository returns: each of its
    `return`s builds a module, by calling a class (`return nn.ReLU()`) or an item of a dict of classes
    bound once in the function or the module (`return ACTIVATIONS[name]()`). None where any `return`
    is something else."""
    module, _, name = qualified.rpartition(".")
    tree, where = numbers.tree_of(file), file
    if tree is None or not module or module.partition(".")[0] in (_bindings(tree) or {}):
        index = package.current()
        target = index.module_file(file, 0, module) if index is not None and module else None
        found = index.source(target) if target is not None else None  # type: ignore[union-attr]
        if found is None:
            return None
        tree, where = found[1], target
    return _getter(tree, where.endswith("__init__.py"), module, name)  # type: ignore[union-attr]


@lru_cache(maxsize=64)
def _getter(tree: ast.Module, is_package: bool, module: str, name: str) -> tuple[str, ...] | None:
    bindings = _bindings(tree)
    bound = bindings.get(name, ()) if bindings is not None else ()
    fn = bound[0] if len(bound) == 1 else None
    if not isinstance(fn, ast.FunctionDef):
        return None
    imports = Imports(tree, module, is_package)
    body = [n for stmt in fn.body for n in _own_nodes(stmt)]
    returns = [n for n in body if isinstance(n, ast.Return)]
    types: list[str | None] = []
    for r in returns:
        call = r.value
        if not isinstance(call, ast.Call):
            return None
        built = call.func
        if isinstance(built, ast.Subscript):
            table = built.value
            if isinstance(table, ast.Name):  # a dict bound once, in the function or else in the module
                stores = {id(n) for n in body if isinstance(n, ast.Name) and n.id == table.id and isinstance(n.ctx, ast.Store)}
                local = [n for n in body if isinstance(n, ast.stmt) and not isinstance(n, ast.Return)
                         and any(id(t) in stores for t in ast.iter_child_nodes(n))]
                if len(local) != len(stores):
                    return None  # bound by a loop, a `with` or a nested target: not one dict
                held = local or list(bindings.get(table.id, ()) if bindings is not None else ())
                if len(held) != 1 or not isinstance(held[0], ast.Assign) or len(held[0].targets) != 1:
                    return None
                table = held[0].value
            if not isinstance(table, ast.Dict) or not table.values or None in table.keys:
                return None
            types.extend(imports.qualify(v) for v in table.values)
        else:
            types.append(imports.qualify(built))
    if not returns or any(t is None for t in types):
        return None
    return tuple(dict.fromkeys(types))  # type: ignore[arg-type]


def _own_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """The nodes of a function's statement, not those of functions or classes defined inside it."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [stmt]
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return out


@lru_cache(maxsize=8)
def _bindings(tree: ast.Module) -> dict[str, list[ast.stmt]] | None:
    return package.bindings(tree)


@lru_cache(maxsize=64)
def _file_class(tree: ast.Module, text: str, file: str, module: str, name: str,
                index: package.PackageIndex | None) -> ClassModel | None:
    from engine.extract.extractor import class_model  # the extractor imports the analysis

    return class_model(tree, text, file, module, name, index)


def _einsum_rank(node: Node, shape: Shape) -> Shape:
    """A matrix product the extractor lowered from an einsum (`torch.einsum('bhid,bhjd->bhij')`, in
    the node's target) has the rank its output spec lists."""
    target = node.target
    if target is None or "einsum(" not in target or not target.endswith("')"):
        return shape
    spec = target.partition("(")[2][1:-2]
    axes = C.einsum_axes(spec.partition("->")[2], einops=target.startswith("einops."))
    if axes is None or "..." in axes or len(axes) < len(shape.axes) or shape.exact and len(axes) != len(shape.axes):
        return shape
    return Shape(tuple(fresh() for _ in range(len(axes) - len(shape.axes))) + shape.axes, True)


def _with_rank(shape: Shape | None, rank: int) -> Shape | None:
    """`shape` of a value known to have `rank` axes (fresh ones added before those known)."""
    if shape is not None and (shape.exact or len(shape.axes) > rank):
        return shape
    known = shape.axes if shape is not None else ()
    return Shape(tuple(fresh() for _ in range(rank - len(known))) + known, True)


def _inserted(shape: Shape, dim: int, axis: Axis) -> Shape | None:
    """`shape` with `axis` inserted where `unsqueeze(dim)` puts a new axis (a negative `dim` counts
    in the result from the end); None where that position is not provable."""
    n = len(shape.axes)
    if dim < 0:
        i = n + dim + 1
        if i < 0:
            return None
    else:
        if not shape.exact or dim > n:
            return None
        i = dim
    axes = list(shape.axes)
    axes.insert(i, axis)
    return Shape(tuple(axes), shape.exact)


def _index_text(index: Operand) -> str:
    if isinstance(index, Const) and isinstance(index.value, int):
        return str(index.value)
    return index.text if isinstance(index, Sym) else ""


def _join(shapes: list[Shape | None]) -> Shape | None:
    """A value that is one of several (a merge after `if`): the axes all agree on."""
    if not shapes or any(s is None for s in shapes):
        return None
    first = shapes[0]
    assert first is not None
    if all(s == first for s in shapes):
        return first
    width = min(len(s.axes) for s in shapes)  # type: ignore[union-attr]
    exact = all(s.exact for s in shapes) and len({len(s.axes) for s in shapes}) == 1  # type: ignore[union-attr]
    axes = []
    for k in range(width, 0, -1):
        here = {s.axes[len(s.axes) - k] for s in shapes}  # type: ignore[union-attr]
        ids = {a.id for a in here}
        if len(ids) == 1:
            axes.append(Axis(next(iter(ids)), all(a.unit for a in here)))
        else:
            axes.append(Axis(_join_id(tuple(sorted(ids))), all(a.unit for a in here)))
    return Shape(tuple(axes), exact)


@lru_cache(maxsize=4096)
def _join_id(ids: tuple[int, ...]) -> int:
    return next(_IDS)


def _same_size(a: Operand, b: Operand) -> bool:
    """Two view sizes that are the same value: one operand, or the same text."""
    return a == b or (isinstance(a, Sym) and isinstance(b, Sym) and a.text.replace(" ", "") == b.text.replace(" ", ""))


def _is_number_text(text: str) -> bool:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@lru_cache(maxsize=4096)
def _index_parts(text: str) -> list[str] | None:
    """An index expression as parts: S (a slice: keeps the axis), I (an int: drops it), N (None: a
    new size-1 axis), E (Ellipsis). None for anything else (a tensor index, a variable)."""
    try:
        tree = ast.parse(f"x[{text}]", mode="eval").body
    except (SyntaxError, MemoryError, RecursionError, ValueError):
        return None
    if not isinstance(tree, ast.Subscript):
        return None
    items = tree.slice.elts if isinstance(tree.slice, ast.Tuple) else [tree.slice]
    parts = []
    for item in items:
        if isinstance(item, ast.Slice):
            parts.append("S")
        elif isinstance(item, ast.Constant) and item.value is None:
            parts.append("N")
        elif isinstance(item, ast.Constant) and item.value is Ellipsis:
            parts.append("E")
        elif isinstance(item, ast.Constant) and isinstance(item.value, int) and not isinstance(item.value, bool):
            parts.append("I")
        elif isinstance(item, ast.UnaryOp) and isinstance(item.op, ast.USub) and isinstance(item.operand, ast.Constant) \
                and isinstance(item.operand.value, int):
            parts.append("I")
        else:
            return None
    if parts.count("E") > 1:
        return None
    return parts


@lru_cache(maxsize=1024)
def _sym_sequence(text: str) -> tuple[Operand, ...] | None:
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, MemoryError, RecursionError, ValueError):
        return None
    if not isinstance(tree, (ast.Tuple, ast.List)) or any(isinstance(e, ast.Starred) for e in tree.elts):
        return None
    return tuple(Const(e.value) if isinstance(e, ast.Constant) else Sym(ast.unparse(e)) for e in tree.elts)


def _einops_groups(side: str) -> list[str] | None:
    """The top-level axes of one side of an einops pattern: names, `(h d)` groups, `1`, `...`."""
    groups: list[str] = []
    depth, current = 0, ""
    for ch in side.strip() + " ":
        if ch == "(":
            if depth:
                return None
            depth, current = 1, "("
        elif ch == ")":
            if not depth:
                return None
            depth = 0
            groups.append(current + ")")
            current = ""
        elif ch.isspace():
            if depth:
                current += " "
            elif current:
                groups.append(current)
                current = ""
        else:
            current += ch
    if depth:
        return None
    return groups


def _factory_shape(inputs: tuple[Operand, ...], kwargs: tuple[tuple[str, Operand], ...]) -> Shape | None:
    if not inputs:  # the sizes passed by keyword, `torch.zeros(size=(b, 1))` (with none, the call raises)
        size = dict(kwargs).get("size")
        if size is None:
            return None
        inputs = (size,)
    if len(inputs) == 1 and isinstance(inputs[0], Seq):
        sizes: tuple[Operand, ...] = inputs[0].items
    elif len(inputs) == 1 and isinstance(inputs[0], Const) and isinstance(inputs[0].value, tuple):
        sizes = tuple(Const(v) for v in inputs[0].value)
    elif len(inputs) == 1 and isinstance(inputs[0], Sym) and (listed := _sym_sequence(inputs[0].text)) is not None:
        sizes = listed  # `[]`, `(2, 3)` as written
    else:
        sizes = inputs
    if any(isinstance(s, Var) for s in sizes):
        return None
    return Shape(tuple(fresh(unit=_int(s) == 1) for s in sizes), True)


@lru_cache(maxsize=1024)
def _constructor_shape(text: str) -> Shape | None:
    """The shape of a parameter's initial value written in `__init__`: a factory call with listed
    sizes (`torch.ones(heads, 1, 1)`, `torch.zeros((1, h, 1, 1))`), possibly under elementwise math
    (`torch.log(10 * torch.ones((h, 1, 1)))`)."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, MemoryError, RecursionError, ValueError):
        return None
    return _ast_shape(tree)


_ELEMENTWISE_CALLS = {"log", "exp", "sqrt", "abs", "neg"}
_LEGACY_CONSTRUCTORS = {"Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor"}


def _ast_shape(e: ast.expr) -> Shape | None:
    if isinstance(e, ast.BinOp):
        left, right = e.left, e.right
        if isinstance(left, ast.Constant) and isinstance(left.value, (int, float)):
            return _ast_shape(right)
        if isinstance(right, ast.Constant) and isinstance(right.value, (int, float)):
            return _ast_shape(left)
        return None
    if not isinstance(e, ast.Call):
        return None
    name = ast.unparse(e.func)
    short = name.rsplit(".", 1)[-1]
    if short in ("ones", "zeros", "randn", "rand", "empty") and name.startswith(("torch.", "th.")) or name in (
            "ones", "zeros", "randn", "rand", "empty"):
        if any(isinstance(a, ast.Starred) for a in e.args):
            return None
        sizes = e.args or [k.value for k in e.keywords if k.arg == "size"]  # `torch.zeros(size=(4, 1))`
        if len(sizes) == 1 and isinstance(sizes[0], (ast.Tuple, ast.List)):
            sizes = sizes[0].elts
        if not sizes or any(isinstance(s, ast.Starred) for s in sizes):
            return None
        return Shape(tuple(fresh(unit=isinstance(s, ast.Constant) and s.value == 1) for s in sizes), True)
    if short in _LEGACY_CONSTRUCTORS and name.startswith(("torch.", "th.")) and len(e.args) > 1 and not e.keywords \
            and not any(isinstance(a, (ast.Starred, ast.Tuple, ast.List)) for a in e.args):
        # `torch.Tensor(2, n)`: given more than one argument the legacy constructor takes them as sizes
        # (given one, it may be data: `torch.Tensor([1, 2])`)
        return Shape(tuple(fresh(unit=isinstance(s, ast.Constant) and s.value == 1) for s in e.args), True)
    if short == "full" and e.args and isinstance(e.args[0], (ast.Tuple, ast.List)):
        return Shape(tuple(fresh(unit=isinstance(s, ast.Constant) and s.value == 1) for s in e.args[0].elts), True)
    if short in _ELEMENTWISE_CALLS and e.args:
        return _ast_shape(e.args[0])
    if isinstance(e.func, ast.Attribute) and short in ("float", "clone", "detach") and not e.args:
        return _ast_shape(e.func.value)
    return None


class _NotProven(Exception):
    pass


def _operand_key(operand: Operand) -> str:
    return f"v:{operand.name}" if isinstance(operand, Var) else f"s:{getattr(operand, 'text', operand)}"


_COMPARISONS = {"compare:eq": lambda a, b: a == b, "compare:noteq": lambda a, b: a != b,
                "compare:lt": lambda a, b: a < b, "compare:lte": lambda a, b: a <= b,
                "compare:gt": lambda a, b: a > b, "compare:gte": lambda a, b: a >= b}
_INT_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}
_AST_OPS = {ast.Add: _INT_OPS["add"], ast.Sub: _INT_OPS["sub"], ast.Mult: _INT_OPS["mul"]}


class _Lengths:
    """Evaluates an integer expression built from `len(N)` (taken as `k`), integer constants, + - *,
    `range`, `tuple`/`list` and comprehensions over a range, through the method's definitions and
    inside a symbol's text. Anything else is not proven (raises `_NotProven`). Every `N` whose length
    is read is appended to `lens`."""

    def __init__(self, defs: dict[str, Node], k: int, lens: list[Operand]) -> None:
        self.defs, self.k, self.lens = defs, k, lens
        self.nodes: dict[int, Node] = {}  # the definitions read, by id

    def value(self, operand: Operand, depth: int = 0):
        if depth > 30:
            raise _NotProven
        if isinstance(operand, Const) and isinstance(operand.value, int) and not isinstance(operand.value, bool):
            return operand.value
        if isinstance(operand, Sym):
            try:
                tree = ast.parse(operand.text, mode="eval").body
            except (SyntaxError, MemoryError, RecursionError, ValueError):
                raise _NotProven from None
            return self.text_value(tree, {})
        if not isinstance(operand, Var):
            raise _NotProven
        node = self.defs.get(operand.name)
        if node is None or node.kind != "op" or node.kwargs:
            raise _NotProven
        self.nodes[id(node)] = node
        args = [self.value(i, depth + 1) if node.op != "len" else None for i in node.inputs]
        if node.op == "len" and len(node.inputs) == 1:
            self.lens.append(node.inputs[0])
            return self.k
        if node.op == "assign" and len(args) == 1:
            return args[0]
        if node.op == "neg" and len(args) == 1 and isinstance(args[0], int):
            return -args[0]
        if node.op in _INT_OPS and len(args) == 2 and all(isinstance(a, int) for a in args):
            return _INT_OPS[node.op](*args)
        return self.call(node.op, args)

    def call(self, name: str, args: list):
        if name == "range" and 1 <= len(args) <= 3 and all(isinstance(a, int) for a in args) \
                and (len(args) < 3 or args[2] != 0):
            return tuple(range(*args))
        if name in ("tuple", "list") and len(args) == 1 and isinstance(args[0], tuple):
            return args[0]
        raise _NotProven

    def text_value(self, e: ast.expr, env: dict[str, int]):
        if isinstance(e, ast.Constant) and isinstance(e.value, int) and not isinstance(e.value, bool):
            return e.value
        if isinstance(e, ast.Name) and e.id in env:
            return env[e.id]
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            v = self.text_value(e.operand, env)
            if isinstance(v, int):
                return -v
        if isinstance(e, ast.BinOp) and type(e.op) in _AST_OPS:
            a, b = self.text_value(e.left, env), self.text_value(e.right, env)
            if isinstance(a, int) and isinstance(b, int):
                return _AST_OPS[type(e.op)](a, b)
        if isinstance(e, (ast.Tuple, ast.List)) and not any(isinstance(x, ast.Starred) for x in e.elts):
            return tuple(self.text_value(x, env) for x in e.elts)
        if isinstance(e, (ast.GeneratorExp, ast.ListComp)) and len(e.generators) == 1:
            gen = e.generators[0]
            if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name):
                raise _NotProven
            items = self.text_value(gen.iter, env)
            if not isinstance(items, tuple):
                raise _NotProven
            return tuple(self.text_value(e.elt, {**env, gen.target.id: i}) for i in items)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and not e.keywords \
                and not any(isinstance(a, ast.Starred) for a in e.args):
            if e.func.id == "len" and len(e.args) == 1:
                # the length of an attribute (`self.normalized_shape`): a name of the method is
                # read through its definitions instead (it may be rebound before the norm)
                arg = e.args[0]
                if not (isinstance(arg, ast.Attribute) and ast.unparse(arg).startswith("self.")):
                    raise _NotProven
                self.lens.append(Sym(ast.unparse(arg)))
                return self.k
            return self.call(e.func.id, [self.text_value(a, env) for a in e.args])
        raise _NotProven


def _einops_sides(pattern: str, rank: int | None) -> tuple[list[list[str]], list[list[str]]] | None:
    """The axes of both sides of an einops pattern, each top-level group as the list of the axis
    names it holds (a name alone: one item; `(h d)`: two; `1`: none; `...` expanded to one name per
    axis it covers, `...0`, `...1`, ..., which needs the input's `rank`). None where the pattern
    cannot be read so (`...` with the rank unknown, a name twice on a side, an anonymous size
    other than 1, a malformed side)."""
    if "->" not in pattern:
        return None
    lhs, _, rhs = pattern.partition("->")
    left, right = _einops_groups(lhs), _einops_groups(rhs)
    if left is None or right is None or any(g.startswith("(") for g in left):
        return None
    dots = sum(g == "..." for g in left)
    if dots > 1 or (dots and rank is None) or (rank is not None and len(left) - dots > rank) \
            or (not dots and rank is not None and len(left) != rank):
        return None
    covered = [f"...{i}" for i in range(rank - (len(left) - 1))] if dots and rank is not None else []

    def expand(groups: list[str]) -> list[list[str]] | None:
        out = []
        for group in groups:
            items = group.strip("()").split() if group.startswith("(") else [group]
            names: list[str] = []
            for item in items:
                if item == "...":
                    names.extend(covered)
                elif item.isidentifier():
                    names.append(item)
                elif item != "1":
                    return None
            if group == "1" or names or group.startswith("("):
                out.append(names)
            else:
                out.append([])  # `...` covering no axis
        return out

    lsides, rsides = expand(left), expand(right)
    if lsides is None or rsides is None:
        return None

    def spread(groups: list[list[str]], texts: list[str]) -> list[list[str]]:
        out: list[list[str]] = []  # `...` outside parentheses: one group per axis it covers
        for group, text in zip(groups, texts, strict=True):
            out.extend([[n] for n in group] if text == "..." else [group])
        return out

    lsides, rsides = spread(lsides, left), spread(rsides, right)
    lnames = [n for g in lsides for n in g]
    rnames = [n for g in rsides for n in g]
    if len(set(lnames)) != len(lnames) or len(set(rnames)) != len(rnames) or not set(rnames) <= set(lnames):
        return None
    return lsides, rsides


def einops_reduction(pattern: str, rank: int | None) -> tuple[tuple[int, ...], bool] | None:
    """Where the einops pattern of `reduce` only reduces axes of an input of `rank` axes (`'o ... ->
    o 1 1 1'` of a 4-D tensor, `'b c h w -> b c'`): the positions of the reduced axes, and whether
    each is kept as a size-1 axis in its place (`keepdim=True`) rather than dropped. The kept axes
    stay in their order, ungrouped; the reduced ones are all replaced by `1` where they were or all
    dropped. None for any other pattern (a permute, a grouping, a new axis, a rank unknown where
    `...` is written)."""
    sides = _einops_sides(pattern, rank)
    if sides is None:
        return None
    left, right = sides
    if any(len(g) != 1 for g in left) or any(len(g) > 1 for g in right):
        return None
    names = [g[0] for g in left]
    kept = [g[0] for g in right if g]
    reduced = tuple(i for i, n in enumerate(names) if n not in kept)
    if not reduced or kept != [n for n in names if n in kept]:
        return None
    if len(right) == len(left) and all(r == [n] if n in kept else r == [] for n, r in zip(names, right, strict=True)):
        return reduced, True
    if len(right) == len(kept):
        return reduced, False
    return None


def einops_flattened_from(pattern: str, rank: int | None) -> int | None:
    """Where the einops pattern of `rearrange` flattens the trailing axes of an input of `rank` axes
    into its last axis, in order (`'o ... -> o (...)'`, `'b c h w -> b (c h w)'`): the position of
    the first flattened axis, the leading ones kept as they are. None for any other pattern."""
    sides = _einops_sides(pattern, rank)
    if sides is None:
        return None
    left, right = sides
    if any(len(g) != 1 for g in left) or len(right) < 2 or any(len(g) != 1 for g in right[:-1]):
        return None
    names = [g[0] for g in left]
    start = len(right) - 1
    if [g[0] for g in right[:-1]] != names[:start] or right[-1] != names[start:] or len(names) - start < 1:
        return None
    return start


def einops_unit_tail(pattern: str) -> tuple[int, int] | None:
    """Where the einops pattern of `rearrange` appends size-1 axes after all the axes of its input,
    kept in order (`'o -> o 1 1 1'`): the input's rank (the pattern names each axis) and how many
    axes it appends. None for any other pattern."""
    if "..." in pattern:
        return None
    lhs = pattern.partition("->")[0]
    groups = _einops_groups(lhs)
    sides = _einops_sides(pattern, len(groups)) if groups is not None else None
    if sides is None:
        return None
    left, right = sides
    if any(len(g) != 1 for g in left) or right[:len(left)] != left or any(right[len(left):]) \
            or len(right) == len(left):
        return None
    return len(left), len(right) - len(left)
