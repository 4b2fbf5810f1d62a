"""Named checks a rule can require with `where NAME`. Each returns None when the match satisfies
it, or the reason it does not (which becomes the near-miss reason)."""

from __future__ import annotations

from collections.abc import Callable

from engine.dsl.ir import Const, Sym, Var
from engine.match.matcher import Match, MethodIndex, numeric


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


CHECKS: dict[str, Callable[[Match, MethodIndex], str | None]] = {
    "fill_is_minus_infinity": _fill_is_minus_infinity,
    "same_branch": _same_branch,
    "same_helper": _same_helper,
}
