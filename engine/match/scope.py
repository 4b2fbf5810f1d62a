"""Scope analysis: from raw matches to findings (rewritable, guarded, or near-miss with a reason)."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable

from engine.analysis.numbers import tree_of
from engine.analysis.shapes import CASTS
from engine.dsl.ir import HELPER_CONDITION, Cond, Const, FileModel, Node, Pos, Seq, Sym, Var
from engine.match import constraints
from engine.match import matcher as _matcher
from engine.match.matcher import (
    FileIndexes,
    Finding,
    Match,
    MethodIndex,
    constant_truth,
    match_method,
)
from engine.match.rewritten_form import in_rewritten_form
from engine.match.rule import Rule


def _atom(text: str) -> str:
    """A condition's text, parenthesized unless it is one simple term."""
    simple = " or " not in text and " and " not in text and " if " not in text and not text.startswith("lambda")
    return text if simple else f"({text})"


def _literal_text(text: str, taken: bool) -> str:
    if taken:
        return _atom(text)
    if text.startswith("not ") and _atom(text[4:]) == text[4:]:
        return text[4:]  # not (not x) is x
    subject, _, rest = text.partition(" is not ")
    if rest == "None" and _atom(subject) == subject and " is " not in subject:
        return f"{subject} is None"  # not (x is not None) is x is None
    return f"not {text}" if text.replace("_", "").replace(".", "").isalnum() else f"not ({text})"


def _simplify(terms: list[frozenset]) -> list[frozenset]:
    """Simplify a disjunction of conjunctions of (condition text, truth) literals: merge terms that
    differ in one literal's truth only (X and A or not X and A == A), drop absorbed terms
    (A or A and B == A) and a literal whose negation is a term (X or not X and B == X or B). A literal of constants only is decided: a false one drops its term, a true
    one leaves it."""
    decided = []
    for term in terms:
        truths = {(text, taken): constant_truth(text) for text, taken in term}
        if any(t is not None and t != taken for (_, taken), t in truths.items()):
            continue
        decided.append(frozenset(lit for lit, t in truths.items() if t is None))
    if not decided and terms:
        return []
    current = set(decided)
    changed = True
    while changed:
        changed = False
        for a in list(current):
            for b in list(current):
                if a is b or a not in current or b not in current:
                    continue
                diff = a ^ b
                if len(diff) == 2 and len({text for text, _ in diff}) == 1:
                    current -= {a, b}
                    current.add(a & b)
                    changed = True
        for a in list(current):
            if any(b < a for b in current):
                current.discard(a)
                changed = True
        for b in [t for t in current if len(t) == 1]:
            (text, taken), = b
            for a in [t for t in current if (text, not taken) in t]:
                current.discard(a)
                current.add(a - {(text, not taken)})
                changed = True
    return sorted(current, key=lambda t: (len(t), sorted(t)))


def _render_dnf(terms: list[frozenset]) -> str:
    parts = []
    for term in terms:
        literals = [_literal_text(text, taken) for text, taken in sorted(term)]
        if not literals:
            return "True"
        parts.append(" and ".join(literals))
    if len(parts) == 1:
        return parts[0]
    return " or ".join(f"({p})" if " and " in p else p for p in parts)


def _transitive_uses(ix: MethodIndex, name: str) -> list[tuple[Node, dict[int, bool]]]:
    """Nodes that read `name`, looking through plain assignments and phi merges. Flowing through a
    phi from one branch implies that branch's decision: each use comes with those decisions."""
    out: list[tuple[Node, dict[int, bool]]] = []
    todo: list[tuple[str, dict[int, bool]]] = [(name, {})]
    seen = {name}
    while todo:
        current, implied = todo.pop()
        for use in ix.uses.get(current, ()):
            if use.kind == "phi":
                positions = [i for i, v in enumerate(use.inputs) if isinstance(v, Var) and v.name == current]
                if not positions:
                    continue  # the phi only reads it as its branch test
                cid = use.kwarg("if")
                more = dict(implied)
                if isinstance(cid, Const) and len(use.inputs) == 2 and len(positions) == 1:
                    more[cid.value] = positions[0] == 0  # type: ignore[index]
                elif cid is None and len(positions) == 1 and current in ix.defs:
                    # a merge of an inlined helper's returns (`if ret_attn: return out, attn`): the
                    # value is taken where its own return ran, under that return's decisions
                    more.update({c.id: c.taken for c in ix.defs[current].guard})
                for out_name in use.outputs:
                    if out_name not in seen:
                        seen.add(out_name)
                        todo.append((out_name, more))
                continue
            if use.kind == "op" and use.op == "assign" and len(use.inputs) == 1:
                for out_name in use.outputs:
                    if out_name not in seen:
                        seen.add(out_name)
                        todo.append((out_name, implied))
                continue
            out.append((use, implied))
    return out


_METADATA_ATTRS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout"}


def _reads_metadata_only(node: Node) -> bool:
    if node.op in (".size", ".dim", ".numel", "len", ".get_device"):
        return True
    return node.op == "getattr" and len(node.inputs) == 2 and isinstance(node.inputs[1], Const) \
        and node.inputs[1].value in _METADATA_ATTRS


def _inside(inner: Pos | None, outer: Pos | None) -> bool:
    return inner is not None and outer is not None and inner.file == outer.file \
        and (inner.line, inner.col) >= (outer.line, outer.col) \
        and (inner.end_line, inner.end_col) <= (outer.end_line, outer.end_col)


_DTYPE_TAKERS = {"torch.finfo", "torch.iinfo"}  # calls whose first argument is a dtype, not a tensor


def _only_feeds_dropped_argument(use: Node, match: Match, ix: MethodIndex,
                                 kept: list[dict[int, bool]] | None = None) -> list[Node] | None:
    """A metadata read of an intermediate (its dtype, shape, device: not its values) whose only
    purpose is an argument of a matched call that the rewrite drops: `s.masked_fill(m,
    -torch.finfo(s.dtype).max)`, `p.type(s.dtype)`, or the same value computed in a statement of its
    own (`mask_value = -torch.finfo(s.dtype).max`, then `s.masked_fill(m, mask_value)`). The rewrite
    replaces the call, so the read goes with it. Returns the nodes of that computation that lie
    outside every matched statement (synthesis removes their statements too), or None when the read
    reaches anything else: another use of the value, the call's tensor itself, an argument the
    rewrite keeps, a merge of branches. A cast is such a computation too: fairseq's
    `w = w_float.type_as(w)`, whose result only names the dtype of the dropped cast
    `w_float.type_as(w)` before dropout, computes nothing the kernel path reads.
    With `kept`, the computation may also reach code on a path the match does not take (imagen-video's
    `max_neg_value` filling the scores under `if self.causal:` too, where the match is the padding
    fill's): that code runs only where the original is kept under a guard, which holds the read as
    written; the decisions of each such path are appended to `kept` (the guard's terms)."""
    if not (_reads_metadata_only(use) or use.kind == "op" and use.op in CASTS):
        return None
    rewrite = match.rule.rewrite or ""
    matched = {id(n): n for n in match.nodes.values()}
    frontier, slice_nodes, seen = [use], [], {id(use)}
    chosen: set[int] = set()  # merges of a helper's returns that a test in the slice chooses between
    while frontier:
        node = frontier.pop()
        slice_nodes.append(node)
        merge = _helper_choice(node, ix)
        if merge is not None:
            # the test of a helper's branch (`if dtype is torch.float16: return -65504`): it decides
            # which value the call returns, so it reaches what the call's result reaches
            chosen.add(id(merge))
            if id(merge) not in seen:
                seen.add(id(merge))
                frontier.append(merge)
            continue
        if id(node) in chosen:
            pass  # that merge: the call's result
        elif node.kind != "op" or not node.outputs or not any(ix.uses.get(name) for name in node.outputs):
            return None  # a value leaving the method, or one computed for nothing (kept as written)
        for name in node.outputs:
            for user in ix.uses.get(name, ()):
                if id(user) in matched:
                    if user is match.root:
                        return None
                    if user.op not in _DTYPE_TAKERS and any(isinstance(i, Var) and i.name == name
                                                            for i in user.inputs[:1]):
                        return None  # the call's tensor itself
                    bound = [v for v, b in match.bindings.items() if isinstance(b, Var) and b.name == name]
                    if not bound or any(_in_template(v, rewrite) for v in bound):
                        return None  # an argument the rewrite keeps
                    continue
                if id(user) in seen:
                    continue
                seen.add(id(user))
                if kept is not None and (off := _off_path(user, match, ix)) is not None:
                    if off:
                        kept.append(off)
                    continue
                if len(seen) > 8:
                    return None
                frontier.append(user)
    # a helper called for the value (`mask_value = max_neg_value(s)`, returning `-torch.finfo(t.dtype).max`)
    # goes with its call only when all it computes is that value
    depth = len(match.root.via)
    sites = {n.via[:depth + 1] for n in slice_nodes if len(n.via) > depth}
    computed = {id(n) for n in slice_nodes} | matched.keys()
    if any(n.via[:depth + 1] == site and id(n) not in computed for site in sites for n in ix.method.nodes):
        return None
    holders = [n.pos for n in match.nodes.values() if n.pos is not None]
    return [n for n in slice_nodes if not any(_inside(n.pos, h) for h in holders)]


def _off_path(node: Node, match: Match, ix: MethodIndex) -> dict[int, bool] | None:
    """The decisions under which `node` runs where it runs only on paths the match does not take
    (one of its branch decisions is the other way round from the match's); empty where it runs on
    no possible path at all, None where it may run on the match's path."""
    needed = {c.id: c.taken for c in node.guard}
    if not any(match.conditions.get(cid, taken) != taken for cid, taken in needed.items()):
        return None
    return needed if ix.possible(needed.items()) else {}


def _helper_choice(node: Node, ix: MethodIndex) -> Node | None:
    """The merge of an inlined helper's returns that `node` chooses between, where `node` is a
    comparison in that helper whose value nothing else reads (the test of its `if`, which the
    extraction keeps as the condition of the returns): each return is assigned at the helper's call,
    and the merge of those assignments is the call's result. None otherwise."""
    if node.kind != "op" or not node.op.startswith("compare:") or not node.via or len(node.outputs) != 1 \
            or ix.uses.get(node.outputs[0]):
        return None
    call = node.via[-1]
    for merge in ix.method.nodes:
        if merge.kind != "phi" or merge.kwarg("if") is not None or merge.via != node.via[:-1] or not merge.inputs:
            continue
        arms = [ix.defs.get(v.name) if isinstance(v, Var) else None for v in merge.inputs]
        if all(a is not None and a.op == "assign" and a.pos == call for a in arms):
            return merge
    return None


