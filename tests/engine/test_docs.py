"""Generated and hand-written documentation stays true to the code: docs/rules.md is what
`python -m engine.docs_gen` makes of the rule files, and docs/dsl.md quotes the rule grammar."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from engine import docs_gen
from engine.match import load_rules, parse_rule
from engine.match.constraints import CHECKS
from rules import RULES_DIR

ROOT = Path(__file__).resolve().parents[2]
RULES = load_rules(RULES_DIR)


def _without_lines(pattern):
    return tuple(dataclasses.replace(s, line=0) for s in pattern)


def test_rules_md_is_up_to_date():
    current = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert current == docs_gen.generate(), (
        "docs/rules.md is out of date with the rule files; regenerate it with `python -m engine.docs_gen`")


def _blocks(rule):
    return [(_without_lines(stmts), reason) for stmts, reason in docs_gen.match_blocks(rule)]


@pytest.mark.parametrize("rule", [pytest.param(r, id=r.id) for r in RULES])
def test_rendered_match_blocks_parse_back(rule):
    text = f'rule t/x\nsummary "s"\nkernel "k"\ndetect-only\n{docs_gen.render_match_blocks(rule)}\n'
    assert _blocks(parse_rule(text)) == _blocks(rule)


def test_rendered_pattern_covers_every_form():
    source = '''match {
  $a = @torch.nn.Linear | @*.Conv*d($x, _, 3, -1.5, "s", True, False, None, bias=$b, ...)
  $c = .masked_fill | torch.nn.functional.softmax($a, ...)?
  $d = scale($c, $f)
  add($d, dim=-1)
}'''
    rule = parse_rule(f'rule t/x\nsummary "s"\nkernel "k"\ndetect-only\n{source}\n')
    rendered = docs_gen.render_pattern(rule.pattern)
    assert rendered == source
    assert _without_lines(parse_rule(f'rule t/x\nsummary "s"\nkernel "k"\ndetect-only\n{rendered}').pattern) == \
        _without_lines(rule.pattern)


def test_every_rule_has_an_anchored_section_and_index_row():
    text = docs_gen.render_rules_markdown(RULES)
    for rule in RULES:
        assert f'<a id="{rule.id}"></a>' in text
        assert f"| [{rule.id}](#{rule.id}) |" in text
        assert f"### {rule.id}\n" in text


SYNTHETIC = '''
rule demo-fix
summary "A demo rewrite"
kernel "torch.nn.functional.gelu"
requires "torch>=2.1"
import "import torch"
guard
where last_dim
rewrite "torch.nn.functional.gelu($x)"
match {
  $out = softmax($x, dim=$dim)
}
doc """Because the fused kernel is faster."""
example fires """
x = 1
""" expect """
x = 2
"""
example near-miss """
y = 1
""" reason "dim=1 is not provably the last dimension"
example near-miss """
z = 1
""" count 0
'''


def test_rule_section_has_ruff_style_parts():
    rule = parse_rule(SYNTHETIC, "demo.rule")
    text = docs_gen.render_rules_markdown([rule])
    section = text[text.index('<a id="demo-fix">'):]
    order = ["### demo-fix", "A demo rewrite", "**Kernel:** `torch.nn.functional.gelu`",
             "**Fix:** rewrites, guarded where needed", "**Requires:** `torch>=2.1`",
             "**Imports added:** `import torch`", "#### What it does", "#### Why",
             "Because the fused kernel is faster.", "#### Conditions", "`last_dim`: `$dim` is the last dimension",
             "#### Pattern", "$out = softmax($x, dim=$dim)", "torch.nn.functional.gelu($x)", "#### Example",
             "x = 1", "#### Use instead", "x = 2", "#### When it does not apply",
             "`dim=1 is not provably the last dimension`", "y = 1", "not reported as a near-miss", "z = 1"]
    at = 0
    for piece in order:
        found = section.find(piece, at)
        assert found >= 0, f"{piece!r} missing (or out of order) in:\n{section}"
        at = found + len(piece)
    assert "## Current kernels" in text and "The paper's rules" not in text


def test_detect_only_rule_says_so_and_points_to_the_kernel():
    rule = next(r for r in RULES if r.detect_only)
    section = docs_gen.render_rule(rule)
    assert "**Fix:** detect-only" in section
    assert "does not change the code" in section


def test_fence_outlasts_backticks_in_code():
    fenced = docs_gen._fence('s = """```"""')
    assert fenced.startswith("````python\n") and fenced.endswith("\n````\n")


def test_check_mode_reports_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "rules.md"
    stale.write_text("old\n")
    assert docs_gen.main(["--check", "--output", str(stale)]) == 1
    assert "python -m engine.docs_gen" in capsys.readouterr().err
    assert docs_gen.main(["--output", str(stale)]) == 0
    assert docs_gen.main(["--check", "--output", str(stale)]) == 0


# ---------------------------------------------------------------------------------------------
# docs/dsl.md, section Rules


def _rules_section() -> str:
    text = (ROOT / "docs" / "dsl.md").read_text(encoding="utf-8")
    start = text.index("\n## Rules\n")
    end = text.find("\n## ", start + 1)
    return text[start: end if end >= 0 else len(text)]


def test_dsl_md_quotes_the_rule_grammar_verbatim():
    blocks = re.findall(r"```lark\n(.*?)```", _rules_section(), flags=re.S)
    grammar = (ROOT / "engine" / "match" / "rule.lark").read_text(encoding="utf-8")
    assert blocks, "docs/dsl.md (## Rules) has no ```lark block"
    assert blocks[0] == grammar, "the rule grammar in docs/dsl.md differs from engine/match/rule.lark; copy it"


def test_dsl_md_documents_every_named_constraint():
    section = _rules_section()
    missing = [name for name in CHECKS if f"`{name}`" not in section]
    assert not missing, f"docs/dsl.md (## Rules) does not document the constraints {missing}"


def test_near_miss_match_block_renders_and_parses_back():
    source = 'match {\n  $a = softmax($x, dim=-1)\n}\nnear-miss "over \\"dim\\" 1" match {\n  $a = softmax($x, dim=1)\n}'
    rule = parse_rule(f'rule t/x\nsummary "s"\nkernel "k"\ndetect-only\n{source}\n')
    assert docs_gen.render_match_blocks(rule) == source
    assert docs_gen.match_blocks(rule)[1][1] == 'over "dim" 1'


def test_dsl_md_quotes_each_constraint_docstring():
    import inspect

    section = " ".join(_rules_section().split())
    for name, check in CHECKS.items():
        doc = " ".join((inspect.getdoc(check) or "").split())
        assert doc and doc in section, f"docs/dsl.md (## Rules) does not quote the docstring of `{name}`: {doc!r}"


def test_dsl_md_canonical_table_lists_every_spelling():
    from engine.dsl import canonical as C

    section = _rules_section()
    rows = {line.split("|")[1].strip(): line for line in section.splitlines() if line.startswith("| `")}
    for name, op in C.FUNCTIONS.items():
        assert f"`{name}`" in rows.get(f"`{op}`", ""), f"{name} -> {op} is missing from the canonical-op table"
    for name, op in C.METHODS.items():
        assert f"`.{name}`" in rows.get(f"`{op}`", ""), f".{name} -> {op} is missing from the canonical-op table"
    for layer, (op, params) in C.LAYER_OPS.items():
        assert f"`{layer}({', '.join(params)})`" in rows.get(f"`{op}`", ""), f"{layer} is missing from the table"
    for op in set(C.BINARY.values()) | set(C.SIGNATURES):
        assert f"`{op}`" in rows, f"canonical op {op} has no row in the canonical-op table"
