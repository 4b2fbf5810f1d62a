"""Split a string literal that cannot fit on a line into two implicitly concatenated ones.

A statement moved one block deeper under a guard can push a long message past the line length,
and no formatter splits strings. `f"Attention mask should be {a}, but is {b}"` becomes
`f"Attention mask should be {a}," f" but is {b}"` (split at the space nearest the middle, outside
any `{...}`), which means the same; the formatter then puts the parts on lines of their own.
"""

from __future__ import annotations

import libcst as cst

MIN_LENGTH = 40  # shorter literals are left as they are


def _split_text(text: str) -> int | None:
    """Where to split `text` (an index just after a space), nearest its middle; None if nowhere."""
    middle = len(text) // 2
    spaces = [i + 1 for i, ch in enumerate(text) if ch == " " and 0 < i < len(text) - 1]
    return min(spaces, key=lambda i: abs(i - middle)) if spaces else None


class _Splitter(cst.CSTTransformer):
    def visit_ConcatenatedString(self, node: cst.ConcatenatedString) -> bool:  # noqa: N802
        return False  # its parts are split by leave_ConcatenatedString (a left part cannot be a concatenation)

    def leave_ConcatenatedString(self, original, updated):  # noqa: N802
        return self._parts(updated)

    def _parts(self, node):
        """A concatenation with each long part split: a + (b + c) keeps the left a single literal."""
        right = node.right
        right = self._parts(right) if isinstance(right, cst.ConcatenatedString) else self._one(right)
        left = self._one(node.left)
        if isinstance(left, cst.ConcatenatedString):
            inner = cst.ConcatenatedString(left=left.right, right=right)  # type: ignore[arg-type]
            return node.with_changes(left=left.left, right=inner)
        return node.with_changes(left=left, right=right)

    def _one(self, part):
        if isinstance(part, cst.SimpleString):
            return self.leave_SimpleString(part, part)
        if isinstance(part, cst.FormattedString):
            return self.leave_FormattedString(part, part)
        return part

    def leave_SimpleString(self, original, updated):  # noqa: N802 - libcst's visitor names
        value = updated.value
        prefix = value[:len(value) - len(value.lstrip("rRbBuU"))]
        body = value[len(prefix):]
        if len(value) < MIN_LENGTH or body[:3] in ('"""', "'''") or "\\" in body:
            return updated
        quote = body[0]
        text = body[1:-1]
        at = _split_text(text)
        if at is None:
            return updated
        return cst.ConcatenatedString(
            left=cst.SimpleString(f"{prefix}{quote}{text[:at]}{quote}"),
            right=cst.SimpleString(f"{prefix}{quote}{text[at:]}{quote}"),
            lpar=updated.lpar, rpar=updated.rpar)

    def leave_FormattedString(self, original, updated):  # noqa: N802
        if updated.start.endswith(('"""', "'''")):
            return updated
        code = cst.Module([]).code_for_node(updated)
        if len(code) < MIN_LENGTH:
            return updated
        parts = list(updated.parts)
        total = sum(len(cst.Module([]).code_for_node(p)) for p in parts)
        seen = 0
        best: tuple[int, int, int] | None = None  # (distance from the middle, part index, offset)
        for index, part in enumerate(parts):
            width = len(cst.Module([]).code_for_node(part))
            if isinstance(part, cst.FormattedStringText) and "\\" not in part.value:
                for i, ch in enumerate(part.value):
                    if ch == " " and (index, i) != (0, 0) and not (index == len(parts) - 1 and i == len(part.value) - 1):
                        distance = abs(seen + i + 1 - total // 2)
                        if best is None or distance < best[0]:
                            best = (distance, index, i + 1)
            seen += width
        if best is None:
            return updated
        _, index, offset = best
        text = parts[index].value  # type: ignore[attr-defined]
        left_parts = [*parts[:index], cst.FormattedStringText(text[:offset])]
        right_parts = [cst.FormattedStringText(text[offset:]), *parts[index + 1:]]
        left_parts = [p for p in left_parts if not (isinstance(p, cst.FormattedStringText) and not p.value)]
        right_parts = [p for p in right_parts if not (isinstance(p, cst.FormattedStringText) and not p.value)]
        if not left_parts or not right_parts:
            return updated
        return cst.ConcatenatedString(
            left=updated.with_changes(parts=left_parts, lpar=[], rpar=[]),
            right=updated.with_changes(parts=right_parts, lpar=[], rpar=[]),
            lpar=updated.lpar, rpar=updated.rpar)


def split_long_strings(stmt: cst.CSTNode) -> cst.CSTNode:
    """`stmt` with each long one-line string literal split in two."""
    return stmt.visit(_Splitter())
