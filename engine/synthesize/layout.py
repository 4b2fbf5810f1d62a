"""Layout adaptation for a rewrite: the kernel wants (batch..., query, feature) operands, and the code
may hold them another way. A match says which way through the statements it bound (see
rules/sdpa-attention.rule):

  * no `$kt` (the key's transpose) bound: the product read the key stored as (..., feature, key),
    so the kernel gets `k.transpose(-2, -1)`;
  * `$pt` bound (`v @ p.transpose(-2, -1)`): the value is stored (..., feature, key) and the output
    is read back as (..., feature, query): the kernel gets `v.transpose(-2, -1)` and its result is
    transposed back;
  * `$mask2` bound (a second additive mask, `s + bias + mask`): the kernel's mask is the sum of both;
  * `$temp` bound (a learned temperature constant along the last two axes): it multiplies the query,
    `(q * temp) @ k^T == (q @ k^T) * temp`, and the kernel's own scale stays as the template says;
    `$tdiv` (a tensor dividing the scores, such as a 0-d `torch.full([], sqrt(d))`) divides it.

  * an operand the extractor transposed to lower an einsum (`'b h d i, b h d j -> b h i j'`) is the
    einsum's operand itself, transposed only where the kernel needs it;
  * an operand the extractor permuted to bring an einsum's batch axes into the output's order
    (`'bihd,bjhd->bhij'`) gets that permute as a `transpose(1, 2)` or `permute(...)`, and a batch
    axis it lacks (a multi-query key, `'b h i d, b j d -> b h i j'`) as `unsqueeze(p)` expanded to
    the size another operand has there (the fused kernels take no broadcast heads); an einsum output
    permuted back is permuted back after the kernel;
  * an einsum's several contracted axes (`'bhtcfn,bhtefn->bhce'`), or a value's several axes carried
    to the output (`'b h i j, b h j w d -> b h i w d'`), which the extractor flattened into one
    feature axis, are flattened the same way (`.flatten(3)`), and the kernel's result unflattened to
    the sizes the value has there (`.unflatten(-1, v.shape[3:5])`, of a value with a plain name);
  * `$s0p` and `$p3` bound (the scores permuted after the product, the probabilities permuted back):
    each mask of the permuted scores is moved to the kernel's layout as constraint
    `scores_permuted_back` recorded (`match.relayout`).

Only the transposes the layout needs are emitted; a match in the kernel's layout renders unchanged.

The fused kernels take 4-D (batch, heads, query, feature) operands only; other ranks run the math
path, which materializes the attention matrix and cannot pay. Where both products are proven 3-D
(`torch.bmm` and `torch.baddbmm` take nothing else; the fairseq `(bsz * heads, n, d)` layout), the
kernel gets each operand with a leading axis of 1 (`q.unsqueeze(0)`) and its result `.squeeze(0)`
(proven 2-D operands, `(query, feature)`, gain two: `q[None, None]`, the result `[0, 0]`):
every operand gains the same leading 1, so broadcasting is unchanged (a 3-D output admits masks of
rank 3 or less only). The kernels take 2-D or 4-D masks: one proven 3-D gains the axis too, one of
unproven rank is passed as written. Where both products are proven 5-D and the query, key and value
provably share their two leading axes (the same axes, not merely equal sizes), those axes are
flattened into one (`q.flatten(0, 1)`) and the result unflattened (`.unflatten(0, q.shape[:2])`);
a mask there must be proven of rank 3 or less (it broadcasts the same against the flattened axis).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from engine.analysis.contraction import ONE_ROW_OF_COLUMN, is_one_row
from engine.analysis.shapes import ShapeFacts
from engine.dsl import canonical as C
from engine.dsl.ir import Const, Node, Operand, Seq, Var
from engine.match.constraints import folded_mask, round_trip
from engine.match.matcher import Match
from engine.synthesize.template import TemplateError

_SWAP = ".transpose(-2, -1)"


def _atom(text: str) -> str:
    """`text` as the receiver of a method call: parenthesized unless it is a name, an attribute, a
    call or a subscript."""
    if re.fullmatch(r"[\w.]+", text):
        return text
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return f"({text})"
    if isinstance(tree, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        return text
    if text.startswith("(") and text.endswith(")"):
        try:  # the outer parentheses enclose the whole text already when what they hold parses
            ast.parse(text[1:-1], mode="eval")
            return text
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            pass
    return f"({text})"


def _int(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return -inner if inner is not None else None
    return node.value if isinstance(node, ast.Constant) and type(node.value) is int else None


def _swapped(text: str) -> str:
    """`text` with its last two axes swapped. A swap that `text` ends with cancels (`k.transpose(-2,
    -1)`, or `k.t()`, which is that swap for the 2-D tensors it takes): a key the code stored
    transposed is passed as it was, not as `k.t().transpose(-2, -1)`."""
    try:
        tree = ast.parse(text, mode="eval").body if text.isascii() and "\n" not in text else None
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        tree = None
    if isinstance(tree, ast.Call) and isinstance(tree.func, ast.Attribute) and not tree.keywords:
        dims = {_int(a) for a in tree.args}
        if tree.func.attr == "t" and not tree.args or tree.func.attr == "transpose" and dims == {-2, -1}:
            inner = tree.func.value
            return text[inner.col_offset:inner.end_col_offset]
        order = [_int(a) for a in tree.args]
        if tree.func.attr == "permute" and len(order) > 2 and sorted(order) == list(range(len(order))):  # type: ignore[type-var]
            # a permute of every axis takes the swap into its order (speechbrain's key stored
            # `key.permute(0, 2, 3, 1)` is passed as `key.permute(0, 2, 1, 3)`)
            order[-2:] = order[-1], order[-2]
            inner = tree.func.value
            return f"{text[inner.col_offset:inner.end_col_offset]}.permute({', '.join(map(str, order))})"
    return _atom(text) + _SWAP


def _needs_key_swap(match: Match) -> bool:
    pattern = match.pattern
    declares = pattern is not None and any(s.out == "kt" for s in pattern.stmts)
    return declares and "kt" in match.skipped


def _producer(match: Match, operand: Operand | None):
    if not isinstance(operand, Var):
        return None
    return next((n for n in match.method.nodes if operand.name in n.outputs), None)


_LOWERING_OPS = ("transpose", ".permute", ".unsqueeze", ".flatten", ".unflatten", ".size")


def _generated(node) -> bool:
    """A node the extractor made to lower an einsum: no source text of its own (its position is the
    whole einsum)."""
    return node is not None and node.kind == "op" and node.op in _LOWERING_OPS and node.target in C.EINSUM_FUNCTIONS


def _permutes_a_result(match: Match, node) -> bool:
    """`node` permutes an einsum's own product into the equation's output order: it is part of the
    value that einsum's text computes, not a step towards another product."""
    source = _producer(match, node.inputs[0]) if node.inputs else None
    if source is not None and source.op == ".unflatten" and _generated(source):
        source = _producer(match, source.inputs[0]) if source.inputs else None
    return source is not None and source.op == "matmul" and source.pos == node.pos


