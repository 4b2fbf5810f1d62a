"""Findings as SARIF 2.1.0 (OASIS), for code-scanning UIs such as GitHub's.

One run; the driver lists the rules that ran; one result per finding. A result's `locations` are
the distinct source positions of the matched nodes (together they cover every statement of the
match; the first is the topmost), `relatedLocations` the call sites through which inlined helpers
were reached. `properties.status` is the finding's status; near-misses carry `properties.reason`,
guarded rewrites `properties.guard`, findings suppressed by `# adopter: ignore` in the source SARIF's
`suppressions`. `partialFingerprints` identify a finding across commits by rule, file and the
matched source text (not its line numbers).

Columns and fingerprints need the source files. `places` computes them where the files are (a
scan's checkout) as plain data (`Place`); `to_sarif(..., places=...)` writes a log from them later,
without the files (the App's publish step), equal to the one written beside the files.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.dsl.ir import Pos
from engine.match.matcher import Finding
from engine.match.rule import Rule
from engine.report.links import adopter_version, rule_help_url

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
ROOT_BASE_ID = "SRCROOT"
FINGERPRINT_KEY = "adopterMatchHash/v1"


def tool_version() -> str:
    return adopter_version()


@dataclass(frozen=True)
class Region:
    """A span of a file as SARIF states it: 1-based lines; 1-based columns in Unicode code points
    (None: the line range only, where no node position was known)."""

    path: str  # relative to the scanned root, `/`-separated
    start_line: int
    end_line: int
    start_column: int | None = None
    end_column: int | None = None

    def to_dict(self) -> dict:
        return {"path": self.path, "start_line": self.start_line, "start_column": self.start_column,
                "end_line": self.end_line, "end_column": self.end_column}

    @classmethod
    def from_dict(cls, data: Mapping) -> Region:
        return cls(path=str(data["path"]), start_line=int(data["start_line"]), end_line=int(data["end_line"]),
                   start_column=data.get("start_column"), end_column=data.get("end_column"))


@dataclass(frozen=True)
class Place:
    """Where a finding is, in SARIF's terms: its locations (the matched nodes, topmost first), related
    locations (call sites of inlined helpers) and its `partialFingerprints` value."""

    locations: tuple[Region, ...]
    related: tuple[Region, ...]
    fingerprint: str  # hash of rule, file and matched text; `:n` for the n-th equal one in the scan


class _Sources:
    """Source lines of the scanned files, for columns and fingerprints. Lines come from `texts` when
    given (path -> text), else from the file under `base`; unreadable files give no lines."""

    def __init__(self, base: Path, texts: Mapping[str, str] | None) -> None:
        self.base = base
        self.texts = dict(texts or {})
        self.cache: dict[str, list[str] | None] = {}

    def lines(self, rel: str) -> list[str] | None:
        if rel not in self.cache:
            text = self.texts.get(rel)
            if text is None:
                try:
                    text = (self.base / rel).read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError):
                    text = None
            self.cache[rel] = text.splitlines() if text is not None else None
        return self.cache[rel]

    def column(self, rel: str, line: int, byte_col: int) -> int:
        """1-based column in Unicode code points of a 0-based UTF-8 byte offset (as `ast` gives)."""
        lines = self.lines(rel)
        if lines is None or not 1 <= line <= len(lines):
            return byte_col + 1
        return len(lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", errors="ignore")) + 1

    def matched_text(self, rel: str, positions: Iterable[Pos]) -> str | None:
        """The matched source lines without any whitespace (indentation and spacing do not count)."""
        lines = self.lines(rel)
        if lines is None:
            return None
        numbers = sorted({n for p in positions for n in range(p.line, p.end_line + 1)})
        picked = ["".join(lines[n - 1].split()) for n in numbers if 1 <= n <= len(lines)]
        return "\n".join(p for p in picked if p)


def _relative(path: str, base: Path) -> str:
    p = Path(path)
    if p.is_absolute():
        try:
            return p.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            return p.as_posix()
    return p.as_posix()


def _mode(rule: Rule) -> str:
    if rule.detect_only:
        return "detect-only"
    return "rewrite-guarded" if rule.guard else "rewrite"


def _rule_descriptor(rule: Rule, help_base: str | None) -> dict:
    descriptor: dict = {
        "id": rule.id,
        "name": rule.id,
        "shortDescription": {"text": rule.summary},
        "helpUri": rule_help_url(rule.id, help_base),
        "defaultConfiguration": {"level": "warning"},
        "properties": {
            "kernel": rule.kernel,
            "fix": _mode(rule),
            "requires": list(rule.requires),
            "imports": list(rule.imports),
            "tags": ["performance", "pytorch", "detect-only" if rule.detect_only else "rewrite"],
        },
    }
    first_paragraph = rule.doc.strip().split("\n\n", 1)[0]
    if first_paragraph:
        descriptor["fullDescription"] = {"text": " ".join(first_paragraph.split())}
    return descriptor


def _message(finding: Finding) -> str:
    text = finding.message
    if finding.status == "near-miss":
        return f"{text} (near-miss, not rewritten: {finding.reason})" if finding.reason else f"{text} (near-miss)"
    if finding.status == "guarded":
        return f"{text} (rewritten behind a guard: the original code runs when {finding.guard_text})"
    if finding.status == "detected":
        return f"{text} (detected; this rule does not rewrite)"
    if finding.status == "already-fused":
        return f"{text} (not rewritten: {finding.reason})"
    if finding.status == "suppressed":
        return f"{text} (suppressed in the source: {finding.reason})"
    return text


def _region(pos: Pos, sources: _Sources, base: Path, fallback_file: str) -> Region:
    rel = _relative(pos.file or fallback_file, base)
    return Region(path=rel, start_line=pos.line, start_column=sources.column(rel, pos.line, pos.col),
                  end_line=pos.end_line, end_column=sources.column(rel, pos.end_line, pos.end_col))


def _location(region: Region) -> dict:
    span: dict = {"startLine": region.start_line}
    if region.start_column is not None:
        span["startColumn"] = region.start_column
    span["endLine"] = region.end_line
    if region.end_column is not None:
        span["endColumn"] = region.end_column
    return {"physicalLocation": {"artifactLocation": {"uri": region.path, "uriBaseId": ROOT_BASE_ID},
                                 "region": span}}


def _distinct_positions(positions: Iterable[Pos]) -> list[Pos]:
    unique = {(p.file, p.line, p.col, p.end_line, p.end_col): p for p in positions}
    return [unique[k] for k in sorted(unique)]


def _fingerprint(finding: Finding, rel: str, positions: list[Pos], sources: _Sources) -> str:
    matched = sources.matched_text(rel, [p for p in positions if _relative(p.file or rel, sources.base) == rel])
    if matched is None:  # no source to read: fall back to where the match is, by name
        matched = f"{finding.cls}.{finding.method}:{len(positions)}"
    digest = hashlib.sha256("\0".join((finding.rule_id, rel, matched)).encode("utf-8")).hexdigest()
    return digest[:32]


def _base(root: Path | str) -> Path:
    root = Path(root)
    return root.parent if root.is_file() or root.suffix == ".py" else root


def _places(findings: Sequence[Finding], base: Path, reader: _Sources,
            given: Sequence[Place | None] | None = None) -> list[Place]:
    """Each finding's place: the one given, else computed from the sources `reader` has."""
    out: list[Place] = []
    seen: dict[str, int] = {}
    for i, finding in enumerate(findings):
        if given is not None and given[i] is not None:
            out.append(given[i])
            continue
        rel = _relative(finding.file, base)
        positions = _distinct_positions(finding.locations)
        if positions:
            locations = tuple(_region(p, reader, base, rel) for p in positions)
        else:  # no node positions: the finding's line range
            locations = (Region(path=rel, start_line=finding.line, end_line=finding.end_line),)
        related = tuple(_region(p, reader, base, rel) for p in _distinct_positions(finding.related))
        fingerprint = _fingerprint(finding, rel, positions, reader)
        seen[fingerprint] = seen.get(fingerprint, 0) + 1  # identical code twice in a file: :1, :2
        out.append(Place(locations=locations, related=related, fingerprint=f"{fingerprint}:{seen[fingerprint]}"))
    return out