# ops that give a value shaped like their (first, or any broadcast) tensor operand: the scores stay
# (..., query, key) through them
_SHAPE_KEEPING = {"scale", "mul", "div", "add", "sub", "masked_fill", ".masked_fill", ".float", ".to", ".type_as",
                  ".type", ".half", ".bfloat16", "softmax", "dropout", "torch.where", ".contiguous", ".clone"}


def _score_shaped(match: Match, ix: MethodIndex, whole: bool = False, start: str = "s0") -> set[str]:
    """The names of matched values shaped like the attention scores (..., query, key): the product
    of `$q` and `$k` (`s0`) and what the match computes from it elementwise (scaled, masked,
    normalized, dropped out). A skipped optional step stands for its first input. `start`: "s0p" for
    the values shaped like the scores permuted after their product (an einsum's output order). With `whole`, the
    values of the product's very shape: an addition counts only in place (`w += attn_mask`, which
    cannot broadcast to a larger shape), and the view that merges a round trip of views back
    (constraint `mask_view_round_trip`) gives that shape again."""
    pattern = match.pattern
    if pattern is None or start not in match.nodes or not {"q", "k"} <= match.bindings.keys():
        return set()
    keys = {start}
    views = constraints.round_trip(match) if whole else None
    merge = next((key for key, node in match.nodes.items() if node is views[1]), None) \
        if views is not None and views[0] is not None and not constraints.CHECKS["mask_view_round_trip"](match, ix) \
        else None
    split = next((key for key, node in match.nodes.items() if node is views[0]), None) if merge is not None else None
    between: set[str] = set()  # computed from the split view, before the merge
    for stmt in pattern.stmts[:-1]:
        if stmt.out is None or stmt.out == start or not stmt.data_args:
            continue
        if stmt.out == split:
            between.add(stmt.out)
        elif stmt.out in match.skipped:
            if stmt.data_args[0] in keys:
                keys.add(stmt.out)
            elif stmt.data_args[0] in between:
                between.add(stmt.out)
        elif stmt.out == merge and stmt.data_args[0] in between:
            keys.add(stmt.out)
        elif stmt.out in match.nodes and {op.name for op in stmt.all_ops} <= _SHAPE_KEEPING \
                and any(arg in keys for arg in stmt.data_args) \
                and not (whole and "add" in {op.name for op in stmt.all_ops} and not _in_place(match.nodes[stmt.out], ix)):
            keys.add(stmt.out)
        elif stmt.out in match.nodes and any(arg in between for arg in stmt.data_args):
            between.add(stmt.out)
    return {match.nodes[key].outputs[0] for key in keys if key in match.nodes and match.nodes[key].outputs}


def _permuted_scores(match: Match, ix: MethodIndex) -> tuple[set[str], tuple[int, ...]] | None:
    """The values shaped like the scores permuted after their product (`$s0p`, every axis named by a
    constant permutation) and that permutation (axis `c` of them is the product's axis `perm[c]`)."""
    there = match.nodes.get("s0p")
    if there is None or there.op not in (".permute", "torch.permute") or there.kwargs:
        return None
    dims = there.inputs[1:]
    if len(dims) == 1 and isinstance(dims[0], Seq):
        dims = dims[0].items
    if not dims or not all(isinstance(d, Const) and type(d.value) is int for d in dims):
        return None
    n = len(dims)
    perm = tuple(d.value % n for d in dims)  # type: ignore[union-attr, operator]
    if sorted(perm) != list(range(n)):
        return None
    return _score_shaped(match, ix, start="s0p"), perm


def _whole_scores(match: Match, ix: MethodIndex) -> set[str]:
    """The values of the 3-D product of `torch.bmm`'s very shape (`_score_shaped`), where both
    products are `torch.bmm`; else none."""
    if not all((p := match.nodes.get(k)) is not None and p.target in constraints._BATCHED_3D for k in ("s0", "out")):
        return set()
    return _score_shaped(match, ix, whole=True)


def _in_place(node: Node, ix: MethodIndex) -> bool:
    """`node` is an augmented assignment's operation (`w += m`: in place, the target's shape kept)."""
    tree = tree_of(ix.file.path) if node.pos is not None and not node.via else None
    return tree is not None and any(isinstance(s, ast.AugAssign) and (s.lineno, s.col_offset) == (node.pos.line, node.pos.col)
                                    and (s.end_lineno, s.end_col_offset) == (node.pos.end_line, node.pos.end_col)
                                    for s in ast.walk(tree))


# Ops whose result has their first operand's shape and device whatever the others are: a fill's mask
# broadcasts to the tensor it fills, never the reverse (an addition may broadcast to a larger shape,
# `.to` may move to another device: neither is here)
_KEEPS_SHAPE_AND_DEVICE = {"masked_fill", ".masked_fill", "softmax", "dropout", ".float", ".half", ".bfloat16",
                           ".contiguous", ".clone"}


# of those, the ops that keep the dtype too
_KEEPS_DTYPE = {"masked_fill", ".masked_fill", "dropout", ".contiguous", ".clone"}


def _of_scores(operand, scores: set[str], ix: MethodIndex, depth: int = 0,
               keeps: set[str] = _KEEPS_SHAPE_AND_DEVICE) -> bool:
    """`operand` holds score-shaped values on every path: one of `scores`, a merge of such, or one
    made from such by an op that keeps its input's shape and device (a fill outside the match: the
    optional `if exists(mask): dots.masked_fill_(~mask, v)` before a causal mask reads `dots.shape`)."""
    if not isinstance(operand, Var) or depth > 8:
        return False
    if operand.name in scores:
        return True
    node = ix.defs.get(operand.name)
    if node is None or not node.inputs:
        return False
    if node.kind == "op" and (node.op in keeps or node.op == "assign" and len(node.inputs) == 1
                              or node.op == "scale" and len(node.inputs) == 2 and isinstance(node.inputs[1], Const)):
        return _of_scores(node.inputs[0], scores, ix, depth + 1, keeps)
    if node.kind != "phi":
        return False
    merged = [v for v in node.inputs if isinstance(v, Var)]
    return bool(merged) and all(_of_scores(v, scores, ix, depth + 1, keeps) for v in merged)


def _here(node: Node, file: str) -> Pos:
    """Where `node` is in the file `file`: its own position, or else the last call it was inlined
    through that is in the file."""
    assert node.pos is not None
    if node.pos.file == file:
        return node.pos
    return next((p for p in reversed(node.via) if p.file == file), node.via[0] if node.via else node.pos)


def _axes(index: object) -> tuple[str, ...] | None:
    """Which of the scores' axes an index of their shape reads: the last is the key's, the one
    before it the query's (`-2:` both)."""
    if isinstance(index, Const):
        return {-1: ("key",), -2: ("query",)}.get(index.value) if type(index.value) is int else None  # type: ignore[call-overload]
    if isinstance(index, Sym) and index.text.replace(" ", "") == "-2:":
        return ("query", "key")
    return None


def _restatement(use: Node, scores: set[str], ix: MethodIndex, dtyped: set[str] | frozenset[str] = frozenset(),
                 whole: Callable[[], set[str]] = set,
                 permuted: Callable[[], tuple[set[str], tuple[int, ...]] | None] = lambda: None,
                 ) -> tuple[Node, tuple[str, ...]] | None:
    """A read of the scores' metadata that the query and the key state as well, and the node whose
    expression becomes that statement: `s.device` (the query's device), `s.shape[-1]` /
    `s.size(-1)` (the key's length), `s.shape[-2]` (the query's), `s.shape[-2:]` (both), and
    `s.dtype` (the query's) where `s` is one of `dtyped`, the product and its scalings by a number
    (`matmul` takes operands of one dtype and gives that dtype; a fill keeps it too, a cast does
    not). The rewrite removes the scores; such a read is then written on `$q` and `$k` (synthesis).
    A read of the whole shape (`w.size()`, `w.shape`) of values of the product's very shape (`whole`:
    the 3-D scores of `torch.bmm`, whose shape is the query's but its last axis, then the key's
    length) is restated as that (WavLM's `position_bias.view(attn_weights.size())`). A read of an axis
    of the scores permuted after their product (`permuted`: those values and the permutation, labml's
    `scores.shape[-1]` of einsum 'ibhd,jbhd->ijbh' scores, the heads) is the read of the kernel's
    scores' axis it is: the key's or the query's length, or an axis they share with the query
    (`axis-3`, the kernel query's axis -3)."""
    if use.kind != "op" or not use.inputs or use.pos is None:
        return None
    if use.op == "getattr" and use.inputs[1:] == (Const("shape"),) and len(use.outputs) == 1 \
            and (found := permuted()) is not None and _of_scores(use.inputs[0], found[0], ix):
        users = ix.uses.get(use.outputs[0], [])
        index = users[0].inputs[1] if len(users) == 1 and users[0].op == "getitem" and len(users[0].inputs) == 2 \
            else None
        perm, n = found[1], len(found[1])
        if index is None or users[0].pos is None or not isinstance(index, Const) or type(index.value) is not int \
                or not -n <= index.value < n:  # type: ignore[operator]
            return None
        kernel = perm[index.value % n] - n  # type: ignore[operator]
        return users[0], ("key",) if kernel == -1 else ("query",) if kernel == -2 else (f"axis{kernel}",)
    if use.op == "getattr" and not use.via and use.inputs[1:] == (Const("dtype"),) and isinstance(use.inputs[0], Var) \
            and _of_scores(use.inputs[0], dtyped, ix, keeps=_KEEPS_DTYPE):
        # only for a dtype's limits (`torch.finfo(s.dtype).min`, a fill value); a test of the dtype
        # choosing a branch (`if s.dtype == torch.float16:`) decides more than a name
        users = [u for out in use.outputs for u in ix.uses.get(out, [])]
        if users and all(u.kind != "phi" and u.op in ("torch.finfo", "torch.iinfo") for u in users):
            return use, ("dtype",)
        return None
    if (use.op == ".size" and len(use.inputs) == 1 or use.op == "getattr" and use.inputs[1:] == (Const("shape"),)
            and not any(u.op == "getitem" for out in use.outputs for u in ix.uses.get(out, []))) \
            and not use.kwargs and _of_scores(use.inputs[0], whole(), ix):
        return use, ("shape",)
    if not _of_scores(use.inputs[0], scores, ix):
        return None
    if use.op == ".size" and len(use.inputs) == 2 and not use.kwargs:
        axes = _axes(use.inputs[1])
        return (use, axes) if axes else None
    if use.op != "getattr" or len(use.inputs) != 2 or not isinstance(use.inputs[1], Const):
        return None
    if use.inputs[1].value == "device":
        return use, ("device",)
    if use.inputs[1].value != "shape" or len(use.outputs) != 1:
        return None
    users = ix.uses.get(use.outputs[0], [])
    if len(users) != 1 or users[0].op != "getitem" or len(users[0].inputs) != 2 or users[0].pos is None:
        return None
    axes = _axes(users[0].inputs[1])
    return (users[0], axes) if axes else None


