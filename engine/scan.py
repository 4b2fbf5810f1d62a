"""One scan: extract -> match -> synthesize over a file or a folder. The engine's public entry point
for the command line and the service (no web, database or queue imports here)."""

from __future__ import annotations

import ast
import difflib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from engine.analysis import numbers
from engine.dsl.ir import Diagnostic, FileModel
from engine.extract import package as repo_package
from engine.extract.imports import module_name_for
from engine.extract.package import PackageIndex
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
    # the repository's files, for base classes defined in another file (engine/extract/package.py)
    package: PackageIndex | None = field(default=None, repr=False, compare=False)

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
    with numbers.source(fm.path, text, parsed):  # call sites and attributes read from the source
        findings = find([fm], rules)
    mark_already_fused(text, fm.module, findings, {r.id: r.kernel for r in rules if r.kernel}, parsed)
    apply_suppressions(findings, text)
    return findings


def scan_source(text: str, rules: list[Rule], path: str = "model.py", module: str = "model",
                package: PackageIndex | None = None) -> tuple[list[Finding], str]:
    """Scan one source text; return the findings and the rewritten text (unchanged if none).
    `package`: the repository the file at `path` belongs to, whose other files may define its
    classes' bases (engine/extract/package.py)."""

    with repo_package.using(package):
        fm, parsed = extract_parsed(text, path, module)  # one parse, for extraction and what follows
        findings = _find(fm, text, rules, parsed)
        new_text = _rewritten(text, findings, Path(path), _package_reader(package), parsed=parsed)
    return findings, new_text


def _rewritten(text: str, findings: list[Finding], path: Path, read, style=None, parsed=None) -> str:
    """The file rewritten by its applicable findings, after those whose kernel would never run
    with the class's default settings are reported instead (`_never_runs`): the same decision for
    a folder's scan and for one text (a rule's own rewrite of a file for its pull-request group).
    `read`: another file of the repository by its path (for configuration classes), or None."""
    from engine.synthesize import apply_findings

    known: dict[str, list[dict]] = {}  # class -> its settings by default and in each construction (`_never_runs`)
    _never_runs(findings, path, text, known, read)
    if not any(f.status in ("rewritten", "guarded") for f in findings):
        return text
    new_text = apply_findings(text, findings, style, parsed=parsed)  # type: ignore[arg-type]
    if _never_runs(findings, path, text, known, read):  # synthesis chose another match, whose guard does
        new_text = apply_findings(text, findings, style)  # type: ignore[arg-type]
    return new_text


def _package_reader(package: PackageIndex | None):
    """A reader of the repository's files by their path as the index names them, through the
    index (which reads only the repository's own files, never through a link out of it); None
    without one."""
    if package is None:
        return None

    def read(target: Path) -> str | None:
        found = package.source(target.as_posix())
        return found[0] if found is not None else None

    return read


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

    root = Path(root)
    from engine.synthesize.contract import project_root, torch_contract

    styles: dict[Path, object] = {}  # folder -> the repository style configured for it
    contract = torch_contract(project_root(root))
    chosen = select_rules(rules) if isinstance(rules, str) else rules
    result = ScanResult(str(root))
    base, paths = _python_files(root, result)
    modules: dict[str, str] = {}  # dotted module name -> relative path, for `# Copied from` marks
    marked: dict[str, str] = {}  # relative path -> text, of the files holding such marks
    # the repository's files, read only where a class derives from a class of another of them
    result.package = PackageIndex(base, [p.relative_to(base).as_posix() for p in paths])
    read = _package_reader(result.package)  # configuration classes of other files (only files inside `base`)
    with repo_package.using(result.package):
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
            module = module_name_for(path)
            modules.setdefault(module, rel)
            if "Copied from" in text:
                marked[rel] = text
            fm, parsed = extract_parsed(text, rel, module)  # one parse for every step
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
            if not rewrite:
                _never_runs(findings, Path(rel), text, {}, read)
            elif any(f.status in ("rewritten", "guarded") for f in findings):
                try:
                    new_text = _rewritten(text, findings, Path(rel), read, _style_for(styles, path), parsed)
                except Exception as exc:  # a synthesis bug must not lose the scan
                    result.diagnostics.append(Diagnostic(rel, 0, f"rewrite failed and was skipped: {exc}", "error"))
                    continue
                if new_text != text:
                    result.files[rel] = new_text
                    result.originals[rel] = text
        if rewrite and marked:
            _keep_copies_in_step(result, base, modules, marked, styles)
    return result


def _style_for(styles: dict, path: Path):
    """The repository style configured for `path`'s folder, looked up once per folder."""
    from engine.synthesize import find_style

    style = styles.get(path.parent)
    if style is None:
        style = styles[path.parent] = find_style(path.parent)
    return style


