"""Rewrite templates: a Python expression with `$variables`, and optional segments.

    torch.nn.functional.scaled_dot_product_attention($q, $k, $v[[, attn_mask=$mask]][[, scale=$factor || , scale=1.0]])

`$name` is replaced by the rendered binding. A segment `[[ a || b || c ]]` becomes the first
alternative whose variables are all bound (an alternative without variables always is); when none
is, the segment disappears. A `$name` outside any segment must be bound.
Special variables: `$callee` and `$args` are the source of the root call's function and arguments
(the first positional one read once into a list under the name a constraint binds as `$materialized`,
`name := list(<argument>)`, or `name := <argument>` where `$materialized_as_is` says it already makes a
new list, and a `**` one replaced by the dict a constraint binds as `$merged`, where
they bind them).
"""

from __future__ import annotations

import re
from collections.abc import Callable

_VAR = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)")


class TemplateError(ValueError):
    pass


def _segments(template: str) -> list[tuple[bool, str]]:
    """Split into (is_segment, text) parts; segments do not nest."""
    parts: list[tuple[bool, str]] = []
    pos = 0
    while True:
        start = template.find("[[", pos)
        if start < 0:
            parts.append((False, template[pos:]))
            return parts
        end = template.find("]]", start)
        if end < 0:
            raise TemplateError(f"unclosed [[ in template: {template!r}")
        parts.append((False, template[pos:start]))
        parts.append((True, template[start + 2:end]))
        pos = end + 2


def render_template(template: str, lookup: Callable[[str], str | None]) -> str:
    """Fill a template; `lookup(name)` returns the Python text of a binding or None if unbound."""
    out: list[str] = []
    for is_segment, text in _segments(template):
        if not is_segment:
            out.append(_fill(text, lookup, required=True))
            continue
        for alternative in text.split("||"):
            names = _VAR.findall(alternative)
            if all(lookup(n) is not None for n in names):
                alt = alternative.strip()
                if alt.startswith(","):
                    alt = ", " + alt[1:].lstrip()
                out.append(_fill(alt, lookup, required=True))
                break
    return "".join(out)


def _fill(text: str, lookup: Callable[[str], str | None], required: bool) -> str:
    def replace(m: re.Match[str]) -> str:
        value = lookup(m.group(1))
        if value is None:
            raise TemplateError(f"${m.group(1)} is not bound")
        return value

    return _VAR.sub(replace, text)
