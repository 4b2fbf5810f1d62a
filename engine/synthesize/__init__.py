"""Synthesis: rewrite source for the findings that scope analysis proved safe.

`apply_findings` edits one file: it applies one finding, extracts and matches the result again, and
repeats (bottom-most finding first), so positions are always fresh and a second scan of the output
finds nothing left to rewrite. A finding that cannot be rewritten is turned into a near-miss with
the reason; the rest still apply.
"""

from __future__ import annotations

from engine.match.matcher import Finding
from engine.synthesize.rewrite import SynthesisError, Synthesizer, add_imports
from engine.synthesize.template import TemplateError

MAX_REWRITES_PER_FILE = 200

REWRITABLE = ("rewritten", "guarded")


def _identity(f: Finding) -> tuple:
    return (f.rule_id, f.cls, f.method, f.line)


def _span(finding: Finding) -> tuple[int, int]:
    """The lines a rewrite of `finding` reads or edits: its matched nodes and removed checks (the
    enclosing statements are found from these)."""
    places = [*finding.locations, *finding.checks]
    return min(p.line for p in places), max(p.end_line for p in places)


def apply_findings(text: str, findings: list[Finding]) -> str:
    from engine.extract import extract_source
    from engine.match import find
    from engine.suppression import apply_suppressions

    todo = [f for f in findings if f.status in REWRITABLE and f.match is not None]
    if not todo:
        return text
    rules = list({id(f.match.rule): f.match.rule for f in todo}.values())  # type: ignore[union-attr]
    file = todo[0].match.file  # type: ignore[union-attr]
    original = text
    applied_rules: dict[str, object] = {}
    failed: dict[tuple, str] = {}
    current = todo
    for _ in range(MAX_REWRITES_PER_FILE):
        candidates = sorted((f for f in current if f.status in REWRITABLE and _identity(f) not in failed),
                            key=lambda f: (f.line, f.end_line), reverse=True)
        if not candidates:
            break
        # Bottom-up: an edit never moves the lines above it, so every finding that ends above the
        # last edit can be applied to the edited text without matching again.
        edited_from = None
        for finding in candidates:
            if edited_from is not None and finding.end_line >= edited_from:
                continue  # overlaps an edit made in this round: matched again in the next one
            try:
                new_text = Synthesizer(text, _span(finding)).rewrite(finding)
                compile(new_text, file.path, "exec")
            except (SynthesisError, TemplateError, SyntaxError) as exc:
                failed[_identity(finding)] = str(exc)
                continue
            text = new_text
            edited_from = finding.line
            applied_rules[finding.rule_id] = finding.match.rule  # type: ignore[union-attr]
        if edited_from is None:
            break
        fm = extract_source(text, file.path, file.module)
        current = find([fm], rules, near_misses=False)
        apply_suppressions(current, text)  # matched again: `# adopter: ignore` still holds
    if text != original:
        imports = [line for rule in applied_rules.values() for line in rule.imports]  # type: ignore[attr-defined]
        text = add_imports(text, list(dict.fromkeys(imports)))
    for f in findings:
        reason = failed.get(_identity(f))
        if reason is not None:
            f.status = "near-miss"
            f.reason = f"not rewritten: {reason}"
    return text


__all__ = ["SynthesisError", "apply_findings"]
