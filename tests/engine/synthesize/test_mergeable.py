"""The mergeability check (engine/synthesize/mergeable.py) catches what a maintainer would reject,
and every rule example's rewrite passes it."""

from __future__ import annotations

import pytest

from engine.scan import scan_source
from engine.synthesize.mergeable import check
from engine.synthesize.style import Style
from tests.engine.rules.test_rule_examples import RULES

ORIGINAL = """import math
import torch


def f(x, flag):
    y = torch.relu(x)
    return y * math.pi
"""


def test_clean_rewrite_passes():
    assert check(ORIGINAL, ORIGINAL.replace("torch.relu(x)", "torch.nn.functional.relu(x)")).ok


def test_new_unused_import_is_found():
    verdict = check(ORIGINAL, ORIGINAL.replace("return y * math.pi", "return y"))
    assert verdict.new_lint == ["F401: import math"]


def test_long_line_counts_at_the_given_length_only():
    long = ORIGINAL.replace("torch.relu(x)", "torch.relu(" + " + ".join(["x"] * 24) + ")")
    assert check(ORIGINAL, long, line_length=80).new_lint[0].startswith("E501")
    assert check(ORIGINAL, long, line_length=120).ok


def test_unused_local_is_found():
    verdict = check(ORIGINAL, ORIGINAL.replace("    return y * math.pi", "    z = 1\n    return y * math.pi"))
    assert verdict.new_lint == ["F841: z = 1"]


def test_dead_and_repeated_guards_are_found():
    guarded = ORIGINAL.replace("    y = torch.relu(x)\n", "    if flag:\n        if flag:\n            y = torch.relu(x)\n"
                               "    else:\n        pass\n    if True:\n        y = x\n")
    verdict = check(ORIGINAL, guarded)
    assert verdict.repeated_guards == ["if flag: inside if flag:"]
    assert verdict.dead_branches == ["if True:", "if flag: ... else: pass"]


def test_what_the_original_had_is_not_counted():
    messy = "import os\nif True:\n    pass\n"
    assert check(messy, messy + "x = 1\n").ok


def test_broken_code_does_not_compile():
    assert not check(ORIGINAL, ORIGINAL + "def (:\n").compiles


def _fires_examples():
    for rule in RULES:
        for number, example in enumerate(e for e in rule.examples if e.kind == "fires"):
            if not rule.detect_only:
                yield pytest.param(rule, example, id=f"{rule.id}-{number + 1}")


@pytest.mark.parametrize(("rule", "example"), list(_fires_examples()))
def test_every_rule_example_rewrite_is_mergeable(rule, example):
    _, new_text = scan_source(example.code, [rule], path="example.py", module="example")
    # the line length the synthesizer wrote to (no configuration here: the one the example keeps to)
    verdict = check(example.code, new_text, Style().for_text(example.code).line_length)
    assert verdict.ok, verdict.problems()


def test_a_file_without_configuration_is_held_to_the_length_it_keeps_to():
    assert Style().for_text("x = 1\n" * 50).line_length == 88
    assert Style().for_text(("y = " + "a" * 110 + "\n") * 50).line_length == 119
    configured = Style(100, "double", "pyproject.toml")
    assert configured.for_text(("y = " + "a" * 110 + "\n") * 50) is configured


def test_the_quote_style_is_read_from_string_literals_only():
    single = "x = 'a'\ny = 'b'\n" * 10
    assert Style().for_text(single).quote_style == "single"
    # quotes in comments, inside docstrings and inside other strings are not literals of their own
    noise = '# "c" "d" "e"\n"""a "doc" string\n"x" "y"\n"""\nz = \'say "hi"\'\n'
    assert Style().for_text(single + noise * 10).quote_style == "single"
    # an escaped quote does not end a literal; a prefix does not change its quote
    assert Style().for_text("p = r'\\' \"'\nq = b'x'\n" * 10).quote_style == "single"
    assert Style().for_text('a = "1"\nb = f"{a}"\n' * 10).quote_style == "double"
    # a mix under nine in ten keeps the configured default
    assert Style().for_text("a = 'x'\nb = \"y\"\n" * 10).quote_style == "preserve"


def test_repository_configuration_sets_the_line_length(tmp_path):
    from engine.synthesize.style import find_style

    (tmp_path / ".git").mkdir()
    (tmp_path / "pyproject.toml").write_text('[tool.ruff]\nline-length = 100\n[tool.ruff.format]\nquote-style = "single"\n')
    (tmp_path / "pkg").mkdir()
    style = find_style(tmp_path / "pkg")
    assert (style.line_length, style.quote_style) == (100, "single")
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 119\nskip-string-normalization = true\n")
    assert (find_style(tmp_path / "pkg").line_length, find_style(tmp_path).quote_style) == (119, "preserve")
    (tmp_path / "pyproject.toml").unlink()
    (tmp_path / "setup.cfg").write_text("[flake8]\nmax-line-length = 79\n")
    assert find_style(tmp_path / "pkg").line_length == 79
    (tmp_path / "setup.cfg").unlink()
    assert find_style(tmp_path / "pkg").source is None