def places(findings: Iterable[Finding], root: Path | str, *, sources: Mapping[str, str] | None = None) -> list[Place]:
    """Each finding's `Place` (columns, fingerprint), read from the files under `root` (or `sources`),
    in the order of `findings`: what `to_sarif` writes for them, as data to keep."""
    base = _base(root)
    return _places(list(findings), base, _Sources(base, sources))


def to_sarif(findings: Iterable[Finding], rules: Iterable[Rule], root: Path | str, *,
             sources: Mapping[str, str] | None = None, help_base: str | None = None,
             places: Sequence[Place | None] | None = None) -> dict:
    """The SARIF 2.1.0 log (a JSON-ready dict) of `findings` from a scan of `root` with `rules`.

    File paths in findings are relative to `root` (to its folder when `root` is a file), as
    `engine.scan.scan_path` reports them. `sources` (relative path -> text) supplies file texts
    instead of reading them under `root`; texts are used for code-point columns and fingerprints.
    `places` (one per finding, None for one to compute) are positions and fingerprints computed
    earlier by `places()`, where the files were. `help_base` is the documentation folder's absolute
    URL (default: `ADOPTER_DOCS_URL`, else the published docs); each rule's `helpUri` is its section
    of `rules.md` there."""
    base = _base(root)
    reader = _Sources(base, sources)
    finding_list = list(findings)
    if places is not None and len(places) != len(finding_list):
        raise ValueError(f"{len(places)} places for {len(finding_list)} findings")
    rule_list = list(rules)
    index = {rule.id: i for i, rule in enumerate(rule_list)}
    results = []
    for finding, place in zip(finding_list, _places(finding_list, base, reader, places), strict=True):
        properties: dict = {"status": finding.status, "class": finding.cls, "method": finding.method}
        if finding.status in ("near-miss", "already-fused"):
            properties["reason"] = finding.reason or ""
        if finding.guard_text is not None:
            properties["guard"] = finding.guard_text
        result: dict = {
            "ruleId": finding.rule_id,
            "level": "note" if finding.status in ("near-miss", "already-fused") else "warning",
            "message": {"text": _message(finding)},
            "locations": [_location(region) for region in place.locations],
            "partialFingerprints": {FINGERPRINT_KEY: place.fingerprint},
            "properties": properties,
        }
        if finding.status == "suppressed":  # `# adopter: ignore[...]` in the source
            result["level"] = "note"
            result["suppressions"] = [{"kind": "inSource", "justification": finding.reason or ""}]
        if finding.rule_id in index:
            result["ruleIndex"] = index[finding.rule_id]
        if place.related:
            result["relatedLocations"] = [
                {"id": number, **_location(region),
                 "message": {"text": "call through which the matched helper code runs (inlined)"}}
                for number, region in enumerate(place.related, 1)]
        results.append(result)
    run: dict = {
        "tool": {"driver": {
            "name": "adopter",
            "version": tool_version(),
            "semanticVersion": tool_version(),
            "rules": [_rule_descriptor(rule, help_base) for rule in rule_list],
        }},
        "columnKind": "unicodeCodePoints",
        "results": results,
    }
    if base.is_absolute() or base.exists():
        run["originalUriBaseIds"] = {ROOT_BASE_ID: {"uri": base.resolve().as_uri().rstrip("/") + "/"}}
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}
