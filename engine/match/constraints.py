"""Named checks a rule can require with `where NAME`. Each returns None when the match satisfies
it, or the reason it does not (which becomes the near-miss reason)."""

from __future__ import annotations

import ast
import itertools
import math
import re
from collections.abc import Callable
from pathlib import Path

from engine.analysis.contraction import is_one_row
from engine.analysis.kwargs import Unknown, dict_keys
from engine.analysis.numbers import (
    attribute_is_setting,
    attribute_values,
    function_attribute_cache,
    function_attribute_value,
    tree_of,
)
from engine.analysis.shapes import ShapeFacts
from engine.dsl import canonical as C
from engine.dsl.ir import Const, Node, Operand, Pos, Seq, Sym, Var
from engine.extract import package
from engine.match.fused import _exclusive
from engine.match.fused import _File as _BranchFile
from engine.match.matcher import KEY_MAJOR, Match, MethodIndex, numeric, render
from engine.match.polynomial import PolynomialReader


def _is_finfo_max(value, ix: MethodIndex) -> bool:
    node = ix.defs.get(value.name) if isinstance(value, Var) else None
    if node is None or node.op != "getattr" or node.inputs[1:] != (Const("max"),):
        return False
    source = ix.defs.get(node.inputs[0].name) if isinstance(node.inputs[0], Var) else None
    return source is not None and source.op in ("torch.finfo", "numpy.finfo")


def _drops_keys(value, ix: MethodIndex) -> bool:
    if isinstance(value, Sym):
        text = value.text.replace(" ", "")
        if text in ("float('-inf')", 'float("-inf")', "-float('inf')", '-float("inf")', "-math.inf", "-torch.inf",
                    "-numpy.inf", "-np.inf") or ".finfo(" in text and text.endswith(".min"):
            return True
        if text.startswith("-") and ".finfo(" in text and text.endswith(".max"):
            return True  # -torch.finfo(dtype).max is finfo.min
    number = numeric(value) if isinstance(value, (Const, Sym)) else None
    if number is not None and number <= -1e4:
        return True
    if isinstance(value, Var):
        node = ix.defs.get(value.name)
        if node is not None and node.op == "getattr" and node.inputs[1:] == (Const("min"),):
            return True
        if node is not None and node.op == "neg" and _is_finfo_max(node.inputs[0], ix):
            return True  # -torch.finfo(dtype).max is the dtype's lowest value, finfo.min
    return False


_SELF_ATTRIBUTE = re.compile(r"self\.([A-Za-z_]\w*)")


def _fill_values(value, ix: MethodIndex, depth: int = 0) -> list:
    """What a fill may be: itself; for `self.<attr>` each value `__init__` assigns it on its paths
    (engine.analysis.numbers.attribute_values: `-65000` for half parameters, else `-float("inf")`);
    for the result of a helper that returns one of several values, each of them (a fill chosen by
    dtype, `neginf(s.dtype)` returning `-65504` for float16 and `-1e20` otherwise)."""
    node = ix.defs.get(value.name) if isinstance(value, Var) and depth < 8 else None
    if node is not None and node.kind == "op" and node.op == "assign" and len(node.inputs) == 1 and not node.kwargs \
            and isinstance(node.inputs[0], (Const, Sym)):
        return _fill_values(node.inputs[0], ix, depth + 1)  # a local holding the value (funasr's `min_value`)
    if node is not None and node.kind == "phi" and node.inputs and node.kwarg("if") is None:
        # the merge of an inlined helper's returns (a merge of the function's own branches has its
        # decision, and the statements choosing its value would outlive the fill)
        arms = [ix.defs.get(v.name) if isinstance(v, Var) else None for v in node.inputs]
        if all(a is not None and a.kind == "op" and a.op == "assign" and len(a.inputs) == 1 and not a.kwargs
               and isinstance(a.inputs[0], (Const, Sym)) for a in arms):
            return [v for a in arms if a is not None for v in _fill_values(a.inputs[0], ix, depth + 1)]
    m = _SELF_ATTRIBUTE.fullmatch(value.text.replace(" ", "")) if isinstance(value, Sym) else None
    tree = tree_of(ix.file.path) if m is not None else None
    values = attribute_values(tree, ix.cls.name, m.group(1)) if tree is not None and m is not None else None
    return [Sym(ast.unparse(v)) for v in values] if values else [value]


def _fill_is_minus_infinity(match: Match, ix: MethodIndex) -> str | None:
    """A `masked_fill` mask must fill with -inf (or the dtype's lowest value, or a huge negative
    number): only then is it the same as dropping those keys from the softmax. A fill that is an
    attribute must be one on every path of `__init__` that sets it, all infinite or all finite (or
    the probabilities filled with 0 under the same mask after the softmax, which sets those rows)."""
    value = match.bindings.get("fill")
    if value is None:
        return None
    values = _fill_values(value, ix)
    text = _dim_text(value, ix) if isinstance(value, Var) else repr(getattr(value, "text", getattr(value, "value", value)))
    if not all(_drops_keys(v, ix) for v in values):
        return f"masked_fill value {text} is not -inf"
    if len({_fill_is_infinite(v) for v in values}) > 1 and not _refilled(match):
        where = "of `__init__`" if isinstance(value, Sym) else "of the helper computing it"
        return (f"masked_fill value {text} is -inf on some paths {where} and finite on others: rows whose "
                "every key is masked are NaN on the one and the average of v on the other")
    return None


def _same_branch(match: Match, ix: MethodIndex) -> str | None:
    """All matched nodes run under the same branch decisions (computed together, fusable)."""
    guards = {tuple((c.id, c.taken) for c in n.guard) for n in match.nodes.values()}
    if len(guards) > 1:
        return "the matched operations run under different branch conditions"
    return None


def _same_helper(match: Match, ix: MethodIndex) -> str | None:
    """Statements named `*_split` come from one helper function inlined at each call."""
    split = [n for key, n in match.nodes.items() if key.endswith("_split")]
    if not split:
        return None
    if any(not n.via for n in split) or len({n.pos for n in split}) != 1:
        return "the projections are not each followed by the same head-splitting helper"
    return None


def _helper_named_split_heads(match: Match, ix: MethodIndex) -> str | None:
    """The head-splitting helper is the method `_split_heads`, as in the paper's rule 9."""
    split = [n for key, n in match.nodes.items() if key.endswith("_split")]
    for node in split:
        if node.pos is None:
            continue
        owner = next((m.name for m in match.cls.methods if m.pos is not None
                      and m.pos.line <= node.pos.line <= m.pos.end_line), None)
        if owner != "_split_heads":
            return f"the head-splitting helper is `{owner}`, not `_split_heads` (the paper's rule names it)"
    return None


def _linear_has_bias(match: Match, ix: MethodIndex) -> str | None:
    """The Linear bound to `$l` is built with a bias (a fused bias+activation needs one)."""
    node = match.nodes.get("l")
    layer = ix.layer_for(node) if node is not None else None
    if layer is None:
        return None
    bias = layer.kwarg("bias")
    if bias is None and len(layer.args) >= 3:
        bias = layer.args[2]
    if isinstance(bias, Const) and bias.value is False:
        return f"{node.target} is built with bias=False: there is no bias to fuse"
    return None


_CHOOSING = ("fused", "foreach", "capturable", "differentiable")  # settings that conflict with fused=


def _not_already_chosen(match: Match, ix: MethodIndex) -> str | None:
    """The optimizer call does not already choose an implementation (`fused=`, `foreach=`,
    `capturable=`, `differentiable=`), nor passes a `**kwargs` that may: the keys a `**` dict can
    hold must be proven, from the function's code and its callers' (engine.analysis.kwargs), to
    include none of them. One `**` dict whose keys cannot be proven (a configuration's section,
    `**cfg.adam`) is left to decide at run time: `$chooser` is bound to it, and `fused=` goes into a
    dict merged under its keys (`_bind_fused`)."""
    node = match.root
    match.bindings.pop("chooser", None)
    for key, _ in node.kwargs:
        if key in _CHOOSING:
            return f"the call already sets {key}="
    if any(key == "**" for key, _ in node.kwargs):
        return _kwargs_choose_nothing(match)
    return None


def _kwargs_choose_nothing(match: Match) -> str | None:
    """Why the `**` dicts of the optimizer call may choose an implementation, or None where their
    keys are proven to include none of `_CHOOSING`, or where one of them alone has keys that cannot
    be proven and is read as a name or an attribute (read twice, for its keys and for the call:
    `$chooser` and `$chooser_at`, its place among the call's `**` arguments, are bound)."""
    node, pos = match.root, match.method.pos
    tree = tree_of(match.file.path)
    fn = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.lineno == pos.line and n.col_offset == pos.col), None) if tree is not None and pos else None
    call = next((n for n in ast.walk(fn) if isinstance(n, ast.Call) and n.lineno == node.pos.line
                 and n.col_offset == node.pos.col), None) if fn is not None and node.pos and not node.via else None
    if call is None:
        return "the call passes **kwargs, which may already choose an implementation"
    unknown: list[tuple[int, ast.expr, str]] = []  # (place among the `**` arguments, the dict, why)
    for at, kw in enumerate(k for k in call.keywords if k.arg is None):
        text = ast.unparse(kw.value)
        if isinstance(kw.value, ast.Dict):
            chosen = next((k.value for k in kw.value.keys if isinstance(k, ast.Constant) and k.value in _CHOOSING),
                          None)
            if chosen is not None:
                return f"the call already sets {chosen}= (in `**{{...}}`)"
            if all(isinstance(k, ast.Constant) for k in kw.value.keys):
                continue  # a literal whose keys are all written out
        if not isinstance(kw.value, ast.Name):
            unknown.append((at, kw.value, ""))
            continue
        try:
            keys = dict_keys(tree, match.file.path, fn, kw.value.id, package.current())
        except Unknown as why:
            unknown.append((at, kw.value, f": {why}"))
            continue
        chosen = next((k for k in _CHOOSING if k in keys), None)
        if chosen is not None:
            return f"the call passes **{text}, which may set {chosen}= (at {keys[chosen]})"
    if not unknown:
        return None
    at, value, why = unknown[0]
    if len(unknown) > 1:
        texts = " and ".join(f"**{ast.unparse(v)}" for _, v, _ in unknown)
        return f"the call passes {texts}, which may already choose an implementation: the keys of neither are known"
    if not _read_twice_alike(value):
        return f"the call passes **{ast.unparse(value)}, which may already choose an implementation{why}; " \
            "its keys would be read from a second evaluation"
    match.bindings["chooser"] = Sym(ast.unparse(value))
    match.bindings["chooser_at"] = Const(at)
    return None


def _read_twice_alike(value: ast.expr) -> bool:
    """A name or an attribute of one (`extra`, `cfg.adam`): read again, it gives the same mapping."""
    while isinstance(value, ast.Attribute):
        value = value.value
    return isinstance(value, ast.Name)


CHECKS: dict[str, Callable[[Match, MethodIndex], str | None]] = {
    "fill_is_minus_infinity": _fill_is_minus_infinity,
    "same_branch": _same_branch,
    "same_helper": _same_helper,
    "linear_has_bias": _linear_has_bias,
    "helper_named_split_heads": _helper_named_split_heads,
    "not_already_chosen": _not_already_chosen,
}


# ---------------------------------------------------------------------------------------------
# Dimensions by meaning (engine.analysis.shapes): which axis a dimension argument names


def rank_of(operand, ix: MethodIndex) -> int | None:
    """The number of dimensions of a value where the code proves it (see engine.analysis.shapes)."""
    return ix.shapes.rank(operand)


def _dim_text(dim, ix: MethodIndex | None = None) -> str:
    """An operand as a reason quotes it: a constant's value, an expression's text, a variable by its
    source name (`dim`, not the SSA `dim.1`), a value extraction computed by what computed it
    (`` `neginf(...)` at line 249 ``), never an object's repr."""
    if isinstance(dim, Var):
        base = dim.name.split(".", 1)[0]
        node = ix.defs.get(dim.name) if ix is not None else None
        line = f" at line {node.pos.line}" if node is not None and node.pos is not None else ""
        if node is not None and re.fullmatch(r"_t\d+", base) and node.kind == "op":
            return f"`{node.op}(...)`{line}"
        if base == "_if":  # extraction's name for the merge of a conditional expression
            return f"a conditional expression{line}"
        if node is not None and node.kind == "phi" and node.kwarg("if") is None and base.startswith("_"):
            return f"`{base[1:]}(...)`"  # the merge of an inlined helper's returns, `_<helper>`
        return base
    return str(getattr(dim, "text", getattr(dim, "value", dim)))


def _held_constant(operand, ix: MethodIndex):
    """The constant a variable holds where only assignments lead to it (an inlined helper's
    parameter bound to a literal, `utils_softmax(x, dim=-1)`); otherwise the operand itself."""
    value, depth = operand, 0
    while isinstance(value, Var) and depth < 20:
        node = ix.defs.get(value.name)
        if node is None or node.kind != "op" or node.op != "assign" or len(node.inputs) != 1:
            return operand
        value, depth = node.inputs[0], depth + 1
    return value if isinstance(value, Const) else operand


def _rank_lost_text(operand, ix: MethodIndex) -> str:
    """Where the proof of `operand`'s rank ends, as a reason's tail: each node whose result no fact
    gives a rank (`` `self.k_norm(...)` at line 293 ``) or parameter it comes from."""
    name = operand.name.split(".", 1)[0] if isinstance(operand, Var) else ""
    if not re.fullmatch(r"[A-Za-z_]\w*", name) or re.fullmatch(r"_t\d+", name):
        return ""
    params, nodes = [], []
    here = ix.method.pos.file if ix.method.pos is not None else None
    lost_at = ix.shapes.rank_lost_at(operand)
    for lost in sorted(lost_at, key=lambda n: n.pos.line if isinstance(n, Node) and n.pos else 0):
        if isinstance(lost, Var):
            params.append(f"`{lost.name.split('.', 1)[0]}`")
        else:
            nodes.append(_lost_node_text(lost, ix.shapes, here))
    parts = []
    if nodes:
        parts.append(f"the rank of `{name}` is not proven past {_listed(nodes)}")
    if params == [f"`{name}`"]:
        parts.append(f"`{name}` is a parameter of unknown rank")
    elif params:
        parts.append(f"`{name}` comes from parameter{'s' if len(params) > 1 else ''} {_listed(params)}, of unknown rank")
    return ": " + "; ".join(parts) if parts else ""