def _chain(match: Match, operand: Operand | None) -> tuple[Operand | None, list]:
    """The einsum operand behind `operand` and the generated nodes the lowering applied to it,
    innermost first (stopping at an einsum's result, which its own text computes)."""
    nodes: list = []
    node = _producer(match, operand)
    while _generated(node) and node.inputs and not _permutes_a_result(match, node):
        nodes.append(node)
        operand = node.inputs[0]
        node = _producer(match, operand)
    return operand, nodes[::-1]


def _dims(node) -> list[int]:
    return [d.value for d in node.inputs[1:] if isinstance(d, Const)]


def _permute_text(dims: list[int]) -> str:
    if dims == list(range(len(dims))):
        return ""
    moved = [i for i, d in enumerate(dims) if d != i]
    if len(moved) == 2:
        return f".transpose({moved[0]}, {moved[1]})"
    return f".permute({', '.join(map(str, dims))})"


def _lowered(match: Match, name: str, render: Callable[[Operand], str]) -> tuple[str, list[int | None], list[int], bool] | None:
    """`$name` as the einsum lowering holds it, when it is one: (the operand's text with the
    generated permute, the original axis behind each axis or None for a new one, the new axes,
    whether the lowering swapped its last two axes)."""
    base, nodes = _chain(match, match.bindings.get(name))
    if not nodes or base is None:
        return None
    text = render(base)
    origin: list[int | None] = []
    new: list[int] = []
    swapped = False
    for node in nodes:
        if node.op == ".permute":
            dims = _dims(node)
            origin = [origin[d] for d in dims] if origin else list(dims)
            text = _atom(text) + _permute_text(dims) if _permute_text(dims) else text
        elif node.op == ".unsqueeze":
            position = _dims(node)[0]
            origin.insert(position, None)
            new.append(position)
        elif node.op == ".flatten":  # several contracted axes (or a value's trailing axes) as one
            start, end = _dims(node)
            if not origin:  # (the lowering permutes every operand it flattens first: the rank is proven)
                raise TemplateError("an einsum operand is flattened at axes of no known position")
            last = end == len(origin) - 1
            origin[start:end + 1] = [None]
            text = _atom(text) + (f".flatten({start})" if last else f".flatten({start}, {end})")
        else:  # the last two axes swapped (always the lowering's last step)
            swapped = True
    return text, origin, new, swapped


