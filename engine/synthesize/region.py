"""The part of a file that synthesis parses: the functions that hold its findings.

A libcst parse of a whole file costs several times an `ast.parse` of it (and the extraction that
found the findings has parsed it already); the edits of a finding never leave the function that
holds it, so only that function's lines are parsed, once for all its findings. An indented method
is parsed under an `if 1:` line, which keeps its lines (and so its string literals) exactly as
they are.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.match.matcher import Finding

_PREFIX = "if 1:\n"


@dataclass
class Region:
    start: int  # first line in the file (1-based)
    end: int  # last line, inclusive
    indented: bool
    findings: list[Finding] = field(default_factory=list)

    def text(self, lines: list[str]) -> str:
        body = "".join(lines[self.start - 1:self.end])
        if not body.endswith("\n"):
            body += "\n"
        return (_PREFIX + body) if self.indented else body

    @property
    def offset(self) -> int:
        """What to add to a line of `text()` to get the file's line."""
        return self.start - (2 if self.indented else 1)

    def lines_of(self, code: str, lines: list[str]) -> list[str]:
        """The file's lines for this region from the edited region text `code`."""
        if self.indented:
            code = code[len(_PREFIX):]
        last = lines[self.end - 1] if self.end - 1 < len(lines) else "\n"
        if not last.endswith("\n") and code.endswith("\n"):
            code = code[:-1]
        return code.splitlines(keepends=True)


def regions(findings: list[Finding], line_count: int) -> list[Region]:
    """The regions holding `findings`, in file order; a region inside another (a function of the
    module's top-level code) is merged into it."""
    spans = []
    for f in findings:
        method = f.match.method if f.match is not None else None
        pos = method.pos if method is not None else None
        if pos is None:
            spans.append((1, line_count, 0, f))
        else:
            spans.append((pos.line, pos.end_line, pos.col, f))
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[Region] = []
    for start, end, col, f in spans:
        if out and start <= out[-1].end:
            out[-1].end = max(out[-1].end, end)
            out[-1].findings.append(f)
        else:
            out.append(Region(start, end, col > 0, [f]))
    return out