def _product_dtyped(match: Match) -> set[str]:
    """The product of `$q` and `$k` and its scalings by a number: values of the product's dtype."""
    names = set()
    for key in ("s0", "s1", "s1b"):
        node = match.nodes.get(key)
        if node is None:
            continue
        if key != "s0" and not (node.op == "scale" and isinstance(node.inputs[1], Const)
                                and isinstance(node.inputs[0], Var) and node.inputs[0].name in names):
            break
        names.add(node.outputs[0])
    return names


def _helper_argument(use: Node, match: Match, ix: MethodIndex) -> tuple[Node, tuple[str, ...]] | None:
    """A read of the product's dtype or device in a helper the function calls with it, where the
    helper computes its result from that read alone (dalle's `max_neg_value(dots)`, returning
    `-torch.finfo(t.dtype).max`): the call can take the query instead, which has both (`matmul`
    takes operands of one dtype and gives that dtype). Synthesis writes the query's name at the call."""
    if match.root.via or len(use.via) != 1 or not _reads_metadata_only(use) or use.op != "getattr" \
            or use.inputs[1] not in (Const("dtype"), Const("device")) or not isinstance(use.inputs[0], Var):
        return None
    name = use.inputs[0].name
    if name not in _product_dtyped(match) or "q" not in match.bindings:
        return None
    # the helper computes its result from that read alone and does nothing else (so a call whose
    # result nothing reads can go)
    helper = [n for n in ix.method.nodes if n.via[:1] == use.via]
    made = {out for n in helper for out in n.outputs}
    for node in helper:
        if node.kind != "op" or not node.outputs or not all(ix.uses.get(out) for out in node.outputs):
            return None
        if node is not use and not all(isinstance(v, Const) or isinstance(v, Var) and v.name in made
                                       for v in (*node.inputs, *(v for _, v in node.kwargs))):
            return None
    return use, ("argument",)


def _shape_check(use: Node, ix: MethodIndex):
    """The position of an `if` test that only validates a shape and raises, if `use` is such a read."""
    if not _reads_metadata_only(use) or use.pos is None:
        return None
    frontier = list(use.outputs)
    test_nodes = [use]
    while frontier:
        name = frontier.pop()
        for user in ix.uses.get(name, ()):
            if user.kind == "op" and (user.op.startswith("compare:") or user.op in ("getitem", "list", "tuple", "not",
                                                                                  "or", "and")):
                test_nodes.append(user)
                frontier.extend(user.outputs)
            else:
                return None
    final = test_nodes[-1]
    # the value only feeds a comparison that nothing reads as data: an `if` test. Synthesis checks
    # that it is `if <test>: raise ...` and refuses the rewrite otherwise.
    return final.pos


_GIVEN_ROLES = re.compile(r"(f?mask|keep)\d*")  # bindings of the masks and biases the kernel is handed


def _validates_given(use: Node, match: Match, ix: MethodIndex) -> bool:
    """The shape check that `use` feeds (`_shape_check`) also reads the shape of a mask or bias the
    kernel is handed as it is (`assert attn_bias.shape[-1] == sim.shape[-1]`): it validates that
    operand, and the kernel broadcasts a mask where the code asserted equal sizes (a bias with one
    key column passes the kernel silently), so the check is not moot: it stays, the scores' shape
    read restated on the key (local-attention's cached decoding step)."""
    given = {v.name for key, v in match.bindings.items() if isinstance(v, Var) and _GIVEN_ROLES.fullmatch(key)}
    if not given:
        return False
    chain, frontier = {id(use)}, list(use.outputs)
    compares = []
    while frontier:
        for user in ix.uses.get(frontier.pop(), ()):
            if id(user) not in chain:
                chain.add(id(user))
                compares.append(user)
                frontier.extend(user.outputs)
    pending = [v for node in compares for v in node.inputs if isinstance(v, Var)]
    seen: set[str] = set()
    while pending and len(seen) < 50:
        name = pending.pop().name
        if name in seen:
            continue
        seen.add(name)
        node = ix.defs.get(name)
        if node is None or id(node) in chain or node.kind != "op":
            continue
        if _reads_metadata_only(node):
            if isinstance(node.inputs[0], Var) and node.inputs[0].name in given:
                return True
            continue
        if node.op in ("getitem", "list", "tuple", "len", "assign") or node.op.startswith("compare:"):
            pending.extend(v for v in node.inputs if isinstance(v, Var))
    return False


def _read_only_by(candidates: list[Node], matched_ids: set[int], ix: MethodIndex) -> list[Node]:
    """Those of `candidates` whose values only the matched nodes and the other such candidates read."""
    kept = {id(n): n for n in candidates}
    changed = True
    while changed:
        changed = False
        for key, node in list(kept.items()):
            users = [u for name in node.outputs for u in ix.uses.get(name, ())]
            if not node.outputs or any(id(u) not in matched_ids and id(u) not in kept for u in users):
                del kept[key]
                changed = True
    return list(kept.values())