def _lost_node_text(lost: Node, shapes, here: str | None, depth: int = 0) -> str:
    """A node past which a rank is not proven, as a reason names it: what it computes, where, and why
    where that is known (a module the constructor is given; inside a module of the repository, where
    its `forward`'s proof ends)."""
    if lost.op == "assign" and lost.inputs and isinstance(lost.inputs[0], Sym):
        what = f"`{lost.inputs[0].text}`"
    else:
        named = lost.kind == "layer" or lost.target is not None and "(" not in lost.target
        what = f"`{lost.target if named else lost.op}(...)`"
    if lost.pos is not None:
        what += f" at line {lost.pos.line}" if lost.pos.file == here else f" at {Path(lost.pos.file).name}:{lost.pos.line}"
    given = shapes.given_to_constructor(lost)
    inside = shapes.lost_inside.get(id(lost))
    if given is not None:
        what += f" (from the constructor's parameter `{given}`, of any type)"
    elif inside is not None and depth < 2:
        inner, points = inside
        where = inner.method.pos.file if inner.method.pos is not None else None
        named = [_lost_node_text(n, inner, where, depth + 1) for n in points if isinstance(n, Node)]
        named += [f"parameter `{v.name.split('.', 1)[0]}`" for v in points if isinstance(v, Var)]
        owner = f"{inner.cls.name}.forward" if inner.cls is not None else "its forward"
        what += f" (in `{owner}`, past {_listed(named)})"
    return what


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _last_dim(match: Match, ix: MethodIndex) -> str | None:
    """`$dim` is the last dimension of `$x`: -1, or d where `$x` provably has d + 1 dimensions."""
    dim = match.bindings.get("dim")
    if not isinstance(dim, Const) or isinstance(dim.value, bool) or not isinstance(dim.value, int):
        return f"dim={_dim_text(dim, ix)} is not a constant"
    if ix.shapes.is_last(match.bindings.get("x"), dim):
        return None
    rank = rank_of(match.bindings.get("x"), ix)
    known = f" of a {rank}-D tensor" if rank is not None else ""
    return f"dim={dim.value}{known} is not provably the last dimension"


CHECKS["last_dim"] = _last_dim


def _checked_rank(value: Operand, rank: int, match: Match, ix: MethodIndex) -> str | None:
    """A run-time test that `value` has not `rank` dimensions (`keys.dim() != 4`), for a guard that
    keeps the original code where it has not: a value of unproven rank (a public module's input) whose
    axes the match reads by non-negative indices (`keys.transpose(2, 3)`, `softmax(dim=3)`) is read as
    the code means it where the test fails. The guard is tested where the rewritten statements begin,
    so the value must be held by a plain name from before the first matched statement to the match's
    root (never assigned again in between); None where it is not (a temporary, a value computed
    between, a match in an inlined helper) or the rule has no guarded form."""
    if not match.rule.guard or not isinstance(value, Var) or match.root.via:
        return None
    name = value.name.split(".", 1)[0]
    if not re.fullmatch(r"[A-Za-z_]\w*", name) or re.fullmatch(r"_t\d+|_if", name) or name == "self":
        return None
    order = {id(n): i for i, n in enumerate(ix.method.nodes)}
    placed = [order[id(n)] for n in match.matched_nodes if id(n) in order]
    root = order.get(id(match.root))
    if not placed or root is None:
        return None
    made = ix.defs.get(value.name)
    if made is None and not any(p.name == value.name for p in ix.method.params):
        return None
    start = order.get(id(made), -1) if made is not None else -1
    if made is not None and (start < 0 or start >= min(placed) or made.via):
        return None
    if any(o != value.name and o.split(".", 1)[0] == name for n in ix.method.nodes[start + 1:root + 1]
           for o in n.outputs):
        return None  # the name holds another value somewhere up to the root
    return f"{name}.dim() != {rank}"


# ops between the score product and the softmax that keep the product's rank (a number's scale, a
# fill, which broadcasts its mask to the filled tensor, a cast, a dropout)
_RANK_KEEPING = {"scale", "masked_fill", ".masked_fill", ".float", ".to", ".type_as", ".type", "dropout", ".contiguous",
                 "assign"}


def _checked_scores_rank(match: Match, ix: MethodIndex) -> tuple[int, set[str]] | None:
    """The rank of the softmax's input where run-time tests of the query's and key's ranks prove it:
    the key transposed at non-negative dimensions (r-2, r-1) has r (`_last_two_dims`), the query
    (scaled by a number at most) has r too, proven or tested, and every step from the product to the
    softmax keeps the product's rank. Returns (r, the tests); None otherwise."""
    kt, product, soft = match.nodes.get("kt"), match.nodes.get("s0"), match.nodes.get("p0")
    if kt is None or product is None or soft is None or not kt.inputs or len(product.inputs) != 2 \
            or not soft.inputs or product.target in _BATCHED_3D:
        return None
    d0, d1 = kt.kwarg("dim0"), kt.kwarg("dim1")
    dims = sorted(d.value for d in (d0, d1) if isinstance(d, Const) and type(d.value) is int)
    if len(dims) != 2 or dims[0] < 0 or dims[1] != dims[0] + 1:
        return None
    rank = dims[1] + 1
    tests: set[str] = set()
    for side, value in enumerate(product.inputs):
        if side == 0 and "qs" in match.nodes:
            value = match.bindings.get("q")  # a number's scale of the query keeps its rank
        elif side == 1:
            value = kt.inputs[0]
        known = rank_of(value, ix)
        if known == rank:
            continue
        test = _checked_rank(value, rank, match, ix) if known is None else None
        if test is None:
            return None
        tests.add(test)
    # back from the softmax's input to the product, through rank-keeping steps of the match
    matched = {id(n) for n in match.matched_nodes}
    current = soft.inputs[0]
    while isinstance(current, Var) and current.name not in product.outputs:
        node = ix.defs.get(current.name)
        if node is None or id(node) not in matched or node.kind != "op" or node.op not in _RANK_KEEPING \
                or not node.inputs:
            return None
        current = node.inputs[0]
    return (rank, tests) if isinstance(current, Var) else None


def _last_two_dims(match: Match, ix: MethodIndex) -> str | None:
    """The transpose bound as `$kt` swaps the last two dimensions of `$k`: (-2, -1), or (r-2, r-1)
    where `$k` provably has r dimensions, or is tested to have them at run time where the softmax is
    over dimension r-1 (`_checked_rank`: the original is kept where it has not)."""
    for key in ("kt", "pt"):  # the key's transpose; the probabilities' (output read back channels-first)
        node = match.nodes.get(key)
        if node is None:
            continue
        d0, d1 = node.kwarg("dim0"), node.kwarg("dim1")
        if not (isinstance(d0, Const) and isinstance(d1, Const) and isinstance(d0.value, int) and isinstance(d1.value, int)):
            return "the transpose's dimensions are not constants"
        if ix.shapes.swaps_last_two(node):
            continue
        dims = sorted((d0.value, d1.value))
        product = match.nodes.get("s0" if key == "kt" else "out")
        if dims == [1, 2] and product is not None and product.target in _BATCHED_3D:
            continue  # a bmm operand is 3-D wherever the code runs (bmm raises on any other rank)
        rank = rank_of(node.inputs[0], ix) if node.inputs else None
        soft = match.nodes.get("p0")
        soft_dim = _softmax_dim(soft, ix) if soft is not None else None
        # only where the code states that rank again by the softmax's own non-negative dimension:
        # `softmax(dim=-1)` holds for any rank, and the transpose alone is no sign of one
        test = _checked_rank(node.inputs[0], dims[1] + 1, match, ix) \
            if key == "kt" and rank is None and dims[0] >= 0 and dims[1] == dims[0] + 1 \
            and soft_dim == Const(dims[1]) else None
        if test is not None:
            match.runtime_checks.add(test)
            continue
        known = f" of a {rank}-D tensor" if rank is not None else ""
        lost = _rank_lost_text(node.inputs[0], ix) if node.inputs and rank is None else ""
        return f"transpose({dims[0]}, {dims[1]}){known} is not provably a swap of the last two dimensions{lost}"
    return None


CHECKS["last_two_dims"] = _last_two_dims


def _softmax_over_key_axis(match: Match, ix: MethodIndex) -> str | None:
    """The softmax bound as `$p0` normalizes over the key axis: the axis the score product `$s0`
    took from its right operand (its last axis), wherever transposes moved it and whatever constant
    names it (`dim=-1`, `dim=3` of a 4-D value, `dim=2` after `bmm`). An axis held by a setting of
    the module (`dim=self.dim`, set in `__init__` from one of its parameters or an integer) is the
    key axis where the setting names it: the original is kept when it does not (`self.dim != 2`,
    the key axis of proven 3-D scores; `self.dim != -1` where their rank is unproven)."""
    soft, scores = match.nodes.get("p0"), match.nodes.get("s0")
    if soft is None or scores is None or not scores.outputs:
        return None
    dim = _softmax_dim(soft, ix)
    facts = ix.shapes
    source = soft.inputs[0] if soft.inputs else None
    setting = _setting(dim, ix)
    if setting is not None:
        # the key axis is the last one, by its index where the rank is known (`bmm` scores, only masked
        # and scaled since, are 3-D wherever the code runs)
        rank = facts.rank(source)
        if rank is None and scores.target in _BATCHED_3D and not {"s0p", "sv", "s2u"} & match.nodes.keys():
            rank = 3
        match.setting_guards.add(f"{setting} != {rank - 1 if rank is not None else -1}")
        dim = Const(-1)
    if not isinstance(dim, Const) or isinstance(dim.value, bool) or not isinstance(dim.value, int):
        held = facts.attribute_of(dim)
        if held is not None:
            return (f"softmax dim={held} is not a constant, and `__init__` does not set `{held}` from one of "
                    "its parameters or an integer (a setting a guard could test)")
        return f"softmax dim={_dim_text(dim, ix)} is not a constant"
    product = facts.shape(Var(scores.outputs[0]))
    axis = facts.axis(source, dim)
    rank = facts.rank(source)
    known = f" of a {rank}-D tensor" if rank is not None else ""
    if product is not None and axis is not None:
        if axis.id == product.axes[-1].id:
            return None
        if is_one_row(scores) and axis.id in {a.id for a in product.axes[:-1]}:
            # (the scores of a single query have no query axis: every other one is a batch axis)
            return f"softmax dim={dim.value}{known} is over a batch axis, not the key axis"
        if len(product.axes) >= 2 and axis.id == product.axes[-2].id:
            return f"softmax dim={dim.value}{known} is over the query axis, not the key axis"
    # the statements between the product and the softmax are the pattern's elementwise ones, which
    # keep every axis where it is: the last axis there is the key axis even where a merge of branches
    # (a bias added on one path only) lost the identity (not so after a permute of the scores)
    if "s0p" not in match.nodes and facts.is_last(source, dim):
        return None
    checked = _checked_scores_rank(match, ix) if rank is None and dim.value >= 0 and "s0p" not in match.nodes else None
    if checked is not None and dim.value == checked[0] - 1:
        # the last axis where the query and key have the ranks the run-time tests require
        match.runtime_checks.update(checked[1])
        return None
    return f"softmax dim={dim.value}{known} is not provably the key axis (the last dimension of the scores)"


CHECKS["softmax_over_key_axis"] = _softmax_over_key_axis


def _softmax_dim(soft: Node, ix: MethodIndex):
    """The dimension a softmax is over: its `dim`, a softmax layer's, or the constant a variable
    passed for it holds."""
    dim = soft.kwarg("dim")
    if dim is None and soft.kind == "layer":
        layer = ix.layer_for(soft)
        dim = layer.kwarg("dim", layer.args[0] if layer is not None and layer.args else None) if layer else None
    return _held_constant(dim, ix)


def _setting(operand, ix: MethodIndex) -> str | None:
    """`self.<name>` where `operand` is that attribute (or a variable assigned from it) and it is a
    setting of the module, fixed when the module is built (engine.analysis.numbers
    `attribute_is_setting`): a test of it decides once which code runs."""
    text = ix.shapes.attribute_of(operand)
    tree = tree_of(ix.file.path) if text is not None else None
    return text if tree is not None and text is not None and attribute_is_setting(tree, ix.cls.name, text[5:]) else None


def _keep_mask_fill_is_lowest(match: Match, ix: MethodIndex) -> str | None:
    """`torch.where(keep, s, fill)` drops the keys where `keep` is False exactly when `fill` is the
    lowest value of the scores' own dtype: `torch.finfo(s.dtype).min`, wrapped as a 0-d tensor of
    that dtype (`torch.full([], v, dtype=s.dtype)`, `torch.tensor(v, dtype=s.dtype)`) and moved
    with `.to(device)`. A cast of the scores inside the `where` must be to their own dtype."""
    where = match.nodes.get("s2")
    if where is None or where.op != "torch.where":
        return None
    scores = {i.name for i in where.inputs[1:2] if isinstance(i, Var)}
    cast = match.nodes.get("sc")
    if cast is not None:
        scores |= {i.name for i in cast.inputs[:1] if isinstance(i, Var)}

    def dtype_of_scores(value) -> bool:
        node = ix.defs.get(value.name) if isinstance(value, Var) else None
        return node is not None and node.op == "getattr" and node.inputs[1:] == (Const("dtype"),) \
            and isinstance(node.inputs[0], Var) and node.inputs[0].name in scores

    for name, what in (("scdtype", "the scores' cast"), ("fdtype", "torch.finfo"), ("fdtype2", "the fill tensor")):
        if name in match.bindings and not dtype_of_scores(match.bindings[name]):
            return f"the dtype of {what} in the `torch.where` mask is not provably the scores' own dtype"
    fill = match.nodes.get("fillt")
    if fill is not None and fill.op == "torch.full":
        shape = fill.inputs[0] if fill.inputs else None
        empty = (isinstance(shape, Sym) and shape.text.replace(" ", "") in ("[]", "()")) \
            or (isinstance(shape, Const) and shape.value == ()) or (isinstance(shape, Seq) and not shape.items)
        if not empty:
            return "the `torch.where` fill is not a 0-d tensor (`torch.full([], ...)`)"
    return None


CHECKS["keep_mask_fill_is_lowest"] = _keep_mask_fill_is_lowest


_NUMBER_OPS = {"add", "sub", "mul", "div", "floordiv", "mod", "pow", "neg", ".size", ".dim", ".numel", "len",
               "math.sqrt", "math.log", "math.exp", "float", "int"}


def _is_number(operand, ix: MethodIndex, depth: int = 0) -> bool:
    """Proven a Python number: a numeric literal, or arithmetic of numbers and tensor sizes
    (`value.size(-1) ** 0.5`)."""
    if isinstance(operand, Const):
        return numeric(operand) is not None
    if isinstance(operand, Sym):
        return bool(re.fullmatch(r"[\d.eE+\-*/() ]+", operand.text))
    if not isinstance(operand, Var) or depth > 8:
        return False
    node = ix.defs.get(operand.name)
    if node is None or node.kind != "op" or node.op not in _NUMBER_OPS:
        return False
    if node.op in (".size", ".dim", ".numel", "len"):
        return node.op != ".size" or (len(node.inputs) == 2 and isinstance(node.inputs[1], Const))
    operands = [*node.inputs, *(v for k, v in node.kwargs if k == "exponent")]
    return bool(operands) and all(_is_number(i, ix, depth + 1) for i in operands)


