"""Named checks a rule can require with `where NAME`. Each returns None when the match satisfies
it, or the reason it does not (which becomes the near-miss reason)."""

from __future__ import annotations

from collections.abc import Callable

from engine.dsl import canonical as C
from engine.dsl.ir import Const, Seq, Sym, Var
from engine.match.matcher import Match, MethodIndex, numeric


def _is_finfo_max(value, ix: MethodIndex) -> bool:
    node = ix.defs.get(value.name) if isinstance(value, Var) else None
    if node is None or node.op != "getattr" or node.inputs[1:] != (Const("max"),):
        return False
    source = ix.defs.get(node.inputs[0].name) if isinstance(node.inputs[0], Var) else None
    return source is not None and source.op in ("torch.finfo", "numpy.finfo")


def _fill_is_minus_infinity(match: Match, ix: MethodIndex) -> str | None:
    """A `masked_fill` mask must fill with -inf (or the dtype's lowest value, or a huge negative
    number): only then is it the same as dropping those keys from the softmax."""
    value = match.bindings.get("fill")
    if value is None:
        return None
    if isinstance(value, Sym):
        text = value.text.replace(" ", "")
        if text in ("float('-inf')", 'float("-inf")', "-float('inf')", '-float("inf")', "-math.inf", "-torch.inf",
                    "-numpy.inf", "-np.inf") or ".finfo(" in text and text.endswith(".min"):
            return None
    number = numeric(value) if isinstance(value, (Const, Sym)) else None
    if number is not None and number <= -1e4:
        return None
    if isinstance(value, Var):
        node = ix.defs.get(value.name)
        if node is not None and node.op == "getattr" and node.inputs[1:] == (Const("min"),):
            return None
        if node is not None and node.op == "neg" and _is_finfo_max(node.inputs[0], ix):
            return None  # -torch.finfo(dtype).max is the dtype's lowest value, finfo.min
    return f"masked_fill value {getattr(value, 'text', getattr(value, 'value', value))!r} is not -inf"




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


def _not_already_chosen(match: Match, ix: MethodIndex) -> str | None:
    """The optimizer call does not already choose an implementation (`fused=`, `foreach=`,
    `capturable=`, `differentiable=`, or a `**kwargs` that may)."""
    node = match.root
    for key, _ in node.kwargs:
        if key in ("fused", "foreach", "capturable", "differentiable"):
            return f"the call already sets {key}="
        if key == "**":
            return "the call passes **kwargs, which may already choose an implementation"
    return None


CHECKS: dict[str, Callable[[Match, MethodIndex], str | None]] = {
    "fill_is_minus_infinity": _fill_is_minus_infinity,
    "same_branch": _same_branch,
    "same_helper": _same_helper,
    "linear_has_bias": _linear_has_bias,
    "helper_named_split_heads": _helper_named_split_heads,
    "not_already_chosen": _not_already_chosen,
}


# ---------------------------------------------------------------------------------------------
# Rank inference, for dimension arguments


_SAME_RANK_OPS = {"torch.cat", "cat", "unpack", ".repeat", ".expand", ".expand_as", "add", "sub", "mul", "div", "scale", "masked_fill", "dropout", "softmax", "log_softmax", "neg",
                  ".to", ".float", ".half", ".type_as", ".type", ".contiguous", ".clone", "assign", "transpose",
                  "gelu", "relu", "silu", "tanh", "sigmoid", "exp", "sqrt", "rsqrt", "pow", "erf", ".masked_fill_"}