def analyse(match: Match, ix: MethodIndex, siblings: list[Match], every: list[Match] | None = None,
            partner_of: Match | None = None) -> Finding | None:
    """The finding of `match`. `siblings`: the other matches of its root; `every`: all matches of
    the rule in the method, among which a partner on the other branch of an `if` may share the
    match's leading statements (`_partner`); `partner_of`: the match this one is analysed as the
    partner of, whose nodes may read this one's shared values."""
    rule = match.rule
    nodes = match.matched_nodes
    matched_ids = {id(n) for n in nodes}
    # a node inlined from another file's method (a base class's `get_scores`) is placed at its call here
    placed = [_here(n, match.file.path) for n in nodes if n.pos is not None] \
        or [match.method.pos or Pos(match.file.path, 0, 0, 0, 0)]
    first = min(placed, key=lambda p: (p.line, p.col))
    last = max(placed, key=lambda p: (p.end_line, p.end_col))
    related = []
    for n in nodes:
        for site in n.via:
            if site not in related:
                related.append(site)
    finding = Finding(rule.id, "rewritten" if not rule.detect_only else "detected", match.file.path, match.cls.name,
                      match.method.name, first.line, last.end_line, rule.summary, None,
                      [n.pos for n in nodes if n.pos], related, None, match=match)

    def near_miss(reason: str) -> Finding:
        finding.status = "near-miss"
        finding.reason = reason
        return finding

    match.optional.clear()  # (set again below: a match analysed once more starts afresh)
    match.optional_through.clear()
    # 1. a known look-alike, constants and named constraints
    if match.pattern is not None and match.pattern.near_miss:
        return near_miss(match.pattern.near_miss)
    if match.relaxed:
        return near_miss("constant differs from the rule: " + "; ".join(match.relaxed))
    for name in rule.constraints:
        problem = constraints.CHECKS[name](match, ix)
        if problem:
            return near_miss(problem)

    finding.companions.extend(_read_only_by(match.companions, matched_ids, ix))
    # a local holding the fill's value that only the fill reads (funasr's `min_value = -float("inf")`)
    fill = match.bindings.get("fill")
    held = ix.defs.get(fill.name) if isinstance(fill, Var) else None
    if held is not None and held.kind == "op" and held.op == "assign" and len(held.inputs) == 1 \
            and isinstance(held.inputs[0], (Const, Sym)) and held not in finding.companions:
        finding.companions.extend(_read_only_by([held], matched_ids, ix))
    finding.dead.extend(match.dead)
    # decisions where the other branch computes the same rewrite: its nodes go with the match
    # decisions the code always takes that way (a helper's test of a default, a tensor tested
    # against None) need no guard, and a use on their other branch never runs
    both_ways: set[int] = {cid for cid, taken in match.extra_conditions.items() if ix.decided(cid) == taken}
    match.fold_into = None
    match.fill_through = None
    for cid, taken in sorted(match.extra_conditions.items()):
        if cid in both_ways:
            continue
        both = _both_branches(match, cid, taken, siblings, ix, matched_ids | {id(n) for n in finding.companions})
        if both is not None:
            both_ways.add(cid)
            finding.companions.extend(n for n in both if n not in finding.companions)
            matched_ids |= {id(n) for n in both}

    # a match on the other branch of an `if` that reads the values this match computes before it
    # (GlobalLayerNorm's statistics, then the affine norm on one branch and the plain one on the
    # other): both are written, together (synthesis), and those values go once neither reads them
    partner = _partner(match, ix, every) if partner_of is None and every else None
    shared_with = partner.match if partner is not None else partner_of
    partner_ids = {id(n) for n in shared_with.matched_nodes} if shared_with is not None else set()

    # 2. intermediates must not escape
    guards: list[frozenset] = []  # the original code must run when any of these conjunctions holds
    pattern = match.pattern or rule.patterns[0]
    consumed = {v for stmt in pattern.stmts for v in stmt.data_args}
    # the root and other sinks (not a node that no statement names: an identity cast the match passed
    # through, a node a regrouped product stands for)
    sink_nodes = [n for key, n in match.nodes.items() if key not in consumed and not key.startswith("~")]
    root_outputs = {name for n in sink_nodes for name in n.outputs}
    scores = _score_shaped(match, ix)
    for node in nodes:
        for name in node.outputs:
            if name in root_outputs:
                continue
            for use, implied in _transitive_uses(ix, name):
                if id(use) in matched_ids or id(use) in partner_ids:
                    continue
                if rule.detect_only and _reads_metadata_only(use):
                    continue  # a shape or dtype read does not stop a detected location
                kept: list[dict[int, bool]] = []
                companions = _only_feeds_dropped_argument(use, match, ix, kept if _off_path(use, match, ix) is None else None)
                if companions is not None:
                    # `s.masked_fill(m, -torch.finfo(s.dtype).max)`: removed with the call, and a
                    # statement of its own that computes that argument goes too; where the value
                    # also reaches code off the match's path, the original runs there, read and all
                    finding.companions.extend(c for c in companions if c not in finding.companions)
                    own = {c.id for c in node.guard}
                    guards.extend(frozenset((match.cond_text.get(cid, f"<condition {cid}>"), taken)
                                            for cid, taken in needed.items() if cid not in own)
                                  for needed in kept)
                    continue
                if _decides_only(use, both_ways, ix):
                    # `if s.dtype == torch.float16:` choosing between two spellings of the softmax
                    # that the rewrite makes one: the `if` goes with its branches, emptied
                    continue
                needed = dict(implied)
                for c in use.guard:
                    needed[c.id] = c.taken
                if not ix.possible(needed.items()):
                    continue  # a use on a branch the code never takes
                conflict = any(match.conditions.get(cid, taken) != taken for cid, taken in needed.items())
                check = _shape_check(use, ix) if not conflict else None
                if check is not None and not _validates_given(use, match, ix):
                    # `if attn_weights.size() != (...): raise ValueError(...)`: a validation of an
                    # intermediate that the kernel makes moot; the rewrite removes the check (a read
                    # on another path than the match's is no check: the original code runs there)
                    finding.checks.append(check)
                    continue
                if conflict and rule.detect_only:
                    continue  # that use runs on another path than the match
                # A rewrite removes the intermediate on every path where its producer runs, so a
                # use on another path is an escape under that path's decisions.
                own = {c.id for c in node.guard}
                extra = [Cond(cid, match.cond_text.get(cid, f"<condition {cid}>"), taken)
                         for cid, taken in needed.items()
                         if cid not in own and (conflict or cid not in match.conditions)]
                where = f"line {use.pos.line}" if use.pos else "a merge"
                what = "returned" if use.kind == "return" else "stored" if use.kind == "store" else f"used by `{use.op}`"
                restated = None
                if not extra and not rule.detect_only:
                    restated = _restatement(use, scores, ix, _product_dtyped(match), lambda: _whole_scores(match, ix),
                                            lambda: _permuted_scores(match, ix)) or _helper_argument(use, match, ix)
                elif not conflict and not rule.detect_only:
                    # a read of an axis of permuted scores under a decision the match does not depend
                    # on (labml's ALiBi cache, filled under an `if`): the read stays under it, stated on
                    # the query, rather than the kernel guarded by that decision (other reads there
                    # keep the original on that path, as they did before such reads were restated)
                    restated = _restatement(use, set(), ix, permuted=lambda: _permuted_scores(match, ix))
                if restated is not None:
                    # `torch.eye(dots.shape[-1], device=dots.device)` where the kernel runs: the
                    # kept statement reads the key's length and the query's device instead
                    finding.restated.append(restated)
                    continue
                if not extra:
                    helper = ""
                    if use.kind == "return" and not use.via and not match.method.name.startswith("forward") \
                            and match.method.name != "__call__":
                        # `_attn` returning `(attn_output, attn_weights)`: whether the caller needs
                        # them (`output_attentions`) is not known in the helper
                        helper = f"; `{match.method.name}` hands it to its callers, and only they know when it is needed"
                    refused = near_miss(f"intermediate `{_source_name(name)}` escapes the match: {what} at {where}{helper}")
                    refused.hands_off = bool(helper)
                    return refused
                guards.append(frozenset((c.text, c.taken) for c in extra))

    # a plain assignment of an intermediate (`w = helper(w)` of a helper that returns its argument,
    # `w = MultiheadAttention.apply_sparse_mask(w, ...)`) goes with the match: its uses are the
    # match's own or were accepted above
    passed = [name for node in nodes for name in node.outputs if name not in root_outputs]
    while passed:
        for use in ix.uses.get(passed.pop(), ()):
            if use.kind == "op" and use.op == "assign" and len(use.inputs) == 1 and isinstance(use.inputs[0], Var) \
                    and id(use) not in matched_ids \
                    and use not in finding.companions:
                finding.companions.append(use)
                passed.extend(use.outputs)

    # 3. decisions the match depends on beyond its root's own guard
    fills = []  # (decision, branch, variable) where the fill's mask is set on that branch only
    match.bindings.pop("fthrough", None)
    match.optional.discard("fmask")
    if match.fill_through is not None:  # filled on one branch of a decision the kernel runs on both of
        match.bindings["fthrough"] = Sym(match.fill_through)
        match.optional.add("fmask")
    for cid, taken in sorted(match.extra_conditions.items()):
        if cid in both_ways:
            continue
        if _covered(match, cid, taken, siblings, ix):
            subject = _tested(cid, ix)
            base = _optional_fill(match, subject, cid, ix) if subject is not None else None
            if base is not None:
                fills.append((cid, taken, base))
            elif subject is not None and (folded := _optional_fold(match, subject, cid, ix)) is not None:
                match.fold_into = folded
            continue
        guards.append(frozenset({(match.cond_text.get(cid, f"<condition {cid}>"), not taken)}))
    # settings a constraint holds only for one value of (`self.dim != 2`)
    guards.extend(frozenset({(text, True)}) for text in sorted(match.setting_guards))
    checked = {frozenset({(text, True)}) for text in match.runtime_checks}
    guards.extend(sorted(checked, key=sorted))

    # 4. a location is one place in the code: all matched nodes in one function body (except for a
    #    rule whose pattern is about calls of a helper, `where same_helper`)
    bodies = {n.via for n in nodes}
    # a step computed in a helper the root's function calls (a bias added by `self.apply_pos_bias(s)`,
    # the product of a scorer `self.attn(q, k)` and what its forward reaches by `super().forward`) is
    # written at that one call (engine/synthesize/callsite.py); other mixes are not
    at_call = not match.root.via and len({v[:1] for v in bodies}) == 2
    # the scores made by the caller and handed to a helper that ends the attention (funasr's
    # `self.forward_attention(v, scores, mask)`): the helper's call is written with the kernel
    # (engine/synthesize/callsite.py), the caller's statements that made the scores go
    into_call = len(match.root.via) == 1 and bodies == {(), match.root.via} and not rule.detect_only
    at_call = at_call or into_call
    if into_call:
        # reported where the edit is: the caller's statements that make the scores, and the call
        # (the helper's lines stay as they are, and another call of it has a finding of its own)
        spots = [n.pos for n in nodes if not n.via and n.pos is not None] + [match.root.via[0]]
        finding.line, finding.end_line = min(p.line for p in spots), max(p.end_line for p in spots)
    if len(bodies) > 1 and "same_helper" not in rule.constraints and not at_call:
        return near_miss("the match spans a helper function and its caller; rewrite the helper by hand or inline it")

    terms = _simplify(guards) if guards else []
    for cid, taken, base in fills:
        if frozenset({(match.cond_text.get(cid, f"<condition {cid}>"), not taken)}) not in terms:
            # the kernel runs where the variable may be None: it tests it (else the guard keeps the
            # original wherever it is None, and the kernel takes the mask as it is)
            match.bindings["fthrough"] = Sym(base)
            match.optional.add("fmask")
    if terms:
        opaque = next((text for term in terms for text, _ in term if text.startswith(HELPER_CONDITION)), None)
        if opaque is not None and not rule.detect_only:
            return near_miss(f"the original code would have to be kept when the helper's `{opaque[len(HELPER_CONDITION):]}` "
                             "holds, which its caller cannot test")
        finding.guard_text = _render_dnf(terms).replace(HELPER_CONDITION, "")
        finding.guard_terms = terms
        if any(c.taken and c.text == finding.guard_text for c in match.root.guard):
            # this is the original code an earlier guarded rewrite kept under `if <guard>:`: the
            # rewritten form itself, not a finding (a near-miss here flagged the tool's own edit)
            return None
        if rule.detect_only:
            return finding
        if not rule.guard and not set(terms) <= checked:
            return near_miss(f"the original code would have to be kept when {finding.guard_text}; this rule has no guarded form")
        finding.status = "guarded"
    if finding.status == "guarded" and shared_with is not None:
        return near_miss("a guarded rewrite cannot share its statements with the rewrite on the other branch")
    if partner is not None:
        finding.partner = partner
        finding.locations.extend(p for p in partner.locations if p not in finding.locations)
        finding.end_line = max(finding.end_line, partner.end_line)
    return finding


def _partner(match: Match, ix: MethodIndex, every: list[Match]) -> Finding | None:
    """The rewritable finding of another match of the rule whose root lies on the other branch of
    an `if` that holds this match's root, and that shares with this match exactly the nodes either
    computes before that `if` (the statistics of a norm, then each branch its own end of it: with a
    weight and bias under `if self.elementwise_affine:`, without in the `else`). Each match's values
    are then read by the other's nodes on the other branch: rewriting both replaces every reader,
    and the shared statements go once. The partner is the fullest match of its root, analysed with
    this match as its partner; None where there is no such one."""
    mine = {id(n) for n in match.matched_nodes}
    by_root: dict[int, list[Match]] = {}
    for other in every:
        if other.rule is match.rule and other.root is not match.root and not other.relaxed \
                and mine & {id(n) for n in other.matched_nodes}:
            by_root.setdefault(id(other.root), []).append(other)
    for group in by_root.values():
        other = max(group, key=lambda m: _fullness(m, ix))
        theirs = {id(n) for n in other.matched_nodes}
        decisions = [c.id for c in match.root.guard
                     if any(d.id == c.id and d.taken != c.taken for d in other.root.guard)]
        if len(decisions) != 1:
            continue
        cid = decisions[0]

        def outside(m: Match, cid: int = cid) -> set[int]:
            return {id(n) for n in m.matched_nodes if not any(c.id == cid for c in n.guard)}

        if not outside(match) or outside(match) != mine & theirs or outside(other) != mine & theirs:
            continue
        found = analyse(other, ix, group, partner_of=match)
        if found is not None and found.status == "rewritten":
            return found
    return None


def _source_name(ssa: str) -> str:
    return ssa.split(".", 1)[0]