def _never_runs(findings: list[Finding], path: Path, text: str, known: dict[str, list[dict]], read=None) -> bool:
    """Report the guarded findings whose guard holds with the class's default settings
    (engine/synthesize/defaults.py) and in every construction of the class the repository holds
    (TabTransformer builds pytorch-tabular's attention with `keep_attn=False`): the kernel would
    never run; where another match of the same root is rewritable with a guard that does not hold
    so (the kernel on the branch the defaults take, `HaloAttn`'s `scale_pos_embed`), the finding
    reports that one instead. Whether a finding changed."""
    from engine.match.scope import adopt, fallback
    from engine.synthesize import defaults

    def always(guard: str, cls: str) -> bool:
        return all(defaults.holds_by_default(guard, settings) for settings in known[cls])

    found = False
    for f in findings:
        if f.status != "guarded" or not f.guard_text or "self." not in f.guard_text:
            continue
        if f.cls not in known:
            built = defaults.constructions(repo_package.current(), path.as_posix(), f.cls)
            known[f.cls] = [defaults.settings(path, text, f.cls, read, passed) for passed in [{}, *built]]
        if always(f.guard_text, f.cls):
            while (other := fallback(f)) is not None:
                if other.status == "rewritten" or not (other.guard_text and "self." in other.guard_text
                                                       and always(other.guard_text, f.cls)):
                    break
            if other is not None:
                adopt(f, other)
                found = True
                continue
            f.status = "near-miss"
            f.reason = (f"not rewritten: the original is kept when `{f.guard_text}`, which holds with the "
                        f"default settings ({defaults.default_terms(f.guard_text, known[f.cls][0])}): "
                        "the kernel would never run")
            found = True
    return found


def _keep_copies_in_step(result: ScanResult, base: Path, modules: dict[str, str], marked: dict[str, str],
                         styles: dict) -> None:
    """Withdraw the rewrites that would put a `# Copied from` block out of step with its source
    (engine/synthesize/copies.py), and rewrite those files again without them."""
    from engine.synthesize import apply_findings, copies
    from engine.synthesize.context import module_aliases

    blocks = [b for rel, text in marked.items() for b in copies.marked_blocks(text, rel)]
    if not blocks:
        return
    originals: dict[str, str] = dict(marked)

    def original(rel: str) -> str:
        if rel not in originals:
            originals[rel] = result.originals.get(rel) or read_inside(base, rel).decode("utf-8", "replace")
        return originals[rel]

    for block in blocks:
        where = copies.resolve(block.source, modules)
        if where is not None:
            try:
                original(where[0])
            except (UnsafePath, OSError):
                modules = {m: rel for m, rel in modules.items() if rel != where[0]}
    def rewrite_again(rel: str, aliases: dict[str, str] | None = None) -> None:
        kept = [f for f in result.findings if f.file == rel and f.status in ("rewritten", "guarded")]
        style = _style_for(styles, base / rel)
        text = originals[rel]
        new_text = apply_findings(text, kept, style, aliases=aliases) if kept else text  # type: ignore[arg-type]
        if new_text != text:
            result.files[rel] = new_text
            result.originals[rel] = text
        else:
            result.files.pop(rel, None)
            result.originals.pop(rel, None)

    aligned: set[str] = set()
    for _ in range(8):  # withdrawing one rewrite may put another pair out of step
        current = {rel: result.files.get(rel, text) for rel, text in originals.items()}
        problems = copies.disagreements(blocks, modules, originals, current)
        # a copy first spells the kernel as its source's file does (`nn.functional.` where the
        # source has no `F`): the same rewrite, written alike
        respell = {p.block.file: p.source[0] for p in problems
                   if p.source is not None and p.block.file not in aligned and p.block.file in result.files}
        if respell:
            for rel, source in respell.items():
                aligned.add(rel)
                rewrite_again(rel, module_aliases(ast.parse(original(source))))
            continue
        # then as the project's own `make fix-copies` would: the copy becomes its source's new code
        # after the mark's replacements (a comment the longer name no longer fits stays one line)
        followed = False
        for problem in problems:
            if problem.source is None or problem.block.file not in result.files:
                continue
            source_text = result.files.get(problem.source[0])
            raw = copies.raw_block(source_text, problem.source[1]) if source_text is not None else None
            new_text = copies.propagated(result.files[problem.block.file], problem.block, raw) if raw else None
            if new_text is not None and new_text != result.files[problem.block.file]:
                result.files[problem.block.file] = new_text
                followed = True
        if followed:
            continue
        touched: set[str] = set()
        for problem in problems:
            places = [(problem.block.file, problem.block.name)] + ([problem.source] if problem.source else [])
            for file, name in places:
                span = copies.block_span(originals[file], name)
                if span is None:
                    continue
                for f in result.findings:
                    if f.file != file or f.status not in ("rewritten", "guarded"):
                        continue
                    lines = [f.line, f.end_line, *(p.line for p in f.related)]
                    if any(span[0] <= line <= span[1] for line in lines):
                        f.status, f.reason = "near-miss", f"not rewritten: {problem.reason}"
                        touched.add(file)
        if not touched:
            return
        for rel in touched:
            rewrite_again(rel)