def lookup(match: Match, base: Callable[[str], str | None],
           render: Callable[[Operand], str]) -> Callable[[str], str | None]:
    """The template lookup with the layout's adaptations applied to `$q`, `$k` and `$v`."""
    if match.relayout:
        base = _relaid(match, base)
    lowered = {name: _lowered(match, name, render) for name in ("q", "k", "v")}

    def size_of(position: int) -> str | None:
        """A text for the size of axis `position` from an operand that has it."""
        for name in ("q", "k", "v"):
            low = lowered[name]
            if low is None:
                text = base(name)
                return None if text is None else f"{_atom(text)}.shape[{position}]"
            text, origin, new, _ = low
            if position in new:
                continue
            source = origin[position] if position < len(origin) else None
            if source is not None:
                return f"{_atom(render(_chain(match, match.bindings.get(name))[0]))}.shape[{source}]"
            return f"{_atom(text)}.shape[{position}]"
        return None

    def adapted(name: str) -> str | None:
        if name == "mask":  # several additive masks are one: their sum
            raw = {key: base(key) for key in ("mask", "mask2", "mask3")}
            keyed = [(key, _folded(match, key, raw[key], render)) for key in ("mask", "mask2", "mask3")]
            terms = [t for _, t in keyed if t is not None]
            if not terms:
                return None
            text = " + ".join(terms)
            absent = [(raw[key], t) for key, t in keyed if key in match.optional and t is not None]
            if len(terms) > 1 and absent:
                # one term is None on some path (`if mask is not None: s += mask`): the others alone there
                if len(absent) > 1 or "s2s" in match.nodes or "s3s" in match.nodes or "s2c" in match.nodes:
                    raise TemplateError("several optional masks, or an optional mask scaled or clamped with another")
                other = " + ".join(t for t in terms if t != absent[0][1])
                return f"{other} if {absent[0][0]} is None else {text}"
            after = keyed[2][1]  # added after the fill: not scaled with the scores (constraint `mask_after_fill`)
            if after is not None and len(terms) > 1 and ("s2s" in match.nodes or "s3s" in match.nodes
                                                         or "s2c" in match.nodes or match.fold_into is not None):
                raise TemplateError("a mask added after the fill is summed with one scaled, clamped or folded")
            if match.fold_into is not None and len(terms) > 1:
                if "s3s" in match.nodes or "s2s" in match.nodes or "s2c" in match.nodes:
                    raise TemplateError("a mask set on one branch is scaled or clamped with another")
                other = " + ".join(t for t in terms if t != match.fold_into)
                return f"{other} if {match.fold_into} is None else {other} + {match.fold_into}"
            for step, name in (("s2s", "factorm"), ("s3s", "factor3")):
                factor = base(name) if step in match.nodes and terms != [after] else None
                if factor is not None:  # `(s + m) * c`: the kernel scales before it adds (constraint `scaled_after_fill`)
                    text = f"{_atom(text)} * {_atom(factor)}"
            through = match.optional_through.get("mask") or match.optional_through.get("mask2") \
                or match.optional_through.get("mask3")
            if "s2c" in match.nodes and len(terms) == 1:
                # the scores clamped at their dtype's lowest value after the mask (OPT): the kernel
                # adds the mask itself, so the mask is clamped the same way (constraint `clamp_at_lowest`)
                clamped = f"torch.max({text}, torch.tensor(torch.finfo({_atom(text)}.dtype).min))"
                return f"{clamped} if {text} is not None else None" if match.optional & {"mask"} else clamped
            if through is not None and len(terms) == 1 and text != through:
                # `attention_mask.to(q.device)` where the mask may be None: None passes as it is (0.0
                # in the fill's mask built around it, `torch.where(fmask, -inf, mask)`, which takes no None)
                return f"{text} if {through} is not None else {'0.0' if 'fmask' in match.bindings else 'None'}"
            if match.optional & {"mask", "mask2", "mask3"} and "fmask" in match.bindings:
                # the fill's mask is built around the additive one (`torch.where(fmask, -inf, mask)`),
                # which takes no None: where the code adds it only when present, so does the rewrite
                tested = absent[0][0] if absent else text
                return f"{text} if {tested} is not None else 0.0"
            return text
        if name == "factor":  # the score factors in series, each as the branch it runs on says
            texts = {n: base(n) for n in ("factor", "tdiv_number", "factor2", "factorm", "factor3")}
            if texts["tdiv_number"] is not None:  # `s / torch.full([], n)`: the factor 1 / n
                texts["tdiv_number"] = f"1 / {_atom(texts['tdiv_number'])}"
            terms = [_conditional(match, n, t) for n, t in texts.items() if t is not None]
            return " * ".join(terms) if terms else None
        if name in ("dp", "dtraining") and "dp" in match.conditional:
            return _conditional_dropout(match, name, base(name))
        if name not in ("q", "k", "v"):
            return base(name)
        swap = (name == "k" and _needs_key_swap(match)) or (name == "v" and "pt" in match.nodes)
        low = lowered[name]
        if low is not None:
            text, origin, new, swapped = low
            if new:
                sizes = []
                for position in range(len(origin)):
                    if position in new:
                        size = size_of(position)
                        if size is None:
                            return None
                        sizes.append(size)
                    else:
                        sizes.append("-1")
                text = _atom(text) + "".join(f".unsqueeze({p})" for p in new) + f".expand({', '.join(sizes)})"
            if swapped:
                swap = not swap  # the equation's own transpose and the layout's cancel
        else:
            text = base(name)
        if text is None:
            return None
        if swap:
            text = _swapped(text)
        if name == "v" and _upcast(match):
            # the code computed the scores in a wider dtype than the value's (`q.to(torch.float32)`)
            # and cast the probabilities to the value's: the kernel takes one dtype, so the value
            # is cast up for it and the result back (`upcast_result`)
            q = base("q")
            return f"{_atom(text)}.to({_atom(q)}.dtype)" if q is not None else None
        if name == "q" and _negated(match):
            text = f"{_atom(text)}.neg()"
        if name == "q" and _one_row(match, "s0"):
            # a single query gets its query axis (constraint `one_row_products`): a column its row
            column = match.nodes["s0"].target == ONE_ROW_OF_COLUMN
            text = _atom(text) + (_SWAP if column else ".unsqueeze(-2)")
        if name == "q" and "temp" in match.bindings:
            temp = base("temp")
            return f"({text} * {temp})" if temp is not None else None
        if name == "q" and "tdiv" in match.bindings:
            divisor = base("tdiv")
            return f"({text} / {_atom(divisor)})" if divisor is not None else None
        return text

    split = bmm_split(match)
    if split is None:
        return adapted

    def unflattened(name: str) -> str | None:
        # a mask added to (or a fill made in) the 3-D scores viewed (bsz, heads, tgt, src): the
        # operands are viewed the same way, and the kernel's result flattened back (`_four_d`)
        text = adapted(name)
        if name not in ("q", "k", "v") or text is None:
            return text
        return _atom(text) + _split_text(split, render)

    return unflattened


