"""Every rule's examples are its tests (Fixit's VALID/INVALID cases, Semgrep's `ruleid:`/`ok:`).

For each `*.rule` file under rules/ the suite checks:
  * the rule has at least one `example fires` and one `example near-miss`;
  * a `fires` example yields exactly `count` findings of the rule that are not near-misses
    ("detected" for a detect-only rule); with `expect`, the rewritten text equals it (trailing
    whitespace aside), compiles, and a second scan of it rewrites nothing;
  * a `near-miss` example yields no rewritten/guarded/detected finding of the rule, exactly
    `count` near-miss findings (`count 0`: no finding at all), and with `reason`, some near-miss
    finding's reason contains it.
"""

from __future__ import annotations

import pytest

from engine.match import RuleSyntaxError, load_rule
from engine.match.rule import Example, Rule
from engine.scan import scan_source
from rules import RULES_DIR

RULE_FILES = sorted(RULES_DIR.rglob("*.rule"))
_ERRORS: dict[str, str] = {}
RULES: list[Rule] = []
for _path in RULE_FILES:
    try:
        RULES.append(load_rule(_path))
    except RuleSyntaxError as exc:  # reported by test_rule_file_loads; the other files still run
        _ERRORS[_path.relative_to(RULES_DIR).as_posix()] = str(exc)
MATCHING_STATUSES = ("rewritten", "guarded", "detected")


def _examples(kind: str) -> list:
    params = []
    for rule in RULES:
        number = 0
        for example in rule.examples:
            if example.kind == kind:
                number += 1
                params.append(pytest.param(rule, example, id=f"{rule.id}-{kind}-{number}"))
    return params


def _normalized(text: str) -> str:
    """Only trailing whitespace is forgiven: at line ends and at the end of the text."""
    return "\n".join(line.rstrip() for line in text.rstrip().splitlines())


def _scan(rule: Rule, code: str):
    findings, new_text = scan_source(code, [rule], path="example.py", module="example")
    return [f for f in findings if f.rule_id == rule.id], new_text


def _describe(findings) -> str:
    if not findings:
        return "no findings"
    return "\n".join(f"  line {f.line}-{f.end_line}: {f.status}" + (f" ({f.reason})" if f.reason else "")
                     for f in findings)


def test_rules_exist():
    assert RULE_FILES, f"no *.rule files found under {RULES_DIR}"
    assert any(r.id.startswith("paper/") for r in RULES)


@pytest.mark.parametrize("name", [p.relative_to(RULES_DIR).as_posix() for p in RULE_FILES])
def test_rule_file_loads(name: str):
    assert name not in _ERRORS, _ERRORS.get(name)


def test_rule_ids_are_unique():
    seen: dict[str, str] = {}
    for rule in RULES:
        assert rule.id not in seen, f"rule id {rule.id} defined in {seen[rule.id]} and {rule.path}"
        seen[rule.id] = rule.path


def check_both_kinds(rule: Rule) -> None:
    kinds = {e.kind for e in rule.examples}
    missing = [k for k in ("fires", "near-miss") if k not in kinds]
    assert not missing, f"{rule.path}: rule {rule.id} has no `example {' / '.join(missing)}` block"


def check_fires(rule: Rule, example: Example) -> None:
    findings, new_text = _scan(rule, example.code)
    hits = [f for f in findings if f.status != "near-miss"]
    assert len(hits) == example.count, (
        f"{rule.path}: expected {example.count} finding(s) of {rule.id}, got {len(hits)}:\n{_describe(findings)}")
    if rule.detect_only:
        assert all(f.status == "detected" for f in hits), _describe(hits)
        assert new_text == example.code, "a detect-only rule changed the code"
    else:
        assert all(f.status in ("rewritten", "guarded") for f in hits), _describe(hits)
    if example.expect is None:
        return
    assert _normalized(new_text) == _normalized(example.expect), (
        f"{rule.path}: rewritten code differs from `expect`:\n--- got\n{new_text}\n--- expected\n{example.expect}")
    compile(new_text, f"<{rule.id} rewritten>", "exec")
    again_findings, again = _scan(rule, new_text)
    assert again == new_text, f"{rule.id}: a second scan rewrote its own output again:\n{again}"
    assert not [f for f in again_findings if f.status in ("rewritten", "guarded")], _describe(again_findings)


def check_near_miss(rule: Rule, example: Example) -> None:
    findings, new_text = _scan(rule, example.code)
    matched = [f for f in findings if f.status in MATCHING_STATUSES]
    assert not matched, f"{rule.path}: near-miss example matched:\n{_describe(findings)}"
    assert new_text == example.code, "a near-miss example was rewritten"
    near = [f for f in findings if f.status in ("near-miss", "already-fused")]  # reported, not rewritten
    if example.count == 0:
        assert not findings, f"{rule.path}: `count 0` example has findings:\n{_describe(findings)}"
    else:
        assert len(near) == example.count, (
            f"{rule.path}: expected {example.count} near-miss finding(s), got {len(near)}:\n{_describe(findings)}")
    if example.reason is not None:
        assert any(example.reason in (f.reason or "") for f in near), (
            f"{rule.path}: no near-miss reason contains {example.reason!r}:\n{_describe(findings)}")


@pytest.mark.parametrize("rule", [pytest.param(r, id=r.id) for r in RULES])
def test_rule_has_both_kinds_of_example(rule: Rule):
    check_both_kinds(rule)


@pytest.mark.parametrize(("rule", "example"), _examples("fires"))
def test_fires(rule: Rule, example: Example):
    check_fires(rule, example)


@pytest.mark.parametrize(("rule", "example"), _examples("near-miss"))
def test_near_miss(rule: Rule, example: Example):
    check_near_miss(rule, example)