def _score_divisor_is_number(match: Match, ix: MethodIndex) -> str | None:
    """A 0-d tensor of a number dividing the scores (GPT-2's `s / torch.full([], v.size(-1) ** 0.5,
    dtype=s.dtype, device=s.device)`) is that number: the kernel's scale is its inverse, and the
    dtype and device it read from the scores go with it (`$tdiv_number`; `$tdiv_tensor` keeps the
    tensor bound, read by no template)."""
    divisor = match.bindings.get("tdiv")
    node = ix.defs.get(divisor.name) if isinstance(divisor, Var) else None
    if node is None or node.op not in ("torch.full", "torch.tensor") or any(k == "requires_grad" for k, _ in node.kwargs):
        return None
    value = node.inputs[1] if node.op == "torch.full" and len(node.inputs) == 2 else \
        node.inputs[0] if node.op == "torch.tensor" and len(node.inputs) == 1 else None
    if node.op == "torch.full":
        shape = node.inputs[0]
        empty = (isinstance(shape, Sym) and shape.text.replace(" ", "") in ("[]", "()")) \
            or (isinstance(shape, Const) and shape.value == ()) or (isinstance(shape, Seq) and not shape.items)
        if not empty:
            return None
    if value is None or not _is_number(value, ix):
        return None
    match.bindings["tdiv_number"] = value
    match.bindings["tdiv_tensor"] = match.bindings.pop("tdiv")
    return None


CHECKS["score_divisor_is_number"] = _score_divisor_is_number


def _score_factor_is_constant(match: Match, ix: MethodIndex) -> str | None:
    """A tensor `$temp` multiplying the scores (a learned temperature), or `$tdiv` dividing them (a 0-d
    `torch.full([], sqrt(d))`), is constant along their last two axes (query and key): its rank is
    proven and those axes are size 1 (`nn.Parameter(torch.ones(heads, 1, 1))`), or it has none, so it
    can be folded into the query (`(q * temp) @ k^T == (q @ k^T) * temp`) and SDPA runs with
    `scale=1.0`; gradients still reach the parameter. A factor that is a Python number is folded the
    same way: a function parameter proven one (engine.analysis.numbers: a fused kernel's `scale` in
    the same function, or what every call of a private helper passes), or None (`s * None` and
    `q * None` both raise); and a tensor proven to hold one element (a parameter built in `__init__`
    as `torch.tensor` of a constructor argument that a layer size proves one element). A parameter
    of a private function has the shape every call passes (engine/analysis/shapes.py
    `param_shape`: `self.logit_scale` of the calling class, built in its `__init__`); of a public
    one, which code outside the repository may call with anything, the near-miss names what the
    file's calls pass."""
    key = "temp" if "temp" in match.bindings else "tdiv" if "tdiv" in match.bindings else None
    if key is None:
        return None
    temp = match.bindings[key]
    shape = ix.shapes.shape(temp)
    if shape is not None and shape.exact and all(a.unit for a in shape.axes[-2:]):
        return None
    if ix.shapes.number(temp, none_ok=True):
        return None  # a Python number (folded into q as well: where it is None, both raise)
    if ix.shapes.single_element(temp):
        return None  # one element: constant along every axis, whatever its rank
    node = ix.defs.get(temp.name) if isinstance(temp, Var) else None
    text = getattr(temp, "text", None) or (node.target if node is not None and node.target else None) \
        or getattr(temp, "name", "the factor").split(".")[0]
    if re.fullmatch(r"_t\d+", text) and node is not None:
        text = node.op  # a value with no name of its own (`torch.ones(...)` written in the expression)
    if shape is not None and shape.exact:
        return f"the score factor `{text}` varies along the query or key axis (its last two axes are not size 1)"
    public = ix.shapes.public_callers(temp)
    if public is not None:
        return f"the score factor `{text}` is not provably constant along the query and key axes ({public})"
    return f"the score factor `{text}` is not provably constant along the query and key axes"


CHECKS["score_factor_is_constant"] = _score_factor_is_constant


def _row_max_over_key_axis(match: Match, ix: MethodIndex) -> str | None:
    """Subtracting the scores' maximum over the key axis (`s - s.amax(-1, keepdim=True)`, detached
    or not, or `s.max(dim=-1, keepdim=True)[0]`) before the softmax changes nothing: the softmax is
    invariant to a per-row constant. So it is right after the product (`$rmax0`, BEATs' `(w -
    w.max(dim=-1, keepdim=True)[0]) * alpha`): the scale that follows, the masks and fills add to
    each row that constant times a factor, which the softmax drops as well."""
    for key in ("rmax", "rmax0"):
        node = match.nodes.get(key)
        if node is not None and not ix.shapes.is_last(node.inputs[0] if node.inputs else None, node.kwarg("dim")):
            return f"the maximum subtracted before the softmax is over dim={_dim_text(node.kwarg('dim'))}, not " \
                "provably the key axis"
    return None


CHECKS["row_max_over_key_axis"] = _row_max_over_key_axis


def _stats_over_last_axis(match: Match, ix: MethodIndex) -> str | None:
    """The statistics of a norm (the mean bound as `$mu` or `$ms`, the variance as `$var`, or as
    E[x^2] - E[x]^2 with the mean of squares `$ex2`) are taken
    over one axis of their input. Over the last one (`dim=-1`, or d where the input provably has
    d + 1 axes) the fused kernel computes them as they are. Over another constant axis d (a
    channels-first norm, `dim=1` of NCHW) the kernel normalizes the input with that axis moved last
    and the result is moved back: `$axis` and `$axis_end` are bound (d and d + 1), and the rule's
    template applies the weight and bias outside the kernel with the code's own broadcasting, so no
    fact about their shapes is needed. Over a tuple of axes computed at run time that is provably the
    last len(N) axes (`tuple(-(i + 1) for i in range(len(self.normalized_shape)))`;
    engine/analysis/shapes.py `trailing_axes`) the kernel normalizes over N: `$nshape` is bound to
    N, and the statements computing the tuple go with the match where nothing else reads them; so
    is the last axis where an earlier assert proves len(N) == 1 (engine/analysis/shapes.py
    `asserted_single`), the assert going with the match. Over several constant axes (a tuple
    written out, or held by a local the statistics alone read: `stat_dim = (1, 3)`, which goes with
    the match) `$axes` and `$last` are bound (the axes in increasing order, and as many trailing
    ones): the kernel normalizes the input with them moved last by one movedim, over their sizes,
    and the result is moved back, the weight and bias again applied as written (for a rule whose
    template reads `$axes`; for another, several axes are a near-miss). Over one axis an
    attribute holds (`dim = self.dim`) that is proven an integer (set in `__init__` from integer
    arithmetic of parameters every construction in the file passes integers for, `dim if dim >= 0
    else total_dim + dim`; engine/analysis/shapes.py `int_attribute`), `$axis` alone is bound, to
    that value: the kernel normalizes the input with it moved last, over its size, and the result
    is moved back. Constant axes that are the trailing ones of the input, counted from the end
    (`dim=(-2, -1)`) or its rank proven or tested by a branch the statistics are under (`if x.dim() ==
    3:`), bind `$from` (the first of them) for a rule whose template reads it: the kernel normalizes
    `x.shape[from:]` as it is; a list or tuple of one axis (`dim=[-1]`) is that axis. A list of axes the
    function is given is tested at run time to be the trailing ones (`_checked_trailing`)."""
    axes: set[int | tuple[int, ...]] = set()  # one constant axis, or several (in increasing order)
    trailing: dict[str, Operand] = {}  # the normalized shape N of statistics over the last len(N) axes
    computed: list = []  # the nodes computing those tuples of axes
    runtime: dict[str, Operand] = {}  # one axis held by an attribute proven an integer (`self.dim`)
    tails: set[tuple[int, ...]] = set()  # constant axes proven the trailing ones of their input
    listed: dict[str, tuple[Var, Operand | None]] = {}  # a list of axes passed in, and the input it is of
    for key in ("mu", "ms", "var", "ex2"):
        node = match.nodes.get(key)
        if node is None or node.op == "sub":
            continue  # the variance as E[x^2] - E[x]^2: its statistics are `$ex2` and `$mu`
        dim = node.kwarg("dim")
        source = node.inputs[0] if node.inputs else None
        if ix.shapes.is_last(source, dim):
            single = ix.shapes.asserted_single(node)
            if single is None:
                axes.add(-1)
                continue
            # the last axis where an assert proves len(N) == 1: the trailing len(N) axes
            trailing[render(single[0])] = single[0]
            computed.extend(n for n in single[1] if n not in computed)
            continue
        found = ix.shapes.trailing_axes(dim)
        if found is not None:
            trailing[render(found[0])] = found[0]
            computed.extend(n for n in found[1] if n not in computed)
            continue
        rank = ix.shapes.rank_where(source, node.guard)
        constant = ix.shapes.constant_axes(dim)
        if constant is None and ix.shapes.int_attribute(dim) is not None:
            runtime[render(dim)] = dim  # an attribute proven an integer: one axis, known at run time
            continue
        attribute = ix.shapes.attribute_of(dim)
        if attribute is not None:
            return (f"the statistics are over `{attribute}`, not proven to hold one integer axis (set once in "
                    "`__init__`, an integer literal at every construction in the file)")
        if constant is None and isinstance(dim, Var):
            listed[dim.name] = (dim, source)
            continue
        if constant is None or (rank is not None and any(not -rank <= d < rank for d in constant[0])):
            known = f" of a {rank}-D tensor" if rank is not None else ""
            return f"the statistics are over dim={_dim_text(dim)}{known}, not axes the kernel can normalize"
        computed.extend(n for n in constant[1] if n not in computed)  # a local holding the axes
        held = tuple(sorted(d if d >= 0 or rank is None else d + rank for d in constant[0]))
        if len(held) == 1 and held[0] in (-1, None if rank is None else rank - 1):
            axes.add(-1)  # the last axis written as a one-item list (`dim=[-1]`)
            continue
        axes.add(held[0] if len(held) == 1 else held)
        if len(held) > 1 and held == tuple(range(rank - len(held), rank) if rank is not None else range(-len(held), 0)):
            tails.add(held)  # the trailing axes: of a proven rank, or counted from the end (`dim=(-2, -1)`)
    if len(axes) + len(trailing) + len(runtime) + len(listed) > 1:
        if listed and not axes and not trailing and not runtime:
            dim = next(iter(listed.values()))[0]
            return f"the statistics are over `{dim.name.split('.')[0]}`, not one axis nor provably the trailing axes"
        return "the mean and the variance are taken over different axes"
    if listed:
        return _checked_trailing(match, *next(iter(listed.values())))
    # the tuples of axes, or the locals holding them, are read by the statistics alone: they go with them
    match.companions.extend(n for n in computed if n not in match.companions)
    if runtime:
        # the axis is moved last and back at run time; the normalized shape is its size
        match.bindings["axis"] = next(iter(runtime.values()))
        return None
    if trailing:
        # over the last len(N) axes: the kernel normalizes over them itself, given N
        match.bindings["nshape"] = next(iter(trailing.values()))
        return None
    held = axes.pop() if axes else -1
    if held in tails and "$from" in (match.rule.rewrite or ""):
        # the trailing axes of the input (its rank proven, or tested by a branch it is under): the
        # kernel normalizes them as they are, over the sizes from the first on
        match.bindings["from"] = Const(held[0])
        return None
    if isinstance(held, tuple) and "$axes" not in (match.rule.rewrite or ""):
        return f"the statistics are over the axes {held}, which the rule's rewrite has no form for"
    if isinstance(held, tuple):
        # several axes: moved last in their order and back; the kernel normalizes over their sizes
        match.bindings["axes"], match.bindings["last"] = Const(held), Const(tuple(range(-len(held), 0)))
    elif held != -1:
        match.bindings["axis"], match.bindings["axis_end"] = Const(held), Const(held + 1)
    return None


def _checked_trailing(match: Match, dims: Var, source: Operand | None) -> str | None:
    """Statistics over a list of axes the function is given (asteroid's `z_norm(x, dims, eps)`):
    where they are the trailing ones, the kernel normalizes over the last `len(dims)` sizes. That is
    tested at run time, the original kept where it fails (`dims != list(range(x.dim() - len(dims),
    x.dim()))`: axes written otherwise, negative or out of order, keep it too), for a rule whose
    template reads `$count`; the list and the input must be the function's parameters as given
    (assigned nowhere in it), so that the test reads what the statistics read. Binds `$count`."""
    name = dims.name
    why = f"the statistics are over `{name.split('.')[0]}`, not one axis nor provably the trailing axes"
    if "$count" not in (match.rule.rewrite or "") or not isinstance(source, Var):
        return why
    params = {p.name for p in match.method.params if p.kind == "normal"}
    assigned = {out.split(".")[0] for node in match.method.nodes for out in node.outputs}
    if not {name, source.name} <= params or {name, source.name} & assigned:
        return why + " (a run-time test of them needs the function's own parameters, assigned nowhere in it)"
    x = source.name
    match.bindings["count"] = Sym(f"len({name})")
    match.runtime_checks.add(f"{name} != list(range({x}.dim() - len({name}), {x}.dim()))")
    return None


CHECKS["stats_over_last_axis"] = _stats_over_last_axis


def _affine_in_kernel(match: Match, ix: MethodIndex) -> str | None:
    """The weight `$w` and bias `$b` of a norm over the last axis go into the fused kernel
    (`layer_norm(x, x.shape[-1:], w, b, eps)`) only where their shape is proven to be the kernel's
    (N,): one axis, not of size 1 (engine/analysis/shapes.py: `nn.Parameter(torch.ones(dim))` built
    in `__init__`, or what every call of a private helper passes). The kernel takes nothing else,
    where the code's product broadcasts any shape: a weight of shape (1, 1, N) or (3, 1), a scalar, a
    gate of the input's own shape. Nor where the input is cast to a named dtype (`x = x.float()`
    before the statistics) and the parameter is not proven of that dtype: the kernel takes a weight
    of another dtype than its input at most for a half-precision input (returning that dtype), where
    the code's product promotes. Otherwise they are bound as `$w_out` and `$b_out` and the
    template applies them after the kernel as the code wrote them (`layer_norm(x, ...) * w + b`);
    the bias goes out too where the weight does (it is added after the product). Statistics over
    another axis, several axes or a run-time tuple of axes (`$axis`, `$axes`, `$from`, `$count`,
    `$nshape` bound by `stats_over_last_axis`, which must come first) apply them outside already,
    or where N may have several axes, outside as well."""
    if any(k in match.bindings for k in ("axis", "axes", "from", "count")):
        return None  # the template applies the weight and bias after the kernel, as written
    several = "nshape" in match.bindings  # N of len(N) axes: a 1-D weight is its shape only where len(N) == 1
    cast = ix.shapes.dtype(match.bindings.get("x"))
    cast = cast if cast is not None and not cast.startswith("@") else None  # a named dtype the input is cast to

    def fits(operand: Operand) -> bool:
        return _one_axis(operand, ix) and (cast is None or ix.shapes.dtype(operand) == cast)

    w_inside = "w" not in match.bindings or not several and fits(match.bindings["w"])
    if not w_inside:
        match.bindings["w_out"] = match.bindings.pop("w")
    if "b" in match.bindings and (not w_inside or several or not fits(match.bindings["b"])):
        match.bindings["b_out"] = match.bindings.pop("b")
    return None


