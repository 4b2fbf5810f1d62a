"""Synthesis: rewrite source for the findings that scope analysis proved safe.

`apply_findings` edits one file. The findings are grouped by the function that holds them; each such
region is parsed once with libcst and every finding in it becomes an edit computed against that one
parse; the edits are made together in one pass, the region is checked to compile, and put back in
the file. Two findings whose edits touch the same statements cannot both be computed against one
parse: the lower one is made, and the other is matched again on the edited text in a further round.
A guarded rewrite keeps the original code under its guard, where another match may now be made: its
class is matched again too (these are the cases that parse a region twice); a class whose regions
were all made in one round is not extracted again. A finding that cannot be rewritten is turned into a
near-miss with the reason; the rest still apply. Then the imports the new code needs are added, and
imports and parameter-free modules it orphaned are removed.
"""

from __future__ import annotations

import ast

from engine.dsl.ir import Var
from engine.extract.extractor import TOPLEVEL
from engine.match.matcher import Finding
from engine.synthesize.context import FileContext
from engine.synthesize.imports import tidy_imports
from engine.synthesize.region import Region, regions
from engine.synthesize.rewrite import Edit, SynthesisError, Synthesizer
from engine.synthesize.style import Style, find_style
from engine.synthesize.template import TemplateError

MAX_ROUNDS = 20

REWRITABLE = ("rewritten", "guarded")


def _identity(f: Finding) -> tuple:
    return (f.rule_id, f.cls, f.method, f.line)


def _inside(finding: Finding, other: Finding) -> bool:
    """Whether `finding`'s match shares nodes with `other`'s and reads a value `other`'s computes."""
    mine, theirs = finding.match, other.match
    if mine is None or theirs is None or mine is theirs or finding.rule_id == other.rule_id:
        return False
    if not {id(n) for n in mine.nodes.values()} & {id(n) for n in theirs.nodes.values()}:
        return False
    made_here = {o for n in mine.nodes.values() for o in n.outputs}
    made_there = {o for n in theirs.nodes.values() for o in n.outputs} - made_here
    return any(isinstance(v, Var) and v.name in made_there for v in mine.bindings.values())


class _File:
    """One file being rewritten: what was applied, what failed and why."""

    def __init__(self, text: str, context: FileContext) -> None:
        self.text = text
        self.context = context
        self.failed: dict[tuple, str] = {}
        self.applied_rules: dict[str, object] = {}
        self.codes: list[str] = []
        # findings left for another round because an edit made here overlaps theirs: finding -> the
        # rule of that edit; and how many edits each (rule, class, method) had made
        self.overlapped: dict[int, tuple[Finding, str]] = {}
        self.made: dict[tuple, int] = {}

    def rewrite_region(self, lines: list[str], region: Region, path: str) -> tuple[list[str], bool]:
        """The region's new lines, and whether some finding was left for another round."""
        original = lines[region.start - 1:region.end]
        try:
            synth = Synthesizer(region.text(lines), lines, region.offset, self.context)
            synth.path = path
        except Exception as exc:  # libcst cannot parse this function: nothing in it is rewritten
            for f in region.findings:
                self.failed[_identity(f)] = f"the function does not parse for rewriting: {exc}"
            return original, False
        edits: list[tuple[Finding, Edit]] = []
        deferred = False
        ordered = sorted(region.findings, key=lambda f: (f.line, f.end_line), reverse=True)
        # a match whose input another match computes, their nodes shared (an RMSNorm of `x - mean`
        # inside a LayerNorm), is the inner part of that computation: the outer one is made first
        inner = {id(f) for f in ordered if any(_inside(f, other) for other in ordered)}
        ordered.sort(key=lambda f: id(f) in inner)
        for finding in ordered:
            try:
                edit = self._edit(synth, finding)
            except (SynthesisError, TemplateError) as exc:
                self.failed[_identity(finding)] = str(exc)
                continue
            except Exception as exc:  # a synthesis bug must not lose the other findings
                self.failed[_identity(finding)] = f"synthesis failed: {type(exc).__name__}: {exc}"
                continue
            winner = next((f for f, other in edits if edit.overlaps(other)), None)
            if winner is not None:
                deferred = True  # made on the edited text in the next round
                self.overlapped.setdefault(id(finding), (finding, winner.rule_id))
                continue
            edits.append((finding, edit))
        if not edits:
            return original, deferred
        code = self._compiling(synth, edits, path)
        if code is None:
            return original, deferred
        for finding, edit in edits:
            if _identity(finding) not in self.failed:
                self.applied_rules[finding.rule_id] = finding.match.rule  # type: ignore[union-attr]
                self.codes.append(edit.code)
                key = (finding.rule_id, finding.cls, finding.method)
                self.made[key] = self.made.get(key, 0) + 1
                # the original code stays under a guard, where the guard's facts may let another
                # rule (or this one, on the other path) match it: matched again in the next round
                deferred = deferred or finding.status == "guarded"
        return region.lines_of(code, lines), deferred

    @staticmethod
    def _edit(synth: Synthesizer, finding: Finding) -> Edit:
        """The edit of `finding`; where synthesis cannot write its match, the edit of the next of the
        same root's other matches that it can (the finding then reports that one)."""
        from engine.match.scope import adopt, fallback

        try:
            return synth.edit(finding)
        except (SynthesisError, TemplateError) as exc:
            if not finding.fallbacks:
                raise
            first = exc
        while (other := fallback(finding)) is not None:
            try:
                edit = synth.edit(other)
            except (SynthesisError, TemplateError):
                finding.fallbacks = other.fallbacks
                continue
            adopt(finding, other)
            return edit
        raise first

    def _compiling(self, synth: Synthesizer, edits: list[tuple[Finding, Edit]], path: str) -> str | None:
        code = synth.apply([e for _, e in edits])
        if _compiles(code, path):
            return code
        # some edit breaks the code: find it by making each alone (error path only)
        good = []
        for finding, edit in edits:
            if _compiles(synth.apply([edit]), path):
                good.append((finding, edit))
            else:
                self.failed[_identity(finding)] = "the rewritten code does not compile"
        if not good:
            return None
        code = synth.apply([e for _, e in good])
        return code if _compiles(code, path) else None


