"""One scan: extract -> match -> synthesize over a file or a folder. The engine's public entry point
for the command line and the service (no web, database or queue imports here)."""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from engine.dsl.ir import Diagnostic, FileModel
from engine.extract import extract_source, iter_python_files
from engine.extract.imports import module_name_for
from engine.match import Finding, find, load_rules
from engine.match.rule import Rule
from rules import RULES_DIR

MAX_FILE_BYTES = 2_000_000  # larger Python files are skipped with a diagnostic (generated code)


class RuleSelectionError(ValueError):
    pass


def select_rules(spec: str = "default") -> list[Rule]:
    """`default` (the current-kernel rules), `paper` (rules/paper), `all`, or comma-separated ids."""
    every = load_rules(RULES_DIR)
    if spec == "all":
        return every
    if spec == "paper":
        return [r for r in every if r.id.startswith("paper/")]
    if spec == "default":
        return [r for r in every if not r.id.startswith("paper/")]
    wanted = [s.strip() for s in spec.split(",") if s.strip()]
    by_id = {r.id: r for r in every}
    unknown = [w for w in wanted if w not in by_id]
    if unknown:
        raise RuleSelectionError(f"unknown rule id(s): {', '.join(unknown)}; known: {', '.join(sorted(by_id))}")
    return [by_id[w] for w in wanted]


@dataclass
class ScanResult:
    root: str
    findings: list[Finding] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # relative path -> rewritten text (changed files only)
    originals: dict[str, str] = field(default_factory=dict)  # relative path -> original text (changed files)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    files_scanned: int = 0

    @property
    def diff(self) -> str:
        parts = []
        for rel in sorted(self.files):
            parts.extend(difflib.unified_diff(
                self.originals[rel].splitlines(keepends=True), self.files[rel].splitlines(keepends=True),
                fromfile=f"a/{rel}", tofile=f"b/{rel}"))
        return "".join(parts)

    def to_json(self) -> dict:
        return {
            "root": self.root,
            "files_scanned": self.files_scanned,
            "findings": [f.to_json() for f in self.findings],
            "changed_files": sorted(self.files),
            "diagnostics": [{"file": d.file, "line": d.line, "severity": d.severity, "message": d.message}
                            for d in self.diagnostics],
        }


def _included(rel: str, include: list[str] | None, exclude: list[str] | None) -> bool:
    if include and not any(fnmatch.fnmatch(rel, pat) or rel.startswith(pat.rstrip("/") + "/") for pat in include):
        return False
    if exclude and any(fnmatch.fnmatch(rel, pat) or rel.startswith(pat.rstrip("/") + "/") for pat in exclude):
        return False
    return True


def scan_source(text: str, rules: list[Rule], path: str = "model.py", module: str = "model") -> tuple[list[Finding], str]:
    """Scan one source text; return the findings and the rewritten text (unchanged if none)."""
    from engine.synthesize import apply_findings

    fm = extract_source(text, path, module)
    findings = find([fm], rules)
    new_text = apply_findings(text, findings) if any(f.status in ("rewritten", "guarded") for f in findings) else text
    return findings, new_text


def scan_path(root: Path | str, *, rules: str | list[Rule] = "default", include: list[str] | None = None,
              exclude: list[str] | None = None, rewrite: bool = True, progress=None) -> ScanResult:
    """Scan a file or folder. Files that do not parse or cannot be read become diagnostics; the
    rest is scanned."""
    from engine.synthesize import apply_findings, find_style

    root = Path(root)
    from engine.synthesize.contract import project_root, torch_contract

    styles: dict[Path, object] = {}  # folder -> the repository style configured for it
    contract = torch_contract(project_root(root))
    chosen = select_rules(rules) if isinstance(rules, str) else rules
    base = root if root.is_dir() else root.parent
    paths = iter_python_files(root)
    result = ScanResult(str(root))
    for index, path in enumerate(paths):
        rel = path.relative_to(base).as_posix()
        if not _included(rel, include, exclude):
            continue
        if progress is not None:
            progress(index, len(paths), rel)
        try:
            size = path.stat().st_size
            if size > MAX_FILE_BYTES:
                result.diagnostics.append(Diagnostic(rel, 0, f"skipped: {size} bytes is over the {MAX_FILE_BYTES}-byte limit"))
                continue
            raw = path.read_bytes()
        except OSError as exc:
            result.diagnostics.append(Diagnostic(rel, 0, f"cannot read: {exc.strerror}", "error"))
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            result.diagnostics.append(Diagnostic(rel, 0, "not UTF-8 text; skipped", "error"))
            continue
        if "torch" not in text and "nn." not in text:
            result.files_scanned += 1
            continue  # no PyTorch here: nothing any rule could match
        fm: FileModel = extract_source(text, rel, module_name_for(path))
        result.files_scanned += 1
        result.diagnostics.extend(fm.diagnostics)
        findings = find([fm], chosen)
        result.findings.extend(findings)
        for f in findings:
            requires = f.match.rule.requires if f.match is not None else ()
            if f.status not in ("rewritten", "guarded") or not requires:
                continue
            refused = contract.refuses(requires) if contract is not None else None
            if refused is not None:  # the rewrite would break the project's users on older torch
                f.status, f.reason = "near-miss", f"not rewritten: {refused}"
            else:
                f.message = f"{f.message} (needs {', '.join(requires)})"
        if rewrite and any(f.status in ("rewritten", "guarded") for f in findings):
            try:
                style = styles.get(path.parent)
                if style is None:
                    style = styles[path.parent] = find_style(path.parent)
                new_text = apply_findings(text, findings, style)  # type: ignore[arg-type]
            except Exception as exc:  # a synthesis bug must not lose the scan
                result.diagnostics.append(Diagnostic(rel, 0, f"rewrite failed and was skipped: {exc}", "error"))
                continue
            if new_text != text:
                result.files[rel] = new_text
                result.originals[rel] = text
    return result
