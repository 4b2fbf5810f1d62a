"""einops patterns read as reductions, flattens and appended size-1 axes (engine/analysis/shapes.py)."""

from __future__ import annotations

import pytest

from engine.analysis.shapes import einops_flattened_from, einops_reduction, einops_unit_tail


@pytest.mark.parametrize(("pattern", "rank", "want"), [
    ("o ... -> o 1 1 1", 4, ((1, 2, 3), True)),
    ("b c h w -> b c", None, ((2, 3), False)),  # every axis named: the rank is the pattern's
    ("b c h w -> b 1 h w", None, ((1,), True)),
    ("b c h w -> 1 c 1 1", 4, ((0, 2, 3), True)),
    ("... c -> ... 1", 3, ((2,), True)),
    ("o ... -> 1 ...", 4, ((0,), True)),
    ("b c -> b ()", 2, ((1,), True)),
    # not a reduction in place: `...` of unknown or another rank, a permute, a grouping, nothing
    # reduced, size-1 axes that are not where the reduced ones were
    ("o ... -> o 1 1 1", 3, None),
    ("o ... -> o 1 1 1", None, None),
    ("b c h w -> c b", 4, None),
    ("b (c h) -> b", 2, None),
    ("b c -> b c", 2, None),
    ("b c -> b 1 1", 2, None),
    ("b c h w -> b 1 1", 4, None),
    ("b c h w -> b c h w", 3, None),
])
def test_einops_reduction(pattern, rank, want):
    assert einops_reduction(pattern, rank) == want


@pytest.mark.parametrize(("pattern", "rank", "want"), [
    ("o ... -> o (...)", 4, 1),
    ("b c h w -> b (c h w)", None, 1),
    ("b c h w -> b c (h w)", 4, 2),
    ("b c h w -> b (h c w)", 4, None),  # out of order
    ("o ... -> o (...)", None, None),  # the flattened axes unknown
    ("o ... -> (...) o", 4, None),
    ("b c h w -> (b c) h w", 4, None),
])
def test_einops_flattened_from(pattern, rank, want):
    assert einops_flattened_from(pattern, rank) == want


@pytest.mark.parametrize(("pattern", "want"), [
    ("o -> o 1 1 1", (1, 3)),
    ("a b -> a b 1", (2, 1)),
    ("o -> 1 o 1 1", None),
    ("o -> o", None),
    ("a b -> b a 1", None),
    ("o ... -> o ... 1", None),
])
def test_einops_unit_tail(pattern, want):
    assert einops_unit_tail(pattern) == want