def _covered(match: Match, cid: int, taken: bool, siblings: list[Match], ix: MethodIndex) -> bool:
    """A decision is covered when the other branch matches too, with an optional statement absent
    whose input is None exactly there (`if attention_mask is not None: s = s + attention_mask`):
    the kernel then receives the variable itself, which is None on that branch."""
    if _conditional_factor(match, cid, taken, siblings, ix):
        return True
    # one term of a sum of masks may be None (the kernel's mask is then the other terms), not two
    bound = {name for name in _SUMMED if name in match.bindings}
    summed = bound if len(bound) > 1 and match.optional & bound else set()
    for other in siblings:
        if other is match or other.conditions.get(cid) != (not taken):
            continue
        if not other.skipped and not match.skipped:
            continue
        # the test must be `V is not None` / `V is None` on a variable bound by the match
        phi = ix.phi_of(cid)
        test = phi.kwarg("test") if phi is not None else None
        if not isinstance(test, Var):
            # a test on no tracked data: `if self.bias is not None:` with `self.bias` bound
            text = match.cond_text.get(cid, "")
            for suffix in (" is not None", " is None"):
                if text.endswith(suffix):
                    subject = text[: -len(suffix)].strip()
                    names = [key for key, b in match.bindings.items() if isinstance(b, Sym) and b.text == subject]
                    if names:
                        match.optional.update(names)
                        return True
            continue
        compare = ix.defs.get(test.name)
        if compare is None or compare.op not in ("compare:isnot", "compare:is") or len(compare.inputs) != 2 \
                or compare.inputs[1] != Const(None):
            continue
        subject = compare.inputs[0]
        names = [key for key, v in match.bindings.items() if isinstance(v, Var) and key not in summed
                 and isinstance(subject, Var) and v.name == subject.name]
        if names:
            match.optional.update(names)
            return True
        # the binding is the variable moved or cast (`attention_mask.to(scores.device)`), which a
        # None cannot be: the kernel gets the value where the variable is set and None elsewhere
        cast = [key for key, v in match.bindings.items() if isinstance(v, Var) and key in _SUMMED
                and not summed and isinstance(subject, Var) and _method_of(v, subject, ix)]
        if cast:
            match.optional.update(cast)
            match.optional_through.update({key: _source_name(subject.name) for key in cast})
            return True
        # the binding is a value of the variable that the code assigns back to its name on this
        # branch (local-attention's `attn_bias = attn_bias[..., -1:, -k_len:]`): after the merge the
        # name holds it where the variable is set and None elsewhere, and the kernel reads the name
        merged = [key for key, v in match.bindings.items() if isinstance(v, Var) and key in _SUMMED
                  and not summed and isinstance(subject, Var)
                  and _assigned_back(match, v, subject, cid, compare.op == "compare:isnot", taken, ix)]
        if merged:
            match.optional.update(merged)
            return True
        if isinstance(subject, Var) and _optional_fill(match, subject, cid, ix) is not None:
            return True
        if isinstance(subject, Var) and _optional_fold(match, subject, cid, ix) is not None:
            return True
    return False


def _assigned_back(match: Match, value: Var, subject: Var, cid: int, set_branch: bool, taken: bool,
                   ix: MethodIndex) -> bool:
    """`value` is assigned to the tested `subject`'s name on the branch of decision `cid` where the
    subject is set (`set_branch`, which the match takes), and the merge of that decision is the
    name's value at the match's root (nothing assigns the name again in between): there the name
    holds `value` where the subject was set and the subject itself, None, elsewhere, which is the
    kernel's optional mask."""
    if taken != set_branch or _source_name(value.name) != _source_name(subject.name):
        return False
    order = {id(n): i for i, n in enumerate(ix.method.nodes)}
    root_at = order.get(id(match.root), -1)
    base = _source_name(subject.name)
    latest = None
    for node in ix.method.nodes[:root_at]:
        if node.via == match.root.via and any(_source_name(o) == base for o in node.outputs):
            latest = node
    if latest is None or latest.kind != "phi" or latest.kwarg("if") != Const(cid) or len(latest.inputs) != 2:
        return False
    on_set, elsewhere = latest.inputs if set_branch else latest.inputs[::-1]
    return on_set == value and elsewhere == subject


def _tested(cid: int, ix: MethodIndex) -> Var | None:
    """The variable of a decision `V is not None` / `V is None`."""
    phi = ix.phi_of(cid)
    test = phi.kwarg("test") if phi is not None else None
    compare = ix.defs.get(test.name) if isinstance(test, Var) else None
    if compare is None or compare.op not in ("compare:isnot", "compare:is") or len(compare.inputs) != 2 \
            or compare.inputs[1] != Const(None) or not isinstance(compare.inputs[0], Var):
        return None
    return compare.inputs[0]


def _optional_fill(match: Match, subject: Var, cid: int, ix: MethodIndex) -> str | None:
    """The fill's mask is computed from the tested variable alone, on the branch where it is set
    (`mask = mask[:, None, None, :]`, then `s.masked_fill(~mask, fill)`), and the fill is the only
    mask: the kernel then takes that mask where the variable is set and none where it is None
    (`None if mask is None else ...`, the fix-up of fully masked rows included; a -inf fill, whose
    NaN rows the template writes on its result, is taken only where that result is assigned to a name
    of its own, `x = attn @ v`: synthesis then writes the rows' fix-up as a statement under the test,
    `if mask is not None: x = x.masked_fill(...)`). The test at the kernel reads the
    variable's name after the merge, so on the branch where it is set that name must hold no None:
    each step of the mask's computation gives no tensor of a None (a tensor method, `~`, an index,
    a torch or einops function raise; `None == 0` is a bool), and `masked_fill` takes a tensor mask
    only, so where the fill runs every value of that computation is set. Returns the variable's
    name, None where the fill is not such a one."""
    fmask = match.bindings.get("fmask")
    if not isinstance(fmask, Var) or any(name in match.bindings for name in (*_SUMMED, "keep")):
        return None
    if "nan_rows" in match.bindings and (len(match.root.outputs) != 1 or constraints.TEMP.match(match.root.outputs[0])):
        return None  # the result is no name's value: the rows' fix-up has no statement to go in
    chain = _none_raising_chain(fmask, subject, ix, merges=True)
    return _source_name(subject.name) if chain is not None and _set_only_by(chain, cid, ix) else None


_ARITHMETIC = {"add", "sub", "mul", "div", "floordiv", "mod", "and_", "or_", "xor", "scale"}


def _none_raising_chain(value: Var, subject: Var, ix: MethodIndex, merges: bool = False) -> list[str] | None:
    """The values from `value` back to `subject` where `value` is computed from `subject` alone by
    steps that each give no tensor of a None (a tensor method, `~`, an index, a comparison, a torch
    or einops function): where `value` exists, `subject` is set. None where it is not such a value.
    With `merges`, also through arithmetic with another value assigned back to the tested name
    (`mask = mask * chunk_mask`: None times a tensor raises) and merges of branches each of which is
    such a value (funasr's `if chunk_mask is not None: mask = mask * chunk_mask`); the values are then
    listed in no particular order."""
    seen: list[str] = []

    def walk(name: str) -> bool:
        if name == subject.name or name in seen:
            return True
        node = ix.defs.get(name)
        if node is None or len(seen) > 12:
            return False
        seen.append(name)
        if merges and node.kind == "phi" and node.inputs:
            return all(isinstance(i, Var) and walk(i.name) for i in node.inputs)
        if node.kind != "op" or not node.inputs:
            return False
        if merges and node.op in _ARITHMETIC and _source_name(name) == _source_name(subject.name):
            # the tested variable combined with another value and assigned back to its name
            return any(isinstance(i, Var) and walk(i.name) for i in node.inputs[:2])
        if not isinstance(node.inputs[0], Var) \
                or any(isinstance(i, Var) for i in (*node.inputs[1:], *(v for _, v in node.kwargs))):
            return False  # a value of anything else than the tested variable
        if node.op not in _MOVES and node.op not in ("invert", "getitem") \
                and not node.op.startswith(("compare:", "torch.", "einops.")) \
                and not (merges and node.op.startswith(".") and not node.op.startswith(".__")):
            return False  # a step that may make a tensor of a None
        return walk(node.inputs[0].name)

    return [*seen, subject.name] if walk(value.name) else None


def _set_only_by(chain: list[str], cid: int, ix: MethodIndex) -> bool:
    """The tested variable's name holds no other value than those of `chain` (and their merge after
    decision `cid`), so that a test of that name where the kernel runs is the decision's test. A
    helper inlined at another call has names of its own (funasr's `forward_fsmn` reshapes its `mask`)."""
    base = _source_name(chain[-1])
    scopes = {()} | {node.via for name in chain if (node := ix.defs.get(name)) is not None}
    for node in ix.method.nodes:
        if node.via not in scopes:
            continue
        for name in node.outputs:
            if _source_name(name) != base or name in chain:
                continue
            if node.kind == "phi" and node.kwarg("if") == Const(cid) \
                    and all(isinstance(i, Var) and i.name in chain for i in node.inputs):
                continue
            return False  # the name holds another value where the kernel tests it
    return True


def _optional_fold(match: Match, subject: Var, cid: int, ix: MethodIndex) -> str | None:
    """The mask added through the scores' split views (`if mask is not None: attn = attn.view(B_ //
    nW, nW, H, N, N) + mask.unsqueeze(1).unsqueeze(0)`, constraints `folded_mask`) is computed from
    the tested variable alone, which holds no other value: on its branch the variable can be
    assigned that mask folded into the scores' layout (`mask = mask.unsqueeze(1).unsqueeze(0)
    .expand(B_ // nW, nW, -1, -1, -1).flatten(0, 1)`, where the sizes the views read are set), and
    the kernel after the merge takes the variable, None on the other branch. The variable must be
    read nowhere after that assignment but by its test against None (a read that would see the
    folded mask). Returns the variable's name, None where the mask is not such a one."""
    fold = constraints.folded_mask(match, ix.shapes)
    value = match.bindings.get(fold[0]) if fold is not None else None
    add = match.nodes.get("s2m" if fold is not None and fold[0] == "mask2" else "s2")
    if not isinstance(value, Var) or add is None or "fmask" in match.bindings or "keep" in match.bindings:
        return None
    chain = _none_raising_chain(value, subject, ix)
    if chain is None or not _set_only_by(chain, cid, ix):
        return None
    base = _source_name(subject.name)
    order = {id(n): i for i, n in enumerate(ix.method.nodes)}
    at = order.get(id(add), -1)
    for node in ix.method.nodes:
        if order[id(node)] <= at or any(o in chain for o in node.outputs):
            continue
        reads = [i for i in (*node.inputs, *(v for _, v in node.kwargs)) if isinstance(i, Var) and _source_name(i.name) == base]
        if not reads or node.kind == "phi":
            continue
        if node.op in ("compare:is", "compare:isnot") and node.inputs[1:] == (Const(None),):
            continue
        return None  # read after the branch would assign it the folded mask
    return base


