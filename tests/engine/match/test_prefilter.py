"""The matcher's prefilter (engine/match/matcher.py `needs`): which statements every match of a
pattern contains, computed once per rule and in time linear in the pattern."""

from __future__ import annotations

import pytest

from engine.analysis import numbers
from engine.extract import extract_source
from engine.match import parse_rule
from engine.match.matcher import FileIndexes, _required_statements, match_method, needs


def _rule(body: str):
    return parse_rule(f'rule t/x\nsummary "s"\nkernel "k"\ndetect-only\nmatch {{\n{body}\n}}\n')


class _BoundedLookups(dict):
    """A pattern's definers that count their lookups and stop a search that makes too many."""

    def __init__(self, items, limit: int) -> None:
        super().__init__(items)
        self.limit = limit
        self.lookups = 0

    def get(self, key, default=None):
        self.lookups += 1
        assert self.lookups <= self.limit, "the required statements are searched once per path, not once each"
        return super().get(key, default)


def test_required_statements_of_a_pattern_read_twice_at_every_step():
    # each statement reads the one before twice: 2**40 paths from the root, 41 statements
    steps = ["  $a0 = .float($x)"] + [f"  $a{i} = add($a{i - 1}, $a{i - 1})" for i in range(1, 41)]
    rule = _rule("\n".join(steps))
    pattern = rule.patterns[0]
    object.__setattr__(pattern, "definers", _BoundedLookups(pattern.definers, limit=10 * len(pattern.stmts)))
    assert _required_statements(pattern) == set(range(41))
    assert needs(rule)[0].names == {"add", ".float"}


def test_an_optional_statement_requires_only_what_both_readings_need():
    # `$y` absent: `add` reads `$x` itself, a free variable; the cast is in no required set
    rule = _rule("  $y = .float($x)?\n  $z = add($y, $y)")
    assert _required_statements(rule.patterns[0]) == {1}
    assert needs(rule)[0].names == {"add"}
    rule = _rule("  $y = .float($x)\n  $z = add($y, $y)")
    assert _required_statements(rule.patterns[0]) == {0, 1}
    assert needs(rule)[0].names == {"add", ".float"}


# ---------------------------------------------------------------------------------------------
# The file-level test (FileIndexes.candidates): a file none of whose methods has what a rule needs
# is settled at once; it must never drop a method where the rule matches.

def _rule_examples():
    from tests.engine.rules.test_rule_examples import RULES

    return [pytest.param(rule, example, id=f"{rule.id}-{example.kind}-{i}")
            for rule in RULES for i, example in enumerate(rule.examples) if example.kind in ("fires", "near-miss")]


@pytest.mark.parametrize(("rule", "example"), _rule_examples())
def test_the_file_level_test_keeps_every_method_where_the_rule_matches(rule, example):
    fm = extract_source(example.code, "example.py", "example")
    with numbers.source(fm.path, example.code):  # as a scan matches (engine/scan.py `_find`)
        chosen = {id(ix.method) for ix in FileIndexes(fm).candidates(rule)}
        # every method looked at, matched without any prefilter of the file's
        brute = FileIndexes(fm)
        matched = [ix for ix in brute.indexes(rule.anywhere) if match_method(rule, ix, relaxed=True)]
    assert {id(ix.method) for ix in matched} <= chosen
    if example.kind == "fires":
        assert matched, "a firing example matches somewhere"


_OPTIMIZER = parse_rule('rule t/adam\nsummary "s"\nkernel "k"\ndetect-only\nanywhere\nmatch {\n'
                        '  $opt = torch.optim.AdamW($params, ...) | torch.optim.Adam($params, ...)\n}\n')


def test_a_file_without_the_ops_builds_no_index_of_every_method():
    fm = extract_source("import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n\n"
                        "    def reset(self):\n        self.w = torch.zeros(3)\n", "m.py", "m")
    indexes = FileIndexes(fm)
    assert indexes.candidates(_OPTIMIZER) == []
    assert indexes._every is None


def test_an_optimizer_outside_the_training_methods_is_found():
    code = ("import torch\n\nclass Trainer:\n    def build(self, model):\n"
            "        return torch.optim.AdamW(list(model.parameters()), lr=1e-3)\n")
    fm = extract_source(code, "t.py", "t")
    found = FileIndexes(fm).candidates(_OPTIMIZER)
    assert [ix.method.name for ix in found] == ["Trainer.build"]
    assert match_method(_OPTIMIZER, found[0])