def _one_row(match: Match, key: str) -> bool:
    """The product bound as `key` has a vector on its left and no row axis (engine/analysis/contraction.py)."""
    return is_one_row(match.nodes.get(key))


# the statement adding each additive mask, and the views a round trip may split the scores at (in order)
_ADDS = {"mask": "s2", "mask2": "s2m", "mask3": "s3m"}
_STEPS = ("sv", "s2", "s2u", "s2m", "s2v", "s3", "s3v", "s3m")


def bmm_split(match: Match) -> Node | None:
    """The view that splits the 3-D scores of `torch.bmm` into (bsz, heads, tgt, src) around a mask
    (constraint `mask_view_round_trip`): the kernel's operands are viewed the same way."""
    views = round_trip(match)
    if views is None or views[2] not in ("mask", "fmask") or views[0] is None or views[1] is None:
        return None
    if not all((p := match.nodes.get(k)) is not None and p.target in ("torch.bmm", ".bmm", "torch.baddbmm", ".baddbmm")
               for k in ("s0", "out")):
        return None
    return views[0]


def _unsplit(match: Match, key: str, text: str, render: Callable[[Operand], str]) -> str:
    """An additive mask of 3-D `torch.bmm` scores added outside their round trip of views (before the
    split, after the merge: `w += attn_mask.unsqueeze(0)`, then `w.view(bsz, heads, tgt, src)
    .masked_fill(...)`) in the layout of the split: as it is where it broadcasts alike against both
    (proven of rank 2 or less, or with a size-1 axis before its last two: the scores take no mask of
    more axes than theirs, `w += attn_mask.unsqueeze(0)`), else broadcast to the 3-D
    scores' shape, the merge's sizes, and its leading axis split as the scores' was
    (`m.expand(bsz * heads, tgt, src).unflatten(0, (bsz, heads))`, a view)."""
    split = bmm_split(match)
    views = round_trip(match)
    if split is None or views is None:
        return text
    key_of = {node_key: k for k, node_key in _ADDS.items()}
    inside = False
    for step in _STEPS:
        if match.nodes.get(step) is split:
            inside = True
        elif match.nodes.get(step) is views[1]:
            inside = False
        elif key_of.get(step) == key:
            break
    if inside:
        return text
    facts = ShapeFacts(match.method, match.cls)
    shape = facts.shape(match.bindings[key])
    lead = shape.axis(-3) if shape is not None else None
    if shape is not None and (shape.rank is not None and shape.rank <= 2 or lead is not None and lead.unit):
        return text
    outer, back = split.inputs[1:], views[1].inputs[1:]
    if len(outer) == 1 and isinstance(outer[0], Seq):
        outer = outer[0].items
    if len(back) == 1 and isinstance(back[0], Seq):
        back = back[0].items
    if len(back) != 3 or any(isinstance(s, Const) and s.value == -1 for s in back) and (shape is None or shape.rank != 3):
        raise TemplateError("a mask outside the scores' round trip of views has no sizes to be broadcast to")
    sizes = ", ".join(_size_text(s, render) for s in back)
    return f"{_atom(text)}.expand({sizes}){_split_text(split, render)}"


