"""The matcher's prefilter (engine/match/matcher.py `needs`): which statements every match of a
pattern contains, computed once per rule and in time linear in the pattern."""

from __future__ import annotations

from engine.match import parse_rule
from engine.match.matcher import _required_statements, needs


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