def _one_axis(operand: Operand, ix: MethodIndex) -> bool:
    """`operand` provably has one axis, not provably of size 1."""
    shape = ix.shapes.shape(operand)
    return shape is not None and shape.exact and len(shape.axes) == 1 and not shape.axes[0].unit


CHECKS["affine_in_kernel"] = _affine_in_kernel


_BATCHED_3D = {"torch.bmm", ".bmm", "torch.baddbmm", ".baddbmm"}


def _products_run_as_written(match: Match, ix: MethodIndex) -> str | None:
    """Every matched `torch.bmm` takes 3-D operands: a `bmm` of a value with a proven other rank raises
    as written, so that path computes nothing a rewrite could preserve (and must not be made to run)."""
    for node in match.nodes.values():
        if node.op != "matmul" or node.target not in _BATCHED_3D:
            continue
        for operand in node.inputs[:2]:
            rank = ix.shapes.rank(operand)
            if rank is not None and rank != 3:
                return f"`{node.target}` of a {rank}-D tensor raises as written (bmm takes 3-D operands)"
    return None


CHECKS["products_run_as_written"] = _products_run_as_written


# ---------------------------------------------------------------------------------------------
# Mask and dropout semantics of the attention rewrite. These checks never reject: they bind the
# variables the rule's rewrite template reads, so that the kernel call computes what the original
# computes on every row and in every mode (the template has no conditionals of its own).

_INFINITE_FILLS = {"float('-inf')", 'float("-inf")', "-float('inf')", '-float("inf")', "-math.inf", "-torch.inf",
                   "-numpy.inf", "-np.inf", "float('-Infinity')", 'float("-Infinity")'}


def _fill_is_infinite(value) -> bool:
    if isinstance(value, Sym):
        return value.text.replace(" ", "") in _INFINITE_FILLS
    number = numeric(value) if isinstance(value, Const) else None
    return number is not None and number == float("-inf")


def _refilled(match: Match) -> bool:
    """The probabilities are filled with 0 under the fill's mask after the softmax, before the
    dropout (`$pr`) or after it (`$pz`): a zero stays zero under dropout, so either sets the rows
    whose every key is masked to 0 (NaN there under a -inf fill, the average of v under a finite one)
    and changes no other entry (a masked key's probability is already 0 in a row that keeps one)."""
    return "pr" in match.nodes or "pz" in match.nodes


def _fully_masked_rows_keep_original(match: Match, ix: MethodIndex) -> str | None:
    """A query row whose every key is masked by `masked_fill(mask, fill)` is, in the original, the
    softmax of equal values: the plain average of `v` for a finite fill (-1e9, finfo.min), NaN for
    -inf. The rewrite unmasks those rows (so that the kernel computes no NaN, forward or backward).
    For a finite fill it zeroes their queries (`$zero_query`: scores 0, so the kernel averages `v`
    and no gradient reaches `q` or `k`, as `masked_fill` blocks it); for an infinite fill it binds
    `$nan_rows` so the template sets those output rows to NaN. Where the probabilities are filled
    with 0 under the same mask after the softmax (`$pz`, speechbrain's fix-up of NaN rows; `$pr`
    before the dropout, funasr's), those rows are 0 whatever the fill, and so `$nan_rows` is 0.
    Where the output rows are set, their queries need not be zeroed: that fill of the output passes
    no gradient back to them."""
    if _refilled(match):
        match.bindings["nan_rows"] = Const(0.0)
    elif "fmask" in match.bindings and all(_fill_is_infinite(v) for v in _fill_values(match.bindings.get("fill"), ix)):
        match.bindings["nan_rows"] = Sym('float("nan")')
    elif "fmask" in match.bindings:
        # the rows average v: their queries are zeroed (where the rows are set to NaN or 0 on the
        # output instead, their queries need not be: that fill passes no gradient back to them)
        match.bindings["zero_query"] = Const(0)
    return None


def _dropout_when_original_drops(match: Match, ix: MethodIndex) -> str | None:
    """The kernel drops exactly when the original's dropout does: a dropout module when that module
    is in training mode (`$dtraining` = `<module>.training`); `F.dropout(x, p)` always (its `training`
    defaults to True, so it drops in eval mode too); `F.dropout(x, p, training=t)` when `t` holds;
    `training=False` never (`$dp` is unbound, no `dropout_p`)."""
    node = match.nodes.get("p2")
    if node is None or "dp" not in match.bindings:
        return None
    if node.kind == "layer":
        if node.target:
            match.bindings["dtraining"] = Sym(f"{node.target}.training")
        return None
    training = node.kwarg("training")
    if training is None or (isinstance(training, Const) and training.value is True):
        return None  # always drops: dropout_p=$dp
    if isinstance(training, Const) and training.value is False:
        del match.bindings["dp"]  # never drops
        return None
    match.bindings["dtraining"] = training
    return None


CHECKS["fully_masked_rows_keep_original"] = _fully_masked_rows_keep_original
CHECKS["dropout_when_original_drops"] = _dropout_when_original_drops


def _permutation(node: Node) -> tuple[int, ...] | None:
    """The dimensions of `x.permute(...)` when they are constants naming every axis once."""
    dims = node.inputs[1:]
    if len(dims) == 1 and isinstance(dims[0], Const) and isinstance(dims[0].value, tuple):
        values = dims[0].value
    elif dims and all(isinstance(d, Const) for d in dims):
        values = tuple(d.value for d in dims)  # type: ignore[union-attr]
    else:
        return None
    if node.kwargs or any(type(v) is not int for v in values) or sorted(values) != list(range(len(values))):
        return None
    return values


def _index_min_rank(text: str) -> int | None:
    """The least rank of `x[text]` for an index of slices, `None`s, integers and `...` (each slice
    keeps an axis of `x`, each `None` adds one, an integer removes one): slices plus `None`s."""
    try:
        tree = ast.parse(f"x[{text}]", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    index = tree.slice if isinstance(tree, ast.Subscript) else None
    items = index.elts if isinstance(index, ast.Tuple) else [index]
    count = 0
    for item in items:
        if isinstance(item, ast.Slice) and all(b is None or isinstance(b, ast.Constant) for b in
                                                (item.lower, item.upper, item.step)):
            count += 1
        elif isinstance(item, ast.Constant) and (item.value is None or type(item.value) is int):
            count += item.value is None
        elif not (isinstance(item, ast.Constant) and item.value is Ellipsis):
            return None  # a tensor index: any rank
    return count


def _items_min_rank(items: tuple, ix: MethodIndex) -> int | None:
    """`_index_min_rank` of an index the extractor split into items (`[:n, :n, None, :]`, whose
    slices of names are `slice` nodes): slices plus `None`s; None where an item may be a tensor."""
    count = 0
    for item in items:
        made = ix.defs.get(item.name) if isinstance(item, Var) else None
        if made is not None and made.kind == "op" and made.op == "slice":
            count += 1
        elif isinstance(item, Const) and (item.value is None or type(item.value) is int):
            count += item.value is None
        elif isinstance(item, Sym) and (one := _index_min_rank(item.text)) is not None and "," not in item.text:
            count += one
        else:
            return None
    return count


_BROADCASTING = {"mul", "add", "sub", "compare:eq", "compare:ne", "compare:lt", "compare:le", "compare:gt",
                 "compare:ge", "and_", "or_", "xor", "invert", "torch.logical_and", "torch.logical_or",
                 "torch.logical_not", ".bool", ".to", ".float"}


def _min_rank(operand, ix: MethodIndex, depth: int = 0, before: Pos | None = None) -> int:
    """A rank `operand` provably has at least: its proven axes, the axes an index of slices and
    `None`s gives, the largest of an elementwise op's operands (broadcasting keeps every axis), one
    more than what it unsqueezes; for a parameter of the method, one more than the largest axis
    `x.shape[k]` reads wherever the method runs, before `before` (`_shape_read_rank`)."""
    shape = ix.shapes.shape(operand)
    known = len(shape.axes) if shape is not None else 0
    node = ix.defs.get(operand.name) if isinstance(operand, Var) and depth < 8 else None
    if node is None and isinstance(operand, Var) and before is not None \
            and operand.name in {p.name for p in ix.method.params}:
        return max(known, _shape_read_rank(operand.name, ix, before))
    if node is None or node.kind != "op":
        return known
    if node.op in (".unsqueeze", "torch.unsqueeze") and node.inputs and isinstance(node.inputs[0], Var):
        return max(known, _min_rank(node.inputs[0], ix, depth + 1, before) + 1)
    if node.op == "assign" and len(node.inputs) == 1 and isinstance(node.inputs[0], Var) and not node.kwargs:
        return max(known, _min_rank(node.inputs[0], ix, depth + 1, before))
    if node.op == "getitem" and len(node.inputs) == 2 and isinstance(node.inputs[1], Sym):
        return max(known, _index_min_rank(node.inputs[1].text) or 0)
    if node.op == "getitem" and len(node.inputs) == 2 and isinstance(node.inputs[1], Seq):
        return max(known, _items_min_rank(node.inputs[1].items, ix) or 0)
    if node.op in _BROADCASTING:
        return max([known, *(_min_rank(i, ix, depth + 1, before) for i in node.inputs if isinstance(i, Var))])
    return known


def _shape_read_rank(name: str, ix: MethodIndex, before: Pos) -> int:
    """The least rank that the reads `name.shape[k]` (`k` a constant >= 0) of the method prove: such
    a read raises unless the value has more than `k` axes. Only a read of the method's own code (no
    helper) in a statement of its body's top level (every call runs it), ended before `before` and
    before any statement binding `name` again, outside `with` and `try` blocks, and evaluated
    whenever its statement completes: not in a branch of a conditional expression, a lambda or a
    comprehension, and in a boolean operation only in its first operand or, in an `assert` of
    `and`s, in any (the assert raises unless each was read)."""
    tree = tree_of(ix.file.path)
    fn_pos = ix.method.pos
    if tree is None or fn_pos is None or before.file != fn_pos.file:
        return 0
    fn = next((f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               and f.lineno == fn_pos.line and f.col_offset == fn_pos.col), None)
    if fn is None:
        fn = next((f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and f.name == ix.method.name and f.lineno <= fn_pos.line <= (f.end_lineno or f.lineno)), None)
    if fn is None:
        return 0
    best = 0
    for stmt in fn.body:
        if (stmt.end_lineno or stmt.lineno) >= before.line or any(
                isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load) for n in ast.walk(stmt)):
            break  # past the match, or `name` bound again: later reads are of another value
        if isinstance(stmt, (ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                or not isinstance(stmt, (ast.Assert, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr, ast.If)):
            continue
        roots: list[ast.AST] = [stmt.test] if isinstance(stmt, (ast.Assert, ast.If)) else \
            [stmt.value] if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Expr, ast.AnnAssign)) and stmt.value else []
        best = max([best, *(_reads_always(r, name, isinstance(stmt, ast.Assert)) for r in roots)])
    return best


