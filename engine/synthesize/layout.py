"""Layout adaptation for a rewrite: the kernel wants (batch..., query, feature) operands, and the code
may hold them another way. A match says which way through the statements it bound (see
rules/sdpa-attention.rule):

  * no `$kt` (the key's transpose) bound: the product read the key stored as (..., feature, key),
    so the kernel gets `k.transpose(-2, -1)`;
  * `$pt` bound (`v @ p.transpose(-2, -1)`): the value is stored (..., feature, key) and the output
    is read back as (..., feature, query): the kernel gets `v.transpose(-2, -1)` and its result is
    transposed back;
  * `$temp` bound (a learned temperature constant along the last two axes): it multiplies the query,
    `(q * temp) @ k^T == (q @ k^T) * temp`, and the kernel's own scale stays as the template says.

  * an operand the extractor transposed to lower an einsum (`'b h d i, b h d j -> b h i j'`) is the
    einsum's operand itself, transposed only where the kernel needs it.

Only the transposes the layout needs are emitted; a match in the kernel's layout renders unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from engine.dsl import canonical as C
from engine.dsl.ir import Operand, Var
from engine.match.matcher import Match

_SWAP = ".transpose(-2, -1)"


def _atom(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def _needs_key_swap(match: Match) -> bool:
    pattern = match.pattern
    declares = pattern is not None and any(s.out == "kt" for s in pattern.stmts)
    return declares and "kt" in match.skipped


def _generated_transpose_input(match: Match, operand: Operand | None) -> Operand | None:
    """The operand of a transpose that the extractor made from an einsum's equation (it has no
    source text of its own: its position is the whole einsum), or None."""
    if not isinstance(operand, Var):
        return None
    node = next((n for n in match.method.nodes if operand.name in n.outputs), None)
    if node is None or node.kind != "op" or node.op != "transpose" or node.target not in C.EINSUM_FUNCTIONS:
        return None
    return node.inputs[0] if node.inputs else None


def lookup(match: Match, base: Callable[[str], str | None],
           render: Callable[[Operand], str]) -> Callable[[str], str | None]:
    """The template lookup with the layout's adaptations applied to `$q`, `$k` and `$v`."""

    def adapted(name: str) -> str | None:
        if name not in ("q", "k", "v"):
            return base(name)
        swap = (name == "k" and _needs_key_swap(match)) or (name == "v" and "pt" in match.nodes)
        inner = _generated_transpose_input(match, match.bindings.get(name))
        if inner is not None:
            text: str | None = render(inner)
            swap = not swap  # the equation's own transpose and the layout's cancel
        else:
            text = base(name)
        if text is None:
            return None
        if swap:
            text = _atom(text) + _SWAP
        if name == "q" and "temp" in match.bindings:
            temp = base("temp")
            return f"({text} * {temp})" if temp is not None else None
        return text

    return adapted


def result(match: Match, code: str) -> str:
    """The kernel's result in the code's layout: transposed back where the output was read so."""
    if "pt" in match.nodes:
        return f"({code}){_SWAP}"
    return code