def _both_branches(match: Match, cid: int, taken: bool, siblings: list[Match], ix: MethodIndex,
                   removed: set[int]) -> list[Node] | None:
    """A decision is covered when the other branch computes the same rewrite: a sibling match of the
    same pattern takes the other branch, matches the same statements (none absent on one branch
    only, some computed in each branch), agrees on every other decision and on every node outside the branch, meets the rule's
    constraints, and binds what the template reads to the same values (the
    mean over the trailing len(N) axes on one branch, over the last axis on the other where an assert
    proves len(N) == 1). The kernel then runs on both paths; the other branch's nodes, its
    companions and the merges of the two go with the match (returned), where nothing else reads
    them. None where no sibling does."""
    if not match.rule.rewrite:
        return None  # a rule that only detects: what the original computes on each path is not asked
    names = set(re.findall(r"\$([A-Za-z_]\w*)", match.rule.rewrite))

    def outside(m: Match) -> set[int]:
        return {id(n) for n in m.nodes.values() if not any(c.id == cid for c in n.guard)}

    def steps(m: Match) -> tuple[set[str], list[str]]:  # the statements matched, and those absent
        return {k for k in m.nodes if not k.startswith("~")}, sorted(m.skipped)

    def within(m: Match, side: bool) -> bool:  # some matched step is computed on that branch
        return any(c.id == cid and c.taken == side for n in m.nodes.values() for c in n.guard)

    if not within(match, taken):
        return None
    # a mask added through split views of the scores on this branch only, which the kernel can take
    # as the tested variable folded on its branch: the other branch lacks those steps and that mask
    subject = _tested(cid, ix)
    folded = _optional_fold(match, subject, cid, ix) if subject is not None else None
    fold = constraints.folded_mask(match, ix.shapes) if folded is not None else None
    fold_steps = {"mask2": {"s2u", "s2m", "s2v"}, "mask": {"sv", "s2", "s2u"}}[fold[0]] if fold is not None else set()
    unbound: set[str] = {fold[0]} if fold is not None else set()
    # a fill (and its zero re-fill after the softmax) on this branch only, of a mask computed there
    # from the tested variable (funasr: `if mask is not None: mask = mask.unsqueeze(1).eq(0); s =
    # s.masked_fill(mask, -inf); attn = softmax(s).masked_fill(mask, 0.0)`, `else: attn =
    # softmax(s)`): the kernel after the merge takes that mask where the variable is set
    filled = _optional_fill(match, subject, cid, ix) if subject is not None and fold is None else None
    if filled is not None:
        fold_steps = {"s3", "pr", "pz"} & set(match.nodes)
        unbound = {"fmask", "fill", "nan_rows", "zero_query"}

    mine = steps(match)  # the match is not changed below (a constraint may change a sibling)
    folded_steps = (mine[0] - fold_steps, sorted({*mine[1], *(fold_steps & mine[0])}))
    my_outside = outside(match)

    # the tests are pure: the cheap ones first (most siblings take the same branch)
    for other in siblings:
        if other is match or other.conditions.get(cid) != (not taken) or other.pattern is not match.pattern \
                or other.relaxed or not within(other, not taken) \
                or (steps(other) != mine and not _upcast_choice(match, other, cid, taken, ix)
                    and not _float_softmax_spellings(match, other) and not (fold_steps and steps(other) == folded_steps)) \
                or outside(other) != my_outside \
                or any(match.conditions.get(c, t) != t for c, t in other.conditions.items() if c != cid) \
                or any(other.conditions.get(c, t) != t for c, t in match.conditions.items() if c != cid):
            continue
        if any(constraints.CHECKS[name](other, ix) for name in match.rule.constraints):
            continue
        unfolded = steps(other) != mine  # the other branch adds no mask through the views, or fills none
        bound = {n for n in names if n in match.bindings and not (unfolded and n in unbound)}
        if bound != {n for n in names if n in other.bindings} \
                or any(match.bindings[n] != other.bindings[n] for n in bound):
            continue
        nodes = [n for n in [*other.nodes.values(), *other.companions] if id(n) not in removed]
        # the merges of the decision, and of an inlined helper's returns (no `if` of their own) of
        # the two branches' values
        made = {name for n in ix.method.nodes if id(n) in removed for name in n.outputs} \
            | {name for n in nodes for name in n.outputs}
        merges = [n for n in ix.method.nodes if n.kind == "phi" and (
            n.kwarg("if") == Const(cid)
            or n.kwarg("if") is None and n.inputs and all(isinstance(i, Var) and i.name in made for i in n.inputs))]
        kept = {id(n) for n in nodes} | {id(n) for n in merges} | removed
        if all(id(u) in kept for n in nodes for name in n.outputs for u in ix.uses.get(name, ())):
            if unfolded and fold is not None:
                match.fold_into = folded
            if unfolded and filled is not None:
                match.fill_through = filled
            return nodes
    return None


_HALF = ("torch.float16", "torch.half", "torch.bfloat16")
_FLOAT32 = ("torch.float32", "torch.float")


def _text(operand) -> str | None:
    return operand.text if isinstance(operand, Sym) else None


def _dtype_test(cid: int, ix: MethodIndex) -> tuple[str, str] | None:
    """The decision `cid` as (tensor, half dtype) where it is `tensor.dtype == <half dtype>`."""
    phi = ix.phi_of(cid)
    test = phi.kwarg("test") if phi is not None else None
    compare = ix.defs.get(test.name) if isinstance(test, Var) else None
    if compare is None or compare.op != "compare:eq" or len(compare.inputs) != 2:
        return None
    read = ix.defs.get(compare.inputs[0].name) if isinstance(compare.inputs[0], Var) else None
    dtype = _text(compare.inputs[1])
    if read is None or not _reads_metadata_only(read) or read.inputs[1:] != (Const("dtype"),) \
            or not isinstance(read.inputs[0], Var) or dtype not in _HALF:
        return None
    return read.inputs[0].name, dtype


def _decides_only(use: Node, decisions: set[int], ix: MethodIndex) -> bool:
    """A dtype read whose only purpose is the test of decisions that the rewrite takes both ways
    (`_upcast_choice`): it reaches nothing but the comparisons those branches merge on."""
    if not decisions or not _reads_metadata_only(use) or len(use.outputs) != 1:
        return False
    compares = ix.uses.get(use.outputs[0], ())
    if not compares or any(c.op != "compare:eq" or len(c.outputs) != 1 for c in compares):
        return False
    tests = [Const(d) for d in decisions]
    return all(readers and all(r.kind == "phi" and r.kwarg("if") in tests and r.kwarg("test") == Var(c.outputs[0])
                               for r in readers)
               for c in compares for readers in [ix.uses.get(c.outputs[0], ())])


def _upcast_choice(match: Match, other: Match, cid: int, taken: bool, ix: MethodIndex) -> bool:
    """The two branches of `if s.dtype == torch.float16:` choose between spellings of one softmax:
    `softmax(s, dim, dtype=torch.float32).to(torch.float16)` where the test holds and `softmax(s,
    dim)` where it does not (OPT). Both are the softmax of `s` computed in at least float32 and
    given back in `s`'s own dtype, which is what the kernel does with half-precision scores; so the
    matches differ only by that cast back (`$p1`), on the branch whose test proves it is to the
    scores' own dtype, and agree on every other step."""
    ours, theirs = (set(m.nodes) - {k for k in m.nodes if k.startswith("~")} for m in (match, other))
    if ours ^ theirs != {"p1"} or set(match.skipped) ^ set(other.skipped) != {"p1"}:
        return False
    test = _dtype_test(cid, ix)
    upcast, plain = (match, other) if "p1" in match.nodes else (other, match)
    if test is None or (upcast is match) != taken:
        return False
    scores, half = test
    up, down, again = upcast.nodes.get("p0"), upcast.nodes.get("p1"), plain.nodes.get("p0")
    if up is None or down is None or again is None or up.inputs[:1] != again.inputs[:1] \
            or not isinstance(up.inputs[0], Var) or up.inputs[0].name != scores:
        return False
    if _text(up.kwarg("dtype")) not in _FLOAT32 or again.kwarg("dtype") is not None \
            or up.kwarg("dim") != again.kwarg("dim") or down.op != ".to" or _text(down.inputs[1]) != half \
            or len(down.inputs) != 2 or down.kwargs:
        return False
    return True


def _float_softmax_spellings(match: Match, other: Match) -> bool:
    """The two matches differ only by how they spell a float32 softmax of the same scores:
    `softmax(s.float(), dim)` on one, `softmax(s, dim, dtype=torch.float32)` on the other (fairseq's
    `utils_softmax`, choosing by `onnx_trace`). `dtype=` casts the input before the operation, so
    both are one value whichever branch runs."""
    ours, theirs = (set(m.nodes) - {k for k in m.nodes if k.startswith("~")} for m in (match, other))
    if ours ^ theirs != {"s4"} or set(match.skipped) ^ set(other.skipped) != {"s4"}:
        return False
    upcast, plain = (match, other) if "s4" in match.nodes else (other, match)
    cast, up, again = upcast.nodes["s4"], upcast.nodes.get("p0"), plain.nodes.get("p0")
    if up is None or again is None or cast.op != ".float" or len(cast.inputs) != 1 or cast.kwargs \
            or up.inputs != (Var(cast.outputs[0]),) or again.inputs != cast.inputs:
        return False
    if up.kwarg("dtype") is not None or _text(again.kwarg("dtype")) not in _FLOAT32:
        return False
    rest = {k: v for k, v in again.kwargs if k != "dtype"}
    return up.op == again.op and dict(up.kwargs) == rest


# tensor methods that give a tensor of a tensor (None has none of them)
_MOVES = {".to", ".type", ".float", ".half", ".bfloat16", ".type_as", ".contiguous", ".bool", ".unsqueeze", ".view",
          ".reshape", ".expand", ".repeat"}


