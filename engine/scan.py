"""One scan: extract -> match -> synthesize over a file or a folder. The engine's public entry point
for the command line and the service (no web, database or queue imports here)."""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from engine.analysis import numbers
from engine.dsl.ir import Diagnostic, FileModel
from engine.extract.imports import module_name_for
from engine.match import Finding, find, load_rules
from engine.match.fused import extract_parsed, mark_already_fused
from engine.match.rule import Rule
from engine.repo_files import MAX_DEPTH, MAX_FILES, UnsafePath, read_inside, walk_files
from engine.suppression import apply_suppressions
from rules import RULES_DIR

# Folders never scanned (virtual environments, VCS, build output); hidden folders neither.
_SKIP_DIRS = frozenset({".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", "build", "dist", ".eggs"})

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
        choices = [*sorted(by_id), "default", "paper", "all"]
        named = []
        for word in unknown:
            close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
            named.append(f"{word} (did you mean {close[0]!r}?)" if close else word)
        raise RuleSelectionError(f"unknown rule id(s): {', '.join(named)}; known: {', '.join(sorted(by_id))}")
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


def _find(fm: FileModel, text: str, rules: list[Rule], parsed=None) -> list[Finding]:
    """The rules' findings in one extracted file, fallbacks of a fused path beside them marked
    `already-fused` (never rewritten), and those the source suppresses marked `suppressed`.
    `parsed`: the file's `ast` parse made on first use (`LazyParse`), shared with synthesis."""
    with numbers.source(fm.path, text):  # call sites and attributes read from the source
        findings = find([fm], rules)
    mark_already_fused(text, fm.module, findings, {r.id: r.kernel for r in rules if r.kernel}, parsed)
    apply_suppressions(findings, text)
    return findings


def scan_source(text: str, rules: list[Rule], path: str = "model.py", module: str = "model") -> tuple[list[Finding], str]:
    """Scan one source text; return the findings and the rewritten text (unchanged if none)."""
    from engine.synthesize import apply_findings

    fm, parsed = extract_parsed(text, path, module)  # one parse, for extraction and what follows
    findings = _find(fm, text, rules, parsed)
    rewrite = any(f.status in ("rewritten", "guarded") for f in findings)
    new_text = apply_findings(text, findings, parsed=parsed) if rewrite else text
    return findings, new_text


def _python_files(root: Path, result: ScanResult) -> tuple[Path, list[Path]]:
    """The Python files to scan and the folder their paths are relative to. Links are never
    followed (a link leaving the tree is reported); the walk stops at MAX_FILES files and does not
    descend past MAX_DEPTH folders, saying so."""
    if not root.is_dir():  # one file named by the user: the user's own choice, link or not
        return root.resolve().parent, [root.resolve()]
    base = root.resolve()
    walk = walk_files(base, skip_dir=lambda name: name in _SKIP_DIRS or name.startswith("."),
                      keep_file=lambda name: name.endswith(".py"), max_files=MAX_FILES, max_depth=MAX_DEPTH)
    for rel in walk.outside_links:
        result.diagnostics.append(Diagnostic(rel, 0, "symbolic link to outside the repository; not read", "error"))
    for rel in walk.skipped_deep:
        result.diagnostics.append(Diagnostic(rel, 0, f"not scanned: more than {MAX_DEPTH} folders deep", "error"))
    if walk.truncated:
        result.diagnostics.append(Diagnostic(".", 0, f"scan stopped after {MAX_FILES} files: the repository is "
                                             "larger than a scan reads (use include/exclude to narrow it)", "error"))
    return base, walk.files


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
    result = ScanResult(str(root))
    base, paths = _python_files(root, result)
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
            raw = read_inside(base, rel)
        except UnsafePath as exc:
            result.diagnostics.append(Diagnostic(rel, 0, f"not read: {exc}", "error"))
            continue
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
        fm, parsed = extract_parsed(text, rel, module_name_for(path))  # one parse for every step
        result.files_scanned += 1
        result.diagnostics.extend(fm.diagnostics)
        findings = _find(fm, text, chosen, parsed)
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
                new_text = apply_findings(text, findings, style, parsed=parsed)  # type: ignore[arg-type]
            except Exception as exc:  # a synthesis bug must not lose the scan
                result.diagnostics.append(Diagnostic(rel, 0, f"rewrite failed and was skipped: {exc}", "error"))
                continue
            if new_text != text:
                result.files[rel] = new_text
                result.originals[rel] = text
    return result