def rank_of(operand, ix: MethodIndex, depth: int = 0) -> int | None:
    """The number of dimensions of a value where the code makes it certain (einsum output spec,
    view/reshape/permute with listed sizes, ops that keep their input's rank)."""
    if depth > 40 or not isinstance(operand, Var):
        return None
    node = ix.defs.get(operand.name)
    if node is None:
        return None
    if node.kind == "phi":
        ranks = {rank_of(i, ix, depth + 1) for i in node.inputs}
        return ranks.pop() if len(ranks) == 1 else None
    op = node.op
    if op == "torch.einsum" and node.inputs and isinstance(node.inputs[0], Const) and isinstance(node.inputs[0].value, str):
        spec = node.inputs[0].value.replace(" ", "")
        if "->" in spec and "..." not in spec:
            return len(spec.split("->", 1)[1])
        return None
    if op in (".view", ".reshape", ".permute", "torch.reshape"):
        args = node.inputs[1:]
        if len(args) == 1 and isinstance(args[0], Var):
            # `.view(*shape)` / `.view(shape)` with `shape = (a, b, c)` assigned just before
            shape = ix.defs.get(args[0].name)
            if shape is not None and shape.op == "assign" and shape.inputs and isinstance(shape.inputs[0], Seq):
                return len(shape.inputs[0].items)
            return None
        if len(args) == 1 and isinstance(args[0], Seq):
            return len(args[0].items)
        if len(args) == 1 and isinstance(args[0], Const) and isinstance(args[0].value, tuple):
            return len(args[0].value)
        if args and all(not isinstance(a, Seq) and not (isinstance(a, Var) and ix.defs.get(a.name) is not None
                                                       and ix.defs[a.name].op in ("add",)) for a in args):
            return len(args) if len(args) > 1 or isinstance(args[0], Const) else None
        return None
    if op == "getitem" and len(node.inputs) == 2:
        index = node.inputs[1]
        text = index.text if isinstance(index, Sym) else None
        if text is not None and "None" not in text and all(":" in part or part.strip() == "..." for part in text.split(",")):
            return rank_of(node.inputs[0], ix, depth + 1)  # slicing keeps the rank
        return None
    if op in ("torch.cat", "cat") and node.inputs and isinstance(node.inputs[0], Seq):
        # torch.cat requires every input to have the same number of dimensions: one known is enough
        ranks = {rank_of(i, ix, depth + 1) for i in node.inputs[0].items} - {None}
        return ranks.pop() if len(ranks) == 1 else None
    if op == "matmul" and node.target is not None and node.target.endswith("')") and "einsum(" in node.target:
        # an einsum extracted as a matrix product: `torch.einsum('bhid,bhjd->bhij')`
        spec = node.target.partition("(")[2][1:-2]
        axes = C.einsum_axes(spec.partition("->")[2], einops=node.target.startswith("einops."))
        if axes is not None and "..." not in axes:
            return len(axes)
    if op == "matmul":
        ranks = [rank_of(i, ix, depth + 1) for i in node.inputs[:2]]
        return max(ranks) if all(r is not None for r in ranks) else None  # type: ignore[type-var]
    if node.kind == "layer":
        layer = ix.layer_for(node)
        if layer is not None and layer.type in ("torch.nn.Dropout", "torch.nn.Softmax"):
            return rank_of(node.inputs[0], ix, depth + 1) if node.inputs else None
        return None
    if op in _SAME_RANK_OPS and node.inputs:
        ranks = [rank_of(i, ix, depth + 1) for i in node.inputs if isinstance(i, Var)]
        known = [r for r in ranks if r is not None]
        return max(known) if known else None
    return None


def _last_dim(match: Match, ix: MethodIndex) -> str | None:
    """`$dim` is the last dimension of `$x`: -1, or d where `$x` provably has d + 1 dimensions."""
    dim = match.bindings.get("dim")
    if not isinstance(dim, Const) or isinstance(dim.value, bool) or not isinstance(dim.value, int):
        return f"dim={getattr(dim, 'text', getattr(dim, 'value', dim))} is not a constant"
    if dim.value == -1:
        return None
    rank = rank_of(match.bindings.get("x"), ix)
    if dim.value >= 0 and rank is not None and dim.value == rank - 1:
        return None
    known = f" of a {rank}-D tensor" if rank is not None else ""
    return f"dim={dim.value}{known} is not provably the last dimension"


CHECKS["last_dim"] = _last_dim