def _reads_always(expr: ast.AST, name: str, asserted: bool) -> int:
    """One more than the largest `k` of the reads `name.shape[k]` that evaluating `expr` always makes
    (see `_shape_read_rank`); 0 where none."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Attribute) and expr.value.attr == "shape" \
            and isinstance(expr.value.value, ast.Name) and expr.value.value.id == name \
            and isinstance(expr.slice, ast.Constant) and type(expr.slice.value) is int and expr.slice.value >= 0:
        return expr.slice.value + 1
    if isinstance(expr, ast.BoolOp):
        always = expr.values if asserted and isinstance(expr.op, ast.And) else expr.values[:1]
        return max(_reads_always(v, name, asserted) for v in always)
    if isinstance(expr, (ast.IfExp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return 0
    if isinstance(expr, ast.Compare):
        return _reads_always(expr.left, name, False) if len(expr.ops) > 1 else \
            max(_reads_always(expr.left, name, False), _reads_always(expr.comparators[0], name, False))
    return max([0, *(_reads_always(c, name, False) for c in ast.iter_child_nodes(expr))])


def _moved_axes(back: tuple[int, ...], rank: int | None, least: int) -> str | None:
    """The method call that takes a tensor in the permuted layout to the kernel's (`back`: the
    permute that does it for a tensor of the scores' rank): that `permute` for a tensor of that rank,
    else a `movedim` of the trailing axes the permute moves, for a tensor of at least that many axes
    (it broadcasts from the right); None where neither is proven."""
    n = len(back)
    fixed = next((i for i, d in enumerate(back) if d != i), n)
    if fixed == n:
        return ""
    if rank == n:
        return f".permute({', '.join(map(str, back))})"
    moved = n - fixed
    if least < moved or (rank is not None and rank > n):
        return None
    want = [d - n for d in back[fixed:]]  # the source (negative) of each trailing position
    start = list(range(-moved, 0))
    for a in start:
        for b in start:
            order = [x for x in start if x != a]
            order.insert(b + moved, a)
            if order == want:
                return f".movedim({a}, {b})"
    return f".movedim({tuple(want)}, {tuple(start)})"


def _scores_permuted_back(match: Match, ix: MethodIndex) -> str | None:
    """Scores permuted after their product (`$s0p`: an einsum's output order, LoFTR's heads-last
    `'nlhd,nshd->nlsh'`) are the kernel's scores with their axes moved, wherever the softmax's axis
    went (constraint `softmax_over_key_axis` follows the axes): the probabilities must be permuted
    back (`$p3`, the inverse permutation) before the product with the value, and each mask, held in
    the permuted layout, is moved to the kernel's by that inverse too: a mask of the scores' proven
    rank by the same `permute`, one of unproven rank by a `movedim` of the trailing axes it moves
    where the mask provably has them all (a mask broadcasts from the right)."""
    there, back = match.nodes.get("s0p"), match.nodes.get("p3")
    if there is None and back is None:
        return None
    perm = _permutation(there) if there is not None else None
    inverse = _permutation(back) if back is not None else None
    if perm is None or inverse is None:
        return "the scores' axes are not permuted after their product and back before the product with the value " \
            "by constant permutations"
    if len(perm) != len(inverse) or any(perm[inverse[i]] != i for i in range(len(perm))):
        return "the probabilities are not permuted back to the scores' layout before the product with the value"
    for name in ("mask", "mask2", "fmask"):
        mask = match.bindings.get(name)
        if mask is None:
            continue
        root = match.root
        at = root.via[0] if root.via else root.pos
        moved = _moved_axes(inverse, ix.shapes.rank(mask), _min_rank(mask, ix, before=at))
        if moved is None:
            named = "" if isinstance(mask, Var) and TEMP.match(mask.name) else f" `{render(mask)}`"
            return f"the mask{named} of the permuted scores has no proven rank to move its axes by"
        match.relayout[name] = moved
    return None


def _one_row_products(match: Match, ix: MethodIndex) -> str | None:
    """A single query written without its query axis (engine/analysis/contraction.py: key-major
    scores `(k @ u.unsqueeze(-1)).squeeze(-1)`, an output `(v * p.unsqueeze(-1)).sum(-2)`) is
    attention with one query, `u.unsqueeze(-2)` (a query held as a column, `(k @ c).squeeze(-1)` of
    c (..., d, 1), is `c.transpose(-2, -1)`), whose output is squeezed back: both products must be
    read so (scores without a query axis and an output with one, or the reverse, are no such pair),
    the scores neither permuted nor viewed, and each mask of the scores, which lack the query axis,
    gets it back (`.unsqueeze(-2)`): a mask provably of at least one axis (a 0-d one has no axis to
    put it before)."""
    scores, output = match.nodes.get("s0"), match.nodes.get("out")
    one = [is_one_row(node) for node in (scores, output)]
    if not any(one):
        return None
    if not all(one):
        return "one product has a single query (no query axis) and the other a query axis"
    if {"s0p", "p3", "sv", "s2u"} & match.nodes.keys():
        return "the scores of a single query are permuted or viewed"
    for name in ("mask", "mask2", "fmask", "keep"):
        mask = match.bindings.get(name)
        if mask is None:
            continue
        if _min_rank(mask, ix) < 1:
            named = "" if isinstance(mask, Var) and TEMP.match(mask.name) else f" `{render(mask)}`"
            return f"the mask{named} of a single query's scores is not proven to have an axis to add the query's before"
        match.relayout[name] = ".unsqueeze(-2)"
    return None


CHECKS["one_row_products"] = _one_row_products


def _key_major_scores(match: Match, ix: MethodIndex) -> str | None:
    """Scores laid out key-major and turned back, `softmax(k @ qt, dim=-2).transpose(-2, -1)` (read as
    `softmax(q @ k.transpose(-2, -1))`, engine/match/matcher.py `transposed_view`), give the kernel
    the query the code holds transposed, `qt`, turned back: `$q` is the product's right operand and
    the kernel takes it `.transpose(-2, -1)`, or, where that operand is itself a swap of the last two
    axes (`items.transpose(1, 2)` of a 3-D value), the value swapped (the swap goes with the match
    where nothing else reads it). The view's product has no
    scale, mask or other step before its softmax, so nothing else is in the transposed layout."""
    scores = match.nodes.get("s0")
    if scores is None or scores.target != KEY_MAJOR:
        return None
    if {"qs", "s0p"} & match.nodes.keys():
        return "the query of key-major scores is scaled or the scores permuted"
    turned = ix.defs.get(scores.inputs[0].name) if isinstance(scores.inputs[0], Var) else None
    if turned is None or not turned.inputs:
        return "the query of key-major scores is not found"
    held = turned.inputs[0]
    swap = ix.defs.get(held.name) if isinstance(held, Var) else None
    if swap is not None and swap.kind == "op" and swap.op == "transpose" and swap.inputs and ix.shapes.swaps_last_two(swap):
        match.bindings["q"] = swap.inputs[0]
        match.companions.append(swap)  # (removed with the match where nothing else reads it)
    else:
        match.bindings["q"] = held
        match.relayout["q"] = ".transpose(-2, -1)"
    return None


CHECKS["key_major_scores"] = _key_major_scores


def _positive(operand, ix: MethodIndex, depth: int = 0) -> bool:
    """Proven a positive Python number (or raising): a positive literal, products and powers of
    positive numbers, a positive number divided by a non-negative one (a zero raises)."""
    number = numeric(operand) if isinstance(operand, (Const, Sym)) else None
    if number is not None:
        return number > 0
    if isinstance(operand, Sym):
        try:
            tree = ast.parse(operand.text, mode="eval").body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            return False
        return _sign(tree) == "positive"
    node = ix.defs.get(operand.name) if isinstance(operand, Var) and depth < 8 else None
    if node is None or node.kind != "op" or not node.inputs or not _is_number(operand, ix):
        return False
    if node.op == "assign":
        return _positive(node.inputs[0], ix, depth + 1)
    if node.op == "mul" and len(node.inputs) == 2:
        return all(_positive(i, ix, depth + 1) for i in node.inputs)
    if node.op == "div" and len(node.inputs) == 2:
        return _positive(node.inputs[0], ix, depth + 1) and _non_negative(node.inputs[1], ix, depth + 1)
    if node.op == "pow" and len(node.inputs) == 2:
        return _positive(node.inputs[0], ix, depth + 1)
    return False


def _sign(e: ast.expr, depth: int = 0) -> str | None:
    """`positive` or `non-negative` where the expression is proven so and made of Python numbers
    only (literals, tensor sizes `x.size(i)` and `x.shape[i]`, `len`, `math.sqrt`, `*`, `/`, `**`),
    where a zero divisor raises; else None."""
    if depth > 16:
        return None
    if isinstance(e, ast.Constant) and type(e.value) in (int, float):
        return "positive" if e.value > 0 else "non-negative" if e.value == 0 else None
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "size" and len(e.args) == 1 \
            and not e.keywords and isinstance(e.args[0], ast.Constant) and type(e.args[0].value) is int:
        return "non-negative"
    if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute) and e.value.attr == "shape" \
            and isinstance(e.slice, ast.Constant) and type(e.slice.value) is int:
        return "non-negative"
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "len" and len(e.args) == 1:
        return "non-negative"
    if isinstance(e, ast.Call) and ast.unparse(e.func) == "math.sqrt" and len(e.args) == 1 and not e.keywords:
        return _sign(e.args[0], depth + 1)
    if not isinstance(e, ast.BinOp):
        return None
    left, right = _sign(e.left, depth + 1), _sign(e.right, depth + 1)
    if isinstance(e.op, ast.Mult) and left and right:
        return "positive" if left == right == "positive" else "non-negative"
    if isinstance(e.op, ast.Div) and left == "positive" and right:
        return "positive"  # a zero divisor raises ZeroDivisionError
    if isinstance(e.op, ast.Pow) and left and isinstance(e.right, ast.Constant) and type(e.right.value) in (int, float):
        return left if left == "positive" or e.right.value > 0 else None
    return None


def _non_negative(operand, ix: MethodIndex, depth: int = 0) -> bool:
    """Proven a non-negative Python number: a positive one, a tensor's size, its power."""
    number = numeric(operand) if isinstance(operand, (Const, Sym)) else None
    if number is not None:
        return number >= 0
    node = ix.defs.get(operand.name) if isinstance(operand, Var) and depth < 8 else None
    if node is None or node.kind != "op" or not _is_number(operand, ix):
        return False
    if node.op in (".size", ".dim", ".numel", "len"):
        return True
    if node.op == "pow" and len(node.inputs) == 2:
        return _non_negative(node.inputs[0], ix, depth + 1)
    return _positive(operand, ix, depth)


def _scaled_after_fill(match: Match, ix: MethodIndex) -> str | None:
    """A factor scaling the scores after their `masked_fill` (`$s3s`, LoFTR's `softmax(temp * s)` of
    the filled scores) is part of the kernel's scale, which SDPA applies before its mask, where the
    fill is -inf and the factor a proven positive Python number: -inf times it stays -inf (a finite
    fill times a small factor would no longer drop the keys, a negative factor would raise them). An
    additive mask before it is scaled too, which the kernel's is not: `(s + m) * c == s * c + m * c`,
    so where the mask is added on every path with no fill between, it passes to the kernel times the
    factor (a number, as every `scale` step's: engine.synthesize.layout). A factor between the
    additive mask and the fill (`$s2s`, Music-Transformer's `((q k^T + Srel) / sqrt(d)).masked_fill(m,
    -inf)`) scales that mask the same way, whatever its sign or the fill: the fill comes after both.
    That step is a scale after a mask only where a mask is added before it: with none, it is the
    product's own scale (`$s1`), a reading that keeps the product's dtype for what reads it (a fill
    value a helper computes from the scores' dtype, `max_neg_value(dots)`)."""
    if "s2s" in match.nodes:
        if "mask" not in match.bindings and "mask2" not in match.bindings:
            return "a scale read as one after an additive mask, where no mask is added before it"
        if "s2c" in match.nodes or match.optional & {"mask", "mask2"} or match.bindings.get("factorm") is None:
            return "the scores are scaled after an additive mask, which the kernel adds after its scale"
    if "s3s" not in match.nodes:
        return None
    factor = match.bindings.get("factor3")
    if "mask" in match.bindings or "mask2" in match.bindings:
        if "s3" in match.nodes or "s2c" in match.nodes or match.optional & {"mask", "mask2"} or factor is None:
            return "the scores are scaled after an additive mask, which the kernel adds after its scale"
        return None
    if "s3" not in match.nodes:
        return None
    if not _fill_is_infinite(match.bindings.get("fill")):
        return "the scores are scaled after a `masked_fill` whose value is not -inf"
    if factor is None or not _positive(factor, ix):
        return f"the factor `{render(factor) if factor is not None else '?'}` scaling the filled scores is not " \
            "provably a positive number"
    return None


def _mask_after_fill(match: Match, ix: MethodIndex) -> str | None:
    """An additive mask added after the fill (`$mask3`: WavLM's gated position bias, added to the
    key-padding-filled scores) is the kernel's additive mask where the fill is -inf on every path:
    a filled key is -inf plus the term, -inf again (for a finite term, or one that is -inf), as in the
    kernel, which adds its mask with -inf at the filled keys (`torch.where(fmask, -inf, mask)`); the
    other keys get the term either way. After a finite fill a filled key would be the fill plus the
    term, and a row whose every key is filled would be the softmax of the terms, no average of v."""
    if "s3m" not in match.nodes:
        return None
    if "s3" not in match.nodes:
        return "an additive mask read as one after a fill where there is none"
    values = _fill_values(match.bindings.get("fill"), ix)
    if not all(_fill_is_infinite(v) for v in values):
        return "an additive mask is added after a `masked_fill` whose value is not -inf (a filled key gets the " \
            "fill plus the mask)"
    return None


CHECKS["mask_after_fill"] = _mask_after_fill


_PLAIN_NAME = re.compile(r"[A-Za-z_][\w.]*")


def _reads_any(operand: Operand | None, names: set[str], ix: MethodIndex) -> bool:
    """`operand` is, or is computed from, one of the SSA values `names` (True where the values it is
    computed from are too many to follow: unproven). Each value is visited once."""
    todo, seen = [operand], set()
    while todo:
        value = todo.pop()
        if not isinstance(value, Var) or value.name in seen:
            continue
        if value.name in names or len(seen) > 256:
            return True
        seen.add(value.name)
        node = ix.defs.get(value.name)
        if node is not None:
            todo.extend((*node.inputs, *(v for _, v in node.kwargs)))
    return False


def _probabilities_plus_term(match: Match, ix: MethodIndex) -> str | None:
    """A term added to the probabilities before the product with the value (`$pb`, tsai's relative
    bias after the softmax, `(softmax(q k * c) + B) @ v`) distributes over the product: `(p + B) @ v ==
    p @ v + B @ v`, so the kernel's result plus `B @ v` is the original's, forward and backward, where
    `B` is computed from nothing the kernel replaces (neither the scores nor the probabilities: the
    statements computing them go) and is a tensor (a number has no `@`), added on every path, and the
    value is a plain name (it is read twice) that the product takes as written (`p @ v`, no einsum
    lowering, permute or upcast)."""
    if "pb" not in match.nodes:
        return None
    term = match.bindings.get("pbias")
    if match.optional & {"pbias"} or term is None:
        return "a term is added to the probabilities on some paths only"
    if any(step in match.nodes for step in ("s0p", "p3", "pt")):
        return "a term is added to the probabilities of permuted scores"
    replaced = {out for key, node in match.nodes.items() if key != "pb" for out in node.outputs}
    if _reads_any(term, replaced, ix):
        return "the term added to the probabilities is computed from the scores or the probabilities the " \
            "kernel replaces"
    if ix.shapes.shape(term) is None:
        return "the term added to the probabilities is not provably a tensor"
    if not _PLAIN_NAME.fullmatch(render(term)) or TEMP.search(render(term)):
        return "the term added to the probabilities is no plain name (it is read twice)"
    value, product = match.bindings.get("v"), match.nodes["out"]
    if not isinstance(value, Var) or not _PLAIN_NAME.fullmatch(render(value)) or TEMP.search(render(value)) \
            or product.target in C.EINSUM_FUNCTIONS:
        return "the value the probabilities and the added term multiply is no plain name"
    return None


CHECKS["scores_permuted_back"] = _scores_permuted_back
CHECKS["probabilities_plus_term"] = _probabilities_plus_term
CHECKS["scaled_after_fill"] = _scaled_after_fill


TEMP = re.compile(r"_t\d+$")  # the extractor's name for a value the source does not name
_FUSED_DEVICES = '("cpu", "cuda")'  # where torch>=2.4 has a fused Adam/AdamW kernel


def _bound_in_file(path: str, name: str) -> bool:
    """Whether the file at `path` binds `name` anywhere (a def, an import, an assignment), so that
    it may not be the builtin; True where the source is not known."""
    tree = tree_of(path)
    if tree is None:
        return True
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name:
            return True
        if isinstance(n, ast.alias) and (n.asname or n.name).split(".")[0] == name:
            return True
        if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load):
            return True
        if isinstance(n, ast.arg) and n.arg == name:
            return True
    return False


def _module_parameters(e: ast.expr, method: str = "parameters") -> str | None:
    """The text of `<name>.<attr>....parameters()` (a module's parameters: a fresh generator over
    the same tensors each time it is called), else None; `method="named_parameters"` takes
    `<name>.<attr>....named_parameters()`, whose tensors are the same, and gives the owner's
    `.parameters()` call too."""
    if not (isinstance(e, ast.Call) and not e.args and not e.keywords and isinstance(e.func, ast.Attribute)
            and e.func.attr == method):
        return None
    owner = e.func.value
    while isinstance(owner, ast.Attribute):
        owner = owner.value
    return f"{ast.unparse(e.func.value)}.parameters()" if isinstance(owner, ast.Name) else None


