"""Inline suppression: ``# adopter: ignore[RULE-ID, ...]`` (or a bare ``# adopter: ignore``) in a
comment on a finding's first line turns that finding into ``suppressed``: reported (text, JSON,
SARIF ``suppressions``), never rewritten. Comments are found with ``tokenize``, so the words inside
a string literal do not count."""

from __future__ import annotations

import io
import re
import tokenize

SUPPRESSED = "suppressed"
_MARK = re.compile(r"#\s*adopter:\s*ignore\b(?:\[(?P<ids>[^\]]*)\])?", re.IGNORECASE)


def suppression_marks(text: str) -> dict[int, tuple[frozenset[str] | None, str]]:
    """Line number -> (the rule ids it names, None for all; the comment as written)."""
    if "adopter" not in text:
        return {}
    marks: dict[int, tuple[frozenset[str] | None, str]] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type != tokenize.COMMENT:
                continue
            found = _MARK.search(token.string)
            if found is None:
                continue
            ids = found.group("ids")
            names = None if ids is None else frozenset(i.strip() for i in ids.split(",") if i.strip())
            marks[token.start[0]] = (names, found.group(0))
    except (tokenize.TokenError, SyntaxError):  # a file that does not tokenize has no findings either
        return {}
    return marks


def apply_suppressions(findings: list, text: str) -> None:
    """Mark the findings of one file's ``text`` that a comment on their first line suppresses."""
    marks = suppression_marks(text)
    if not marks:
        return
    for finding in findings:
        mark = marks.get(finding.line)
        if mark is None:
            continue
        names, comment = mark
        if names is not None and finding.rule_id not in names:
            continue
        was = finding.status + (f": {finding.reason}" if finding.reason else "")
        finding.status = SUPPRESSED
        finding.reason = f"`{comment}` on line {finding.line} (would have been {was})"