def _method_of(value: Var, subject: Var, ix: MethodIndex, depth: int = 0) -> bool:
    """`value` is `subject` moved, cast or reshaped by tensor methods (`.to(device)`, `.unsqueeze(0)`,
    a `.repeat` on one branch only), which a None cannot pass: a tensor exactly where `subject` is."""
    if depth > 8:
        return False
    node = ix.defs.get(value.name)
    if node is None:
        return False
    if node.kind == "phi":
        merged = [v for v in node.inputs if isinstance(v, Var)]
        return bool(merged) and len(merged) == len(node.inputs) \
            and all(_method_of(v, subject, ix, depth + 1) for v in merged)
    if node.kind != "op" or node.op not in _MOVES or not node.inputs or not isinstance(node.inputs[0], Var):
        return False
    return node.inputs[0] == subject or _method_of(node.inputs[0], subject, ix, depth + 1)


# optional statements that only scale the scores or drop out the probabilities, and the binding
# holding each one's factor or probability
_FLAGGED_STEPS = {"s1": ("factor", "tdiv_number"), "s1b": ("factor2",), "s2s": ("factorm",), "s3s": ("factor3",), "p2": ("dp",)}


def _conditional_factor(match: Match, cid: int, taken: bool, siblings: list[Match], ix: MethodIndex) -> bool:
    """A decision is covered when it only chooses whether a score factor or a dropout applies: the
    match holds an optional scale or dropout step on that branch, and a sibling match is the same
    but for that step, on the other branch. The kernel's scale is then that factor there and 1.0
    elsewhere, its dropout probability that one there and 0.0 elsewhere. The condition must read no
    tracked data (a flag such as `self.scale_attn_weights`, `self.use_dropout`): the kernel call
    evaluates it again, later, where an intermediate it read may be gone."""
    text = match.cond_text.get(cid, "")
    phi = ix.phi_of(cid)
    if not text or text.startswith(HELPER_CONDITION) or (phi is not None and phi.kwarg("test") is not None):
        return False
    for step, names in _FLAGGED_STEPS.items():
        node = match.nodes.get(step)
        factor = next((n for n in names if n in match.bindings), None)
        if node is None or factor is None or not any(c.id == cid and c.taken == taken for c in node.guard):
            continue
        rest = {k: id(n) for k, n in match.nodes.items() if k != step}
        for other in siblings:
            if other is match or other.conditions.get(cid) != (not taken) or step not in other.skipped:
                continue
            if {k: id(n) for k, n in other.nodes.items()} == rest:
                match.conditional[factor] = (text, taken)
                return True
    return False


# Bindings the attention rewrite adds up into one mask where several are bound (engine/synthesize/layout.py):
# a None on one path is the sum of the others there, on two it is no pass-through (`None + bias` raises),
# so that path keeps the original; `$mask` in a template stands for them all.
_SUMMED = ("mask", "mask2", "mask3")


def _in_template(name: str, rewrite: str) -> bool:
    """Whether the rewrite template reads the binding `name` (as `$name`, or through the sum it is part of)."""
    names = set(re.findall(r"\$([A-Za-z_]\w*)", rewrite))
    return name in names or (name in _SUMMED and _SUMMED[0] in names)


def find(files: list[FileModel], rules: list[Rule], *, near_misses: bool = True) -> list[Finding]:
    """All findings of `rules` in `files`, one per source location and rule."""
    findings: list[Finding] = []
    for file in files:
        indexes = FileIndexes(file)
        for rule in rules:
            candidates = indexes.candidates(rule)  # the methods that have the ops the rule needs
            if candidates:
                findings.extend(_find_rule(rule, candidates, near_misses))
    return _drop_inner_rewrites(findings)


_REWRITES = ("rewritten", "guarded")


def _drop_inner_rewrites(findings: list[Finding]) -> list[Finding]:
    """A rewrite whose locations lie strictly inside another rule's rewrite of the same place is a
    part of it seen by a narrower rule (the RMSNorm of `x - mean` inside a LayerNorm): the larger
    one is made, the inner one is no finding of its own."""
    by_file: dict[str, list[tuple[Finding, frozenset]]] = {}
    for f in findings:
        if f.status in _REWRITES:
            key = frozenset((p.file, p.line, p.col, p.end_line, p.end_col) for p in f.locations)
            by_file.setdefault(f.file, []).append((f, key))
    inner = {id(f) for rewrites in by_file.values() if len({f.rule_id for f, _ in rewrites}) > 1
             for f, key in rewrites if any(other.rule_id != f.rule_id and key < wide for other, wide in rewrites)}
    return [f for f in findings if id(f) not in inner] if inner else findings


def _find_rule(rule: Rule, indexes: list[MethodIndex], near_misses: bool) -> list[Finding]:
    chosen: dict[frozenset, tuple[Match, MethodIndex, list[Match]]] = {}
    every: dict[int, list[Match]] = {}  # id(method index) -> the rule's strict matches in it
    # the same location inlined once into a caller: rewritten at the call where the helper's own
    # finding says that only its callers know whether the intermediates are needed
    # the fullest match at each call of a helper, by the helper's root it reaches (the matches
    # there may differ from the helper's own: a call that decides a test takes one path)
    at_calls: dict[tuple, list[tuple[Match, MethodIndex, list[Match]]]] = {}
    loose: list[tuple[Match, MethodIndex]] = []
    roots: list[tuple[MethodIndex, dict[int, list[Match]]]] = []
    own = set()  # the roots that a function's own body holds (not inlined at a call)
    for ix in indexes:
        # a match on a path no call takes (`None is not None`: a helper's test of the None its
        # caller passes) computes nothing
        # ... and a match wholly in a method inherited from another file is that file's finding
        matches = [m for m in match_method(rule, ix, relaxed=near_misses)
                   if all(constant_truth(m.cond_text.get(cid, "")) in (None, taken) for cid, taken in m.conditions.items())
                   and not all(n.pos is not None and n.pos.file != ix.file.path for n in m.nodes.values())]
        every[id(ix)] = [m for m in matches if not m.relaxed]
        by_root: dict[int, list[Match]] = {}
        for m in matches:
            if m.relaxed:
                loose.append((m, ix))
            else:
                by_root.setdefault(id(m.root), []).append(m)
        roots.append((ix, by_root))
        own |= {(m.root.pos, m.root.target) for group in by_root.values() for m in group if not m.root.via}
    for ix, by_root in roots:
        for group in by_root.values():
            # the fullest match (most nodes) of a root is the one to rewrite
            best = max(group, key=lambda m, ix=ix: _fullness(m, ix))
            key = best.location_key
            previous = chosen.get(key)
            # a location seen both in a helper's own body and inlined into a caller: keep the
            # helper's own (fewer inlining steps); a match wholly in a helper whose own body holds
            # its root is the helper's to report, whichever path its call takes (a call that
            # decides the helper's test, leaving `logit_scale` None, has a fullest match of its own)
            inside = len(best.root.via) == 1 and all(n.via == best.root.via for n in best.nodes.values()) \
                and (best.root.pos, best.root.target) in own
            if not inside and (previous is None or len(best.root.via) < len(previous[0].root.via)):
                chosen[key] = (best, ix, group)
            if len(best.root.via) == 1:
                at_calls.setdefault((best.root.pos, best.root.target), []).append((best, ix, group))
    # code already in the rule's rewritten form is no finding (analyse: None)
    results = []
    for m, ix, group in chosen.values():
        if in_rewritten_form(m, ix):
            continue
        finding = _least_guarded(m, ix, group, every.get(id(ix)))
        sites = at_calls.get((m.root.pos, m.root.target), []) if not m.root.via else []
        if finding is not None and finding.hands_off and sites:
            calls = [_least_guarded(*site) for site in sites]
            if all(f is None for f in calls):
                continue  # every call already keeps the helper only where its weights are needed
            rewritable = [f for f in calls if f is not None and f.status in ("rewritten", "guarded")]
            if rewritable:
                results.extend(rewritable)
                continue
        elif finding is not None and finding.status == "near-miss" and sites:
            # the helper cannot be rewritten for every caller (a public function's parameter that
            # code outside may pass anything for), but a call that decides what the helper left
            # open (V1's Swin call leaves `logit_scale` None) is rewritten where it is made
            results.extend(f for f in (_least_guarded(*site) for site in sites)
                           if f is not None and f.status in ("rewritten", "guarded"))
        results.append(finding)
    # structures that differ only in a constant, where nothing matched exactly: near-misses
    strict_positions = {p for key in chosen for p in key}  # (position, target) pairs
    relaxed_seen: set[frozenset] = set()
    for m, ix in loose:
        key = m.location_key
        if key in relaxed_seen or key & strict_positions:
            continue
        relaxed_seen.add(key)
        if not in_rewritten_form(m, ix):
            results.append(analyse(m, ix, [m]))
    results.extend(_search_bounds(rule, indexes, results))
    results = _drop_contained(_without_partners([f for f in results if f is not None]))
    results.sort(key=lambda f: (f.file, f.line, f.rule_id))
    return results


def _search_bounds(rule: Rule, indexes: list[MethodIndex], results: list[Finding | None]) -> list[Finding]:
    """A near-miss at each root where the search for `rule` stopped at its bound
    (`engine.match.matcher.MAX_ATTEMPTS_PER_ROOT`) without a match and no other finding covers: the code there may
    hold a site the search did not finish looking for, and the user is told so."""
    covered = {p for f in results if f is not None for p in f.locations}
    out: list[Finding] = []
    seen: set[Pos] = set()
    for ix in indexes:
        for rule_id, node in ix.bounded:
            pos = node.pos
            if rule_id != rule.id or pos is None or pos in covered or pos in seen:
                continue
            seen.add(pos)
            out.append(Finding(rule.id, "near-miss", ix.file.path, ix.cls.name, ix.method.name, pos.line,
                               pos.end_line, rule.summary,
                               f"not searched to the end: the matcher stopped after {_matcher.MAX_ATTEMPTS_PER_ROOT} attempts "
                               "at this statement without a match (a site here may have been missed)",
                               [pos], list(node.via)))
    return out


def _root_place(f: Finding) -> tuple[int, int]:
    pos = f.match.root.pos if f.match is not None else None
    return (pos.line, pos.col) if pos is not None else (f.line, 0)