_SAME_ITEMS = ("list", "tuple", "sorted")  # builtins that make a new sequence of their argument's items


def _items_of(e: ast.expr, shadowed: Callable[[str], bool]) -> ast.expr | None:
    """The iterable `e` makes a new list or tuple of, item for item, then and there: `list(x)`,
    `tuple(x)`, `sorted(x, key=...)` (the builtins) or a display of it alone (`[*x]`), else None."""
    if isinstance(e, (ast.List, ast.Tuple)) and len(e.elts) == 1 and isinstance(e.elts[0], ast.Starred):
        return e.elts[0].value
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in _SAME_ITEMS and len(e.args) == 1 \
            and not isinstance(e.args[0], ast.Starred) and not shadowed(e.func.id) \
            and all(k.arg in (("key", "reverse") if e.func.id == "sorted" else ()) for k in e.keywords):
        return e.args[0]
    return None


def _parameters_selected_from(e: ast.expr, shadowed: Callable[[str], bool]) -> str | None:
    """The `.parameters()` call whose tensors the optimizer's parameters `e` are all among: the
    call itself, `filter(f, <call>)`, a comprehension or generator that yields its loop variable
    from the call (`p for p in m.parameters() if p.requires_grad`, or the tensor of each pair of
    `m.named_parameters()`: `p for n, p in ...`), or a list, tuple or sorted list of any of those
    (`list(...)`, `[*...]`). Reading the devices from the call again then consumes nothing the
    optimizer reads, and all of a superset on a fused device implies all of the selection is. None
    for anything else."""
    for _ in range(8):
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "filter" and len(e.args) == 2 \
                and not e.keywords and not isinstance(e.args[1], ast.Starred) and not shadowed("filter"):
            e = e.args[1]
        elif isinstance(e, (ast.GeneratorExp, ast.ListComp)) and len(e.generators) == 1:
            loop = e.generators[0]
            if loop.is_async or not isinstance(e.elt, ast.Name):
                return None
            if isinstance(loop.target, ast.Name) and e.elt.id == loop.target.id:
                e = loop.iter
            elif isinstance(loop.target, ast.Tuple) and len(loop.target.elts) == 2 \
                    and isinstance(loop.target.elts[1], ast.Name) and e.elt.id == loop.target.elts[1].id \
                    and not (isinstance(loop.target.elts[0], ast.Name) and loop.target.elts[0].id == e.elt.id):
                return _module_parameters(loop.iter, "named_parameters")
            else:
                return None
        elif (items := _items_of(e, shadowed)) is not None:
            e = items
        else:
            return _module_parameters(e)
    return None


def _fused_where_params_live(match: Match, ix: MethodIndex) -> str | None:
    """`fused=` is keyed on the devices the optimizer's parameters live on (all on the CPU or CUDA,
    the devices with a fused kernel), not on whether CUDA exists somewhere. The parameters must be
    readable twice without being consumed: `<module>.parameters()` (called again), or a list built in
    the function (a list literal or comprehension, or one filled by `append`/`insert`, of parameters
    or of groups whose `params` are such lists or were already iterated here), or a list of group
    dict literals whose generators are made lists where they are written (`_group_literals`,
    `$listed_at`). Anything else is materialized once as the optimizer's argument, as the
    optimizer's own first step does (`_materialized_once`). Parameters written as an expression at the call are read from its
    source (`_written_params`). Binds `$fused` to that test (or `$merged`: `_bind_fused`)."""
    node = match.root
    params = node.inputs[0] if node.inputs else node.kwarg("params")
    if not isinstance(params, Var) or TEMP.match(params.name):
        return _written_params(params, match)
    producer = ix.defs.get(params.name)
    if producer is not None and producer.op == "generatorexp" and isinstance(producer.kwarg("text"), Sym):
        try:  # a generator assigned to a name: its source is kept as `text`
            written = ast.parse(producer.kwarg("text").text, mode="eval").body
        except SyntaxError:
            written = None
        source = _parameters_selected_from(written, _shadowed(match)) if written is not None else None
        if source is not None:
            return _bind_fused(match, f"all(p.device.type in {_FUSED_DEVICES} for p in {source})")
    if producer is None:
        return _materialized_once(params, match)
    if producer.op == "list":  # `list(...)` of whatever was given (the materialized form below)
        return _bind_fused(match, _items_on_fused_devices(params.name.partition(".")[0]), defaulted=True)
    if producer.op == ".parameters" and producer.inputs and (
            isinstance(producer.inputs[0], Sym) or isinstance(producer.inputs[0], Var)
            and not TEMP.match(producer.inputs[0].name)):
        owner = producer.inputs[0]
        owner_text = owner.text if isinstance(owner, Sym) else owner.name.partition(".")[0]
        return _bind_fused(match, f"all(p.device.type in {_FUSED_DEVICES} for p in {owner_text}.parameters())")
    wrapped = _group_literals(params, match, ix)
    match.bindings.pop("listed_at", None)
    if isinstance(wrapped, str):
        return wrapped
    if wrapped is not None:
        if wrapped:
            match.bindings["listed_at"] = Const(wrapped)
        name = params.name.partition(".")[0]
        return _bind_fused(match, f'all(p.device.type in {_FUSED_DEVICES} for g in {name} for p in g["params"])')
    if _built_list(params, ix) is None:
        return _materialized_once(params, match)
    why = _unreadable_groups(params, match, ix)
    if why is not None:
        return why
    name = params.name.partition(".")[0]
    return _bind_fused(match, f"all(p.device.type in {_FUSED_DEVICES} for g in {name} "
                              f'for p in (g["params"] if isinstance(g, dict) else [g])) and {_distinct(name)}',
                       defaulted=True)


def _group_literals(params: Operand, match: Match, ix: MethodIndex) -> tuple | str | None:
    """Where the optimizer's parameters name a list of group dict literals assigned in the same
    block before the call (vocos: `disc_params = [{"params": self.mpd.parameters()}, ...]`), the
    positions `(line, col, end_line, end_col)` of the groups' `params` values to be made lists at
    the literal (`{"params": list(self.mpd.parameters())}`), so that the device test can read them
    again: a selection of a module's parameters (`_parameters_selected_from`; a list already,
    `[p for p in m.parameters() if ...]`, stays; other tensors may hold one twice). The optimizer makes each group's `params` a list itself (`list(params)`),
    so the values are the same, read a little earlier: only assignments whose values call nothing
    but `.parameters()`/`.named_parameters()`, `filter`/`all`/`list`/`tuple`/`sorted` or another
    optimizer (which changes no module) may stand between the literal and the call, and the
    function must mention the name nowhere else. Each group holds the tensors of one selection,
    each once; a tensor in two groups raises either way. A str (why not) where such a literal
    holds a selection that cannot be made a list there: read as a group's `params` at the call it
    is a generator, which the device test cannot read, so `fused` would never be set. None where
    the parameters are not such a literal."""
    producer = ix.defs.get(params.name) if isinstance(params, Var) else None
    found = _enclosing(match)
    if producer is None or producer.op != "assign" or producer.via or match.root.via or producer.pos is None \
            or found is None:
        return None
    fn, call = found
    name = params.name.partition(".")[0]
    shadowed = _shadowed(match)
    at = (producer.pos.line, producer.pos.col)
    assign = next((n for n in ast.walk(fn) if isinstance(n, ast.Assign) and (n.lineno, n.col_offset) == at), None)
    if assign is None or len(assign.targets) != 1 or not isinstance(assign.targets[0], ast.Name) \
            or assign.targets[0].id != name or not isinstance(assign.value, ast.List) or not assign.value.elts:
        return None
    wrapped = []
    for group in assign.value.elts:
        if not isinstance(group, ast.Dict) or any(not (isinstance(k, ast.Constant) and isinstance(k.value, str))
                                                  for k in group.keys):
            return None
        value = next((v for k, v in zip(group.keys, group.values, strict=True)
                      if isinstance(k, ast.Constant) and k.value == "params"), None)
        if value is None:
            return None
        if _parameters_selected_from(value, shadowed) is None:
            return None  # other tensors may hold one twice, which the fused kernel would update once
        if isinstance(value, (ast.List, ast.ListComp)) or isinstance(value, ast.Call) \
                and _items_of(value, shadowed) is not None:
            continue  # a list already (of what the call would give: the same reads)
        inside = 1 if isinstance(value, ast.GeneratorExp) else 0  # its range holds its parentheses
        wrapped.append((value.lineno, value.col_offset + inside, value.end_lineno, value.end_col_offset - inside))
    why = (f"a group of `{name}` holds a generator (`{ast.unparse(wrapped_value)}`) that cannot be made a list "
           "where it is written: the device test cannot read it, so `fused` would never be set"
           if (wrapped_value := _first_at(assign, wrapped)) is not None else None)
    blocks = [getattr(n, f) for n in ast.walk(fn) for f in ("body", "orelse", "finalbody")
              if isinstance(getattr(n, f, None), list)]
    block = next((b for b in blocks if assign in b), [])
    start = block.index(assign) if assign in block else -1
    end = next((i for i, s in enumerate(block) if any(n is call for n in ast.walk(s))), -1)
    if not call.args or not (isinstance(call.args[0], ast.Name) and call.args[0].id == name) or end <= start \
            or any(isinstance(getattr(block[end], field, None), list) for field in ("body", "orelse")):
        return why  # the call's own statement follows in the block: no test or loop runs in between
    own = {id(n) for k in call.keywords if k.arg == "fused" for n in ast.walk(k.value)}  # this rule's own test
    mentions = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == name and id(n) not in own]
    if len(mentions) != 2 or any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(fn)):
        return why  # the assignment and the call's argument only
    allowed = ("filter", "all", *_SAME_ITEMS)  # `all`: a device test of another optimizer
    optimizers = {(n.pos.line, n.pos.col) for n in match.method.nodes
                  if n.op.startswith("torch.optim.") and not n.via and n.pos is not None}

    def inert(stmt: ast.stmt) -> bool:
        return isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets) and all(
            isinstance(n.func, ast.Attribute) and n.func.attr in ("parameters", "named_parameters") and not n.args
            or isinstance(n.func, ast.Name) and n.func.id in allowed and not shadowed(n.func.id)
            or (n.lineno, n.col_offset) in optimizers  # another optimizer: it reads its own groups only
            for n in ast.walk(stmt.value) if isinstance(n, ast.Call))

    if not all(inert(stmt) for stmt in block[start:end]):
        return why
    return tuple(wrapped)


def _first_at(tree: ast.AST, positions: list) -> ast.expr | None:
    """The expression of `tree` at the first of `positions`, if any."""
    return next((n for n in ast.walk(tree) if isinstance(n, ast.expr) and positions and (
        n.lineno, n.col_offset, n.end_lineno, n.end_col_offset) == positions[0]
        or isinstance(n, ast.GeneratorExp) and positions and (
        n.lineno, n.col_offset + 1, n.end_lineno, n.end_col_offset - 1) == positions[0]), None)


def _shadowed(match: Match) -> Callable[[str], bool]:
    """Whether a name may not be the builtin in the matched file (`_bound_in_file`)."""
    return lambda name: _bound_in_file(match.file.path, name)


def _written_params(params: Operand, match: Match) -> str | None:
    """Parameters written at the call as an expression, not a name (`list(extra)`, `[*given]`,
    `[p for p in m.parameters() if ...]`, `self.make_parameter_groups()`): the test is written in
    terms of the source of that expression, since the values the analysis gives its parts have no
    name in the source. A selection of a module's parameters reads that module's `.parameters()`
    again (`_parameters_selected_from`); a list already held under a name by `:=` is read through
    that name; anything else is materialized once under a free name (`_materialized_once`)."""
    node = match.root
    call = _call_at(match)
    if call is None or not node.inputs or node.inputs[0] is not params or not call.args \
            or isinstance(call.args[0], ast.Starred):
        return "where the parameters live is not known here (their expression is not found in the source)"
    written, shadowed = call.args[0], _shadowed(match)
    source = _parameters_selected_from(written, shadowed)
    if source is not None:
        return _bind_fused(match, f"all(p.device.type in {_FUSED_DEVICES} for p in {source})")
    if isinstance(written, ast.NamedExpr) and _fresh_sequence(written.value, shadowed):
        # `name := list(...)`, the materialized form itself: the test reads that list
        return _bind_fused(match, _items_on_fused_devices(written.target.id), defaulted=True)
    return _materialized_once(params, match, fresh=_fresh_sequence(written, shadowed))


def _fresh_sequence(e: ast.expr, shadowed: Callable[[str], bool]) -> bool:
    """Whether `e` makes a new list or tuple then and there (a display, a list comprehension, the
    builtin `list`/`tuple`/`sorted` of something), which can be read again unchanged."""
    return isinstance(e, (ast.List, ast.Tuple, ast.ListComp)) or isinstance(e, ast.Call) \
        and isinstance(e.func, ast.Name) and e.func.id in _SAME_ITEMS and not shadowed(e.func.id)


def _call_at(match: Match) -> ast.Call | None:
    """The optimizer's call in the matched file's `ast`, where its source is known."""
    tree, pos = tree_of(match.file.path), match.root.pos
    if tree is None or pos is None or pos.file not in (match.file.path, ""):
        return None
    return next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and (n.lineno, n.col_offset, n.end_lineno,
                 n.end_col_offset) == (pos.line, pos.col, pos.end_line, pos.end_col)), None)


def _bind_fused(match: Match, test: str, defaulted: bool = False) -> None:
    """Binds `$fused` to the device test (`... or None` where a group that cannot be read leaves
    it at its default, `defaulted`). Where a `**` dict whose keys are not known (`$chooser`,
    `**cfg.adam`) passes the settings, the test goes into a dict merged under it instead (`$merged`,
    which takes that argument's place): a key of the dict wins, and the test holds only where the
    dict chooses no other implementation (`fused=True` beside `foreach=True` or
    `differentiable=True` raises; `None` is the default)."""
    chooser = match.bindings.get("chooser")
    if not isinstance(chooser, Sym):
        match.bindings.pop("merged", None)
        match.bindings["fused"] = Sym(f"{test} or None" if defaulted else test)
        return None
    match.bindings.pop("fused", None)
    match.bindings["merged"] = Sym(f"**{merged_under(chooser.text, 'fused', test)}")
    return None


def merged_under(chooser: str, key: str, test: str) -> str:
    """The dict literal that passes `key=<test>` under a `**` dict `chooser` whose keys are not
    known: its keys win, and the test holds only where it chooses no other implementation."""
    others = ", ".join(f'"{k}"' for k in _CHOOSING if k != key)
    return f'{{"{key}": {{{others}}}.isdisjoint({chooser}.keys()) and {test} or None, **{chooser}}}'


_FREE_NAMES = ("params", "param_groups")  # names that may hold parameters materialized from an expression