def test_a_long_message_is_split_where_it_means_the_same():
    import libcst as cst

    from engine.synthesize.strings import split_long_strings

    stmt = cst.parse_statement('raise ValueError(f"Attention mask should be of size {(b, 1)}, but is {m.size()}")\n')
    split = cst.Module([]).code_for_node(split_long_strings(stmt))
    assert split != cst.Module([]).code_for_node(stmt)
    names = {"b": 2, "m": type("M", (), {"size": lambda self: (3,)})(), "ValueError": ValueError}
    original = eval(cst.Module([]).code_for_node(stmt.body[0].exc), names)  # noqa: S307 - our own literal
    again = eval(cst.Module([]).code_for_node(split_long_strings(stmt).body[0].exc), names)  # noqa: S307
    assert str(original) == str(again) == "Attention mask should be of size (2, 1), but is (3,)"


def test_a_long_part_of_a_message_already_in_parts_is_split_too():
    import libcst as cst

    from engine.synthesize.strings import split_long_strings

    stmt = cst.parse_statement('x = ("a first part that is long enough to split " "and a second one")\n')
    split = split_long_strings(stmt)
    code = cst.Module([]).code_for_node(split)
    assert code.count('"') == 6
    assert eval(code.split("=", 1)[1]) == "a first part that is long enough to split and a second one"  # noqa: S307



def test_guard_facts_fold_and_negate_plainly():
    import libcst as cst

    from engine.synthesize.rewrite import evaluate, known_when, negate, plain

    def code(node):
        return cst.Module([]).code_for_node(node)

    guard = cst.parse_expression("head_mask is not None or output_attentions")
    kernel = known_when(guard, False)  # on the kernel's path both disjuncts are false
    assert evaluate(cst.parse_expression("output_attentions"), kernel) is False
    assert evaluate(cst.parse_expression("head_mask is None"), kernel) is True
    assert evaluate(cst.parse_expression("not output_attentions and x"), kernel) is None
    assert evaluate(cst.parse_expression("True"), {}) is True
    assert code(plain(cst.parse_expression("not (mask is not None)"))) == "mask is None"
    assert code(negate(cst.parse_expression("a or b"))) == "not (a or b)"


SPACED = """import torch
import torch.nn.functional as F


class Attention(torch.nn.Module):
    def forward(self, x, q, k, v):
        q = q.permute(0, 2, 1, 3)
        k = k.permute(0, 2, 1, 3)
{gap}        s = q @ k.transpose(-2, -1) * 0.125
        p = s.softmax(dim=-1)
        return p @ v
"""


@pytest.mark.parametrize("gap", ["\n", "", "\n        # attention\n"], ids=["blank", "none", "comment"])
def test_the_blank_line_above_the_removed_statements_stays(gap):
    """A rewrite that removes the first statements of a paragraph keeps the paragraph's blank line
    (and adds none where there was none); a comment that headed the removed code goes with it."""
    source = SPACED.format(gap=gap)
    _, new = scan_source(source, RULES, "case.py", "case")
    assert "scaled_dot_product_attention" in new, new
    above = new.split("k = k.permute(0, 2, 1, 3)\n", 1)[1].split("return", 1)[0]
    assert above == ("\n" if gap else "") + "        ", repr(above)


# comments written below the statement they describe (stanza's relative attention)
TRAILING = """import torch


class Attention(torch.nn.Module):
    def forward(self, x, q, k, v):
        k = k.permute(0, 2, 1, 3)
        # k.shape = (b, h, n, d)

        s = q @ k.transpose(-2, -1) * 0.125
        # s.shape = (b, h, n, n)
        p = s.softmax(dim=-1)
        return p @ v
"""


def test_a_comment_trailing_a_kept_statement_stays():
    """The comment right below a kept statement, set off from the removed ones by a blank line,
    describes the kept one: it stays, with its blank line; the removed statements' own go."""
    _, new = scan_source(TRAILING, RULES, "case.py", "case")
    assert "scaled_dot_product_attention" in new, new
    assert "        k = k.permute(0, 2, 1, 3)\n        # k.shape = (b, h, n, d)\n\n        return " in new, new
    assert "s.shape" not in new, new


GUARDED_STATE = """import torch


class Attention(torch.nn.Module):
    def forward(self, q, k, v, keep=None):
        s = q @ k.transpose(-2, -1) * 0.125
        p = s.softmax(dim=-1)
        if keep is not None:
            p, keep = p * keep, keep.sum()
        out = p @ v
        return out, keep
"""


def test_a_name_assigned_only_on_the_original_path_may_be_read_after_the_guarded_rewrite():
    """`keep` is reassigned only when the original path runs (`keep is not None`); where the kernel
    runs the original would not have assigned it either, so reading it after the `if` is sound."""
    torch = pytest.importorskip("torch")
    findings, new = scan_source(GUARDED_STATE, RULES, "case.py", "case")
    assert [f.status for f in findings] == ["guarded"], [(f.status, f.reason) for f in findings]
    assert "scaled_dot_product_attention" in new and new.rstrip().endswith("return out, keep"), new
    q, k, v = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    modules = []
    for text in (GUARDED_STATE, new):
        namespace: dict = {}
        exec(compile(text, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
        modules.append(namespace["Attention"]())
    for keep in (None, torch.rand(2, 3, 5, 5, dtype=torch.float64)):
        (want, want_keep), (got, got_keep) = (m(q, k, v, keep) for m in modules)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
        assert (got_keep is None) == (want_keep is None)
        if want_keep is not None:
            torch.testing.assert_close(got_keep, want_keep)
