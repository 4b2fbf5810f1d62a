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

Only the transposes the layout needs are emitted; a match in the kernel's layout renders unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from engine.match.matcher import Match

_SWAP = ".transpose(-2, -1)"


def _atom(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def applies(match: Match) -> bool:
    """Whether the match's layout differs from the kernel's (the rewrite must adapt it)."""
    return _needs_key_swap(match) or "pt" in match.nodes or "temp" in match.bindings


def _needs_key_swap(match: Match) -> bool:
    pattern = match.pattern
    declares = pattern is not None and any(s.out == "kt" for s in pattern.stmts)
    return declares and "kt" in match.skipped


def lookup(match: Match, base: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """The template lookup with the layout's adaptations applied to `$q`, `$k` and `$v`."""
    if not applies(match):
        return base

    def adapted(name: str) -> str | None:
        text = base(name)
        if text is None:
            return None
        if name == "k" and _needs_key_swap(match):
            return _atom(text) + _SWAP
        if name == "v" and "pt" in match.nodes:
            return _atom(text) + _SWAP
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