def _materialized_once(params: Operand, match: Match, fresh: bool = False) -> str | None:
    """Parameters the function cannot read twice (maybe a one-shot generator): passed in
    (`def get_std_opt(model_params, ...)`), assigned from elsewhere (`params = kwargs.pop("params",
    self.model.parameters())`), or computed by the call's argument itself (`self.make_parameter_groups()`,
    `filter(f, params)`), are materialized once as the optimizer's first argument, as the optimizer's
    own `list(params)` does, under their name (`model_params := list(model_params)`) or, for an
    expression, under a name the function does not use (`params := list(self.make_parameter_groups())`);
    both the optimizer and the device test read that list. A name must be read by nothing but the
    optimizer on the optimizer's path (it holds the list afterwards), except where it is assigned
    before the call. Groups (dicts) are not looked into where their `params` are not a list, which
    could consume them (`_items_on_fused_devices`). An expression that makes a new list or tuple
    then and there (`fresh`: `[p for p in extra]`, `list(extra)`) is held as it is (`params :=
    list(extra)`), where `$materialized_as_is` says so. Binds `$materialized` and `$fused`."""
    node = match.root
    if not node.inputs or node.inputs[0] is not params or node.via:
        return "where the parameters live is not known here (they are not built in this function)"
    if isinstance(params, Var) and not TEMP.match(params.name):
        name = params.name.partition(".")[0]
        if not _named_once(match, name):
            return f"`{name}` is read elsewhere in the function: it cannot be materialized for the optimizer alone"
    else:
        name = _free_name(match)
        if name is None:
            return "the parameters are computed at the call and no name is free to hold them once materialized"
    match.bindings["materialized"] = Sym(name)
    if fresh:
        match.bindings["materialized_as_is"] = Const(True)
    else:
        match.bindings.pop("materialized_as_is", None)
    return _bind_fused(match, _items_on_fused_devices(name), defaulted=True)


def _items_on_fused_devices(name: str) -> str:
    """The device test over a list whose items may be groups made elsewhere: a group's `params`
    are read only where they are a list (read again unchanged; a generator there would be
    consumed). A group holding anything else, or any parameter off a fused device, leaves `fused`
    at its default (None: `fused=False` would also turn off the `foreach` default; the caller adds
    the `or None`), and so does a tensor held twice (`_distinct`)."""
    return (f"all(g.device.type in {_FUSED_DEVICES} if not isinstance(g, dict) else "
            f'isinstance(g.get("params"), list) and all(p.device.type in {_FUSED_DEVICES} for p in g["params"]) '
            f"for g in {name}) and {_distinct(name)}")


def _distinct(name: str) -> str:
    """The test that the list `name` (of tensors, or of groups whose `params` are lists: evaluated
    after a device test that proves so) holds no tensor twice. A group holding one tensor twice
    (`list(model.parameters()) + list(extra)` where `extra` overlaps, or weights tied between two
    modules) is updated twice in turn by the default implementation, once by the fused kernel:
    there `fused` stays at its default. A tensor in two groups raises either way. Parameters read
    from one `.parameters()` call (or a selection of it) need no test: a module lists each of its
    tensors once."""
    loops = f'for g in {name} for p in (g["params"] if isinstance(g, dict) else [g])'
    return f"len({{id(p) {loops}}}) == len([p {loops}])"


def _enclosing(match: Match) -> tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.Call] | None:
    """The matched function's `ast` definition and the optimizer's call in it, where both are found."""
    tree, pos, call_pos = tree_of(match.file.path), match.method.pos, match.root.pos
    fn = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.lineno == pos.line and n.col_offset == pos.col), None) if tree is not None and pos else None
    call = next((n for n in ast.walk(fn) if isinstance(n, ast.Call) and n.lineno == call_pos.line
                 and n.col_offset == call_pos.col), None) if fn is not None and call_pos else None
    return (fn, call) if call is not None else None


def _free_name(match: Match) -> str | None:
    """A name of `_FREE_NAMES` that the matched function mentions nowhere (nor declares global):
    bound at the call by `:=`, it is a new local that changes nothing else the function reads."""
    found = _enclosing(match)
    if found is None:
        return None
    fn, _ = found
    used = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    used |= {a.arg for n in ast.walk(fn) if isinstance(n, ast.arguments) for a in (
        *n.posonlyargs, *n.args, *n.kwonlyargs, *([n.vararg] if n.vararg else []), *([n.kwarg] if n.kwarg else []))}
    used |= {name for n in ast.walk(fn) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    return next((name for name in _FREE_NAMES if name not in used), None)


def _named_once(match: Match, name: str) -> bool:
    """Whether the source of the matched function names `name` once on any path through it
    (besides its parameter and assignments before the call): at the optimizer's call, not in a
    loop, comprehension, lambda or nested function, which could run the call more than once, and
    any other mention on a path exclusive with the call's (another branch of an `if`, an earlier
    branch that always leaves the function: `if name == "adam": return Adam(params, ...)` / `elif
    ...: return SGD(params, ...)`). An assignment before the call (not in a nested function or
    comprehension, whose names are their own) binds what the call reads; the name must be the
    function's own, a parameter or assigned in it (not declared `global` or `nonlocal`). False where
    the source is not known."""
    found = _enclosing(match)
    if found is None:
        return False
    fn, call = found
    if not call.args or not (isinstance(call.args[0], ast.Name) and call.args[0].id == name):
        return False
    if any(isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(fn)):
        return False
    repeats = (ast.For, ast.AsyncFor, ast.While, ast.comprehension, ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)
    scopes = (ast.comprehension, ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)
    found_names: list[tuple[ast.Name, bool, bool]] = []  # each mention, whether repeated, whether in another scope

    def walk(node: ast.AST, repeated: bool, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Name) and child.id == name:
                found_names.append((child, repeated, nested))
            walk(child, repeated or isinstance(child, repeats), nested or isinstance(child, scopes))

    walk(fn, False, False)
    own = call.args[0]
    if (own, False, False) not in found_names:
        return False
    file = _BranchFile(tree_of(match.file.path), match.file.module)
    here = file.steps(own, fn)
    start = (call.lineno, call.col_offset)

    def assigned_before(mention: ast.Name, nested: bool) -> bool:
        return isinstance(mention.ctx, ast.Store) and not nested and (mention.lineno, mention.col_offset) < start

    local = any(a.arg == name for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)) \
        or any(assigned_before(m, nested) for m, _, nested in found_names)
    return local and all(mention is own or assigned_before(mention, nested) or _exclusive(here, file.steps(mention, fn))
                         or not repeated and not nested and _superseded(mention, fn, call)
                         for mention, repeated, nested in found_names)


def _superseded(mention: ast.Name, fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call) -> bool:
    """Whether a read of a name is followed, on every path that can reach `call`, by a new
    assignment of the name first: it is read on the right of that assignment (`params =
    list(filter(f, params))`), or an assignment follows it in the same block before anything that
    could reach the call or jump (audiolm's `wd, no_wd = split(params)` then `params = [groups]`).
    What it read (maybe a spent generator) is then never what the call reads. Reads inside a `try`
    are not (a handler may go on to the call between the two)."""
    if not isinstance(mention.ctx, ast.Load):
        return False
    parents: dict[int, ast.AST] = {}
    for node in ast.walk(fn):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    statement: ast.AST = mention
    while not isinstance(statement, ast.stmt):
        statement = parents[id(statement)]
    up: ast.AST = statement
    while up is not fn:
        up = parents[id(up)]
        if isinstance(up, ast.Try | getattr(ast, "TryStar", ast.Try)):
            return False

    def assigns(stmt: ast.stmt) -> bool:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            and stmt.value is not None else []
        return any(isinstance(t, ast.Name) and t.id == mention.id for t in targets)

    if assigns(statement):
        # read on the right of its own new assignment that makes a list of it then and there
        # (`params = list(filter(f, params))`); a lazy wrapper (`filter(None, params)`) is not
        # taken, and neither is a statement that holds the call too
        value = getattr(statement, "value", None)
        eager = isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in _READS_THROUGH
        return eager and not any(n is call for n in ast.walk(statement))
    block = next((getattr(parents[id(statement)], field) for field in ("body", "orelse", "finalbody")
                  if statement in getattr(parents[id(statement)], field, [])), None)
    if block is None:
        return False
    for later in block[block.index(statement) + 1:]:
        if assigns(later):
            return not any(n is call for n in ast.walk(later))
        if any(n is call or isinstance(n, (ast.Break, ast.Continue)) for n in ast.walk(later)):
            return False
    return False


_READS_THROUGH = ("set", "list", "tuple", "sorted")  # calls that iterate their argument to its end


def _built_list(value: Operand, ix: MethodIndex) -> Node | None:
    """The node that builds the list `value` names in this function (a list literal, comprehension
    or `list(...)` call, through plain renamings), else None. A list is read again unchanged."""
    definition = ix.defs.get(value.name) if isinstance(value, Var) else None
    while definition is not None and definition.op == "assign" and isinstance(definition.inputs[0], Var):
        definition = ix.defs.get(definition.inputs[0].name)
    if definition is None:
        return None
    if definition.op in ("listcomp", "list") or definition.op == "assign" and (
            isinstance(definition.inputs[0], Seq) and definition.inputs[0].kind == "list"
            or isinstance(definition.inputs[0], Sym) and definition.inputs[0].text == "[]"):
        return definition
    return None


def _unreadable_groups(params: Operand, match: Match, ix: MethodIndex) -> str | None:
    """Why the optimizer's parameters cannot be read again, or None: they must be a list built in
    this function whose items can all be read again: a dict literal whose `params` are such a list,
    a group whose `params` this function already iterated (a one-shot iterator there is spent
    before the optimizer reads it, so reading it once more changes nothing), or a tensor: a module's
    parameter (`for p in model.parameters()`, `for name, p in model.named_parameters()`) or one
    named in the source. The list must be filled only by `append`/`insert` and read only by
    optimizers (and by the device test of the call's own `fused=`, where it has one: this
    constraint's rewrite), or on a path that never runs with the optimizer's call (another branch
    of the `if`/`elif` chain choosing the optimizer: `_on_exclusive_path`)."""
    root = match.root
    built = _built_list(params, ix)
    if built is None:
        return "the parameters are not a list built in this function: reading their devices could consume them"
    items: list[Operand] = list(built.inputs[0].items) if isinstance(built.inputs[0], Seq) else []
    names = {built.outputs[0]}
    for name in list(names):
        for use in ix.uses.get(name, ()):
            if use.op == "assign" and use.outputs:
                names.add(use.outputs[0])
    for name in names:
        for use in ix.uses.get(name, ()):
            if use.op in (".append", ".insert") and use.inputs[0] == Var(name):
                items.append(use.inputs[-1])
            elif not (use.op == "assign" or use.op.startswith("torch.optim.") or _feeds_fused(use, root, ix)
                      or _on_exclusive_path(match, use)):
                return f"the parameter groups are passed to `{use.op}`, which may change them"
    for item in items:
        if isinstance(item, Sym) and not item.text.startswith(("(", "[", "{")):
            continue  # a tensor named in the source (`self.weight`)
        if not isinstance(item, Var):
            # a pair (`(name, param)`, which optimizers take too) or a list: no device to read
            return f"an item of the parameter list is `{render(item)}`, not a parameter or a group"
        group = ix.defs.get(item.name)
        if group is None:
            return f"the parameter group `{item.name}` is passed in: reading its `params` could consume them"
        if _module_parameter(item, group, ix):
            continue
        if group.op == "dict":
            if _built_list(_group_params(group), ix) is None:
                return "a parameter group's `params` is not a list built in this function"
        elif not _params_read_before(item.name, group, ix):
            return f"the parameter group `{item.name}` is built elsewhere: reading its `params` could consume them"
    return None


def _module_parameter(item: Var, group: Node, ix: MethodIndex) -> bool:
    """Whether `item` is a parameter of a module, as a loop over its parameters binds it: the
    element of `for p in m.parameters()`, or the tensor of `for name, p in m.named_parameters()`
    (not the (name, tensor) pair a single loop variable would hold there)."""
    if group.op != "iter" or not isinstance(group.inputs[0], Var):
        return False
    source = getattr(ix.defs.get(group.inputs[0].name), "op", None)
    return source == ".parameters" and group.outputs == (item.name,) \
        or source == ".named_parameters" and len(group.outputs) == 2 and group.outputs[1] == item.name