def _last_two_dims(match: Match, ix: MethodIndex) -> str | None:
    """The transpose bound as `$kt` swaps the last two dimensions of `$k`: (-2, -1), or (r-2, r-1)
    where `$k` provably has r dimensions."""
    node = match.nodes.get("kt")
    if node is None:
        return None
    d0, d1 = node.kwarg("dim0"), node.kwarg("dim1")
    if not (isinstance(d0, Const) and isinstance(d1, Const) and isinstance(d0.value, int) and isinstance(d1.value, int)):
        return "the transpose's dimensions are not constants"
    dims = sorted((d0.value, d1.value))
    if dims == [-2, -1]:
        return None
    rank = rank_of(node.inputs[0], ix) if node.inputs else None
    if rank is not None and dims == [rank - 2, rank - 1]:
        return None
    known = f" of a {rank}-D tensor" if rank is not None else ""
    return f"transpose({dims[0]}, {dims[1]}){known} is not provably a swap of the last two dimensions"


CHECKS["last_two_dims"] = _last_two_dims


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


def _fully_masked_rows_keep_original(match: Match, ix: MethodIndex) -> str | None:
    """A query row whose every key is masked by `masked_fill(mask, fill)` is, in the original, the
    softmax of equal values: the plain average of `v` for a finite fill (-1e9, finfo.min), NaN for
    -inf. The rewrite reproduces both: it zeroes those rows' queries and unmasks them (scores 0,
    so the kernel averages `v` and no gradient reaches `q` or `k`, as `masked_fill` blocks it), and
    for an infinite fill binds `$nan_rows` so the template sets those output rows to NaN."""
    if "fmask" in match.bindings and _fill_is_infinite(match.bindings.get("fill")):
        match.bindings["nan_rows"] = Sym("float('nan')")
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


_FUSED_DEVICES = '("cpu", "cuda")'  # where torch>=2.4 has a fused Adam/AdamW kernel


def _fused_where_params_live(match: Match, ix: MethodIndex) -> str | None:
    """`fused=` is keyed on the devices the optimizer's parameters live on (all on the CPU or CUDA,
    the devices with a fused kernel), not on whether CUDA exists somewhere. The parameters must be
    readable twice without being consumed: `<module>.parameters()` (called again), or a list built in
    the function (a list literal or comprehension, of parameters or of groups whose `params` are
    such lists). Binds `$fused` to that test."""
    node = match.root
    params = node.inputs[0] if node.inputs else node.kwarg("params")
    text = params.text.replace(" ", "") if isinstance(params, Sym) else ""
    if text.endswith(".parameters()") and text[:-len(".parameters()")].replace(".", "").replace("_", "").isalnum():
        match.bindings["fused"] = Sym(f"all(p.device.type in {_FUSED_DEVICES} for p in {text})")
        return None
    producer = ix.defs.get(params.name) if isinstance(params, Var) else None
    if producer is None:
        return "where the parameters live is not known here (they are not built in this function)"
    if producer.op == ".parameters" and producer.inputs and isinstance(producer.inputs[0], (Var, Sym)):
        owner = producer.inputs[0]
        owner_text = owner.text if isinstance(owner, Sym) else owner.name.partition(".")[0]
        match.bindings["fused"] = Sym(f"all(p.device.type in {_FUSED_DEVICES} for p in {owner_text}.parameters())")
        return None

    def is_list(value) -> bool:
        definition = ix.defs.get(value.name) if isinstance(value, Var) else None
        return definition is not None and (definition.op == "listcomp"
                                           or definition.op == "assign" and isinstance(definition.inputs[0], Seq)
                                           and definition.inputs[0].kind == "list")

    if not is_list(params):
        return "the parameters are not a list built in this function: reading their devices could consume them"
    items = producer.inputs[0].items if producer.op == "assign" else ()
    for item in items:
        group = ix.defs.get(item.name) if isinstance(item, Var) else None
        if group is not None and group.op == "dict" and not all(is_list(i) for i in group.inputs if isinstance(i, Var)
                                                                 and ix.defs.get(i.name) is not None
                                                                 and ix.defs[i.name].op != "assign"):
            return "a parameter group's `params` is not a list built in this function"
    name = params.name.partition(".")[0]
    match.bindings["fused"] = Sym(f"all(p.device.type in {_FUSED_DEVICES} for g in {name} "
                                  f"for p in (g['params'] if isinstance(g, dict) else [g]))")
    return None


CHECKS["fused_where_params_live"] = _fused_where_params_live