def _split_text(split: Node, render: Callable[[Operand], str]) -> str:
    """`.unflatten(0, (a, b))` of the split view `x.view(a, b, tgt, src)`."""
    sizes = split.inputs[1:]
    if len(sizes) == 1 and isinstance(sizes[0], Seq):
        sizes = sizes[0].items
    return f".unflatten(0, ({_size_text(sizes[0], render)}, {_size_text(sizes[1], render)}))"


def _folded(match: Match, key: str, text: str | None, render: Callable[[Operand], str]) -> str | None:
    """The mask bound as `key` in the kernel's layout: as it is, or, added through views that split
    the scores' leading axis (`attn.view(B_ // nW, nW, H, N, N) + m`, then `.view(-1, H, N, N)`),
    broadcast to the split axes and those flattened into the scores' leading one, a copy of at most
    the scores' size (`m.expand(B_ // nW, nW, -1, -1, -1).flatten(0, 1)`); added outside the round
    trip of 3-D `torch.bmm` scores, in the split's layout (`_unsplit`)."""
    fold = folded_mask(match, ShapeFacts(match.method, match.cls)) if text is not None else None
    if fold is None and text is not None:
        return _unsplit(match, key, text, render)
    if fold is None or fold[0] != key:
        return text
    if match.fold_into is not None:
        return match.fold_into  # assigned on its branch (`fold_statement`)
    _, a, b, kept = fold
    return f"{_atom(text)}.expand({render(a)}, {render(b)}{', -1' * kept}).flatten(0, 1)"


def fold_statement(match: Match, render: Callable[[Operand], str]) -> tuple[Node, str] | None:
    """Where a mask added through the scores' split views is set on one branch only (scope
    `_optional_fold`): the node that adds it, whose statement becomes the assignment of that mask,
    folded into the scores' layout, to the tested variable; and that statement's text."""
    if match.fold_into is None:
        return None
    fold = folded_mask(match, ShapeFacts(match.method, match.cls))
    if fold is None:
        raise TemplateError("the optional mask's round trip of views is no longer a fold")
    key, a, b, kept = fold
    text = _atom(render(match.bindings[key]))
    add = match.nodes["s2m" if key == "mask2" else "s2"]
    return add, f"{match.fold_into} = {text}.expand({render(a)}, {render(b)}{', -1' * kept}).flatten(0, 1)"