def _on_exclusive_path(match: Match, node: Node) -> bool:
    """Whether `node`, a call in the matched function itself (not in a helper inlined into it), and
    the optimizer's call never run in one call of the function: they sit in the two branches of one
    `if` (another `elif` of a chain is in its `else`), or one follows an `if` whose branch holding
    the other always leaves the function (engine/match/fused.py `_exclusive`), and no loop,
    comprehension or nested function holds both (which could take one branch on one pass and the
    other on the next)."""
    found = _enclosing(match)
    if found is None or node.via or node.pos is None:
        return False
    fn, call = found
    other = next((n for n in ast.walk(fn) if isinstance(n, ast.Call) and n.lineno == node.pos.line
                  and n.col_offset == node.pos.col), None)
    if other is None or other is call:
        return False
    file = _BranchFile(tree_of(match.file.path), match.file.module)
    here, there = file.steps(call, fn), file.steps(other, fn)
    shared = list(itertools.takewhile(lambda pair: pair[0] == pair[1], zip(here, there, strict=False)))
    repeats = (ast.For, ast.AsyncFor, ast.While, ast.comprehension, ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef,
               ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
    return not any(isinstance(step.node, repeats) for step, _ in shared[1:]) and _exclusive(here, there)


def _feeds_fused(node: Node, root: Node, ix: MethodIndex) -> bool:
    """Whether `node` only computes the value `root` passes as `fused=` (through single readers: the
    longest chain is the distinct-tensor count, `{...}` -> `len` -> `==` -> `and` -> `or None`)."""
    fused = root.kwarg("fused")
    for _ in range(6):
        if fused is None or not node.outputs:
            return False
        if fused == Var(node.outputs[0]):
            return True
        readers = ix.uses.get(node.outputs[0], [])
        if len(readers) != 1:
            return False
        node = readers[0]
    return False


def _group_params(group: Node) -> Operand | None:
    """The operand a dict literal (`{"params": decay, ...}`, `dict(params=decay)`) holds under
    `params`, where it names one."""
    if group.kwarg("params") is not None:
        return group.kwarg("params")
    text = group.kwarg("text")
    try:
        literal = ast.parse(text.text, mode="eval").body if isinstance(text, Sym) else None
    except SyntaxError:
        return None
    if not isinstance(literal, ast.Dict):
        return None
    value = next((v for k, v in zip(literal.keys, literal.values, strict=True)
                  if isinstance(k, ast.Constant) and k.value == "params"), None)
    if not isinstance(value, ast.Name):
        return None
    return next((i for i in group.inputs if isinstance(i, Var) and i.name.partition(".")[0] == value.id), None)


def _params_read_before(name: str, group: Node, ix: MethodIndex) -> bool:
    """Whether this function iterates `name["params"]` to its end whenever it builds `name`
    (`set(group["params"])`), and does nothing else with `name` but read it and add it to a list."""
    uses = ix.uses.get(name, ())
    if any(use.op not in ("getitem", ".append", ".insert") for use in uses):
        return False
    for use in uses:
        if use.op == "getitem" and use.inputs[1:] == (Const("params"),) and use.guard == group.guard:
            if any(read.op in _READS_THROUGH and read.guard == group.guard for read in ix.uses.get(use.outputs[0], ())):
                return True
    return False


CHECKS["fused_where_params_live"] = _fused_where_params_live


def _view_sizes(node, defs) -> tuple | None:
    """The sizes a `.view`/`.reshape` call names, one operand each (None for `view(shape)`, or where
    an argument spreads several, `*x.shape[:2]`: `defs` gives the node of each value)."""
    sizes = node.inputs[1:]
    if len(sizes) == 1 and isinstance(sizes[0], Seq):
        sizes = sizes[0].items
    if not sizes or any(isinstance(s, Seq) or (isinstance(s, Sym) and s.text.startswith("*"))
                        or isinstance(s, Var) and (d := defs.get(s.name)) is not None and d.op == "starred"
                        for s in sizes):
        return None
    return tuple(sizes)


def _same_size(a, b) -> bool:
    return a == b or (isinstance(a, Sym) and isinstance(b, Sym) and a.text.replace(" ", "") == b.text.replace(" ", ""))


_SPLITS = ("sv", "s2u", "s2v")  # the views of the scores a match may bind before their fill, in order


def round_trip(match: Match) -> tuple[Node | None, Node | None, str] | None:
    """The views of the scores around a mask the match reads, as (split, merge, the binding of the
    mask added between them): `$sv`, `$s2u` around `$mask` (BART's `w.view(bsz, heads, tgt, src) +
    mask`), or, after a first mask added outside, `$s2u`, `$s2v` around `$mask2` (Swin's relative
    position bias, then the window mask through `attn.view(B_ // nW, nW, H, N, N)`), or the view
    before the fill and `$s3v` after it around `$fmask` (fairseq's key-padding fill,
    `w.view(bsz, heads, tgt, src).masked_fill(kpm[:, None, None], -inf).view(bsz * heads, tgt, src)`).
    None where the match binds no view."""
    if "s3v" in match.nodes:
        splits = [match.nodes[key] for key in _SPLITS if key in match.nodes]
        return (splits[0] if len(splits) == 1 else None), match.nodes["s3v"], "fmask"
    if "s2v" in match.nodes:
        return match.nodes.get("s2u"), match.nodes["s2v"], "mask2"
    if "sv" in match.nodes or "s2u" in match.nodes:
        return match.nodes.get("sv"), match.nodes.get("s2u"), "mask"
    return None


def _mask_view_round_trip(match: Match, ix: MethodIndex) -> str | None:
    """A mask added through a view round trip. The 3-D scores of `torch.bmm` (BART, OPT:
    `w.view(bsz, heads, tgt, src) + mask`, then `.view(bsz * heads, tgt, src)`): the first view
    splits the batch axis in two and keeps the others, the second merges them back, and both
    products are `torch.bmm` (whose batch axes must be equal, so the scores' batch axis is the split
    one's product); the kernel takes the operands viewed the same way (`q.unflatten(0, (bsz,
    heads))`) and the mask as it is. Scores of any other proven rank split at their leading axis
    (Swin's `attn.view(B_ // nW, nW, H, N, N) + mask.unsqueeze(1).unsqueeze(0)`, viewed back with
    `.view(-1, H, N, N)`, ShapeFacts.leading_split): the kernel's operands stay as they are and the
    mask is folded into their layout, broadcast to the split axes and those flattened
    (`m.expand(B_ // nW, nW, -1, -1, -1).flatten(0, 1)`), whichever order the split names. A fill
    made through such views of 3-D `torch.bmm` scores (fairseq's key padding, `w.view(bsz, heads,
    tgt, src).masked_fill(kpm[:, None, None], -inf)`, then `$s3v` viewing it back) is the kernel's
    fill as it is, the operands viewed alike; masks added before the split or after the merge are
    broadcast to the 3-D scores' shape and split the same way (engine/synthesize/layout.py)."""
    views = round_trip(match)
    if views is None:
        return None
    split, merge, inner = views
    if inner == "fmask" and "s3" not in match.nodes and split is not None and ("s2" in match.nodes or "s2m" in match.nodes):
        # the views around an additive mask, their merge read after the fill there is none of: the
        # reading of the merge before it takes them, this one gives its reason where they are refused
        problem = _round_trip_problem(match, ix, split, merge, "mask")  # type: ignore[arg-type]
        return problem or "the scores' round trip of views is read around their first mask"
    if inner == "fmask":
        if split is None or "s3" not in match.nodes:
            return "the scores are viewed to another shape and not back around a mask"
        # one reading of the view before the fill: the last step that can take it
        order = ("sv", "s2", "s2c", "s2u", "s2m", "s2v")
        key = next(k for k in _SPLITS if match.nodes.get(k) is split)
        if key != "s2v" and not any(k in match.nodes for k in order[order.index(key) + 1:]):
            return "the scores' round trip of views is read around their fill at a later step"
        return _round_trip_problem(match, ix, split, merge, inner)
    if split is None or merge is None or ("s2" if inner == "mask" else "s2m") not in match.nodes:
        return "the scores are viewed to another shape and not back around a mask"
    if inner == "mask2" and "sv" in match.nodes:
        return "the scores are viewed to another shape and not back around a mask"
    # views around the only mask read as `$s2u`, `$s2v`: the reading `$sv`, `$s2u` takes them (one
    # reading of each), this one gives its reason where they are refused
    duplicate = inner == "mask2" and "s2" not in match.nodes
    problem = _round_trip_problem(match, ix, split, merge, "mask" if duplicate else inner)
    return problem or ("the scores' round trip of views is read around their first mask" if duplicate else None)


def _round_trip_problem(match: Match, ix: MethodIndex, split: Node, merge: Node, inner: str) -> str | None:
    outer, back = _view_sizes(split, ix.defs), _view_sizes(merge, ix.defs)
    if outer is None or back is None:
        return "the scores' views do not name their sizes"
    products = [match.nodes.get(k) for k in ("s0", "out")]
    if inner == "fmask" and not all(p is not None and p.target in _BATCHED_3D for p in products):
        return "the scores are filled through a view of them; only the 3-D scores of torch.bmm split into 4-D are covered"
    if inner in ("mask", "fmask") and all(p is not None and p.target in _BATCHED_3D for p in products):
        if len(outer) != 4 or len(back) != 3:
            return "the mask is added through a view of the scores; only the 3-D scores of torch.bmm split into 4-D are covered"
        if any(isinstance(o, Var) and re.fullmatch(r"_t\d+", o.name) for o in outer[:2]):
            return "the scores' view splits their batch axis by sizes computed inline"
        if not all(_same_size(a, b) for a, b in zip(outer[2:], back[1:], strict=True)):
            return "the scores' views do not split and merge the same axes"
        first = back[0]
        merged = isinstance(first, Const) and first.value == -1
        if isinstance(first, Sym):
            a, b = (getattr(o, "text", repr(getattr(o, "value", o))) for o in outer[:2])
            merged = first.text.replace(" ", "") in (f"{a}*{b}".replace(" ", ""), f"{b}*{a}".replace(" ", ""))
        elif isinstance(first, Var):
            node = ix.defs.get(first.name)
            merged = node is not None and node.op in ("mul", "scale") and len(node.inputs) == 2 and \
                {str(node.inputs[0]), str(node.inputs[1])} == {str(outer[0]), str(outer[1])}
        if not merged:
            return "the second view of the scores does not merge the two axes the first one split"
        return None
    if ix.shapes.rank(split.inputs[0] if split.inputs else None) is None:
        return "the mask is added through a view of the scores, whose rank is not proven"
    if ix.shapes.leading_split(split, merge) is None:
        return "the scores' views do not split their leading axis in two and merge it back"
    return None


CHECKS["mask_view_round_trip"] = _mask_view_round_trip


def folded_mask(match: Match, facts: ShapeFacts) -> tuple[str, Operand, Operand, int] | None:
    """Where the match adds a mask through a round trip of views that split the scores' leading axis
    (constraint `mask_view_round_trip`, other than the bmm scores whose operands are viewed instead):
    (the mask's binding, the split's two sizes, the count of the axes the split keeps), so that the
    kernel takes `mask.expand(a, b, -1, ...).flatten(0, 1)`."""
    views = round_trip(match)
    if views is None or views[0] is None or views[1] is None:
        return None
    split, merge, inner = views
    if inner in ("mask", "fmask") and all((p := match.nodes.get(k)) is not None and p.target in _BATCHED_3D
                                          for k in ("s0", "out")):
        return None
    sizes = facts.leading_split(split, merge)
    rank = facts.rank(split.inputs[0])
    if sizes is None or rank is None:
        return None
    return inner, sizes[0], sizes[1], rank - 1



def _clamp_at_lowest(match: Match, ix: MethodIndex) -> str | None:
    """The masked scores clamped from below (OPT: `torch.max(s, torch.tensor(torch.finfo(s.dtype).min))`)
    by the lowest value of their own dtype, as a 0-d tensor of the default dtype (no `dtype=`; a
    `device=` is allowed). The clamp changes only entries that are -inf (a -inf in the mask, or
    `s + finfo.min` overflowing), and the kernel adds its mask itself, so the rewrite clamps the mask
    the same way: `s + max(m, c)` equals `max(s + m, c)` on every row that keeps a key (the -inf
    entries weigh 0 both ways), and on a row that keeps none both are `c` throughout in float32 and
    bfloat16, a uniform average of v (`c + s` rounds to `c` for abs(s) below half the spacing of the
    dtype's largest values); the float32 0-d tensor of float64's lowest value is -inf, a clamp that
    does nothing, and so does the rewrite's. Any other bound is a near-miss."""
    clamp = match.nodes.get("s2c")
    if clamp is None:
        return None
    scores = match.nodes.get("s2")
    bound = match.bindings.get("clamp")
    tensor = ix.defs.get(bound.name) if isinstance(bound, Var) else None
    if scores is None or tensor is None or tensor.op != "torch.tensor" or len(tensor.inputs) != 1 \
            or any(key != "device" for key, _ in tensor.kwargs):
        return "the scores are clamped by a value not provably `torch.tensor(torch.finfo(scores.dtype).min)`"
    lowest = ix.defs.get(tensor.inputs[0].name) if isinstance(tensor.inputs[0], Var) else None
    finfo = ix.defs.get(lowest.inputs[0].name) if lowest is not None and lowest.op == "getattr" \
        and lowest.inputs[1:] == (Const("min"),) and isinstance(lowest.inputs[0], Var) else None
    dtype = ix.defs.get(finfo.inputs[0].name) if finfo is not None and finfo.op == "torch.finfo" \
        and finfo.inputs and isinstance(finfo.inputs[0], Var) else None
    if dtype is None or dtype.op != "getattr" or dtype.inputs[1:] != (Const("dtype"),) \
            or not isinstance(dtype.inputs[0], Var) or dtype.inputs[0].name not in scores.outputs:
        return "the scores are clamped by a value not provably the lowest of their own dtype (`torch.finfo(scores.dtype).min`)"
    return None


CHECKS["clamp_at_lowest"] = _clamp_at_lowest


# The tanh GELU, 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3))): the constants the kernel
# (`F.gelu(approximate="tanh")`) computes with. The argument is compared as a polynomial in x, so any
# distribution or factoring of it fits. Constants may differ from these by RELATIVE_TOLERANCE: about
# eight float32 ulps (float32 resolves 1.2e-7), less than the rounding the hand-written chain of about
# eight float32 operations already has, and far below any other function's constants (0.0447, 0.7).
_GELU_SLOPE = math.sqrt(2 / math.pi)
_GELU_CUBIC = 0.044715
RELATIVE_TOLERANCE = 1e-6


def _close(value: float, expected: float) -> bool:
    return abs(value - expected) <= RELATIVE_TOLERANCE * abs(expected)


def _tanh_gelu_argument(match: Match, ix: MethodIndex) -> str | None:
    """`tanh($arg)` of the tanh GELU: `$arg`, read as a polynomial in `$x` through the method's data
    flow, is sqrt(2 / pi) * (x + 0.044715 * x**3), however written (`x * 0.7978845608 * (1 + 0.044715 *
    x * x)`, the constant cached on the function). The nodes computing it go with the match where
    nothing else reads them."""
    x, arg, tanh = match.bindings.get("x"), match.bindings.get("arg"), match.nodes.get("t")
    if not isinstance(x, Var) or arg is None or tanh is None:
        return "the tanh argument is not a polynomial of the GELU's input"

    cached: list[Sym] = []

    def number(sym: Sym) -> float | None:
        value = function_attribute_value(match.file.path, sym.text, tanh.pos.line) if tanh.pos else None
        cached.append(sym)
        return numeric(Sym(ast.unparse(value))) if value is not None else None

    reader = PolynomialReader(ix, x.name, tanh, number)
    poly = reader.read(arg)
    if poly is None:
        return f"the tanh argument is not a polynomial of `{x.name.partition('.')[0]}` with known coefficients"
    slope, cubic = poly.get(1, 0.0), poly.get(3, 0.0)
    if set(poly) != {1, 3}:
        terms = " + ".join(f"{c:.6g} * x**{d}" for d, c in sorted(poly.items()))
        return f"the tanh argument is {terms}, not sqrt(2 / pi) * (x + 0.044715 * x**3)"
    if not _close(cubic / slope, _GELU_CUBIC):
        return f"the cubic coefficient is {cubic / slope:.6g} (relative to the linear one), not 0.044715"
    if not _close(slope, _GELU_SLOPE):
        return f"the tanh argument's scale is {slope:.10g}, not sqrt(2 / pi) = {_GELU_SLOPE:.10g}"
    match.companions[:] = [n for n in reader.nodes if all(n is not m for m in match.nodes.values())]
    for sym in cached:  # a constant cached on the function for this read alone goes with it
        stmt = function_attribute_cache(match.file.path, sym.text, tanh.pos.line) if tanh.pos else None
        if stmt is not None and not tanh.via:
            match.dead.append(Pos(tanh.pos.file, stmt.lineno, stmt.col_offset, stmt.end_lineno or stmt.lineno,
                                  stmt.end_col_offset or 0))
    return None


CHECKS["tanh_gelu_argument"] = _tanh_gelu_argument