def _compiles(code: str, path: str) -> bool:
    try:
        compile(code, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def apply_findings(text: str, findings: list[Finding], style: Style | None = None, parsed=None,
                   aliases: dict[str, str] | None = None) -> str:
    """`text` with `findings` rewritten (see the module's docstring). `parsed`: the caller's `ast`
    parse of `text` made on first use (`engine.match.fused.LazyParse`), where it has one.
    `aliases`: where given, the file's import aliases are used only where they agree with these
    (a `# Copied from` block spells names as its source's file does)."""
    from engine.match import find
    from engine.match.fused import LazyParse, extract_parsed, mark_already_fused
    from engine.suppression import apply_suppressions

    todo = [f for f in findings if f.status in REWRITABLE and f.match is not None]
    if not todo:
        return text
    rules = list({id(f.match.rule): f.match.rule for f in todo}.values())  # type: ignore[union-attr]
    file = todo[0].match.file  # type: ignore[union-attr]
    original = text
    # the one ast parse: aliases, import positions, the classes' spans (an outline where the file
    # was not parsed whole already)
    tree = parsed() if parsed is not None and parsed.made else \
        _outline(text, file) or (parsed or LazyParse(text))()
    context = FileContext.of(tree, text, style)
    if aliases is not None:
        context.aliases = {name: local for name, local in context.aliases.items() if aliases.get(name) == local}
    state = _File(text, context)
    moved = _LineMap()
    for round_number in range(MAX_ROUNDS):
        lines = text.splitlines(keepends=True)
        new_lines = list(lines)
        again: set[str | None] = set()  # the classes of the regions to match again
        for region in reversed(regions(todo, len(lines))):  # bottom-up: earlier lines do not move
            replaced, deferred = state.rewrite_region(lines, region, file.path)
            new_lines[region.start - 1:region.end] = replaced
            moved.add(round_number, region.start, region.end, len(replaced))
            if deferred:
                again |= {f.cls for f in region.findings}
        text = "".join(new_lines)
        if not again:
            break
        # only the classes with a region left for another round are extracted and matched again:
        # the others' edits are made and their failures known
        classes_text = _only_classes(text, again, tree, moved)
        fm, classes_parsed = extract_parsed(classes_text, file.path, file.module)
        current = find([fm], rules, near_misses=False)
        # matched again: a fallback beside a fused path stays one, `# adopter: ignore` still holds
        mark_already_fused(classes_text, file.module, current, {r.id: r.kernel for r in rules if r.kernel},
                           classes_parsed)
        apply_suppressions(current, classes_text)
        todo = [f for f in current
                if f.status in REWRITABLE and f.match is not None and _identity(f) not in state.failed]
        if not todo:
            break
    if text != original:
        imports = list(dict.fromkeys(line for rule in state.applied_rules.values()
                                     for line in rule.imports))  # type: ignore[attr-defined]
        if tree is not None:
            text = tidy_imports(original, tree, text, moved, imports, _names_in(state.codes), state.context.aliases,
                                is_package_init=file.path.endswith("__init__.py"),
                                kept=moved.kept(original.count("\n") + 1))
    for f in findings:
        reason = state.failed.get(_identity(f))
        if reason is not None:
            f.status = "near-miss"
            f.reason = f"not rewritten: {reason}"
    _report_overlapped(findings, state)
    return text


def _report_overlapped(findings: list[Finding], state: _File) -> None:
    """A finding whose edit overlapped another rule's and that no later round made (its code is
    gone into that rewrite: an RMSNorm of `x - mean` inside the LayerNorm rewritten) is reported as
    not rewritten, naming that rule, not as rewritten."""
    made = dict(state.made)
    for f in findings:
        key = (f.rule_id, f.cls, f.method)
        if id(f) not in state.overlapped or f.status not in REWRITABLE:
            made[key] = made.get(key, 0) - (f.status in REWRITABLE)  # the edits made in the first round
    for f in sorted((f for f in findings if id(f) in state.overlapped and f.status in REWRITABLE),
                    key=lambda f: f.line):
        key = (f.rule_id, f.cls, f.method)
        if made.get(key, 0) > 0:
            made[key] -= 1  # made again on the edited text
            continue
        f.status = "near-miss"
        f.reason = f"not rewritten: its code is rewritten by {state.overlapped[id(f)][1]} here"


def _outline(text: str, file) -> ast.Module | None:
    """The `ast` parse of `text` that synthesis needs, for a fraction of a whole one: the module's
    top level and every `__init__` as written, every other function that extraction found (`file`,
    its positions) written `def _(): pass` on its last line with its other lines blank, so that
    every line keeps its number and the classes their spans. None where that does not parse."""
    if "\r" in text:  # ast's lines are the text's `\n`-lines only without a carriage return
        return None
    spans = sorted({(m.pos.line, m.pos.end_line) for c in file.classes for m in c.methods
                    if m.pos is not None and not m.name.endswith("__init__") and m.name != TOPLEVEL},
                   key=lambda s: (s[0], -s[1]))
    lines = text.split("\n")
    last = 0
    for first, end in spans:
        if first <= last:
            continue  # inside a function already outlined
        head = lines[first - 1] if 0 < first <= end <= len(lines) else ""
        body = head.lstrip()
        if not (body.startswith("def ") or body.startswith("async def ")):
            return None
        for i in range(first - 1, end - 1):
            lines[i] = ""
        lines[end - 1] = head[:len(head) - len(body)] + "def _(): pass"
        last = end
    if not last:
        return None
    try:
        return ast.parse("\n".join(lines))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _only_classes(text: str, names: set[str], tree: ast.Module | None, moved: _LineMap) -> str:
    """`text` with every top-level class but `names` blanked out line for line (positions stay as
    they are): matching again after an edit extracts only the classes that were edited, with the
    module's functions and imports that they may use. The classes are found in the original's
    parse `tree`, their lines through `moved` (a class not edited lies outside every region)."""
    if tree is None:
        return text
    lines = text.splitlines(keepends=True)
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name not in names:
            first = moved(min([stmt.lineno, *(d.lineno for d in stmt.decorator_list)]))
            last = moved(stmt.end_lineno or stmt.lineno)
            if first is None or last is None:
                continue
            for i in range(first - 1, last):
                lines[i] = "\n"
    return "".join(lines)


class _LineMap:
    """Where a line of the original is after regions were replaced, round after round (None inside
    a replaced region). Each round's regions are in the lines of the text that round started from."""

    def __init__(self) -> None:
        self.rounds: dict[int, list[tuple[int, int, int]]] = {}  # round -> (start, end, new length)

    def add(self, round_number: int, start: int, end: int, new_length: int) -> None:
        self.rounds.setdefault(round_number, []).append((start, end, new_length))

    def kept(self, line_count: int) -> list[tuple[int, int, int]]:
        """The runs of the original's lines 1..`line_count` that lie outside every replaced region,
        as (first, last, shift): line L of such a run is line L + shift now (what `self(L)` says)."""
        spans = [(1, line_count, 0)]
        for _, changes in sorted(self.rounds.items()):
            out = []
            for first, last, shift in spans:
                pieces = [(first, last)]
                for start, end, _ in changes:  # this round's regions, in the lines it started from
                    cut = []
                    for a, b in pieces:
                        if b + shift < start or a + shift > end:
                            cut.append((a, b))
                            continue
                        if a + shift < start:
                            cut.append((a, start - 1 - shift))
                        if b + shift > end:
                            cut.append((end + 1 - shift, b))
                    pieces = cut
                for a, b in pieces:  # no region inside a piece: every one is above it or below
                    moved = sum(n - (end - start + 1) for start, end, n in changes if end < a + shift)
                    out.append((a, b, shift + moved))
            spans = out
        return spans

    def __call__(self, line: int) -> int | None:
        for _, changes in sorted(self.rounds.items()):
            shift = 0
            for start, end, new_length in changes:
                if start <= line <= end:
                    return None
                if end < line:
                    shift += new_length - (end - start + 1)
            line += shift
        return line


def _names_in(codes: list[str]) -> set[str]:
    names: set[str] = set()
    for code in codes:
        try:
            tree = ast.parse(code, mode="eval")
        except SyntaxError:
            continue
        names.update(n.id for n in ast.walk(tree) if isinstance(n, ast.Name))
    return names


__all__ = ["SynthesisError", "Style", "apply_findings", "find_style"]