def _relaid(match: Match, base: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """`base` with each mask held in the layout of permuted scores moved to the kernel's (constraint
    `scores_permuted_back`)."""

    def lookup(name: str) -> str | None:
        text = base(name)
        moved = match.relayout.get(name)
        return _atom(text) + moved if text is not None and moved else text

    return lookup


def _negated(match: Match) -> bool:
    """Whether the scores' row maximum is subtracted from them the other way round (DANet's channel
    attention, `energy.max(-1, keepdim=True)[0].expand_as(energy) - energy`): the softmax is
    invariant to that per-row constant (constraint `row_max_over_key_axis`), so what it takes is the
    negated product, `-q @ k^T`, and the kernel gets the query negated."""
    sub = match.nodes.get("s0m")
    return sub is not None and sub.inputs[1] == match.bindings.get("s0p", match.bindings.get("s0"))


def sequence_axis(match: Match, name: str) -> tuple[Operand, int] | None:
    """The operand behind the kernel's `$q` or `$k` as the code holds it, and which of its axes is
    the kernel operand's axis -2 (the query's or the key's length); None where a lowering made
    that axis (or where a single query has none: the scores' axis before the key's is another)."""
    if name == "q" and _one_row(match, "s0"):
        return None
    operand = match.bindings.get(name)
    swap = name == "k" and _needs_key_swap(match) or name == "q" and match.relayout.get("q") == _SWAP
    low = _lowered(match, name, lambda o: "")
    if low is None:
        return (operand, -1 if swap else -2) if operand is not None else None
    _, origin, _, swapped = low
    base, nodes = _chain(match, operand)
    if base is None:
        return None
    position = -1 if swap != swapped else -2
    if not origin:
        return base, position
    source = origin[len(origin) + position]
    if source is None:
        return None
    # the operand's rank: the lowering's permute names every axis (a flattened run merged several)
    rank = len(_dims(nodes[0])) if nodes[0].op == ".permute" else sum(1 for o in origin if o is not None)
    return base, source - rank


def shared_axis(match: Match, position: int) -> tuple[Operand, int] | None:
    """The operand behind the kernel's `$q` as the code holds it, and which of its axes is the kernel
    query's axis `position` (< -2: a batch or head axis the scores share with the query); only where
    an einsum lowering made the kernel's query, whose permutation names each of its axes' origins."""
    if position >= -2 or _one_row(match, "s0") or match.relayout.get("q"):
        return None
    low = _lowered(match, "q", lambda o: "")
    if low is None:
        return None
    _, origin, new, _ = low
    base, nodes = _chain(match, match.bindings.get("q"))
    if base is None or not nodes or nodes[0].op != ".permute" or new or -position > len(origin):
        return None
    source = origin[len(origin) + position]
    return (base, source - len(_dims(nodes[0]))) if source is not None else None


def restated(match: Match, axes: tuple[str, ...], render: Callable[[Operand], str | None],
             method: str = "shape") -> str | None:
    """The text of a read of the scores' metadata (`axes`, see engine/match/scope.py `_restatement`)
    on the operands the rewrite keeps, or None where an operand has no plain name (its expression
    would be evaluated again). `method`: `shape` (`k.shape[-2]`) or `size` (`k.size(-2)`)."""
    if axes == ("shape",):
        # the 3-D scores of torch.bmm: the query's shape, its last axis the key's length
        query, key = sequence_axis(match, "q"), sequence_axis(match, "k")
        if query is None or key is None or query[1] != -2:
            return None
        q, k = render(query[0]), render(key[0])
        if q is None or k is None or not all(re.fullmatch(r"[A-Za-z_][\w.]*", text) for text in (q, k)):
            return None
        last = f"{key[1]}:{key[1] + 1}" if key[1] != -1 else "-1:"
        return f"{q}.{method}()[:-1] + {k}.{method}()[{last}]" if method == "size" else \
            f"{q}.shape[:-1] + {k}.shape[{last}]"
    texts = []
    for axis in axes:
        found = shared_axis(match, int(axis[4:])) if axis.startswith("axis") else \
            sequence_axis(match, "k" if axis == "key" else "q")
        if found is None:
            return None
        operand, position = found
        text = render(operand)
        if text is None or not re.fullmatch(r"[A-Za-z_][\w.]*", text):
            return None
        if axis in ("device", "dtype"):
            texts.append(f"{text}.{axis}")
        else:
            texts.append(f"{text}.size({position})" if method == "size" else f"{text}.shape[{position}]")
    return ", ".join(texts)


def _conditional(match: Match, name: str, text: str | None) -> str | None:
    """A score factor the code applies only on one branch of an `if` (`if self.scale_attn_weights:
    w = w / sqrt(d)`), as the factor there and 1.0 elsewhere."""
    if text is None or name not in match.conditional:
        return text
    cond, taken = match.conditional[name]
    yes, no = (text, "1.0") if taken else ("1.0", text)
    return f"({yes} if {cond} else {no})"


def _conditional_dropout(match: Match, name: str, text: str | None) -> str | None:
    """The kernel's dropout where the code drops out only on one branch of an `if` (`if
    self.use_dropout: a = self.dropout(a)`): the module's training flag holds only there
    (`$dtraining`), or, for a dropout that always drops, the probability is 0.0 elsewhere."""
    cond, taken = match.conditional["dp"]
    when = _atom(cond) if taken else f"not {_atom(cond)}"
    if text is None:
        return None
    if name == "dtraining":
        return f"{when} and {_atom(text)}"
    return text if "dtraining" in match.bindings else f"({text} if {when} else 0.0)"


_CASTS = {".to", ".float", ".double", ".half", ".bfloat16", ".type"}


def _upcast(match: Match) -> bool:
    """The query is a cast of the code's own (`query = query.to(torch.float32)`) and the value is not
    cast the same way."""
    q, v = (_producer(match, match.bindings.get(n)) for n in ("q", "v"))
    if q is None or q.op not in _CASTS:
        return False
    return v is None or v.op != q.op or v.inputs[1:] != q.inputs[1:] or v.kwargs != q.kwargs


def upcast_result(match: Match, code: str, value_of: Callable[[], str | None]) -> str:
    """The kernel's result back in the value's dtype where `$v` was cast up for it (`value_of`
    renders `$v`; only called then, since rendering a helper's operand at its call emits locals)."""
    if not _upcast(match):
        return code
    value = value_of()
    if value is None:
        return code
    return f"{_atom(code)}.to({_atom(value)}.dtype)"


def plus_term(match: Match, code: str, base: Callable[[str], str | None]) -> str:
    """The kernel's result plus the term the code added to the probabilities times the value,
    `(p + B) @ v == p @ v + B @ v` (constraint `probabilities_plus_term`; `base`: the bindings as the
    code wrote them). `B @ v` needs B's last axis to be the key axis; where it may be a broadcast
    size 1, B is expanded to the value's length there first, which contracts the same sum."""
    if "pb" not in match.nodes:
        return code
    term, value = base("pbias"), base("v")
    if term is None or value is None:
        raise TemplateError("the term added to the probabilities, or the value, has no text")
    facts, scores = ShapeFacts(match.method, match.cls), match.nodes["s0"]
    shape = facts.shape(match.bindings["pbias"])
    keys = facts.shape(Var(scores.outputs[0])) if scores.outputs else None
    if not (shape and keys and shape.axes and keys.axes and shape.axes[-1].id == keys.axes[-1].id):
        term = f"{_atom(term)}.expand(*{_atom(term)}.shape[:-1], {_atom(value)}.shape[-2])"
    return f"{code} + {_atom(term)} @ {_atom(value)}"


def _product_rank(match: Match, facts: ShapeFacts, node: Node | None) -> int | None:
    """The proven rank of a matrix product's result: 3 for `torch.bmm` and `torch.baddbmm` (they take
    nothing else), else what the shape facts prove."""
    if node is None or not node.outputs:
        return None
    if node.target in ("torch.bmm", "torch.baddbmm"):
        return 3
    return facts.rank(Var(node.outputs[0]))


_MASKS = ("mask", "mask2", "mask3", "fmask", "keep")


def _kernel_rank(match: Match) -> tuple[int | None, ShapeFacts]:
    """The rank of the kernel's operands where both products prove it (the scores and the output
    alike), else None."""
    facts = ShapeFacts(match.method, match.cls)
    scores, output = (_product_rank(match, facts, match.nodes.get(key)) for key in ("s0", "out"))
    return (scores if scores == output else None), facts


def _flattens(match: Match, facts: ShapeFacts) -> bool:
    """The two leading axes of 5-D operands flatten into one batch axis with the same meaning: the
    query, key and value are proven 5-D and share those two axes (one identity each, so equal
    sizes without broadcasting), and the mask is proven of rank 3 or less (it broadcasts against
    the trailing axes only). The operands must be the bindings as they are (no einsum lowering nor
    folded factor, whose adapted text could carry other axes)."""
    if any(name in match.bindings for name in ("temp", "tdiv")) \
            or any(_chain(match, match.bindings.get(name))[1] for name in ("q", "k", "v")):
        return False
    shapes = [facts.shape(match.bindings.get(name)) for name in ("q", "k", "v")]
    if any(s is None or s.rank != 5 for s in shapes):
        return False
    if len({s.axes[0].id for s in shapes}) != 1 or len({s.axes[1].id for s in shapes}) != 1:  # type: ignore[union-attr]
        return False
    rank = _mask_rank(match, facts)
    return rank is not None and rank <= 3


def _bound_masks(match: Match) -> list[str]:
    return [name for name in _MASKS if name in match.bindings]


def _mask_rank(match: Match, facts: ShapeFacts) -> int | None:
    """The proven rank of the kernel's mask: the largest of the masks it is built from (each form the
    template writes broadcasts them, `.all(-1, keepdim=True)` keeping the rank), 0 where none is
    bound; None where one's rank is unproven."""
    ranks = [facts.rank(match.bindings[name]) for name in _bound_masks(match)]
    return None if None in ranks else max(ranks, default=0)  # type: ignore[type-var]


def _offset(code: str, line: int, col: int) -> int:
    """The character offset of an ast position (1-based line, UTF-8 byte column) in `code`."""
    lines = code.splitlines(keepends=True)
    before = sum(len(text) for text in lines[:line - 1])
    text = lines[line - 1] if line - 1 < len(lines) else ""
    return before + len(text.encode("utf-8")[:col].decode("utf-8", "replace"))


def _kernel_call(code: str, kernel: str) -> ast.Call | None:
    """The outermost call of the kernel (by its last name) in `code`, when it has three positional
    operands."""
    try:
        tree = ast.parse(code, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    name = kernel.partition("(")[0].rpartition(".")[2]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and len(node.args) >= 3 and not any(isinstance(a, ast.Starred) for a in node.args[:3]):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if called == name:
                return node
    return None


def _size_text(size: Operand, render: Callable[[Operand], str] | None = None) -> str:
    """A view's size operand as the code wrote it (a name, an attribute, a number, an expression)."""
    if isinstance(size, Const):
        return repr(size.value)
    if isinstance(size, Var) and render is not None:
        return render(size)
    if isinstance(size, Var):
        return size.name.split(".", 1)[0]
    text = getattr(size, "text", str(size))
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def _four_d(match: Match, code: str) -> str:
    """The kernel call in `code` given 4-D operands where its products are proven 3-D or flattenable
    5-D, and its result viewed back (see the module's docstring); else `code` as it is."""
    rank, facts = _kernel_rank(match)
    if rank not in (2, 3, 5) or not match.rule.kernel or _one_row(match, "out"):
        # (a single query's products lack the query axis: their ranks are not the kernel's, and
        # its one-row scores are no matrix the fused kernels would save)
        return code
    call = _kernel_call(code, match.rule.kernel)
    if call is None or call.end_lineno is None or call.end_col_offset is None:
        return code
    spans = [(_offset(code, a.lineno, a.col_offset), _offset(code, a.end_lineno or a.lineno, a.end_col_offset or 0))
             for a in call.args[:3]]
    operands = [code[start:end] for start, end in spans]
    split = bmm_split(match)
    if rank == 3 and split is not None:
        # the mask was added to (or the fill made in) the scores viewed (bsz, heads, tgt, src): the
        # operands are viewed the same way (`lookup`), and so is all the template computes from the
        # kernel's result (the rows a fill masks whole); it is flattened back after that
        return _atom(code) + ".flatten(0, 1)"
    if rank == 3:
        into, back = ".unsqueeze(0)", ".squeeze(0)"
    elif rank == 2:
        # (query, feature) operands gain a batch and a head axis of 1; a mask broadcasts as before
        # (the kernel takes 2-D masks, and a 2-D output admits no mask of higher rank)
        into, back = "[None, None]", "[0, 0]"
    else:
        named = next((text for text in operands if re.fullmatch(r"[A-Za-z_][\w.]*", text)), None)
        if named is None or not _flattens(match, facts):
            return code
        into, back = ".flatten(0, 1)", f".unflatten(0, {named}.shape[:2])"
    views = [(span, _atom(text) + into) for span, text in zip(spans, operands, strict=True)]
    mask = next((k.value for k in call.keywords if k.arg == "attn_mask"), None)
    if mask is not None and split is None and _mask_rank(match, facts) == 3 and not match.optional & set(_bound_masks(match)):
        # the fused kernels take a 2-D or 4-D mask: a 3-D one gains the leading axis of 1 too
        span = (_offset(code, mask.lineno, mask.col_offset), _offset(code, mask.end_lineno or mask.lineno,
                                                                       mask.end_col_offset or 0))
        views.append((span, _atom(code[span[0]:span[1]]) + ".unsqueeze(0)"))
    end = _offset(code, call.end_lineno, call.end_col_offset)
    out = code[:end] + back + code[end:]
    for (start, stop), text in sorted(views, reverse=True):
        out = out[:start] + text + out[stop:]
    return out


def _sizes_text(match: Match, node, render: Callable[[Operand], str] | None) -> str | None:
    """The sizes an einsum lowering's `.unflatten` reads from its operand's shape, as text: a slice
    where they are consecutive axes (`v.shape[3:]`), else a tuple of them. None where the operand has
    no plain name (its expression, a layer call say, would be evaluated again)."""
    sizes = node.inputs[2].items if len(node.inputs) > 2 and isinstance(node.inputs[2], Seq) else ()
    reads = [_producer(match, size) for size in sizes]
    if render is None or not reads or any(r is None or r.op != ".size" or len(r.inputs) != 2 for r in reads):
        return None
    if len({r.inputs[0] for r in reads}) != 1:
        return None
    dims = [d.value for r in reads for d in r.inputs[1:] if isinstance(d, Const)]
    operand = render(reads[0].inputs[0])
    if not re.fullmatch(r"[A-Za-z_][\w.]*", operand or ""):
        return None
    if dims == list(range(dims[0], dims[0] + len(dims))):
        end = "" if dims[-1] == _operand_rank(match, reads[0].inputs[0]) - 1 else str(dims[-1] + 1)
        return f"{operand}.shape[{dims[0]}:{end}]"
    return "(" + ", ".join(f"{operand}.shape[{d}]" for d in dims) + ")"


def _operand_rank(match: Match, operand: Operand) -> int:
    rank = ShapeFacts(match.method, match.cls).rank(operand)
    return -1 if rank is None else rank


def result(match: Match, code: str, render: Callable[[Operand], str] | None = None) -> str:
    """The kernel's result in the code's layout: given 4-D operands and viewed back where it was
    3-D or 5-D, transposed back where the output was read so, and its trailing axes unflattened and
    permuted as an einsum's output was (`render`: an operand's text, for the sizes unflattened)."""
    code = _four_d(match, code)
    if "pt" in match.nodes:
        code = f"({code}){_SWAP}"
    if _one_row(match, "out"):
        code = _atom(code) + ".squeeze(-2)"
    root = match.root
    if root.outputs:
        value = Var(root.outputs[0])
        after = next((n for n in match.method.nodes if n.op == ".unflatten" and _generated(n) and n.inputs
                      and n.inputs[0] == value), None)
        if after is not None:
            sizes = _sizes_text(match, after, render)
            if sizes is None:
                raise TemplateError("the sizes of the einsum's value axes have no text (the value has no plain name)")
            code = _atom(code) + f".unflatten(-1, {sizes})"
            value = Var(after.outputs[0])
        after = next((n for n in match.method.nodes if n.op == ".permute" and _generated(n) and n.inputs
                      and n.inputs[0] == value), None)
        if after is not None:
            code = _atom(code) + _permute_text(_dims(after))
    return code