def _without_partners(results: list[Finding]) -> list[Finding]:
    """One finding for two matches written together (`Finding.partner`): the one whose root comes
    first reports both; the other's own finding goes."""
    partnered = {id(f.partner.match.root): f for f in results if f.partner is not None and f.partner.match is not None}
    kept = []
    for f in results:
        first = partnered.get(id(f.match.root)) if f.match is not None else None
        if first is not None and first is not f and first.match is not None and f.status in _REWRITES \
                and _root_place(first) < _root_place(f):
            continue
        kept.append(f)
    return kept


_VIEW_STEPS = ("sv", "s2u", "s2v")  # the views around a mask add (constraints `mask_view_round_trip`)


def _least_guarded(best: Match, ix: MethodIndex, group: list[Match], every: list[Match] | None = None) -> Finding | None:
    """The finding of the fullest match of a root. Where that one sums two additive masks and so
    needs a guard (a None on either's path is no pass-through), the fullest match with one mask is
    taken instead when a rewrite can use it: it passes its mask as the kernel's optional one, so the
    kernel runs wherever the other term is absent (BEiT's relative-position biases, MPNet's position
    bias: one of them is None by default). A rewritable finding keeps the root's other matches,
    fullest first, for synthesis to fall back on (`fallback`)."""
    finding = analyse(best, ix, group, every)
    chosen = best

    def fullness(m: Match) -> tuple:
        return _fullness(m, ix)

    if finding is not None and finding.status == "near-miss" and any(k in best.nodes for k in _VIEW_STEPS):
        # a mask added through views the kernel cannot take (a 5-D window view of 4-D scores): the
        # match without those steps keeps the original where the mask is added, as before
        plain = [m for m in group if not any(k in m.nodes for k in _VIEW_STEPS)]
        if plain:
            candidate = analyse(max(plain, key=fullness), ix, group)
            if candidate is not None and candidate.status in ("rewritten", "guarded"):
                finding, chosen = candidate, max(plain, key=fullness)
    if finding is not None and finding.status == "guarded" and finding.guard_text == "True":
        # the original would be kept everywhere (a match through the branch that returns the
        # weights): the fullest match whose kernel runs somewhere, where there is one
        for other in sorted((m for m in group if m is not best), key=fullness, reverse=True):
            candidate = analyse(other, ix, group)
            if candidate is not None and candidate.status in ("rewritten", "guarded") and candidate.guard_text != "True":
                finding, chosen = candidate, other
                break
    def terms(m: Match) -> int:
        return sum(name in m.bindings for name in _SUMMED)

    if finding is not None and finding.status == "guarded" and terms(best) > 1:
        single = [m for m in group if m is not best and terms(m) < terms(best)]
        if single:
            other = max(single, key=fullness)
            candidate = analyse(other, ix, group)
            if candidate is not None and candidate.status in ("rewritten", "guarded"):
                finding, chosen = candidate, other
    passed_over: list[Match] = []
    if finding is not None and finding.status == "guarded":
        # readings of the root as full as the chosen one that differ in which branches they take (a
        # fill under `if exists(mask):` with the kernel taking the mask where it is set, or the one
        # under `if self.causal:`): one whose kernel takes the optional fill's mask or None, keeping
        # the original on fewer paths, so that the kernel runs where neither fill is made (x-clip's
        # vision tower) and not only on one branch (`_least_kept`)
        level = fullness(chosen)
        ties = [(m, ix, group) for m in group if m is not chosen and m is not best and fullness(m) == level]
        picked = _least_kept(ties, finding)
        if picked is not None:
            passed_over.append(chosen)
            finding, chosen = picked, picked.match
    if finding is not None and finding.status in ("rewritten", "guarded"):
        others = sorted((m for m in group if m is not chosen and (m is not best or any(m is p for p in passed_over))),
                        key=fullness, reverse=True)
        finding.fallbacks = [(m, ix, group) for m in others[:_FALLBACKS]]
    return finding


def _least_kept(candidates: list[tuple[Match, MethodIndex, list[Match]]], than: Finding | None = None) -> Finding | None:
    """Of `candidates` (matches of one root, each with what analysing it needs), the first rewritable
    finding (or `than`, where given), replaced by a later one whose kernel takes an optional fill's
    mask where it is set and none elsewhere (so it runs on both branches of that fill's decision)
    where the one held does not, and whose original is kept on fewer paths (`_kept_share`): x-clip's
    padding reading before its causal one, not a reading that only trades one branch for another
    (DALLE2's padding fill beside a bias, which no kernel takes as optional: its causal reading
    stays). None where no candidate is rewritable and `than` is not given."""
    held = than
    for m, ix, group in candidates:
        candidate = analyse(m, ix, group)
        if candidate is None or candidate.status not in ("rewritten", "guarded"):
            continue
        if held is None:
            held = candidate
        elif _passes_fill(candidate) and not _passes_fill(held) and _share(candidate) < _share(held):
            held = candidate
    return None if held is than else held


def _passes_fill(finding: Finding) -> bool:
    return finding.match is not None and "fmask" in finding.match.optional


def _share(finding: Finding) -> float:
    return _kept_share(finding.guard_terms) if finding.status == "guarded" else 0.0


def _kept_share(terms: list[frozenset]) -> float:
    """The share of the paths (each condition text taken as an independent choice) on which a guard
    written as `terms` (a disjunction of conjunctions of (text, taken)) keeps the original code; 1.0
    where there are too many conditions to count."""
    texts = sorted({text for term in terms for text, _ in term})
    if not terms:
        return 0.0
    if len(texts) > 12:
        return 1.0
    kept = 0
    for bits in range(1 << len(texts)):
        value = {text: bool(bits >> i & 1) for i, text in enumerate(texts)}
        kept += any(all(value[text] == taken for text, taken in term) for term in terms)
    return kept / (1 << len(texts))


_FALLBACKS = 4  # other matches of a root kept for synthesis to try when it cannot write the chosen one


def fallback(finding: Finding) -> Finding | None:
    """The next rewritable finding among `finding`'s fallbacks (analysed now), or None. Used by
    synthesis when it cannot write a match as chosen: the fullest match may bind a value the code
    reassigns before the kernel call (`q = q * scale`, then `q = rotary(q)`), where a smaller match of
    the same root (the scale left in place) is still a correct rewrite."""
    while finding.fallbacks:
        # the next matches as full as one another: the one that keeps the original on the fewest paths
        level = _fullness(finding.fallbacks[0][0], finding.fallbacks[0][1])
        run = 1
        while run < len(finding.fallbacks) and _fullness(finding.fallbacks[run][0], finding.fallbacks[run][1]) == level:
            run += 1
        ties, finding.fallbacks = finding.fallbacks[:run], finding.fallbacks[run:]
        candidate = _least_kept(ties)
        if candidate is not None:
            finding.fallbacks = [t for t in ties if t[0] is not candidate.match] + finding.fallbacks
            candidate.fallbacks = finding.fallbacks
            return candidate
    return None


_CHOSEN_MATCH_FIELDS = ("status", "line", "end_line", "reason", "locations", "related", "guard_text", "checks",
                        "companions", "dead", "match", "fallbacks", "partner", "guard_terms")


def adopt(finding: Finding, other: Finding) -> None:
    """`finding` reports `other`, a fallback match of its root, from now on (its site, guard, match)."""
    for name in _CHOSEN_MATCH_FIELDS:
        setattr(finding, name, getattr(other, name))


# constraints on how the match reads the scores' layout and order of steps: a reading they refuse
# (another value's product permuted and added to the scores, taken for the scores; a scale after an
# additive mask taken for a scale after the fill) gives way to a less full one of the same root
_READINGS = ("scores_permuted_back", "scaled_after_fill", "mask_view_round_trip", "mask_after_fill")


def _fullness(m: Match, ix: MethodIndex) -> tuple:
    """How full a reading of the root `m` is (the greatest is chosen), computed once per match: the
    readings' checks read the match's nodes and bindings, which analysis does not change, and of what
    it changes only which masks are optional (`scaled_after_fill`), so the value is kept with those."""
    optional = frozenset(m.optional & _OPTIONAL_READ) if m.optional else frozenset()
    cached = m.fullness
    if cached is not None and cached[0] == optional:
        return cached[1]
    readable = not any(constraints.CHECKS[name](m, ix) for name in _READINGS if name in m.rule.constraints)
    value = (m.pattern is None or m.pattern.near_miss is None, readable, len(m.nodes), -len(m.extra_conditions))
    m.fullness = (optional, value)
    return value


_OPTIONAL_READ = frozenset({"mask", "mask2"})  # the optional bindings a reading's check reads (`scaled_after_fill`)


def _in_helper_of(small: Finding, large: Finding) -> bool:
    """`small` is a rewritable match of a helper's own body that `large` inlines at a call (the root
    of `large` in the caller, or in the helper with a step in the caller: `self._norm(x.float())`)."""
    if small.status not in ("rewritten", "guarded") or small.match is None or large.match is None:
        return False
    inner, outer = small.match, large.match
    return not inner.root.via and len(outer.root.via) <= 1 and inner.method is not outer.method \
        and any(n.via for n in outer.nodes.values()) and inner.rule.id == outer.rule.id


def _drop_contained(results: list[Finding]) -> list[Finding]:
    """A finding whose locations lie strictly inside another's is the same place seen by a shorter
    pattern (a norm without its bias add): keep the larger, unless the larger is only a near-miss
    and the smaller is one a rewrite can use — then the near-miss goes (the place is served).
    Also unless the larger spans a helper and its caller (Gemma's `output = self._norm(x.float())`,
    then `output * (1.0 + self.scale)`) and the smaller is the helper's own rewritable match: the
    helper is rewritten where it is written, for every caller, rather than at one call with the
    helper left behind as manual code (which a scan after `--apply` would then rewrite anyway)."""
    keys = [frozenset((p.file, p.line, p.col, p.end_line, p.end_col) for p in f.locations) for f in results]
    keep = []
    for i, f in enumerate(results):
        redundant = False
        for j, other in enumerate(results):
            if i == j:
                continue
            if keys[i] < keys[j] and _in_helper_of(f, other):
                continue
            if keys[j] < keys[i] and _in_helper_of(other, f):
                redundant = True  # the helper's own rewrite serves this call
            elif keys[i] < keys[j] and (other.status != "near-miss" or f.status == "near-miss"):
                redundant = True  # a larger finding covers this place
            elif keys[j] < keys[i] and f.status == "near-miss" and other.status != "near-miss":
                redundant = True  # a rewrite of part of this place is made; the look-alike is noise
            if redundant:
                break
        if not redundant:
            keep.append(f)
    return keep
